"""OpenDocument text (.odt) and presentations (.odp) for mt/documents/sentences.py: the text of their paragraphs
out as units, the translations back into their spans (runs.py), every other byte of the zip kept.

Read: every paragraph and heading of content.xml (the body with its tables, lists, frames and text boxes,
footnotes and endnotes, comments, slides and their notes, a presentation's footer text) and of styles.xml's
master pages (headers and footers, what a master slide shows). Not read: deleted text kept for tracked changes,
and placeholders (presentation:placeholder="true": the prompt an empty one shows while editing). Inside a
paragraph, spans and links are runs of its text and <text:s/> its spaces; a tab, a line break or a field with
text (a page number, a date, a cross-reference) ends a unit, as <br> does in HTML, and is kept as it is; a
note, a frame, a bookmark or a comment inside a paragraph stays where it was and does not cut it.
"""

from __future__ import annotations

from lxml import etree

from mt.documents.runs import Run
from mt.documents.safe import a, parse_xml, read_zip
from mt.documents.sentences import Document
from mt.documents.zipped import required, runs_section, xml_part, zip_document
from mt.errors import MtError

TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"
OFFICE = "{urn:oasis:names:tc:opendocument:xmlns:office:1.0}"
PRESENTATION = "{urn:oasis:names:tc:opendocument:xmlns:presentation:1.0}"
XLINK = "{http://www.w3.org/1999/xlink}"
MANIFEST = "{urn:oasis:names:tc:opendocument:xmlns:manifest:1.0}"
UNITS = (TEXT + "p", TEXT + "h", PRESENTATION + "footer-decl", PRESENTATION + "header-decl")
INLINE = {TEXT + "span", TEXT + "a", TEXT + "meta"}
BREAKS = {TEXT + "tab", TEXT + "line-break"}
MAX_SPACES = 1000  # a <text:s text:c="…"/> asking for more is damaged, or an attack on memory
MIME = {"odt": ("application/vnd.oasis.opendocument.text", "OpenDocument text"),
        "odp": ("application/vnd.oasis.opendocument.presentation", "OpenDocument presentation")}


def odt_document(data: bytes, name: str) -> Document:
    return opendocument(data, name, "odt")


def odp_document(data: bytes, name: str) -> Document:
    return opendocument(data, name, "odp")


def opendocument(data: bytes, name: str, fmt: str) -> Document:
    mime, kind = MIME[fmt]
    parts = read_zip(data, name, kind)
    found = parts.get("mimetype", mime.encode()).decode("ascii", "replace").strip()
    if not found.startswith(mime):
        raise MtError(f"{name}: its mimetype is {found[:80]!r}, not {a(kind)} ({mime}): is --format {fmt} right?")
    refuse_encrypted(parts, name)
    required(parts, "content.xml", name, kind)
    content = xml_part(parts, "content.xml", name)
    units = [(content, runs) for p in content.tree.iter(*UNITS) if translated(p) for runs in odf_lines(p)]
    if "styles.xml" in parts:
        styles = xml_part(parts, "styles.xml", name)
        masters = styles.tree.getroot().find(OFFICE + "master-styles")
        units += [(styles, runs) for p in (masters.iter(*UNITS) if masters is not None else ()) if translated(p)
                  for runs in odf_lines(p)]
    return zip_document(data, [runs_section(units)])


def refuse_encrypted(parts: dict[str, bytes], name: str) -> None:
    """MtError if the manifest says parts are encrypted: a password-protected document."""
    if "META-INF/manifest.xml" in parts:
        manifest = parse_xml(parts["META-INF/manifest.xml"], f"{name}:META-INF/manifest.xml")
        if next(manifest.iter(MANIFEST + "encryption-data"), None) is not None:
            raise MtError(f"{name}: password-protected (its parts are encrypted); save it without a password")


def translated(paragraph: etree._Element) -> bool:
    """Whether a paragraph is text to translate: not deleted text of a tracked change, nor a placeholder's."""
    return not any(a.tag == TEXT + "tracked-changes" or a.get(PRESENTATION + "placeholder") == "true"
                   for a in paragraph.iterancestors())


def odf_lines(paragraph: etree._Element) -> list[list[Run]]:
    """The runs of text of an OpenDocument paragraph: its text, and its spans' and links' (their text and each
    child's tail), cut at tabs, line breaks and fields; not those of a paragraph inside it (a note's, a text
    box's), which is one of its own. A run's style: the styles of the spans around it, and its link."""
    lines: list[list[Run]] = [[]]

    def walk(node: etree._Element, linked: bool, style: str) -> None:
        lines[-1].append(Run(node, "text", node.text or "", linked, style=style))
        for child in node:
            tag = child.tag if isinstance(child.tag, str) else ""  # a comment's or a processing instruction's
            if tag in INLINE:
                name, href = child.get(TEXT + "style-name"), child.get(XLINK + "href")
                inner = style + f" {name or ''}:{href or ''}" if name or href else style  # a bare span: no formatting
                walk(child, linked or tag == TEXT + "a", inner)
            elif tag == TEXT + "s":
                lines[-1].append(Run(child, "", " " * spaces(child), style=style))
            elif tag in BREAKS or (tag.startswith(TEXT) and tag != TEXT + "note" and "".join(child.itertext()).strip()):
                lines.append([])
            lines[-1].append(Run(child, "tail", child.tail or "", linked, style=style))
    walk(paragraph, False, "")
    return [line for line in lines if any(run.text for run in line)]


def spaces(space: etree._Element) -> int:
    try:
        return min(max(int(space.get(TEXT + "c", "1")), 1), MAX_SPACES)
    except ValueError:
        return 1

