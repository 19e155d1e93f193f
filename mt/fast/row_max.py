"""Each row's maximum and the index of its first occurrence, as `Tensor.max(dim=-1)` gives them (a fast path of
mt/fast/): for greedy search, which asks it of every step's logits.

PyTorch's CPU reduction with indices runs element by element, while its plain maximum (`amax`) runs in vector
registers; `by_blocks` takes the maxima of blocks of `BLOCK` entries, the first block holding the row's maximum,
and the first index of that maximum inside it (the chunk maxima of mt/decode/hypotheses.py's `top_tokens`, which
beam search asks for the k best, where ties may come in any order). Which of the two is the faster is measured on
this machine for each kind of shape (mt/fast/choose.py). Both give the same values and indices, NaN aside.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mt.fast.choose import Kept, choice, rows_class
from mt.fast.paths import enabled

BLOCK = 64

_blocks_faster = Kept()  # (dtype, rows class, width, threads) → whether `by_blocks` was the faster


def row_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """The maximum (B,) of each row of x (B, V) and the index of its first occurrence (B,)."""
    if (x.device.type != "cpu" or x.dim() != 2 or x.size(1) < 2 * BLOCK or not enabled()
            or not blocks_faster(x)):
        return x.max(dim=-1)
    return by_blocks(x)


def by_blocks(x: Tensor) -> tuple[Tensor, Tensor]:
    rows, width = x.shape
    whole = width // BLOCK * BLOCK
    blocks = x[:, :whole].view(rows, -1, BLOCK).amax(-1)  # (B, V / BLOCK)
    if whole < width:
        blocks = torch.cat([blocks, x[:, whole:].amax(-1, keepdim=True)], dim=1)
    best, block = blocks.max(dim=-1)  # the first block holding each row's maximum
    start = block * BLOCK
    at = (start[:, None] + torch.arange(BLOCK, device=x.device)).clamp_(max=width - 1)  # a short last block repeats
    first = (x.gather(1, at) == best[:, None]).to(torch.uint8).argmax(dim=-1)  # a repeated last index comes after
    return best, start + first


def blocks_faster(x: Tensor) -> bool:
    kind = (str(x.dtype).removeprefix("torch."), rows_class(x.size(0)), x.size(1), torch.get_num_threads())
    faster = _blocks_faster.get(kind)
    if faster is None:
        sample = torch.randn(kind[1], kind[2], generator=torch.Generator().manual_seed(0)).to(x.dtype)
        question = f"row maximum {kind[0]}, {kind[1]} rows of {kind[2]}, {kind[3]} threads"
        chosen = choice(question, {"torch": lambda: sample.max(dim=-1), "blocks": lambda: by_blocks(sample)})
        faster = _blocks_faster.keep(kind, chosen == "blocks", question)
    return faster
