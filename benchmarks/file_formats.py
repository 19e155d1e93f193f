"""What reading and writing Word, PowerPoint, OpenDocument and EPUB files costs mt, beside the model: Multi30k's
test2016 German sentences made into a file of each format with its own library (paragraphs of five sentences with
a bold word inside the third, in a Word file also a table; slides of a title and five bullets with notes;
chapters of an EPUB; the Office files' XML declarations spelled as Office spells them),
then translated by a stand-in for the model (upper case) through mt/documents: the median time of mt's own work
(unpack, parse, cut into sentences, place the translations, write the zip), the parts it rewrote, and the inputs
it gives the model (sentences, and spans of other formatting inside one, translated on their own too). Beside it,
for Word and PowerPoint, the same done with python-docx / python-pptx (each run upper-cased, then saved): its time,
and how many parts its save rewrote.

    python benchmarks/file_formats.py [--mirror ../shared/data] [--runs 5]

Needs the documents extra and the dev extra's python-docx, python-pptx, odfpy, ebooklib. One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import statistics
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import docx
import pptx
from ebooklib import epub
from odf.opendocument import OpenDocumentText
from odf.style import Style, TextProperties
from odf.text import P, Span

from mt.documents.formats import read_file
from mt.documents.sentences import finish, plan


def word(paragraphs: list[list[str]]) -> bytes:
    d = docx.Document()
    for sentences in paragraphs:
        before, word, after = bold_word(sentences)
        p = d.add_paragraph(before)
        p.add_run(word).bold = True
        p.add_run(after)
    table = d.add_table(rows=10, cols=5)
    for cell, sentences in zip((c for row in table.rows for c in row.cells), paragraphs, strict=False):
        cell.text = sentences[0]
    return saved(d)


def powerpoint(paragraphs: list[list[str]]) -> bytes:
    deck = pptx.Presentation()
    for sentences in paragraphs[::5]:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = sentences[0]
        slide.placeholders[1].text_frame.text = "\n".join(sentences)
        slide.notes_slide.notes_text_frame.text = " ".join(sentences)
    return saved(deck)


def opendocument(paragraphs: list[list[str]]) -> bytes:
    doc = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    for sentences in paragraphs:
        before, word, after = bold_word(sentences)
        p = P(text=before)
        p.addElement(Span(stylename=bold, text=word))
        p.addText(after)
        doc.text.addElement(p)
    return saved(doc)


def bold_word(sentences: list[str]) -> tuple[str, str, str]:
    """A paragraph of `sentences` cut around the second word of the third: the text before it, it, the rest."""
    first, word, *rest = sentences[2].split(" ")
    return (" ".join([*sentences[:2], first]) + " ", word, " " + " ".join([*rest, *sentences[3:]]))


def book(paragraphs: list[list[str]], folder: Path) -> bytes:
    b = epub.EpubBook()
    b.set_identifier("multi30k")
    b.set_title("Multi30k")
    chapters = []
    for k in range(0, len(paragraphs), 20):
        chapter = epub.EpubHtml(title=paragraphs[k][0], file_name=f"c{k}.xhtml")
        chapter.content = "".join(f"<p>{' '.join(s[:2])} <b>{s[2]}</b> {' '.join(s[3:])}</p>"
                                  for s in paragraphs[k:k + 20])
        b.add_item(chapter)
        chapters.append(chapter)
    b.toc, b.spine = chapters, chapters
    b.add_item(epub.EpubNcx())
    epub.write_epub(str(folder / "multi30k.epub"), b)
    return (folder / "multi30k.epub").read_bytes()


OFFICE_DECLARATION = b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\r\n'


def office_spelled(data: bytes) -> bytes:
    """The zip `data` with each XML part's declaration as Office writes it (python-docx writes its own), so that
    a library that re-serializes what it opened shows what it does to a file Word or PowerPoint wrote."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            part = source.read(info)
            if part.startswith(b"<?xml"):
                part = OFFICE_DECLARATION + part[part.index(b"?>") + 2:].lstrip()
            target.writestr(info, part)
    return out.getvalue()


def saved(doc) -> bytes:
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def mt_work(fmt: str, data: bytes) -> bytes:
    todo = plan([read_file(fmt, data, fmt)], "de", lambda texts: [len(t.split()) for t in texts], 200)
    return finish(todo, [part.upper() for part in todo.parts])[0]


def model_inputs(fmt: str, data: bytes) -> dict[str, int]:
    """What the model is given for the file: its inputs, those that are spans inside a sentence, and their words."""
    todo = plan([read_file(fmt, data, fmt)], "de", lambda texts: [len(t.split()) for t in texts], 200)
    spans = [span for unit in todo.sentences[0] for s in unit for span in s.spans if span.count]
    return {"inputs": len(todo.parts), "span_inputs": sum(span.count for span in spans),
            "words": sum(len(part.split()) for part in todo.parts),
            "span_words": sum(len(todo.parts[k].split()) for span in spans
                              for k in range(span.first, span.first + span.count))}


def library_work(fmt: str, data: bytes) -> bytes:
    """The alternative: the format's library opens the file, each run upper-cased, saved."""
    if fmt == "docx":
        d = docx.Document(io.BytesIO(data))
        paragraphs = [*d.paragraphs, *(p for t in d.tables for row in t.rows for c in row.cells for p in c.paragraphs)]
        runs = [r for p in paragraphs for r in p.runs]
    else:
        d = pptx.Presentation(io.BytesIO(data))
        frames = [s.text_frame for slide in d.slides for s in slide.shapes if s.has_text_frame]
        frames += [slide.notes_slide.notes_text_frame for slide in d.slides]
        runs = [r for f in frames for p in f.paragraphs for r in p.runs]
    for run in runs:
        run.text = run.text.upper()
    return saved(d)


def rewritten(before: bytes, after: bytes) -> str:
    with zipfile.ZipFile(io.BytesIO(before)) as old, zipfile.ZipFile(io.BytesIO(after)) as new:
        return f"{sum(old.read(n) != new.read(n) for n in old.namelist())}/{len(old.namelist())}"


def timed(work, fmt: str, data: bytes, runs: int) -> tuple[float, bytes]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = work(fmt, data)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 3), out


def cpu() -> str:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with gzip.open(args.mirror / "multi30k" / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    paragraphs = [lines[i:i + 5] for i in range(0, len(lines) - 4, 5)]
    with tempfile.TemporaryDirectory() as folder:
        files = {"docx": office_spelled(word(paragraphs)), "pptx": office_spelled(powerpoint(paragraphs)),
                 "odt": opendocument(paragraphs), "epub": book(paragraphs, Path(folder))}
    result = {"cpu": cpu(), "sentences": len(paragraphs) * 5}
    for fmt, data in files.items():
        seconds, out = timed(mt_work, fmt, data, args.runs)
        row = {"bytes": len(data), "mt_s": seconds, "mt_parts_rewritten": rewritten(data, out)}
        row |= model_inputs(fmt, data)
        if fmt in ("docx", "pptx"):
            seconds, out = timed(library_work, fmt, data, args.runs)
            row |= {"library_s": seconds, "library_parts_rewritten": rewritten(data, out)}
        result[fmt] = row
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
