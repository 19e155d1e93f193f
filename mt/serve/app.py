"""`mt serve`: checkpoints behind HTTP, on FastAPI and uvicorn.

The APIs: LibreTranslate's (mt/serve/libretranslate_routes.py: `POST /translate`, `/detect`, `GET /languages`...,
and mt/serve/file_routes.py: `/translate_file`, `/download_file`), so its clients work unchanged; mt's own, here
(`POST /v1/translate`, `GET /v1/models`, `POST /v1/attention` for the page's heatmap); `GET /health`, `GET /ready`,
`GET /metrics` (Prometheus); the page at `/`. Both translation APIs take documents too (`format` html, and text
and srt in mt's own), cut into sentences and put back together by mt/documents/. Concurrent requests are
batched together by mt/serve/batcher.py, through mt/serve/translating.py; a text the model cannot take whole is
translated in parts (mt/serve/parts.py), and what is still lost is said in the answer's `warnings`. Limits
(characters per line, lines and sentences per request, beam, glossary work, queue room, a timeout per request;
docs/serving.md has them all) answer with a status and `{"error": ...}`, never by falling over:
mt/serve/checks.py judges each request before it is queued, mt/serve/errors.py gives every refusal that shape, and
mt/serve/limits.py drops clients too slow to send their requests. No endpoint reads a path a request names.
"""

from __future__ import annotations

import asyncio
import gc
import io
import logging
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from mt.decode.alignments import alignments as hard_alignments
from mt.decode.alignments import pair_attention, pharaoh, select, to_pieces
from mt.decode.load import Loaded
from mt.decode.search import Hypothesis, SearchOptions
from mt.decode.translate import compiled, encode_lines, load_any, translate_lines
from mt.device import pick_device
from mt.errors import ApiError, MtError
from mt.options import ServeOptions
from mt.serve.batcher import Batcher, Settings
from mt.serve.checks import check_glossary, check_key, check_search, header_key
from mt.serve.detect import Detector
from mt.serve.errors import add_error_handlers
from mt.serve.file_routes import add_file_routes
from mt.serve.files import FileStore
from mt.serve.libretranslate_routes import add_libretranslate_routes
from mt.serve.limits import FORM_ROOM, BodyLimit, max_body, protocol
from mt.serve.metrics import CountAnswers, Metrics
from mt.serve.parts import Parts
from mt.serve.translating import (
    Served,
    labels,
    not_placed,
    plan_parts,
    render,
    settings,
    translate,
    translate_texts,
)

log = logging.getLogger("uvicorn.error")  # uvicorn's own log, formatted as its messages are


def load_models(paths: list[Path], names: list[str], options: ServeOptions) -> dict[str, Served]:
    """Each checkpoint (or CTranslate2 export) loaded once, named by --name or its languages."""
    if names and len(names) != len(paths):
        raise MtError(f"--name was given {len(names)} times for {len(paths)} checkpoints: give one per checkpoint")
    device = pick_device(options.device)
    models: dict[str, Served] = {}
    for i, path in enumerate(paths):
        holder: dict[str, Loaded] = {}

        def setup(path=path, holder=holder):  # on the thread of all PyTorch work: see mt/serve/batcher.py
            if options.threads:
                torch.set_num_threads(options.threads)
            holder["loaded"] = load_any(path, device, options.precision)
            if options.compile:
                compiled(holder["loaded"], SearchOptions.from_config(holder["loaded"].config.decode,
                                                               precision=options.precision), device)
            return translator(holder["loaded"], device, options.precision)
        batcher = Batcher(setup, options.max_waiting, name=path.name)
        loaded = holder["loaded"]
        batcher.batch_tokens = loaded.config.decode.batch_tokens if options.batching else 0  # 0: a request a call
        langs = loaded.state.get("langs") or (loaded.state.get("export") or {}).get("langs") or {}
        src, tgt = langs.get("src") or "src", langs.get("tgt") or "tgt"
        name = names[i] if names else f"{src}-{tgt}"
        if name in models:
            batcher.stop()
            raise MtError(f"{path}: a second model named {name}; give each checkpoint a --name")
        models[name] = Served(name, src, tgt, loaded, batcher)
    return models


def translator(loaded: Loaded, device: torch.device, precision: str):
    """What a model's worker calls: lines and decoding settings in, hypotheses per line out (as mt translate)."""
    def translate(lines: list[str], settings: Settings) -> list[list[Hypothesis]]:
        beam, len_penalty, nbest, glossary = settings
        opts = SearchOptions.from_config(loaded.config.decode, beam=beam, len_penalty=len_penalty, nbest=nbest,
                                   precision=precision)
        opts.beam = max(opts.beam, opts.nbest)
        return translate_lines(loaded, lines, opts, device, warn=io.StringIO(),  # cut lines: no stderr per request
                               glossary=glossary)
    return translate


class NativeRequest(BaseModel):
    model: str | None = None  # default: the only model, if one
    text: list[str]
    beam: int | None = Field(None, ge=1, le=64)
    len_penalty: float | None = Field(None, ge=0.0, le=10.0)
    nbest: int = Field(1, ge=1, le=16)
    scores: bool = False
    alignments: bool = False
    format: Literal["lines", "text", "html", "srt"] = "lines"  # lines: each text a line; else each a document
    glossary: Any = None  # [{"source": ..., "target": ...}] or {source: target}, as checks.py's check_glossary says
    glossary_method: Any = None  # constrain or replace; None: the best the model can do


class AttentionRequest(BaseModel):
    model: str | None = None
    text: str


def create_app(models: dict[str, Served], options: ServeOptions | None = None) -> FastAPI:
    options = options or ServeOptions()
    store = FileStore(options.file_ttl, options.max_files, options.max_stored_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sweeper = asyncio.create_task(sweep(store))
        yield
        sweeper.cancel()
        for served in models.values():  # uvicorn has stopped accepting and answered what was in flight
            served.batcher.stop()
        store.close()

    app = FastAPI(title="mt", lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.models, app.state.options, app.state.metrics = models, options, Metrics(models)
    languages = {m.src for m in models.values()} | {m.tgt for m in models.values()}
    app.state.detector, app.state.files = Detector(languages), store
    if options.cors:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=options.cors, allow_methods=["GET", "POST"],
                           allow_headers=["*"])
    add_error_handlers(app)
    add_info_routes(app)
    add_translation_routes(app)
    add_libretranslate_routes(app)
    add_file_routes(app, store)
    app.add_middleware(BodyLimit, limit=max_body(options), file_limit=options.max_file_bytes + FORM_ROOM)
    app.add_middleware(CountAnswers, metrics=app.state.metrics)  # the outermost: it counts BodyLimit's 413s too
    return app


def add_info_routes(app: FastAPI) -> None:
    models, metrics = app.state.models, app.state.metrics

    @app.get("/", response_class=HTMLResponse)
    async def page():
        return resources.files("mt.serve").joinpath("static/serve.html").read_text(encoding="utf-8")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        alive = all(m.batcher.thread.is_alive() for m in models.values())
        return JSONResponse({"ready": alive, "models": list(models)}, 200 if alive else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def list_models():
        return {"models": [describe(m) for m in models.values()]}


def add_translation_routes(app: FastAPI) -> None:
    models, options = app.state.models, app.state.options

    @app.post("/v1/translate")
    async def native(body: NativeRequest, request: Request):
        check_key(options, header_key(request))
        served = pick(models, body.model)
        check_search(options, body.beam, body.nbest)
        glossary = check_glossary(body.glossary, body.glossary_method, "export" in served.loaded.state, options)
        per_line = body.nbest > 1 or body.scores or body.alignments
        if body.format != "lines":
            if per_line:
                raise ApiError(400, f"format {body.format} translates documents; nbest, scores and alignments are for "
                                    "format lines")
            texts, warnings = await translate_texts(app, request, served, body.text, body.format,
                                                    settings(served, body.beam, body.len_penalty, glossary=glossary),
                                                    "v1")
            out = [{"text": text} for text in texts]
        else:
            decoding = settings(served, body.beam, body.len_penalty, body.nbest, glossary)
            parts = await plan_parts(app, served, body.text, labels(len(body.text)), decoding)
            whole = whole_lines(parts, body.text, "nbest, scores and alignments") if per_line else []
            results = await translate(app, request, served, parts.parts, decoding, "v1", len(body.text)) \
                if parts.parts else []
            if per_line:
                each = [results[k] if k is not None else [] for k in whole]
                aligned = await served.batcher.run_alone(lambda: align(served, body.text, each)) \
                    if body.alignments else None
                out = [render(served, hyps, body.nbest, body.scores, aligned[i] if aligned else None)
                       for i, hyps in enumerate(each)]
            else:
                out = [{"text": text} for text in parts.put_back([render(served, hyps, 1, False)["text"]
                                                                  for hyps in results])]
            warnings = parts.warnings
        if glossary is not None:
            for one, terms in zip(out, await not_placed(glossary, body.text, out), strict=True):
                one["glossary_missed"] = terms
        return {"model": served.name, "translations": out} | ({"warnings": warnings} if warnings else {})

    @app.post("/v1/attention")
    async def attention(body: AttentionRequest, request: Request):
        check_key(options, header_key(request))
        served = pick(models, body.model)
        parts = await plan_parts(app, served, [body.text], labels(1, single=True), settings(served))
        [k] = whole_lines(parts, [body.text], "attention")
        results = await translate(app, request, served, parts.parts, settings(served), "attention") \
            if k is not None else [[]]
        return await served.batcher.run_alone(lambda: attention_map(served, body.text, results[0]))


def whole_lines(parts: Parts, texts: list[str], what: str) -> list[int | None]:
    """The part each text is translated as (None for a blank one); ApiError 413 for a text that is not one line
    the model takes whole, since `what` are of one search of one line."""
    whole = [parts.whole(i) for i in range(len(texts))]
    for i, (text, k) in enumerate(zip(texts, whole, strict=True)):
        if k is None and text.strip():
            where = "the text" if len(texts) == 1 else f"text {i + 1}"
            raise ApiError(413, f"{where} is more than one line the model takes whole (it holds a line break, or is "
                                f"longer than the model takes), and {what} are of one line translated whole: send "
                                f"each line, or sentence, as a text of its own, or ask without them")
    return whole


def pick(models: dict[str, Served], name: str | None) -> Served:
    if name is None and len(models) == 1:
        return next(iter(models.values()))
    if name not in models:
        raise ApiError(404 if name else 400, f"{'no model ' + repr(name) if name else 'give a model'}; the models "
                                             f"are {', '.join(models)}")
    return models[name]


async def sweep(store: FileStore) -> None:
    """Remove expired translated files while the server runs, so that they go even when nobody asks for one."""
    while True:
        await asyncio.sleep(min(max(store.ttl, 1), 60))  # not a busy loop under a tiny --file-ttl
        store.sweep()


def describe(served: Served) -> dict:
    decode = served.loaded.config.decode
    return {"name": served.name, "source": served.src, "target": served.tgt, "beam": decode.beam,
            "len_penalty": decode.len_penalty}


def align(served: Served, lines: list[str], results: list[list[Hypothesis]]) -> list[str]:
    """Each line's Pharaoh alignment of its best translation, as `mt translate --alignments` writes it."""
    loaded = served.loaded
    if "export" in loaded.state:
        raise ApiError(400, "alignments need mt's own model, not a CTranslate2 export")
    refuse_right_to_left(loaded, "alignments")
    srcs = encode_lines(loaded, lines, warn=io.StringIO())
    todo = [i for i, hyps in enumerate(results) if hyps]
    weights = pair_attention(loaded.model, [srcs[i] for i in todo], [results[i][0].tokens for i in todo])
    aligned = [""] * len(lines)
    for i, attn in zip(todo, weights, strict=True):
        aligned[i] = pharaoh(hard_alignments(attn))
    return aligned


def refuse_right_to_left(loaded: Loaded, what: str) -> None:
    if loaded.model.cfg.right_to_left:  # its attention rows run last piece first
        raise ApiError(400, f"no {what} from a right-to-left model (model.right_to_left): it reads its output last "
                            "piece first; ask without them, or serve a left-to-right model")


def attention_map(served: Served, line: str, hyps: list[Hypothesis]) -> dict:
    """The page's heatmap: source and target pieces (each with EOS) and the mean cross-attention, a row per
    target piece."""
    loaded = served.loaded
    if "export" in loaded.state:
        raise ApiError(400, "attention needs mt's own model, not a CTranslate2 export")
    refuse_right_to_left(loaded, "attention")
    src = encode_lines(loaded, [line], warn=io.StringIO())[0]
    text = render(served, hyps, 1, False)["text"]
    if src is None or not hyps:
        return {"text": text, "source": [], "target": [], "weights": []}
    weights = select(pair_attention(loaded.model, [src], [hyps[0].tokens])[0])
    return {"text": text, "source": to_pieces(loaded.src_tok.sp, src), "target": to_pieces(loaded.tgt_tok.sp,
            hyps[0].tokens), "weights": [[round(w, 4) for w in row] for row in weights.tolist()]}


def run(paths: list[Path], names: list[str], options: ServeOptions) -> None:
    """Load the models, then serve until SIGTERM or Ctrl-C (uvicorn answers what is in flight, then exits)."""
    import uvicorn

    app = create_app(load_models(paths, names, options), options)
    try:
        app.state.detector.load()  # before the first request, rather than on it
    except ApiError as error:
        log.warning("%s", error.message)
    # What loading left (the models, compiled code) lives as long as the server: out of the garbage collector's
    # full passes, which walk every object and would stall requests (about 0.1 s a pass, 0.5 s with --compile).
    gc.freeze()
    uvicorn.run(app, host=options.host, port=options.port, log_level="info", timeout_graceful_shutdown=30,
                http=protocol(options))
