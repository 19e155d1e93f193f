"""Documents in, documents out (mt/documents/): paragraphs and subtitles cut into sentences and put back
together, nothing dropped; and `mt translate --format` around them, end to end on a tiny model."""

import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

pytest.importorskip("sentencex")

from mt import checkpoint  # noqa: E402
from mt.cli import app  # noqa: E402
from mt.decode.translate import plan_documents, source_limit  # noqa: E402
from mt.documents.formats import read_document  # noqa: E402
from mt.documents.sentences import finish, fit, plan  # noqa: E402
from mt.errors import MtError  # noqa: E402

from ..conftest import assert_refused, tiny_model  # noqa: E402
from ..test_checkpoint import state_for  # noqa: E402


def words(texts: list[str]) -> list[int]:
    """A stand-in for the tokenizer: a piece a word."""
    return [len(text.split()) for text in texts]


def translated(fmt: str, text: str, translate=str.upper, limit: int = 100) -> tuple[str, list[str]]:
    """`text` as a document of `fmt`, each part translated by `translate`: the output, and the parts."""
    todo = plan([read_document(fmt, text.split("\n"), "doc")], "en", words, limit)
    return finish(todo, [translate(part) for part in todo.parts])[0], todo.parts


def test_paragraphs_keep_their_blank_lines_and_the_whitespace_between_sentences():
    text = "  The cat sat. The dog\nran away.\nA bird sang!\n\n\n  \n42 - 7\n\nLast one?"
    out, parts = translated("text", text)
    assert parts == ["The cat sat.", "The dog ran away.", "A bird sang!", "Last one?"]  # soft wraps: spaces
    # A line break between sentences stays, one inside a sentence does not; blank lines and a paragraph without
    # a letter stay as they are.
    assert out == "  THE CAT SAT. THE DOG RAN AWAY.\nA BIRD SANG!\n\n\n  \n42 - 7\n\nLAST ONE?"


def test_a_part_translated_to_nothing_keeps_its_source_and_a_warning_says_so(capsys):
    out, _ = translated("text", "One sentence. Another one.", translate=lambda part: "" if "One" in part else "x")
    assert out == "One sentence. x"
    assert capsys.readouterr().err == ("warning: sentence 1: the model translated it to nothing; it is kept "
                                       "untranslated: 'One sentence.'\n")


def test_a_long_sentence_is_cut_at_punctuation_then_at_spaces_and_nothing_is_lost(capsys):
    sentence = "one two three four five six seven, eight nine ten eleven twelve; thirteen fourteen"
    out, parts = translated("text", f"{sentence}. Short one.", limit=4)
    assert len(parts) == 6 and out.split() == f"{sentence}. Short one.".upper().split()
    assert capsys.readouterr().err == ("warning: sentence 1: 14 pieces, more than the model takes (4): translated in "
                                       "5 parts, cut at punctuation or spaces: 'one two three four five six seven, "
                                       "eight nine ten eleven twe'\n")
    assert fit(sentence, 4, words) == ["one two three four", "five six seven,", "eight nine ten",
                                       "eleven twelve;", "thirteen fourteen"]
    assert fit("abcdefghij", 3, lambda texts: [len(t) for t in texts]) == ["ab", "cde", "fg", "hij"]  # no space



def test_a_missing_stop_is_seen_where_the_document_starts_sentences_with_the_next_word():
    text = ("Ein Mann schläft. Ein Hund sieht ein Kind. Ein Kind rennt. Anna singt. Anna lacht. Anna tanzt.\n\n"
            "Zwei Männer in einer Stadt Ein Mann hebt die Hand. Ein Vogel singt, Ein Lied. Frau Anna liest.")
    _, parts = translated("text", text)
    # "Ein" starts four sentences, stands capitalized inside two and is written "ein" inside one: a caption
    # without its stop ends before it; not after a comma, and never before a name, which is never in lower case.
    assert parts == ["Ein Mann schläft.", "Ein Hund sieht ein Kind.", "Ein Kind rennt.", "Anna singt.",
                     "Anna lacht.", "Anna tanzt.", "Zwei Männer in einer Stadt", "Ein Mann hebt die Hand.",
                     "Ein Vogel singt, Ein Lied.", "Frau Anna liest."]
    _, parts = translated("text", text.replace("Ein Kind rennt.", "Der Kind rennt."))
    # Three starts against two capitalized uses inside are not evidence enough.
    assert "Zwei Männer in einer Stadt Ein Mann hebt die Hand." in parts

SENTENCE = st.builds(lambda ws, end: " ".join(ws) + end,
                     st.lists(st.sampled_from("the cat dog sat ran on a big mat 3 e.g. über Straße".split()),
                              min_size=1, max_size=12),
                     st.sampled_from([".", "!", "?", "", ".\u00a0"]))
PARAGRAPH = st.builds(lambda sentences, seps: "".join(s + sep for s, sep in zip(sentences, seps, strict=False)).strip(),
                      st.lists(SENTENCE, min_size=1, max_size=6),
                      st.lists(st.sampled_from([" ", "  ", "\n", " \n"]), min_size=6, max_size=6))
TEXT = st.builds(lambda paragraphs, gaps: "".join(p + gap for p, gap in zip(paragraphs, gaps, strict=False)),
                 st.lists(PARAGRAPH, min_size=1, max_size=4),
                 st.lists(st.sampled_from(["\n\n", "\n \n", "\n\n\n"]), min_size=4, max_size=4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT, limit=st.integers(2, 6))
def test_every_sentence_is_translated_once_in_order_and_within_the_limit(text, limit):
    out, parts = translated("text", text, translate=lambda part: f"<{part.upper()}>", limit=limit)
    assert all(n <= limit for n in words(parts))
    # Each part was translated once (one <...> each), none is empty, and together, in order, they are the whole
    # text: nothing dropped, nothing repeated.
    assert out.count("<") == len(parts) and all(part.strip() for part in parts)
    assert out.replace("<", "").replace(">", "").split() == text.upper().split()
    # A model that translates everything to nothing loses nothing either.
    out, _ = translated("text", text, translate=lambda part: "", limit=limit)
    assert out.split() == text.split()


SRT = """1
00:00:01,000 --> 00:00:02,500
<i>Hello there. How are
you?</i>

2
00:00:03,000 --> 00:00:04,000 X1:10 X2:20
- Hi.
- Bye.

3
00:00:05,000 --> 00:00:06,000
{\\an8}♪ ♪
"""


def test_subtitles_keep_numbers_timings_markup_and_their_number_of_lines():
    out, parts = translated("srt", SRT)
    assert parts == ["Hello there.", "How are you?", "Hi.", "Bye."]  # a speaker's dash stays on its line
    assert out == ("1\n00:00:01,000 --> 00:00:02,500\n<i>HELLO THERE.\nHOW ARE YOU?</i>\n\n"
                   "2\n00:00:03,000 --> 00:00:04,000 X1:10 X2:20\n- HI.\n- BYE.\n\n"
                   "3\n00:00:05,000 --> 00:00:06,000\n{\\an8}♪ ♪\n")


@pytest.mark.parametrize("broken, line, phrase", [
    (SRT.replace("00:00:03,000 -->", "00:00:03,000 ->"), 7, "a broken timing line"),
    (SRT.replace("1\n", "eins\n", 1), 1, "expected a cue"),  # text before the first cue
    (SRT.rstrip("\n").rsplit("\n", 2)[0], 12, "the end of the file"),
])
def test_a_broken_subtitle_file_is_refused_naming_the_line(broken, line, phrase):
    with pytest.raises(MtError, match=rf"^subs.srt:{line}: .*{phrase}"):
        read_document("srt", broken.split("\n"), "subs.srt")


def test_without_the_splitter_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencex", None)  # import fails
    with pytest.raises(MtError, match=r"sentencex, which is not installed: pip install 'mt\[documents\]'"):
        read_document("text", ["Hello."], "doc")


def test_no_part_is_longer_than_the_model_takes(loaded):
    long = " ".join(["the big cat sat on a red mat,"] * 30) + " and then ran."
    todo = plan_documents(loaded, [read_document("text", [long, "", "a dog."], "doc")])
    pieces = [len(ids) for ids in loaded.src_tok.encode(todo.parts)]
    assert len(todo.parts) > 2 and max(pieces) <= source_limit(loaded)
    assert " ".join(todo.parts).split() == (long + " a dog.").split()


@pytest.fixture
def model_path(tokenizer, tmp_path):
    model = tiny_model(vocab=tokenizer.vocab_size)
    checkpoint.save(state_for(model, tokenizer), tmp_path / "c.pt")
    return tmp_path / "c.pt"


def mt_translate(*args: str):
    return CliRunner().invoke(app, ["translate", *map(str, args)])


def test_translate_format_srt_and_html_end_to_end(model_path, tmp_path):
    (tmp_path / "in.srt").write_text(SRT, encoding="utf-8")
    result = mt_translate("-c", model_path, "-i", tmp_path / "in.srt", "-o", tmp_path / "out.srt", "--format", "srt",
                          "--beam", "1")
    assert result.exit_code == 0, result.output
    out = (tmp_path / "out.srt").read_text(encoding="utf-8").split("\n")
    source = SRT.split("\n")
    assert [out[i] for i in (0, 1, 5, 6, 10, 11, 12)] == [source[i] for i in (0, 1, 5, 6, 10, 11, 12)]
    assert out[2].startswith("<i>") and out[3].endswith("</i>") and len(out) == len(source)

    page = '<p class="x">The cat <b>sat</b>. A dog ran.</p><script>if (a < b) go()</script>\n<pre>the cat</pre>'
    (tmp_path / "in.html").write_text(page, encoding="utf-8")
    result = mt_translate("-c", model_path, "-i", tmp_path / "in.html", "--format", "html", "--beam", "1")
    assert result.exit_code == 0, result.output
    # Whatever the untrained model says, in its sentence's place or the source where it says nothing:
    assert result.stdout.startswith('<p class="x">') and result.stdout.count("<b>") == result.stdout.count("</b>") == 1
    assert result.stdout.endswith('</p><script>if (a < b) go()</script>\n<pre>the cat</pre>\n')


def test_bad_documents_are_refused_in_one_line_and_nothing_is_written(model_path, tmp_path):
    out = tmp_path / "out.srt"
    (tmp_path / "bad.srt").write_text("1\n00:00:01,000 -> 00:00:02,000\nHello.\n", encoding="utf-8")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "bad.srt", "-o", out, "--format", "srt"),
                   f"{tmp_path / 'bad.srt'}:2: a broken timing line")
    (tmp_path / "bad.txt").write_bytes(b"Hello.\n\nA caf\xe9.\n")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "bad.txt", "-o", out, "--format", "text"),
                   f"{tmp_path / 'bad.txt'}:3: invalid UTF-8")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "bad.txt", "--format", "text", "--nbest", "2"),
                   "--format text", "drop --format")
    assert not out.exists() and list(tmp_path.glob(".out*")) == []


def test_translate_format_docx_end_to_end_and_a_bad_file_leaves_nothing(model_path, tmp_path):
    docx = pytest.importorskip("docx")
    source = docx.Document()
    p = source.add_paragraph("The ")
    p.add_run("cat").bold = True  # a span of its own too, translated in the same search as the sentences
    p.add_run(" sat. A dog ran.")
    source.add_table(rows=1, cols=2).cell(0, 1).text = "The big cat."
    source.save(tmp_path / "in.docx")
    result = mt_translate("-c", model_path, "-i", tmp_path / "in.docx", "-o", tmp_path / "out.docx",
                          "--format", "docx", "--beam", "1")
    assert result.exit_code == 0, result.output
    out = docx.Document(tmp_path / "out.docx")  # Word's own reader opens what mt wrote
    assert len(out.paragraphs) == 1 and [len(row.cells) for row in out.tables[0].rows] == [2]
    [bold] = [run for run in out.paragraphs[0].runs if run.bold]  # kept on a word, whatever the model wrote
    assert bold.text.strip() or not any(c.isalnum() for c in out.paragraphs[0].text)
    (tmp_path / "bad.docx").write_bytes(b"PK\x03\x04 not really a zip")
    assert_refused(mt_translate("-c", model_path, "-i", tmp_path / "bad.docx", "-o", tmp_path / "bad.out.docx",
                                "--format", "docx"), f"{tmp_path / 'bad.docx'}: not a Word document")
    assert not (tmp_path / "bad.out.docx").exists() and list(tmp_path.glob(".bad*")) == []
