"""LibreTranslate's requests and answers, as its clients send and read them: the fields of a JSON body, or of the
query string and a form; for `POST /translate`, `q` a string or a list, `source` (or "auto"), `target`, `format`
("text": each `q` a text, its line breaks kept; "html": each a document, mt/documents/), `alternatives` and
`api_key`; and mt's own `glossary` (with `glossary_method`), as /v1/translate takes it, answered with
`glossaryMissed`, and `warnings` where something could not be kept whole (LibreTranslate's clients ignore fields
they do not know)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request

from mt.errors import ApiError
from mt.serve.errors import unreadable

MAX_ALTERNATIVES = 10  # per line: each costs a beam of its own
OFF_LOOP = 64 * 2 ** 10  # bytes of JSON past which it is parsed off the event loop (15 MiB of escapes: 0.2 s)


@dataclass
class Query:
    lines: list[str]
    single: bool  # `q` was one string: answer with one string
    source: str
    target: str
    format: str = "text"
    alternatives: int = 0  # the next-best translations asked for each line
    glossary: Any = None  # as sent: mt/serve/checks.py's check_glossary judges it
    glossary_method: Any = None


def body_key(body: dict) -> str | None:
    key = body.get("api_key")
    return key if isinstance(key, str) else None


def texts(body: dict) -> tuple[list[str], bool]:
    """`q`'s texts, and whether it was one string."""
    q = body.get("q")
    if isinstance(q, str):
        return [q], True
    if not (isinstance(q, list) and all(isinstance(x, str) for x in q)):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    return q, False


def parse(body: dict) -> Query:
    """The /translate request in `body` (its `fields`)."""
    lines, single = texts(body)
    for key in ("source", "target"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise ApiError(400, f"Invalid request: missing {key} parameter (a language code)")
    fmt = body.get("format", "text")
    if fmt not in ("text", "html"):
        raise ApiError(400, f"format {fmt!r} is not supported; send format=text or format=html")
    return Query(lines, single, body["source"], body["target"], fmt, alternatives(body.get("alternatives", 0)),
                 body.get("glossary"), body.get("glossary_method"))


def alternatives(value: Any) -> int:
    """`alternatives`: a whole number (in a form, its digits) from 0 to MAX_ALTERNATIVES."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ALTERNATIVES:
        raise ApiError(400, f"Invalid request: alternatives must be a whole number from 0 to {MAX_ALTERNATIVES}, "
                            f"not {value!r}")
    return value


def respond(query: Query, translated: list[str], missed: list[list[dict]] | None, detected: list[dict] | None,
            alternatives: list[list[str]], warnings: list[str]) -> dict:
    """The answer, one value per `q` (a list when `q` was): with source auto, `detectedLanguage` ({"confidence",
    "language"}); asked for them, `alternatives`; with a glossary, `glossaryMissed` (the terms a translation lacks);
    `warnings`, each naming its text, when there are any."""
    def each(values: list):
        return values[0] if query.single else values

    out: dict = {"translatedText": each(translated)}
    if query.alternatives:
        out["alternatives"] = each(alternatives)
    if detected is not None:
        out["detectedLanguage"] = each(detected)
    if missed is not None:
        out["glossaryMissed"] = each(missed)
    if warnings:
        out["warnings"] = warnings
    return out


async def fields(request: Request) -> dict:
    """The request's fields as LibreTranslate reads them (Flask's `request.values`): a JSON body's object; else the
    query string's fields, then a form's for the keys the query string lacks (deep-translator sends everything in
    the query string, with no body). A field given more than once: the list of its values."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        raw = await request.body()
        try:
            body = json.loads(raw) if len(raw) < OFF_LOOP else await asyncio.to_thread(json.loads, raw)
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
