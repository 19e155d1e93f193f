"""Valid BLEU of an ensemble of checkpoints, to decide whether ensembles pay before mt builds them in.

The members' next-token probabilities are averaged at every step (log of the mean), through mt's own beam search
and `translate_lines`; the first checkpoint gives the data, the tokenizers and the decoding defaults, and every
member must share its vocabulary. Scores the prepared valid split, never test.

    python benchmarks/ensemble_valid.py --beam 5 --len-penalty 1.0 RUN_A/final.pt RUN_B/final.pt
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch

from mt.checkpoint import load_model
from mt.translate import Options, translate_lines


@dataclass
class EnsembleCache:
    caches: list

    def select(self, rows, sentences=None) -> EnsembleCache:
        return EnsembleCache([c.select(rows, sentences) for c in self.caches])


class Ensemble(torch.nn.Module):
    """The decoding interface of `mt.model.Transformer` (encode, start_cache, decode_step) over several models."""

    def __init__(self, models: list[torch.nn.Module]):
        super().__init__()
        self.members = torch.nn.ModuleList(models)
        self.cfg = models[0].cfg

    def encode(self, src):
        encoded = [m.encode(src) for m in self.members]
        return [memory for memory, _ in encoded], encoded[0][1]

    def start_cache(self, memory, src_mask, max_steps=None, beam=1) -> EnsembleCache:
        return EnsembleCache([m.start_cache(x, src_mask, max_steps, beam=beam) for m, x in zip(self.members, memory,
                                                                                              strict=True)])

    def decode_step(self, tokens, cache: EnsembleCache):
        steps = [m.decode_step(tokens, c) for m, c in zip(self.members, cache.caches, strict=True)]
        logp = torch.stack([logits.float().log_softmax(-1) for logits, _ in steps])  # (members, rows, V)
        return torch.logsumexp(logp, 0) - math.log(len(steps)), EnsembleCache([c for _, c in steps])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--len-penalty", type=float, default=1.0)
    args = parser.parse_args()
    members = [load_model(path) for path in args.checkpoints]
    first = members[0]
    if any(m.tgt_tok.sp.serialized_model_proto() != first.tgt_tok.sp.serialized_model_proto() for m in members):
        raise SystemExit("the checkpoints do not share one target vocabulary")
    data = Path(first.config.data)
    src = (data / "valid.src.txt").read_text(encoding="utf-8").splitlines()
    ref = (data / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()
    first.model = Ensemble([m.model for m in members])
    opts = Options.from_config(first.config.decode, beam=args.beam, len_penalty=args.len_penalty)
    hyps = translate_lines(first, src, opts, torch.device("cpu"))
    texts = [first.tgt_tok.decode([h[0].tokens])[0] if h else "" for h in hyps]
    print(f"{len(members)} models, beam {args.beam}, lp {args.len_penalty}: valid BLEU "
          f"{sacrebleu.corpus_bleu(texts, [ref]).score:.2f}, lowercased "
          f"{sacrebleu.corpus_bleu(texts, [ref], lowercase=True).score:.2f}")


if __name__ == "__main__":
    main()
