"""Label-smoothed cross-entropy, summed over non-padding targets, with a hand-written backward; and, for training
on CPU, the output layer and this loss fused, a block of rows at a time (a fast path of mt/fast/).

The result equals `F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=eps, reduction="sum")`
(tests/fast/test_loss.py checks values and gradients). It exists for speed: with a large vocabulary the (N, V)
logits are the biggest tensor of a training step, and PyTorch's composite version walks them about ten times
(log-softmax, a zero-filled NLL gradient, the smoothing gradient, their sum, the log-softmax backward). Here the
forward makes one log-softmax and the backward turns it, in place, into the gradient
softmax(logits) - (1 - eps) * onehot(target) - eps / V, scaled per row: no other (N, V) tensor is allocated.

`output_loss` goes further on CPU, where the (N, V) logits do not fit in any cache and every pass over them
is a trip to memory: it computes the logits, the loss and the gradient (of the hidden states and of the output
weights) for up to 8M logits (32 MiB) at a time, and never holds all the logits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mt.data.tokenizer import PAD
from mt.fast.linear import linear, linear_grads, plain_cpu_fp32

# Logits per block of rows in `output_loss`: just under 32 MiB in float32, the largest block glibc keeps for reuse
# when freed (mt/memory.py); fewer, larger blocks measured faster than 8 MiB ones (docs/performance.md).
BLOCK = 2 ** 23 - 2 ** 14


def summed_loss(logp: Tensor, target: Tensor, smoothing: float, keep: Tensor) -> Tensor:
    """The loss of log-probabilities logp (N, V) summed over the rows in `keep`."""
    nll = -logp.gather(1, target.clamp(min=0)[:, None]).squeeze(1)
    loss = nll if smoothing == 0 else (1 - smoothing) * nll - smoothing * logp.mean(dim=-1)
    return (loss * keep).sum()


def loss_gradient_(logp: Tensor, target: Tensor, smoothing: float, row_scale: Tensor) -> Tensor:
    """Turns logp (N, V), in place, into the loss's gradient with respect to the logits, row i scaled by
    row_scale[i]: softmax - (1 - eps) * onehot(target) - eps / V."""
    g = logp.exp_()  # softmax
    if smoothing:
        g.sub_(smoothing / logp.size(-1))
    g[torch.arange(g.size(0), device=g.device), target.clamp(min=0)] -= 1 - smoothing
    return g.mul_(row_scale.to(g.dtype)[:, None])


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, smoothing: float, ignore_index: int) -> Tensor:
        logp = torch.log_softmax(logits, dim=-1)  # (N, V); kept for the backward, which turns it into the gradient
        keep = target != ignore_index
        ctx.save_for_backward(logp, target, keep)
        ctx.smoothing = smoothing
        return summed_loss(logp, target, smoothing, keep)

    @staticmethod
    def backward(ctx, grad: Tensor):
        logp, target, keep = ctx.saved_tensors
        return loss_gradient_(logp, target, ctx.smoothing, keep * grad), None, None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, smoothing: float, ignore_index: int) -> Tensor:
    """Summed loss over rows whose target is not `ignore_index`; logits (N, V) in float32, target (N,)."""
    return _SmoothedCrossEntropy.apply(logits, target, smoothing, ignore_index)


def output_loss(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float, bias: Tensor | None = None,
                ignore_index: int = PAD) -> Tensor:
    """`label_smoothed_nll(linear(hidden, weight, bias), target, ...)`: hidden (N, D), weight (V, D), target (N,);
    the fast path for `mt.model.transformer.output_loss`, with its signature.

    Fused on CPU in float32 (see the module docstring); everywhere else (GPU, autocast, torch.compile), and for an
    output layer with a bias (model.output_bias, an imported Marian model's), the logits are made whole, in
    float32, and given to `label_smoothed_nll`."""
    if bias is not None or not plain_cpu_fp32(hidden, weight):
        return label_smoothed_nll(linear(hidden, weight, bias).float(), target, smoothing, ignore_index)
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return _FusedOutputLoss.apply(hidden, weight, target, smoothing, ignore_index, need_grad)


def block_loss_and_gradient(logits: Tensor, target: Tensor, smoothing: float, need_grad: bool
                            ) -> tuple[Tensor, Tensor | None]:
    """The summed loss of the logits (N, V) of rows none of which is padding and, if `need_grad`, its gradient with
    respect to them, as `loss_gradient_` makes it. In the fewest passes over the logits that PyTorch's kernels
    allow: the loss needs only the target's logit, the logits' mean and the log-sum-exp, and the softmax kernel works
    a row at a time in cache, where a log-softmax followed by its exponential takes two passes and two exponentials a
    logit."""
    tgt = logits.gather(1, target[:, None]).squeeze(1)
    mean = logits.mean(dim=-1) if smoothing else None
    top = logits.amax(dim=-1)
    g = torch.softmax(logits, dim=-1)
    lse = top - g.amax(dim=-1).log()  # the largest logit's probability is 1 / sum(exp(logits - top))
    nll = lse - tgt
    loss = (nll if smoothing == 0 else (1 - smoothing) * nll + smoothing * (lse - mean)).sum()
    if not need_grad:
        return loss, None
    if smoothing:
        g.sub_(smoothing / g.size(-1))
    g[torch.arange(g.size(0), device=g.device), target] -= 1 - smoothing
    return loss, g


class _FusedOutputLoss(torch.autograd.Function):
    """The gradients are computed in the forward pass, block by block, so that the whole logits are never held;
    the backward only scales them by the incoming gradient (a scalar: the loss is a sum). Rows whose target is
    padding add nothing to the loss and get no gradient: they are left out before the output layer, whose products
    then skip them (a real batch's targets are several percent padding)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float, ignore_index: int,
                need_grad: bool) -> Tensor:
        kept = (target != ignore_index).nonzero().squeeze(1)
        every = kept.numel() == target.numel()
        states = hidden if every else hidden.index_select(0, kept)
        targets = target if every else target.index_select(0, kept)
        rows = max(1, BLOCK // weight.size(0))
        total = hidden.new_zeros(())
        grad_s = torch.empty_like(states) if need_grad else None
        grad_w = torch.zeros_like(weight) if need_grad else None
        for start in range(0, states.size(0), rows):
            h, t = states[start:start + rows], targets[start:start + rows]
            loss, g = block_loss_and_gradient(linear(h, weight), t, smoothing, need_grad)
            total += loss
            if need_grad:  # for an incoming gradient of 1
                gh, gw = linear_grads(g, h, weight)
                grad_s[start:start + rows] = gh
                grad_w += gw
        grad_h = grad_s if every or not need_grad else hidden.new_zeros(hidden.shape).index_copy_(0, kept, grad_s)
        ctx.save_for_backward(grad_h, grad_w)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is None:
            raise RuntimeError("output_loss was computed without gradients (under no_grad); it cannot backpropagate")
        return grad_h * grad, grad_w * grad, None, None, None, None

