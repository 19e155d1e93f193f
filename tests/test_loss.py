import pytest
import torch
import torch.nn.functional as F

from mt.loss import label_smoothed_nll
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
