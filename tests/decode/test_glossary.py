"""Glossaries: the file and its refusals, finding terms, both methods of placing them, the report of what was not
placed, and `mt translate --glossary` end to end (without a glossary, or with one no line uses, nothing changes)."""

import pytest
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.data.tokenizer import EOS
from mt.decode.constrained import holds
from mt.decode.glossary import Glossary, Term, apply, check_method, missed, placed, read_glossary
from mt.errors import MtError

from ..conftest import assert_refused, tiny_model
from ..test_checkpoint import state_for

LINES = ["the cat sat on the mat", "", "a big red dog runs under the tree", "the cats sat", "red cat, blue cat"]


@pytest.fixture
def model_path(tokenizer, tmp_path):
    model = tiny_model(vocab=tokenizer.vocab_size)
    checkpoint.save(state_for(model, tokenizer), tmp_path / "c.pt")
    return tmp_path / "c.pt"


def write(tmp_path, text: str, name: str = "terms.tsv"):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_a_glossary_file_has_comments_blank_lines_and_one_term_a_line(tmp_path):
    path = write(tmp_path, "# animals\n\ncat\tdog\n  mat \t rug\n\nred cat\tblue dog\ncat\tdog\n")
    glossary = read_glossary(path, "replace")
    assert glossary.terms == (Term("cat", "dog"), Term("mat", "rug"), Term("red cat", "blue dog"))
    assert glossary.method == "replace" and glossary == read_glossary(path, "replace")  # equal: batched together


@pytest.mark.parametrize("text, line, phrase", [
    ("cat\tdog\nmat rug\n", 2, "no tab"),
    ("cat\tdog\tbird\n", 1, "2 tabs"),
    ("# x\n\t dog\n", 2, "the source term is empty"),
    ("cat\t \n", 1, "the target term is empty"),
    ("cat\t...\n", 1, "holds no letter or digit"),
    ("cat\tdog\n\ncat\tbird\n", 3, "already given as 'dog' on line 1"),
])
def test_a_bad_line_is_refused_naming_the_file_the_line_and_the_fix(tmp_path, text, line, phrase):
    path = write(tmp_path, text)
    with pytest.raises(MtError) as refused:
        read_glossary(path)
    message = str(refused.value)
    assert message.startswith(f"{path}:{line}: ") and phrase in message and "\n" not in message


def test_an_empty_or_unreadable_glossary_is_refused(tmp_path):
    with pytest.raises(MtError, match="no terms in it"):
        read_glossary(write(tmp_path, "# nothing\n\n"))
    with pytest.raises(MtError, match="no such file"):
        read_glossary(tmp_path / "missing.tsv")
    (tmp_path / "latin1.tsv").write_bytes(b"cat\tdog\nK\xe4se\tcheese\n")
    with pytest.raises(MtError, match="latin1.tsv:2"):
        read_glossary(tmp_path / "latin1.tsv")


def test_terms_are_found_as_whole_words_longest_first_and_replaced():
    glossary = Glossary((Term("cat", "dog"), Term("red cat", "blue dog"), Term("mat", "rug")), "replace")
    assert glossary.find("the cats sat on the format") == []  # inside longer words: not the term
    assert glossary.find("red cat, blue cat") == [Term("red cat", "blue dog"), Term("cat", "dog")]
    assert glossary.find("Cat") == []  # case counts
    assert glossary.replaced("red cat, blue cat on a mat") == "blue dog, blue dog on a rug"
    assert placed("blue dog", "a blue dog.") and not placed("dog", "two dogs") and not placed("dog", "hotdog")
    assert missed(glossary, "the cat on the mat", "the dog on the mat") == [Term("mat", "rug")]


def test_each_method_prepares_the_lines_as_it_needs_them(tokenizer):
    terms = (Term("cat", "dog"), Term("mat", "big tree"))
    constrained = apply(Glossary(terms, "constrain"), LINES, tokenizer)
    assert constrained.lines == LINES and constrained.terms[0] == list(terms) and constrained.terms[1] == []
    assert constrained.constraints.phrases[0] == tokenizer.encode(["dog", "big tree"])
    glued = constrained.constraints.glued  # what may not follow a term: pieces that continue a word
    assert constrained.constraints.phrases[3] == [] and glued and tokenizer.sp.piece_to_id("▁dog") not in glued
    assert all(tokenizer.sp.id_to_piece(i)[0].isalnum() for i in glued)
    replaced = apply(Glossary(terms, "replace"), LINES, tokenizer)
    assert replaced.lines[0] == "the dog sat on the big tree" and replaced.constraints is None
    for nothing in (None, Glossary((Term("bird", "fish"),))):  # no glossary, or no line with a term: as they are
        same = apply(nothing, LINES, tokenizer)
        assert same.lines == LINES and same.constraints is None and same.missed(0, "") == []


def test_constrain_is_refused_for_a_ctranslate2_export_and_replace_is_not():
    assert check_method("replace", exported=True) == "replace"
    with pytest.raises(MtError, match="CTranslate2 export cannot constrain.*--glossary-method replace"):
        check_method("constrain", exported=True)


def translate(model_path, tmp_path, *args: str):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return CliRunner().invoke(app, ["translate", "-c", str(model_path), "-i", str(source), "--beam", "2", *args])


def test_without_a_glossary_or_with_one_no_line_uses_the_output_is_unchanged(model_path, tmp_path):
    plain = translate(model_path, tmp_path)
    unused = translate(model_path, tmp_path, "--glossary", str(write(tmp_path, "bird\tfish\n")))
    assert plain.exit_code == 0 and unused.exit_code == 0
    assert unused.stdout == plain.stdout and unused.stderr == plain.stderr == ""


def test_translate_places_the_terms_or_warns_per_line(model_path, tmp_path):
    terms = write(tmp_path, "cat\tdog\nmat\tred\n")
    for method in ("constrain", "replace"):
        result = translate(model_path, tmp_path, "--glossary", str(terms), "--glossary-method", method)
        assert result.exit_code == 0, result.output
        out = result.stdout.splitlines()
        warned = {int(line.split()[2].rstrip(":")) for line in result.stderr.splitlines()}
        assert all(line.startswith("warning: line ") for line in result.stderr.splitlines())
        for i, (line, text) in enumerate(zip(LINES, out, strict=True), 1):
            wanted = [t for src, t in (("cat", "dog"), ("mat", "red")) if src in line.split()]
            assert (i in warned) == (not all(placed(t, text) for t in wanted)), (method, i, text, result.stderr)
    # A term that cannot fit the output's length limit cannot be placed: the line is named, with the term.
    long = write(tmp_path, "cat\t" + " ".join(["dog"] * 60) + "\n", "long.tsv")
    result = translate(model_path, tmp_path, "--glossary", str(long))
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == len(LINES)
    assert result.stderr.splitlines()[0].startswith("warning: line 1: glossary term not in the translation: cat → "
                                                    "dog dog")
    assert {line.split()[2] for line in result.stderr.splitlines()} == {"1:", "5:"}


def test_constrained_translation_holds_the_term_pieces(loaded):
    from mt.decode.search import SearchOptions
    from mt.decode.translate import translate_lines

    opts = SearchOptions(beam=3, len_penalty=0.6, max_len_a=1.0, max_len_b=4, batch_tokens=256)
    glossary = Glossary((Term("cat", "dog"), Term("tree", "big red mat")))
    hyps = translate_lines(loaded, LINES, opts, torch.device("cpu"), glossary=glossary)
    for line, h in zip(LINES, hyps, strict=True):
        want = [loaded.tgt_tok.encode([t.target])[0] for t in glossary.find(line)]
        assert not h or (EOS not in h[0].tokens and holds(h[0].tokens, want))


def test_bad_glossaries_and_methods_are_refused_in_one_line_before_the_model_loads(tmp_path):
    missing = tmp_path / "no-such.pt"  # never loaded: the glossary is read first
    runner = CliRunner()
    assert_refused(runner.invoke(app, ["translate", "-c", str(missing), "--glossary",
                                       str(write(tmp_path, "cat dog\n"))]), "terms.tsv:1: no tab")
    assert_refused(runner.invoke(app, ["translate", "-c", str(missing), "--glossary-method", "replace"]),
                   "--glossary-method", "give --glossary FILE too")
    assert_refused(runner.invoke(app, ["translate", "-c", str(missing), "--glossary", str(write(tmp_path, "a\tb\n")),
                                       "--glossary-method", "guess"]), "--glossary-method")


def test_a_document_takes_a_glossary_and_names_each_sentence_that_misses_a_term(model_path, tmp_path):
    pytest.importorskip("sentencex")
    page = tmp_path / "page.txt"
    page.write_text("The cat sat on the mat. A big red dog runs under the tree.\n\nThe cats sat.\n", encoding="utf-8")
    terms = write(tmp_path, "cat\tdog\n")
    result = CliRunner().invoke(app, ["translate", "-c", str(model_path), "-i", str(page), "--format", "text",
                                      "--glossary", str(terms), "--beam", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n\n") == 1  # the two paragraphs, each translated in its place
    first = result.stdout.split("\n\n")[0]
    assert placed("dog", first) or "warning: sentence 1: glossary term not in the translation: cat → dog" \
        in result.stderr
    assert all(line.startswith("warning: sentence ") for line in result.stderr.splitlines())
