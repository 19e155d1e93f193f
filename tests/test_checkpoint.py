import pickle
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import mt.config
from mt import checkpoint
from mt.cli import app
from mt.config import RETIRED, Config, to_dict
from mt.decode.load import load_model
from mt.errors import MtError
from mt.train.loop import train
from mt.train.resume import resume_config

from .conftest import tiny_model
from .train.test_loop import assert_same_saved_weights, data, one_thread_config, straight  # noqa: F401  (fixtures)


def state_for(model, tokenizer):
    return {"model": model.state_dict(), "config": to_dict(Config(model=model.cfg)),
            "spm": {"src": tokenizer.model_proto, "tgt": tokenizer.model_proto}, "step": 7}


def test_a_checkpoint_is_self_contained(tmp_path, tokenizer):
    model = tiny_model(vocab=tokenizer.vocab_size)
    checkpoint.save(state_for(model, tokenizer), tmp_path / "c.pt")
    loaded = load_model(tmp_path / "c.pt")
    src = torch.tensor([[5, 6, 7, 3]])
    tgt = torch.tensor([[2, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(src, tgt), model(src, tgt))
    assert loaded.src_tok.encode(["the cat"]) == tokenizer.encode(["the cat"])
    assert not loaded.model.training


def test_a_checkpoint_with_a_lever_since_dropped_translates_and_says_so_once(tmp_path, tokenizer, monkeypatch, capsys):
    monkeypatch.setattr(mt.config, "_noted", set())
    model = tiny_model(vocab=tokenizer.vocab_size)
    state = state_for(model, tokenizer)
    state["config"]["train"] |= {"rdrop": 1.0, "word_dropout": 0.0, "both_ways_epochs": 0, "shared": 0.0}  # as written
    path = tmp_path / "best.pt"
    checkpoint.save(state, path)
    result = CliRunner().invoke(app, ["translate", "-c", str(path), "--beam", "2"], input="the cat\nthe dog\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 2
    assert result.stderr.splitlines() == [f"note: train.rdrop=1.0 in {path} is no longer a setting of mt "
                                          f"({RETIRED['train.rdrop']}); ignored"]
    assert load_model(path).config == Config(model=model.cfg)  # loaded again: not said again
    assert capsys.readouterr().err == ""


def test_a_failed_save_leaves_the_previous_file(tmp_path, tokenizer):
    model = tiny_model(vocab=tokenizer.vocab_size)
    path = tmp_path / "c.pt"
    checkpoint.save(state_for(model, tokenizer), path)
    before = path.read_bytes()
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError), match="pickle"):
        checkpoint.save({"model": lambda: None}, path)  # cannot be pickled
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]


def test_truncated_or_foreign_files_are_clear_errors(tmp_path, tokenizer):
    path = tmp_path / "c.pt"
    checkpoint.save(state_for(tiny_model(vocab=tokenizer.vocab_size), tokenizer), path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(MtError, match="c.pt: not a readable mt checkpoint"):
        checkpoint.load(path)
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(MtError, match="not an mt checkpoint"):
        checkpoint.load(path)
    with pytest.raises(MtError, match="not found"):
        checkpoint.load(tmp_path / "missing.pt")


def test_loading_never_runs_code_from_the_file(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"model": Evil(), "config": {}, "spm": {}}, path)
    with pytest.raises(MtError):
        checkpoint.load(path)


def test_resuming_needs_the_training_state_and_passes_over_damaged_checkpoints(tmp_path, tokenizer, capsys):
    run = tmp_path / "run"
    state = state_for(tiny_model(vocab=tokenizer.vocab_size), tokenizer)
    checkpoint.save_last(state, run, keep=1)  # weights only, as best.pt holds
    with pytest.raises(MtError, match="holds no training state .* it cannot be resumed"):
        checkpoint.latest_resumable(run)
    checkpoint.save_last(state | {"train": {"position": {}}}, run, keep=1)
    (run / "last.pt").unlink()
    (run / "last.pt").write_bytes(b"damaged")
    path, resumed = checkpoint.latest_resumable(run)
    assert path == run / "checkpoint-7.pt" and "train" in resumed
    err = capsys.readouterr().err
    assert f"warning: {run / 'last.pt'}: not a readable mt checkpoint" in err
    assert f"resuming from {run / 'checkpoint-7.pt'} (step 7)" in err


def test_the_last_k_checkpoints_are_kept_and_a_damaged_last_falls_back(data, straight, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    train(one_thread_config(data, max_steps=30, keep_checkpoints=2), run, progress=False)
    assert sorted(p.name for p in run.glob("checkpoint-*.pt")) == ["checkpoint-20.pt", "checkpoint-30.pt"]
    assert_same_saved_weights(run / "checkpoint-20.pt", straight / "checkpoint-20.pt")

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
    assert_same_saved_weights(last, straight / "checkpoint-40.pt")
    assert_same_saved_weights(run / "checkpoint-30.pt", straight / "checkpoint-30.pt")  # rewritten whole


def test_keep_checkpoints_zero_keeps_last_alone_and_nothing_readable_is_a_clear_error(data, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    train(one_thread_config(data, max_steps=10, keep_checkpoints=0), run, progress=False)
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
    with pytest.raises(checkpoint.MtError,
                       match=f"{path}: cannot write: the disk is full; the previous file there is unchanged"):
        checkpoint.save({"model": {"w": torch.zeros(10_000)}, "config": {}, "spm": {}, "step": 2}, path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["last.pt"]
