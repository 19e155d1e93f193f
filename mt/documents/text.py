"""Plain text and SubRip subtitles for mt/documents/sentences.py: paragraphs and cues out as units to translate,
their translations back in, blank lines, cue numbers, timings and a cue's markup kept as they were."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from mt.documents.sentences import Document, Sentence, join
from mt.errors import MtError

NUMBER = re.compile(r"\s*\d+\s*$")
TIMING = re.compile(r"\s*\d+:\d\d:\d\d[,.]\d{1,3}\s*-->\s*\d+:\d\d:\d\d[,.]\d{1,3}(\s.*)?$")
MARKUP = r"(?:<[^<>]*>|\{[^{}]*\})"  # a subtitle's <i>, </font>, {\an8}
LEADING_MARKUP = re.compile(rf"^(?:\s*{MARKUP})+")
TRAILING_MARKUP = re.compile(rf"(?:{MARKUP}\s*)+$")


def text_document(lines: list[str]) -> Document:
    """Paragraphs: runs of lines with text, between blank lines (kept as they are). A line break inside a
    paragraph is a soft wrap: kept where it falls between two sentences, a space inside one."""
    units: list[str] = []
    layout: list[str | int] = []  # a blank line, or the index of a paragraph
    for blank, group in itertools.groupby(lines, key=lambda line: not line.strip()):
        if blank:
            layout.extend(group)
        else:
            layout.append(len(units))
            units.append("\n".join(group))

    def render(sentences: list[list[Sentence]]) -> str:
        return "\n".join(item if isinstance(item, str) else join(units[item], sentences[item]) for item in layout)
    return Document(units, render)


@dataclass
class Cue:
    """A subtitle's text: its unit, the lines it had, and the markup around it (<i>, {\\an8}), kept as it is."""

    unit: int
    lines: int
    lead: str
    trail: str


def srt_document(lines: list[str], name: str) -> Document:
    """SubRip: cues of a number, a timing line and lines of text, between blank lines. Numbers and timings are
    kept as they are; a cue's lines are one unit, written back on as many lines as the cue had."""
    units: list[str] = []
    layout: list[str | Cue] = []
    i = 0
    while i < len(lines):
        if not lines[i].strip():
            layout.append(lines[i])
            i += 1
            continue
        if not NUMBER.match(lines[i]):
            raise MtError(f"{name}:{i + 1}: expected a cue number, found {lines[i][:40]!r}; is this SubRip (.srt)?")
        if i + 1 == len(lines) or not TIMING.match(lines[i + 1]):
            found = repr(lines[i + 1][:60]) if i + 1 < len(lines) else "the end of the file"
            raise MtError(f"{name}:{i + 2}: a broken timing line, {found}: SubRip's is "
                          f"HH:MM:SS,mmm --> HH:MM:SS,mmm")
        end = next((j for j in range(i + 2, len(lines)) if not lines[j].strip()), len(lines))
        layout += lines[i:i + 2]
        if end > i + 2:
            text = "\n".join(lines[i + 2:end])
            lead = LEADING_MARKUP.match(text)
            trail = TRAILING_MARKUP.search(text, lead.end() if lead else 0)
            start, stop = lead.end() if lead else 0, trail.start() if trail else len(text)
            layout.append(Cue(len(units), end - i - 2, text[:start], text[stop:]))
            units.append(text[start:stop])
        i = end

    def render(sentences: list[list[Sentence]]) -> str:
        out = []
        for item in layout:
            if isinstance(item, Cue):
                text = join(units[item.unit], sentences[item.unit])
                out.append(item.lead + "\n".join(wrap(text.split("\n"), item.lines)) + item.trail)
            else:
                out.append(item)
        return "\n".join(out)
    return Document(units, render)


def wrap(lines: list[str], count: int) -> list[str]:
    """`lines`, the longest cut in two at its space nearest the middle until there are `count` (or no space)."""
    lines = list(lines)
    while len(lines) < count:
        longest = max(range(len(lines)), key=lambda i: len(lines[i]))
        line = lines[longest]
        spaces = [i for i, c in enumerate(line) if c == " "]
        if not spaces:
            break
        cut = min(spaces, key=lambda i: abs(i - len(line) / 2))
        lines[longest:longest + 1] = [line[:cut].rstrip(), line[cut:].lstrip()]
    return lines
