"""Would reranking the beam with a right-to-left model, or a channel model, lift valid BLEU? Measured before mt
builds it in.

For each beam size K: the valid split is translated by the left-to-right CHECKPOINT (a model or an `mt ensemble`)
with its length penalty, the K best kept per sentence; a model trained with `model.right_to_left` (the same
prepared data, another run) scores each of them (`mt score`'s forced decoding, reading the pieces last first).
Each sentence's output is then the hypothesis of highest (log P_l2r + w · log P_r2l) / (1 + w) / lp(length, a),
lp the GNMT length penalty over pieces (Sennrich et al. 2016's reranking, Liu et al. 2016's agreement). Prints
corpus BLEU (cased sacreBLEU) for each w and a; w = 0 is the left-to-right model reranking its own K best. With
--out, writes the best setting's translations, for `sacrebleu --paired-bs` against another system's.
With --channel, a model of the reverse direction (trained on the same corpus, any vocabulary; a two-way model turns
to the source language) scores log P_ch(source | hypothesis), Yee et al. 2019's noisy channel without the language
model, and the score becomes ((log P_l2r + w · log P_r2l) / lp + c · log P_ch / lp(source length)) / (1 + w + c)
(R2L_CHECKPOINT optional), as mt reranks; `--channel-length target` divides c · log P_ch by the hypothesis's lp
instead, as mt did before.
With --union, the right-to-left model's own K best (searched with it, turned to reading order) join the
left-to-right model's before reranking, each scored by every model (Liu et al. 2016's joint K-best).
The best of many settings flatters itself, so a two-fold figure is printed beside it: the setting chosen on the
odd lines translates the even ones and the other way round, scored as one corpus.

    python benchmarks/rerank_valid.py CHECKPOINT [R2L_CHECKPOINT] [--beams 5,8] [--weights 0,0.5,1]
        [--channel CHECKPOINT --channel-weights 0,0.5,1] [--penalties 0.6,1.0,1.5] [--union] [--out FILE]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import sacrebleu
import torch

from mt.data.lines import write_lines
from mt.decode.forced import score_pairs
from mt.decode.load import load_model
from mt.decode.search import SearchOptions, length_penalty
from mt.decode.translate import translate_lines
from mt.decode.tune import held_out


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("r2l", nargs="?")
    parser.add_argument("--beams", default="5,8")
    parser.add_argument("--weights", default="0,0.5,1")
    parser.add_argument("--channel")
    parser.add_argument("--channel-weights", default="0,0.5,1")
    parser.add_argument("--penalties", default="0.6,1.0,1.5")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--union", action="store_true", help="rerank the right-to-left model's K best too")
    parser.add_argument("--channel-length", choices=("source", "target"), default="source",
                        help="divide c · log P_ch by lp of the hypothesis's length (target) or the source's")
    args = parser.parse_args()
    loaded = load_model(args.checkpoint)
    r2l = load_model(args.r2l) if args.r2l else None
    if loaded.model.cfg.right_to_left or (r2l is not None and not r2l.model.cfg.right_to_left):
        parser.error("give a left-to-right CHECKPOINT, then a model trained with model.right_to_left")
    if args.union and r2l is None:
        parser.error("--union needs R2L_CHECKPOINT")
    channel = load_model(args.channel, to=loaded.state["langs"]["src"]) if args.channel else None
    sources, refs = held_out(loaded)
    decode, cpu = loaded.config.decode, torch.device("cpu")

    def bleu(texts: list[str]) -> float:
        return round(sacrebleu.corpus_bleu(texts, [refs]).score, 2)

    tuned = translate_lines(loaded, sources, SearchOptions.from_config(decode), cpu)
    print(f"left-to-right, tuned (beam {decode.beam}, len_penalty {decode.len_penalty}): "
          f"{bleu(loaded.tgt_tok.decode([h[0].tokens if h else [] for h in tuned]))}")
    best: tuple[float, str, list[str]] = (-1.0, "", [])
    outputs: dict[str, list[str]] = {}
    for k in map(int, args.beams.split(",")):
        opts = SearchOptions.from_config(decode, beam=k, nbest=k)
        hyps = translate_lines(loaded, sources, opts, cpu)
        texts = [loaded.tgt_tok.decode([h.tokens for h in hs]) if hs else [""] for hs in hyps]
        own = [[(h.logprob, len(h.tokens)) for h in hs] for hs in hyps]
        if args.union:  # the right-to-left model's K best join, each new text scored by the left-to-right model
            for i, hs in enumerate(translate_lines(r2l, sources, opts, cpu)):
                texts[i] = list(dict.fromkeys(texts[i] + r2l.tgt_tok.decode([h.tokens for h in hs])))
            flat = [(i, j) for i, ts in enumerate(texts) for j in range(len(ts))]
            hyp_texts, src_texts = [texts[i][j] for i, j in flat], [sources[i] for i, _ in flat]
            forward = iter(zip(score_pairs(loaded, src_texts, hyp_texts, cpu),
                               map(len, loaded.tgt_tok.encode(hyp_texts)), strict=True))
            own = [[next(forward) for _ in ts] for ts in texts]
        flat = [(i, j) for i, hs in enumerate(own) for j in range(len(hs))]
        hyp_texts, src_texts = [texts[i][j] for i, j in flat], [sources[i] for i, _ in flat]
        zeros = [0.0] * len(flat)
        backwards = score_pairs(r2l, src_texts, hyp_texts, cpu) if r2l else zeros
        channels = score_pairs(channel, hyp_texts, src_texts, cpu) if channel else zeros
        src_lengths = [len(p) + 1 for p in channel.tgt_tok.encode(sources)] if channel else [1] * len(sources)
        extra: list[list[tuple[float, float]]] = [[] for _ in own]
        for (i, _), b, ch in zip(flat, backwards, channels, strict=True):
            extra[i].append((b, ch))
        row = {}
        for w in floats(args.weights) if r2l else [0.0]:
            for c in floats(args.channel_weights) if channel else [0.0]:
                for a in floats(args.penalties):
                    chosen = []
                    for hs, ts, ex, s in zip(own, texts, extra, src_lengths, strict=True):
                        combined = []
                        for (logprob, length), (b, ch) in zip(hs, ex, strict=True):
                            lp = length_penalty(length + 1, a)
                            lp_ch = lp if args.channel_length == "target" else length_penalty(s, a)
                            combined.append(((logprob + w * b) / lp + c * ch / lp_ch) / (1 + w + c))
                        chosen.append(ts[max(range(len(hs)), key=combined.__getitem__)] if hs else "")
                    name = f"w {w:g} " + (f"c {c:g} " if channel else "") + f"a {a:g}"
                    row[name] = score = bleu(chosen)
                    outputs[f"beam {k}, {name}"] = chosen
                    if score > best[0]:
                        best = (score, f"beam {k}, {name}", chosen)
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
