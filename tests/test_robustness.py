"""Bad input at the command line, end to end: exit code 2, one `error:` line naming the file, no partial output.
(Training's own robustness, signals, kill -9 and non-finite steps, is tested in test_train.py; checkpoints' in
test_checkpoint.py.) The checks run the real Typer app in-process with `CliRunner`."""

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import Config, DecodeConfig, to_dict
from mt.data.prepare import prepare
from mt.data.tokenizer import Tokenizer, same_pieces

from .conftest import LEXICON, tiny_model, write_corpus
from .train.test_loop import ROOT, data, straight  # noqa: F401  (fixtures)

# ---------------------------------------------------------------------------------------------- signals


# ---------------------------------------------------------------------------------------------- checkpoints


# ---------------------------------------------------------------------------------------------- non-finite steps


# ---------------------------------------------------------------------------------------------- bad input


def invoke(*args, stdin: bytes | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr


def write_pair(prefix: Path, de: bytes, en: bytes) -> Path:
    prefix.with_suffix(".de").write_bytes(de)
    prefix.with_suffix(".en").write_bytes(en)
    return prefix


GOOD_DE = "ein großer Hund\neine Katze\nein Baum\n".encode()
GOOD_EN = b"a big dog\na cat\na tree\n"


@pytest.mark.parametrize("case", ["missing", "empty", "invalid utf-8"])
def test_bad_corpus_files_are_one_line_errors_and_leave_no_output(tmp_path, case):
    prefix = tmp_path / "c"
    de = prefix.with_suffix(".de")
    if case == "missing":
        prefix.with_suffix(".en").write_bytes(GOOD_EN)
        fragments = [str(de)]
    elif case == "empty":
        write_pair(prefix, b"", GOOD_EN)
        fragments = [f"{de}: file is empty"]
    else:
        write_pair(prefix, b"ein Hund\nschl\xff\xfecht\nein Baum\n", GOOD_EN)
        fragments = [f"{de}:2: invalid UTF-8", "--encoding-errors replace"]
    out = tmp_path / "out"
    assert_one_line_error(invoke("prepare", "--train", prefix, "--out", out, "--vocab-size", 30, "-q"), *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in tmp_path.glob("c.*"))
    if case == "invalid utf-8":
        result = invoke("prepare", "--train", prefix, "--out", out, "--vocab-size", 30, "-q",
                        "--encoding-errors", "replace")
        assert result.exit_code == 0, result.stderr
        assert json.loads((out / "meta.json").read_text())["splits"]["train"]["pairs"] == 3


def test_crlf_and_bom_input_is_prepared_exactly_like_clean_input(tmp_path):
    clean = write_pair(tmp_path / "clean", GOOD_DE, GOOD_EN)
    windows = write_pair(tmp_path / "windows", b"\xef\xbb\xbf" + GOOD_DE.replace(b"\n", b"\r\n"),
                         b"\xef\xbb\xbf" + GOOD_EN.replace(b"\n", b"\r\n"))
    for prefix in (clean, windows):
        result = invoke("prepare", "--train", prefix, "--valid", prefix, "--out", tmp_path / f"{prefix.name}.out",
                        "--vocab-size", 25, "-q")  # all this little text supports: no warning expected
        assert result.exit_code == 0 and result.stderr == "", result.stderr
    a, b = tmp_path / "clean.out", tmp_path / "windows.out"
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for path in a.iterdir():
        # meta.json names the input files; SentencePiece's training is not byte-reproducible, its pieces are.
        if path.name not in ("meta.json", "spm.model"):
            assert path.read_bytes() == (b / path.name).read_bytes(), path.name
    assert same_pieces(Tokenizer.load(a / "spm.model"), Tokenizer.load(b / "spm.model"))
    meta_a, meta_b = (json.loads((d / "meta.json").read_text()) for d in (a, b))
    assert meta_a["splits"] == meta_b["splits"] and meta_a["cleaning"] == meta_b["cleaning"]


@pytest.mark.parametrize(("yaml_text", "sets", "fragments"), [
    ("train:\n  lrr: 0.1\n", [], ["unknown config key 'train.lrr'", "valid keys", "warmup"]),
    ("", ["train.max_steps=many"], ["train.max_steps='many': expected int"]),
    ("", ["model.d_model=32", "model.n_heads=3"], ["model.d_model=32 is not divisible by model.n_heads=3"]),
    ("", ["train.max_bad_steps=0"], ["train.max_bad_steps=0: must be at least 1"]),
    ("", ["train.keep_checkpoints=-1"], ["train.keep_checkpoints=-1: must be at least 0"]),
], ids=["unknown key", "ill-typed value", "heads do not divide d_model", "max_bad_steps", "keep_checkpoints"])
def test_config_mistakes_are_one_line_errors_and_start_no_run(data, tmp_path, yaml_text, sets, fragments):  # noqa: F811
    path = tmp_path / "c.yaml"
    path.write_text(f"data: {data}\n{yaml_text}", encoding="utf-8")
    run = tmp_path / "run"
    result = invoke("train", path, "--out", run, "-q", *[x for s in sets for x in ("--set", s)])
    assert_one_line_error(result, *fragments)
    assert not run.exists()


def test_resuming_on_data_with_another_vocabulary_is_refused(data, straight, tmp_path):  # noqa: F811
    # Same vocabulary size, different pieces: the ids would silently mean other words.
    other = {f"x{de}": f"y{en}" for de, en in LEXICON.items()}
    root = write_corpus(tmp_path / "other", other, seed=1, n_train=300, n_valid=10)
    prepare(root / "data", "de", "en", train=str(root / "train"), vocab_size=40, progress=False)
    assert Tokenizer.load(root / "data" / "spm.model").vocab_size == Tokenizer.load(data / "spm.model").vocab_size
    run = tmp_path / "run"
    shutil.copytree(straight, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    result = invoke("train", "--resume", "--out", run, "--set", f"data={root / 'data'}", "-q")
    assert_one_line_error(result, str(root / "data"), "vocabulary", str(run / "last.pt"), f"--set data={data}")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


# ---------------------------------------------------------------------------------------------- translate


@pytest.fixture(scope="module")
def model_path(tokenizer, tmp_path_factory) -> Path:
    """An untrained tiny model with a real tokenizer, saved as `mt train` would; greedy, at most 3 tokens out."""
    model = tiny_model(vocab=tokenizer.vocab_size)
    cfg = Config(model=model.cfg, decode=DecodeConfig(beam=1, max_len_a=0.0, max_len_b=3))
    path = tmp_path_factory.mktemp("model") / "model.pt"
    checkpoint.save({"model": model.state_dict(), "config": to_dict(cfg),
                     "spm": {"src": tokenizer.model_proto, "tgt": tokenizer.model_proto}, "step": 0}, path)
    return path


def test_translate_keeps_one_line_per_input_line_whatever_comes_in(model_path, tmp_path):
    lines = ["the cat sat", "", "   \t ", " ".join(["dog"] * 200), "a\x00b\x07c\x1b[31m", "the dog Собака 犬 كلب 🐕",
             "\u200f\u202eunder the tree\ufeff", "x\ry"]
    src = tmp_path / "in.txt"
    src.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    out = tmp_path / "out.txt"
    result = invoke("translate", "--checkpoint", model_path, "--input", src, "--output", out)
    assert result.exit_code == 0, result.stderr
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got[:-1]) == len(lines)
    assert got[1] == got[2] == ""


def test_translate_refuses_bytes_that_are_not_utf8_and_writes_nothing(model_path, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(b"the cat\nthe \xff dog\n")
    out = tmp_path / "out.txt"
    result = invoke("translate", "--checkpoint", model_path, "--input", src, "--output", out)
    assert_one_line_error(result, f"{src}:2: invalid UTF-8", "--encoding-errors replace")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    result = invoke("translate", "--checkpoint", model_path, "--input", src, "--output", out,
                    "--encoding-errors", "replace")
    assert result.exit_code == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).map(str.encode),
                          st.binary(max_size=30)).map(lambda line: line.replace(b"\n", b"")), max_size=8))
def test_mt_translate_gives_one_line_per_line_for_arbitrary_input(model_path, lines):
    result = invoke("translate", "--checkpoint", model_path, "--encoding-errors", "replace",
                    stdin=b"".join(line + b"\n" for line in lines))
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout.count("\n") == len(lines)
    assert all(not line.strip() for line, src in zip(result.stdout.split("\n"), lines, strict=False)
               if not src.decode("utf-8", "replace").strip())


def test_every_commands_mistakes_are_one_error_line_with_exit_code_2(tmp_path):
    (tmp_path / "hyp").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "ref").write_text("a\n", encoding="utf-8")
    missing = tmp_path / "none.pt"
    assert_one_line_error(invoke("evaluate", "--hyp", tmp_path / "hyp", "--ref", tmp_path / "ref"),
                          f"{tmp_path / 'hyp'} has 2 lines but {tmp_path / 'ref'} has 1")
    assert_one_line_error(invoke("evaluate", "--ref", tmp_path / "ref"), "give either --hyp FILE")
    assert_one_line_error(invoke("score", "-c", missing, "-s", tmp_path / "hyp", "-t", tmp_path / "ref"),
                          "line-aligned")
    assert_one_line_error(invoke("tune", "-c", missing, "-o", missing, "--beams", "one"), "--beams 'one'")
    assert_one_line_error(invoke("average", tmp_path, "-o", missing, "--last", "2"), "no checkpoint-STEP.pt files")
    assert_one_line_error(invoke("report", tmp_path), f"{tmp_path / 'final.pt'}: not found")
    assert_one_line_error(invoke("info", missing), str(missing))
    assert_one_line_error(invoke("plot", tmp_path), f"{tmp_path / 'log.jsonl'}: not found")
    assert_one_line_error(invoke("prepare"), "name a corpus")
    assert not missing.exists()


# ---------------------------------------------------------------------------------------------- option ranges
# Derandomized, so CI checks the same draws every run; explore with more examples and derandomize off.

NUMBER = st.one_of(st.integers(-3, 40), st.floats(-2.0, 3.0, allow_nan=False).map(lambda x: round(x, 2)),
                   st.sampled_from(["x", "1e9", "nan", "inf", ""]))


def assert_success_or_one_error_line(result) -> None:
    """A run ends in success, or in exit code 2 with one `error:` line; never in a traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code != 0:
        assert_one_line_error(result)


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["--beam", "--len-penalty", "--nbest", "--batch-tokens", "--threads",
                                        "--layer", "--head"]), NUMBER, max_size=4), st.booleans())
def test_translate_takes_any_number_for_any_option_or_says_what_is_allowed(model_path, tmp_path, options, align):
    args = [arg for option, value in options.items() for arg in (option, value)]
    if align:  # --layer and --head are checked against the model when alignments are asked for
        args += ["--alignments", tmp_path / "align.txt"]
    result = invoke("translate", "--checkpoint", model_path, *args, stdin=b"the cat\n\nthe red dog runs\n")
    assert_success_or_one_error_line(result)
    if result.exit_code == 0:  # one line per input line, or with --nbest N up to N per line, numbered
        lines = result.stdout.splitlines()
        assert len(lines) == 3 if str(options.get("--nbest", 1)) == "1" else {x.split(" ||| ")[0] for x in lines} == {
            "0", "1", "2"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), n_train=60, n_valid=5)


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["--vocab-size", "--spm-sentences", "--max-words", "--max-ratio",
                                        "--max-pieces", "--subword-samples", "--subword-alpha"]), NUMBER,
                       max_size=3))
def test_prepare_takes_any_number_for_any_option_or_says_what_is_allowed(corpus, tmp_path, options):
    options.setdefault("--vocab-size", 30)
    args = [arg for option, value in options.items() for arg in (option, value)]
    out = tmp_path / f"out-{abs(hash(tuple(args)))}"
    result = invoke("prepare", "--train", corpus / "train", "--valid", corpus / "valid", "--out", out, "-q", *args)
    assert_success_or_one_error_line(result)
    assert (out / "meta.json").is_file() == (result.exit_code == 0)


@settings(max_examples=30, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["train.max_tokens", "train.lr", "train.warmup", "train.accumulate",
                                        "train.label_smoothing", "train.clip_norm", "train.threads",
                                        "train.beta2", "model.dropout", "model.n_heads", "decode.beam"]),
                       NUMBER, max_size=3), st.integers(-1, 3))
def test_train_takes_any_number_for_any_config_value_or_says_what_is_allowed(data, tmp_path, values, steps):  # noqa: F811
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml_config(data), encoding="utf-8")
    sets = [arg for key, value in {**values, "train.max_steps": steps}.items() for arg in ("--set", f"{key}={value}")]
    out = tmp_path / f"run-{abs(hash(tuple(sets)))}"
    result = invoke("train", config, "--out", out, "-q", *sets)
    assert_success_or_one_error_line(result)


def yaml_config(data_dir: Path) -> str:
    return (f"data: {data_dir}\nmodel: {{d_model: 32, n_heads: 4, n_enc_layers: 1, n_dec_layers: 1, d_ff: 64, "
            "max_len: 32}\ntrain: {max_tokens: 256, warmup: 5, valid_every: 2, log_every: 1, valid_bleu: false, "
            "threads: 1}\n")


# ---------------------------------------------------------------------------------------------- output paths


def test_output_paths_are_checked_before_any_work_and_named_with_the_fix(model_path, tmp_path, corpus):
    src = tmp_path / "in.txt"
    src.write_text("the cat\n", encoding="utf-8")
    in_the_way = tmp_path / "file"
    in_the_way.write_text("keep me\n", encoding="utf-8")
    missing = tmp_path / "missing" / "out.txt"
    cases = [
        (("translate", "-c", model_path, "-i", src, "-o", missing), f"--output {missing}: its directory"),
        (("translate", "-c", model_path, "-i", src, "-o", tmp_path), f"--output {tmp_path}: is a directory"),
        (("translate", "-c", model_path, "-i", src, "--alignments", missing), "--alignments"),
        (("translate", "-c", model_path, "-i", src, "--attention", in_the_way / "maps"), f"{in_the_way} is a file"),
        (("train", ROOT / "configs" / "demo.yaml", "--out", in_the_way), "a file is in the way"),
        (("prepare", "--train", corpus / "train", "--out", in_the_way / "data"), f"{in_the_way} is a file"),
        (("plot", tmp_path, "--out", in_the_way / "curves.png"), f"{in_the_way}: a file is in the way"),
    ]
    for args, fragment in cases:
        assert_one_line_error(invoke(*args), fragment, "choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "in.txt"]
    assert in_the_way.read_text(encoding="utf-8") == "keep me\n"
