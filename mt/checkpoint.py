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
Loading uses `weights_only=True`: a checkpoint file can never run code. Nor can it cost more than it holds: its
entries must be stored as torch writes them (a compressed one could unpack a small file into gigabytes), its
tensors are mapped, not read, its nesting is bounded, and `check` holds its config, SentencePiece models and
weights (mt/shapes.py) to one another before any loader builds anything; what does not fit is one line naming the
file, the part and what was expected.

A run directory keeps its resumable checkpoints as `last.pt` plus the newest K `checkpoint-{step}.pt` (hard links
to what `last.pt` was at that step, so they cost no extra writing). `latest_readable` finds the newest one that
loads, so a damaged `last.pt` costs one checkpoint interval, not the run.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

from mt.config import from_dict, note_retired
from mt.errors import MtError, cannot_write
from mt.shapes import check_weights
from mt.vocab import read_sentencepiece


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
    """The checkpoint at `path`, checked (`check`): every loader of mt comes through here."""
    path = Path(path)
    if (path / "mt_export.json").is_file():
        raise MtError(f"{path}: a model written by `mt export`, not a checkpoint; its mt_export.json names the "
                      f"checkpoint it came from")
    if not path.is_file():
        raise MtError(f"{path}: checkpoint not found")
    try:
        state = read_tensors(path)
    except MtError:
        raise
    except Exception as e:  # truncated, corrupt, or not a checkpoint at all
        raise MtError(f"{path}: not a readable mt checkpoint ({_why(e)})") from None
    if not isinstance(state, dict) or not {"config", "spm"} <= state.keys() or not state.keys() & {"model", "members"}:
        raise MtError(f"{path}: not an mt checkpoint (no model/config/spm entries)")
    check(state, path)
    return state


def read_tensors(path: Path) -> Any:
    """What a file of `torch.save` holds, read so that it can neither run code (weights_only) nor cost more than
    its size: torch stores the entries of its zip format as they are, so a compressed one is refused unread, and
    tensors are mapped from the file (mmap), read only as they are used. (Files of torch's format before 1.6, not
    zip, store nothing compressed and are read whole.) Raises as torch.load does."""
    if not zipfile.is_zipfile(path):
        return torch.load(path, map_location="cpu", weights_only=True)
    with zipfile.ZipFile(path) as archive:
        packed = [entry.filename for entry in archive.infolist() if entry.compress_type != zipfile.ZIP_STORED]
    if packed:
        raise MtError(f"{path}: its entry {packed[0]} is compressed, which torch.save never writes; refused unread, "
                      f"as a small file could unpack into gigabytes")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


MAX_ENTRIES, MAX_DEPTH = 100_000, 16  # a checkpoint holds thousands of entries (weights, optimizer state) in 5 levels


def check(state: dict[str, Any], path: str | Path) -> None:
    """What every loader relies on, checked before anything is built: a bounded structure; a config that mt reads
    (mt/config.py's checks); SentencePiece models of as many pieces as the config's vocabularies; every state dict
    (model, ensemble members, reranker, channel model, the raw weights of a resumable one) of the config's shapes
    (mt/shapes.py); the record (step, languages, metrics) of the types mt reads."""
    check_bounded(state, path)
    check_model(state, str(path))
    if "channel" in state:
        channel = state["channel"]
        if not isinstance(channel, dict) or not {"config", "spm"} <= channel.keys() \
                or not channel.keys() & {"model", "members"}:
            raise MtError(f"{path}: channel: not a model (no model/config/spm entries)")
        check_model(channel, f"{path}: channel")
    check_record(state, path)


def check_bounded(state: dict[str, Any], path: str | Path) -> None:
    """A pickle may hold one list many times over (by reference), so that a small file unfolds into more entries
    than any walk over it can visit: at most MAX_ENTRIES entries, counted as walked, MAX_DEPTH levels deep."""
    stack, walked = [(state, 0)], 0
    while stack:
        value, depth = stack.pop()
        walked += 1
        if walked > MAX_ENTRIES or depth > MAX_DEPTH:
            what = f"holds more than {MAX_ENTRIES:,} entries (each counted as often as it is referenced)" \
                if depth <= MAX_DEPTH else f"nests deeper than {MAX_DEPTH} levels"
            raise MtError(f"{path}: {what}; an mt checkpoint is far smaller, and this one is damaged or not mt's")
        if isinstance(value, dict):
            stack += [(item, depth + 1) for pair in value.items() for item in pair]
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack += [(item, depth + 1) for item in value]


def check_model(state: dict[str, Any], where: str) -> None:
    """A model's config, SentencePiece models and weights, held to one another."""
    raw = state["config"]
    if not isinstance(raw, dict):
        raise MtError(f"{where}: config: not a mapping of sections (model, train, decode)")
    note_retired(raw, where)
    try:
        cfg = from_dict(raw)
    except MtError as e:
        raise MtError(f"{where}: config: {e}") from None
    if not isinstance(state["spm"], dict):
        raise MtError(f"{where}: spm: not a mapping of the SentencePiece models (src, tgt)")
    pieces: dict[str, int] = {}
    for side in ("src", "tgt"):
        if side == "tgt" and state["spm"].get("tgt") == state["spm"].get("src"):
            pieces["tgt"] = pieces["src"]  # one joint model, read once
        else:
            pieces[side] = read_sentencepiece(state["spm"].get(side), f"{where}: spm.{side}").get_piece_size()
        size = getattr(cfg.model, f"{side}_vocab_size")
        if pieces[side] != size:
            raise MtError(f"{where}: spm.{side} has {pieces[side]:,} pieces, but model.{side}_vocab_size={size:,}; the "
                          f"file is damaged, or its config is not its SentencePiece model's")
    members = state.get("members")
    if "members" in state and (not isinstance(members, list) or not members):
        raise MtError(f"{where}: members: not a list of state dicts")
    parts = [("model", state.get("model"))] if "model" in state else []
    parts += [(f"members[{i}]", member) for i, member in enumerate(members or [])]
    parts += [("reranker", state["reranker"])] if "reranker" in state else []  # right to left: the same shapes
    raw_weights = state.get("train") if isinstance(state.get("train"), dict) else {}
    parts += [("train.weights", raw_weights["weights"])] if "weights" in raw_weights else []
    for part, weights in parts:
        check_weights(weights, cfg.model, f"{where}: {part}")


def check_record(state: dict[str, Any], path: str | Path) -> None:
    """The entries beside the model that commands read and `mt info` shows, of the types they are read as."""
    langs, init, imported = (state.get(key) for key in ("langs", "init", "imported"))
    if not isinstance(state.get("metrics") or {}, dict):
        raise MtError(f"{path}: metrics: expected a mapping; the file is damaged, or not mt's")
    metrics = state.get("metrics") or {}
    ensemble = metrics.get("ensemble", [])
    entries = {  # entry: (whether it is wrong, what is expected there)
        "step": (not _count(state.get("step"), none=True), "a count of steps"),
        "langs": (langs is not None and not (isinstance(langs, dict) and all(
            isinstance(langs.get(side), (str, type(None))) for side in ("src", "tgt"))), "{src: LANG, tgt: LANG}"),
        "metrics.step": ("step" in metrics and not _count(metrics["step"]), "a count of steps"),
        "metrics.ensemble": (not isinstance(ensemble, list) or not all(map(_names_checkpoint, ensemble))
                             or "members" in state and len(ensemble) != len(state["members"]),
                             "a list of {path, step}, one per member"),
        "metrics.reranker": ("reranker" in metrics and not _names_checkpoint(metrics["reranker"]), "{path, step}"),
        "metrics.channel": ("channel" in metrics and not _names_checkpoint(metrics["channel"]), "{path, step}"),
        "init": (init is not None and not (_names_checkpoint(init, "from") and _count(init.get("step"))),
                 "{from, step}"),
        "imported": (imported is not None and not isinstance(imported, dict), "a mapping"),
    }
    for entry, (wrong, expected) in entries.items():
        if wrong:
            raise MtError(f"{path}: {entry}: expected {expected}; the file is damaged, or not mt's")


def _count(value: Any, none: bool = False) -> bool:
    return value is None and none or isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63


def _names_checkpoint(entry: Any, key: str = "path") -> bool:
    """Whether `entry` is {path: str, step: count} (init's is {from: str, step: count})."""
    return isinstance(entry, dict) and isinstance(entry.get(key), str) and _count(entry.get("step"), none=True)


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
