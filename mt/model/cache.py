"""The decoder's KV cache: what incremental decoding carries from one step to the next, and how beam search
reorders it. `Transformer.start_cache` makes one and `decode_step` returns it one position longer
(mt/model/transformer.py); nothing is kept on the modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from mt.device import reads_wait


@dataclass
class DecoderCache:
    """Everything incremental decoding needs between steps, per decoder layer.

    Rows of the self-attention buffers are (sentence × beam), a sentence's `beam` rows side by side; the encoder
    memory has one row per sentence. `decode_step` writes into the self-attention buffers in place and returns
    the cache one position longer: a cache is used once, then replaced by the one returned.
    """

    mem_k: list[Tensor]  # (n, H, S, Dh) per layer: the encoder output's cross-attention keys, computed once
    mem_v: list[Tensor]
    self_k: list[Tensor]  # (L, n * beam, H, Dh) per layer: keys of the target prefix, positions [0, length) filled
    self_v: list[Tensor]
    src_mask: Tensor  # (n, 1, 1, S)
    length: int = 0  # target positions decoded so far
    beam: int = 1
    move_rows: Callable[[DecoderCache, list[int], list[int]], None] | None = None  # in place; None: PyTorch's copies

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> DecoderCache:
        """Keep (and reorder) the rows in `rows` of the target-side state, e.g. to follow the beams, and, when
        sentences finish, the `sentences` kept of the encoder side. `rows` must stay grouped by sentence.

        Only the filled positions are copied: time-major buffers make `buf[:length]` one contiguous block. While
        all sentences stay, only the rows that change are copied, in place (beam search keeps most beams in
        their row), where finding them costs no wait for the device (on a CPU): in C for the C decoding step's
        few rows, however many move. Fewer rows, or most of them moved, are gathered to the front of the same
        buffers (`compacted`). Either way this cache's buffers are reused, as `decode_step` reuses them: this cache
        must not be used again.
        """
        width = self.self_k[0].size(1)

        def at_filled(r: Tensor) -> Tensor:
            """Rows r at every filled position, as indices into a buffer's `as_rows` view."""
            return (torch.arange(self.length, device=r.device)[:, None] * width + r).view(-1)

        if sentences is None and rows.numel() == width and self.move_rows is not None:  # a few rows, copied in C
            listed = rows.tolist()
            moved = [i for i, r in enumerate(listed) if r != i]
            if moved:  # however many: C copies only them, each a few contiguous floats a position
                self.move_rows(self, moved, [listed[i] for i in moved])
            return self
        elif sentences is None and rows.numel() == width and not reads_wait(rows):  # which rows moved is a read
            moved = (rows != torch.arange(rows.numel(), device=rows.device)).nonzero().squeeze(1)
            if moved.numel() < width // 2:
                to, src = at_filled(moved), at_filled(rows[moved])
                for buf in self.self_k + self.self_v:
                    flat = as_rows(buf)
                    flat.index_copy_(0, to, flat.index_select(0, src))  # sources read before any write
                return self
        picked = at_filled(rows)

        def pick_filled(buf: Tensor) -> Tensor:
            if rows.numel() <= width:
                return compacted(buf, picked, rows.numel())
            new = buf.new_empty((buf.size(0), rows.numel(), *buf.shape[2:]))
            torch.index_select(as_rows(buf), 0, picked, out=as_rows(new)[:picked.numel()])
            return new

        mem_k, mem_v, src_mask = self.mem_k, self.mem_v, self.src_mask
        if sentences is not None:
            mem_k = [k.index_select(0, sentences) for k in mem_k]
            mem_v = [v.index_select(0, sentences) for v in mem_v]
            src_mask = src_mask.index_select(0, sentences)
        return DecoderCache(mem_k, mem_v, [pick_filled(k) for k in self.self_k], [pick_filled(v) for v in self.self_v],
                            src_mask, self.length, self.beam)

    def widen(self, beam: int) -> DecoderCache:
        """This cache of one row per sentence as `beam` identical rows per sentence, side by side: beam search
        decodes its first step, where all of a sentence's beams are alike, one row per sentence."""
        if self.beam != 1:
            raise ValueError(f"only a cache of one row per sentence widens, not one of {self.beam}")
        rows = torch.arange(self.self_k[0].size(1), device=self.src_mask.device).repeat_interleave(beam)
        return replace(self.select(rows), beam=beam, move_rows=self.move_rows)


# Floats gathered at a time by `compacted`: a temporary under glibc's mmap threshold as mt/memory.py sets it (32 MiB),
# so that its memory is reused, not faulted in anew.
CHUNK = 2 ** 21


def compacted(buf: Tensor, picked: Tensor, rows: int) -> Tensor:
    """The (L, B, H, Dh) buffer's filled rows `picked` (as `at_filled` lists them: position-major, `rows` a
    position) as an (L, rows, H, Dh) buffer at the front of its own memory, rows <= B. A new buffer's pages would
    be faulted in and zeroed by the kernel (over 32 MiB, glibc maps them afresh), at every later write too; these
    are already in use. Position chunks are gathered in turn: chunk [t0, t1) lands below t1 * B, where no position
    not yet gathered lies."""
    row = buf[0, 0].numel()
    new = buf.view(-1)[:buf.size(0) * rows * row].view(buf.size(0), rows, *buf.shape[2:])
    source, target = as_rows(buf), as_rows(new)
    per_chunk = max(1, CHUNK // (rows * row)) * rows
    for start in range(0, picked.numel(), per_chunk):
        part = picked[start:start + per_chunk]
        target[start:start + part.numel()] = source.index_select(0, part)
    return new


def as_rows(buf: Tensor) -> Tensor:
    """A (L, B, H, Dh) buffer as (L * B, H * Dh) rows: indexing whole rows of a 2-D tensor is the fastest copy."""
    return buf.view(-1, buf.size(2) * buf.size(3))
