"""Attention in plain matmuls, for the few queries of a decoding step and where PyTorch's fused CPU kernel is the
slower one in training (a fast path of mt/fast/); both compute `mt.model.transformer.attention`."""

from __future__ import annotations

import torch
from torch import Tensor

from mt.fast.choose import Kept, choice, rows_class
from mt.fast.dropout import dropout
from mt.model.transformer import attention


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p_drop: float = 0.0,
                     causal: bool = False) -> Tensor:
    """`mt.model.transformer.attention` in plain matmuls, its dropout mask drawn by mt.fast.dropout: for the few
    queries of a decoding step, and for CPU training where `cpu_training_attention` says so."""
    if causal:
        n = q.size(-2)
        before = torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
        mask = before if mask is None else mask & before
    scores = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    return dropout(scores.softmax(dim=-1), p_drop, p_drop > 0) @ v


def cpu_training_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p_drop: float,
                           causal: bool) -> Tensor:
    """`mt.model.transformer.attention` in CPU training (forward and backward), step by step in matmuls where this
    machine measured that the faster than PyTorch's fused kernel for this kind of shape (`steps_faster`), the fused
    kernel everywhere else."""
    if (q.device.type == "cpu" and q.requires_grad and not torch.compiler.is_compiling()
            and steps_faster(q, k, mask, p_drop, causal)):
        return matmul_attention(q, k, v, mask, p_drop, causal)
    return attention(q, k, v, mask, p_drop, causal)


_steps_faster = Kept()  # kind of shape → whether the step-by-step attention was measured the faster


def steps_faster(q: Tensor, k: Tensor, mask: Tensor | None, p_drop: float, causal: bool) -> bool:
    """Whether attention step by step, forward and backward, is this machine's faster way for q's kind of shape:
    its dtype, the batch times heads, queries and keys rounded up to powers of two, the head width, a mask, dropout,
    causality and the threads; measured once for each kind (mt/fast/choose.py). Why it can be: no fused CPU kernel
    has attention dropout, the fused bf16 backward was 3-10x slower, and over few keys on several threads the fused
    kernel's fixed costs outweigh its work (machine B, docs/performance.md)."""
    kind = (str(q.dtype).removeprefix("torch."), rows_class(q.size(0) * q.size(1)), rows_class(q.size(-2)),
            rows_class(k.size(-2)), q.size(-1), mask is not None, p_drop > 0, causal, torch.get_num_threads())
    faster = _steps_faster.get(kind)
    if faster is None:
        dtype, rows, queries, keys, width = kind[0], kind[1], kind[2], kind[3], kind[4]
        generator = torch.Generator().manual_seed(0)
        tensors = [torch.randn(rows, 1, n, width, generator=generator).to(q.dtype) for n in (queries, keys, keys)]
        keep = torch.ones(rows, 1, 1, keys, dtype=torch.bool)
        keep[:, :, :, keys - keys // 4:] = False  # a batch's padding
        shown = keep if mask is not None else None

        def forward_backward(attend):
            def call():
                leaves = [t.detach().requires_grad_() for t in tensors]
                attend(*leaves, shown, p_drop, causal).float().sum().backward()
            return call

        question = (f"training attention {dtype}, {rows} rows of {queries} queries by {keys} keys of {width}"
                    f"{', masked' if mask is not None else ''}{', dropout' if p_drop > 0 else ''}"
                    f"{', causal' if causal else ''}, {kind[-1]} threads")
        faster = _steps_faster.keep(kind, choice(question, {"fused": forward_backward(attention),
                                                            "steps": forward_backward(matmul_attention)}) == "steps",
                                    question)
    return faster
