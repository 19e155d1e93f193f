"""How mt serve's routes translate: a request's texts cut into the parts the model takes (mt/serve/parts.py) and
bounded, off the event loop; the parts queued for a model's worker (mt/serve/batcher.py), within the request's
timeout and withdrawn when its client goes away; documents read and cut into sentences off the event loop, their
sentences queued as one request and put back together; each line's hypotheses rendered as text; what could not be
kept whole said in the answer's `warnings`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request

from mt.decode.glossary import Glossary, missed
from mt.decode.load import Loaded
from mt.decode.search import Hypothesis
from mt.decode.translate import plan_documents
from mt.documents.formats import read_document
from mt.documents.sentences import Document, finish, splitter
from mt.errors import ApiError, MtError
from mt.serve.batcher import Batcher, QueueFull, Settings
from mt.serve.checks import check_lines
from mt.serve.parts import Parts, check_parts, owners_of, plan_texts

log = logging.getLogger("uvicorn.error")  # uvicorn's own log, formatted as its messages are


@dataclass
class Served:
    """One model the server translates with."""

    name: str
    src: str
    tgt: str
    loaded: Loaded
    batcher: Batcher


def settings(served: Served, beam: int | None = None, len_penalty: float | None = None, nbest: int = 1,
             glossary: Glossary | None = None) -> Settings:
    """A request's decoding settings: what it asks for, else the model's decode config."""
    decode = served.loaded.config.decode
    return beam or decode.beam, decode.len_penalty if len_penalty is None else len_penalty, nbest, glossary


async def not_placed(glossary: Glossary, lines: list[str], out: list[dict]) -> list[list[dict]]:
    """Per line, the glossary's terms (as {"source", "target"}) that its best translation does not hold; sought
    off the event loop (every term in every line)."""
    return await asyncio.to_thread(lambda: [[{"source": t.source, "target": t.target}
                                             for t in missed(glossary, line, one["text"])]
                                            for line, one in zip(lines, out, strict=True)])


def labels(count: int, single: bool = False) -> list[str]:
    """What errors and warnings call each of a request's texts."""
    return ["the text"] if single else [f"text {i + 1}" for i in range(count)]


async def plan_parts(app: FastAPI, served: Served, texts: list[str], names: list[str], settings: Settings) -> Parts:
    """The parts `texts` are translated as (mt/serve/parts.py), each text checked as a line is, planned and
    bounded off the event loop."""
    options = app.state.options
    check_lines(texts, options)

    def planned() -> Parts:
        parts = plan_texts(served.loaded, texts, names)
        parts.warnings += check_parts(served.loaded, parts.parts, parts.owners, names, settings[3], options)
        return parts
    try:
        return await asyncio.to_thread(planned)
    except MtError as error:
        raise ApiError(400, str(error)) from None


def request_lines(text: str) -> list[str]:
    """A request's text as `mt translate --format` reads a file's lines: without a leading byte-order mark, cut at
    each "\n", a "\r" before it dropped."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").split("\n")


async def translate_texts(app: FastAPI, request: Request, served: Served, texts: list[str], fmt: str,
                          settings: Settings, endpoint: str) -> tuple[list[str], list[str]]:
    """Each of `texts` translated as a document of text format `fmt`, each text checked as a line is; and the
    warnings."""
    check_lines(texts, app.state.options)
    documents = await read_documents(lambda: [read_document(fmt, request_lines(text), f"text {i + 1}")
                                              for i, text in enumerate(texts)])
    return await translate_documents(app, request, served, documents, settings, endpoint, labels(len(texts)))


async def read_documents(read: Callable[[], list[Document]]) -> list[Document]:
    """`read()`'s documents, read off the event loop: ApiError 400 for what cannot be read as one, 501 without the
    sentence splitter."""
    try:
        splitter()
    except MtError as error:
        raise ApiError(501, str(error)) from None
    try:
        return await asyncio.to_thread(read)
    except MtError as error:  # a broken subtitle, HTML that html.parser cannot read, a zip past its bounds
        raise ApiError(400, str(error)) from None


async def translate_documents(app: FastAPI, request: Request, served: Served, documents: list[Document],
                              settings: Settings, endpoint: str, names: list[str]
                              ) -> tuple[list[str | bytes], list[str]]:
    """`documents` (each called by its name of `names`) translated: cut into sentences and bounded off the event
    loop, the sentences of all queued as one request, put back together (text for a text format, bytes for a file
    format); and the warnings."""
    def planned():
        todo = plan_documents(served.loaded, documents)
        return todo, check_parts(served.loaded, todo.parts, owners_of(todo), names, settings[3], app.state.options)
    try:
        todo, warnings = await asyncio.to_thread(planned)
    except MtError as error:
        raise ApiError(400, str(error)) from None
    results = await translate(app, request, served, todo.parts, settings, endpoint) if todo.parts else []
    return finish(todo, [render(served, hyps, 1, False)["text"] for hyps in results]), warnings


async def translate(app: FastAPI, request: Request, served: Served, lines: list[str], settings: Settings,
                    endpoint: str, sent: int | None = None) -> list[list[Hypothesis]]:
    """Queue `lines` (checked by `check_lines` first) for `served`'s worker; the hypotheses of each line. A request
    that times out or whose client goes away is withdrawn: the worker drops it unread if it has not reached it yet.
    `sent`: the lines the request sent, for /metrics, when `lines` are the parts they were cut into."""
    options, metrics = app.state.options, app.state.metrics
    started = time.perf_counter()
    submitted = asyncio.ensure_future(served.batcher.submit(lines, settings))
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({submitted, gone}, timeout=options.timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not submitted.done():
        submitted.cancel()
        if gone.done() and not gone.cancelled():
            raise ApiError(499, "the client closed the connection")  # nobody reads this; the log does
        raise ApiError(504, f"not translated within {options.timeout:g} s (--timeout); retry, or send fewer lines")
    try:
        results = submitted.result()
    except QueueFull:
        raise ApiError(503, f"model {served.name} is busy: its queue is full; retry shortly",
                       {"Retry-After": "1"}) from None
    except UnicodeError as error:  # check_lines lets no such line through; should one pass, it is still the text's
        raise ApiError(400, f"the text cannot be translated ({error}): send valid Unicode") from None
    except Exception:  # the batcher has retried it alone: this request, and only this one, fails
        log.exception("model %s failed on a request of %d lines", served.name, len(lines))
        raise ApiError(500, "internal error: the model failed on this request; the server's log has the cause") \
            from None
    metrics.served(endpoint, served, len(lines) if sent is None else sent, results, time.perf_counter() - started)
    return results


async def disconnected(request: Request) -> None:
    """Returns once the client has closed the connection: the body has been read, so the server's next message
    is the disconnect (uvicorn sends it when the connection is lost or the response has been sent)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def render(served: Served, hyps: list[Hypothesis], nbest: int, scores: bool, alignment: str | None = None
           ) -> dict:
    """One line's result: its text, and, when asked, its score, n best and alignment."""
    texts = served.loaded.tgt_tok.decode([h.tokens for h in hyps]) if hyps else [""]
    out: dict = {"text": texts[0]}
    if scores:
        out["score"] = hyps[0].score if hyps else 0.0
    if nbest > 1:
        out["nbest"] = [{"text": t, "score": h.score} for t, h in zip(texts, hyps, strict=True)] if hyps else []
    if alignment is not None:
        out["alignment"] = alignment
    return out

