"""What `mt serve` checks of a request before it is batched with others, and of its API keys at start: a bad
request is refused alone and never fails the requests beside it; keys fail closed."""

import asyncio
import hmac

import pytest
from typer.testing import CliRunner

pytest.importorskip("fastapi")

from mt.cli import app as cli_app  # noqa: E402
from mt.errors import ApiError, MtError  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.checks import api_keys, check_key  # noqa: E402

from ..conftest import assert_refused  # noqa: E402
from .test_app import LINES, client, held_and_watched, one_by_one, run, until  # noqa: E402

GOOD = [LINES[0], LINES[2], LINES[4]]


def test_bad_requests_are_refused_before_batching_and_the_good_ones_beside_them_translated(checkpoint):
    app, served, inside, release, seen = held_and_watched(checkpoint)
    json = {"Content-Type": "application/json"}
    bad = {  # each kind of bad request, sent while good ones wait for the same model call
        "lone surrogate": ("/v1/translate", b'{"text": ["der hund", "ab\\ud800"]}', 400, "line 2 holds a lone "
                           "surrogate (U+D800) at character 3"),
        "libre surrogate": ("/translate", b'{"q": "\\udfff", "source": "de", "target": "en"}', 400, "line 1"),
        "attention surrogate": ("/v1/attention", b'{"text": "\\ud83d"}', 400, "lone surrogate"),
        "line too long": ("/v1/translate", b'{"text": ["a", "%s"]}' % (b"x" * 5001), 413, "line 2 has 5001"),
        "beam out of range": ("/v1/translate", b'{"text": ["der hund"], "beam": 0}', 422, "beam"),
        "nbest out of range": ("/v1/translate", b'{"text": ["der hund"], "nbest": 17}', 422, "nbest"),
    }

    async def go():
        async with client(app) as c:
            first = asyncio.create_task(c.post("/v1/translate", json={"text": [LINES[0]]}))
            await until(inside.is_set, "the worker to start")
            good = [asyncio.create_task(c.post("/v1/translate", json={"text": [line]})) for line in GOOD]
            refused = {case: await c.post(path, content=body, headers=json) for case, (path, body, *_) in bad.items()}
            await until(lambda: served.batcher.depth == len(GOOD), "the good requests to queue")
            release.set()
            return await first, [await g for g in good], refused

    first, good, refused = run(go())
    for case, (_, _, status, phrase) in bad.items():
        assert refused[case].status_code == status and phrase in refused[case].json()["error"], refused[case].json()
    assert first.status_code == 200 and [g.status_code for g in good] == [200] * len(GOOD)
    assert [g.json()["translations"][0]["text"] for g in good] == run(one_by_one(app, GOOD))[:len(GOOD)]
    assert seen[0] == [LINES[0]] and sorted(seen[1]) == sorted(GOOD)  # one call for the good ones, nothing bad


def test_a_model_call_that_fails_anyway_fails_only_the_request_that_caused_it(checkpoint):
    app, served, inside, release, seen = held_and_watched(checkpoint)
    watched = served.batcher.translate

    def failing(lines, settings):  # a model that breaks on two inputs that passed every check
        if "kaputt" in lines:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if "zwei" in lines:
            raise UnicodeEncodeError("utf-8", "zwei", 0, 1, "the tokenizer cannot take it")
        return watched(lines, settings)
    served.batcher.translate = failing

    async def go():
        async with client(app) as c:
            first = asyncio.create_task(c.post("/v1/translate", json={"text": [LINES[0]]}))
            await until(inside.is_set, "the worker to start")
            sent = [asyncio.create_task(c.post("/v1/translate", json={"text": text}))
                    for text in ([GOOD[0]], ["der hund", "kaputt"], ["zwei"], [GOOD[1]])]
            await until(lambda: served.batcher.depth == len(sent), "the requests to queue")
            release.set()
            return await first, [await s for s in sent]

    first, (good, broken, unencodable, other) = run(go())
    assert [r.status_code for r in (first, good, broken, unencodable, other)] == [200, 200, 500, 400, 200]
    assert broken.json() == {"error": "internal error: the model failed on this request; the server's log has the "
                                      "cause"}
    assert "send valid Unicode" in unencodable.json()["error"]
    assert seen[0] == [LINES[0]] and sorted(seen[1:]) == [[GOOD[0]], [GOOD[1]]]  # then each good request alone


@pytest.mark.parametrize("content, phrase", [
    ("\n\n  \n", "no key in it, only blank lines"),  # the file of the issue: the server started open to all
    (None, "no such file"),
    ("", "file is empty"),
    ("dir", "cannot read"),
    (b"\xff\n", "invalid UTF-8"),
])
def test_a_key_file_without_keys_stops_the_server_at_start(tmp_path, content, phrase):
    keys = tmp_path / "keys.txt"
    if content == "dir":
        keys.mkdir()
    elif isinstance(content, bytes):
        keys.write_bytes(content)
    elif content is not None:
        keys.write_text(content)
    result = CliRunner().invoke(cli_app, ["serve", str(tmp_path / "model.pt"), "--api-keys-file", str(keys)])
    assert_refused(result, f"--api-keys-file {keys}", phrase, "per line")


def test_a_blank_api_key_stops_the_server_and_keys_are_trimmed(tmp_path):
    result = CliRunner().invoke(cli_app, ["serve", str(tmp_path / "model.pt"), "--api-key", "  "])
    assert_refused(result, "--api-key was given a blank key")
    keys = tmp_path / "keys.txt"
    keys.write_text("  k1 \n\n\tk2\n", encoding="utf-8")
    assert api_keys([" k3 "], keys) == {"k1", "k2", "k3"}
    with pytest.raises(MtError, match="blank key"):
        api_keys(["k1", ""], keys)


def test_keys_are_compared_in_constant_time_each_of_them(monkeypatch):
    calls, compare_digest = [], hmac.compare_digest

    def compare(a, b):
        calls.append((a, b))
        return compare_digest(a, b)
    monkeypatch.setattr("mt.serve.checks.hmac.compare_digest", compare)
    options = ServeOptions(api_keys=frozenset({"k1", "k2", "k3"}))
    check_key(options, "k2")
    assert len(calls) == 3 and all(isinstance(a, bytes) and b == b"k2" for a, b in calls)  # not stopped at k2
    for wrong in ("k", "k22", "\ud800", "ü"):
        with pytest.raises(ApiError) as refused:
            check_key(options, wrong)
        assert refused.value.status == 403
    assert len(calls) == 3 + 4 * 3
