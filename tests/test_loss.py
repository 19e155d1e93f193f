import pytest
import torch
import torch.nn.functional as F

import mt.loss
from mt.loss import label_smoothed_nll, output_loss
from mt.tokenizer import PAD


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


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_output_loss_matches_logits_then_loss(monkeypatch, smoothing):
    monkeypatch.setattr(mt.loss, "BLOCK", 3 * 50)  # blocks of 3 rows: the last one short
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(13, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    target = torch.randint(4, 50, (13,), generator=g)
    target[[0, 11]] = PAD
    fused = output_loss(hidden, weight, target, smoothing, PAD)
    grads = torch.autograd.grad(0.7 * fused, (hidden, weight))
    ref = label_smoothed_nll(hidden @ weight.t(), target, smoothing, PAD)
    ref_grads = torch.autograd.grad(0.7 * ref, (hidden, weight))
    torch.testing.assert_close(fused, ref)
    for ours, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(ours, theirs)
    with torch.no_grad():  # validation-style use computes no gradients but the same loss
        torch.testing.assert_close(output_loss(hidden, weight, target, smoothing, PAD), ref.detach())
