"""Plain text and SubRip subtitles for mt/documents/sentences.py: paragraphs and cues out as units to translate,
their translations back in, blank lines, cue numbers, timings, the markup at the edges of a cue's lines, a
speaker's dash and a byte-order mark kept as they were. SubRip is read as ffmpeg, Subtitle Edit and pysubs2 read
it: a cue starts wherever a timing line is, so a cue not followed by a blank line does not swallow the next."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from mt.documents.sentences import Document, Sentence, join
from mt.errors import MtError

BOM = "\ufeff"
NUMBER = re.compile(r"\s*\d+\s*$")
TIME = r"\d{1,3}:\d{1,2}:\d{1,2}[,.]\d{1,3}"  # ffmpeg and Subtitle Edit take a "." and short fields too
TIMING = re.compile(rf"\s*{TIME}\s*-->\s*{TIME}(?:\s.*)?$")  # and what follows it: X1:... Y2:...
MEANT_AS_TIMING = re.compile(r"\s*\d+:[\d:,.]*\s*-+>|.*-->\s*\d+:")  # a time and an arrow, but broken
DASH = re.compile(r"\s*[-‐–—](?![-\d])\s*")  # a speaker's turn in a dialogue (not -5, not --)
MARKUP = re.compile(r"</?(?:[bisu]|font)(?:\s[^<>]*)?>|\{\\[^{}]*\}", re.IGNORECASE)  # SubRip's <i>, <font ...>, {\an8}


def text_document(lines: list[str]) -> Document:
    """Paragraphs: runs of lines with text, between blank lines (kept as they are). A line break inside a
    paragraph is a soft wrap: kept where it falls between two sentences, a space inside one."""
    bom, lines = without_bom(lines)
    units: list[str] = []
    layout: list[str | int] = []  # a blank line, or the index of a paragraph
    for blank, group in itertools.groupby(lines, key=lambda line: not line.strip()):
        if blank:
            layout.extend(group)
        else:
            layout.append(len(units))
            units.append("\n".join(group))

    def render(sentences: list[list[Sentence]]) -> str:
        return bom + "\n".join(item if isinstance(item, str) else join(units[item], sentences[item])
                                for item in layout)
    return Document(units, render)


@dataclass
class Cue:
    """Lines of a subtitle's text: their unit, and the markup each line starts and ends with (<i>, {\\an8}), kept
    as it is on the line of the same place."""

    unit: int
    leads: list[str]
    trails: list[str]

    def lines(self, text: str) -> list[str]:
        """The cue's lines with `text` (its unit, translated) in them: as many as it had, unless there are not
        spaces enough to cut at, where the last takes the markup of those missing."""
        count = len(self.leads)
        lines = wrap(text.split("\n"), count)
        lines[count - 1:] = [" ".join(lines[count - 1:])]  # a translation has no line break: never more lines
        out = [lead + line + trail for lead, line, trail in zip(self.leads, lines, self.trails, strict=False)]
        out[-1] += "".join(lead + trail for lead, trail in zip(self.leads[len(lines):], self.trails[len(lines):],
                                                                strict=True))
        return out


def srt_document(lines: list[str], name: str) -> Document:
    """SubRip as ffmpeg and Subtitle Edit read it: a cue starts at a timing line (and the number line right
    before it, if there is one), wherever it is, blank line before it or not; its text runs to the next cue. Numbers,
    timings and blank lines are kept as they are; each speaker's turn in a run of a cue's lines between blank lines
    is a unit, written back on as many lines as it had. Refused, naming the line: text before the first cue, a line
    meant as a timing line that is not one, a number at the end without its timing."""
    bom, lines = without_bom(lines)
    timings = [i for i, line in enumerate(lines) if TIMING.match(line)]
    heads = [i - 1 if i and NUMBER.match(lines[i - 1]) else i for i in timings]  # where each cue starts
    before = lines[:heads[0]] if heads else lines
    check_timings(before, 0, name)
    first = next((i for i, line in enumerate(before) if line.strip()), None)
    if first is not None:
        raise MtError(f"{name}:{first + 1}: expected a cue (a number, then a timing line HH:MM:SS,mmm --> "
                      f"HH:MM:SS,mmm), found {lines[first][:40]!r}; is this SubRip (.srt)?")
    units: list[str] = []
    layout: list[str | Cue] = list(before)
    for head, timing, end in zip(heads, timings, [*heads[1:], len(lines)], strict=True):
        layout += lines[head:timing + 1]
        for blank, group in itertools.groupby(range(timing + 1, end), key=lambda i: not lines[i].strip()):
            at = list(group)
            if blank:
                layout += [lines[i] for i in at]
                continue
            check_timings([lines[i] for i in at], at[0], name)
            layout += cues([lines[i] for i in at], units)
    last = next((i for i in reversed(range(len(lines))) if lines[i].strip()), None)
    if last is not None and NUMBER.match(lines[last]) and (last == 0 or not lines[last - 1].strip()):
        raise MtError(f"{name}:{last + 2}: a broken timing line, the end of the file: the last cue has its number "
                      f"but no timing (is the file cut short?); SubRip's is HH:MM:SS,mmm --> HH:MM:SS,mmm")

    def render(sentences: list[list[Sentence]]) -> str:
        out = []
        for item in layout:
            out.extend(item.lines(join(units[item.unit], sentences[item.unit])) if isinstance(item, Cue) else [item])
        return bom + "\n".join(out)
    return Document(units, render)


def check_timings(lines: list[str], offset: int, name: str) -> None:
    """MtError for a line of `lines` (the first at line `offset` + 1) meant as a timing line but not one."""
    broken = next((i for i, line in enumerate(lines) if MEANT_AS_TIMING.match(line)), None)
    if broken is not None:
        raise MtError(f"{name}:{offset + broken + 1}: a broken timing line, {lines[broken][:60]!r}: SubRip's is "
                      f"HH:MM:SS,mmm --> HH:MM:SS,mmm")


def cues(block: list[str], units: list[str]) -> list[Cue]:
    """The Cues of a run of a subtitle's lines, one for each speaker's turn (a line that starts with a dash, "- Hi."
    "- Bye.": two), their texts, without the markup and the dash at each line's edges, added to `units`."""
    out: list[Cue] = []
    for line in block:
        start, stop = edges(line)
        turn = DASH.match(line, start)
        if turn:
            start = turn.end()
        if turn or not out:
            out.append(Cue(len(units), [], []))
            units.append("")
        out[-1].leads.append(line[:start])
        out[-1].trails.append(line[max(start, stop):])
        units[-1] += ("\n" if len(out[-1].leads) > 1 else "") + line[start:max(start, stop)]
    return out


def edges(line: str) -> tuple[int, int]:
    """Where a subtitle line's text starts and ends: after the markup it opens with, before the markup it ends with
    (spaces between them included); a line of markup alone has none."""
    spans = [m.span() for m in MARKUP.finditer(line)]  # not a regex anchored at the end: linear on any line
    start = 0
    for begin, end in spans:
        if line[start:begin].strip():
            break
        start = end
    stop = len(line)
    for begin, end in reversed(spans):
        if end <= start or line[end:stop].strip():
            break
        stop = begin
    return start, max(start, stop)


def without_bom(lines: list[str]) -> tuple[str, list[str]]:
    """A document's byte-order mark (kept: a player may need it to see UTF-8), and its lines without it."""
    if lines and lines[0].startswith(BOM):
        return BOM, [lines[0][1:], *lines[1:]]
    return "", lines


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
