"""Checkpoint averaging: the mean of the weights of several checkpoints of one run, as one checkpoint.

Averaging the last few checkpoints of a run (Vaswani et al. 2017 average the last 5 or 20) smooths out the noise
of the final updates, for free. How many to average depends on the
run (how far apart its checkpoints are, how high the learning rate still was), so several counts can be tried
and the one with the best validation BLEU kept. The result is a translation checkpoint like `best.pt`: weights,
config and SentencePiece models, no optimizer state.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from mt import checkpoint
from mt.checkpoint import joined
from mt.config import same_model
from mt.data.lines import check_not_input, check_output
from mt.decode.load import from_state
from mt.decode.tune import held_out, tune
from mt.device import pick_device
from mt.errors import MtError
from mt.options import DEVICE
from mt.runlock import writing_into
from mt.train.members import average_members, member_dirs


def choose(run_dir: str | Path, last: int = 0, best: int = 0) -> list[Path]:
    """The run's numbered checkpoints to average: the `last` newest, or the `best` by validation BLEU (by
    validation loss when the run did not compute BLEU). Oldest first."""
    found = checkpoint.numbered(run_dir)  # newest first
    if not found:
        raise MtError(f"{run_dir}: no checkpoint-STEP.pt files to average; train with "
                      "train.keep_checkpoints=N (N > 0) to keep them")
    want = last or best
    if want > len(found):
        raise MtError(f"{run_dir}: asked for {want} checkpoints but the run kept {len(found)} "
                      f"(steps {', '.join(str(s) for s, _ in found)}); raise train.keep_checkpoints")
    if last:
        chosen = found[:last]
    else:
        ranked = sorted(found, key=lambda item: _quality(checkpoint.load(item[1]), item[1]), reverse=True)
        chosen = ranked[:best]
    return [path for _, path in sorted(chosen)]


def _quality(state: dict[str, Any], path: Path) -> float:
    metrics = state.get("metrics") or {}
    if metrics.get("step") != state["step"]:  # saved on an interrupt: the metrics are an earlier step's
        return -math.inf
    if "valid_bleu" in metrics:
        return metrics["valid_bleu"]
    if "valid_loss" in metrics:
        return -metrics["valid_loss"]
    raise MtError(f"{path}: holds no validation score to rank it by; average the --last N instead")


def average(paths: list[Path]) -> dict[str, Any]:
    """A translation checkpoint whose weights are the mean of those in `paths` (same model config required).
    Tensors that are not floating point (none in today's model) are taken from the newest checkpoint."""
    if not paths:
        raise MtError("no checkpoints to average")
    first = checkpoint.load(paths[0])
    total = {name: value.double() for name, value in first["model"].items() if value.is_floating_point()}
    steps = [int(first["step"])]
    newest = first
    for path in paths[1:]:
        state = newest = checkpoint.load(path)
        if not same_model(state["config"], first["config"]) or state["spm"] != first["spm"]:
            raise MtError(f"{path}: a different model or vocabulary than {paths[0]}; average checkpoints "
                          "of one run")
        for name in total:
            total[name] += state["model"][name].double()
        steps.append(int(state["step"]))
    weights = {name: (total[name] / len(paths)).to(value.dtype) if name in total else newest["model"][name]
               for name, value in first["model"].items()}
    return {"model": weights, "config": newest["config"], "spm": first["spm"], "langs": first.get("langs"),
            "step": max(steps), "metrics": {"averaged_steps": steps}}


def average_checkpoints(run_dir: Path, out: Path, last: str = "0", best: int = 0,
                        device: str = DEVICE) -> tuple[dict[str, Any], list[dict]]:
    """What `mt average` does: `last` is a count or comma-separated counts; several counts are each averaged
    and the best on the valid split kept (`average_on_valid`, whose results are returned; else none), those above
    the checkpoints a run kept left out. In an
    ensemble run (train.members), each member's into its own final.pt, and `out` joins those (mt/train/members.py)."""

    try:
        counts = tuple(int(n) for n in last.split(","))
    except ValueError:
        raise MtError(f"--last {last!r}: expected a count or comma-separated counts, e.g. 8 or 2,4,8") from None
    if len(counts) > 1 and best:
        raise MtError("--best N averages the N best checkpoints; several counts work with --last only")
    check_not_input(out, "--out", averaged_inputs(run_dir))
    check_output(out, "--out", create_parent=True)

    def average_one(directory: Path, to: Path) -> tuple[dict[str, Any], list[dict]]:
        tried = counts
        if len(counts) > 1:  # of several counts, those the run kept checkpoints for (a short run keeps few)
            kept = len(checkpoint.numbered(directory))
            tried = tuple(n for n in counts if n <= kept) or (min(counts),)  # none: the smallest, which says why not
            if tried != counts:
                print(f"mt average: {directory} kept {kept} checkpoints: trying --last "
                      f"{','.join(map(str, tried))} of {last}", file=sys.stderr)
        if len(tried) == 1:
            return average_run(directory, to, last=tried[0], best=best), []
        return average_on_valid(directory, to, tried, pick_device(device))
    with writing_into(out):
        if member_dirs(run_dir):  # an ensemble run: each member averaged, then joined
            return average_members(Path(run_dir), out, average_one)
        return average_one(run_dir, out)


def averaged_inputs(run_dir: Path) -> list[Path]:
    """What `mt average RUN` reads: the run's numbered checkpoints, or in an ensemble run each member's and the
    final.pt that the members' averages are joined from."""
    members = member_dirs(run_dir)
    numbered = [path for directory in [Path(run_dir), *members] for _, path in checkpoint.numbered(directory)]
    return numbered + [directory / "final.pt" for directory in members]


def summary(state: dict[str, Any], results: list[dict], out: Path) -> str:
    """What `mt average` prints: each count's valid BLEU when several were tried (per member of an ensemble run),
    then the steps averaged, or the members joined."""
    lines = [f"{r['member'] + '  ' if 'member' in r else ''}last {r['last']:3d}  valid BLEU {r['valid_bleu']:6.2f} "
             "(greedy)" for r in results]
    if "members" in state:
        paths = [m["path"] for m in state["metrics"]["ensemble"]] + [state["metrics"][key]["path"] for key in
                                                                     ("reranker", "channel") if key in state]
        lines.append(f"{out}: {joined(state)} ({', '.join(paths)})")
    else:
        lines.append(f"{out}: the average of steps {', '.join(map(str, state['metrics']['averaged_steps']))}")
    return "\n".join(lines)


def average_run(run_dir: str | Path, out: str | Path, last: int = 0, best: int = 0) -> dict[str, Any]:
    """Average the chosen checkpoints of `run_dir` into `out` (written atomically); returns the new state."""
    if min(last, best) < 0 or (last > 0) == (best > 0):
        raise MtError(f"--last {last} --best {best}: choose the checkpoints with either --last N or "
                      "--best N, N at least 1")
    state = average(choose(run_dir, last=last, best=best))
    checkpoint.save(state, out)
    return state


def average_on_valid(run_dir: str | Path, out: str | Path, counts: tuple[int, ...],
                     device: torch.device) -> tuple[dict[str, Any], list[dict]]:
    """Average the newest N checkpoints for each N in `counts`, translate the valid split of the run's data with
    each (greedy search), and write the best by BLEU to `out`. Returns its state and every count's BLEU, best
    first; ties go to fewer checkpoints. The choice is recorded in the checkpoint's metrics."""

    if not counts or min(counts) < 1:
        raise MtError(f"--last {','.join(map(str, counts))}: each count must be at least 1")
    choose(run_dir, last=max(counts))  # before any slow work: raises if the run kept fewer checkpoints
    results: list[dict] = []
    best_state, data = None, None
    for n in sorted(set(counts)):
        state = average(choose(run_dir, last=n))
        loaded = from_state(state, device)
        data = data or held_out(loaded)
        score = tune(loaded, *data, device, beams=(1,), penalties=(0.0,), progress=False)[0]["bleu"]
        if not results or score > max(r["valid_bleu"] for r in results):
            best_state = state
        results.append({"last": n, "valid_bleu": score})
    results.sort(key=lambda r: (-r["valid_bleu"], r["last"]))
    best_state["metrics"]["average_choice"] = results
    checkpoint.save(best_state, out)
    return best_state, results
