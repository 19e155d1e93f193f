"""Word (.docx) and PowerPoint (.pptx) files for mt/documents/sentences.py: the text of their paragraphs out as
units, the translations back into their runs (runs.py), every other byte of the zip kept.

The parts read are those [Content_Types].xml names as holding text. Word: the body with its tables and text
boxes, headers, footers, footnotes, endnotes and comments; deleted text (<w:delText>), field codes
(<w:instrText>) and hidden runs (<w:vanish/>) are not read. PowerPoint: slides with their tables and notes
slides, SmartArt, and what layouts and masters show outside their placeholders (whose text is the prompt an
empty placeholder shows while editing); charts are not read. A tab, a line break or a field (a slide number, a
date) ends a unit, as <br> does in HTML: what is on either side of it is translated on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from lxml import etree

from mt.documents.runs import Run
from mt.documents.safe import a, parse_xml, read_zip
from mt.documents.sentences import Document
from mt.documents.zipped import XmlPart, required, runs_section, xml_part, zip_document
from mt.errors import MtError

W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
P = "{http://schemas.openxmlformats.org/presentationml/2006/main}"
CONTENT_TYPES = "[Content_Types].xml"
CT = "{http://schemas.openxmlformats.org/package/2006/content-types}"
WORD_INLINE = {W + tag for tag in "hyperlink ins moveTo smartTag sdt sdtContent fldSimple customXml bdo dir".split()}
WORD_BREAKS = {W + tag for tag in ("tab", "ptab", "br", "cr")}
OFF = {"0", "false", "off"}
R_ID = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}id"
UNSEEN_WORD = {W + tag for tag in ("lang", "noProof", "rPrChange")}  # run properties a reader does not see
UNSEEN_SLIDE = {"lang", "altLang", "dirty", "err", "noProof", "smtClean", "smtId", "bmk"}  # (a:rPr attributes)


@dataclass(frozen=True)
class Office:
    """What an Office format reads: its main part (by the usual name, for errors, and what its content type
    says), and by the last word of their content types, the parts whose text it translates, and those whose text
    it translates outside placeholders only."""

    kind: str
    main: str
    families: tuple[str, ...]
    text: frozenset[str]
    masters: frozenset[str] = frozenset()


WORD = Office("Word document", "word/document.xml", ("wordprocessingml", "ms-word"),
              frozenset("main header footer footnotes endnotes comments chart".split()))
POWERPOINT = Office("PowerPoint presentation", "ppt/presentation.xml", ("presentationml", "ms-powerpoint"),
                    frozenset("slide notesSlide diagramData diagramDrawing chart".split()),
                    frozenset("slideLayout slideMaster notesMaster".split()))


@dataclass
class Field:
    """A Word field (<w:fldChar> begin ... separate ... end): its code (`HYPERLINK "https://..."`), and whether
    the walk is in its result, the text it shows."""

    code: str = ""
    shown: bool = False


def docx_document(data: bytes, name: str) -> Document:
    parts = read_zip(data, name, WORD.kind)
    units = [(part, runs) for part, _ in text_parts(parts, name, WORD)
             for p in part.tree.iter(W + "p", A + "p")  # a chart's titles are DrawingML paragraphs
             for runs in (word_lines(p) if p.tag == W + "p" else slide_lines(p))]
    return zip_document(data, [runs_section(units)])


def pptx_document(data: bytes, name: str) -> Document:
    parts = read_zip(data, name, POWERPOINT.kind)
    units = [(part, runs) for part, master in text_parts(parts, name, POWERPOINT)
             for p in part.tree.iter(A + "p") if not (master and in_placeholder(p)) for runs in slide_lines(p)]
    return zip_document(data, [runs_section(units)])


def text_parts(parts: dict[str, bytes], file: str, office: Office) -> list[tuple[XmlPart, bool]]:
    """The parts of `office`'s kind whose text is translated, parsed, in the zip's order; and for each, whether
    it is a master (its placeholders not translated). MtError if the main part is missing."""
    types = parse_xml(required(parts, CONTENT_TYPES, file, office.kind), f"{file}:{CONTENT_TYPES}")
    names = {part.lower(): part for part in parts}  # part names are case-insensitive (ECMA-376 part 2, 9.1.1.1)
    found, main = {}, None
    for override in types.iter(CT + "Override"):
        part = names.get(override.get("PartName", "").lstrip("/").lower())
        content_type = override.get("ContentType", "")
        last = content_type.rpartition(".")[2].removesuffix("+xml")
        if part and last == "main" and any(family in content_type for family in office.families):
            main = part
        if part and (last in office.text or last in office.masters):
            found[part] = last in office.masters
    if main is None:
        raise MtError(f"{file}: no {office.main} (the main part) in the zip: not {a(office.kind)}, or a damaged one")
    return [(xml_part(parts, part, file), found[part]) for part in parts if part in found]


def word_lines(paragraph: etree._Element) -> list[list[Run]]:
    """The runs of text of a Word paragraph (<w:p>), cut at tabs and line breaks; not those of a paragraph inside
    it (a text box's), which is one of its own. The shown text of a HYPERLINK field is linked, as a <w:hyperlink>.
    A run's style: its link, and the properties of its <w:r> a reader sees."""
    lines: list[list[Run]] = [[]]
    fields: list[Field] = []  # the complex fields open where the walk is

    def walk(node: etree._Element, link: str) -> None:
        for child in node:
            if child.tag == W + "r" and not hidden(child):
                for item in child:
                    shown = [f.code for f in fields if f.shown and f.code.split()[:1] == ["HYPERLINK"]]
                    style = " ".join([link, *shown[-1:], word_format(child)])
                    if item.tag == W + "t":
                        lines[-1].append(Run(item, "text", item.text or "", bool(link or shown), True, style))
                    elif item.tag == W + "fldChar":
                        field(item.get(W + "fldCharType"))
                    elif item.tag == W + "instrText" and fields:
                        fields[-1].code += item.text or ""
                    elif item.tag in WORD_BREAKS:
                        lines.append([])
                    elif item.tag == W + "noBreakHyphen":
                        lines[-1].append(Run(item, "", "\u2011", style=style))
            elif child.tag in WORD_INLINE:
                here = f"link:{child.get(R_ID) or ''}#{child.get(W + 'anchor') or ''}"
                walk(child, here if child.tag == W + "hyperlink" else link)
    def field(kind: str | None) -> None:
        if kind == "begin":
            fields.append(Field())
        elif kind == "separate" and fields:
            fields[-1].shown = True
        elif kind == "end" and fields:
            fields.pop()
    walk(paragraph, "")
    return [line for line in lines if line]


def word_format(run: etree._Element) -> str:
    """A Word run's formatting as a reader sees it: its properties (<w:rPr>), less the language and the like."""
    props = run.find(W + "rPr")
    return "" if props is None else b"".join(
        etree.tostring(p, with_tail=False) for p in props if p.tag not in UNSEEN_WORD).decode()


def hidden(run: etree._Element) -> bool:
    vanish = run.find(f"{W}rPr/{W}vanish")
    return vanish is not None and vanish.get(W + "val", "true") not in OFF


def slide_lines(paragraph: etree._Element) -> list[list[Run]]:
    """The runs of text of a DrawingML paragraph (<a:p>), cut at line breaks and fields."""
    lines: list[list[Run]] = [[]]
    for child in paragraph:
        if child.tag == A + "r" and (t := child.find(A + "t")) is not None:
            lines[-1].append(Run(t, "text", t.text or "", child.find(f"{A}rPr/{A}hlinkClick") is not None,
                                 style=slide_format(child)))
        elif child.tag in (A + "br", A + "fld"):
            lines.append([])
    return [line for line in lines if line]


def slide_format(run: etree._Element) -> str:
    """A DrawingML run's formatting as a reader sees it: its properties (<a:rPr>: attributes and children, a link
    among them), less the language, the spelling marks and the like."""
    props = run.find(A + "rPr")
    if props is None:
        return ""
    seen = sorted((name, value) for name, value in props.attrib.items() if name not in UNSEEN_SLIDE)
    return repr(seen) + b"".join(etree.tostring(p, with_tail=False) for p in props).decode()


def in_placeholder(paragraph: etree._Element) -> bool:
    """Whether a paragraph is in a placeholder shape (<p:ph> in its shape's properties)."""
    shape = next(paragraph.iterancestors(P + "sp"), None)
    return shape is not None and shape.find(f"{P}nvSpPr/{P}nvPr/{P}ph") is not None
