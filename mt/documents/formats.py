"""Every document format mt reads and writes, by name: `mt translate --format NAME`, mt serve's `format` and
/translate_file. A text format reads the lines of a decoded file and renders text; a file format reads the file's
bytes (a zip of XML, or a text file that declares its own encoding) and renders bytes."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from mt.documents.html import html_document
from mt.documents.po import po_document
from mt.documents.sentences import Document, splitter
from mt.documents.text import srt_document, text_document
from mt.errors import MtError


def html(lines: list[str], name: str) -> Document:
    units, render = html_document("\n".join(lines), name)
    return Document(units, lambda sentences: render([[(s.start, s.end, s.text) for s in unit] for unit in sentences]))


TEXT_FORMATS: dict[str, Callable[[list[str], str], Document]] = {
    "text": lambda lines, name: text_document(lines),
    "html": html,
    "srt": srt_document,
}


def needs_lxml(module: str, reader: str) -> Callable[[bytes, str], Document]:
    """The reader `reader` of mt.documents.`module`, imported when first called: it needs lxml (the documents
    extra), which mt needs for nothing else."""
    def read(data: bytes, name: str) -> Document:
        try:
            import lxml  # noqa: F401
        except ImportError:
            raise MtError("Word, PowerPoint, OpenDocument, EPUB and XLIFF files are read with lxml, which is not "
                          "installed: pip install 'mt[documents]' (or pip install lxml)") from None
        return getattr(importlib.import_module(f"mt.documents.{module}"), reader)(data, name)
    return read


FILE_FORMATS: dict[str, Callable[[bytes, str], Document]] = {
    "docx": needs_lxml("ooxml", "docx_document"),
    "pptx": needs_lxml("ooxml", "pptx_document"),
    "odt": needs_lxml("opendocument", "odt_document"),
    "odp": needs_lxml("opendocument", "odp_document"),
    "epub": needs_lxml("epub", "epub_document"),
    "po": po_document,
    "xliff": needs_lxml("xliff", "xliff_document"),
}
FORMATS = ("lines", *TEXT_FORMATS, *FILE_FORMATS)  # lines: one sentence a line, mt translate's way without --format
SUFFIXES = {".txt": "text", ".html": "html", ".htm": "html", ".xhtml": "html", ".srt": "srt",
            ".pot": "po", ".xlf": "xliff"} | {  # a POT translated is a PO
    f".{fmt}": fmt for fmt in FILE_FORMATS}


def read_document(fmt: str, lines: list[str], name: str) -> Document:
    """The document of text format `fmt` whose lines (without their line ends) are `lines`; `name` (a file, or a
    request's text) is what an error about it says. Raises MtError for what cannot be read as one."""
    splitter()  # the clear message for a missing splitter, before any work
    if fmt not in TEXT_FORMATS:
        raise MtError(f"format {fmt!r}: must be one of {', '.join(TEXT_FORMATS)}")
    return TEXT_FORMATS[fmt](lines, name)


def read_file(fmt: str, data: bytes, name: str) -> Document:
    """The document of file format `fmt` whose bytes are `data`; its `render` returns the translated file's bytes.
    Raises MtError, naming `name` and what is wrong, for what cannot be read as one."""
    splitter()
    if fmt not in FILE_FORMATS:
        raise MtError(f"format {fmt!r}: must be one of {', '.join(FILE_FORMATS)}")
    return FILE_FORMATS[fmt](data, name)


def format_of(filename: str) -> str:
    """The format a file's suffix names (`report.docx`: docx), or MtError naming the suffixes known."""
    suffix = "." + filename.rpartition(".")[2].lower() if "." in filename else ""
    if suffix not in SUFFIXES:
        raise MtError(f"{filename}: no format for the suffix {suffix or '(none)'!r}; known: {', '.join(SUFFIXES)}")
    return SUFFIXES[suffix]
