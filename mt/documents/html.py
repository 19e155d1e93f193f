"""HTML for mt/documents/sentences.py: the text of each block out as a unit to translate, the translations back in,
with the standard library's html.parser.

A unit is the text between two block boundaries: any tag but the inline ones (<b>, <a>, <span>, ...), so that a
sentence with a bold word in it is translated whole. Every tag, attribute, comment and declaration comes out as the
source had it, byte for byte, and so does what html.parser passes over ("</>"), a byte-order mark, all of a unit
with nothing translated in it and all that is inside <script>, <style>, <code>, <pre> (and the other elements of
UNTOUCHED) or an element marked translate="no" or class="notranslate". Such an element ends where the HTML standard
ends it: at its end tag, or where an end tag it may leave out is implied (a <p> at the next block, an <li> at the
next <li>: html_elements.py). A translation is written escaped (&, <, >), so that it can only ever be text. The
model sees no tags: an inline tag between two sentences stays where it was; one inside a sentence moves to the
sentence's edge (those that open go before it, those that close after it, nesting kept), so that it wraps the whole
translation.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser

from mt.documents.html_elements import OpenElements
from mt.errors import MtError

INLINE = frozenset("a abbr b bdi bdo big cite data del dfn em font i img ins label mark nobr q s small span strong "
                   "sub sup time tt u wbr".split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
UNTOUCHED = frozenset("script style code pre textarea kbd samp var svg math xmp iframe noembed noframes plaintext"
                      .split())

Translated = list[list[tuple[int, int, str]]]  # per unit, (start, end, what takes its place) of each sentence


@dataclass
class Tag:
    """An inline tag within a unit: where it is in the unit's text, its source, and whether it opens, closes or
    stands alone (an image, a <wbr>)."""

    at: int
    raw: str
    kind: str  # "open", "close" or "void"
    name: str


@dataclass
class Unit:
    """A block's text (entities decoded), its inline tags, and its source, for when nothing in it is translated."""

    text: str
    tags: list[Tag]
    raw: str


class Events(HTMLParser):
    """Every token of the source with its offset: (offset, kind, tag name or text, attributes)."""

    def __init__(self, source: str):
        super().__init__(convert_charrefs=True)
        self.lines = [0] + [m.end() for m in re.finditer("\n", source)]
        self.events: list[tuple[int, str, str, list]] = []

    def at(self) -> int:
        line, column = self.getpos()
        return self.lines[line - 1] + column

    def handle_starttag(self, tag, attrs):
        self.events.append((self.at(), "void" if tag in VOID else "open", tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self.events.append((self.at(), "void", tag, attrs))

    def handle_endtag(self, tag):
        self.events.append((self.at(), "close", tag, []))

    def handle_data(self, data):
        self.events.append((self.at(), "text", data, []))

    def handle_comment(self, data):
        self.events.append((self.at(), "other", "", []))

    handle_decl = handle_pi = unknown_decl = handle_comment


def html_document(source: str, name: str) -> tuple[list[str], Callable[[Translated], str]]:
    """The units' texts of an HTML document or fragment, and what puts the document back together from their
    sentences' translations. Raises MtError, naming `name` and the line, for what html.parser cannot read."""
    bom, source = ("\ufeff", source[1:]) if source.startswith("\ufeff") else ("", source)  # kept, not text
    parser = Events(source)
    try:
        parser.feed(source)
        unended = parser.rawdata  # what html.parser holds back: from a comment or tag that never ends, if any
        if unended.startswith("<"):  # to the end, as browsers read it; html.parser's close() would take O(n²) on it
            parser.events.append((len(source) - len(unended), "other", "", []))
        else:
            parser.close()
    except (AssertionError, ValueError) as error:  # html.parser is lenient: this is hardly HTML
        raise MtError(f"{name}:{parser.getpos()[0]}: cannot read this as HTML ({error}); is --format right?") \
            from None
    events = parser.events
    items: list[str | int] = [bom] + ([] if events else [source])  # the output: source, or the index of a unit
    units: list[Unit] = []
    texts: list[str] = []
    tags: list[Tag] = []
    length = 0  # of the unit's text so far
    start = 0  # where the unit being gathered starts in the source
    elements = OpenElements()
    untouched: int | None = None  # where the element being passed through is among the open elements

    def flush(end: int) -> None:
        nonlocal texts, tags, length
        if texts or tags:
            items.append(len(units))
            units.append(Unit("".join(texts), tags, source[start:end]))
        texts, tags, length = [], [], 0

    # Each token's source runs to the next one's: what html.parser skips (a stray "</>") stays with the one before.
    bounds = [0] + [offset for offset, *_ in events[1:]] + [len(source)]
    for (_, kind, what, attrs), begin, end in zip(events, bounds, bounds[1:], strict=False):
        raw = source[begin:end]
        elements.mark()
        if kind in ("open", "void"):
            elements.start(what, void=kind == "void")
        elif kind == "close":
            elements.end(what)
        if untouched is not None:
            if elements.lowest > untouched or kind != "open":  # still inside, or the end tag that ends it
                untouched = None if elements.lowest <= untouched else untouched
                items.append(raw)
                continue
            untouched = None  # ended by a tag that starts what follows it (<li> after <li translate="no">)
        if not texts and not tags:
            start = begin
        if kind == "text":
            texts.append(what)
            length += len(what)
            stop = text_end(source, begin, end, what)
            if stop < end:  # what html.parser passed over without a token ("</>"): kept, as a boundary
                flush(stop)
                items.append(source[stop:end])
        elif kind in ("open", "close", "void") and what in INLINE and not (kind == "open" and kept(what, attrs)):
            tags.append(Tag(length, raw, kind, what))
        else:
            flush(begin)
            items.append(raw)
            if kind == "open" and (what in UNTOUCHED or kept(what, attrs)):
                untouched = len(elements) - 1
    flush(len(source))

    def render(translated: Translated) -> str:
        return "".join(item if isinstance(item, str) else put_back(units[item], translated[item]) for item in items)
    return [unit.text for unit in units], render


def text_end(source: str, begin: int, end: int, text: str) -> int:
    """Where the source of the text token `text` at `begin` ends (at the next "<", as html.parser reads text), if
    before `end`, the next token's start."""
    stop = source.find("<", begin + 1, end)
    return stop if stop >= 0 and html.unescape(source[begin:stop]) == text else end


def kept(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
    """Whether an element is marked to be left untranslated: translate="no", or class notranslate."""
    values = dict(attrs)
    return (values.get("translate") or "").lower() == "no" or "notranslate" in (values.get("class") or "").split()


def put_back(unit: Unit, sentences: list[tuple[int, int, str]]) -> str:
    """The unit's HTML with each sentence's translation (escaped) in its place, and every tag."""
    if all(text == unit.text[s:e] for s, e, text in sentences):
        return unit.raw
    out: list[str] = []
    pos, tags = 0, list(unit.tags)

    def upto(end: int, inclusive: bool) -> None:  # the unit's own text and tags, as they were, up to `end`
        nonlocal pos
        while tags and (tags[0].at < end or (inclusive and tags[0].at == end)):
            out.extend([html.escape(unit.text[pos:tags[0].at], quote=False), tags[0].raw])
            pos = tags.pop(0).at
        out.append(html.escape(unit.text[pos:end], quote=False))
        pos = end

    for s, e, text in sentences:
        upto(s, inclusive=True)
        if text == unit.text[s:e]:  # kept as it is: its tags too
            upto(e, inclusive=False)
            continue
        inside = [tags.pop(0) for _ in range(sum(1 for t in tags if t.at < e))]
        before, after = around(inside)
        out.extend([t.raw for t in before] + [html.escape(text, quote=False)] + [t.raw for t in after])
        pos = e
    upto(len(unit.text), inclusive=True)
    return "".join(out)


def around(inside: list[Tag]) -> tuple[list[Tag], list[Tag]]:
    """The tags inside a translated sentence, moved to its edges so that they wrap it, nesting kept: (before,
    after). Pairs opened and closed inside wrap it; a tag opened before it and closed inside ends after it; one
    opened inside and closed after it starts before it (or, where the sentence also closes an outer tag, after it).
    Tags that do not nest keep their order, all after the sentence."""
    opened: list[Tag] = []
    closer: dict[int, Tag] = {}  # id of an opening tag closed inside → its closing tag
    outer: list[Tag] = []  # closing tags of elements opened before the sentence
    for tag in inside:
        if tag.kind == "open":
            opened.append(tag)
        elif tag.kind == "close":
            if opened and opened[-1].name == tag.name:
                closer[id(opened.pop())] = tag
            elif any(t.name == tag.name for t in opened):
                return [], inside
            else:
                outer.append(tag)
    pairs = [t for t in inside if t.kind == "void" or id(t) in closer]
    closing = [closer[id(t)] for t in reversed(pairs) if id(t) in closer]
    if outer:
        return pairs, closing + outer + opened
    return opened + pairs, closing
