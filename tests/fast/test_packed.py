"""Training on real tokens only (mt/fast/packed.py) computes the plain path's loss and gradients."""

import pytest
import torch

import mt.fast.packed
from mt.config import ModelConfig
from mt.data.tokenizer import BOS, EOS, PAD
from mt.fast.packed import packed_loss
from mt.fast.paths import fast_paths, for_training
from mt.model.transformer import Transformer, teacher_forced_loss

pytestmark = pytest.mark.numerics


def padded_batch(src_lens, tgt_lens, vocab=50, seed=0):
    """src (B, S) and tgt_in, tgt_out (B, T) as mt collates them: right-padded, EOS ending each source."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(src_lens), max(src_lens)), PAD)
    tgt_in = torch.full((len(tgt_lens), max(tgt_lens) + 1), PAD)
    tgt_out = tgt_in.clone()
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens, strict=True)):
        src[i, :s - 1], src[i, s - 1] = torch.randint(4, vocab, (s - 1,), generator=g), EOS
        words = torch.randint(4, vocab, (t,), generator=g)
        tgt_in[i, 0], tgt_in[i, 1:t + 1] = BOS, words
        tgt_out[i, :t], tgt_out[i, t] = words, EOS
    return src, tgt_in, tgt_out


def loss_and_grads(loss_fn, model, batch):
    model.zero_grad()
    loss = loss_fn(model, *batch, 0.1)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_the_layers_on_real_tokens_compute_the_padded_batchs_loss_and_gradients(norm):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=64, dropout=0.0,
                                    norm=norm, src_vocab_size=50, tgt_vocab_size=50)).train()
    batch = padded_batch([7, 3, 5, 7], [2, 6, 4, 1])  # padding on both sides, a sentence without any
    taken = []
    plain = loss_and_grads(teacher_forced_loss, model, batch)
    real = loss_and_grads(lambda *args: taken.append(1) or packed_loss(*args), model, batch)
    for ours, theirs in zip(real, plain, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    assert taken and any(p.abs().sum() > 0 for p in real[1:])


def test_a_batch_without_padding_takes_the_plain_path(monkeypatch):
    model = Transformer(ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64, dropout=0.0,
                                    src_vocab_size=50, tgt_vocab_size=50))
    packed = []
    monkeypatch.setattr(mt.fast.packed.Padding, "pack", lambda *args: packed.append(1))
    loss = packed_loss(model, *padded_batch([4, 4], [3, 3]), 0.1)
    assert not packed and torch.isfinite(loss)


def test_training_fast_paths_include_it():
    model = for_training(Transformer(ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                 src_vocab_size=50, tgt_vocab_size=50)))
    assert model.teacher_forced_loss is packed_loss
    assert "padding: skipped outside attention" in fast_paths(model)
