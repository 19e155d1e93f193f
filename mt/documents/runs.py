"""Runs of text in XML (a Word or PowerPoint run, an OpenDocument span): a unit's text is the concatenation of its
runs', and `place` puts the unit's translated sentences back into them, every element kept.

The rule for inline formatting: a sentence inside one run is translated in that run. A sentence across runs of
one formatting goes whole into the one holding most of its letters (the first of those that tie). A sentence
across runs formatted differently is grouped (`groups`): runs of its dominant formatting (the one holding most
of its letters), and spans of another (a bold word, an italic phrase, a link's text), each span's text also
translated on its own (`spans`, through Document.spans). The translation is then cut by projection.py: each span
gets the stretch of the translation where its own translation (or its source text) is found, the dominant runs
the rest, in order; a span not found, words where it stood. A link whose text is not found wraps the whole
translation instead, so that the sentence stays clickable (as html.py moves an <a> to the sentence's edges). A
group's piece goes into its run with most letters; the other runs the sentence covered keep their part outside
the sentence and lose the part inside; they stay, empty if nothing is left, with their properties, and so does
every element between them (an image, a footnote reference, a bookmark), in order. Text between sentences stays
where it was.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from lxml import etree

from mt.documents.projection import cut, find
from mt.documents.safe import xml_text
from mt.documents.sentences import Sentence

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


@dataclass
class Run:
    """A piece of a unit's text: `node.text` (or `node.tail`, with `slot` "tail"), or, with `slot` "", text that is
    there but cannot be written (an OpenDocument <text:s/>: spaces). `linked`: inside a hyperlink; `spaces`: the
    node needs xml:space="preserve" to keep spaces at its edges (Word's <w:t>); `style`: its formatting as a
    reader sees it (the same for runs that look alike, and another for each link)."""

    node: etree._Element
    slot: str
    text: str
    linked: bool = False
    spaces: bool = False
    style: str = ""

    @property
    def kind(self) -> tuple[bool, str]:
        """Its formatting: whether it is linked, and its style."""
        return self.linked, self.style

    def write(self, text: str) -> None:
        text = xml_text(text)
        setattr(self.node, self.slot, text)
        if self.spaces and text != text.strip():
            self.node.set(XML_SPACE, "preserve")


@dataclass
class Group:
    """Runs next to each other in a sentence, formatted alike (their indexes), their text in it, and the one that
    takes their piece of the translation (None: none can be written); `span`: where in the unit's text they hold a
    stretch of the sentence formatted otherwise than most of it (None: its dominant formatting)."""

    runs: list[int]
    text: str
    holder: int | None
    kind: tuple[bool, str]  # its formatting: (linked, style)
    span: tuple[int, int] | None = None


def text_of(runs: list[Run]) -> str:
    return "".join(run.text for run in runs)


def bounds_of(runs: list[Run]) -> list[int]:
    """Where each run starts in the unit's text, and where the last ends."""
    return [0, *itertools.accumulate(len(run.text) for run in runs)]


def groups(runs: list[Run], text: str, bounds: list[int], start: int, end: int) -> list[Group]:
    """The runs (their text, and `bounds_of` them) covering text[start:end] (a sentence), grouped: its dominant
    formatting (the one holding most of its letters, the first of those that tie; a group possibly of no run), a
    span, the dominant, ..., the dominant. A stretch of another formatting without a letter or digit (a bold
    comma) goes with the dominant runs. A group's holder is the run that can be written of its formatting holding
    most letters (the first of those that tie), else of another."""
    covered = [i for i in range(len(runs)) if bounds[i] < end and bounds[i + 1] > start]
    if len(covered) == 1:  # a sentence in one run, as most are
        return [Group(covered, text[start:end], covered[0] if runs[covered[0]].slot else None, runs[covered[0]].kind)]
    letters = {i: sum(map(str.isalpha, text[max(start, bounds[i]):min(end, bounds[i + 1])])) for i in covered}
    by_style = Counter()
    for i in covered:
        by_style[runs[i].kind] += letters[i]
    dominant = max(by_style, key=by_style.__getitem__, default=(False, ""))

    def group(members: list[int], kind: tuple[bool, str] = dominant, span: tuple[int, int] | None = None) -> Group:
        writable = [i for i in members if runs[i].slot]
        inside = text[max(start, bounds[members[0]]):min(end, bounds[members[-1] + 1])] if members else ""
        holder = max(writable, key=lambda i: (runs[i].kind == kind, letters[i], -i), default=None)
        return Group(members, inside, holder, kind, span)

    if len(by_style) <= 1:  # one formatting, as most sentences are
        return [group(covered)]
    out, waiting = [], []  # the groups so far; the dominant runs since the last span
    for style, alike in itertools.groupby(covered, key=lambda i: runs[i].kind):
        members = list(alike)
        a, b = max(start, bounds[members[0]]), min(end, bounds[members[-1] + 1])
        a, b = a + len(text[a:b]) - len(text[a:b].lstrip()), a + len(text[a:b].rstrip())
        if style != dominant and any(c.isalnum() for c in text[a:b]):
            out += [group(waiting), group(members, style, (a, b))]
            waiting = []
        else:
            waiting += members
    return [*out, group(waiting)]


def spans(runs: list[Run], sentences: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """For each sentence (start, end) of the unit of `runs`, the stretches of it formatted otherwise than most of
    it: each is translated on its own too, to be found in the sentence's translation."""
    text, bounds = text_of(runs), bounds_of(runs)
    return [[g.span for g in groups(runs, text, bounds, start, end)[1::2]] for start, end in sentences]


def place(runs: list[Run], sentences: list[Sentence]) -> bool:
    """Each translated sentence of the unit made of `runs` written into them (the rule above); whether any was."""
    text, bounds = text_of(runs), bounds_of(runs)
    pieces = {k: share(runs, text, bounds, s) for k, s in enumerate(sentences) if s.text != text[s.start:s.end]}
    if not pieces:
        return False
    for i, run in enumerate(runs):
        if not run.slot:
            continue
        start, end = bounds[i], bounds[i + 1]
        out, pos = [], start
        for k, given in pieces.items():
            s = sentences[k]
            if s.start < end and s.end > start:
                out += [text[pos:max(s.start, start)], given.get(i, "")]
                pos = min(s.end, end)
        out.append(text[pos:end])
        if "".join(out) != run.text:
            run.write("".join(out))
    return True


def share(runs: list[Run], text: str, bounds: list[int], sentence: Sentence) -> dict[int, str]:
    """The translation of `sentence` cut for the runs it covers: run index → its piece (the rule above)."""
    parts = groups(runs, text, bounds, sentence.start, sentence.end)
    if len(parts) == 1:  # runs of one formatting
        return {parts[0].holder: sentence.text}
    spanned = parts[1::2]
    translated = {(t.start, t.end): t.text for t in sentence.spans}
    found = find(sentence.text, [[translated.get(g.span, ""), text[slice(*g.span)]] for g in spanned])
    lost = [g for g, f in zip(spanned, found, strict=True) if f is None and g.kind[0]]
    if lost:
        return {lost[0].holder: sentence.text}
    given: dict[int, str] = {}
    holders = [g.holder for g in parts]
    kinds = [None if g.holder is None else runs[g.holder].kind for g in parts]  # the formatting each piece gets
    for k, piece in enumerate(cut(sentence.text, found, [g.text for g in parts], kinds)):
        # a group of no run that can be written (no dominant run between two spans): the one before takes its piece
        owner = next(h for h in [*holders[k::-1], *holders[k + 1:]] if h is not None)
        given[owner] = given.get(owner, "") + piece
    return given
