import pytest
import torch
from torch import nn

from mt.config import ModelConfig, TrainConfig
from mt.model.transformer import CrossAttention, SelfAttention, Transformer
from mt.train.optim import LateDropout, adam, cooldown_factor, learning_rate


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


def test_late_dropout_turns_every_dropout_off_for_its_epochs_then_back_to_the_models_rates():
    model = Transformer(ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64, dropout=0.3,
                                    attn_dropout=0.2, act_dropout=0.1, src_vocab_size=20, tgt_vocab_size=20))

    def rates() -> set[float]:
        return ({m.p for m in model.modules() if isinstance(m, nn.Dropout)}
                | {m.dropout for m in model.modules() if isinstance(m, (SelfAttention, CrossAttention))})

    late = LateDropout(model, 2)
    late.at(0)
    assert rates() == {0.0}
    late.at(1)
    assert rates() == {0.0}
    late.at(2)
    assert rates() == {0.3, 0.2, 0.1}
    LateDropout(model, 0).at(0)
    assert rates() == {0.3, 0.2, 0.1}
