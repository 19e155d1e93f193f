"""LibreTranslate's file translation: `POST /translate_file` (a multipart upload: `file`, `source` or "auto",
`target`, `api_key`) answers {"translatedFileUrl": ".../download_file/<name>"}, and `GET /download_file/<name>`
gives the translated file back, named as the upload was, for as long as mt/serve/files.py keeps it.

The upload's suffix names its format (mt.documents.formats.format_of): a file format's bytes are read as they are,
a text format's as UTF-8 lines, as `mt translate --format` reads them. Its text may hold as much as the largest
/translate request (--max-lines lines of --max-chars characters), and goes through the same queue, batched with
other requests, within --timeout.
"""

from __future__ import annotations

import asyncio
import mimetypes

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile

from mt.decode.translate import document_lines
from mt.documents.formats import FILE_FORMATS, format_of, read_document, read_file
from mt.documents.sentences import Document
from mt.errors import ApiError, MtError
from mt.serve.checks import check_key, header_key
from mt.serve.files import FileStore, content_disposition, download_name
from mt.serve.libretranslate import body_key, grouped, strict_pairs
from mt.serve.libretranslate_routes import by_detection, detect_each, pick_by_languages
from mt.serve.translating import read_documents, settings, translate_documents

MAX_FIELDS = 16  # of an upload's form, besides its file


def add_file_routes(app: FastAPI, store: FileStore) -> None:
    models, options = app.state.models, app.state.options

    @app.post("/translate_file")
    async def translate_file(request: Request):
        if not options.files:
            raise ApiError(403, "Files translation are disabled on this server.")  # LibreTranslate's words
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "multipart/form-data":
            raise ApiError(415, f"send the file as multipart/form-data (a field `file`, with source and target), "
                                f"not {kind or 'no Content-Type'}")
        query = grouped(strict_pairs(request.scope.get("query_string", b""), "query string"))
        async with request.form(max_files=1, max_fields=MAX_FIELDS) as form:  # removes what it spooled on closing
            body = grouped(list(form.multi_items())) | query  # as LibreTranslate's request.values
            check_key(options, body_key(body) or header_key(request))
            upload, source, target = body.get("file"), body.get("source"), body.get("target")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "Invalid request: missing file parameter (the file, as a multipart upload)")
            for key, value in (("source", source), ("target", target)):
                if not isinstance(value, str) or not value:
                    raise ApiError(400, f"Invalid request: missing {key} parameter (a language code)")
            name = upload.filename or ""
            data = await upload.read(options.max_file_bytes + 1)
        if not name:
            raise ApiError(400, "Invalid request: the file has no name; its suffix (.txt, .html, ...) says its format")
        if len(data) > options.max_file_bytes:
            raise ApiError(413, f"file {name}: over {options.max_file_bytes:,} bytes, the limit (--max-file-bytes)")
        try:
            fmt = format_of(name)
        except MtError as error:
            raise ApiError(400, f"file {error}") from None
        [document] = await read_documents(lambda: [read_upload(fmt, data, name)])
        check_text(document, name, options.max_lines * options.max_chars)
        store.check_room()  # before the work, not only after it
        if source == "auto":
            detected = await detect_each(app, [" ".join(document.units)])
            served = by_detection(models, detected, target, True)[0]
        else:
            served = pick_by_languages(models, source, target)
        [out], warnings = await translate_documents(app, request, served, [document], settings(served),
                                                    "translate_file", [f"file {name}"])
        if isinstance(out, str):  # a text format: its lines, each ended as mt translate writes them
            out = (out + "\n").encode("utf-8") if data else b""
        suffix = "." + name.rpartition(".")[2].lower()
        stored = await asyncio.to_thread(store.put, out, suffix, download_name(name, suffix))
        return {"translatedFileUrl": str(request.url_for("download_file", name=stored))} | (
            {"warnings": warnings} if warnings else {})

    @app.get("/download_file/{name}", name="download_file")
    async def download_file(name: str):
        found = await asyncio.to_thread(store.read, name)
        if found is None:
            raise ApiError(404, f"no translated file {name!r}: each is kept {options.file_ttl:g} s (--file-ttl), "
                                f"then removed; translate the file again")
        data, download = found
        return Response(data, media_type=mimetypes.guess_type(download)[0] or "application/octet-stream",
                        headers={"Content-Disposition": content_disposition(download)})


def read_upload(fmt: str, data: bytes, name: str) -> Document:
    """The upload's document: a file format's from its bytes, a text format's from its UTF-8 lines, as `mt translate
    --format` reads a file (its byte-order mark kept, bound by the upload's size, not a line's)."""
    if fmt in FILE_FORMATS:
        return read_file(fmt, data, name)
    return read_document(fmt, document_lines(data, "strict", name), name)


def check_text(document: Document, name: str, limit: int) -> None:
    """ApiError 413 when `document` holds more text than the largest request may (`limit` characters)."""
    size = sum(len(unit) for unit in document.units)
    if size > limit:
        raise ApiError(413, f"file {name}: {size:,} characters of text; the limit is {limit:,} (--max-lines times "
                            f"--max-chars): send it in parts")
