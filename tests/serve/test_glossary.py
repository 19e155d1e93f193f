"""Glossaries in both server APIs: mt's /v1/translate and LibreTranslate's /translate take `glossary` (a list of
{"source", "target"} or a mapping), translate as `mt translate --glossary` does, report per line the terms not
placed, answer as before without one, and refuse a bad glossary with a 4xx `{"error"}`."""

import pytest
import torch

pytest.importorskip("fastapi")

from mt import checkpoint  # noqa: E402
from mt.decode.glossary import Glossary, Term, placed  # noqa: E402
from mt.decode.load import load_model  # noqa: E402
from mt.decode.search import SearchOptions  # noqa: E402
from mt.decode.translate import translate_lines  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.app import create_app, load_models  # noqa: E402

from ..conftest import tiny_model  # noqa: E402
from ..test_checkpoint import state_for  # noqa: E402
from .test_app import client, run  # noqa: E402

LINES = ["the cat sat on the mat", "", "a big dog runs", "red cat"]
TERMS = [{"source": "cat", "target": "dog"}, {"source": "mat", "target": "red tree"}]


@pytest.fixture(scope="module")
def model_path(tokenizer, tmp_path_factory):
    """A tiny untrained model, decoding 2 beams: quick, and it places terms only because it must."""
    state = state_for(tiny_model(vocab=tokenizer.vocab_size), tokenizer)
    state["config"]["decode"] = state["config"]["decode"] | {"beam": 2, "max_len_b": 4, "max_len_a": 1.0}
    state["langs"] = {"src": "de", "tgt": "en"}
    path = tmp_path_factory.mktemp("glossary") / "c.pt"
    checkpoint.save(state, path)
    return path


@pytest.fixture(scope="module")
def app(model_path):
    return create_app(load_models([model_path], [], ServeOptions(max_chars=40)), ServeOptions(max_chars=40))


def expected(model_path, lines: list[str]) -> dict[str, list[str]]:
    """What `mt translate --glossary` would write for `lines`, by each method."""
    loaded = load_model(model_path)
    opts = SearchOptions.from_config(loaded.config.decode)
    out = {}
    for method in ("constrain", "replace"):
        glossary = Glossary(tuple(Term(t["source"], t["target"]) for t in TERMS), method)
        hyps = translate_lines(loaded, lines, opts, torch.device("cpu"), glossary=glossary)
        out[method] = [loaded.tgt_tok.decode([h[0].tokens])[0] if h else "" for h in hyps]
    return out


def test_both_apis_take_a_glossary_and_report_per_line_what_was_not_placed(app, model_path):
    async def go():
        async with client(app) as c:
            return (await c.post("/v1/translate", json={"text": LINES, "glossary": TERMS}),
                    await c.post("/v1/translate", json={"text": LINES, "glossary": {t["source"]: t["target"]
                                                                                    for t in TERMS},
                                                        "glossary_method": "replace"}),
                    await c.post("/translate", json={"q": LINES, "source": "de", "target": "en", "glossary": TERMS}),
                    await c.post("/translate", data={"q": LINES[0], "source": "de", "target": "en",
                                                     "glossary": '{"cat": "dog", "mat": "red tree"}'}),
                    await c.post("/v1/translate", json={"text": LINES}),
                    await c.post("/translate", json={"q": LINES[0], "source": "de", "target": "en"}))

    native, replaced, libre, form, plain, libre_plain = (r.json() for r in run(go()))
    texts, by_cli = [t["text"] for t in native["translations"]], expected(model_path, LINES)
    assert texts == by_cli["constrain"] == libre["translatedText"]
    assert [t["text"] for t in replaced["translations"]] == by_cli["replace"]
    assert form["translatedText"] == texts[0]
    for answer, missed in ((native, [t["glossary_missed"] for t in native["translations"]]),
                           (replaced, [t["glossary_missed"] for t in replaced["translations"]]),
                           (libre, libre["glossaryMissed"])):
        outputs = [t["text"] for t in answer["translations"]] if "translations" in answer else answer[
            "translatedText"]
        for line, text, terms in zip(LINES, outputs, missed, strict=True):
            wanted = [t for t in TERMS if t["source"] in line.split()]
            assert terms == [t for t in wanted if not placed(t["target"], text)]
    assert form["glossaryMissed"] == libre["glossaryMissed"][0]
    # Without a glossary: the answers as they were, with no glossary field.
    assert all(set(t) == {"text"} for t in plain["translations"]) and set(libre_plain) == {"translatedText"}


@pytest.mark.parametrize("glossary, extra, status, phrase", [
    ({"cat": 5}, {}, 400, "glossary term 1: send {\"source\""),
    ([{"source": "cat"}], {}, 400, "glossary term 1"),
    ([{"source": "cat", "target": "dog"}, {"source": " ", "target": "x"}], {}, 400, "glossary term 2: the source "
                                                                                     "term is empty"),
    ([{"source": "cat", "target": "dog"}, {"source": "cat", "target": "bird"}], {}, 400, "given twice"),
    ("cat=dog", {}, 400, "glossary: not JSON"),
    (17, {}, 400, "glossary: send a list"),
    ({f"w{i}": "x" for i in range(1001)}, {}, 413, "1001 terms; the limit is 1000"),
    ({"cat": "d" * 41}, {}, 413, "longer than a line may be"),
    ({"cat": "dog"}, {"glossary_method": "guess"}, 400, "glossary_method"),
    (None, {"glossary_method": "replace"}, 400, "send glossary too"),
])
def test_a_bad_glossary_is_refused_with_a_4xx_and_one_line(app, glossary, extra, status, phrase):
    async def go():
        async with client(app) as c:
            body = {"glossary": glossary} if glossary is not None else {}
            return (await c.post("/v1/translate", json={"text": ["the cat"]} | body | extra),
                    await c.post("/translate", json={"q": "the cat", "source": "de", "target": "en"} | body | extra))

    for answer in run(go()):
        assert answer.status_code == status and phrase in answer.json()["error"], answer.json()
        assert "\n" not in answer.json()["error"]
