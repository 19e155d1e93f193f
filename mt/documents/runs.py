"""Runs of text in XML (a Word or PowerPoint run, an OpenDocument span): a unit's text is the concatenation of its
runs', and `place` puts the unit's translated sentences back into them, every element kept.

The rule for inline formatting, html.py's in spirit: a sentence inside one run is translated in that run. A
sentence across runs goes whole into one of them: a linked run if it covers one (so that the link wraps the whole
translation, as html.py moves an <a> to the sentence's edges), else the run holding most of its letters (its
dominant formatting; the first of those that tie). The other runs it covered keep their part outside the
sentence and lose the part inside; they stay, empty if nothing is left, with their properties, and so does every
element between them (an image, a footnote reference, a bookmark), in order. Text between sentences stays where
it was.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from lxml import etree

from mt.documents.safe import xml_text
from mt.documents.sentences import Sentence

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


@dataclass
class Run:
    """A piece of a unit's text: `node.text` (or `node.tail`, with `slot` "tail"), or, with `slot` "", text that is
    there but cannot be written (an OpenDocument <text:s/>: spaces). `linked`: inside a hyperlink; `spaces`: the
    node needs xml:space="preserve" to keep spaces at its edges (Word's <w:t>)."""

    node: etree._Element
    slot: str
    text: str
    linked: bool = False
    spaces: bool = False

    def write(self, text: str) -> None:
        text = xml_text(text)
        setattr(self.node, self.slot, text)
        if self.spaces and text != text.strip():
            self.node.set(XML_SPACE, "preserve")


def text_of(runs: list[Run]) -> str:
    return "".join(run.text for run in runs)


def place(runs: list[Run], sentences: list[Sentence]) -> bool:
    """Each translated sentence of the unit made of `runs` written into them (the rule above); whether any was."""
    text = text_of(runs)
    bounds = [0, *itertools.accumulate(len(run.text) for run in runs)]
    owners = {}  # index of a translated sentence → the run it goes into
    for k, s in enumerate(sentences):
        if s.text != text[s.start:s.end]:
            covered = [i for i, run in enumerate(runs) if run.slot and bounds[i] < s.end and bounds[i + 1] > s.start]
            if len(covered) == 1:
                owners[k] = covered[0]
            elif covered:
                owners[k] = max(covered, key=lambda i: (runs[i].linked, letters(text, bounds[i], bounds[i + 1], s), -i))
    if not owners:
        return False
    for i, run in enumerate(runs):
        if not run.slot:
            continue
        start, end = bounds[i], bounds[i + 1]
        out, pos = [], start
        for k, owner in owners.items():
            s = sentences[k]
            if s.start < end and s.end > start:
                out.append(text[pos:max(s.start, start)])
                if owner == i:
                    out.append(s.text)
                pos = min(s.end, end)
        out.append(text[pos:end])
        if "".join(out) != run.text:
            run.write("".join(out))
    return True


def letters(text: str, start: int, end: int, sentence: Sentence) -> int:
    """How many of `sentence`'s letters lie in text[start:end]."""
    return sum(map(str.isalpha, text[max(start, sentence.start):min(end, sentence.end)]))
