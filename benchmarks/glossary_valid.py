"""Glossaries on Multi30k valid: how often each method places the terms, what it does to BLEU, and what it costs.

The glossary is drawn reproducibly: a word lexicon from the training data (each source word's target word of
highest Dice coefficient over sentence co-occurrence, kept when the two are each other's best, seen together at
least --min-count times, Dice at least --min-dice), then the entries whose source word is in valid's source and
whose target word is in the reference of every valid sentence whose source holds it (whole words, case-sensitive
as the glossary matches them). It is written to --glossary-out, for `mt translate --glossary`.

valid (never test) is then translated without the glossary and with it by each method: `constrain` (lexically
constrained beam search), `replace` (the source term replaced by the target term) and `placeholder` (the source
term replaced by a placeholder token the model may copy, put back as the target term afterwards; measured here
only, as mt does not offer it). Prints, per setting: the share of term occurrences whose target term is in the
output (whole words), cased sacreBLEU on all of valid and on the sentences with a term, and the seconds taken.
Then the speed, steadier than one pass on a shared machine: the first --timed sentences with a term, translated
--repeats times by each method in turn (the fastest of each kept), in sentences per second.

    python benchmarks/glossary_valid.py CHECKPOINT [--data /work/shared/data/multi30k] [--beams 4]
        [--methods none,constrain,replace,placeholder] [--glossary-out glossary.tsv] [--timed 200] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from pathlib import Path

import sacrebleu
import torch

from mt.data.lines import read_text, write_lines
from mt.decode.glossary import Glossary, Term, placed
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines

WORD = re.compile(r"\w+")
PLACEHOLDER = "XTERM{}"  # numbered per term of a line; put back after translation


def lexicon(src: list[str], tgt: list[str], min_count: int, min_dice: float) -> dict[str, str]:
    """Source word → target word, each the other's best by Dice over the sentences they occur in."""
    n_src, n_tgt, pairs = Counter(), Counter(), Counter()
    for s_line, t_line in zip(src, tgt, strict=True):
        s_words, t_words = set(WORD.findall(s_line)), set(WORD.findall(t_line))
        n_src.update(s_words)
        n_tgt.update(t_words)
        pairs.update((s, t) for s in s_words for t in t_words)
    best_t: dict[str, tuple[float, str]] = {}
    best_s: dict[str, tuple[float, str]] = {}
    for (s, t), c in pairs.items():
        if c < min_count:
            continue
        dice = 2 * c / (n_src[s] + n_tgt[t])
        if dice > best_t.get(s, (0.0, ""))[0]:
            best_t[s] = (dice, t)
        if dice > best_s.get(t, (0.0, ""))[0]:
            best_s[t] = (dice, s)
    return {s: t for s, (dice, t) in best_t.items()
            if dice >= min_dice and best_s[t][1] == s and len(s) > 2 and not s.isdigit()}


def draw_glossary(lex: dict[str, str], src: list[str], ref: list[str]) -> list[Term]:
    """The lexicon's entries whose source word is in valid's source and whose target word is in the reference of
    every sentence that holds it."""
    holds: dict[str, bool] = {}
    for s_line, r_line in zip(src, ref, strict=True):
        for word in set(WORD.findall(s_line)):
            if word in lex:
                holds[word] = holds.get(word, True) and placed(lex[word], r_line)
    return [Term(s, lex[s]) for s in sorted(holds) if holds[s]]


def with_placeholders(glossary: Glossary, lines: list[str]) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """Each line with its source terms replaced by numbered placeholders, and what each placeholder stands for."""
    out, maps = [], []
    for line in lines:
        found = {t.source: (PLACEHOLDER.format(i + 1), t.target) for i, t in enumerate(glossary.find(line))}
        out.append(glossary.pattern.sub(lambda m, f=found: f[m.group()][0], line) if found else line)
        maps.append(list(found.values()))
    return out, maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/multi30k"))
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--beams", default="4")
    parser.add_argument("--methods", default="none,constrain,replace,placeholder")
    parser.add_argument("--timed", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-count", type=int, default=10)
    parser.add_argument("--min-dice", type=float, default=0.5)
    parser.add_argument("--glossary-out", type=Path, default=Path("glossary.tsv"))
    parser.add_argument("--outputs", type=Path, help="write each setting's translations into this directory")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    train_src, train_tgt = (read_text(args.data / f"train.{lang}.gz") for lang in (args.src, args.tgt))
    src, ref = (read_text(args.data / f"val.{lang}.gz") for lang in (args.src, args.tgt))
    lex = lexicon(train_src, train_tgt, args.min_count, args.min_dice)
    terms = draw_glossary(lex, src, ref)
    write_lines(args.glossary_out, [f"{t.source}\t{t.target}" for t in terms])
    glossary = Glossary(tuple(terms))
    found = [glossary.find(line) for line in src]
    with_terms = [i for i, f in enumerate(found) if f]
    occurrences = sum(len(f) for f in found)
    print(f"lexicon {len(lex)} entries; glossary {len(terms)} terms ({args.glossary_out}); valid: {len(src)} "
          f"sentences, {len(with_terms)} with a term, {occurrences} term occurrences")
    print(f"CPU threads {torch.get_num_threads()}")
    loaded = load_model(args.checkpoint)
    device = torch.device("cpu")
    methods, beams = args.methods.split(","), [int(b) for b in args.beams.split(",")]

    def run(method: str, beam: int, lines: list[str]) -> list[str]:
        opts = SearchOptions.from_config(loaded.config.decode, beam=beam)
        gloss = Glossary(tuple(terms), method) if method in ("constrain", "replace") else None
        maps = None
        if method == "placeholder":
            lines, maps = with_placeholders(glossary, lines)
        hyps = translate_lines(loaded, lines, opts, device, glossary=gloss)
        out = [loaded.tgt_tok.decode([h[0].tokens])[0] if h else "" for h in hyps]
        for i, pairs in enumerate(maps or []):
            for placeholder, target in pairs:
                out[i] = out[i].replace(placeholder, target)
        return out

    print("| setting | beam | terms placed | BLEU valid | BLEU on lines with terms | seconds |")
    print("|---|---|---|---|---|---|")
    for beam in beams:
        for method in methods:
            started = time.perf_counter()
            out = run(method, beam, src)
            seconds = time.perf_counter() - started
            hits = sum(placed(t.target, out[i]) for i, f in enumerate(found) for t in f)
            bleu = sacrebleu.corpus_bleu(out, [ref]).score
            sub = sacrebleu.corpus_bleu([out[i] for i in with_terms], [[ref[i] for i in with_terms]]).score
            print(f"| {method} | {beam} | {hits}/{occurrences} = {100 * hits / occurrences:.1f}% | {bleu:.2f} | "
                  f"{sub:.2f} | {seconds:.1f} |", flush=True)
            if args.outputs is not None:
                args.outputs.mkdir(parents=True, exist_ok=True)
                write_lines(args.outputs / f"{method}.beam{beam}.{args.tgt}", out)
    timed = [src[i] for i in with_terms[:args.timed]]
    best = {(m, b): float("inf") for b in beams for m in methods}
    for _ in range(args.repeats):
        for beam in beams:
            for method in methods:
                started = time.perf_counter()
                run(method, beam, timed)
                best[method, beam] = min(best[method, beam], time.perf_counter() - started)
    print(f"\nspeed: {len(timed)} sentences with a term, fastest of {args.repeats}")
    print("| setting | beam | sentences/s | time against none |")
    print("|---|---|---|---|")
    for (method, beam), seconds in best.items():
        against = f"{seconds / best['none', beam]:.2f}x" if ("none", beam) in best else "-"
        print(f"| {method} | {beam} | {len(timed) / seconds:.1f} | {against} |")


if __name__ == "__main__":
    main()
