"""EPUB books for mt/documents/sentences.py: each XHTML page of the spine, and the navigation page, through
html.py (every byte of a page kept but the text translated); the table of contents of toc.ncx and the book's
title in the package (OPF) through lxml; every other part of the zip (images, styles, fonts) byte for byte.

The package is the one META-INF/container.xml names, and the pages the ones its manifest and spine name, each a
path inside the zip (one leading outside it, `../`, is refused). A page is decoded as its XML declaration or byte
order mark says (UTF-8 without either) and written back in the same encoding. A book with DRM (its pages listed
in META-INF/encryption.xml) is refused; one whose fonts only are obfuscated is read.
"""

from __future__ import annotations

import codecs
import posixpath
import re
from urllib.parse import unquote

from mt.documents.html import html_document
from mt.documents.runs import Run
from mt.documents.safe import parse_xml, read_zip, xml_text
from mt.documents.sentences import Document, Sentence
from mt.documents.zipped import Section, required, runs_section, xml_part, zip_document
from mt.errors import MtError

KIND = "EPUB"
CONTAINER = "META-INF/container.xml"
ENCRYPTION = "META-INF/encryption.xml"
OCF = "{urn:oasis:names:tc:opendocument:xmlns:container}"
OPF = "{http://www.idpf.org/2007/opf}"
DC = "{http://purl.org/dc/elements/1.1/}"
NCX = "{http://www.daisy.org/z3986/2005/ncx/}"
XENC = "{http://www.w3.org/2001/04/xmlenc#}"
PAGE_TYPES = {"application/xhtml+xml", "text/html"}
NCX_TYPE = "application/x-dtbncx+xml"
DECLARED = re.compile(rb"""<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")


def epub_document(data: bytes, name: str) -> Document:
    parts = read_zip(data, name, KIND)
    if parts.get("mimetype", b"application/epub+zip").strip() != b"application/epub+zip":
        raise MtError(f"{name}: its mimetype is {parts['mimetype'][:80]!r}, not an EPUB's (application/epub+zip)")
    required(parts, CONTAINER, name, KIND)
    container = xml_part(parts, CONTAINER, name)
    rootfile = next(container.tree.iter(OCF + "rootfile"), None)
    if rootfile is None or not rootfile.get("full-path"):
        raise MtError(f"{name}: {CONTAINER} names no package (<rootfile full-path=...>): a damaged EPUB")
    package = xml_part(parts, present(parts, inside(rootfile.get("full-path"), "", name, CONTAINER), name, CONTAINER),
                       name)
    base = posixpath.dirname(package.name)
    items = {item.get("id"): item for item in package.tree.iter(OPF + "item")}
    spine = [items[ref.get("idref")] for ref in package.tree.iter(OPF + "itemref") if ref.get("idref") in items]
    navigation = [item for item in items.values() if "nav" in (item.get("properties") or "").split()]
    pages = [item for item in spine if item.get("media-type") in PAGE_TYPES] + navigation
    paths = [present(parts, inside(item.get("href") or "", base, name, package.name), name, package.name)
             for item in pages]
    tocs = [present(parts, inside(item.get("href") or "", base, name, package.name), name, package.name)
            for item in items.values() if item.get("media-type") == NCX_TYPE]
    refuse_drm(parts, name, paths + tocs)
    labels = [(package, [Run(title, "text", title.text)]) for title in package.tree.iter(DC + "title")
              if title.text and len(title) == 0]
    for path in dict.fromkeys(tocs):
        toc = xml_part(parts, path, name)
        labels += [(toc, [Run(text, "text", text.text)]) for text in toc.tree.iter(NCX + "text") if text.text]
    return zip_document(data, [*(page_section(parts, path, name) for path in dict.fromkeys(paths)),
                               runs_section(labels)])


def inside(href: str, base: str, file: str, where: str) -> str:
    """The part `href` (relative to the folder `base`, URL-escaped, perhaps with a #fragment) names, or MtError
    if it leads outside the zip."""
    path = posixpath.normpath(posixpath.join(base, unquote(href.partition("#")[0])))
    if not href or "://" in href or path.startswith("/") or path.split("/")[0] == "..":
        raise MtError(f"{file}: {where} names {href!r}, not a part inside the EPUB: a damaged or malicious file")
    return path


def present(parts: dict[str, bytes], path: str, file: str, where: str) -> str:
    if path not in parts:
        raise MtError(f"{file}: {where} names {path}, which is not in the zip: a damaged EPUB")
    return path


def refuse_drm(parts: dict[str, bytes], file: str, paths: list[str]) -> None:
    """MtError if any of `paths` is encrypted (META-INF/encryption.xml names it): a book with DRM."""
    if ENCRYPTION in parts:
        encrypted = {unquote(ref.get("URI") or "") for ref in
                     parse_xml(parts[ENCRYPTION], f"{file}:{ENCRYPTION}").iter(XENC + "CipherReference")}
        for path in paths:
            if path in encrypted:
                raise MtError(f"{file}: {path} is encrypted (DRM); mt translates only books without DRM")


def page_section(parts: dict[str, bytes], path: str, file: str) -> Section:
    """An XHTML page as a section of units (html.py's), rendered in its own encoding."""
    raw, encoding = parts[path], encoding_of(parts[path])
    try:
        source = raw.decode(encoding)
    except (UnicodeDecodeError, LookupError) as error:
        raise MtError(f"{file}:{path}: cannot be read as {encoding} ({error})") from None
    if "<!ENTITY" in source:  # html.parser never expands one; refused, as in every XML mt reads
        parse_xml(raw, f"{file}:{path}")
    units, render = html_document(source, f"{file}:{path}")

    def render_page(sentences: list[list[Sentence]]) -> dict[str, bytes]:
        out = render([[(s.start, s.end, xml_text(s.text)) for s in unit] for unit in sentences])
        return {} if out == source else {path: out.encode(encoding, "xmlcharrefreplace")}
    return Section(units, render_page)


def encoding_of(raw: bytes) -> str:
    """A page's encoding: its byte order mark's, else its XML declaration's, else UTF-8."""
    if raw.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    declared = DECLARED.match(raw)
    return declared.group(1).decode("ascii") if declared else "utf-8"

