"""Would minimum Bayes risk reranking of the beam lift valid BLEU? Measured before mt builds it in.

For each beam size K: the valid split is translated with the checkpoint's length penalty, the K best kept per
sentence; then each sentence's output is the hypothesis with the highest expected sentence BLEU against the K
(Kumar and Byrne 2004), the others weighted by their model probabilities sharpened by a temperature (0: equal
weights). Sentence BLEU: n-grams up to 4, add-one smoothing above unigrams (Lin and Och 2004), over lowercased
13a words or over SentencePiece pieces. Prints corpus BLEU (cased sacreBLEU) of each choice beside the K-best
search's own best and the checkpoint's tuned setting.

    python benchmarks/mbr_valid.py CHECKPOINT [--beams 5,8] [--temperatures 0,0.5,1]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

import sacrebleu
import torch
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from mt.checkpoint import load_model
from mt.translate import Options, translate_lines
from mt.tune import held_out


def counts(units: list) -> tuple[int, list[Counter]]:
    return len(units), [Counter(tuple(units[i:i + n]) for i in range(len(units) - n + 1)) for n in range(1, 5)]


def sentence_bleu(hyp: tuple[int, list[Counter]], ref: tuple[int, list[Counter]]) -> float:
    (hyp_len, hyp_ngrams), (ref_len, ref_ngrams) = hyp, ref
    if hyp_len == 0:
        return 0.0
    log_precision = 0.0
    for n in range(4):
        matches = sum(min(c, ref_ngrams[n][g]) for g, c in hyp_ngrams[n].items())
        if n == 0 and matches == 0:
            return 0.0
        log_precision += math.log((matches + (n > 0)) / (max(hyp_len - n, 0) + (n > 0)))
    return math.exp(min(0.0, 1 - ref_len / hyp_len) + log_precision / 4)


def mbr_choice(stats: list[tuple[int, list[Counter]]], logprobs: list[float], temperature: float) -> int:
    """The index of the hypothesis (its `counts`) of highest expected BLEU against the others."""
    if temperature == 0:
        weights = [1.0] * len(stats)
    else:
        top = max(logprobs)
        weights = [math.exp((lp - top) / temperature) for lp in logprobs]
    gain = [sum(w * (1.0 if i == j else sentence_bleu(stats[i], stats[j])) for j, w in enumerate(weights))
            for i in range(len(stats))]
    return max(range(len(stats)), key=lambda i: gain[i])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--beams", default="5,8")
    parser.add_argument("--temperatures", default="0,0.5,1")
    args = parser.parse_args()
    loaded = load_model(args.checkpoint)
    sources, refs = held_out(loaded)
    decode, cpu, words = loaded.config.decode, torch.device("cpu"), Tokenizer13a()

    def bleu(texts: list[str]) -> float:
        return round(sacrebleu.corpus_bleu(texts, [refs]).score, 2)

    tuned = translate_lines(loaded, sources, Options.from_config(decode), cpu)
    print(f"tuned (beam {decode.beam}, len_penalty {decode.len_penalty}): "
          f"{bleu(loaded.tgt_tok.decode([h[0].tokens if h else [] for h in tuned]))}")
    for k in map(int, args.beams.split(",")):
        hyps = translate_lines(loaded, sources, Options.from_config(decode, beam=k, nbest=k), cpu)
        texts = [loaded.tgt_tok.decode([h.tokens for h in hs]) if hs else [""] for hs in hyps]
        row = {"k-best search's best": bleu([t[0] for t in texts])}
        stats = {"words": [[counts(words(t.lower()).split()) for t in ts] for ts in texts],  # once, for every T
                 "pieces": [[counts(h.tokens) for h in hs] for hs in hyps]}
        for temperature in map(float, args.temperatures.split(",")):
            for unit in ("words", "pieces"):
                chosen = [ts[mbr_choice(st, [h.logprob for h in hs], temperature)] if hs else ""
                          for hs, ts, st in zip(hyps, texts, stats[unit], strict=True)]
                row[f"MBR {unit}, T {temperature:g}"] = bleu(chosen)
        print(f"beam {k}, len_penalty {decode.len_penalty}: {row}")


if __name__ == "__main__":
    main()
