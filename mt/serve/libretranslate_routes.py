"""LibreTranslate's routes, answered as LibreTranslate answers them, so that its clients and apps work unchanged:
`POST /translate` (with `source: "auto"` and `alternatives`), `POST /detect`, `POST /suggest` (suggestions are off),
`GET /languages`, `GET /frontend/settings`. Its files, `/translate_file` and `/download_file`, are in
mt/serve/file_routes.py; its fields are read by mt/serve/libretranslate.py.

With source "auto", each text is detected alone (mt/serve/detect.py) and translated by the model from its language,
where LibreTranslate detects a list's language once, for all of its texts.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from mt.decode.search import Hypothesis
from mt.documents.formats import SUFFIXES, read_document
from mt.documents.sentences import Document
from mt.errors import ApiError
from mt.serve.checks import check_glossary, check_key, check_lines, header_key
from mt.serve.libretranslate import Query, body_key, fields, parse, respond, texts
from mt.serve.translating import (
    Served,
    labels,
    not_placed,
    plan_parts,
    read_documents,
    render,
    request_lines,
    settings,
    translate,
    translate_documents,
)

LANGUAGE_NAMES = {"cs": "Czech", "de": "German", "en": "English", "fr": "French"}


def add_libretranslate_routes(app: FastAPI) -> None:
    models, options = app.state.models, app.state.options

    @app.get("/frontend/settings")
    async def frontend_settings():
        """What LibreTranslate's page and apps read first, with its fields."""
        first = next(iter(models.values()))
        return {"charLimit": options.max_chars, "frontendTimeout": int(options.timeout * 1000),
                "apiKeys": bool(options.api_keys), "keyRequired": bool(options.api_keys), "suggestions": False,
                "filesTranslation": options.files, "supportedFilesFormat": list(SUFFIXES) if options.files else [],
                "language": {side: {"code": code, "name": LANGUAGE_NAMES.get(code, code)}
                             for side, code in (("source", first.src), ("target", first.tgt))}}

    @app.get("/languages")
    async def languages():
        sources = sorted({m.src for m in models.values()})
        return [{"code": s, "name": LANGUAGE_NAMES.get(s, s),
                 "targets": sorted(m.tgt for m in models.values() if m.src == s)} for s in sources]

    @app.post("/suggest")
    async def suggest():
        raise ApiError(403, "Suggestions are disabled on this server.")  # LibreTranslate's words: its page shows them

    @app.post("/detect")
    async def detect(request: Request):
        body = await fields(request)
        check_key(options, body_key(body) or header_key(request))
        lines, single = texts(body)
        if not lines:
            raise ApiError(400, "Invalid request: missing q parameter (a text, or a list of texts)")
        check_lines(lines, options)
        detector = app.state.detector
        return await asyncio.to_thread(detector.detect if single else detector.detect_together,
                                       lines[0] if single else lines)

    @app.post("/translate")
    async def libretranslate(request: Request):
        body = await fields(request)
        check_key(options, body_key(body) or header_key(request))
        query = parse(body)
        check_lines(query.lines, options)
        documents = await read_documents(lambda: [read_document("html", request_lines(text), f"text {i + 1}")
                                                  for i, text in enumerate(query.lines)]) \
            if query.format == "html" else None
        if query.source == "auto":
            shown = [" ".join(doc.units) for doc in documents] if documents is not None else query.lines
            detected = await detect_each(app, shown)
            chosen = by_detection(models, detected, query.target, query.single)
        else:
            detected, chosen = None, [pick_by_languages(models, query.source, query.target)] * len(query.lines)
        translated, alternatives, missed = [""] * len(query.lines), [[] for _ in query.lines], [[] for _ in query.lines]
        glossary_given, warnings = query.glossary is not None, []
        for name in dict.fromkeys(one.name for one in chosen):  # a model at a time: each watches the one connection
            indices = [i for i, one in enumerate(chosen) if one.name == name]
            out, said = await translate_some(app, request, models[name], query, indices, documents)
            for i, (text, others, lacks) in zip(indices, zip(*out, strict=True), strict=True):
                translated[i], alternatives[i], missed[i] = text, others, lacks
            warnings += said
        return respond(query, translated, missed if glossary_given else None, detected, alternatives, warnings)


async def translate_some(app: FastAPI, request: Request, served: Served, query: Query, indices: list[int],
                         documents: list[Document] | None
                         ) -> tuple[tuple[list[str], list[list[str]], list[list[dict]]], list[str]]:
    """The texts of `query` at `indices`, by `served`: their translations, alternatives and glossary terms missed;
    and the warnings."""
    options = app.state.options
    glossary = check_glossary(query.glossary, query.glossary_method, "export" in served.loaded.state, options)
    lines, names = [query.lines[i] for i in indices], [labels(len(query.lines), query.single)[i] for i in indices]
    if documents is not None:  # LibreTranslate has no alternatives for html either
        texts, warnings = await translate_documents(app, request, served, [documents[i] for i in indices],
                                                    settings(served, glossary=glossary), "translate", names)
        out, alternatives = [{"text": text} for text in texts], [[] for _ in indices]
    else:
        decoding = settings(served, nbest=query.alternatives + 1, glossary=glossary)
        parts = await plan_parts(app, served, lines, names, decoding)
        results = await translate(app, request, served, parts.parts, decoding, "translate", len(lines)) \
            if parts.parts else []
        out = [{"text": text} for text in parts.put_back([render(served, hyps, 1, False)["text"] for hyps in results])]
        whole, warnings = [parts.whole(i) for i in range(len(lines))], parts.warnings
        alternatives = [next_best(served, results[k], query.alternatives) if k is not None else [] for k in whole]
        if query.alternatives:
            warnings += [f"{name}: no alternatives: it is translated in parts (its lines, or sentences), and they "
                         f"are of a whole line" for name, line, k in zip(names, lines, whole, strict=True)
                         if k is None and line.strip()]
    missed = await not_placed(glossary, lines, out) if glossary is not None else [[] for _ in indices]
    return ([one["text"] for one in out], alternatives, missed), warnings


def next_best(served: Served, hyps: list[Hypothesis], n: int) -> list[str]:
    """Up to `n` translations after the best, as LibreTranslate lists them: each once, none empty or the best."""
    if n == 0 or not hyps:
        return []
    texts = served.loaded.tgt_tok.decode([h.tokens for h in hyps])
    seen, out = {texts[0], ""}, []
    for text in texts[1:]:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out[:n]


async def detect_each(app: FastAPI, shown: list[str]) -> list[dict]:
    """Each text's likeliest language ({"confidence", "language"}), detected off the event loop."""
    detector = app.state.detector
    return await asyncio.to_thread(lambda: [detector.detect(text)[0] for text in shown])


def by_detection(models: dict[str, Served], detected: list[dict], target: str, single: bool) -> list[Served]:
    """The model for each text of `detected` language into `target`; a text with no letter (confidence 0) goes
    with any model into `target`, and is said to be in its language, confidence 0."""
    into = [m for m in models.values() if m.tgt == target]
    if not into:
        raise ApiError(400, f"no model translates into {target}; the models translate {pairs(models)}")
    chosen = []
    for i, found in enumerate(detected):
        if found["confidence"] == 0:
            chosen.append(into[0])
            found["language"] = into[0].src
            continue
        fits = [m for m in into if m.src == found["language"]]
        if not fits:
            language = found["language"]
            where = "the text" if single else f"text {i + 1}"
            raise ApiError(400, f"{where} looks {LANGUAGE_NAMES.get(language, language)} ({language}, confidence "
                                f"{found['confidence']:g}%), and no model translates {language}→{target}: the "
                                f"models translate {pairs(models)}; give source")
        chosen.append(fits[0])
    return chosen


def pick_by_languages(models: dict[str, Served], source: str, target: str) -> Served:
    """LibreTranslate's choice: the model for `source` → `target`."""
    fits = [m for m in models.values() if m.tgt == target and m.src == source]
    if not fits:
        raise ApiError(400, f"no model translates {source}→{target}; the models translate {pairs(models)}")
    return fits[0]


def pairs(models: dict[str, Served]) -> str:
    return ", ".join(f"{m.src}→{m.tgt}" for m in models.values())
