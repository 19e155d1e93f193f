"""Which sentence splitter for `mt translate --format`: pysbd or sentencex, on real sentences in four languages.

Multi30k's valid sentences (de, en, fr, cs) are joined, `--per` at a time and with one space between them, into
paragraphs; each splitter cuts the paragraphs again, and a boundary counts as recovered when a piece starts exactly
where a sentence did. Recall is over every boundary, and over those after a sentence that ends in . ! ? (the others,
about 5% of Multi30k's, which sentencex and pysbd cannot see); precision is over the boundaries a splitter
proposed. mt's splitter (sentencex, then `missing_stops` over all the paragraphs as one document) is the third row.

    pip install pysbd sentencex
    python benchmarks/splitters.py [--mirror ../shared/data] [--split val] [--per 5]

Prints a Markdown table (docs/documents.md has it).
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

LANGS = ("de", "en", "fr", "cs")
PYSBD_LANG = {"cs": "sk"}  # pysbd has no Czech rules; Slovak's are the nearest it has
ENDS = (".", "!", "?", "…", '."', '!"', '?"')


def paragraphs(sentences: list[str], per: int) -> list[tuple[str, list[int], list[int]]]:
    """(paragraph, the offsets where its 2nd..nth sentences start, those of them after a sentence-final mark)."""
    out = []
    for i in range(0, len(sentences) - per + 1, per):
        group = [s.strip() for s in sentences[i:i + per]]
        starts, after_mark, pos = [], [], 0
        for k, sentence in enumerate(group):
            if k:
                starts.append(pos)
                if group[k - 1].endswith(ENDS):
                    after_mark.append(pos)
            pos += len(sentence) + 1
        out.append((" ".join(group), starts, after_mark))
    return out


def boundaries(pieces: list[str], text: str) -> set[int]:
    """The offsets in `text` where each piece after the first starts (its leading whitespace skipped)."""
    found, pos = set(), 0
    for k, piece in enumerate(pieces):
        at = text.find(piece.strip(), pos)
        if at < 0:  # a splitter that changed the text: count what it kept in order
            continue
        if k:
            found.add(at)
        pos = at + len(piece.strip())
    return found


def splitters(lang: str):
    """Each splitter as a function from the paragraphs to their pieces; mt's sees them as one document."""
    import pysbd
    import sentencex

    from mt.documents.sentences import missing_stops, split_sentences

    def mt_split(texts: list[str]) -> list[list[str]]:
        spans = missing_stops(texts, [split_sentences(text, lang, sentencex.segment) for text in texts])
        return [[text[s:e] for s, e in unit] for text, unit in zip(texts, spans, strict=True)]

    segmenter = pysbd.Segmenter(language=PYSBD_LANG.get(lang, lang), clean=False)
    return {"pysbd 0.3.4": lambda texts: [segmenter.segment(text) for text in texts],
            "sentencex": lambda texts: [list(sentencex.segment(lang, text)) for text in texts],
            "mt: sentencex, then missing stops": mt_split}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--split", default="val")
    parser.add_argument("--per", type=int, default=5)
    args = parser.parse_args()
    print("| language | splitter | boundaries recovered | after . ! ? | false splits | paragraphs exact | ms |")
    print("|---|---|---|---|---|---|---|")
    for lang in LANGS:
        with gzip.open(args.mirror / "multi30k" / f"{args.split}.{lang}.gz", "rt", encoding="utf-8") as f:
            data = paragraphs(f.read().splitlines(), args.per)
        for name, split in splitters(lang).items():
            total = marked = got = got_marked = proposed = exact = 0
            started = time.perf_counter()
            cut = split([text for text, _, _ in data])
            ms = (time.perf_counter() - started) * 1000
            for (text, starts, after_mark), pieces in zip(data, cut, strict=True):
                found = boundaries(pieces, text)
                total, marked, proposed = total + len(starts), marked + len(after_mark), proposed + len(found)
                got += len(found & set(starts))
                got_marked += len(found & set(after_mark))
                exact += found == set(starts)
            shown = f"{name} ({PYSBD_LANG[lang]} rules)" if lang in PYSBD_LANG and "pysbd" in name else name
            print(f"| {lang} | {shown} | {got}/{total} ({100 * got / total:.1f}%) | {got_marked}/{marked} "
                  f"({100 * got_marked / marked:.1f}%) | {proposed - got} | {exact}/{len(data)} | {ms:.0f} |")


if __name__ == "__main__":
    main()
