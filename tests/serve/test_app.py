"""`mt serve`: every endpoint on a tiny trained model, batching across requests, the limits, a real server."""

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from mt.cli import app as cli_app  # noqa: E402
from mt.documents.formats import SUFFIXES  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.app import create_app, load_models  # noqa: E402

WAIT = 120  # seconds: how long a held worker or a test waits for the other side, however loaded the machine
LINES = ["der hund sitzt unter dem baum", "", "die katze läuft auf das rote haus", "   ", "das größte Ü-Ei ☃"]


def serve_app(checkpoint: Path, **options):
    opts = ServeOptions(**options)
    return create_app(load_models([checkpoint], [], opts), opts)


def mt_translate(checkpoint: Path, lines: list[str], tmp_path: Path, *args: str) -> list[str]:
    source = tmp_path / "input.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = CliRunner().invoke(cli_app, ["translate", "-c", str(checkpoint), "--input", str(source), *args])
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mt")


def run(coroutine):
    return asyncio.run(coroutine)


def test_the_native_api_translates_as_mt_translate_does(checkpoint, tmp_path):
    app = serve_app(checkpoint)

    async def go():
        async with client(app) as c:
            models = (await c.get("/v1/models")).json()["models"]
            one = await c.post("/v1/translate", json={"text": LINES, "scores": True, "alignments": True})
            nbest = await c.post("/v1/translate", json={"model": "de-en", "text": LINES[:1], "nbest": 3, "beam": 4})
            return models, one.json(), nbest.json()

    models, one, nbest = run(go())
    assert [(m["name"], m["source"], m["target"]) for m in models] == [("de-en", "de", "en")]
    assert [t["text"] for t in one["translations"]] == mt_translate(checkpoint, LINES, tmp_path)
    assert one["translations"][1] == {"text": "", "score": 0.0, "alignment": ""}  # an empty line stays empty
    assert re.fullmatch(r"(\d+-\d+ ?)+", one["translations"][0]["alignment"])
    assert [h["text"] for h in nbest["translations"][0]["nbest"]] == [
        line.split(" ||| ")[1] for line in mt_translate(checkpoint, LINES[:1], tmp_path, "--nbest", "3", "--beam", "4")]


def test_libretranslate_requests_in_every_shape_its_clients_send(checkpoint, tmp_path):
    app = serve_app(checkpoint, api_keys=frozenset({"k1"}))
    expected = mt_translate(checkpoint, LINES, tmp_path)

    async def go():
        async with client(app) as c:
            single = await c.post("/translate", json={"q": LINES[0], "source": "de", "target": "en", "api_key": "k1"})
            many = await c.post("/translate", json={"q": LINES, "source": "auto", "target": "en", "api_key": "k1"})
            form = await c.post("/translate", data={"q": LINES[2], "source": "de", "target": "en", "api_key": "k1",
                                                    "format": "text"})
            # deep-translator's LibreTranslator: every field in the query string, no body
            query = await c.post("/translate", params={"q": LINES[0], "source": "de", "target": "en",
                                                       "format": "text", "api_key": "k1"})
            mixed = await c.post("/translate", params={"api_key": "k1"}, data={"q": LINES[2], "source": "de",
                                                                               "target": "en"})
            refused = [await c.post("/translate", params={"q": LINES[0], "source": "de", "target": "en", **key})
                       for key in ({}, {"api_key": "k2"})]
            languages = await c.get("/languages")
            settings = await c.get("/frontend/settings")
            return single, many, form, query, mixed, refused, languages, settings

    single, many, form, query, mixed, refused, languages, settings = run(go())
    assert single.json() == {"translatedText": expected[0]}
    assert many.json()["translatedText"] == expected and many.json()["detectedLanguage"][0]["language"] == "de"
    assert form.json() == {"translatedText": expected[2]}
    assert query.json() == {"translatedText": expected[0]} and mixed.json() == {"translatedText": expected[2]}
    assert [r.status_code for r in refused] == [401, 403]  # no key, a wrong one: in the query string as in a body
    assert languages.json() == [{"code": "de", "name": "German", "targets": ["en"]}]
    assert settings.json() == {"charLimit": 5000, "frontendTimeout": 60000, "apiKeys": True, "keyRequired": True,
                               "suggestions": False, "filesTranslation": True, "supportedFilesFormat": list(SUFFIXES),
                               "language": {"source": {"code": "de", "name": "German"},
                                            "target": {"code": "en", "name": "English"}}}


PAGE = '<p class="x">Der Hund <b>sitzt</b> unter dem Baum. Die Katze läuft.</p>\n<pre>der hund</pre>'
SUBTITLES = "1\n00:00:01,000 --> 00:00:02,000\nder hund sitzt.\ndie katze läuft.\n"


def test_documents_through_both_apis_are_translated_as_mt_translate_format_does(checkpoint, tmp_path):
    pytest.importorskip("sentencex")
    app = serve_app(checkpoint, max_lines=2)

    async def go():
        async with client(app) as c:
            native = await c.post("/v1/translate", json={"text": [PAGE, SUBTITLES], "format": "html"})
            libre = await c.post("/translate", json={"q": PAGE, "source": "de", "target": "en", "format": "html"})
            srt = await c.post("/v1/translate", json={"text": [SUBTITLES], "format": "srt"})
            broken = await c.post("/v1/translate", json={"text": [SUBTITLES.replace("-->", "->")], "format": "srt"})
            nbest = await c.post("/v1/translate", json={"text": [PAGE], "format": "text", "nbest": 2})
            return native.json(), libre.json(), srt.json(), broken, nbest

    native, libre, srt, broken, nbest = run(go())
    page = mt_translate(checkpoint, [PAGE], tmp_path, "--format", "html")  # its sentences: more than --max-lines
    assert native["translations"][0]["text"].split("\n") == page == libre["translatedText"].split("\n")
    assert srt["translations"][0]["text"].split("\n") == mt_translate(checkpoint, [SUBTITLES], tmp_path, "--format",
                                                                        "srt")
    assert (broken.status_code, broken.json()) == (400, {"error": "text 1:2: a broken timing line, '00:00:01,000 -> "
                                                                  "00:00:02,000': SubRip's is HH:MM:SS,mmm --> "
                                                                  "HH:MM:SS,mmm"})
    assert nbest.status_code == 400 and "nbest, scores and alignments are for format lines" in nbest.json()["error"]


def held(batcher):
    """Make `batcher`'s worker wait inside its next model call until the test lets it go."""
    inside, release = threading.Event(), threading.Event()
    translate = batcher.translate

    def hold_then_translate(lines, settings):
        inside.set()
        release.wait(WAIT)  # the test's to let go: a loaded machine only makes it later, never changes the batch
        return translate(lines, settings)
    batcher.translate = hold_then_translate
    return inside, release


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"waited {WAIT} s for {what}")


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_concurrent_requests_are_translated_together_and_each_gets_its_own_lines(checkpoint):
    app = serve_app(checkpoint)
    served = app.state.models["de-en"]
    inside, release = held(served.batcher)
    n = len(LINES)

    async def go():
        async with client(app) as c:
            first = asyncio.create_task(c.post("/v1/translate", json={"text": [LINES[0]]}))
            await until(inside.is_set, "the worker to start")  # the model is busy: what arrives now queues up
            rest = [asyncio.create_task(c.post("/v1/translate", json={"text": [line, LINES[0]]}))
                    for line in LINES[:n]]
            await until(lambda: served.batcher.depth == n, f"{n} requests to queue")
            release.set()
            answers = [await t for t in [first, *rest]]
            return answers, (await c.get("/metrics")).text

    answers, metrics = run(go())
    alone = run(one_by_one(app, LINES[:n] + [LINES[0]]))
    assert [a.json()["translations"][0]["text"] for a in answers[1:]] == alone[:n]
    assert all(a.json()["translations"][-1]["text"] == alone[-1] for a in answers)
    assert metric(metrics, 'mt_model_calls_total{model="de-en"}') < n + 1  # n + 1 requests, fewer calls
    assert metric(metrics, 'mt_batch_requests_bucket{le="8.0",model="de-en"}') - metric(
        metrics, 'mt_batch_requests_bucket{le="4.0",model="de-en"}') >= 1  # one call took all n waiting
    assert metric(metrics, 'mt_lines_total{model="de-en"}') == 1 + 2 * n  # what was sent, counted
    assert metric(metrics, 'mt_requests_total{code="200",endpoint="/v1/translate"}') == n + 1


async def one_by_one(app, lines: list[str]) -> list[str]:
    async with client(app) as c:
        return [(await c.post("/v1/translate", json={"text": [line]})).json()["translations"][0]["text"]
                for line in lines]


def test_a_full_queue_and_a_slow_answer_are_refused_clearly_and_others_are_undisturbed(checkpoint):
    # The queued request must still be waiting when the third arrives: a second of timeout, not a loaded CI
    # machine's stall (0.3 s once let it time out first, and the third was queued)
    app = serve_app(checkpoint, max_waiting=1, timeout=1.0)
    served = app.state.models["de-en"]
    inside, release = held(served.batcher)

    async def go():
        async with client(app) as c:
            first = asyncio.create_task(c.post("/v1/translate", json={"text": [LINES[0]]}))
            await until(inside.is_set, "the worker to start")
            queued = asyncio.create_task(c.post("/v1/translate", json={"text": [LINES[2]]}))
            await until(lambda: served.batcher.depth == 1, "a request to queue")
            full = await c.post("/v1/translate", json={"text": [LINES[2]]})
            late = [await first, await queued]  # held past the timeout
            release.set()
            await asyncio.sleep(0.2)
            after = await c.post("/v1/translate", json={"text": [LINES[0]]})
            return full, late, after

    full, late, after = run(go())
    assert full.status_code == 503 and full.headers["retry-after"] == "1" and "queue is full" in full.json()["error"]
    assert [r.status_code for r in late] == [504, 504] and "--timeout" in late[0].json()["error"]
    assert after.status_code == 200 and after.json()["translations"][0]["text"]


def test_limits_keys_and_malformed_bodies_get_a_status_and_an_error_message(checkpoint):
    app = serve_app(checkpoint, api_keys=frozenset({"secret"}), max_lines=3, max_chars=50)
    ok = {"Authorization": "Bearer secret"}

    async def go():
        async with client(app) as c:
            return {
                "no key": await c.post("/v1/translate", json={"text": ["a"]}),
                "wrong key": await c.post("/v1/translate", json={"text": ["a"]}, headers={"X-API-Key": "guess"}),
                "libre no key": await c.post("/translate", json={"q": "a", "source": "de", "target": "en"}),
                "too many lines": await c.post("/v1/translate", json={"text": ["a"] * 4}, headers=ok),
                "too long": await c.post("/v1/translate", json={"text": ["a", "x" * 51]}, headers=ok),
                "not json": await c.post("/v1/translate", content=b"{text: [", headers=ok | {
                    "Content-Type": "application/json"}),
                "wrong type": await c.post("/v1/translate", json={"text": "one string"}, headers=ok),
                "unknown model": await c.post("/v1/translate", json={"model": "fr-en", "text": ["a"]}, headers=ok),
                "no such pair": await c.post("/translate", json={"q": "a", "source": "fr", "target": "en",
                                                                 "api_key": "secret"}),
                "xml": await c.post("/translate", json={"q": "a", "source": "de", "target": "en",
                                                        "format": "xml", "api_key": "secret"}),
                "fine": await c.post("/v1/translate", json={"text": ["der hund"]}, headers=ok),
            }

    answers = run(go())
    expected = {"no key": (401, "API key is needed"), "wrong key": (403, "not accepted"),
                "libre no key": (401, "API key"), "too many lines": (413, "the limit is 3 (--max-lines)"),
                "too long": (413, "line 2 has 51 characters"), "not json": (400, "not valid JSON"),
                "wrong type": (422, "text"), "unknown model": (404, "the models are de-en"),
                "no such pair": (400, "translate de→en"), "xml": (400, "format=text or format=html")}
    for case, (status, phrase) in expected.items():
        assert answers[case].status_code == status, case
        assert phrase in answers[case].json()["error"], (case, answers[case].json())
    assert answers["fine"].status_code == 200


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, process: subprocess.Popen) -> None:
    with httpx.Client(timeout=1) as http:  # one client: each of httpx.get's loads the certificates anew (50 ms)
        for _ in range(600):
            assert process.poll() is None, process.stderr.read() if process.stderr else "the server ended"
            try:
                if http.get(f"{url}/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise AssertionError("the server never became ready")


def start_server(checkpoint: Path, *args: str, env: dict | None = None, log=subprocess.PIPE
                 ) -> tuple[str, subprocess.Popen]:
    """`mt serve CHECKPOINT ARGS` in a process of its own on a free port, once it is ready: its URL and process.
    Its output goes to `log` (a file, for a server that answers more than a pipe holds unread)."""
    url = f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen([sys.executable, "-m", "mt", "serve", str(checkpoint), "--port", url.rsplit(":", 1)[1],
                                *args], stdout=log, stderr=subprocess.STDOUT if log is not subprocess.PIPE else log,
                               text=True, env=os.environ | {"OMP_NUM_THREADS": "1"} | (env or {}))
    try:
        wait_ready(url, process)
    except BaseException:
        process.kill()
        raise
    return url, process


def test_a_real_server_answers_a_libretranslate_client_and_stops_cleanly_on_sigterm(checkpoint, tmp_path):
    from deep_translator import LibreTranslator
    from libretranslatepy import LibreTranslateAPI

    url, process = start_server(checkpoint)
    try:
        expected = mt_translate(checkpoint, LINES, tmp_path)
        assert LibreTranslateAPI(url + "/").translate(LINES[0], "de", "en") == expected[0]
        deep = LibreTranslator(source="de", target="en", custom_url=url + "/", use_free_api=False, api_key="any")
        assert deep.translate(LINES[0]) == expected[0]  # a key the server, which has none, ignores
        assert deep.translate_batch([LINES[0], LINES[2]]) == [expected[0], expected[2]]
        answers = []
        many = LINES * 50  # in flight when SIGTERM comes
        sender = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{url}/v1/translate", json={"text": many, "beam": 8}, timeout=60)))
        sender.start()
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        sender.join(60)
        # uvicorn shuts down, then re-raises the SIGTERM it caught, so a supervisor sees why the server ended
        assert process.wait(60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in process.stderr.read()
        assert answers[0].status_code == 200
        assert [t["text"] for t in answers[0].json()["translations"]] == mt_translate(checkpoint, many, tmp_path,
                                                                                      "--beam", "8")
    finally:
        process.kill()


class Client:
    """What `translate` asks of a request: its next ASGI message, which is the disconnect once its client has gone
    (and never comes while the client waits)."""

    def __init__(self, gone: bool):
        self.gone = gone

    async def receive(self) -> dict:
        if not self.gone:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}


def held_and_watched(checkpoint: Path):
    """An app whose model's worker is `held`, and the list of the lines each of its model calls saw."""
    app = serve_app(checkpoint)
    served = app.state.models["de-en"]
    inside, release = held(served.batcher)
    seen, held_translate = [], served.batcher.translate
    served.batcher.translate = lambda lines, settings: seen.append(list(lines)) or held_translate(lines, settings)
    return app, served, inside, release, seen


def test_a_request_whose_client_went_away_is_dropped_before_the_model_sees_it(checkpoint):
    from mt.serve.app import ApiError, translate

    app, served, inside, release, seen = held_and_watched(checkpoint)
    settings = (4, 0.6, 1, None)

    async def go():
        first = asyncio.create_task(translate(app, Client(False), served, ["der hund"], settings, "v1"))
        await until(inside.is_set, "the worker to start")
        gone = asyncio.create_task(translate(app, Client(True), served, ["die katze"], settings, "v1"))
        kept = asyncio.create_task(translate(app, Client(False), served, ["das haus"], settings, "v1"))
        with pytest.raises(ApiError) as refused:
            await gone
        release.set()
        return refused.value.status, await first, await kept

    status, first, kept = run(go())
    assert status == 499 and first and kept
    assert seen == [["der hund"], ["das haus"]]  # the model never saw the line of the client that went away


def test_a_client_that_hangs_up_on_a_real_server_has_its_line_dropped(checkpoint):
    import uvicorn

    app, served, inside, release, seen = held_and_watched(checkpoint)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    url = f"http://127.0.0.1:{server.config.port}/v1/translate"
    answers = []

    def post(line: str) -> threading.Thread:
        sender = threading.Thread(target=lambda: answers.append(httpx.post(url, json={"text": [line]}, timeout=30)))
        sender.start()
        return sender

    try:
        run(until(lambda: server.started, "the server to start"))
        first = post("der hund")
        run(until(inside.is_set, "the worker to start"))
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            httpx.post(url, json={"text": ["die katze"]}, timeout=0.5)
        run(until(lambda: all(p.future.done() for p in served.batcher.waiting), "the server to see it gone"))
        kept = post("das haus")
        run(until(lambda: served.batcher.depth == 2, "the next request to queue"))
        release.set()
        first.join(30), kept.join(30)
    finally:
        release.set()
        server.should_exit = True
        thread.join(30)
    assert [a.status_code for a in answers] == [200, 200]
    assert seen == [["der hund"], ["das haus"]]  # the model never saw the line of the client that hung up
