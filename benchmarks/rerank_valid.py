"""Would reranking the beam with a right-to-left model lift valid BLEU? Measured before mt builds it in.

For each beam size K: the valid split is translated by the left-to-right CHECKPOINT (a model or an `mt ensemble`)
with its length penalty, the K best kept per sentence; a model trained with `model.right_to_left` (the same
prepared data, another run) scores each of them (`mt score`'s forced decoding, reading the pieces last first).
Each sentence's output is then the hypothesis of highest (log P_l2r + w · log P_r2l) / (1 + w) / lp(length, a),
lp the GNMT length penalty over pieces (Sennrich et al. 2016's reranking, Liu et al. 2016's agreement). Prints
corpus BLEU (cased sacreBLEU) for each w and a; w = 0 is the left-to-right model reranking its own K best. With
--out, writes the best setting's translations, for `sacrebleu --paired-bs` against another system's.
The best of many settings flatters itself, so a two-fold figure is printed beside it: the setting chosen on the
odd lines translates the even ones and the other way round, scored as one corpus.

    python benchmarks/rerank_valid.py CHECKPOINT R2L_CHECKPOINT [--beams 5,8] [--weights 0,0.5,1]
        [--penalties 0.6,1.0,1.5] [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import sacrebleu
import torch

from mt.checkpoint import load_model
from mt.lines import write_lines
from mt.score import score_pairs
from mt.search import length_penalty
from mt.translate import Options, translate_lines
from mt.tune import held_out


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("r2l")
    parser.add_argument("--beams", default="5,8")
    parser.add_argument("--weights", default="0,0.5,1")
    parser.add_argument("--penalties", default="0.6,1.0,1.5")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    loaded, r2l = load_model(args.checkpoint), load_model(args.r2l)
    if not r2l.model.cfg.right_to_left or loaded.model.cfg.right_to_left:
        parser.error("give a left-to-right CHECKPOINT, then a model trained with model.right_to_left")
    sources, refs = held_out(loaded)
    decode, cpu = loaded.config.decode, torch.device("cpu")

    def bleu(texts: list[str]) -> float:
        return round(sacrebleu.corpus_bleu(texts, [refs]).score, 2)

    tuned = translate_lines(loaded, sources, Options.from_config(decode), cpu)
    print(f"left-to-right, tuned (beam {decode.beam}, len_penalty {decode.len_penalty}): "
          f"{bleu(loaded.tgt_tok.decode([h[0].tokens if h else [] for h in tuned]))}")
    best: tuple[float, str, list[str]] = (-1.0, "", [])
    outputs: dict[str, list[str]] = {}
    for k in map(int, args.beams.split(",")):
        hyps = translate_lines(loaded, sources, Options.from_config(decode, beam=k, nbest=k), cpu)
        texts = [loaded.tgt_tok.decode([h.tokens for h in hs]) if hs else [""] for hs in hyps]
        flat = [(i, j) for i, hs in enumerate(hyps) for j in range(len(hs))]
        backwards = score_pairs(r2l, [sources[i] for i, _ in flat], [texts[i][j] for i, j in flat], cpu)
        r2l_logprob: list[list[float]] = [[] for _ in hyps]
        for (i, _), score in zip(flat, backwards, strict=True):
            r2l_logprob[i].append(score)
        row = {}
        for w in floats(args.weights):
            for a in floats(args.penalties):
                chosen = []
                for hs, ts, back in zip(hyps, texts, r2l_logprob, strict=True):
                    combined = [(h.logprob + w * b) / (1 + w) / length_penalty(len(h.tokens) + 1, a)
                                for h, b in zip(hs, back, strict=True)]
                    chosen.append(ts[max(range(len(hs)), key=combined.__getitem__)] if hs else "")
                row[f"w {w:g} a {a:g}"] = score = bleu(chosen)
                outputs[f"beam {k}, w {w:g}, a {a:g}"] = chosen
                if score > best[0]:
                    best = (score, f"beam {k}, w {w:g}, a {a:g}", chosen)
        print(f"beam {k} (search len_penalty {decode.len_penalty}): {row}")
    print(f"best: {best[1]}: {best[0]}")
    print(two_fold(outputs, refs))
    if args.out is not None:
        write_lines(args.out, best[2])
        print(f"wrote {args.out}")


def two_fold(outputs: dict[str, list[str]], refs: list[str]) -> str:
    """BLEU when each half of the lines is translated by the setting that scored best on the other half."""
    def half_bleu(texts: list[str], parity: int) -> float:
        return sacrebleu.corpus_bleu(texts[parity::2], [refs[parity::2]]).score

    picks = [max(outputs, key=lambda name: half_bleu(outputs[name], 1 - parity)) for parity in (0, 1)]
    merged = [outputs[picks[i % 2]][i] for i in range(len(refs))]
    return f"two-fold (chosen on one half, scored on the other): {sacrebleu.corpus_bleu(merged, [refs]).score:.2f} " \
           f"(even lines: {picks[0]}; odd lines: {picks[1]})"


if __name__ == "__main__":
    main()
