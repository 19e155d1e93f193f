"""Checkpoints: self-contained (weights, resolved config, SentencePiece models), written atomically, loaded safely.

A checkpoint is a plain dict saved with `torch.save`:
  model: state_dict (an ensemble has `members` instead, a state_dict each, and may have a right-to-left
         `reranker`: mt/decode/ensemble.py) ·
  config: the resolved config as a dict · spm: {"src": bytes, "tgt": bytes} · langs: {"src": "de", "tgt": "en"}
  (a two-way model's, train.two_way: the direction it translates; `towards` turns it) ·
  step · metrics · init: {"from": path, "step": N} in a fine-tuned run's ·
  and, in the resumable checkpoints only, `train`: optimizer, scaler, position (step, epoch, batch, elapsed,
  validations_since_best), best_score, rng, world_size. (Earlier versions wrote `best_bleu` and `stale` for
  best_score and validations_since_best, and, with train.ema, the raw `weights` beside their average.)
Loading uses `weights_only=True`: a checkpoint file can never run code.

A run directory keeps its resumable checkpoints as `last.pt` plus the newest K `checkpoint-{step}.pt` (hard links
to what `last.pt` was at that step, so they cost no extra writing). `latest_readable` finds the newest one that
loads, so a damaged `last.pt` costs one checkpoint interval, not the run.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, BinaryIO

import torch

from mt.config import note_retired
from mt.errors import MtError, cannot_write


def save(state: dict[str, Any], path: str | Path) -> None:
    """Write to a temporary name, fsync, then rename: a crash at any point leaves the previous file intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    writer = None
    try:
        with open(tmp, "wb") as f:
            writer = _Writer(f)
            torch.save(state, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as e:  # a full disk, a quota, a vanished mount: say so in one line, not a traceback
        raise cannot_write(path, e) from None
    except RuntimeError:  # torch.save's report of a failed write: the write's own error says why
        if writer is None or writer.error is None:
            raise
        raise cannot_write(path, writer.error) from None
    finally:
        tmp.unlink(missing_ok=True)


class _Writer:
    """The file torch.save writes to, keeping the OSError of a failed write, which torch turns into a RuntimeError."""

    def __init__(self, file: BinaryIO):
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


LAST = "last.pt"
_NUMBERED = re.compile(r"checkpoint-(\d+)\.pt")


def save_last(state: dict[str, Any], run_dir: str | Path, keep: int) -> Path:
    """Save a resumable `state` as `run_dir/last.pt`, keep it as `checkpoint-{step}.pt` too, and delete all but the
    newest `keep` numbered checkpoints (0: keep `last.pt` alone). Returns the path of `last.pt`.

    Numbered checkpoints with a later step than `state` are deleted as well: they belong to a continuation this run
    abandoned (it was resumed from an earlier checkpoint), and a later fallback must never pick them.
    """
    run_dir = Path(run_dir)
    last = run_dir / LAST
    save(state, last)
    if keep > 0:
        link_or_copy(last, run_dir / f"checkpoint-{state['step']}.pt")
    newer = [p for step, p in numbered(run_dir) if step > state["step"]]
    older = [p for step, p in numbered(run_dir) if step <= state["step"]][keep:]
    for p in newer + older:
        p.unlink(missing_ok=True)
    return last


def numbered(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The `checkpoint-{step}.pt` files of a run as (step, path), newest first."""
    found = [(int(m[1]), p) for p in Path(run_dir).glob("checkpoint-*.pt") if (m := _NUMBERED.fullmatch(p.name))]
    return sorted(found, reverse=True)


def latest_readable(run_dir: str | Path) -> tuple[Path, dict[str, Any], list[str]]:
    """The newest checkpoint of a run that loads: `last.pt`, else the numbered ones, newest first.

    Returns (path, state, problems): `problems` holds one message per newer file that could not be used, for the
    caller to report. Raises `MtError` when no file loads (or there is none).
    """
    run_dir = Path(run_dir)
    problems = []
    for path in [run_dir / LAST] + [p for _, p in numbered(run_dir)]:
        try:
            return path, load(path), problems
        except MtError as e:
            problems.append(str(e))
    raise MtError(f"{run_dir}: no readable checkpoint; {'; '.join(problems)}")


def latest_resumable(run_dir: Path, warn: bool = True) -> tuple[Path, dict[str, Any]]:
    """The newest readable checkpoint of the run in `run_dir` that holds training state; says on stderr (when
    `warn`) which damaged ones it passed over."""
    path, state, problems = latest_readable(run_dir)
    if warn:
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        if problems:
            print(f"warning: resuming from {path} (step {state['step']}) instead; the steps after it are trained "
                  f"again", file=sys.stderr)
    if "train" not in state:
        raise MtError(f"{path}: holds no training state (optimizer, data position); it cannot be resumed")
    return path, state


def link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` a hard link to `src` (a copy where links are not supported), atomically replacing any `dst`."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(src, tmp)
        except OSError:  # a filesystem without hard links (some network or FUSE mounts)
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except OSError as e:
        raise MtError(f"{dst}: cannot write ({e.strerror or e}); {src} is saved") from None
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: without this a power cut can undo it even though the file's data is on disk."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open a directory; its renames are durable without this
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if (path / "mt_export.json").is_file():
        raise MtError(f"{path}: a model written by `mt export`, not a checkpoint; its mt_export.json names the "
                      f"checkpoint it came from")
    if not path.is_file():
        raise MtError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt, or not a checkpoint at all
        raise MtError(f"{path}: not a readable mt checkpoint ({_why(e)})") from None
    if not isinstance(state, dict) or not {"config", "spm"} <= state.keys() or not state.keys() & {"model", "members"}:
        raise MtError(f"{path}: not an mt checkpoint (no model/config/spm entries)")
    note_retired(state["config"], path)
    return state


def weights(state: dict[str, Any], path: str | Path, needs: str) -> dict[str, Any]:
    """The model's state dict; an ensemble (several) is refused, naming what `needs` one model."""
    if "members" in state:
        raise MtError(f"{path}: {joined(state)}; {needs} needs one model: give the checkpoint of one member "
                      f"({', '.join(m['path'] for m in state['metrics']['ensemble'])})")
    return state["model"]


def joined(state: dict[str, Any]) -> str:
    """What an `mt ensemble` checkpoint holds, in words."""
    count = len(state["members"])
    helpers = (["a right-to-left model"] if "reranker" in state else []) \
        + (["a channel model ({src}→{tgt})".format(**state["channel"]["langs"])] if "channel" in state else [])
    return (f"an ensemble of {count} models" if count > 1 else "a model") \
        + (f" and {' and '.join(helpers)} to rerank with" if helpers else "")


def _why(error: Exception) -> str:
    """One short line for why torch.load failed; its own messages run to paragraphs and suggest weights_only=False."""
    text = str(error)
    if "Unsupported global" in text:
        return "it holds Python objects, not only tensors and plain data, and loading those could run code"
    first = text.splitlines()[0].split(". ")[0].strip() if text.strip() else ""
    return f"truncated or corrupt: {type(error).__name__}{': ' + first if first else ''}"


def towards(state: dict[str, Any], lang: str | None, path: str | Path = "the checkpoint") -> dict[str, Any]:
    """`state` set to translate into `lang` (None: as it is): a two-way model (train.two_way) turns to its other
    direction; any model already going there stays; anything else is an error that says which directions exist."""
    langs, two_way = state.get("langs") or {}, (state["config"].get("train") or {}).get("two_way")
    if lang is None or lang == langs.get("tgt"):
        return state
    if two_way and lang == langs.get("src"):
        return {**state, "langs": {"src": langs["tgt"], "tgt": langs["src"]}}
    ways = f"{langs.get('src')}→{langs.get('tgt')}" + (f" and {langs.get('tgt')}→{langs.get('src')}" if two_way else "")
    raise MtError(f"{path} translates {ways}, not into {lang!r}; train one model of both directions with "
                  "`mt prepare --two-way` and train.two_way")
