"""No silent loss through the API, and bounded work per request: a text longer than the model takes is translated
whole, in parts, as `mt translate --format text` translates it; line breaks inside a text are kept; what cannot
be kept whole is refused (413) or said in `warnings`; a request's sentences, beam, glossary work and terms per
sentence are bounded, with a 413 naming the option. Every hostile input is built here."""

import random

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sentencex")

from mt.decode.load import Loaded  # noqa: E402
from mt.options import ServeOptions  # noqa: E402
from mt.serve.parts import check_parts, plan_texts  # noqa: E402

from ..conftest import LEXICON, tiny_model  # noqa: E402
from .test_app import SUBTITLES, client, mt_translate, run, serve_app  # noqa: E402

WORDS = list(LEXICON)
BREAKS = ["\n", "\r\n", "\r", "\u2028", "\x0b", "\x85"]


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 5))).capitalize() + "." for _ in range(n)]


@pytest.fixture(scope="module")
def app(checkpoint):
    return serve_app(checkpoint, max_sentences=80, max_beam=8, max_sentence_terms=2)


def test_a_text_longer_than_the_model_takes_is_translated_whole_in_both_apis(app, checkpoint, tmp_path):
    text = " ".join(sentences(60))  # some 1,500 characters: far inside --max-chars, some 400 pieces
    assert len(text) < app.state.options.max_chars
    assert len(app.state.models["de-en"].loaded.src_tok.encode([text])[0]) > 4 * 63  # the model takes 63

    async def go():
        async with client(app) as c:
            return ((await c.post("/translate", json={"q": text, "source": "de", "target": "en"})).json(),
                    (await c.post("/v1/translate", json={"text": [text, "der hund"]})).json())

    libre, native = run(go())
    whole = mt_translate(checkpoint, [text], tmp_path, "--format", "text")  # sentence by sentence, none cut
    assert libre == {"translatedText": "\n".join(whole)}  # and no warning: nothing was lost
    assert [t["text"] for t in native["translations"]] == ["\n".join(whole), *mt_translate(checkpoint, ["der hund"],
                                                                                             tmp_path)]
    assert "warnings" not in native


def test_line_breaks_inside_a_text_are_kept_each_line_translated_as_a_line(app, checkpoint, tmp_path):
    lines = sentences(len(BREAKS) + 1, seed=1)
    text = "".join(line + brk for line, brk in zip(lines, BREAKS + [""], strict=True))
    blank = f"{lines[0]}\n\n{lines[1]}\n"

    async def go():
        async with client(app) as c:
            return ((await c.post("/translate", json={"q": [text, blank], "source": "de", "target": "en"})).json(),
                    (await c.post("/v1/translate", json={"text": [text, blank]})).json())

    libre, native = run(go())
    each = mt_translate(checkpoint, lines, tmp_path)
    expected = ["".join(out + brk for out, brk in zip(each, BREAKS + [""], strict=True)),
                f"{each[0]}\n\n{each[1]}\n"]
    assert libre["translatedText"] == expected == [t["text"] for t in native["translations"]]


def test_what_is_of_one_line_is_refused_or_said_for_a_text_translated_in_parts(app):
    long, broken = " ".join(sentences(30)), "der hund.\ndie katze."

    async def go():
        async with client(app) as c:
            refused = [await c.post("/v1/translate", json={"text": ["der hund", text]} | ask)
                       for text in (long, broken) for ask in ({"nbest": 2}, {"scores": True}, {"alignments": True})]
            attention = await c.post("/v1/attention", json={"text": long})
            libre = await c.post("/translate", json={"q": ["der hund", broken], "source": "de", "target": "en",
                                                     "alternatives": 2})
            return refused, attention, libre.json()

    refused, attention, libre = run(go())
    for answer in [*refused, attention]:
        assert answer.status_code == 413 and "translated whole" in answer.json()["error"], answer.json()
    assert "text 2 is more than one line" in refused[0].json()["error"]
    assert libre["alternatives"][1] == [] and libre["translatedText"][1].count("\n") == 1
    assert libre["warnings"] == ["text 2: no alternatives: it is translated in parts (its lines, or sentences), "
                                 "and they are of a whole line"]


def test_a_request_is_bounded_in_sentences_however_it_carries_them(app):
    """--max-sentences counts what the model is asked: HTML documents (each one text) and long lines carry many
    sentences each; past the limit, 413 before anything is queued."""
    def page(n: int, seed: int) -> str:
        return "<p>" + " ".join(sentences(n, seed)) + "</p>"

    async def go():
        async with client(app) as c:
            return {
                "html, under": await c.post("/translate", json={"q": [page(40, 2)], "source": "de", "target": "en",
                                                                "format": "html"}),
                "html, over": await c.post("/translate", json={"q": [page(40, 2), page(41, 3)], "source": "de",
                                                               "target": "en", "format": "html"}),
                "native html, over": await c.post("/v1/translate", json={"text": [page(81, 4)], "format": "html"}),
                "long lines, over": await c.post("/v1/translate", json={"text": [" ".join(sentences(45, 5))] * 2}),
            }

    answers = run(go())
    assert answers["html, under"].status_code == 200
    for case in ("html, over", "native html, over", "long lines, over"):
        assert answers[case].status_code == 413, case
        assert "the limit is 80 (--max-sentences)" in answers[case].json()["error"], case
    assert app.state.models["de-en"].batcher.stats.calls > 0


def test_search_width_and_glossary_work_are_bounded(app, monkeypatch):
    import mt.serve.parts

    crowded = {"hund": "dog", "katze": "cat", "baum": "tree"}  # three terms in one sentence; 2 may be placed

    async def go():
        async with client(app) as c:
            answers = {
                "beam": await c.post("/v1/translate", json={"text": ["der hund"], "beam": 9}),
                "nbest": await c.post("/v1/translate", json={"text": ["der hund"], "nbest": 9}),
                "crowded": await c.post("/v1/translate", json={"text": ["der hund katze baum"], "glossary": crowded}),
                "crowded, libre": await c.post("/translate", json={"q": "der hund katze baum", "source": "de",
                                                                   "target": "en", "glossary": crowded}),
                "crowded, replace": await c.post("/v1/translate", json={"text": ["der hund katze baum"],
                                                                        "glossary": crowded,
                                                                        "glossary_method": "replace"}),
            }
            monkeypatch.setattr(mt.serve.parts, "GLOSSARY_WORK", 3 * 100)  # 3 terms sought in 100 characters
            answers["work, under"] = await c.post("/v1/translate", json={"text": ["x" * 100], "glossary": crowded})
            answers["work, over"] = await c.post("/v1/translate", json={"text": ["x" * 101], "glossary": crowded})
            return answers

    answers = run(go())
    assert "beam 9: the limit is 8 (--max-beam)" in answers["beam"].json()["error"]
    assert "nbest 9: the limit is 8 (--max-beam)" in answers["nbest"].json()["error"]
    for case in ("crowded", "crowded, libre"):
        assert answers[case].status_code == 413, case
        assert "holds 3 of the glossary's terms; the limit is 2 a sentence (--max-sentence-terms)" in answers[
            case].json()["error"]
    assert answers["crowded, replace"].status_code == 200 == answers["work, under"].status_code
    assert answers["work, over"].status_code == 413 and "303 term-characters" in answers["work, over"].json()["error"]


def test_a_subtitle_or_page_that_starts_with_a_byte_order_mark_is_read_as_the_cli_reads_its_file(app):
    page = "<p>der hund sitzt.</p>"

    async def go():
        async with client(app) as c:
            return [(await c.post("/v1/translate", json={"text": [bom + SUBTITLES], "format": "srt"})).json()
                    for bom in ("", "\ufeff")] + [
                (await c.post("/translate", json={"q": bom + page, "source": "de", "target": "en",
                                                  "format": "html"})).json() for bom in ("", "\ufeff")]

    srt, srt_bom, html, html_bom = run(go())
    assert srt == srt_bom and "translations" in srt
    assert html == html_bom and "translatedText" in html


def test_a_part_the_model_cannot_take_whole_even_cut_is_a_warning_naming_its_text(tokenizer):
    """The one cut left: a part of a single character longer than the model takes (a model of 2 positions takes
    1 piece, and a line is cut down to words and single characters, and an unknown character is 2)."""
    from mt.config import Config

    model = tiny_model(vocab=tokenizer.vocab_size, max_len=2)
    loaded = Loaded(model, Config(model=model.cfg), tokenizer, tokenizer, {})
    names = ["text 1", "text 2"]
    parts = plan_texts(loaded, ["", "the cat ☃ on the mat ☃"], names)  # ☃: not in its vocabulary, 2 pieces
    warnings = check_parts(loaded, parts.parts, parts.owners, names, None, ServeOptions())
    counts = [len(ids) for ids in tokenizer.encode(parts.parts)]
    assert all(n <= 1 or len(part) == 1 for part, n in zip(parts.parts, counts, strict=True))  # cut as far as it goes
    assert warnings == [f"text 2: a part of {n} pieces was cut to the model's 1" for n in counts if n > 1]
    assert warnings
