"""Resuming a run: the config it goes on with, the random state it goes on from, and the check that its data still
means what its checkpoint learned."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from mt import checkpoint
from mt.config import Config, apply_overrides, from_dict, note_retired, read_config_file
from mt.data.tokenizer import Tokenizer, same_pieces
from mt.errors import MtError
from mt.train.members import member_dirs


def resume_config(out_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run started with (from its newest readable checkpoint), with `overrides` applied; the model
    cannot change. Silent about damaged checkpoints: `train` reports them when it loads the same one."""
    if member_dirs(out_dir):  # an ensemble run: its members' configs are derived from the run's own
        for item in overrides:
            if item.strip().startswith(("model.", "train.members", "train.member_min_steps", "train.seed",
                                        "train.rerank")):
                raise MtError(f"--set {item}: a resumed ensemble run keeps its model, members, seeds and "
                              "reranker")
        raw = read_config_file(Path(out_dir) / "config.yaml")
        note_retired(raw, Path(out_dir) / "config.yaml")
        return apply_overrides(from_dict(raw), overrides)
    last_path = Path(out_dir) / checkpoint.LAST
    if not last_path.is_file() and not checkpoint.numbered(out_dir):
        raise MtError(f"{last_path}: nothing to resume; drop --resume to start a new run")
    for item in overrides:
        if item.strip().startswith("model."):
            raise MtError(f"--set {item}: the model of a resumed run cannot change")
    return apply_overrides(from_dict(checkpoint.latest_readable(out_dir)[1]["config"]), overrides)


def rng_state(device: torch.device) -> dict:
    """The random state a resumed run goes on from: Python's, torch's, and the training GPU's."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":  # the training GPU's only: asking for every GPU's would start a context on each
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def check_same_vocabulary(state: dict, path: Path, src_tok: Tokenizer, tgt_tok: Tokenizer, data_dir: Path
                          ) -> None:
    """A resumed run's ids must mean the same pieces as when it started, or it silently learns garbage."""
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        old = Tokenizer(state["spm"][side])
        if not same_pieces(old, tok):
            raise MtError(f"{data_dir}: its {side} vocabulary ({tok.vocab_size} pieces) is not the one {path} was "
                          f"trained with ({old.vocab_size} pieces); resume with the run's data "
                          f"(--set data={state['config']['data']}) or start a new run in another --out")
