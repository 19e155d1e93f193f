"""Documents as real tools write them: SubRip as Subtitle Edit and ffmpeg write and read it (pysubs2, a subtitle
library, reads what mt wrote), HTML's optional end tags closed where browsers close them (html5lib, the HTML
standard's tree builder, says where), byte-order marks, CRLF and minified pages; generated files of every shape
round-trip with nothing dropped."""

import asyncio
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("sentencex")
html5lib = pytest.importorskip("html5lib")
pysubs2 = pytest.importorskip("pysubs2")

from mt.decode.translate import document_lines  # noqa: E402
from mt.documents.formats import read_document  # noqa: E402
from mt.errors import MtError  # noqa: E402

from ..conftest import assert_refused  # noqa: E402
from .test_documents import model_path as tiny_checkpoint  # noqa: E402
from .test_documents import mt_translate, translated  # noqa: E402

model_path = tiny_checkpoint  # the fixture: an untrained tiny model, saved

# As Subtitle Edit saves it (a BOM, CRLF, italics line by line, {\an8}, coordinates), then as tools leave it: a cue
# run into the next without a blank line, one without text, numbers out of order or missing, "." in a timing, two
# blank lines, no line end after the last cue.
SUBTITLES = ("\ufeff1\r\n00:00:01,000 --> 00:00:02,500\r\n<i>Hello there.</i>\r\n<i>How are you?</i>\r\n\r\n"
             "2\r\n00:00:03,000 --> 00:00:04,000 X1:100 X2:200 Y1:10 Y2:20\r\n{\\an8}Look up.\r\n"
             "7\r\n00:00:05.000 --> 00:00:06.000\r\n<font color=\"#ffff00\">A yellow line.</font>\r\n\r\n\r\n"
             "4\r\n00:00:07,000 --> 00:00:08,000\r\n\r\n"
             "00:00:09,000 --> 00:00:10,000\r\nNo number here.\r\n\r\nA second paragraph.")
EXPECTED = ("\ufeff1\n00:00:01,000 --> 00:00:02,500\n<i>HELLO THERE.</i>\n<i>HOW ARE YOU?</i>\n\n"
            "2\n00:00:03,000 --> 00:00:04,000 X1:100 X2:200 Y1:10 Y2:20\n{\\an8}LOOK UP.\n"
            "7\n00:00:05.000 --> 00:00:06.000\n<font color=\"#ffff00\">A YELLOW LINE.</font>\n\n\n"
            "4\n00:00:07,000 --> 00:00:08,000\n\n"
            "00:00:09,000 --> 00:00:10,000\nNO NUMBER HERE.\n\nA SECOND PARAGRAPH.")


def cues(text: str) -> list[tuple[int, int, list[str]]]:
    """Each cue as pysubs2 reads it: start, end (ms) and the words of its text, markup left out."""
    return [(e.start, e.end, e.plaintext.split()) for e in pysubs2.SSAFile.from_string(text, format_="srt")]


def test_subtitles_as_tools_write_them_keep_every_cue_and_translate_every_text():
    lines = document_lines(SUBTITLES.encode(), "strict", "film.srt")  # as mt translate reads the file
    out, parts = translated("srt", "\n".join(lines))
    assert parts == ["Hello there.", "How are you?", "Look up.", "A yellow line.", "No number here.",
                     "A second paragraph."]  # not one number or timing among them
    assert out == EXPECTED
    # mt serve is given the text: its lines split as the server splits them, the BOM still there
    assert translated("srt", SUBTITLES.replace("\r\n", "\n"))[0] == EXPECTED
    # pysubs2 reads the same cues from both, the translation's words those of the source, translated
    assert cues(out) == [(start, end, [w.upper() for w in words]) for start, end, words in cues(SUBTITLES)]
    assert len(cues(out)) == 5


@pytest.mark.parametrize("broken, line, phrase", [
    ("1\n00:00:01,000 --> 00:00:02,000\nHi.\n2\n00:00:03,000 -> 00:00:04,000\nBye.", 5, "a broken timing line"),
    ("1\n00:00:01,000 --> 00:00:02,000\nHi.\n\n2\n00:00:03 --> 00:00:04\nBye.", 6, "a broken timing line"),
    ("Subtitles by someone\n\n1\n00:00:01,000 --> 00:00:02,000\nHi.", 1, "expected a cue"),
    ("Just some text.\nNot subtitles.", 1, "is this SubRip"),
])
def test_what_is_not_subrip_is_still_refused_naming_the_line(broken, line, phrase):
    with pytest.raises(MtError, match=rf"^subs.srt:{line}: .*{phrase}"):
        read_document("srt", broken.split("\n"), "subs.srt")


WORD = st.sampled_from("the cat dog sat ran on a big red mat over there".split())
LINE_TEXT = st.builds(lambda ws, end: " ".join(ws) + end, st.lists(WORD, min_size=1, max_size=5),
                      st.sampled_from([".", "!", "?", ",", ""]))
LEAD = st.sampled_from(["", "", "<i>", "{\\an8}", "<font color=\"red\">", "- ", "{\\an8}<i>"])
TRAIL = st.sampled_from(["", "", "</i>", "</font>"])
TIMESTAMP = st.builds(lambda h, m, s, ms, sep: f"{h:02}:{m:02}:{s:02}{sep}{ms:03}", st.integers(0, 9),
                      st.integers(0, 59), st.integers(0, 59), st.integers(0, 999), st.sampled_from([",", "."]))
POSITION = st.sampled_from(["", "", " X1:40 X2:600 Y1:20 Y2:50"])


@st.composite
def subtitle_file(draw) -> tuple[str, list[dict]]:
    """An SRT file of random shape, and its cues: number (or none), timing, text lines (lead, text, trail)."""
    out, cues = [], []
    for _ in range(draw(st.integers(1, 6))):
        number = draw(st.one_of(st.none(), st.integers(0, 99999)))
        timing = f"{draw(TIMESTAMP)} --> {draw(TIMESTAMP)}{draw(POSITION)}"
        blocks = draw(st.lists(st.lists(st.tuples(LEAD, LINE_TEXT, TRAIL), min_size=1, max_size=3), max_size=2))
        cues.append(dict(number=number, timing=timing, blocks=blocks))
        out += ([str(number)] if number is not None else []) + [timing]
        for i, block in enumerate(blocks):
            out += [""] * (i > 0) + ["".join(line) for line in block]
        out += [""] * draw(st.sampled_from([0, 1, 1, 2, 3]))  # 0: the next cue follows at once
    bom = draw(st.sampled_from(["", "\ufeff"]))
    end = draw(st.sampled_from(["\n", "\r\n"]))
    text = bom + end.join(out)
    return (text + end if draw(st.booleans()) else text), cues


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subtitle_file())
def test_any_subtitle_file_keeps_its_numbers_and_timings_and_has_every_text_translated(shape):
    source, expected = shape
    lines = document_lines(source.encode(), "strict", "film.srt")
    out, _ = translated("srt", "\n".join(lines))
    assert out.startswith("\ufeff") == source.startswith("\ufeff")
    got, at = out.removeprefix("\ufeff").split("\n"), 0
    for cue in expected:  # line by line: what the generator wrote, the text of each line translated
        if cue["number"] is not None:
            assert got[at] == str(cue["number"])
            at += 1
        assert got[at] == cue["timing"]
        at += 1
        for i, block in enumerate(cue["blocks"]):
            if i:
                assert got[at] == ""
                at += 1
            lines = got[at:at + len(block)]
            at += len(block)
            # each line's markup where it was; the words of the block all there, in order, translated
            assert [(line.startswith(lead), line.endswith(trail)) for line, (lead, _, trail) in
                    zip(lines, block, strict=True)] == [(True, True)] * len(block)
            text = [line[len(lead):len(line) - len(trail)] for line, (lead, _, trail) in zip(lines, block, strict=True)]
            assert " ".join(text).split() == " ".join(words for _, words, _ in block).upper().split()
        while at < len(got) and got[at] == "":
            at += 1
    assert at == len(got)
    # and a subtitle library reads the cues mt wrote as it reads the source's
    assert cues(out) == [(start, end, [w.upper() for w in words]) for start, end, words in cues(source)]


def test_a_long_line_of_markup_is_read_in_linear_time():
    line = "<i>" * 200_000 + "Hello there." + "</i>" * 200_000  # 1.4 MB on one line
    out, parts = translated("srt", f"1\n00:00:01,000 --> 00:00:02,000\n{line}\n")
    assert parts == ["Hello there."] and out == f"1\n00:00:01,000 --> 00:00:02,000\n{line.upper()}\n".replace(
        "<I>", "<i>").replace("</I>", "</i>")


# HTML: optional end tags (HTML Living Standard, 13.1.2.4) under translate="no" and class="notranslate"


def html_texts(page: str) -> list[tuple[str, bool]]:
    """Each text of `page` as a browser builds it (html5lib: the standard's tree builder), and whether it is in
    an element left untranslated (translate="no", class notranslate, <code>)."""
    out = []

    def walk(node, kept: bool) -> None:
        kept = kept or node.get("translate") == "no" or "notranslate" in (node.get("class") or "").split() \
            or node.tag.endswith("}code")
        if node.text and node.text.strip():
            out.append((node.text, kept))
        for child in node:
            walk(child, kept)
            if child.tail and child.tail.strip():
                out.append((child.tail, kept))
    walk(html5lib.parse(page), False)
    return out


INLINE_TAG = re.compile(r"</?(b|span)\b")  # those the pages below have inside sentences


def tags(page: str) -> list[str]:
    return re.findall(r"<[^<>]*>", page)


def assert_translated_as_a_browser_reads_it(page: str) -> None:
    out, _ = translated("html", page)
    # every tag, byte for byte; in order, but for the inline tags inside a sentence, which move to its edges
    assert sorted(tags(out)) == sorted(tags(page))
    assert [t for t in tags(out) if not INLINE_TAG.match(t)] == [t for t in tags(page) if not INLINE_TAG.match(t)]
    # word by word (an inline tag inside a sentence moves to its edge): what is kept as it was, the rest translated
    words = [(word, kept) for text, kept in html_texts(page) for word in text.split()]
    assert [(word, kept) for text, kept in html_texts(out) for word in text.split()] == [
        (word if kept else word.upper(), kept) for word, kept in words]


@pytest.mark.parametrize("page", [
    '<ul><li translate="no">keep me.<li>translate me.</ul><p>and me.',
    '<ol><li class="x notranslate">keep me.<ol><li>keep me too.</ol>keep me three.<li>translate me.</ol>',
    '<p translate="no">keep me.<p>translate me.<div>and me.</div>',
    '<p class="notranslate">keep me.<ul><li>translate me.</ul><h2>and me.</h2>',
    '<p translate="no">keep me.<hr>translate me.',
    '<dl><dt translate="no">keep me.<dd>translate me.<dt>and me.</dl>',
    '<table><tr><td translate="no">keep me.<td>translate me.<tr><td>and me.</table><p>and me too.',
    '<table><tbody translate="no"><tr><td>keep me.<tbody><tr><td>translate me.</table>',
    '<select><option translate="no">keep me.<option>translate me.</select> and me.',
    '<div><p translate="no">keep me.</div><p>translate me.',
    '<p><span translate="no">keep <b>me</b>.</span> translate me. <code>keep code.</code> and me.</p>',
])
def test_an_element_left_open_under_translate_no_ends_where_the_html_standard_ends_it(page):
    assert_translated_as_a_browser_reads_it("<!DOCTYPE html>" + page)


ATTRS = st.sampled_from(["", "", ' class="x"', ' translate="no"', ' class="a notranslate"'])
SENTENCE = st.builds(lambda ws: " ".join(ws) + ".", st.lists(WORD, min_size=1, max_size=4))


@st.composite
def phrase(draw) -> str:
    """Sentences, some wrapped whole in an inline element (kept, or bold, or code)."""
    out = []
    for sentence in draw(st.lists(SENTENCE, min_size=1, max_size=3)):
        wrap = draw(st.sampled_from(["", "", "b", "span translate=\"no\"", "code", "span"]))
        out.append(f"<{wrap}>{sentence}</{wrap.split()[0]}>" if wrap else sentence)
    return " ".join(out)


def end(draw, tag: str) -> str:
    return draw(st.sampled_from(["", f"</{tag}>"]))  # an optional end tag, left out or not


@st.composite
def block(draw, depth: int = 0) -> str:
    """A block of HTML whose optional end tags are left out at random, with elements left untranslated."""
    kind = draw(st.sampled_from(["p", "p", "list", "dl", "table", "select", "hr", "h2"]
                                + ["div"] * (depth < 2) + ["list"] * (depth < 2)))
    if kind == "p":
        return f"<p{draw(ATTRS)}>{draw(phrase())}{end(draw, 'p')}"
    if kind in ("h2", "div"):
        inside = draw(phrase()) if kind == "h2" else "".join(draw(st.lists(block(depth + 1), min_size=1, max_size=3)))
        return f"<{kind}{draw(ATTRS)}>{inside}</{kind}>"
    if kind == "hr":
        return "<hr>"
    if kind == "list":
        tag = draw(st.sampled_from(["ul", "ol"]))
        items = [f"<li{draw(ATTRS)}>{draw(phrase())}"
                 + (draw(block(depth + 1)) if depth < 2 and draw(st.booleans()) else "") + end(draw, "li")
                 for _ in range(draw(st.integers(1, 3)))]
        return f"<{tag}{draw(ATTRS)}>{''.join(items)}</{tag}>"
    if kind == "dl":
        items = [f"<{t}{draw(ATTRS)}>{draw(phrase())}{end(draw, t)}"
                 for t in draw(st.lists(st.sampled_from(["dt", "dd"]), min_size=1, max_size=4))]
        return f"<dl{draw(ATTRS)}>{''.join(items)}</dl>"
    if kind == "select":
        options = [f"<option{draw(ATTRS)}>{draw(SENTENCE)}{end(draw, 'option')}"
                   for _ in range(draw(st.integers(1, 3)))]
        return f"<select{draw(ATTRS)}>{''.join(options)}</select>"
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        cells = [f"<{t}{draw(ATTRS)}>{draw(phrase())}{end(draw, t)}"
                 for t in draw(st.lists(st.sampled_from(["td", "th"]), min_size=1, max_size=3))]
        rows.append(f"<tr{draw(ATTRS)}>{''.join(cells)}{end(draw, 'tr')}")
    body = draw(st.sampled_from(["", "<tbody>", '<tbody translate="no">']))
    return f"<table{draw(ATTRS)}>{body}{''.join(rows)}{end(draw, 'tbody') if body else ''}</table>"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(block(), min_size=1, max_size=5), st.sampled_from(["", "\n"]))
def test_any_page_keeps_its_tags_and_what_is_not_to_be_translated_and_translates_all_after_it(blocks, gap):
    assert_translated_as_a_browser_reads_it("<!DOCTYPE html><html><body>" + gap.join(blocks) + "</body></html>")


def test_a_deep_page_is_read_in_linear_time():
    page = "<div>" * 20_000 + "<li><table>" + "<span>" * 20_000 + "</li>" * 20_000 + "<p>Hello there."
    out, parts = translated("html", page)
    assert parts == ["Hello there."] and out == page.replace("Hello there.", "HELLO THERE.")


def test_mt_serve_reads_subtitles_as_mt_translate_does_bom_and_all(model_path, tmp_path):
    pytest.importorskip("fastapi")
    from mt.options import ServeOptions
    from mt.serve.app import create_app, load_models

    opts = ServeOptions()
    app = create_app(load_models([model_path], [], opts), opts)

    async def post():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://mt") as client:
            return await client.post("/v1/translate", json={"text": [SUBTITLES], "format": "srt", "beam": 1})
    answer = asyncio.run(post())
    assert answer.status_code == 200, answer.text
    (tmp_path / "in.srt").write_bytes(SUBTITLES.encode())
    result = mt_translate("-c", model_path, "-i", tmp_path / "in.srt", "-o", tmp_path / "out.srt", "--format", "srt",
                          "--beam", "1")
    assert result.exit_code == 0, result.output
    out = (tmp_path / "out.srt").read_text(encoding="utf-8")
    # a file keeps its byte-order mark; a JSON string carries none (mt serve drops it, tests/serve/test_parts.py)
    assert "\ufeff" + answer.json()["translations"][0]["text"] + "\n" == out and out.startswith("\ufeff1\n")
    assert [(start, end) for start, end, _ in cues(out)] == [(start, end) for start, end, _ in cues(SUBTITLES)]


@pytest.mark.parametrize("unended", ["<a " * 20_000, "<!--x>" * 20_000, "<a '" * 20_000])
def test_what_never_ends_is_kept_to_the_end_as_browsers_read_it_and_in_linear_time(unended):
    # html.parser's close() reads each of these in time quadratic in their length (minutes for these 60-120 kB)
    out, parts = translated("html", "<p>The cat sat. " + unended)
    assert parts == ["The cat sat."] and out == "<p>THE CAT SAT. " + unended


# Reading: a document is bounded by its size, not by the line limit of one-sentence-a-line files


def test_a_minified_page_over_the_line_limit_is_translated_and_its_bom_kept(model_path, tmp_path):
    script = "var a = [" + ",".join(["1"] * 700_000) + "];"  # 1.4 MB on the page's one line
    page = f"\ufeff<!DOCTYPE html><html><head><script>{script}</script></head><body><p>the cat sat.</p></body></html>"
    (tmp_path / "min.html").write_text(page, encoding="utf-8")
    result = mt_translate("-c", model_path, "-i", tmp_path / "min.html", "-o", tmp_path / "out.html", "--format",
                          "html", "--beam", "1")
    assert result.exit_code == 0, result.output
    out = (tmp_path / "out.html").read_text(encoding="utf-8")
    assert out.startswith("\ufeff<!DOCTYPE html>") and f"<script>{script}</script>" in out and out.count("\n") == 1


def test_a_document_larger_than_documents_may_be_is_refused_before_it_is_read_whole(model_path, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr("mt.decode.translate.MAX_FILE_BYTES", 1000)
    (tmp_path / "big.txt").write_text("The cat sat.\n" * 100, encoding="utf-8")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "big.txt", "-o", tmp_path / "out.txt",
                                "--format", "text"), "big.txt: more than the 1,000 bytes a document may have")
    assert not (tmp_path / "out.txt").exists()
