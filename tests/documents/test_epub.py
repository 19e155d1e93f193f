"""EPUB books in, translated books out (mt/documents/epub.py): made with ebooklib, translated by a stand-in for the
model (upper case), read again by ebooklib: every chapter, the table of contents and the title translated, the
images, styles and structure of the book as they were."""

import io
import zipfile

import pytest
from lxml import etree

pytest.importorskip("sentencex")
epub = pytest.importorskip("ebooklib.epub")

from ebooklib import ITEM_DOCUMENT  # noqa: E402

from .conftest import assert_only_text_changed, png, translated_file  # noqa: E402


def book_file(tmp_path) -> bytes:
    """A book as ebooklib writes one: two chapters (formatting inside a sentence, an image, preformatted text),
    a stylesheet, a table of contents with a section (nav.xhtml and toc.ncx)."""
    book = epub.EpubBook()
    book.set_identifier("id-1")
    book.set_title("A small book")
    book.set_language("en")
    book.add_author("Ann Author")
    first = epub.EpubHtml(title="The first chapter", file_name="text/chap_01.xhtml", lang="en")
    first.content = ("<h1>The first chapter</h1><p>I like <b>red</b> cars. They are fast.</p>"
                     "<p><img src='../images/cat.png' alt='A cat'/></p>")
    second = epub.EpubHtml(title="The second chapter", file_name="text/chap_02.xhtml", lang="en")
    second.content = "<h1>The second chapter</h1><p>It rains &amp; it pours.</p><pre>keep   me</pre>"
    for item in (first, second,
                 epub.EpubItem(uid="cat", file_name="images/cat.png", media_type="image/png", content=png()),
                 epub.EpubItem(uid="css", file_name="style/main.css", media_type="text/css", content=b"p{margin:0}")):
        book.add_item(item)
    book.toc = (epub.Link("text/chap_01.xhtml", "The first chapter", "c1"), (epub.Section("Part two"), (second,)))
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", first, second]
    epub.write_epub(str(tmp_path / "book.epub"), book)
    return (tmp_path / "book.epub").read_bytes()


def read(data: bytes, tmp_path, name: str):
    (tmp_path / name).write_bytes(data)
    return epub.read_epub(str(tmp_path / name))


def titles(toc) -> list[str]:
    """The titles of a table of contents as ebooklib reads it (a section: a tuple of it and its entries), in order."""
    return [title for entry in toc for title in (
        [entry[0].title, *titles(entry[1])] if isinstance(entry, tuple) else [entry.title])]


def body_text(item) -> str:
    return "".join(etree.fromstring(item.get_content()).itertext())


def test_a_book_is_translated_chapter_by_chapter_with_its_contents_and_title(tmp_path):
    source = book_file(tmp_path)
    out = translated_file("epub", source)
    before, after = read(source, tmp_path, "before.epub"), read(out, tmp_path, "after.epub")
    chapters = [list(book.get_items_of_type(ITEM_DOCUMENT)) for book in (before, after)]
    assert len(chapters[1]) == len(chapters[0]) == 3  # the two chapters and the navigation page
    for old, new in zip(*chapters, strict=True):
        assert body_text(new) == body_text(old).upper().replace("KEEP   ME", "keep   me"), new.file_name
    assert titles(after.toc) == [t.upper() for t in titles(before.toc)] == [
        "THE FIRST CHAPTER", "PART TWO", "THE SECOND CHAPTER"]
    assert after.get_metadata("DC", "title")[0][0] == "A SMALL BOOK"
    assert after.get_metadata("DC", "creator")[0][0] == "Ann Author"
    page = after.get_item_with_href("text/chap_01.xhtml").get_content().decode()
    assert "<p><b>I LIKE RED CARS.</b> THEY ARE FAST.</p>" in page and 'alt="A cat"' in page
    with zipfile.ZipFile(io.BytesIO(out)) as book:
        assert book.infolist()[0].filename == "mimetype"
        ncx = etree.fromstring(book.read("EPUB/toc.ncx"))
    assert [t.text for t in ncx.iter("{*}text")] == ["A SMALL BOOK", "THE FIRST CHAPTER", "PART TWO",
                                                     "THE SECOND CHAPTER"]
    # The image, the stylesheet, the container: byte for byte; mimetype first and stored (assert_only_text_changed).
    assert assert_only_text_changed(source, out) == {
        "EPUB/content.opf", "EPUB/toc.ncx", "EPUB/nav.xhtml", "EPUB/text/chap_01.xhtml", "EPUB/text/chap_02.xhtml"}


def test_a_page_in_another_encoding_is_written_back_in_it(tmp_path):
    source = book_file(tmp_path)
    with zipfile.ZipFile(io.BytesIO(source)) as book:
        parts = {info: book.read(info) for info in book.infolist()}
    latin = "<?xml version='1.0' encoding='iso-8859-1'?>\n<html><body><p>Café ouvert. Ça va.</p></body></html>"
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as book:
        for info, part in parts.items():
            book.writestr(info, latin.encode("iso-8859-1") if info.filename.endswith("chap_02.xhtml") else part)
    out = translated_file("epub", data.getvalue(), translate=lambda s: s.upper() + " → été")
    with zipfile.ZipFile(io.BytesIO(out)) as book:
        page = book.read("EPUB/text/chap_02.xhtml")
    # Still Latin-1, as it declares; what Latin-1 cannot spell, a character reference.
    assert page.decode("iso-8859-1").endswith("<p>CAFÉ OUVERT. &#8594; été ÇA VA. &#8594; été</p></body></html>")
