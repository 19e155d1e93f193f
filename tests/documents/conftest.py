"""What the tests of the file formats share: a file translated by a stand-in for the model, a tiny image, and the
check that a translated zip differs from its source in text only."""

import io
import re
import struct
import zipfile
import zlib

from lxml import etree

from mt.documents.formats import read_file
from mt.documents.sentences import finish, plan


def translated_file(fmt: str, data: bytes, translate=str.upper, name: str = "doc") -> bytes:
    """The file `data` of format `fmt`, each sentence translated by `translate`."""
    todo = plan([read_file(fmt, data, name)], "en", lambda texts: [len(t.split()) for t in texts], 100)
    return finish(todo, [translate(part) for part in todo.parts])[0]


def by_word(table: dict[str, str]):
    """A stand-in for the model that translates word by word by `table`, each other character kept."""
    return lambda text: re.sub(r"\w+", lambda word: table.get(word.group(), word.group()), text)


def exactly(table: dict[str, str]):
    """A stand-in for the model that knows `table`'s texts only (a KeyError naming any other)."""
    return table.__getitem__


def png() -> bytes:
    """A 1×1 PNG image."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b""))


def skeleton(xml: bytes) -> bytes:
    """An XML part without its text: every element and attribute in order (xml:space aside, which Word's text
    needs where it has spaces at its edges)."""
    root = etree.fromstring(xml)
    for node in root.iter():
        node.text = node.tail = None
        node.attrib.pop("{http://www.w3.org/XML/1998/namespace}space", None)
    return etree.tostring(root)


def assert_only_text_changed(before: bytes, after: bytes) -> set[str]:
    """That the zip `after` has `before`'s parts, in order, compressed alike, each with the same bytes or (an XML
    part) the same elements and attributes; the names of the parts whose text changed."""
    with zipfile.ZipFile(io.BytesIO(before)) as old, zipfile.ZipFile(io.BytesIO(after)) as new:
        assert [(i.filename, i.compress_type) for i in old.infolist()] == \
               [(i.filename, i.compress_type) for i in new.infolist()]
        changed = {name for name in old.namelist() if old.read(name) != new.read(name)}
        for name in changed:
            assert skeleton(old.read(name)) == skeleton(new.read(name)), name
    return changed
