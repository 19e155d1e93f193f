"""LibreTranslate's real clients, unchanged, against one live `mt serve` with a key required: deep-translator's
LibreTranslator, libretranslatepy, the form LibreTranslate's page posts, and a file upload with a real multipart
client; a missing or wrong key refused in every spelling on every route that translates or detects; the translated
files' folder gone when the server stops."""

import json
import signal
import urllib.error

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("py3langid")
pytest.importorskip("sentencex")
import httpx  # noqa: E402

from .test_app import LINES, mt_translate, start_server  # noqa: E402

KEY = "k1"
GERMAN = "der hund sitzt unter dem baum"


@pytest.fixture(scope="module")
def live(checkpoint, tmp_path_factory):
    """The module's one server: its URL, its process and its temporary folder."""
    temporary = tmp_path_factory.mktemp("live-tmp")
    with open(temporary.parent / "live-server.log", "w") as log:
        url, process = start_server(checkpoint, "--api-key", KEY, env={"TMPDIR": str(temporary)}, log=log)
        try:
            yield url, process, temporary
        finally:
            process.kill()
            process.wait(30)


@pytest.fixture(scope="module")
def expected(checkpoint, tmp_path_factory) -> list[str]:
    return mt_translate(checkpoint, LINES, tmp_path_factory.mktemp("expected"))


def test_deep_translator_translates_and_batches_with_the_key_and_is_refused_a_wrong_one(live, expected):
    from deep_translator import LibreTranslator
    from deep_translator.exceptions import AuthorizationException

    url = live[0] + "/"
    deep = LibreTranslator(source="de", target="en", custom_url=url, use_free_api=False, api_key=KEY)
    assert deep.translate(LINES[0]) == expected[0]
    assert deep.translate_batch([LINES[0], LINES[2]]) == [expected[0], expected[2]]
    auto = LibreTranslator(source="auto", target="en", custom_url=url, use_free_api=False, api_key=KEY)
    assert auto.translate(LINES[2]) == expected[2]
    with pytest.raises(AuthorizationException):  # deep-translator's word for a 403
        LibreTranslator(source="de", target="en", custom_url=url, use_free_api=False, api_key="k2").translate(GERMAN)


def test_libretranslatepy_lists_translates_and_detects_and_without_a_key_is_refused(live, expected):
    from libretranslatepy import LibreTranslateAPI

    api = LibreTranslateAPI(live[0], api_key=KEY)
    assert api.languages() == [{"code": "de", "name": "German", "targets": ["en"]}]
    assert api.translate(LINES[0], "de", "en") == expected[0]
    detected = api.detect(GERMAN)
    assert detected[0]["language"] == "de" and 50 < detected[0]["confidence"] <= 100
    for call in (lambda a: a.translate(GERMAN, "de", "en"), lambda a: a.detect(GERMAN)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            call(LibreTranslateAPI(live[0]))
        assert refused.value.code == 401 and "API key" in json.loads(refused.value.read())["error"]


def test_the_form_libretranslates_page_posts_is_answered_as_the_page_reads_it(live, expected):
    page = {"q": (None, LINES[2]), "source": (None, "auto"), "target": (None, "en"), "format": (None, "text"),
            "alternatives": (None, "3")}  # FormData: multipart, every field a string
    answer = httpx.post(live[0] + "/translate", files=page | {"api_key": (None, KEY)}, timeout=60)
    body = answer.json()
    assert body["translatedText"] == expected[2] and body["detectedLanguage"]["language"] == "de"
    assert isinstance(body["alternatives"], list) and len(body["alternatives"]) <= 3
    assert expected[2] not in body["alternatives"]
    blank = httpx.post(live[0] + "/translate", files=page | {"api_key": (None, "")}, timeout=60)  # no key typed
    assert blank.status_code == 401


def keyless(route: str) -> dict:
    """A request to `route` that needs only a key, as httpx.post's arguments."""
    if route.startswith("/v1/"):
        return {"json": {"text": [GERMAN] if route == "/v1/translate" else GERMAN}}
    if route == "/translate_file":
        return {"files": {"file": ("a.txt", GERMAN.encode())}, "data": {"source": "de", "target": "en"}}
    return {"json": {"q": GERMAN, "source": "de", "target": "en"} if route == "/translate" else {"q": GERMAN}}


def spellings(route: str, key: str) -> list[dict]:
    """Every way the server reads `key` from a request to `route`: LibreTranslate's api_key in the body (JSON, a
    form) or in the query string, and the headers, which mt's own API reads only."""
    request = keyless(route)
    headers = [request | {"headers": {"Authorization": f"Bearer {key}"}}, request | {"headers": {"X-API-Key": key}}]
    if route.startswith("/v1/"):
        return headers
    if route == "/translate_file":
        return [request | {"data": request["data"] | {"api_key": key}}, request | {"params": {"api_key": key}},
                *headers]
    fields = request["json"] | {"api_key": key}
    return [{"json": fields}, {"data": fields}, {"params": fields}, *headers]


@pytest.mark.parametrize("route", ["/translate", "/detect", "/translate_file", "/v1/translate", "/v1/attention"])
def test_a_missing_or_wrong_key_is_refused_in_every_spelling(live, route):
    url = live[0] + route
    missing = httpx.post(url, **keyless(route), timeout=60)
    assert missing.status_code == 401 and "API key is needed" in missing.json()["error"], missing.text
    for wrong, right in zip(spellings(route, "k2"), spellings(route, KEY), strict=True):
        refused, accepted = httpx.post(url, **wrong, timeout=60), httpx.post(url, **right, timeout=60)
        assert refused.status_code == 403 and "not accepted" in refused.json()["error"], (wrong, refused.text)
        assert accepted.status_code == 200, (right, accepted.text)


def test_a_file_through_the_real_server_and_its_folder_removed_when_the_server_stops(live, checkpoint, tmp_path):
    url, process, temporary = live
    text = "der hund sitzt unter dem baum. die katze läuft.\n"
    answer = httpx.post(url + "/translate_file", files={"file": ("Brief an Anna.txt", text.encode())},
                        data={"source": "de", "target": "en", "api_key": KEY}, timeout=60)
    download = httpx.get(answer.json()["translatedFileUrl"], timeout=60)
    assert download.text.splitlines() == mt_translate(checkpoint, [text.rstrip()], tmp_path, "--format", "text")
    assert download.headers["content-disposition"] == "attachment; filename*=UTF-8''Brief%20an%20Anna.txt"
    assert [p.name.startswith("mt-serve-files-") for p in temporary.iterdir()] == [True]
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    assert list(temporary.iterdir()) == []  # the server took its translated files with it
