"""LibreTranslate's `POST /translate`, as its clients send it: JSON or a form, `q` a string or a list, `source`
(or "auto"), `target`, `format` ("text": each `q` a line; "html": each a document, mt/documents/), and
`api_key` in the body; and mt's own `glossary` (with `glossary_method`), as /v1/translate takes it, answered with
`glossaryMissed`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request

from mt.errors import ApiError
from mt.serve.errors import unreadable


@dataclass
class Query:
    lines: list[str]
    single: bool  # `q` was one string: answer with one string
    source: str
    target: str
    api_key: str | None
    format: str = "text"
    glossary: Any = None  # as sent: mt/serve/checks.py's check_glossary judges it
    glossary_method: Any = None


async def parse(request: Request) -> Query:
    body = await fields(request)
    q = body.get("q")
    single = isinstance(q, str)
    if not single and not (isinstance(q, list) and all(isinstance(x, str) for x in q)):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    for key in ("source", "target"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise ApiError(400, f"Invalid request: missing {key} parameter (a language code)")
    fmt = body.get("format", "text")
    if fmt not in ("text", "html"):
        raise ApiError(400, f"format {fmt!r} is not supported; send format=text or format=html")
    key = body.get("api_key")
    return Query([q] if single else q, single, body["source"], body["target"], key if isinstance(key, str) else None,
                 fmt, body.get("glossary"), body.get("glossary_method"))


def respond(query: Query, src: str, texts: list[str], missed: list[list[dict]] | None = None) -> dict:
    """The answer; with a glossary, `glossaryMissed`: each line's terms its translation does not hold."""
    out: dict = {"translatedText": texts[0] if query.single else texts}
    if missed is not None:
        out["glossaryMissed"] = missed[0] if query.single else missed
    if query.source == "auto":  # as LibreTranslate reports a detection; here, the model's source language
        detected = {"confidence": 100.0, "language": src}
        out["detectedLanguage"] = detected if query.single else [detected] * len(texts)
    return out


async def fields(request: Request) -> dict:
    """The request's fields as LibreTranslate reads them (Flask's `request.values`): a JSON body's object; else the
    query string's fields, then a form's for the keys the query string lacks (deep-translator sends everything in
    the query string, with no body). A field given more than once: the list of its values."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError) as error:  # ValueError: bad JSON, bad UTF-8, a number of 4300 digits
            raise unreadable(error) from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object with q, source and target")
        return body
    query = grouped(strict_pairs(request.scope.get("query_string", b""), "query string"))
    if kind == "application/x-www-form-urlencoded":  # read here, strictly: Starlette turns bad UTF-8 into U+FFFD
        pairs = strict_pairs(await request.body(), "form")
    elif kind == "multipart/form-data":
        async with request.form() as form:  # closes what it spooled of file fields
            pairs = list(form.multi_items())
    elif query:
        pairs = []
    else:
        raise ApiError(415, f"the body must be JSON or a form, or the fields in the query string: send "
                            f"Content-Type: application/json (or application/x-www-form-urlencoded), not "
                            f"{kind or 'none'}")
    return grouped(pairs) | query


def strict_pairs(raw: bytes, where: str) -> list[tuple[str, str]]:
    """The fields of %-escaped `raw` (a form, a query string), refused unless they are UTF-8."""
    try:
        return parse_qsl(raw.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as error:
        raise ApiError(400, f"the {where} is not valid UTF-8 ({error.reason}): send its text encoded as UTF-8, "
                            f"then %-escaped") from None


def grouped(pairs: list[tuple[str, object]]) -> dict:
    fields: dict[str, list] = {}
    for key, value in pairs:
        fields.setdefault(key, []).append(value)
    return {key: values if len(values) > 1 else values[0] for key, values in fields.items()}
