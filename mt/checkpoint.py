"""Checkpoints: self-contained (weights, resolved config, SentencePiece models), written atomically, loaded safely.

A checkpoint is a plain dict saved with `torch.save`:
  model: state_dict · config: the resolved config as a dict · spm: {"src": bytes, "tgt": bytes} ·
  langs: {"src": "de", "tgt": "en"} · step, epoch, batch (position within the epoch) · metrics ·
  and, in `last.pt` only, the training state: optimizer, scheduler, scaler, rng.
Loading uses `weights_only=True`: a checkpoint file can never run code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mt.config import Config, from_dict
from mt.model import Transformer
from mt.tokenizer import Tokenizer


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and what to do."""


def save(state: dict[str, Any], path: str | Path) -> None:
    """Write to a temporary name, fsync, then rename: a crash at any point leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt, or not a checkpoint at all
        raise CheckpointError(f"{path}: not a readable mt checkpoint ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not {"model", "config", "spm"} <= state.keys():
        raise CheckpointError(f"{path}: not an mt checkpoint (no model/config/spm entries)")
    return state


@dataclass
class Loaded:
    """A checkpoint ready to translate with."""

    model: Transformer
    config: Config
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    state: dict[str, Any]


def load_model(path: str | Path, device: torch.device | str = "cpu") -> Loaded:
    state = load(path)
    cfg = from_dict(state["config"])
    model = Transformer(cfg.model)
    model.load_state_dict(state["model"])
    model.to(device).eval()
    return Loaded(model, cfg, Tokenizer(state["spm"]["src"]), Tokenizer(state["spm"]["tgt"]), state)
