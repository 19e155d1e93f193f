import functools
import json

import numpy as np
import pytest
import torch

from mt import checkpoint
from mt.config import Config, ModelConfig, TrainConfig, resume_config
from mt.data import Batch, Split, batch_by_tokens, pad, shift_targets
from mt.errors import MtError
from mt.model import Transformer
from mt.optim import adam, cooldown_factor, learning_rate
from mt.search import greedy
from mt.tokenizer import EOS, PAD
from mt.train import train_step

from .conftest import prepare_corpus


def test_learning_rate_warms_up_then_decays_as_inverse_sqrt():
    peak, warmup = 1e-3, 100
    assert learning_rate(1, peak, warmup) == pytest.approx(peak / 100)
    assert learning_rate(100, peak, warmup) == pytest.approx(peak)
    assert learning_rate(400, peak, warmup) == pytest.approx(peak / 2)
    assert max(learning_rate(s, peak, warmup) for s in range(1, 1000)) == pytest.approx(peak)


def test_cooldown_holds_the_rate_then_brings_it_linearly_to_zero_at_the_end_of_the_budget():
    assert cooldown_factor(0.5, 0.0) == cooldown_factor(1.0, 0.0) == 1.0  # no cooldown
    assert cooldown_factor(0.0, 0.2) == 1.0
    assert cooldown_factor(0.8, 0.2) == pytest.approx(1.0)
    assert cooldown_factor(0.9, 0.2) == pytest.approx(0.5)
    assert cooldown_factor(1.0, 0.2) == cooldown_factor(1.3, 0.2) == 0.0


@pytest.mark.parametrize("grad_scale", [1e-3, 1.0, 1e3])
def test_weight_decay_shrinks_each_weight_by_lr_times_decay_whatever_the_gradient(grad_scale):
    # Decoupled (AdamW): the shrink is lr * weight_decay of the weight, on top of Adam's step, which is the same
    # for any scale of the gradient. As L2 inside the gradient it would be normalised away by Adam's denominator.
    w = torch.nn.Parameter(torch.full((3,), 2.0))
    optimizer = adam([w], TrainConfig(lr=0.1, weight_decay=0.5, eps=1e-12))
    w.grad = torch.full((3,), grad_scale)
    optimizer.step()
    adam_step = 0.1  # Adam's first step is lr * sign(gradient)
    torch.testing.assert_close(w.detach(), torch.full((3,), 2.0 * (1 - 0.1 * 0.5) - adam_step))


def test_tiny_model_learns_to_copy():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    vocab = 20
    cfg = Config(model=ModelConfig(d_model=64, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=128, dropout=0.0,
                                   max_len=32, src_vocab_size=vocab, tgt_vocab_size=vocab))
    cfg.train.label_smoothing = 0.0
    model = Transformer(cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def sample(n):
        return [rng.integers(4, vocab, size=rng.integers(3, 10)).tolist() for _ in range(n)]

    for step in range(400):
        seqs = sample(64)
        tgt_in, tgt_out = shift_targets(seqs)
        batch = Batch(pad(seqs, [], [EOS]), tgt_in, tgt_out, int((tgt_out != PAD).sum()))
        model.train()
        train_step(model, optimizer, scaler, [batch], cfg, torch.device("cpu"), None,
                   learning_rate(step + 1, 2e-3, 50))
    model.eval()
    test = sample(50)
    hyps = []
    for idx in batch_by_tokens([len(s) + 1 for s in test], 200):
        out = greedy(model, pad([test[i] for i in idx], [], [EOS]), max_len_a=1.0, max_len_b=3)
        hyps += [(test[i], h.tokens) for i, h in zip(idx, out, strict=True)]
    exact = sum(src == hyp for src, hyp in hyps) / len(hyps)
    assert exact >= 0.9, f"copied {exact:.0%} of sequences exactly"


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
    from mt.train import train

    return train(cfg, run, resume=resume, progress=False)


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def as_written_by_earlier_versions(path, ema: float = 0.0) -> None:
    """Rewrite a resumable checkpoint as earlier versions wrote it: `best_bleu` and `stale` for today's names and
    `train.ema` in its config; with `ema`, the raw weights as "weights" and their moving average as "model"."""
    state = checkpoint.load(path)
    saved = state["train"]
    saved["best_bleu"] = saved.pop("best_score")
    saved["position"]["stale"] = saved["position"].pop("validations_since_best")
    state["config"]["train"]["ema"] = ema
    if ema:
        saved["weights"] = state["model"]
        state["model"] = {name: tensor * 0.5 for name, tensor in state["model"].items()}  # some other weights
    checkpoint.save(state, path)


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


def test_a_run_that_kept_a_moving_average_goes_on_from_its_raw_weights(prepared, tmp_path, capsys):
    # train.ema is gone; a run written with it resumes from the raw weights, and its best score (the average's)
    # no longer counts.
    train_run(small_config(prepared, max_steps=30), tmp_path / "straight")
    train_run(small_config(prepared, max_steps=20), tmp_path / "resumed")
    as_written_by_earlier_versions(tmp_path / "resumed" / "last.pt", ema=0.9)
    cfg = resume_config(tmp_path / "resumed", ["train.max_steps=30"])
    train_run(cfg, tmp_path / "resumed", resume=True)
    assert_same_weights(checkpoint.load(tmp_path / "straight" / "last.pt")["model"],
                        checkpoint.load(tmp_path / "resumed" / "last.pt")["model"])
    [note] = [line for line in capsys.readouterr().err.splitlines() if "train.ema" in line]
    assert note.startswith("note: ") and "validation and best.pt start afresh from step 20" in note
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


def test_validation_loss_is_per_target_token_whatever_the_batching(prepared):
    from mt.validate import validation_metrics

    cfg = small_config(prepared, valid_bleu=False)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 40
    model = Transformer(cfg.model)
    losses = []
    for max_tokens in (32, 1024):  # one sentence a batch, and all of them in one padded batch
        cfg.train.max_tokens = max_tokens
        losses.append(validation_metrics(model, Split(prepared, "valid"), [], None, cfg, torch.device("cpu"),
                                         None)["valid_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_a_run_directory_is_never_overwritten(prepared, tmp_path):
    from mt.train import train

    train(small_config(prepared, max_steps=10), tmp_path / "run", progress=False)
    with pytest.raises(MtError, match="already holds a run; pass --resume"):
        train(small_config(prepared, max_steps=10), tmp_path / "run", progress=False)


def test_vocabulary_mismatch_is_a_clear_error(prepared, tmp_path):

    from mt.train import train

    cfg = small_config(prepared, max_steps=10)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 999
    with pytest.raises(MtError, match="vocabulary of"):
        train(cfg, tmp_path / "run", progress=False)
