import pickle

import pytest
import torch

from mt import checkpoint
from mt.checkpoint import load_model
from mt.config import Config, to_dict
from mt.errors import MtError

from .conftest import tiny_model


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
