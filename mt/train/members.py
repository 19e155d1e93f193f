"""Ensemble runs (`train.members: N`): N models trained one after another in one run directory, then joined.

Such a run holds `config.yaml` (its config, `members` included) and `member-1/` ... `member-N/`, each an ordinary
run directory (last.pt, numbered checkpoints, best.pt, log.jsonl). Member i trains with seed
`train.seed + 1000 * (i - 1)` for `train.max_minutes / N`: the run's time is shared out, while `max_steps` and
`max_epochs` hold for each member; with `train.rerank`, member N trains right to left and reranks the others' beam
(mt/decode/rerank.py). `--resume` resumes the members that have started (a finished one stops at once) and starts the
others. `mt average RUN` averages each member's checkpoints into its `final.pt` and joins those into one ensemble
checkpoint (mt/decode/ensemble.py); `mt report RUN` adds up the members' training.

With `train.member_min_steps: S` and a time budget, member 1 first trains to where its cooldown would begin (until
there it and one model of the whole budget train alike); if it is on course for fewer than S steps in its share of
the time, it goes on as one model of the whole budget, and the run's config.yaml says `members: 1` from then on.
Either way the decision is written there, so a resumed run keeps it.
"""

from __future__ import annotations

import copy
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from mt import checkpoint
from mt.config import Config, to_dict, validate
from mt.data.lines import write_lines
from mt.decode.ensemble import combine
from mt.device import pick_device
from mt.errors import MtError
from mt.runlock import writing_into
from mt.train import distributed
from mt.train.stopping import TrainInterrupted

SEED_STRIDE = 1000  # member i's seed: train.seed + SEED_STRIDE * (i - 1), apart from any other recipe seed's
_MEMBER = re.compile(r"member-(\d+)")


def member_dirs(run_dir: str | Path) -> list[Path]:
    """The member directories of an ensemble run, in order; [] for a run of one model."""
    found = [(int(m[1]), path) for path in Path(run_dir).glob("member-*")
             if path.is_dir() and (m := _MEMBER.fullmatch(path.name))]
    return [path for _, path in sorted(found)]


def member_config(cfg: Config, i: int) -> Config:
    """The config member `i` (1-based) trains with: its seed, its share of the time, one model."""
    member = copy.deepcopy(cfg)
    member.train.members, member.train.member_min_steps = 1, 0
    member.train.seed = cfg.train.seed + SEED_STRIDE * (i - 1)
    member.train.max_minutes = cfg.train.max_minutes / cfg.train.members
    member.train.rerank = False
    member.model.right_to_left = cfg.train.rerank and i == cfg.train.members  # the reranker (mt/decode/rerank.py)
    return member


def first_part(cfg: Config, share: float) -> Config:
    """Member 1's config for the first `share` of its budget (time, steps, epochs) with no cooldown: member 1 up
    to where its cooldown would begin (`train.member_min_steps`)."""
    part = member_config(cfg, 1)
    part.train.max_minutes *= share
    part.train.max_steps = max(1, round(share * part.train.max_steps))
    part.train.max_epochs = math.ceil(share * part.train.max_epochs)
    part.train.cooldown = 0.0
    return part


def train_members(cfg: Config, out_dir: Path, resume: bool, train_one: Callable[..., dict], **options: Any
                  ) -> dict:
    """Train each member in turn with `train_one` (`mt.train.loop.train`, given `options`); the last one's metrics."""
    validate(cfg)  # as load_config does, for a config built in code
    if options.get("init") is not None:
        raise MtError("--init fine-tunes one model; train.members trains new ones: set train.members=1")
    if not resume and member_dirs(out_dir):
        raise MtError(f"{out_dir} already holds an ensemble run; pass --resume to continue it, or choose another "
                      "--out")
    write_run_config(cfg, out_dir)
    metrics: dict = {}
    distributed.start(pick_device(cfg.train.device))  # under torchrun, one process group for every member
    try:
        if cfg.train.member_min_steps and cfg.train.members > 1 and cfg.train.max_minutes:
            probed = train_resumable(train_one, first_part(cfg, 1.0 - cfg.train.cooldown), out_dir / "member-1",
                                     out_dir, **options)
            cfg = decide_members(cfg, probed, out_dir)
        directories = [out_dir / f"member-{i}" for i in range(1, cfg.train.members + 1)]
        for i, directory in enumerate(directories, 1):
            metrics = train_resumable(train_one, member_config(cfg, i), directory, out_dir, **options)
    finally:
        distributed.stop()
    return metrics


def write_run_config(cfg: Config, out_dir: Path) -> None:
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one process writes
        out_dir.mkdir(parents=True, exist_ok=True)
        write_lines(out_dir / "config.yaml", [yaml.safe_dump(to_dict(cfg), sort_keys=False)])


def decide_members(cfg: Config, probed: dict, out_dir: Path) -> Config:
    """The run's config once member 1 has trained to its cooldown (`probed`: the metrics it ended with, rank 0's
    counting): one model when member 1 is on course for fewer than train.member_min_steps steps, else as it was.
    Written to the run's config.yaml, which then has nothing left to decide."""
    member = member_config(cfg, 1).train
    on_course = 0
    if probed:  # rank 0; the others learn its answer from agree_max
        on_course = min(member.max_steps, round(probed["step"] * 60 * member.max_minutes / probed["elapsed"]))
    on_course = distributed.agree_max(on_course)
    decided = copy.deepcopy(cfg)
    decided.train.member_min_steps = 0
    if on_course < cfg.train.member_min_steps:  # one left-to-right model: nothing is left to rerank with
        decided.train.members, decided.train.rerank = 1, False
    if distributed.rank() == 0:
        plan = (f"it goes on as one model of the run's {cfg.train.max_minutes:g} minutes" if decided.train.members == 1
                else f"training {cfg.train.members} members")
        print(f"member 1 is on course for {on_course:,} steps in its {member.max_minutes:g} minutes (train."
              f"member_min_steps: {cfg.train.member_min_steps:,}): {plan}", file=sys.stderr, flush=True)
    write_run_config(decided, out_dir)
    return decided


def started(directory: Path) -> bool:
    return (directory / checkpoint.LAST).is_file() or bool(checkpoint.numbered(directory))


def train_resumable(train_one: Callable[..., dict], cfg: Config, directory: Path, out_dir: Path, **options: Any
                    ) -> dict:
    """`train_one` into `directory`, resuming what it holds; on Ctrl-C, says how to continue the whole run."""
    try:
        return train_one(cfg, directory, resume=started(directory), **options)
    except TrainInterrupted as stop:  # the command it prints must continue the whole run, not one member
        raise TrainInterrupted(str(stop).replace(f"--out {directory}", f"--out {out_dir}")) from None


def average_members(run_dir: Path, out: Path, average_one: Callable[[Path, Path], tuple[dict, list[dict]]]
                    ) -> tuple[dict[str, Any], list[dict]]:
    """`average_one(member_dir, member_dir / "final.pt")` for each member, then the members' final.pt joined into
    `out`. Returns the ensemble's state and every member's results, each marked with its member."""
    finals, results = [], []
    for directory in member_dirs(run_dir):
        with writing_into(directory / "final.pt"):
            state, tried = average_one(directory, directory / "final.pt")
        finals.append(directory / "final.pt")
        results += [{"member": directory.name, **result} for result in tried]
    if len(finals) > 1:  # else a run that chose one model (train.member_min_steps): its one average is the run's
        state = combine(finals)
    checkpoint.save(state, out)
    return state, results
