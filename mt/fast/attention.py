"""Attention in plain matmuls, for the few queries of a decoding step and where PyTorch's fused CPU kernel is the
slower one in training (a fast path of mt/fast/); both compute `mt.model.transformer.attention`."""

from __future__ import annotations

import torch
from torch import Tensor

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
    """`mt.model.transformer.attention`, step by step in matmuls where PyTorch's fused kernel is the slower one in CPU
    training (forward and backward): with attention dropout (no fused CPU kernel has it), in bf16 (its fused
    backward is slow), and in fp32 over few keys on more than one thread (on one, as each process of a per-core run
    has, the fused kernel is the faster). Everywhere else, the fused kernel."""
    if q.device.type == "cpu" and q.requires_grad and not torch.compiler.is_compiling() and (
            p_drop > 0.0 or q.dtype != torch.float32 or (k.size(-2) <= 64 and torch.get_num_threads() > 1)):
        return matmul_attention(q, k, v, mask, p_drop, causal)
    return attention(q, k, v, mask, p_drop, causal)
