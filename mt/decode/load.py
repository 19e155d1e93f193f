"""A checkpoint made ready to translate with: its model (one, an ensemble, or one reranked by others, with the
inference fast paths of mt/fast/ unless loaded plain), config and tokenizers. The file format itself is
mt/checkpoint.py's."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from mt.checkpoint import load, towards
from mt.config import Config, from_dict
from mt.data.tokenizer import Tokenizer
from mt.decode.ensemble import Ensemble
from mt.decode.rerank import Channel, Reranked
from mt.fast.paths import for_inference
from mt.model.transformer import Transformer, count_parameters


@dataclass
class Loaded:
    """A checkpoint ready to translate with: its model (with the inference fast paths of mt/fast/, unless loaded
    plain), config and tokenizers."""

    model: torch.nn.Module
    config: Config
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    state: dict[str, Any]
    parameters: int = 0  # the trained model's, counted before any fast path replaced its layers
    lead: list[int] = field(default_factory=list)  # what leads every source: a two-way model's target tag



def load_model(path: str | Path, device: torch.device | str = "cpu", precision: str | None = "fp32",
               to: str | None = None) -> Loaded:
    return from_state(towards(load(path), to, path), device, precision)


def from_state(state: dict[str, Any], device: torch.device | str = "cpu", precision: str | None = "fp32") -> Loaded:
    """A checkpoint's state (as `load` returns it) made ready to translate with in `precision` (see
    `mt.fast.paths.for_inference`); precision None keeps the plain model."""
    cfg = from_dict(state["config"])
    members = [built(cfg, one, device, precision) for one in state.get("members") or [state["model"]]]
    parameters = sum(count for _, count in members)
    model = Ensemble([m for m, _ in members]) if len(members) > 1 else members[0][0]
    right = channel = None
    if "reranker" in state:
        backward = replace(cfg, model=replace(cfg.model, right_to_left=True))
        right, count = built(backward, state["reranker"], device, precision)
        parameters += count
    src_tok, tgt_tok = Tokenizer(state["spm"]["src"]), Tokenizer(state["spm"]["tgt"])
    lead = [src_tok.tag_id(state["langs"]["tgt"])] if cfg.train.two_way else []
    if "channel" in state:
        reverse = from_state(state["channel"], device, precision)
        channel, parameters = Channel(reverse, src_tok, tgt_tok, lead), parameters + reverse.parameters
    if right is not None or channel is not None:
        model = Reranked(model, right, channel)
    return Loaded(model, cfg, src_tok, tgt_tok, state, parameters, lead)


def built(cfg: Config, state_dict: dict[str, Any], device: torch.device | str, precision: str | None
          ) -> tuple[torch.nn.Module, int]:
    """The model of `cfg` with `state_dict`, ready to translate in `precision`, and its parameter count."""
    model = Transformer(cfg.model)
    model.load_state_dict(state_dict)
    model.to(device).eval()
    parameters = count_parameters(model)
    return (model if precision is None else for_inference(model, precision)), parameters
