"""A document that is a zip of parts (Word, PowerPoint, OpenDocument, EPUB): sections of units, each putting its
translations back into the parts it read; the zip written back with only the parts that changed replaced
(safe.write_zip: every other part's bytes, and the order, names and compression of all, as they were)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lxml import etree

from mt.documents.runs import Run, place, spans, text_of
from mt.documents.safe import a, parse_xml, write_zip, xml_bytes
from mt.documents.sentences import Document, Sentence
from mt.errors import MtError


@dataclass
class Section:
    """Units of some parts, and what renders them translated: the parts that changed, by name, as bytes; and
    what names the stretches of a unit's sentences to translate on their own too (Document.spans)."""

    units: list[str]
    render: Callable[[list[list[Sentence]]], dict[str, bytes]]
    spans: Callable[[int, list[tuple[int, int]]], list[list[tuple[int, int]]]] | None = None


@dataclass
class XmlPart:
    """A part of the zip parsed as XML, kept with its bytes to write it back as it was spelled."""

    name: str
    original: bytes
    tree: etree._ElementTree


def required(parts: dict[str, bytes], part: str, file: str, kind: str) -> bytes:
    """The part named `part`, or MtError naming it: the file is no `kind`, or a damaged one."""
    if part not in parts:
        raise MtError(f"{file}: no {part} in the zip: not {a(kind)}, or a damaged one")
    return parts[part]


def xml_part(parts: dict[str, bytes], part: str, file: str) -> XmlPart:
    """The part `part` of the zip read from `file`, parsed (safe.parse_xml: no entities)."""
    return XmlPart(part, parts[part], parse_xml(parts[part], f"{file}:{part}"))


def runs_section(units: list[tuple[XmlPart, list[Run]]]) -> Section:
    """A section whose units are runs of text in XML parts: each translation placed in its runs (runs.place), a
    span of other formatting inside a sentence translated on its own too (runs.spans)."""
    def render(sentences: list[list[Sentence]]) -> dict[str, bytes]:
        changed = {part.name: part for (part, runs), unit in zip(units, sentences, strict=True) if place(runs, unit)}
        return {name: xml_bytes(part.tree, part.original) for name, part in changed.items()}
    return Section([text_of(runs) for _, runs in units], render, lambda i, sentences: spans(units[i][1], sentences))


def zip_document(data: bytes, sections: list[Section]) -> Document:
    """The zip `data` as one document of its sections' units; rendered, the zip with the changed parts replaced."""
    def render(sentences: list[list[Sentence]]) -> bytes:
        changed, pos = {}, 0
        for section in sections:
            changed |= section.render(sentences[pos:pos + len(section.units)])
            pos += len(section.units)
        return write_zip(data, changed)
    where = [(section, i) for section in sections for i in range(len(section.units))]  # a unit's section, index in it

    def unit_spans(unit: int, sentences: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        section, i = where[unit]
        return section.spans(i, sentences) if section.spans else [[] for _ in sentences]
    return Document([unit for section in sections for unit in section.units], render, unit_spans)
