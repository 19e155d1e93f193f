"""Every refusal of `mt serve`, in both APIs, is `{"error": MESSAGE}` with a 4xx status: malformed, deep and
wrongly typed bodies, invalid Unicode, unknown endpoints and methods; an unexpected failure is a 500 of that shape."""

import httpx
import pytest

pytest.importorskip("fastapi")

import mt.serve.app  # noqa: E402

from .test_app import run, serve_app  # noqa: E402

JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
DEEP = b"[" * 100_000 + b"]" * 100_000

CASES = {  # name: (method, path, body, headers, status, a phrase of the error)
    "deep JSON, mt's": ("POST", "/v1/translate", DEEP, JSON, 400, "nested too deeply"),
    "deep JSON, LibreTranslate's": ("POST", "/translate", DEEP, JSON, 400, "nested too deeply"),
    "not JSON": ("POST", "/v1/translate", b"{text: [", JSON, 400, "not valid JSON"),
    "not JSON, LibreTranslate's": ("POST", "/translate", b'{"q": ', JSON, 400, "not valid JSON (Expecting value"),
    "a number of 5000 digits": ("POST", "/v1/translate", b'{"text": ["a"], "beam": ' + b"9" * 5000 + b"}", JSON,
                                400, "4300 digits"),
    "a number of 5000 digits, LibreTranslate's": ("POST", "/translate", b'{"q": "a", "n": ' + b"9" * 5000 + b"}",
                                                  JSON, 400, "4300 digits"),
    "invalid UTF-8": ("POST", "/v1/translate", b'{"text": ["\xff"]}', JSON, 400, "not valid UTF-8"),
    "invalid UTF-8, LibreTranslate's": ("POST", "/translate", b'{"q": "\xff"}', JSON, 400, "not valid UTF-8"),
    "invalid UTF-8 in a form": ("POST", "/translate", b"q=%FF%FE&source=de&target=en", FORM, 400,
                                "form is not valid UTF-8"),
    "a surrogate encoded in a form": ("POST", "/translate", b"q=%ED%A0%80&source=de&target=en", FORM, 400,
                                      "form is not valid UTF-8"),
    "a surrogate in a language code": ("POST", "/translate", b'{"q": "a", "source": "\\ud800", "target": "en"}',
                                       JSON, 400, "no model translates \ud800\u2192en"),
    "a broken multipart form": ("POST", "/translate", b"garbage", {"Content-Type": "multipart/form-data; "
                                "boundary=xx"}, 400, "multipart"),
    "text/plain": ("POST", "/v1/translate", b'{"text": ["a"]}', {"Content-Type": "text/plain"}, 415,
                   "send Content-Type: application/json"),
    "no content type": ("POST", "/v1/translate", b'{"text": ["a"]}', {}, 415, "not none"),
    "XML, LibreTranslate's": ("POST", "/translate", b"<q>a</q>", {"Content-Type": "application/xml"}, 415,
                              "JSON or a form"),
    "an empty body": ("POST", "/v1/translate", b"", JSON, 422, "body: Field required"),
    "null": ("POST", "/v1/translate", b"null", JSON, 422, "body"),
    "a list, LibreTranslate's": ("POST", "/translate", b"[]", JSON, 400, "a JSON object"),
    "NaN": ("POST", "/v1/translate", b'{"text": ["a"], "len_penalty": NaN}', JSON, 422, "len_penalty"),
    "a string for a list": ("POST", "/v1/translate", b'{"text": "a"}', JSON, 422, "text"),
    "an unknown endpoint": ("GET", "/v2/translate", b"", {}, 404, "no endpoint /v2/translate"),
    "an unknown method": ("GET", "/v1/translate", b"", {}, 405, "does not take GET; it takes POST"),
    "PUT, LibreTranslate's": ("PUT", "/translate", b"", {}, 405, "it takes POST"),
    "a wrong key": ("POST", "/translate", b'{"q": "a", "source": "de", "target": "en", "api_key": "\\ud800"}', JSON,
                    403, "not accepted"),
}


def test_every_malformed_request_gets_a_4xx_of_the_documented_shape(checkpoint):
    app = serve_app(checkpoint, api_keys=frozenset({"k"}))
    key = {"Authorization": "Bearer k"}

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mt") as c:
            return {case: await c.request(method, path, content=body, headers=headers | key)
                    for case, (method, path, body, headers, *_) in CASES.items()}

    answers = run(go())
    for case, (*_, status, phrase) in CASES.items():
        answer = answers[case]
        assert answer.status_code == status, (case, answer.text)
        assert answer.headers["content-type"] == "application/json", case
        assert list(answer.json()) == ["error"] and phrase in answer.json()["error"], (case, answer.json())
    assert answers["an unknown method"].headers["allow"] == "POST"


def test_an_unexpected_failure_is_a_500_of_the_same_shape(checkpoint, monkeypatch):
    def broken(*args):
        raise RuntimeError("a bug")
    monkeypatch.setattr(mt.serve.app, "attention_map", broken)
    app = serve_app(checkpoint)

    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # as uvicorn: it logs the traceback
        async with httpx.AsyncClient(transport=transport, base_url="http://mt") as c:
            return await c.post("/v1/attention", json={"text": "der hund"})

    answer = run(go())
    assert answer.status_code == 500 and answer.json() == {"error": "internal error"}
