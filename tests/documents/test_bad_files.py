"""Bad Word, PowerPoint, OpenDocument and EPUB files (mt/documents/safe.py and each format's reader): each refused in
one MtError naming the file, the part and what is wrong; no local file ever read through an XML entity."""

import io
import sys
import zipfile

import pytest

pytest.importorskip("sentencex")
pytest.importorskip("lxml")

from lxml import etree  # noqa: E402

from mt.documents.formats import read_file  # noqa: E402
from mt.documents.safe import OLE_MAGIC  # noqa: E402
from mt.errors import MtError  # noqa: E402

from .conftest import translated_file  # noqa: E402

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
TYPES = ('<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Override '
         'PartName="/{part}" ContentType="application/vnd.openxmlformats-officedocument.{kind}.main+xml"/></Types>')
WORD = f"<w:document {W}><w:body><w:p><w:r><w:t>{{text}}</w:t></w:r></w:p></w:body></w:document>"
ODF = ('<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
       'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
       '<text:p>{text}</text:p></office:text></office:body></office:document-content>')
MANIFEST = ('<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
            '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml">{encrypted}'
            '</manifest:file-entry></manifest:manifest>')
CONTAINER = ('<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container" version="1.0"><rootfiles>'
             '<rootfile full-path="{opf}" media-type="application/oebps-package+xml"/></rootfiles></container>')
OPF = ('<package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata/><manifest>'
       '<item id="c1" href="{href}" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c1"/>'
       '</spine></package>')
PAGE = "<html xmlns='http://www.w3.org/1999/xhtml'><body><p>{text}</p></body></html>"
LAUGHS = ('<!DOCTYPE r [<!ENTITY a "ha"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
          '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>')


def zipped(parts: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, part in parts.items():
            z.writestr(name, part, compress_type=zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED)
    return out.getvalue()


def parts_of(fmt: str, text: str = "A small file.", doctype: str = "") -> dict[str, str]:
    """The parts of the smallest file of `fmt`, its one paragraph's text `text`, `doctype` before its root."""
    if fmt == "docx":
        return {"[Content_Types].xml": TYPES.format(part="word/document.xml", kind="wordprocessingml.document"),
                "word/document.xml": doctype + WORD.format(text=text)}
    if fmt == "pptx":
        slide = (f'<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" xmlns:a="http://'
                 f'schemas.openxmlformats.org/drawingml/2006/main"><a:p><a:r><a:t>{text}</a:t></a:r></a:p></p:sld>')
        types = TYPES.format(part="ppt/presentation.xml", kind="presentationml.presentation").replace(
            "</Types>", '<Override PartName="/ppt/slides/slide1.xml" ContentType="application/vnd.openxmlformats-'
                        'officedocument.presentationml.slide+xml"/></Types>')
        return {"[Content_Types].xml": types, "ppt/presentation.xml": "<p:presentation xmlns:p='x'/>",
                "ppt/slides/slide1.xml": doctype + slide}
    if fmt in ("odt", "odp"):
        kind = "text" if fmt == "odt" else "presentation"
        return {"mimetype": f"application/vnd.oasis.opendocument.{kind}",
                "content.xml": doctype + ODF.format(text=text), "META-INF/manifest.xml": MANIFEST.format(encrypted="")}
    return {"mimetype": "application/epub+zip", "META-INF/container.xml": CONTAINER.format(opf="OEBPS/content.opf"),
            "OEBPS/content.opf": OPF.format(href="ch1.xhtml"), "OEBPS/ch1.xhtml": doctype + PAGE.format(text=text)}


FORMATS = ["docx", "pptx", "odt", "odp", "epub"]
TEXT_PART = {"docx": "word/document.xml", "pptx": "ppt/slides/slide1.xml", "odt": "content.xml",
             "odp": "content.xml", "epub": "OEBPS/ch1.xhtml"}


def refused(fmt: str, data: bytes, *phrases: str) -> str:
    with pytest.raises(MtError) as error:
        read_file(fmt, data, "in." + fmt)
    message = str(error.value)
    assert message.startswith("in." + fmt + ":") and "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message
    return message


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_smallest_file_of_each_format_is_translated(fmt):
    out = translated_file(fmt, zipped(parts_of(fmt)))
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        assert b"A SMALL FILE." in z.read(TEXT_PART[fmt])  # so what the tests below refuse is only the flaw


@pytest.mark.parametrize("fmt", FORMATS)
def test_what_is_not_a_zip_is_refused(fmt):
    refused(fmt, b"Hello, I am plain text.", "is a zip file; this one cannot be opened")
    refused(fmt, zipped(parts_of(fmt))[:-30], "cannot be opened")  # cut short: the zip's directory is missing


@pytest.mark.parametrize("fmt", ["docx", "pptx"])
def test_a_password_protected_office_file_is_refused(fmt):
    refused(fmt, OLE_MAGIC + bytes(4096), "password-protected")  # Office encrypts into an OLE file, not a zip


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_zip_bomb_and_an_encrypted_part_are_refused(fmt):
    refused(fmt, zipped(parts_of(fmt) | {"filler.bin": bytes(4 << 20)}), "filler.bin unpacks to 4,194,304 bytes",
            "zip bomb")
    refused(fmt, encrypted(zipped(parts_of(fmt))), "is encrypted: a password-protected file")


def encrypted(data: bytes) -> bytes:
    """The zip `data` with each part flagged encrypted (zipfile cannot write one; the flag is what a reader sees)."""
    out = bytearray(data)
    for signature, flags in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local headers, the central directory
        at = out.find(signature)
        while at >= 0:
            out[at + flags] |= 0x1
            at = out.find(signature, at + 4)
    return bytes(out)


@pytest.mark.parametrize("fmt, missing, phrase", [
    ("docx", "word/document.xml", "no word/document.xml (the main part) in the zip: not a Word document"),
    ("docx", "[Content_Types].xml", "no [Content_Types].xml in the zip: not a Word document"),
    ("pptx", "ppt/presentation.xml", "no ppt/presentation.xml (the main part)"),
    ("odt", "content.xml", "no content.xml in the zip: not an OpenDocument text"),
    ("odp", "content.xml", "no content.xml in the zip"),
    ("epub", "META-INF/container.xml", "no META-INF/container.xml in the zip"),
    ("epub", "OEBPS/content.opf", "META-INF/container.xml names OEBPS/content.opf, which is not in the zip"),
    ("epub", "OEBPS/ch1.xhtml", "OEBPS/content.opf names OEBPS/ch1.xhtml, which is not in the zip"),
])
def test_a_missing_part_is_named(fmt, missing, phrase):
    parts = parts_of(fmt)
    del parts[missing]
    refused(fmt, zipped(parts), phrase)


@pytest.mark.parametrize("fmt", FORMATS)
def test_entity_expansion_is_refused_and_a_broken_part_named(fmt):
    refused(fmt, zipped(parts_of(fmt, "&d;", doctype=LAUGHS)), f"in.{fmt}:{TEXT_PART[fmt]}: declares XML entities")
    broken = "OEBPS/content.opf" if fmt == "epub" else TEXT_PART[fmt]  # a page is HTML: read as browsers would
    refused(fmt, zipped(parts_of(fmt) | {broken: "<unclosed>"}), f"in.{fmt}:{broken}: not well-formed XML")


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_external_entity_never_reads_a_local_file(fmt, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-TOKEN-42", encoding="utf-8")
    doctype = f'<!DOCTYPE r [<!ENTITY xxe SYSTEM "file://{secret}">]>'
    message = refused(fmt, zipped(parts_of(fmt, "Leak: &xxe;", doctype=doctype)), "declares XML entities")
    assert "SECRET-TOKEN-42" not in message
    # Without an entity declared, a DTD naming the file is not loaded either: nothing but the text is read.
    out = translated_file(fmt, zipped(parts_of(fmt, doctype=f'<!DOCTYPE r SYSTEM "file://{secret}">')))
    part = zipfile.ZipFile(io.BytesIO(out)).read(TEXT_PART[fmt])
    assert b"A SMALL FILE." in part and b"SECRET-TOKEN-42" not in part


def test_opendocument_of_the_wrong_kind_or_with_a_password_is_refused():
    parts = parts_of("odt")
    refused("odt", zipped(parts | {"mimetype": "application/vnd.oasis.opendocument.spreadsheet"}),
            "its mimetype is 'application/vnd.oasis.opendocument.spreadsheet', not an OpenDocument text",
            "--format odt")
    encrypted = MANIFEST.format(encrypted='<manifest:encryption-data manifest:checksum="x"/>')
    refused("odt", zipped(parts | {"META-INF/manifest.xml": encrypted, "content.xml": b"\x8f\x01garbage"}),
            "password-protected")


@pytest.mark.parametrize("where, parts", [
    ("META-INF/container.xml names '../content.opf'",
     {"META-INF/container.xml": CONTAINER.format(opf="../content.opf")}),
    ("OEBPS/content.opf names '../../etc/passwd'", {"OEBPS/content.opf": OPF.format(href="../../etc/passwd")}),
    ("OEBPS/content.opf names '/etc/passwd'", {"OEBPS/content.opf": OPF.format(href="/etc/passwd")}),
])
def test_an_epub_path_outside_the_zip_is_refused(where, parts):
    refused("epub", zipped(parts_of("epub") | parts), where, "not a part inside the EPUB")


def test_an_epub_with_drm_is_refused_and_one_with_obfuscated_fonts_read():
    def encryption(uri: str) -> str:
        return ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" xmlns:enc="http://www.w3.org/'
                '2001/04/xmlenc#"><enc:EncryptedData><enc:EncryptionMethod Algorithm="http://www.idpf.org/2008/'
                f'embedding"/><enc:CipherData><enc:CipherReference URI="{uri}"/></enc:CipherData></enc:EncryptedData>'
                '</encryption>')
    refused("epub", zipped(parts_of("epub") | {"META-INF/encryption.xml": encryption("OEBPS/ch1.xhtml")}),
            "OEBPS/ch1.xhtml is encrypted (DRM)")
    out = translated_file("epub", zipped(parts_of("epub") | {"META-INF/encryption.xml": encryption("font.otf"),
                                                               "font.otf": b"\x00obfuscated"}))
    assert b"A SMALL FILE." in zipfile.ZipFile(io.BytesIO(out)).read("OEBPS/ch1.xhtml")


def test_without_lxml_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lxml", None)  # import fails
    with pytest.raises(MtError, match=r"read with lxml, which is not installed: pip install 'mt\[documents\]'"):
        read_file("docx", zipped(parts_of("docx")), "in.docx")


@pytest.mark.parametrize("fmt", FORMATS)
def test_what_the_model_writes_that_xml_cannot_hold_is_left_out(fmt):
    out = translated_file(fmt, zipped(parts_of(fmt)), translate=lambda s: "\x00" + s.upper() + "\x1b\ufffe")
    part = zipfile.ZipFile(io.BytesIO(out)).read(TEXT_PART[fmt])
    assert b"A SMALL FILE.<" in part and etree.fromstring(part) is not None  # still XML
