import functools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import mt.config
import mt.model.transformer
import mt.train.loop
from mt import checkpoint
from mt.config import Config, ModelConfig, to_dict
from mt.data.batches import Batch, batch_by_tokens, epoch_batches, pad, shift_targets
from mt.data.ids import Split
from mt.data.tokenizer import EOS, PAD
from mt.decode.search import greedy
from mt.errors import MtError
from mt.model.transformer import Transformer
from mt.train.loop import train, train_step
from mt.train.optim import learning_rate
from mt.train.resume import resume_config

from ..conftest import prepare_corpus

ROOT = Path(__file__).resolve().parents[2]  # subprocesses run `python -m mt` from the source tree


@pytest.mark.numerics  # how fast it learns hangs on the CPU: make test runs this again as an AVX2-only CPU would
@pytest.mark.slow  # 20 s of a slow CPU; every model the suite trains until it translates shows the loop learns
def test_tiny_model_learns_to_copy():
    """It copies 90% of unseen sequences exactly within 1,200 steps, checked every 100 steps: a bound, not the
    step where one CPU's numbers happen to get there."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    vocab = 20
    cfg = Config(model=ModelConfig(d_model=64, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=128, dropout=0.0,
                                   max_len=32, src_vocab_size=vocab, tgt_vocab_size=vocab))
    cfg.train.label_smoothing = 0.0
    model = Transformer(cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    unseen = np.random.default_rng(1)
    test = [unseen.integers(4, vocab, size=unseen.integers(3, 10)).tolist() for _ in range(50)]
    exact = 0.0
    for step in range(1, 1201):
        model.train()
        train_step(model, optimizer, scaler, [copy_task_batch(rng, vocab, 64)], cfg, torch.device("cpu"), None,
                   learning_rate(step, 2e-3, 50))
        if step % 100 == 0:
            exact = copied_exactly(model, test)
            if exact >= 0.9:
                break
    assert exact >= 0.9, f"copied {exact:.0%} of sequences exactly after {step} steps"


def copied_exactly(model: Transformer, test: list[list[int]]) -> float:
    """The share of `test` the model copies exactly, greedy."""
    model.eval()
    hyps = []
    for idx in batch_by_tokens([len(s) + 1 for s in test], 200):
        out = greedy(model, pad([test[i] for i in idx], [], [EOS]), max_len_a=1.0, max_len_b=3)
        hyps += [(test[i], h.tokens) for i, h in zip(idx, out, strict=True)]
    return sum(src == hyp for src, hyp in hyps) / len(hyps)


def copy_task_batch(rng, vocab: int, n: int) -> Batch:
    seqs = [rng.integers(4, vocab, size=rng.integers(3, 10)).tolist() for _ in range(n)]
    tgt_in, tgt_out = shift_targets(seqs)
    return Batch(pad(seqs, [], [EOS]), tgt_in, tgt_out, int((tgt_out != PAD).sum()))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_corpus(tmp_path_factory.mktemp("corpus"))


def small_config(data, **train_changes):
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                   dropout=0.1, max_len=32))
    cfg.train.max_tokens, cfg.train.warmup, cfg.train.valid_every, cfg.train.log_every = 256, 10, 10, 5
    for key, value in train_changes.items():
        setattr(cfg.train, key, value)
    return cfg


def train_run(cfg, run, resume=False):
    return train(cfg, run, resume=resume, progress=False)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def as_written_by_earlier_versions(path, ema: float = 0.0) -> None:
    """Rewrite a resumable checkpoint as earlier versions wrote it: `best_bleu` and `stale` for today's names and
    `train.ema` in its config and no `model.right_to_left`; with `ema`, the raw weights as "weights" and their
    moving average as "model"."""
    state = checkpoint.load(path)
    saved = state["train"]
    saved["best_bleu"] = saved.pop("best_score")
    saved["position"]["stale"] = saved["position"].pop("validations_since_best")
    state["config"]["train"]["ema"] = ema
    del state["config"]["model"]["right_to_left"]  # a key added since
    if ema:
        saved["weights"] = state["model"]
        state["model"] = {name: tensor * 0.5 for name, tensor in state["model"].items()}  # some other weights
    checkpoint.save(state, path)


@pytest.mark.numerics
@pytest.mark.parametrize("written_by", ["this version", "earlier versions"])
def test_resumed_run_ends_with_the_same_weights(prepared, tmp_path, written_by):
    train_run(small_config(prepared, max_steps=30), tmp_path / "straight")
    train_run(small_config(prepared, max_steps=20), tmp_path / "resumed")
    if written_by == "earlier versions":
        as_written_by_earlier_versions(tmp_path / "resumed" / "last.pt")
    train_run(resume_config(tmp_path / "resumed", ["train.max_steps=30"]), tmp_path / "resumed", resume=True)
    a = checkpoint.load(tmp_path / "straight" / "last.pt")
    b = checkpoint.load(tmp_path / "resumed" / "last.pt")
    assert a["step"] == b["step"] == 30
    assert_same_weights(a["model"], b["model"])
    assert a["train"]["best_score"] == b["train"]["best_score"]
    assert a["train"]["position"] == b["train"]["position"] | {"elapsed": a["train"]["position"]["elapsed"]}



def test_a_run_with_late_dropout_trains_its_first_epochs_as_a_run_without_dropout(prepared, tmp_path):
    train_run(small_config(prepared, max_steps=12, late_dropout=100), tmp_path / "late")  # dropout 0.1, late
    without = small_config(prepared, max_steps=12)
    without.model.dropout = 0.0
    train_run(without, tmp_path / "without")
    assert_same_weights(checkpoint.load(tmp_path / "late" / "last.pt")["model"],
                        checkpoint.load(tmp_path / "without" / "last.pt")["model"])

def test_a_run_that_kept_a_moving_average_goes_on_from_its_raw_weights(prepared, tmp_path, capsys, monkeypatch):
    # train.ema is gone; a run written with it resumes from the raw weights, and its best score (the average's)
    # no longer counts.
    monkeypatch.setattr(mt.config, "_noted", set())
    train_run(small_config(prepared, max_steps=30), tmp_path / "straight")
    train_run(small_config(prepared, max_steps=20), tmp_path / "resumed")
    as_written_by_earlier_versions(tmp_path / "resumed" / "last.pt", ema=0.9)
    cfg = resume_config(tmp_path / "resumed", ["train.max_steps=30"])
    train_run(cfg, tmp_path / "resumed", resume=True)
    assert_same_weights(checkpoint.load(tmp_path / "straight" / "last.pt")["model"],
                        checkpoint.load(tmp_path / "resumed" / "last.pt")["model"])
    ignored, resumed = [line for line in capsys.readouterr().err.splitlines() if "train.ema" in line]
    assert ignored.startswith("note: train.ema=0.9 in ") and ignored.endswith("; ignored")  # said once
    assert resumed.startswith("note: ") and "validation and best.pt start afresh from step 20" in resumed
    assert checkpoint.load(tmp_path / "resumed" / "best.pt")["step"] == 30  # step 30 is compared with nothing


def test_fp16_skips_overflowing_steps_and_resumes_with_the_scalers_state(prepared, tmp_path, monkeypatch):
    # fp16 autocast and the grad scaler on CPU, as on a GPU. A loss scale of 2^20 overflows this model's fp16
    # gradients: the first steps are skipped while the scaler backs off, as a GPU run's first steps are (there
    # from its default 2^16, with larger gradients).
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0 ** 20))
    fp16 = {"precision": "fp16", "valid_bleu": False, "log_every": 1}
    train_run(small_config(prepared, max_steps=30, **fp16), tmp_path / "straight")
    train_run(small_config(prepared, max_steps=20, **fp16), tmp_path / "resumed")
    train_run(small_config(prepared, max_steps=30, **fp16), tmp_path / "resumed", resume=True)
    records = [json.loads(line) for line in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    skipped = [r.get("skipped_steps", 0) for r in records]
    assert skipped[0] > 0 and sum(skipped) < 5  # the scaler backs off at the start, then rarely overflows
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns
    a = checkpoint.load(tmp_path / "straight" / "last.pt")
    b = checkpoint.load(tmp_path / "resumed" / "last.pt")
    assert a["step"] == b["step"] == 30  # skipped steps are not counted
    assert a["train"]["scaler"]["scale"] < 2.0 ** 20
    assert a["train"]["scaler"] == b["train"]["scaler"]
    assert_same_weights(a["model"], b["model"])


def test_a_compiled_cpu_run_keys_the_compile_cache_by_its_vector_width(prepared, tmp_path, monkeypatch):
    """train.compile on a CPU names the vector width to torch.compile, as the compiled decoding step does: its cache
    is not keyed by ATEN_CPU_CAPABILITY, and code written under the AVX2 setting ran out of bounds at AVX-512's."""
    import torch._inductor.cpu_vec_isa

    class Width:
        def bit_width(self) -> int:
            return 256

    asked = []
    monkeypatch.setattr(torch._inductor.cpu_vec_isa, "pick_vec_isa", Width)
    monkeypatch.setattr(torch, "compile", lambda model, **options: asked.append(options) or model)
    train(small_config(prepared, max_steps=1, compile=True, threads=1), tmp_path / "run", progress=False)
    assert asked == [{"options": {"cpp.simdlen": 256}}]


def test_a_run_directory_is_never_overwritten(prepared, tmp_path):
    train(small_config(prepared, max_steps=10), tmp_path / "run", progress=False)
    with pytest.raises(MtError, match="already holds a run; pass --resume"):
        train(small_config(prepared, max_steps=10), tmp_path / "run", progress=False)


def test_vocabulary_mismatch_is_a_clear_error(prepared, tmp_path):
    cfg = small_config(prepared, max_steps=10)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 999
    with pytest.raises(MtError, match="vocabulary of"):
        train(cfg, tmp_path / "run", progress=False)


def test_training_stops_early_when_validation_stops_improving(prepared, tmp_path):
    # A learning rate of 1e-12 leaves the greedy output, hence validation BLEU, unchanged: no validation after
    # the first is a new best, and patience 2 stops the run at the third validation instead of step 100.
    train(small_config(prepared, max_steps=100, valid_every=5, patience=2, lr=1e-12), tmp_path, progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 15


def test_an_early_stopped_run_stays_stopped_on_resume(prepared, tmp_path):
    cfg = small_config(prepared, max_steps=100, valid_every=5, patience=2, lr=1e-12)
    train(cfg, tmp_path, progress=False)
    train(cfg, tmp_path, resume=True, progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 15
    assert sorted(step for step, _ in checkpoint.numbered(tmp_path)) == [5, 10, 15]  # nothing saved again


def test_patience_counts_validation_loss_when_bleu_is_off(prepared, tmp_path):
    # Without BLEU the score is minus the loss; a learning model improves it, so patience never runs out.
    train(small_config(prepared, max_steps=30, valid_every=5, patience=3, valid_bleu=False), tmp_path,
          progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 30
    assert checkpoint.load(tmp_path / "best.pt")["step"] >= 20


# A killed, an interrupted, a diverging run: one thread each, so that runs in different processes agree bit for bit.


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("corpus"), n_train=300, n_valid=10)


def one_thread_config(data: Path, **train_changes) -> Config:
    """A tiny model, a checkpoint every 10 steps, one thread (so that runs in different processes agree bit for
    bit), no BLEU decoding (validation loss is enough here)."""
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                   dropout=0.1, max_len=32))
    train_cfg = cfg.train
    train_cfg.max_tokens, train_cfg.warmup, train_cfg.valid_every, train_cfg.log_every = 256, 10, 10, 5
    train_cfg.valid_bleu, train_cfg.threads = False, 1
    for key, value in train_changes.items():
        setattr(train_cfg, key, value)
    return cfg


@pytest.fixture(scope="module")
def straight(data, tmp_path_factory) -> Path:
    """An uninterrupted 60-step run that keeps every checkpoint: the reference for the resumed runs."""
    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("straight") / "run"
    train(one_thread_config(data, max_steps=60, keep_checkpoints=100), run, progress=False)
    torch.set_num_threads(threads)
    return run


def assert_same_saved_weights(a: Path, b: Path) -> None:
    wa, wb = checkpoint.load(a)["model"], checkpoint.load(b)["model"]
    assert wa.keys() == wb.keys()
    for name, tensor in wa.items():
        assert torch.equal(tensor, wb[name]), f"{name} differs between {a} and {b}"


def all_finite(path: Path) -> bool:
    return all(torch.isfinite(t).all() for t in checkpoint.load(path)["model"].values())


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


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


@pytest.mark.numerics
def test_a_run_killed_mid_interval_resumes_to_the_same_weights(data, straight, tmp_path):
    run = tmp_path / "killed"
    process = start_training(one_thread_config(data, max_steps=60, keep_checkpoints=100), run, tmp_path)
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
    assert_same_saved_weights(run / "last.pt", straight / "last.pt")


def test_a_second_writer_is_refused_and_the_run_ends_as_if_undisturbed(data, straight, tmp_path):
    run = tmp_path / "run"
    process = start_training(one_thread_config(data, max_steps=60, keep_checkpoints=100), run, tmp_path)
    wait_for(lambda: (run / "checkpoint-10.pt").is_file(), process)
    process.send_signal(signal.SIGSTOP)  # holds still, and holds the run, while the second process tries
    try:
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        second = subprocess.run([sys.executable, "-m", "mt", "train", "--resume", "--out", str(run), "--quiet"],
                                capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert second.stderr.startswith(f"error: {run} is in use by process {process.pid} on ")
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # it wrote nothing
    finally:
        process.send_signal(signal.SIGCONT)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr
    for step in range(10, 61, 10):  # every checkpoint as the undisturbed run saved it
        assert_same_saved_weights(run / f"checkpoint-{step}.pt", straight / f"checkpoint-{step}.pt")


def test_a_checkpoint_that_does_not_fit_is_a_clear_error_and_the_previous_one_stays(data, tmp_path):
    from ..data.test_lines import limited_file_size

    run = tmp_path / "run"
    train(one_thread_config(data, max_steps=10), run, progress=False)
    before = (run / "last.pt").read_bytes()
    resumed = subprocess.run([sys.executable, "-m", "mt", "train", "--resume", "--out", str(run), "--quiet",
                              "--set", "train.max_steps=20"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                             preexec_fn=limited_file_size(len(before) // 2))
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "cannot write: the file size limit is reached" in resumed.stderr
    assert (run / "last.pt").read_bytes() == before and checkpoint.load(run / "last.pt")["step"] == 10
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_save_a_checkpoint_and_say_how_to_resume(data, tmp_path, sig):
    run = tmp_path / "run"
    process = start_training(one_thread_config(data, max_steps=100_000), run, tmp_path)
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


def test_a_non_finite_loss_skips_the_update_and_is_counted(data, tmp_path, monkeypatch):
    real_forward = mt.model.transformer.Transformer.forward  # with a target, the training loss
    calls = {"training": 0}

    def forward_with_two_bad_batches(self, src, tgt, target=None, smoothing=0.0):
        loss = real_forward(self, src, tgt, target, smoothing)
        if target is None or not torch.is_grad_enabled():  # validation
            return loss
        calls["training"] += 1
        return loss * float("nan") if calls["training"] in (3, 4) else loss

    monkeypatch.setattr(mt.model.transformer.Transformer, "forward", forward_with_two_bad_batches)
    run = tmp_path / "run"
    cfg = one_thread_config(data, max_steps=10, max_tokens=128)
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
    train(one_thread_config(data, max_steps=4, valid_every=2), run, progress=False)
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
    train(one_thread_config(data, max_steps=4, valid_every=2), run, progress=False)
    before = {p.name: p.read_bytes() for p in run.glob("*.pt")}
    real_step = mt.train.loop.train_step

    def step_that_overflows(model, *args):  # an update that leaves an inf in the weights, as an overflow can
        result = real_step(model, *args)
        with torch.no_grad():
            next(model.parameters()).view(-1)[0] = float("inf")
        return result

    monkeypatch.setattr(mt.train.loop, "train_step", step_that_overflows)
    cfg = resume_config(run, ["train.valid_every=1", "train.max_steps=100"])
    with pytest.raises(MtError, match=r"step 5: the model's weights are not finite; no checkpoint written"):
        train(cfg, run, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in run.glob("*.pt")} == before
