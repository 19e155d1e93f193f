"""LibreTranslate's `POST /translate`, as its clients send it: JSON or a form, `q` a string or a list, `source`
(or "auto"), `target`, `format` ("text"; "html" is refused), and `api_key` in the body."""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi import Request

from mt.errors import ApiError


@dataclass
class Query:
    lines: list[str]
    single: bool  # `q` was one string: answer with one string
    source: str
    target: str
    api_key: str | None


async def parse(request: Request) -> Query:
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object with q, source and target")
    else:
        form = await request.form()
        body = {key: (values if len(values := form.getlist(key)) > 1 else values[0]) for key in form}
    q = body.get("q")
    single = isinstance(q, str)
    if not single and not (isinstance(q, list) and all(isinstance(x, str) for x in q)):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    for key in ("source", "target"):
        if not isinstance(body.get(key), str) or not body[key]:
            raise ApiError(400, f"Invalid request: missing {key} parameter (a language code)")
    if body.get("format", "text") != "text":
        raise ApiError(400, f"format {body.get('format')!r} is not supported; send format=text")
    key = body.get("api_key")
    return Query([q] if single else q, single, body["source"], body["target"], key if isinstance(key, str) else None)


def respond(query: Query, src: str, texts: list[str]) -> dict:
    out: dict = {"translatedText": texts[0] if query.single else texts}
    if query.source == "auto":  # as LibreTranslate reports a detection; here, the model's source language
        detected = {"confidence": 100.0, "language": src}
        out["detectedLanguage"] = detected if query.single else [detected] * len(texts)
    return out
