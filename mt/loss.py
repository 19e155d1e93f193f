"""Label-smoothed cross-entropy, summed over non-padding targets, with a hand-written backward.

The result equals `F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=eps, reduction="sum")`
(tests/test_loss.py checks values and gradients). It exists for speed: with a large vocabulary the (N, V) logits
are the biggest tensor of a training step, and PyTorch's composite version walks them about ten times
(log-softmax, a zero-filled NLL gradient, the smoothing gradient, their sum, the log-softmax backward). Here the
forward makes one log-softmax and the backward turns it, in place, into the gradient
softmax(logits) - (1 - eps) * onehot(target) - eps / V, scaled per row: no other (N, V) tensor is allocated.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float, ignore_index: int) -> Tensor:
        logp = torch.log_softmax(logits, dim=-1)  # (N, V); kept for the backward, which turns it into softmax
        nll = -logp.gather(1, target.clamp(min=0)[:, None]).squeeze(1)
        loss = nll if smoothing == 0 else (1 - smoothing) * nll - smoothing * logp.mean(dim=-1)
        keep = target != ignore_index
        ctx.save_for_backward(logp, target, keep)
        ctx.smoothing = smoothing
        return (loss * keep).sum()

    @staticmethod
    def backward(ctx, grad: Tensor):
        logp, target, keep = ctx.saved_tensors
        eps, vocab = ctx.smoothing, logp.size(-1)
        g = logp.exp_()  # softmax, in place: the saved log-probabilities are not needed again
        if eps:
            g.sub_(eps / vocab)
        rows = torch.arange(g.size(0), device=g.device)
        g[rows, target.clamp(min=0)] -= 1 - eps
        g.mul_((keep * grad).to(g.dtype)[:, None])
        return g, None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int) -> Tensor:
    """Summed loss over rows whose target is not `ignore_index`; logits (N, V) in float32, target (N,)."""
    return _SmoothedCrossEntropy.apply(logits, target, smoothing, ignore_index)
