
import pytest
import torch
import torch.nn.functional as F

import mt.fast.loss
import mt.model.transformer
from mt.data.tokenizer import PAD
from mt.fast.loss import label_smoothed_nll, output_loss

from .test_linear import force_cpu_matmul

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_pytorch_cross_entropy_in_value_and_gradient(smoothing):
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(12, 50, generator=g)).requires_grad_()
    target = torch.randint(4, 50, (12,), generator=g)
    target[[2, 7]] = PAD
    ours = label_smoothed_nll(logits, target, smoothing, PAD)
    (grad_ours,) = torch.autograd.grad(2.5 * ours, logits)
    ref = F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=smoothing, reduction="sum")
    (grad_ref,) = torch.autograd.grad(2.5 * ref, logits)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad_ours, grad_ref)
    assert grad_ours[2].abs().sum() == 0  # padding rows get no gradient


def loss_and_grads(loss_fn, hidden, weight, target, smoothing):
    """loss_fn(hidden, weight, target, smoothing) and the gradients of 0.7 times it for hidden and weight."""
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = loss_fn(h, w, target, smoothing)
    return [loss.detach(), *torch.autograd.grad(0.7 * loss, (h, w))]


def hidden_weight_target(seed=1, n=13):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(n, 16, generator=g), torch.randn(50, 16, generator=g)
    target = torch.randint(4, 50, (n,), generator=g)
    target[[0, 11]] = PAD
    return hidden, weight, target


@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_output_loss_computes_the_models_loss(monkeypatch, smoothing, kernel):
    force_cpu_matmul(monkeypatch, kernel)
    monkeypatch.setattr(mt.fast.loss, "BLOCK", 3 * 50)  # blocks of 3 rows: the last one short
    hidden, weight, target = hidden_weight_target()
    fused = loss_and_grads(output_loss, hidden, weight, target, smoothing)
    plain = loss_and_grads(mt.model.transformer.output_loss, hidden, weight, target, smoothing)  # F.cross_entropy
    for ours, theirs in zip(fused, plain, strict=True):
        torch.testing.assert_close(ours, theirs)  # fp32: rtol 1.3e-6, atol 1e-5
    with torch.no_grad():  # validation-style use computes no gradients but the same loss
        torch.testing.assert_close(output_loss(hidden, weight, target, smoothing), plain[0])


def test_output_loss_in_bf16_autocast_computes_the_models_loss():
    hidden, weight, target = hidden_weight_target(n=40)
    with torch.autocast("cpu", torch.bfloat16):
        fast = loss_and_grads(output_loss, hidden, weight, target, 0.1)
        plain = loss_and_grads(mt.model.transformer.output_loss, hidden, weight, target, 0.1)
    for ours, theirs in zip(fast, plain, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)  # bf16: 8 significant bits


def test_fused_output_loss_of_padding_only_is_zero_with_zero_gradients():
    hidden, weight, target = hidden_weight_target()
    loss, grad_h, grad_w = loss_and_grads(output_loss, hidden, weight, torch.full_like(target, PAD), 0.1)
    assert loss == 0 and not grad_h.any() and not grad_w.any()
