import numpy as np
import pytest
import torch

from mt import device as device_module
from mt.config import Config, ModelConfig, TrainConfig
from mt.data import batch_by_tokens, pad
from mt.device import autocast_dtype
from mt.errors import MtError
from mt.model import Transformer
from mt.search import greedy
from mt.tokenizer import BOS, EOS, PAD
from mt.train import adam, cooldown_factor, label_smoothed_loss, learning_rate, train_step

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


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_on_a_cpu_is_bf16_only_where_it_multiplies_bf16_in_hardware(monkeypatch, native):
    monkeypatch.setattr(device_module, "native_bf16", lambda: native)
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is (torch.bfloat16 if native else None)
    assert autocast_dtype("fp32", cpu) is None and autocast_dtype("bf16", cpu) is torch.bfloat16


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


def test_loss_ignores_padding():
    logits = torch.randn(2, 3, 10)
    target = torch.tensor([[4, 5, PAD], [6, PAD, PAD]])
    expected = label_smoothed_loss(logits[0:1, :2], target[0:1, :2], 0.1) + label_smoothed_loss(
        logits[1:2, :1], target[1:2, :1], 0.1)
    torch.testing.assert_close(label_smoothed_loss(logits, target, 0.1), expected)


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

    from mt.data import Batch
    for step in range(400):
        seqs = sample(64)
        tgt = pad(seqs, [BOS], [EOS])
        tgt_in, tgt_out = tgt[:, :-1].clone(), tgt[:, 1:]
        tgt_in[tgt_in == EOS] = PAD
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


@pytest.mark.parametrize("ema", [0.0, 0.9])
def test_resumed_run_ends_with_the_same_weights(prepared, tmp_path, ema):
    from mt import checkpoint
    from mt.train import train

    train(small_config(prepared, max_steps=30, ema=ema), tmp_path / "straight", progress=False)
    train(small_config(prepared, max_steps=20, ema=ema), tmp_path / "resumed", progress=False)
    train(small_config(prepared, max_steps=30, ema=ema), tmp_path / "resumed", resume=True, progress=False)
    a = checkpoint.load(tmp_path / "straight" / "last.pt")
    b = checkpoint.load(tmp_path / "resumed" / "last.pt")
    assert a["step"] == b["step"] == 30
    weights = [("model", a["model"], b["model"])]
    if ema:  # the moving average and the raw weights training goes on from
        weights.append(("weights", a["train"]["weights"], b["train"]["weights"]))
    for kind, wa, wb in weights:
        for name, tensor in wa.items():
            assert torch.equal(tensor, wb[name]), f"{kind}: {name}"


def test_a_run_resumed_with_ema_switched_off_goes_on_from_the_raw_weights(prepared, tmp_path, capsys):
    from mt import checkpoint
    from mt.train import train

    train(small_config(prepared, max_steps=30, ema=0.9), tmp_path / "straight", progress=False)
    train(small_config(prepared, max_steps=20, ema=0.9), tmp_path / "resumed", progress=False)
    train(small_config(prepared, max_steps=30), tmp_path / "resumed", resume=True, progress=False)
    raw = checkpoint.load(tmp_path / "straight" / "last.pt")["train"]["weights"]
    resumed = checkpoint.load(tmp_path / "resumed" / "last.pt")
    assert "weights" not in resumed["train"]
    for name, tensor in raw.items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert "train.ema is now off: validation and best.pt start afresh from step 20" in capsys.readouterr().err
    assert checkpoint.load(tmp_path / "resumed" / "best.pt")["step"] == 30  # the raw model's, not the average's


def test_with_ema_the_saved_model_is_the_moving_average_of_the_trained_weights(prepared, tmp_path):
    from mt import checkpoint
    from mt.ema import decay_at
    from mt.train import train

    run = tmp_path / "run"
    train(small_config(prepared, max_steps=40, ema=0.9, valid_every=1, keep_checkpoints=40, valid_bleu=False),
          run, progress=False)
    states = {step: checkpoint.load(path) for step, path in checkpoint.numbered(run)}
    assert sorted(states) == list(range(1, 41))
    for step in range(2, 41):
        d = decay_at(step, 0.9)
        for name, avg in states[step]["model"].items():
            expected = d * states[step - 1]["model"][name] + (1 - d) * states[step]["train"]["weights"][name]
            torch.testing.assert_close(avg, expected, msg=f"step {step}: {name}")
    raw, avg = states[40]["train"]["weights"], states[40]["model"]
    assert any(not torch.equal(raw[name], avg[name]) for name in raw)  # the average is not the raw model
    best = checkpoint.load(run / "best.pt")  # what `mt translate` uses is an average too, the best validated
    assert all(torch.equal(tensor, states[best["step"]]["model"][name]) for name, tensor in best["model"].items())


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
