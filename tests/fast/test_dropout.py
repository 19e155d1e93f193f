import pytest
import torch
from torch import nn

from mt.fast.dropout import Dropout, dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_zeroes_a_fraction_p_and_scales_the_rest_forward_and_backward(dtype):
    torch.manual_seed(0)
    x = torch.ones(200_000, dtype=dtype, requires_grad=True)
    y = dropout(x, 0.3, training=True)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - 0.3) < 0.01
    for lane in range(8):  # neighbouring elements (drawn from the same random bits) too
        assert abs(1 - kept.view(-1, 8)[:, lane].float().mean().item() - 0.3) < 0.015
    # The scale 1 / (1 - p), as F.dropout's: exact in fp32, rounded to bf16's 8 bits in bf16.
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.7))
    upstream = torch.randn(x.shape, dtype=dtype)
    (grad,) = torch.autograd.grad(y, x, upstream)
    torch.testing.assert_close(grad, upstream * y.detach())  # the same mask, the same scale (x is all ones)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x


def test_dropout_is_reproducible_from_the_seed():
    x = torch.randn(1000)
    torch.manual_seed(5)
    a = dropout(x, 0.5, True)
    torch.manual_seed(5)
    assert torch.equal(a, dropout(x, 0.5, True))


def test_the_dropout_layer_keeps_as_many_as_nn_dropout_and_is_off_in_eval_mode():
    torch.manual_seed(0)
    x = torch.ones(100_000)
    ours, theirs = Dropout(0.2)(x), nn.Dropout(0.2)(x)
    assert abs((ours != 0).float().mean() - (theirs != 0).float().mean()) < 0.01
    assert set(ours.unique().tolist()) == set(theirs.unique().tolist()) == {0.0, 1.25}
    fast = Dropout(0.2)
    assert torch.equal(fast.eval()(x), x)
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))  # p = 1 drops everything, as nn.Dropout does
