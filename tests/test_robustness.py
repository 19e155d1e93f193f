"""Nothing lost, nothing surprising: exact resume after SIGKILL, clean stops on SIGINT/SIGTERM, falling back from a
damaged checkpoint, skipping non-finite steps, and bad input at the command line (exit code 2, one `error:` line
naming the file, no partial output).

Subprocesses are used only where the process boundary is the point (signals); the command-line checks run the
real Typer app in-process with `CliRunner`, which exercises the same code without importing torch anew each time.
"""

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import mt.model
import mt.train
from mt import checkpoint
from mt.checkpoint import same_pieces
from mt.cli import app
from mt.config import Config, DecodeConfig, ModelConfig, resume_config, to_dict
from mt.data import Split, epoch_batches
from mt.errors import MtError
from mt.prepare import prepare
from mt.tokenizer import Tokenizer
from mt.train import train

from .conftest import LEXICON, prepare_corpus, tiny_model, write_corpus

ROOT = Path(__file__).resolve().parents[1]  # subprocesses run `python -m mt` from the source tree
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("corpus"), n_train=300, n_valid=10)


def config(data: Path, **train_changes) -> Config:
    """A tiny model, a checkpoint every 10 steps, one thread (so that runs in different processes agree bit for
    bit), no BLEU decoding (validation loss is enough here)."""
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                   dropout=0.1, max_len=32))
    t = cfg.train
    t.max_tokens, t.warmup, t.valid_every, t.log_every, t.valid_bleu, t.threads = 256, 10, 10, 5, False, 1
    for key, value in train_changes.items():
        setattr(t, key, value)
    return cfg


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> Path:
    """An uninterrupted 60-step run that keeps every checkpoint: the reference for the resumed runs."""
    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("straight") / "run"
    train(config(data, max_steps=60, keep_checkpoints=100), run, progress=False)
    torch.set_num_threads(threads)
    return run


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = checkpoint.load(a)["model"], checkpoint.load(b)["model"]
    assert wa.keys() == wb.keys()
    for name, tensor in wa.items():
        assert torch.equal(tensor, wb[name]), f"{name} differs between {a} and {b}"


def all_finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in checkpoint.load(path)["model"].values())


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------------------------- signals


def start_training(cfg: Config, run: Path, tmp_path: Path) -> subprocess.Popen:
    path = tmp_path / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)), encoding="utf-8")
    return subprocess.Popen([sys.executable, "-m", "mt", "train", str(path), "--out", str(run), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def wait_for(condition, process: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"training ended (exit {process.returncode}) too soon:\n{process.stderr.read()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for training to get going")
        time.sleep(0.01)


def logged_step(run: Path) -> int:
    try:
        return max((r["step"] for r in log_records(run)), default=0)
    except (FileNotFoundError, json.JSONDecodeError):  # not yet written, or a line half-written
        return 0


def test_a_run_killed_mid_interval_resumes_to_the_same_weights(data, straight, tmp_path):
    run = tmp_path / "killed"
    process = start_training(config(data, max_steps=60, keep_checkpoints=100), run, tmp_path)
    # Step 15 is logged after the step-10 checkpoint and before the step-20 one: the kill loses work to redo.
    wait_for(lambda: (run / "checkpoint-10.pt").is_file() and logged_step(run) >= 15, process)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    process.stderr.close()
    process.stdout.close()
    killed_at = checkpoint.load(run / "last.pt")["step"]
    assert 10 <= killed_at < 60, "the kill must land mid-run"

    resumed = subprocess.run([sys.executable, "-m", "mt", "train", "--resume", "--out", str(run), "--quiet"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    assert checkpoint.load(run / "last.pt")["step"] == 60
    assert_same_weights(run / "last.pt", straight / "last.pt")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_save_a_checkpoint_and_say_how_to_resume(data, tmp_path, sig):
    run = tmp_path / "run"
    process = start_training(config(data, max_steps=100_000), run, tmp_path)
    wait_for(lambda: (run / "checkpoint-10.pt").is_file(), process)  # the loop (and its handlers) is running
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    [message] = stderr.splitlines()
    assert message.startswith(f"error: {sig.name} at step ")
    assert f"mt train --resume --out {run}" in message
    step = int(message.split(" at step ")[1].split(":")[0])
    assert checkpoint.load(run / "last.pt")["step"] == step
    assert checkpoint.load(run / f"checkpoint-{step}.pt")["step"] == step


# ---------------------------------------------------------------------------------------------- checkpoints


def test_the_last_k_checkpoints_are_kept_and_a_damaged_last_falls_back(data, straight, tmp_path, capsys):
    run = tmp_path / "run"
    train(config(data, max_steps=30, keep_checkpoints=2), run, progress=False)
    assert sorted(p.name for p in run.glob("checkpoint-*.pt")) == ["checkpoint-20.pt", "checkpoint-30.pt"]
    assert_same_weights(run / "checkpoint-20.pt", straight / "checkpoint-20.pt")

    # A torn write (or a bad disk) truncates last.pt in place; checkpoint-30.pt shares its bytes (a hard link).
    last = run / "last.pt"
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size // 2)
    capsys.readouterr()
    cfg = resume_config(run, ["train.max_steps=40"])
    train(cfg, run, resume=True, progress=False)
    err = capsys.readouterr().err
    assert f"warning: {last}: not a readable mt checkpoint" in err
    assert f"resuming from {run / 'checkpoint-20.pt'} (step 20)" in err
    assert sorted(p.name for p in run.glob("checkpoint-*.pt")) == ["checkpoint-30.pt", "checkpoint-40.pt"]
    assert_same_weights(last, straight / "checkpoint-40.pt")
    assert_same_weights(run / "checkpoint-30.pt", straight / "checkpoint-30.pt")  # rewritten whole


def test_keep_checkpoints_zero_keeps_last_alone_and_nothing_readable_is_a_clear_error(data, tmp_path):
    run = tmp_path / "run"
    train(config(data, max_steps=10, keep_checkpoints=0), run, progress=False)
    assert not list(run.glob("checkpoint-*.pt"))
    (run / "last.pt").write_bytes(b"not a checkpoint")
    result = CliRunner().invoke(app, ["train", "--resume", "--out", str(run)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert f"{run}: no readable checkpoint" in result.stderr and "last.pt" in result.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to simulate a full disk")
def test_a_full_disk_is_a_clear_error_that_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"model": {}, "config": {}, "spm": {}, "step": 1}, path)
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint, "open", lambda _, mode: open("/dev/full", mode), raising=False)
    with pytest.raises(checkpoint.MtError, match=f"{path}: cannot write \\(No space left on device\\)"):
        checkpoint.save({"model": {"w": torch.zeros(10_000)}, "config": {}, "spm": {}, "step": 2}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# ---------------------------------------------------------------------------------------------- non-finite steps


def test_a_non_finite_loss_skips_the_update_and_is_counted(data, tmp_path, monkeypatch):
    real_forward = mt.model.Transformer.forward  # with a target, the training loss
    calls = {"training": 0}

    def forward_with_two_bad_batches(self, src, tgt, target=None, smoothing=0.0):
        loss = real_forward(self, src, tgt, target, smoothing)
        if target is None or not torch.is_grad_enabled():  # validation
            return loss
        calls["training"] += 1
        return loss * float("nan") if calls["training"] in (3, 4) else loss

    monkeypatch.setattr(mt.model.Transformer, "forward", forward_with_two_bad_batches)
    run = tmp_path / "run"
    cfg = config(data, max_steps=10, max_tokens=128)
    assert len(epoch_batches(Split(data, "train"), 128, cfg.model.max_len, cfg.train.seed, 0)) > 12
    train(cfg, run, progress=False)
    assert sum(r.get("skipped_steps", 0) for r in log_records(run)) == 2
    state = checkpoint.load(run / "last.pt")
    # Ten real updates; the two bad batches were consumed (not retried), and no update came from them.
    assert state["step"] == 10 and calls["training"] == 12
    assert state["train"]["position"]["batch"] == 12 and state["train"]["position"]["epoch"] == 0
    assert all_finite(run / "last.pt")


def test_a_diverging_run_stops_clearly(data, tmp_path):
    run = tmp_path / "run"
    train(config(data, max_steps=4, valid_every=2), run, progress=False)
    before = (run / "last.pt").read_bytes()
    # Resumed with a silly learning rate: step 5 makes the weights huge (finite), so every later loss is NaN and
    # every later step is skipped, until max_bad_steps of them in a row stop the run.
    cfg = resume_config(run, ["train.lr=1e30", "train.max_bad_steps=3", "train.max_steps=100"])
    with pytest.raises(MtError, match=r"after step 5: 3 steps in a row had a non-finite loss or gradients and "
                                         r"were skipped; stopped\..*train\.lr.*train\.clip_norm.*fp32.*--resume"):
        train(cfg, run, resume=True, progress=False)
    assert log_records(run)[-1]["skipped_steps"] == 3
    assert (run / "last.pt").read_bytes() == before


def test_a_checkpoint_with_non_finite_weights_is_never_written(data, tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(config(data, max_steps=4, valid_every=2), run, progress=False)
    before = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    real_step = mt.train.train_step

    def step_that_overflows(model, *args):  # an update that leaves an inf in the weights, as an overflow can
        result = real_step(model, *args)
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("inf")
        return result

    monkeypatch.setattr(mt.train, "train_step", step_that_overflows)
    cfg = resume_config(run, ["train.valid_every=1", "train.max_steps=100"])
    with pytest.raises(MtError, match=r"step 5: the model's weights are not finite; no checkpoint written"):
        train(cfg, run, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in run.glob("*.pt")} == before


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
                        "--vocab-size", 30, "-q")
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
def test_config_mistakes_are_one_line_errors_and_start_no_run(data, tmp_path, yaml_text, sets, fragments):
    path = tmp_path / "c.yaml"
    path.write_text(f"data: {data}\n{yaml_text}", encoding="utf-8")
    run = tmp_path / "run"
    result = invoke("train", path, "--out", run, "-q", *[x for s in sets for x in ("--set", s)])
    assert_one_line_error(result, *fragments)
    assert not run.exists()


def test_resuming_on_data_with_another_vocabulary_is_refused(data, straight, tmp_path):
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
