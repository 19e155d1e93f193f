"""Dropout that is cheap on CPU (a fast path of mt/fast/).

`F.dropout` on CPU draws its mask with `bernoulli_`, slower than drawing uniform numbers and comparing, and a
training step has dozens of dropouts. PyTorch's CPU generator is serial and makes 32 random bits at a time, so
the cheapest mask spends as few bits as it can: `keep_mask` compares 16-bit integers, four from each 64 random
bits. `dropout` keeps the mask as a scaled float mask (one multiply forward, one backward) and is `F.dropout`
everywhere else (GPU, `torch.compile`, which fuse it). Each element is kept with probability 1 - p (to within 1/65536)
and scaled by 1 / (1 - p), as `F.dropout` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A mask shaped as x, in its dtype: 1 / (1 - p) with probability 1 - p (to within 1/65536), else 0. Four
    uniform 16-bit integers come from each 64 random bits, where `rand_like` spends 32 bits on each element."""
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-2**63, None)  # all 64 bits
    mask = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ge(bits.view(torch.int16)[:n].view(x.shape), round(p * 65536) - 32768, out=mask)
    return mask.mul_(1 / (1 - p))


class MaskDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        mask = keep_mask(x, p)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout(x, p, training), with the CPU mask drawn the fast way (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if x.device.type == "cpu" and 0.0 < p < 1.0 and not torch.compiler.is_compiling():
        return MaskDropout.apply(x, p)
    return F.dropout(x, p, training)


class Dropout(nn.Dropout):
    """nn.Dropout on `dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
