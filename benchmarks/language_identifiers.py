"""Which language identifier for mt serve's `/detect` and `source: "auto"`: py3langid or lingua, on real sentences.

Each of Multi30k's valid sentences (de, en, fr, cs: 1,014 a language) is identified alone, once among the four
languages only (as mt serve asks: among the languages its models translate from) and once among every language the
identifier knows; accuracy is the share named right, over whole sentences and over their first two words (what a
user types into a box before the page asks), time the mean per whole sentence after a warm-up (loading excluded,
and timed on its own).

    pip install py3langid lingua-language-detector
    python benchmarks/language_identifiers.py [--mirror ../shared/data] [--split val]

Prints a Markdown table (docs/serving.md has it).
"""

from __future__ import annotations

import argparse
import gzip
import time
from collections.abc import Callable
from pathlib import Path

LANGS = ("de", "en", "fr", "cs")


def py3langid(among: tuple[str, ...] | None) -> Callable[[str], str]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if among:
        identifier.set_languages(list(among))
    return lambda text: identifier.classify(text)[0]


def lingua(among: tuple[str, ...] | None) -> Callable[[str], str]:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    languages = [Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())) for code in among] if among \
        else None
    builder = LanguageDetectorBuilder.from_languages(*languages) if languages \
        else LanguageDetectorBuilder.from_all_languages()
    detector = builder.with_preloaded_language_models().build()

    def identify(text: str) -> str:
        found = detector.detect_language_of(text)
        return found.iso_code_639_1.name.lower() if found else "?"
    return identify


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=Path("../shared/data"))
    parser.add_argument("--split", default="val")
    args = parser.parse_args()
    sentences = {lang: gzip.open(args.mirror / "multi30k" / f"{args.split}.{lang}.gz", "rt", encoding="utf-8")
                 .read().splitlines() for lang in LANGS}
    print("| identifier | among | load (s) | " + " | ".join(LANGS) + " | all | first 2 words | ms a sentence |")
    print("|---|---|---|" + "---|" * (len(LANGS) + 3))
    for name, build in (("py3langid", py3langid), ("lingua", lingua)):
        for among in (LANGS, None):
            started = time.perf_counter()
            identify = build(among)
            identify("warm up")
            loaded = time.perf_counter() - started
            right, short, total, seconds = {}, 0, 0, 0.0
            for lang, lines in sentences.items():
                started = time.perf_counter()
                right[lang] = sum(identify(line) == lang for line in lines)
                seconds += time.perf_counter() - started
                short += sum(identify(" ".join(line.split()[:2])) == lang for line in lines)
                total += len(lines)
            cells = " | ".join(f"{100 * right[lang] / len(sentences[lang]):.1f}%" for lang in LANGS)
            print(f"| {name} | {'these 4' if among else 'all it knows'} | {loaded:.2f} | {cells} | "
                  f"{100 * sum(right.values()) / total:.1f}% | {100 * short / total:.1f}% | "
                  f"{1000 * seconds / total:.3f} |")


if __name__ == "__main__":
    main()
