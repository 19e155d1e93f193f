"""LibreTranslate's file translation, in-process through httpx's own multipart encoding: `/translate_file` answers a
download URL, `/download_file` gives the file back translated as `mt translate --format` would, under the upload's
name made safe and a random stored name; files expire, the store is bounded, and bad uploads get one clear error."""

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sentencex")

from mt.documents.formats import FILE_FORMATS, SUFFIXES  # noqa: E402
from mt.documents.sentences import Document  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.app import create_app, load_models  # noqa: E402
from mt.serve.files import download_name  # noqa: E402

from .test_app import LINES, client, mt_translate, run  # noqa: E402

TEXT = "der hund sitzt unter dem baum. die katze läuft.\n\ndas rote haus\n"
PAGE = '<p class="x">Der Hund <b>sitzt</b> unter dem Baum.</p>'


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve_files(checkpoint: Path, **options):
    opts = ServeOptions(**options)
    app = create_app(load_models([checkpoint], [], opts), opts)
    app.state.files.clock = Clock()
    return app


async def upload(c, name: str, data: bytes, **fields):
    return await c.post("/translate_file", files={"file": (name, data)},
                        data={"source": "de", "target": "en"} | fields)


def test_a_file_is_translated_as_mt_translate_writes_it_and_downloaded_under_its_own_name(checkpoint, tmp_path):
    app = serve_files(checkpoint)

    async def go():
        async with client(app) as c:
            text, page = await upload(c, "notes.txt", TEXT.encode()), await upload(c, "Seite.HTML", PAGE.encode())
            again = await upload(c, "notes.txt", TEXT.encode())
            sneaky = await upload(c, "../../etc\\..\\évil: x?.txt", TEXT.encode())
            urls = [r.json()["translatedFileUrl"] for r in (text, page, again, sneaky)]
            return urls, [await c.get(url) for url in urls], await c.get("/frontend/settings")

    urls, downloads, settings = run(go())
    assert downloads[0].content.decode().splitlines() == mt_translate(checkpoint, [TEXT.rstrip("\n")], tmp_path,
                                                                      "--format", "text")
    assert downloads[1].text.splitlines() == mt_translate(checkpoint, [PAGE], tmp_path, "--format", "html")
    assert all(u.startswith("http://mt/download_file/") for u in urls) and len(set(urls)) == 4  # each its own
    assert [u.rsplit(".", 1)[1] for u in urls] == ["txt", "html", "txt", "txt"]
    assert downloads[0].headers["content-disposition"] == 'attachment; filename="notes.txt"'
    assert downloads[1].headers["content-disposition"] == 'attachment; filename="Seite.html"'
    assert downloads[3].headers["content-disposition"] == "attachment; filename*=UTF-8''%C3%A9vil_%20x_.txt"
    stored = sorted(p.name for p in Path(app.state.files.folder.name).iterdir())
    assert stored == sorted(u.rsplit("/", 1)[1] for u in urls)  # random names only, none the client's
    assert settings.json()["supportedFilesFormat"] == list(SUFFIXES)
    app.state.files.close()


def test_a_file_format_is_read_as_bytes_and_its_rendered_bytes_are_the_download(checkpoint, monkeypatch, tmp_path):
    """Any FILE_FORMATS entry, with its suffix: here a made-up one, UTF-16 text of one unit behind a tag."""
    def utf16(data: bytes, name: str) -> Document:
        assert data.startswith(b"U16:"), name
        return Document([data[4:].decode("utf-16")],
                        lambda units: b"U16:" + " ".join(s.text for s in units[0]).encode("utf-16"))
    monkeypatch.setitem(FILE_FORMATS, "u16", utf16)
    monkeypatch.setitem(SUFFIXES, ".u16", "u16")
    app = serve_files(checkpoint)

    async def go():
        async with client(app) as c:
            url = (await upload(c, "brief.u16", b"U16:" + LINES[0].encode("utf-16"))).json()["translatedFileUrl"]
            return url, await c.get(url)

    url, download = run(go())
    assert url.endswith(".u16") and download.content.startswith(b"U16:")
    assert [download.content[4:].decode("utf-16")] == mt_translate(checkpoint, LINES[:1], tmp_path)
    app.state.files.close()


def test_every_file_format_is_taken_by_its_suffix():
    assert set(FILE_FORMATS) <= set(SUFFIXES.values())  # so /translate_file reads each one other engineers add
    assert download_name("a/b\\c.docx", ".docx") == "c.docx" and download_name("..", ".txt") == "translated.txt"
    assert download_name("x" * 300 + ".TXT", ".txt") == "x" * 116 + ".txt"


def test_files_expire_and_the_store_is_bounded(checkpoint):
    app = serve_files(checkpoint, file_ttl=60, max_files=2)
    store = app.state.files

    async def go():
        async with client(app) as c:
            first = (await upload(c, "a.txt", b"der hund\n")).json()["translatedFileUrl"]
            store.clock.now = 30
            second = (await upload(c, "b.txt", b"die katze\n")).json()["translatedFileUrl"]
            full = await upload(c, "c.txt", b"das haus\n")
            store.clock.now = 61  # the first has expired, the second has not
            gone, kept = await c.get(first), await c.get(second)
            third = await upload(c, "c.txt", b"das haus\n")
            return full, gone, kept, third, await c.get("/download_file/../../etc/passwd"), \
                await c.get("/download_file/" + "A" * 22 + ".txt")

    full, gone, kept, third, traversal, unknown = run(go())
    assert full.status_code == 503 and full.headers["retry-after"] == "30" and "--max-files" in full.json()["error"]
    assert gone.status_code == 404 and "--file-ttl" in gone.json()["error"]
    assert kept.status_code == 200 and third.status_code == 200  # room again once the first went
    assert len(list(Path(store.folder.name).iterdir())) == 2  # the expired file is off the disk too
    assert traversal.status_code == 404 and unknown.status_code == 404
    store.close()
    assert store.folder is None


def test_bad_uploads_get_one_clear_error(checkpoint):
    app = serve_files(checkpoint, max_file_bytes=100, api_keys=frozenset({"k1"}))
    closed = serve_files(checkpoint, files=False)

    async def go():
        async with client(app) as c, client(closed) as off:
            key = {"api_key": "k1"}
            return {
                "no key": await upload(c, "a.txt", b"der hund\n"),
                "wrong key": await upload(c, "a.txt", b"der hund\n", api_key="k2"),
                "suffix": await upload(c, "tool.exe", b"MZ", **key),
                "no suffix": await upload(c, "README", b"der hund", **key),
                "too big": await upload(c, "a.txt", b"der hund\n" * 12, **key),
                "far too big": await upload(c, "a.txt", b"x" * 200_000, **key),
                "not utf-8": await upload(c, "a.txt", b"der hund \xff\n", **key),
                "no file": await c.post("/translate_file", data={"source": "de", "target": "en", **key},
                                        files={"other": ("a.txt", b"x")}),
                "not multipart": await c.post("/translate_file", json={"source": "de", "target": "en", **key}),
                "no pair": await upload(c, "a.txt", b"der hund\n", target="fr", **key),
                "in the query": await c.post("/translate_file", params=key, files={"file": ("a.txt", b"der hund\n")},
                                             data={"source": "de", "target": "en"}),
            }, await upload(off, "a.txt", b"der hund\n")

    answers, off = run(go())
    expected = {"no key": (401, "API key is needed"), "wrong key": (403, "not accepted"),
                "suffix": (400, "file tool.exe: no format for the suffix '.exe'; known: .txt"),
                "no suffix": (400, "file README: no format for the suffix '(none)'"),
                "too big": (413, "over 100 bytes, the limit (--max-file-bytes)"),
                "far too big": (413, "the upload is 200,"), "not utf-8": (400, "a.txt:1"),
                "no file": (400, "missing file parameter"), "not multipart": (415, "multipart/form-data"),
                "no pair": (400, "no model translates de→fr"), "in the query": (200, None)}
    for case, (status, phrase) in expected.items():
        assert answers[case].status_code == status, (case, answers[case].text)
        if phrase:
            assert phrase in answers[case].json()["error"], (case, answers[case].json())
    assert (off.status_code, off.json()) == (403, {"error": "Files translation are disabled on this server."})
    app.state.files.close()
