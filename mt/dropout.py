"""Dropout that is cheap on CPU.

`F.dropout` on CPU draws its mask with `bernoulli_`, which took 3x as long as drawing uniform numbers with
`rand_like` and comparing (machine B, an AMD EPYC): in a training step of the Multi30k recipe model its 40-odd
dropouts cost a fifth of the step. `dropout` draws the mask that way on CPU, keeps it as the scaled float mask
(one multiply forward, one backward) and is `F.dropout` everywhere else (GPU, `torch.compile`, which fuse it).
Each element is kept with probability 1 - p and scaled by 1 / (1 - p), as `F.dropout` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MaskDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        mask = torch.rand_like(x).ge_(p).mul_(1 / (1 - p))  # 0 or 1 / (1 - p)
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
