"""Ensembles: several models of one vocabulary translating as one, their next-token probabilities averaged.

`mt ensemble A.pt B.pt --out E.pt` writes one checkpoint holding every member's weights (`members`, a state dict
each, where a single model's checkpoint has `model`) with the first member's config and SentencePiece models.
`mt translate`, `tune`, `report`, `score` and `serve` load it as one model: at every step the members'
probabilities are averaged (the log of their mean, as fairseq and Marian ensemble), so mt's own greedy and beam
search decode it unchanged. What needs one set of weights (export, fine-tuning, attention and alignments) refuses
an ensemble and says so. A right-to-left model (`model.right_to_left`) among the checkpoints does not join the
average: it becomes the `reranker` of the others' K best (mt/decode/rerank.py), and with it one left-to-right model is
enough. So does a checkpoint of the reverse direction (the first checkpoint's languages swapped, any vocabulary or
architecture, itself an ensemble or not): it becomes the `channel`, which scores how well each of the K best
explains its source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mt import checkpoint
from mt.config import same_model
from mt.data.lines import check_not_input, check_output
from mt.decode.alignments import cross_attention
from mt.errors import MtError
from mt.model.cache import DecoderCache
from mt.runlock import writing_into


@dataclass
class EnsembleCache:
    """The members' decoder caches, rows kept in step."""

    caches: list[DecoderCache]

    def select(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleCache:
        return EnsembleCache([cache.select(rows, sentences) for cache in self.caches])

    def widen(self, beam: int) -> EnsembleCache:
        return EnsembleCache([cache.widen(beam) for cache in self.caches])


class Ensemble(nn.Module):
    """The decoding interface of `mt.model.transformer.Transformer` (encode, start_cache, decode_step, and the
    teacher-forced forward that `mt score` uses) over several of them; it returns log-probabilities where they
    return logits, which searching and scoring normalize again to the same values."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(members)
        self.cfg = members[0].cfg

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        encoded = [member.encode(src) for member in self.members]
        return [memory for memory, _ in encoded], encoded[0][1]

    def start_cache(self, memory: list[Tensor], src_mask: Tensor, max_steps: int | None = None,
                    beam: int = 1) -> EnsembleCache:
        return EnsembleCache([member.start_cache(m, src_mask, max_steps, beam=beam)
                              for member, m in zip(self.members, memory, strict=True)])

    def decode_step(self, tokens: Tensor, cache: EnsembleCache) -> tuple[Tensor, EnsembleCache]:
        steps = [member.decode_step(tokens, c) for member, c in zip(self.members, cache.caches, strict=True)]
        return mean_probabilities([logits for logits, _ in steps]), EnsembleCache([c for _, c in steps])

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return mean_probabilities([member(src, tgt) for member in self.members])

    def cross_attention(self, src: Tensor, tgt: Tensor) -> Tensor:
        """The members' attention weights, averaged."""
        return torch.stack([cross_attention(member, src, tgt) for member in self.members]).mean(0)


def mean_probabilities(logits: list[Tensor]) -> Tensor:
    """log(mean of softmax(logits)) over the members, in fp32."""
    logp = torch.stack([x.float().log_softmax(-1) for x in logits])
    return torch.logsumexp(logp, 0) - math.log(len(logits))


def combine(paths: list[Path]) -> dict[str, Any]:
    """The ensemble checkpoint of the translation checkpoints at `paths`: one vocabulary, one architecture (a
    right-to-left reranker differs in that alone; a channel model, of the first checkpoint's direction reversed, in
    anything); the first left-to-right one gives the config (decoding defaults included) and the languages."""
    states = [checkpoint.load(path) for path in paths]
    reverse = [i for i, state in enumerate(states) if reversed_of(states[0], state)]
    if len(reverse) > 1:
        raise MtError(f"{paths[reverse[1]]}: a second model of the reverse direction; an ensemble reranks with one "
                      f"channel model ({paths[reverse[0]]})")
    backward = [i for i, state in enumerate(states) if right_to_left(state) and i not in reverse]
    forward = [i for i in range(len(states)) if i not in backward + reverse]
    if len(backward) > 1:
        raise MtError(f"{paths[backward[1]]}: a second right-to-left model; an ensemble reranks with one "
                      f"({paths[backward[0]]})")
    if not forward or len(paths) < 2:
        raise MtError(f"an ensemble needs at least two checkpoints, one of them left to right; {len(paths)} given"
                      + (", all right to left (model.right_to_left)" if paths and not forward else ""))
    first = states[forward[0]]
    if reverse and forward + backward == forward[:1] and "members" in first:  # an ensemble, given a channel
        combined = {key: value for key, value in first.items() if key != "channel"}
        return with_channel(combined | {"metrics": dict(first["metrics"])}, states[reverse[0]], paths[reverse[0]])
    for path, state in [(paths[i], states[i]) for i in forward + backward]:  # the channel is checked as it is loaded
        if "members" in state:
            raise MtError(f"{path}: already an ensemble; give the checkpoints of its members "
                          f"({', '.join(m['path'] for m in state['metrics']['ensemble'])}), or it alone with a "
                          "channel model")
        if state["spm"] != first["spm"]:
            raise MtError(f"{path}: another vocabulary than {paths[forward[0]]}; ensemble models trained on one "
                          "prepared data directory")
        config = {**state["config"], "model": {**state["config"]["model"], "right_to_left": False}}
        if not same_model(config, first["config"]):
            raise MtError(f"{path}: another architecture (model config) than {paths[forward[0]]}; ensemble models "
                          "of one config")
    members = [{"path": str(paths[i]), "step": states[i].get("step")} for i in forward]
    combined = {"members": [states[i]["model"] for i in forward], "config": first["config"], "spm": first["spm"],
                "langs": first.get("langs"), "step": max(int(state.get("step") or 0) for state in states),
                "metrics": {"ensemble": members}}
    if backward:
        combined["reranker"] = states[backward[0]]["model"]
        combined["metrics"]["reranker"] = {"path": str(paths[backward[0]]), "step": states[backward[0]].get("step")}
    return with_channel(combined, states[reverse[0]], paths[reverse[0]]) if reverse else combined


def with_channel(combined: dict[str, Any], channel: dict[str, Any], path: Path) -> dict[str, Any]:
    """`combined` with `channel` (a checkpoint of the reverse direction, loaded from `path`) as its channel model;
    of the channel, what scoring needs: its own second opinions would only be loaded, not used."""
    combined["channel"] = {key: channel[key] for key in ("model", "members", "config", "spm", "langs")
                           if key in channel}
    combined["metrics"]["channel"] = {"path": str(path), "step": channel.get("step")}
    return combined


def reversed_of(first: dict[str, Any], state: dict[str, Any]) -> bool:
    """Whether `state` translates the opposite way to `first` (a channel model for it)."""
    langs, other = first.get("langs") or {}, state.get("langs") or {}
    return bool(langs) and other.get("src") == langs.get("tgt") and other.get("tgt") == langs.get("src")


def right_to_left(state: dict[str, Any]) -> bool:
    return bool((state["config"].get("model") or {}).get("right_to_left"))


def write_ensemble(paths: list[Path], out: Path) -> dict[str, Any]:
    """What `mt ensemble` does: `combine` the checkpoints and write the result to `out` (atomically)."""
    check_not_input(out, "--out", paths)
    check_output(out, "--out", create_parent=True)
    with writing_into(out):
        state = combine(paths)
        checkpoint.save(state, out)
    return state
