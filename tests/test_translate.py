import io

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mt.translate import Options, translate_lines, translate_stream

CPU = torch.device("cpu")


def options(**changes):
    opts = Options(beam=2, len_penalty=0.6, max_len_a=1.0, max_len_b=5, batch_tokens=64)
    for k, v in changes.items():
        setattr(opts, k, v)
    return opts


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
    long_line = " ".join(["cat"] * 200)
    [hyps] = translate_lines(loaded, [long_line], options(beam=1), CPU, warn=warn)
    assert "input line 1" in warn.getvalue() and "cut" in warn.getvalue()
    assert hyps


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
