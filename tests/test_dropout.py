import pytest
import torch
import torch.nn.functional as F

import mt.model
from mt.dropout import dropout
from mt.model import attention


def test_dropout_zeroes_a_fraction_p_and_scales_the_rest_forward_and_backward():
    torch.manual_seed(0)
    x = torch.ones(200_000, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.01
    for lane in range(8):  # neighbouring elements (drawn from the same random bits) too
        assert abs(1 - kept.view(-1, 8)[:, lane].float().mean().item() - 0.3) < 0.015
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, y.detach())  # the same mask, the same scale
    assert dropout(x, 0.3, training=False) is x


def test_dropout_is_reproducible_from_the_seed():
    x = torch.randn(1000)
    torch.manual_seed(5)
    a = dropout(x, 0.5, True)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x, 0.5, True))


@pytest.mark.parametrize("p_drop", [0.0, 0.5])
@pytest.mark.parametrize("causal", [True, False])
def test_cpu_training_attention_computes_what_sdpa_does(monkeypatch, causal, p_drop):
    monkeypatch.setattr(mt.model, "dropout", lambda x, p, training: x)  # the same computation, minus the mask
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=g) for _ in range(3))
    mask = None if causal else torch.tensor([True] * 5 + [True, True, True, False, False] + [True] + [False] * 4)
    mask = None if causal else mask.view(3, 1, 1, 5)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]  # with gradients: the step-by-step path
    ours = attention(*leaves, mask, p_drop, causal)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    torch.testing.assert_close(ours, ref)
    ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    F.scaled_dot_product_attention(*ref_leaves, attn_mask=mask, is_causal=causal).square().sum().backward()
    ours.square().sum().backward()
    for a, b in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
