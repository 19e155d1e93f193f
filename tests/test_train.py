import numpy as np
import pytest
import torch

from mt.config import Config, ModelConfig
from mt.data import batch_by_tokens, pad
from mt.model import Transformer
from mt.search import greedy
from mt.tokenizer import BOS, EOS, PAD
from mt.train import label_smoothed_loss, learning_rate, train_step


def test_learning_rate_warms_up_then_decays_as_inverse_sqrt():
    peak, warmup = 1e-3, 100
    assert learning_rate(1, peak, warmup) == pytest.approx(peak / 100)
    assert learning_rate(100, peak, warmup) == pytest.approx(peak)
    assert learning_rate(400, peak, warmup) == pytest.approx(peak / 2)
    assert max(learning_rate(s, peak, warmup) for s in range(1, 1000)) == pytest.approx(peak)


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
