import io
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib.image import imread
from typer.testing import CliRunner

import mt.decode.translate
from mt import checkpoint
from mt.cli import app
from mt.data.tokenizer import EOS, PAD
from mt.decode.search import SearchOptions, translate_ids
from mt.decode.translate import (
    PROMPT,
    Attention,
    TranslateRequest,
    interactive,
    run,
    translate_lines,
    translate_stream,
    translations,
)
from mt.errors import MtError

from ..conftest import tiny_model
from ..test_checkpoint import state_for
from .test_search import sources

CPU = torch.device("cpu")


def options(**changes):
    opts = SearchOptions(beam=2, len_penalty=0.6, max_len_a=1.0, max_len_b=5, batch_tokens=64)
    for k, v in changes.items():
        setattr(opts, k, v)
    return opts


@pytest.fixture
def model_path(tokenizer, tmp_path):
    """The `loaded` fixture's model as `mt train` saves it."""
    model = tiny_model(vocab=tokenizer.vocab_size)
    checkpoint.save(state_for(model, tokenizer), tmp_path / "c.pt")
    return tmp_path / "c.pt"


def test_one_output_line_per_input_line_in_order(loaded):
    lines = ["the cat sat", "", "   ", "a big red dog runs under the tree", "dog\tcat", "the\x07cat \u0434\u043e\u043c"]
    out = list(translate_stream(loaded, iter(lines), options(), CPU))
    assert len(out) == len(lines)
    assert out[1] == "" and out[2] == ""
    # Order is the input's even though batches are sorted by length: each line equals its translation alone.
    for line, got in zip(lines, out, strict=True):
        assert got == list(translate_stream(loaded, iter([line]), options(), CPU))[0]


def test_too_long_input_is_cut_with_a_warning(loaded):
    warn = io.StringIO()
    long_line = " ".join(["cat", "dog", "tree"] * 70)
    [hyps] = translate_lines(loaded, [long_line], options(beam=1), CPU, warn=warn)
    limit = loaded.model.cfg.max_len - 1
    pieces = loaded.src_tok.encode([long_line])[0]
    assert len(pieces) > limit
    assert warn.getvalue() == f"warning: input line 1 has {len(pieces)} pieces; cut to the model's {limit}\n"
    # What comes out is the translation of the line's first `limit` pieces.
    [cut] = translate_ids(loaded.model, [pieces[:limit]], options(beam=1), CPU)
    assert hyps[0].tokens == cut[0].tokens


def test_the_warning_names_the_line_of_the_whole_input_across_chunks(loaded, monkeypatch, capsys):
    monkeypatch.setattr(mt.decode.translate, "CHUNK_LINES", 2)
    lines = ["the cat", "a dog", "the tree", " ".join(["cat"] * 200)]
    list(translate_stream(loaded, lines, options(beam=1), CPU))
    assert "warning: input line 4 has" in capsys.readouterr().err


def test_nbest_lines_carry_index_text_and_score(loaded):
    out = list(translate_stream(loaded, iter(["the cat", "a dog"]), options(beam=3, nbest=2), CPU))
    assert len(out) == 4
    assert [line.split(" ||| ")[0] for line in out] == ["0", "0", "1", "1"]
    scores = [float(line.split(" ||| ")[2]) for line in out]
    assert scores[0] >= scores[1] and scores[2] >= scores[3]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=40),
                max_size=8))
def test_arbitrary_unicode_never_breaks_the_line_count(loaded, lines):
    out = list(translate_stream(loaded, iter(lines), options(beam=1, max_len_b=3), CPU))
    assert len(out) == len(lines)
    assert all("\n" not in line for line in out)


def test_attention_is_an_option_of_the_same_stream(loaded, monkeypatch, tmp_path):
    monkeypatch.setattr(mt.decode.translate, "CHUNK_LINES", 2)  # five lines: three chunks
    lines = ["the cat sat", "", "a big dog", "dog runs under the tree", "the mat"]
    plain = list(translations(loaded, lines, options(), CPU))
    attended = list(translations(loaded, lines, options(), CPU, Attention(tmp_path / "att", layer=1, head=2)))
    assert [t.lines for t in attended] == [t.lines for t in plain] == [[text] for text in
                                                                      translate_stream(loaded, lines, options(), CPU)]
    assert [t.alignment for t in plain] == [""] * 5
    assert attended[1].alignment == "" and all(attended[i].alignment for i in (0, 2, 3, 4))
    # Heatmaps are named by the line's number in the whole input, not in its chunk.
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == [f"00000{i}.png" for i in (1, 3, 4, 5)]


def test_translate_writes_heatmaps_and_alignments(tmp_path, model_path, loaded):
    (tmp_path / "in.txt").write_text("the cat sat\n\na big dog\n", encoding="utf-8")
    runner = CliRunner()
    common = ["translate", "-c", str(model_path), "-i", str(tmp_path / "in.txt"), "--beam", "1"]
    plain = runner.invoke(app, common)
    result = runner.invoke(app, [*common, "--attention", str(tmp_path / "att"),
                                 "--alignments", str(tmp_path / "al.txt")])
    assert result.exit_code == 0, result.output
    assert result.stdout == plain.stdout  # stdout keeps one translation per input line
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["000001.png", "000003.png"]
    assert imread(tmp_path / "att" / "000003.png").ndim == 3
    lines = (tmp_path / "al.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""
    opts = SearchOptions(beam=1, len_penalty=0.6, max_len_a=1.5, max_len_b=10, batch_tokens=4096)
    [[best]] = translate_lines(loaded, ["the cat sat"], opts, CPU)
    assert [int(pair.split("-")[1]) for pair in lines[0].split()] == list(range(len(best.tokens)))

    bad = runner.invoke(app, [*common, "--alignments", str(tmp_path / "x.txt"), "--head", "1"])
    assert bad.exit_code == 2 and "--layer" in bad.output


@pytest.mark.parametrize(("changes", "message"), [
    ({"precision": "fp16"}, "--precision fp16: must be one of fp32, bf16, int8"),
    ({"alignments": "al.txt", "nbest": 2}, "drop --nbest"),
    ({"attention": "att", "head": 1}, "--head picks a head within a layer: give --layer too"),
    ({"attention": "att", "layer": 2}, "--layer 2: the model has decoder layers 0 to 1"),
    ({"attention": "att", "layer": 0, "head": 4}, "--head 4: the model has heads 0 to 3"),
    ({"input": "missing.txt"}, "missing.txt: input file not found"),
])
def test_run_refuses_what_cannot_run_and_writes_nothing(model_path, tmp_path, changes, message):
    paths = {key: tmp_path / value for key, value in changes.items() if key in ("alignments", "attention", "input")}
    request = TranslateRequest(model_path, output=tmp_path / "out.txt", **{**changes, **paths})
    with pytest.raises(MtError, match=message):
        run(request)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def stdin_of(monkeypatch, data: bytes, terminal: bool = False) -> None:
    class Stdin(io.TextIOWrapper):
        def isatty(self) -> bool:
            return terminal

    monkeypatch.setattr(sys, "stdin", Stdin(io.BytesIO(data), encoding="utf-8"))


def test_run_translates_stdin_to_stdout_and_a_file_to_a_file(model_path, loaded, tmp_path, monkeypatch, capsys):
    lines = ["the cat sat", "", "a big dog"]
    expected = "".join(line + "\n" for line in translate_stream(loaded, lines, options(beam=1, max_len_a=1.5,
                                                                                      max_len_b=10), CPU))
    stdin_of(monkeypatch, "".join(line + "\r\n" for line in lines).encode())
    run(TranslateRequest(model_path, beam=1))
    assert capsys.readouterr().out == expected
    (tmp_path / "in.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())  # a BOM, no final newline
    run(TranslateRequest(model_path, input=tmp_path / "in.txt", output=tmp_path / "out.txt", beam=1))
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == expected
    assert capsys.readouterr().out == ""


def test_nbest_beyond_the_beam_widens_the_beam(model_path, monkeypatch, capsys):
    stdin_of(monkeypatch, b"the cat\na dog\n")
    run(TranslateRequest(model_path, beam=1, nbest=3))
    assert [line.split(" ||| ")[0] for line in capsys.readouterr().out.splitlines()] == ["0"] * 3 + ["1"] * 3


def test_bytes_that_are_not_utf8_name_stdin_and_the_way_out(model_path, monkeypatch, capsys):
    stdin_of(monkeypatch, b"the cat\nthe \xff dog\n")
    with pytest.raises(MtError, match=r"^stdin:2: invalid UTF-8 .*--encoding-errors replace"):
        run(TranslateRequest(model_path, beam=1))
    stdin_of(monkeypatch, b"the cat\nthe \xff dog\n")
    run(TranslateRequest(model_path, beam=1, encoding_errors="replace"))
    assert capsys.readouterr().out.count("\n") == 2


def test_each_line_is_translated_as_entered_until_ctrl_d(loaded):
    opts = SearchOptions(beam=1, len_penalty=0.6, max_len_a=1.0, max_len_b=3, batch_tokens=64)
    typed = ["the cat sat", "", "a big dog"]
    stdout, stderr = io.StringIO(), io.StringIO()
    interactive(loaded, opts, CPU, io.BytesIO("".join(t + "\n" for t in typed).encode()), stdout, stderr)
    assert stdout.getvalue().split("\n")[:-1] == list(translate_stream(loaded, typed, opts, CPU))
    assert stderr.getvalue() == PROMPT * 4 + "\n"  # a prompt per line and one more answered by Ctrl-D


def test_a_terminal_on_stdin_is_translated_interactively(model_path, monkeypatch, capsys):
    stdin_of(monkeypatch, b"the cat\na dog\n", terminal=True)
    run(TranslateRequest(model_path, beam=1))
    out, err = capsys.readouterr()
    assert out.count("\n") == 2 and err == PROMPT * 3 + "\n"
    stdin_of(monkeypatch, b"the cat\na dog\n", terminal=True)
    run(TranslateRequest(model_path, beam=1, alignments=model_path.parent / "al.txt"))  # attention: a plain stream
    assert capsys.readouterr().err == ""


def test_finishing_the_whole_beam_finds_a_translation_scored_at_least_as_high_and_returns_one():
    model = tiny_model(seed=0)
    srcs = [[t for t in row if t not in (PAD, EOS)] for row in sources(n=8, seed=0).tolist()]
    opts = SearchOptions(beam=4, len_penalty=1.5, max_len_a=1.5, max_len_b=10, batch_tokens=4096)
    plain = translate_ids(model, srcs, opts, CPU)
    full = translate_ids(model, srcs, replace(opts, finish_all=True), CPU)
    assert [len(hyps) for hyps in full] == [1] * len(srcs)
    assert all(f[0].score >= p[0].score - 1e-5 for p, f in zip(plain, full, strict=True))
    assert any(f[0].tokens != p[0].tokens for p, f in zip(plain, full, strict=True)), \
        "no sentence where searching on finds another translation: the test proves nothing"


# ---------------------------------------------------------------------------------------------- standard streams


def test_a_closed_stdin_or_stdout_is_an_error_naming_the_way_out(model_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # how Python leaves a closed stream: `mt translate <&-`
    with pytest.raises(MtError, match=r"^stdin is closed: nothing to translate; .*give --input FILE$"):
        run(TranslateRequest(model_path, beam=1))
    monkeypatch.setattr(sys, "stdout", None)  # `mt translate ... >&-`
    (model_path.parent / "in.txt").write_text("the cat\n", encoding="utf-8")
    with pytest.raises(MtError, match=r"^stdout is closed: .*give --output FILE$"):
        run(TranslateRequest(model_path, input=model_path.parent / "in.txt", beam=1))


def mt_process(*args: object, data: bytes = b"", shell_tail: str = "", cwd: Path | None = None
               ) -> subprocess.CompletedProcess:
    """`python -m mt ARGS` with `data` on stdin, or in bash when `shell_tail` redirects its streams (`<&-`)."""
    command = [sys.executable, "-m", "mt", *map(str, args)]
    if shell_tail:
        return subprocess.run(f"{shlex.join(command)} {shell_tail}", shell=True, executable="/bin/bash",
                              capture_output=True, timeout=120, cwd=cwd)
    return subprocess.run(command, input=data, capture_output=True, timeout=120, cwd=cwd)


def test_in_a_real_process_dev_stdin_is_an_input_and_closed_or_broken_streams_end_in_one_line(model_path):
    result = mt_process("translate", "-c", model_path, "-i", "/dev/stdin", data=b"the cat\n\na dog\n")
    assert result.returncode == 0 and result.stdout.count(b"\n") == 3, result.stderr
    for tail, message in (("<&-", b"error: stdin is closed"), (">&-", b"error: stdout is closed")):
        result = mt_process("translate", "-c", model_path, shell_tail=tail)
        assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
        assert result.stderr.count(b"\n") == 1, result.stderr
    many = model_path.parent / "many.txt"
    many.write_text("the cat sat on the mat\n" * 1000, encoding="utf-8")
    # Some 90 KB of n-best lines, more than a pipe holds: the reader leaves after one, so writing fails (EPIPE),
    # and the writer ends quietly with no traceback, as `yes | head -1` does.
    result = mt_process("translate", "-c", model_path, "-i", many, "--nbest", 4, cwd=model_path.parent,
                        shell_tail="2>err.txt | head -1; echo status ${PIPESTATUS[0]}; cat err.txt")
    assert result.stdout.split(b"\n")[1:] == [b"status 1", b""], result.stdout
