"""Encoder-decoder attention of a translation: the weights, word alignments drawn from them, and heatmaps.

The weights are those of teacher-forced decoding: the decoder reads BOS + target pieces, and the row for
target position t is the attention of the step that predicts output token t (the pieces, then EOS). They are
`CrossAttention.weights` of what each decoder layer's `cross_attn` receives, captured with forward hooks, so the
model and its fused attention kernel stay as they are. An ensemble's are the mean of its members'.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mt.data.batches import batch_by_tokens, pad, shift_targets
from mt.data.tokenizer import EOS, PAD
from mt.model.transformer import Transformer

if TYPE_CHECKING:  # matplotlib loads when a heatmap is drawn
    from matplotlib.figure import Figure


@torch.inference_mode()
def cross_attention(model: Transformer, src: Tensor, tgt: Tensor) -> Tensor:
    """Attention weights (B, L, H, T, S) of every decoder layer's cross-attention, L = decoder layers.

    `src` (B, S) is a padded source batch (pieces + EOS), `tgt` (B, T) the decoder input (BOS + pieces,
    right-padded). Each row sums to 1 over the source's non-padding positions and is 0 on padding; rows of
    target padding are all 0.
    """
    if hasattr(model, "cross_attention"):  # a kind that holds other models (an ensemble, a reranked model) says
        return model.cross_attention(src, tgt)
    captured: list[Tensor] = []

    def capture(module, args, output) -> None:
        x, k, _, src_mask = args  # what the layer passed to CrossAttention.forward: k is (B, H, S, Dh)
        captured.append(module.weights(x, k, src_mask))  # (B, H, T, S)

    hooks = [layer.cross_attn.register_forward_hook(capture) for layer in model.decoder]
    try:
        memory, src_mask = model.encode(src)
        model.decode(tgt, memory, src_mask)
    finally:
        for hook in hooks:
            hook.remove()
    weights = torch.stack(captured, dim=1)  # (B, L, H, T, S)
    return weights * (tgt != PAD)[:, None, None, :, None]


def pair_attention(model: Transformer, srcs: list[list[int]], tgts: list[list[int]],
                   batch_tokens: int = 4096) -> list[Tensor]:
    """Cross-attention for each (source pieces, target pieces) pair, batched: (L, H, len(tgt)+1, len(src)+1)
    per pair, trimmed of padding; the last row is the step that predicts EOS, the last column the source's EOS."""
    device = next(model.parameters()).device
    out: list[Tensor] = [torch.empty(0)] * len(srcs)
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(srcs, tgts, strict=True)]
    for idx in batch_by_tokens(lengths, batch_tokens):
        src = pad([srcs[i] for i in idx], [], [EOS]).to(device)
        tgt_in, _ = shift_targets([tgts[i] for i in idx])  # the decoder reads BOS + pieces
        weights = cross_attention(model, src, tgt_in.to(device)).cpu()
        for row, i in enumerate(idx):
            out[i] = weights[row, :, :, :len(tgts[i]) + 1, :len(srcs[i]) + 1]
    return out


def select(weights: Tensor, layer: int | None = None, head: int | None = None) -> Tensor:
    """One (T, S) map from (L, H, T, S) weights: a layer's or the average of all layers; a head of that layer
    or the average of its heads. A head without a layer is refused: heads of different layers are unrelated."""
    if head is not None and layer is None:
        raise ValueError("a head is chosen within a layer: give the layer too")
    per_layer = weights.mean(dim=0) if layer is None else weights[layer]  # (H, T, S)
    return per_layer.mean(dim=0) if head is None else per_layer[head]


def alignments(weights: Tensor, layer: int | None = None, head: int | None = None) -> list[tuple[int, int]]:
    """Hard alignments (source index, target index), one per target piece: the source piece it attends to most.

    As in fairseq's `extract_hard_alignment`, EOS is left out on both sides: the EOS row is not a piece of
    the output, and the source's EOS is where attention rests when nothing else fits. By default the map is
    the average over all layers and heads; `layer`/`head` pick one (see `select`).
    """
    attn = select(weights, layer, head)[:-1, :-1]  # (T-1, S-1): pieces only
    if attn.size(1) == 0:
        return []  # an empty source: nothing to align to
    return [(int(s), t) for t, s in enumerate(attn.argmax(dim=1).tolist())]


def pharaoh(pairs: list[tuple[int, int]]) -> str:
    """Alignments as one line of `src-tgt` index pairs (0-based), the format of fast_align and Moses."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


def heatmap(weights: Tensor, src_pieces: list[str], tgt_pieces: list[str], path: Path, layer: int | None = None,
            head: int | None = None) -> Path:
    """Draw the (T, S) attention map chosen by `layer`/`head` as a PNG: target pieces down, source across."""
    # Drawing needs matplotlib: imported here, so that translating without heatmaps starts without it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    attn = select(weights, layer, head).float().numpy()
    if attn.shape != (len(tgt_pieces), len(src_pieces)):
        raise ValueError(f"weights are {attn.shape} (target, source) but there are {len(tgt_pieces)} target "
                         f"and {len(src_pieces)} source pieces")
    n_layers, n_heads = weights.shape[:2]
    # Grow with the sentence so every piece keeps a legible cell; cap so a long line stays a sane image.
    width = min(max(4.0, 2.5 + 0.3 * len(src_pieces)), 30.0)
    height = min(max(3.0, 1.8 + 0.3 * len(tgt_pieces)), 30.0)
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    image = ax.imshow(attn, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(src_pieces)), [label(p) for p in src_pieces], rotation=90)
    ax.set_yticks(range(len(tgt_pieces)), [label(p) for p in tgt_pieces])
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    which_layer = f"layer {layer}" if layer is not None else f"mean of {n_layers} layers"
    which_head = f"head {head}" if head is not None else f"mean of {n_heads} heads"
    ax.set_title(f"cross-attention, {which_layer}, {which_head}", fontsize="medium")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return save_figure(fig, Path(path))


def label(piece: str) -> str:
    return piece.replace("$", r"\$")  # a piece with two dollar signs would otherwise be read as TeX math


def to_pieces(sp, ids: list[int]) -> list[str]:
    """Axis labels: the SentencePiece pieces (▁ marks a word start), then the EOS the model also attends to."""
    return [sp.id_to_piece(i) for i in ids] + ["</s>"]


def save_figure(fig: Figure, path: Path) -> Path:
    """Write `fig` as a PNG under a temporary name, then rename: a reader never sees half an image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
