"""Untrusted files, bounded, for the file formats: a zip is read only within limits on its parts and their unpacked
size (no zip bomb), and refused when encrypted; XML is parsed without entities, DTDs or the network (no billion
laughs, no external entity ever reads a local file). Each refusal is one MtError naming the file and what is wrong.
A translated zip is written with the original's parts, in its order, with their names, dates and compression."""

from __future__ import annotations

import io
import re
import zipfile
from typing import TYPE_CHECKING

from mt.errors import MtError

if TYPE_CHECKING:  # lxml is imported where XML is read: PO files and the CLI need none
    from lxml import etree

MAX_FILE_BYTES = 64 << 20  # a document as uploaded or read whole
MAX_PARTS = 10_000
MAX_UNPACKED_BYTES = 512 << 20  # all parts together, unpacked
MAX_RATIO = 200  # unpacked / packed, per part: text compresses 5-20×; a bomb, thousands of times
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # what XML 1.0 cannot hold
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # an encrypted Office file (or a .doc of before 2007)


def check_size(data: bytes, name: str) -> None:
    if len(data) > MAX_FILE_BYTES:
        raise MtError(f"{name}: {len(data):,} bytes, more than the {MAX_FILE_BYTES:,} a document may have")


def a(kind: str) -> str:
    """`kind` with its article: a Word document, an EPUB."""
    return ("an " if kind[:1] in "AEIOU" else "a ") + kind


def read_zip(data: bytes, name: str, kind: str) -> dict[str, bytes]:
    """Each part of the zip `data` (a `kind` file: "Word document", "EPUB"...) by its name, in the zip's order."""
    check_size(data, name)
    if data.startswith(OLE_MAGIC):
        raise MtError(f"{name}: not a zip but an OLE file: a password-protected (encrypted) Office document, or one "
                      f"of the binary formats before 2007; save it without a password as {a(kind)}")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, EOFError) as error:
        raise MtError(f"{name}: not {a(kind)} ({a(kind)} is a zip file; this one cannot be opened: {error})") from None
    infos = archive.infolist()
    if len(infos) > MAX_PARTS:
        raise MtError(f"{name}: {len(infos):,} parts in the zip, more than the {MAX_PARTS:,} a document may have")
    total = 0
    for info in infos:
        if info.flag_bits & 0x1:
            raise MtError(f"{name}: {info.filename} is encrypted: a password-protected file; save it without a "
                          f"password")
        total += info.file_size
        if total > MAX_UNPACKED_BYTES or info.file_size > MAX_RATIO * max(info.compress_size, 1024):
            raise MtError(f"{name}: {info.filename} unpacks to {info.file_size:,} bytes from {info.compress_size:,}: "
                          f"a zip bomb, or a document larger than the {MAX_UNPACKED_BYTES:,} bytes mt unpacks")
    parts = {}
    try:
        for info in infos:
            with archive.open(info) as f:
                parts[info.filename] = f.read(info.file_size + 1)
            if len(parts[info.filename]) != info.file_size:  # a header that lies about the size
                raise MtError(f"{name}: {info.filename} is not the size its zip header says; the file is damaged")
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as error:
        raise MtError(f"{name}: {kind} damaged, cannot unpack it ({error})") from None
    return parts


def write_zip(data: bytes, changed: dict[str, bytes]) -> bytes:
    """The zip `data` with the parts named in `changed` replaced; every other part's bytes, and every part's
    name, order, date, attributes and compression, as they were (so an uncompressed `mimetype` stays first)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            part = changed[info.filename] if info.filename in changed else source.read(info)
            target.writestr(info, part, compress_type=info.compress_type)
    return out.getvalue()


PARSER_OPTIONS = dict(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False, huge_tree=False,
                      remove_blank_text=False, remove_comments=False, remove_pis=False, strip_cdata=False)


def parse_xml(data: bytes, name: str) -> etree._ElementTree:
    """The XML `data` (`name`: the file and part, for errors), refused if it declares entities."""
    from lxml import etree

    try:
        tree = etree.fromstring(data, etree.XMLParser(**PARSER_OPTIONS)).getroottree()
    except etree.XMLSyntaxError as error:
        raise MtError(f"{name}: not well-formed XML ({error})") from None
    dtd = tree.docinfo.internalDTD
    if dtd is not None and any(True for _ in dtd.iterentities()):
        raise MtError(f"{name}: declares XML entities (<!ENTITY> in a DTD), which documents never need and mt does "
                      f"not expand (entity expansion and external entities are how XML attacks work)")
    return tree


def xml_text(text: str) -> str:
    """`text` without the characters XML cannot hold (a model may write a control character)."""
    return NOT_XML.sub("", text)


def xml_bytes(tree: etree._ElementTree, original: bytes) -> bytes:
    """`tree`, parsed from `original`, written back as it was read: the declaration as `original` spelled it (and
    the whitespace after it), its encoding, its namespace prefixes."""
    from lxml import etree

    body = etree.tostring(tree, encoding=tree.docinfo.encoding or "UTF-8", xml_declaration=False)
    if not original.startswith(b"<?xml"):
        return body
    end = original.index(b"?>") + 2
    after = original[end:end + 16]
    return original[:end] + after[:len(after) - len(after.lstrip())] + body
