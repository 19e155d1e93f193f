"""Forced decoding: the log-probability a model gives to a known translation of each source.

Useful to rank candidate translations, filter noisy corpora, or check that a model prefers the reference.
The score of a pair is log P(target pieces, EOS | source), natural log, summed over the target's tokens:
more negative means less likely, and longer targets score lower.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mt.data.lines import check_aligned, read_text
from mt.decode.load import Loaded, load_model
from mt.decode.search import score_ids
from mt.device import pick_device
from mt.errors import MtError
from mt.options import DEVICE


def score_files(checkpoint: Path, src: Path, tgt: Path, batch_tokens: int | None = None, device: str = DEVICE,
                progress: bool = True) -> list[float]:
    """`score_pairs` of the line-aligned files `src` and `tgt` under the model in `checkpoint`."""
    sources, targets = read_text(src), read_text(tgt)
    check_aligned(src, len(sources), tgt, len(targets))
    dev = pick_device(device)
    return score_pairs(load_model(checkpoint, dev), sources, targets, dev, batch_tokens, progress)


def score_pairs(loaded: Loaded, sources: list[str], targets: list[str], device: torch.device | str = "cpu",
                batch_tokens: int | None = None, progress: bool = False) -> list[float]:
    """Total log-probability of each target given its source (EOS included), in input order."""
    check_aligned("the source list", len(sources), "the target list", len(targets))
    srcs = [loaded.lead + s for s in loaded.src_tok.encode([s.strip() for s in sources])]  # lead: a two-way tag
    tgts = loaded.tgt_tok.encode([t.strip() for t in targets])
    limit = loaded.model.cfg.max_len - 1  # room for EOS (source) or BOS (target)
    for side, seqs in (("source", srcs), ("target", tgts)):
        for i, seq in enumerate(seqs):
            if len(seq) > limit:  # cutting would score a different sentence: refuse instead
                raise MtError(f"line {i + 1}: the {side} has {len(seq)} pieces; the model allows {limit}")
    return score_ids(loaded.model, srcs, tgts, device, batch_tokens or loaded.config.decode.batch_tokens, progress)
