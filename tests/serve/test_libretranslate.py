"""LibreTranslate's API beyond plain translation, in-process: `/detect` and `source: "auto"` (a real identifier,
py3langid, among the served languages), `alternatives`, `/suggest`, answered in LibreTranslate's shapes."""

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("py3langid")

from mt import checkpoint  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.app import create_app, load_models  # noqa: E402

from ..conftest import tiny_model  # noqa: E402
from ..test_checkpoint import state_for  # noqa: E402
from .test_app import client, run  # noqa: E402

GERMAN = ["der Hund sitzt unter dem großen Baum im Garten", "Eine Frau mit einem roten Hut geht über die Straße"]
FRENCH = ["Un homme en chemise bleue joue de la guitare", "Deux enfants courent sur la plage"]
ENGLISH = "A man in a blue shirt is playing the guitar"


@pytest.fixture(scope="module")
def app(tokenizer, tmp_path_factory):
    """Three tiny untrained models, de→en, fr→en and en→de: what they say is noise, but each says its own."""
    paths = []
    for i, (src, tgt) in enumerate((("de", "en"), ("fr", "en"), ("en", "de"))):
        state = state_for(tiny_model(seed=i, vocab=tokenizer.vocab_size), tokenizer)
        state["config"]["decode"] = state["config"]["decode"] | {"beam": 2, "max_len_b": 4, "max_len_a": 1.0}
        state["langs"] = {"src": src, "tgt": tgt}
        paths.append(tmp_path_factory.mktemp("libre") / f"{src}-{tgt}.pt")
        checkpoint.save(state, paths[-1])
    return create_app(load_models(paths, [], ServeOptions()), ServeOptions())


def by_model(c, model: str, lines: list[str], nbest: int = 1):
    return c.post("/v1/translate", json={"model": model, "text": lines, "nbest": nbest})


def test_detect_answers_as_libretranslate_among_the_served_languages(app):
    async def go():
        async with client(app) as c:
            return [await c.post("/detect", json={"q": GERMAN[0]}), await c.post("/detect", data={"q": FRENCH[0]}),
                    await c.post("/detect", params={"q": ENGLISH}), await c.post("/detect", json={"q": GERMAN}),
                    await c.post("/detect", json={"q": "☃ 42 !"}), await c.post("/detect", json={"q": []}),
                    await c.post("/detect", json={"q": 7})]

    german, french, english, together, no_letters, empty, wrong = run(go())
    for answer, language in ((german, "de"), (french, "fr"), (english, "en"), (together, "de")):
        detections = answer.json()
        assert detections[0]["language"] == language and 50 < detections[0]["confidence"] <= 100, detections
        assert {d["language"] for d in detections} <= {"de", "en", "fr"}  # only what the models translate
        assert [d["confidence"] for d in detections] == sorted((d["confidence"] for d in detections), reverse=True)
    assert no_letters.json() == [{"confidence": 0.0, "language": "de"}]
    assert [empty.status_code, wrong.status_code] == [400, 400] and "q" in empty.json()["error"]


def test_source_auto_sends_each_text_to_the_model_of_its_language(app):
    async def go():
        async with client(app) as c:
            mixed = await c.post("/translate", json={"q": [GERMAN[0], FRENCH[0], "", GERMAN[1]], "source": "auto",
                                                     "target": "en"})
            single = await c.post("/translate", data={"q": ENGLISH, "source": "auto", "target": "de"})
            html = await c.post("/translate", json={"q": f"<p class='x'>{FRENCH[1]}</p>", "source": "auto",
                                                    "target": "en", "format": "html"})
            de, fr = await by_model(c, "de-en", [GERMAN[0], GERMAN[1]]), await by_model(c, "fr-en", [FRENCH[0]])
            en = await by_model(c, "en-de", [ENGLISH])
            unserved = await c.post("/translate", json={"q": [GERMAN[0], ENGLISH], "source": "auto", "target": "en"})
            return mixed.json(), single.json(), html.json(), de.json(), fr.json(), en.json(), unserved

    mixed, single, html, de, fr, en, unserved = run(go())
    texts = lambda answer: [t["text"] for t in answer["translations"]]  # noqa: E731
    assert mixed["translatedText"] == [texts(de)[0], texts(fr)[0], "", texts(de)[1]]
    assert [d["language"] for d in mixed["detectedLanguage"]] == ["de", "fr", "de", "de"]
    assert mixed["detectedLanguage"][2]["confidence"] == 0.0  # an empty text is no language
    assert single["translatedText"] == texts(en)[0] and single["detectedLanguage"]["language"] == "en"
    assert 50 < single["detectedLanguage"]["confidence"] <= 100
    assert html["detectedLanguage"]["language"] == "fr"  # the page's text, not its tags
    assert unserved.status_code == 400
    error = unserved.json()["error"]
    assert "text 2 looks English (en" in error and "en→en" in error and "de→en, fr→en, en→de" in error


def test_alternatives_are_the_next_best_of_the_n_best_list(app):
    async def go():
        async with client(app) as c:
            asked = await c.post("/translate", json={"q": GERMAN, "source": "de", "target": "en", "alternatives": 3})
            form = await c.post("/translate", data={"q": GERMAN[0], "source": "de", "target": "en",
                                                    "alternatives": "3"})
            nbest = await by_model(c, "de-en", GERMAN, nbest=4)
            none = await c.post("/translate", json={"q": GERMAN[0], "source": "de", "target": "en"})
            html = await c.post("/translate", json={"q": "<b>hallo</b>", "source": "de", "target": "en",
                                                    "format": "html", "alternatives": 2})
            refused = [await c.post("/translate", json={"q": "a", "source": "de", "target": "en",
                                                        "alternatives": n}) for n in (11, -1, "two", 2.5)]
            return asked.json(), form.json(), nbest.json(), none.json(), html.json(), refused

    asked, form, nbest, none, html, refused = run(go())
    for i, line in enumerate(nbest["translations"]):
        texts = [h["text"] for h in line["nbest"]]
        expected = [t for k, t in enumerate(texts) if k and t and t != texts[0] and t not in texts[1:k]][:3]
        assert asked["translatedText"][i] == texts[0] and asked["alternatives"][i] == expected
    assert asked["alternatives"][0], "an untrained model's 4 best hold more than one text"
    assert form["alternatives"] == asked["alternatives"][0]  # a form's digits; one q: one list of strings
    assert "alternatives" not in none and html["alternatives"] == []  # as LibreTranslate: none for html
    assert [r.status_code for r in refused] == [400] * 4
    assert "alternatives must be a whole number from 0 to 10" in refused[0].json()["error"]


def test_suggestions_are_off_as_libretranslate_says_it(app):
    async def go():
        async with client(app) as c:
            return (await c.post("/suggest", json={"q": "a", "s": "b", "source": "de", "target": "en"}),
                    await c.get("/frontend/settings"))

    suggest, settings = run(go())
    assert (suggest.status_code, suggest.json()) == (403, {"error": "Suggestions are disabled on this server."})
    assert settings.json()["suggestions"] is False
