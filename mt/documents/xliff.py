"""XLIFF 1.2 and 2.0/2.1 for mt/documents/sentences.py: each untranslated source out as a unit to translate, its
translation back in as the target, marked for review; through lxml, entities off (mt/documents/safe.py).

A unit is a 1.2 `<trans-unit>`'s source (its `<seg-source>` where it has one) or a 2.x `<segment>`'s source. Only
those without a target (or with an empty one) are translated; nothing marked `translate="no"` (on the unit, or on
a group or file around it) is, nor a 2.x `<ignorable>`. Everything else stays as it was: files, groups, notes, ids,
the targets there are. The target mt writes goes after its source, with the source's inline codes; it is marked
as a machine translation to review: 1.2 `state="needs-review-translation" state-qualifier="mt-suggestion"`; 2.x
has no state for that (initial, translated, reviewed, final), and its segment gets `state="initial"`, which
translate-toolkit (and so Weblate) reads as fuzzy, and Okapi as not yet translated.

The model sees no codes. Inline codes follow mt/documents/html.py's rule for inline tags: a paired code (1.2 `<g>`,
2.x `<pc>`, `<mrk>`) between two sentences stays where it was, one inside a sentence moves to its edge, nesting
kept; a standalone code (`<x/>`, `<bx/>`, `<ph>`, `<sc/>`..., and a `<mrk>` marked protected or translate="no",
kept whole with its text) does likewise. None is ever dropped, and each keeps its id and attributes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from lxml import etree

from mt.documents.html import around
from mt.documents.safe import check_size, parse_xml, xml_bytes
from mt.documents.sentences import Document, Sentence
from mt.errors import MtError

XLIFF_1 = "urn:oasis:names:tc:xliff:document:1.2"
XLIFF_2 = "urn:oasis:names:tc:xliff:document:2.0"  # 2.1's too
PAIRED = {XLIFF_1: {"g", "mrk"}, XLIFF_2: {"pc", "mrk"}}  # codes with text to translate inside; the rest stand alone
MT_MARK = {XLIFF_1: {"state": "needs-review-translation", "state-qualifier": "mt-suggestion"}}


@dataclass
class Code:
    """An inline code within a unit's text: where it is, whether it opens, closes or stands alone, and its element
    in the source (html.around reads only `kind` and `name`)."""

    at: int
    kind: str  # "open", "close" or "void"
    name: str
    element: etree._Element


@dataclass
class Unit:
    """A source to translate: its text, its codes, and where its target goes."""

    text: str
    codes: list[Code]
    source: etree._Element  # the <source> (or <seg-source>) whose content the target copies
    holder: etree._Element  # the <trans-unit> or <segment> the target belongs in
    target: etree._Element | None  # an empty target there is


def xliff_document(data: bytes, name: str) -> Document:
    """The untranslated sources of the XLIFF file `data`, and what writes it back with their targets. Raises
    MtError, naming `name` and the line, for what is not XLIFF 1.2 or 2.x."""
    check_size(data, name)
    tree = parse_xml(data, name)
    ns = xliff_namespace(tree.getroot(), name)
    units = [read_unit(holder, ns, name) for holder in tree.iter(f"{{{ns}}}trans-unit", f"{{{ns}}}segment")
             if translatable(holder, ns)]
    units = [unit for unit in units if unit is not None]

    def render(sentences: list[list[Sentence]]) -> bytes:
        for unit, unit_sentences in zip(units, sentences, strict=True):
            write_target(unit, unit_sentences, ns)
        return xml_bytes(tree, data)
    return Document([unit.text for unit in units], render)


def xliff_namespace(root: etree._Element, name: str) -> str:
    """The namespace of an XLIFF 1.2 or 2.0/2.1 root, or MtError saying what the file is instead."""
    qname = etree.QName(root)
    version = root.get("version", "")
    if qname.localname != "xliff":
        raise MtError(f"{name}:{root.sourceline}: not XLIFF: the root element is <{qname.localname}>, not <xliff>")
    if (qname.namespace, version) in ((XLIFF_1, "1.2"), (XLIFF_2, "2.0"), (XLIFF_2, "2.1")):
        return qname.namespace
    raise MtError(f"{name}:{root.sourceline}: XLIFF version {version or '(none)'!r} in namespace "
                  f"{qname.namespace or '(none)'!r}: mt reads XLIFF 1.2 ({XLIFF_1}) and 2.0/2.1 ({XLIFF_2}); save it "
                  f"as one of those")


def translatable(holder: etree._Element, ns: str) -> bool:
    """Whether a trans-unit or segment is to be translated: the nearest translate="..." around it is not "no"."""
    for element in holder.iterancestors() if holder.tag == f"{{{ns}}}segment" else [holder, *holder.iterancestors()]:
        if element.get("translate") is not None:
            return element.get("translate").lower() != "no"
    return True


def read_unit(holder: etree._Element, ns: str, name: str) -> Unit | None:
    """The unit of a trans-unit or segment that has no target yet (None where it has one)."""
    source = holder.find(f"{{{ns}}}source")
    if source is None:
        what = etree.QName(holder).localname
        raise MtError(f"{name}:{holder.sourceline}: <{what} id={holder.get('id')!r}> has no <source>; every "
                      f"{what} needs one")
    target = holder.find(f"{{{ns}}}target")
    if target is not None and (len(target) or (target.text or "").strip()):
        return None
    source = holder.find(f"{{{ns}}}seg-source") if holder.find(f"{{{ns}}}seg-source") is not None else source
    texts: list[str] = []
    codes: list[Code] = []
    length = 0  # of the text so far

    def add(text: str | None) -> None:
        nonlocal length
        texts.append(text or "")
        length += len(text or "")

    def walk(element: etree._Element) -> None:
        add(element.text)
        for child in element:
            local = etree.QName(child).localname if isinstance(child.tag, str) else ""
            if child.tag == f"{{{ns}}}{local}" and local in PAIRED[ns] and not protected(child):
                codes.append(Code(length, "open", local, child))
                walk(child)
                codes.append(Code(length, "close", local, child))
            else:  # a standalone code, a comment, an element of another namespace: kept whole
                codes.append(Code(length, "void", local, child))
            add(child.tail)
    walk(source)
    return Unit("".join(texts), codes, source, holder, target)


def protected(mark: etree._Element) -> bool:
    """A marker whose text is not to be translated: 1.2's mtype="protected", 2.x's translate="no"."""
    return mark.get("mtype") == "protected" or (mark.get("translate") or "").lower() == "no"


def write_target(unit: Unit, sentences: list[Sentence], ns: str) -> None:
    """The unit's target, its sentences' translations in place with the source's codes, marked for review."""
    target = unit.target
    if target is None:
        target = unit.holder.makeelement(f"{{{ns}}}target", {})
        before = unit.source  # the <source>, or the <seg-source> that follows it
        previous = before.getprevious()
        indent = unit.holder.text if previous is None else previous.tail
        before.addnext(target)
        target.tail = before.tail
        if indent is not None and not indent.strip():
            before.tail = indent
        space = unit.source.get("{http://www.w3.org/XML/1998/namespace}space")
        if space is not None:
            target.set("{http://www.w3.org/XML/1998/namespace}space", space)
        unit.target = target  # a second render rewrites this one
    for child in list(target):
        target.remove(child)
    target.text = None
    build(target, pieces(unit, sentences))
    marks = MT_MARK.get(ns)
    for key, value in (marks or {}).items():
        target.set(key, value)
    if marks is None:  # 2.x: the state is the segment's
        unit.holder.set("state", "initial")


def pieces(unit: Unit, sentences: list[Sentence]) -> list[str | Code]:
    """The target's content in order: text and the source's codes, each translated sentence in its place with
    the codes inside it moved to its edges (html.around)."""
    out: list[str | Code] = []
    pos, codes = 0, list(unit.codes)

    def upto(end: int, inclusive: bool) -> None:  # the unit's own text and codes, as they were, up to `end`
        nonlocal pos
        while codes and (codes[0].at < end or (inclusive and codes[0].at == end)):
            out.extend([unit.text[pos:codes[0].at], codes[0]])
            pos = codes.pop(0).at
        out.append(unit.text[pos:end])
        pos = end

    for s in sentences:
        upto(s.start, inclusive=True)
        if s.text == unit.text[s.start:s.end]:
            upto(s.end, inclusive=False)
            continue
        inside = [codes.pop(0) for _ in range(sum(1 for c in codes if c.at < s.end))]
        before, after = around(inside)
        out.extend([*before, s.text, *after])
        pos = s.end
    upto(len(unit.text), inclusive=True)
    return out


def build(target: etree._Element, content: list[str | Code]) -> None:
    """`content` written into the empty `target`: text, copies of the standalone codes, and of the paired ones
    (their attributes) holding what comes between their opening and closing."""
    stack = [target]
    opened: dict[int, etree._Element] = {}
    for piece in content:
        parent = stack[-1]
        if isinstance(piece, str):
            if len(parent):
                parent[-1].tail = (parent[-1].tail or "") + piece
            else:
                parent.text = (parent.text or "") + piece
        elif piece.kind == "void":
            element = copy.deepcopy(piece.element)
            element.tail = None
            parent.append(element)
        elif piece.kind == "open":
            element = parent.makeelement(piece.element.tag, dict(piece.element.attrib))
            parent.append(element)
            stack.append(element)
            opened[id(piece.element)] = element
        else:  # the codes come from a tree, so they nest: close up to the one this ends
            while len(stack) > 1 and stack.pop() is not opened.get(id(piece.element)):
                pass
