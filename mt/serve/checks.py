"""What `mt serve` checks of a request before it queues it for a model: its API key, its lines (how many, how
long, and that they are text), its search (beam, n best) and its glossary (how many terms, how long). Each request
is judged alone, so nothing a client sends reaches the model call it would share with other clients' requests unless
it can be translated. Also the keys themselves, read at start: asked for keys and given none, the server refuses to
start rather than serve everyone.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from fastapi import Request

from mt.data.lines import read_text
from mt.decode.glossary import Glossary, check_method, default_method, term
from mt.errors import ApiError, MtError
from mt.options import ServeOptions

MAX_TERM_CHARS = 200  # characters of a glossary term's side: a term is a word or a few, and each is sought everywhere


def check_lines(lines: list[str], options: ServeOptions) -> None:
    if len(lines) > options.max_lines:
        raise ApiError(413, f"{len(lines)} lines in one request; the limit is {options.max_lines} (--max-lines): "
                            f"send them in several requests")
    for i, line in enumerate(lines, 1):
        if len(line) > options.max_chars:
            raise ApiError(413, f"line {i} has {len(line)} characters; the limit is {options.max_chars} "
                                f"(--max-chars): split it")
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:  # JSON's "\ud800" parses to half a UTF-16 pair, which is no character
            raise ApiError(400, f"line {i} holds a lone surrogate (U+{ord(line[error.start]):04X}) at character "
                                f"{error.start + 1}: it is half of a UTF-16 pair, not text; send the whole "
                                f"character, or drop it") from None


def check_search(options: ServeOptions, beam: int | None, nbest: int) -> None:
    """ApiError 413 for a beam or n best wider than --max-beam: a search's cost grows with its width."""
    for name, value in (("beam", beam), ("nbest", nbest)):
        if value is not None and value > options.max_beam:
            raise ApiError(413, f"{name} {value}: the limit is {options.max_beam} (--max-beam): ask for less")


def check_glossary(value: Any, method: Any, exported: bool, options: ServeOptions) -> Glossary | None:
    """A request's `glossary`: a list of {"source": ..., "target": ...} or a mapping of source to target term (in a
    form, either as a JSON string), none when absent; placed by `method` (`glossary_method`), by default the best
    the model can do. ApiError 400 (413 past --max-glossary-terms, or a term past MAX_TERM_CHARS) naming the entry
    and the fix otherwise."""
    if value is None:
        if method is not None:
            raise ApiError(400, "glossary_method says how to place a glossary's terms: send glossary too")
        return None
    if isinstance(value, str):  # a form's field
        try:
            value = json.loads(value)
        except ValueError:
            raise ApiError(400, "glossary: not JSON: send a list of {\"source\": ..., \"target\": ...} or an "
                                "object of source term to target term") from None
    if isinstance(value, dict):
        value = [{"source": source, "target": target} for source, target in value.items()]
    if not isinstance(value, list):
        raise ApiError(400, "glossary: send a list of {\"source\": ..., \"target\": ...} or an object of source "
                            "term to target term")
    if len(value) > options.max_glossary_terms:
        raise ApiError(413, f"glossary: {len(value)} terms; the limit is {options.max_glossary_terms} a request "
                            f"(--max-glossary-terms): send the terms the text needs")
    terms = {}
    for i, entry in enumerate(value, 1):
        where = f"glossary term {i}"
        if not isinstance(entry, dict) or set(entry) != {"source", "target"} \
                or not all(isinstance(entry[k], str) for k in entry):
            raise ApiError(400, f"{where}: send {{\"source\": \"...\", \"target\": \"...\"}}, two strings")
        try:
            found = term(entry["source"].strip(), entry["target"].strip(), where)
        except MtError as error:
            raise ApiError(400, str(error)) from None
        if len(found.source) > options.max_chars or len(found.target) > options.max_chars:
            raise ApiError(413, f"{where} is longer than a line may be ({options.max_chars} characters, --max-chars)")
        if len(found.source) > MAX_TERM_CHARS or len(found.target) > MAX_TERM_CHARS:
            raise ApiError(413, f"{where} is longer than a term may be ({MAX_TERM_CHARS} characters a side): a term "
                                f"is a word or a few")
        if terms.get(found.source, found) != found:
            raise ApiError(400, f"{where}: {found.source!r} is given twice with different targets: give each source "
                                f"term one target term")
        terms[found.source] = found
    if method is not None and not isinstance(method, str):
        raise ApiError(400, "glossary_method: constrain or replace")
    try:
        return Glossary(tuple(terms.values()), check_method(method or default_method(exported), exported))
    except MtError as error:
        raise ApiError(400, str(error).replace("--glossary-method", "glossary_method")) from None


def header_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    return auth[7:] if auth.lower().startswith("bearer ") else request.headers.get("x-api-key")


def check_key(options: ServeOptions, key: str | None) -> None:
    if not options.api_keys:
        return
    if not key:
        raise ApiError(401, "an API key is needed: send `Authorization: Bearer KEY` (or `api_key` in the body)")
    if not accepted(options.api_keys, key):
        raise ApiError(403, "this API key is not accepted")


def accepted(keys: frozenset[str], key: str) -> bool:
    """Whether `key` is one of `keys`, in a time that tells nothing of how much of it matched: each key is compared
    with hmac.compare_digest, and all of them are."""
    given = key.encode("utf-8", "surrogatepass")  # a JSON api_key may hold a lone surrogate
    found = False
    for known in keys:
        found |= hmac.compare_digest(known.encode("utf-8", "surrogatepass"), given)
    return found


def api_keys(keys: list[str], path: Path | None = None) -> frozenset[str]:
    """The keys given on the command line and those of a keys file, one per line (blank lines skipped), each
    trimmed. A blank key, or a file that cannot be read or holds none, is an `MtError`: the server must not start
    open to everyone when it was asked for keys."""
    given = [key.strip() for key in keys]
    if not all(given):
        raise MtError("--api-key was given a blank key: give the key itself, e.g. --api-key \"$(cat key.txt)\"")
    if path is None:
        return frozenset(given)
    try:
        lines = read_text(path)
    except MtError as error:
        raise MtError(f"--api-keys-file {error}: give a readable file of keys, one per line; the server does not "
                      f"start without the keys it was asked for") from None
    from_file = [line.strip() for line in lines if line.strip()]
    if not from_file:
        raise MtError(f"--api-keys-file {path}: no key in it, only blank lines: write one key per line; the server "
                      f"does not start without the keys it was asked for")
    return frozenset(given) | frozenset(from_file)
