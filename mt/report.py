"""The report of a finished recipe run: test scores (cased and lowercased), training time and model size.

`make recipe NAME=...` ends with `mt report`: it translates the prepared test split with the final checkpoint,
scores it with sacreBLEU (signatures included), reads the training wall time and steps from the run's `last.pt`
and its speed from `log.jsonl` (its members' in an ensemble run), and writes `report.json` beside the checkpoint,
atomically. A checkpoint reranked by a channel model (mt/decode/ensemble.py) is reported as `report.channel.json`, with
the channel's own run's training beside the model's: the system's training is both runs'.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from mt import checkpoint
from mt.config import Config, from_dict
from mt.data.batches import epoch_batches, epoch_split, text_files, train_splits, turned
from mt.data.lines import read_text, write_lines
from mt.decode.evaluate import score
from mt.decode.load import Loaded, load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_stream
from mt.decode.tune import decode_choices
from mt.device import pick_device
from mt.errors import MtError
from mt.options import DEVICE
from mt.runlock import writing_into
from mt.train.log import read_log
from mt.train.members import member_dirs


def report_run(run_dir: Path, checkpoint_path: Path | None = None, device: str = DEVICE) -> dict[str, Any]:
    """`recipe_report` of `checkpoint_path` (default: the run's final.pt), also written to RUN_DIR/report.json
    (a two-way model turned to its other direction: report.SRC-TGT.json; one with a channel: report.channel.json)."""
    final = Path(checkpoint_path or Path(run_dir) / "final.pt")
    if not final.is_file():
        raise MtError(f"{final}: not found; make it first, e.g. `mt average {run_dir} --last 8 --out {final}`")
    dev = pick_device(device)
    loaded = load_model(final, dev)
    path = Path(run_dir) / f"report{report_suffix(loaded)}.json"
    with writing_into(path):
        report = recipe_report(run_dir, final, loaded, dev)
        write_report(report, path)
    return report


def report_suffix(loaded: Loaded) -> str:
    """What tells this checkpoint's report and test translations from the run's own: its other way, its channel."""
    return other_way(loaded) + (".channel" if "channel" in loaded.state else "")


def other_way(loaded: Loaded) -> str:
    """"" for a model going the way its data was prepared; ".SRC-TGT" for a two-way model turned the other way."""
    langs = loaded.state.get("langs") or {}
    return f".{langs['src']}-{langs['tgt']}" if turned(loaded.config.data, langs) else ""


def recipe_report(run_dir: str | Path, final: str | Path, loaded: Loaded, device: torch.device) -> dict[str, Any]:
    """Score `loaded` (the checkpoint `final`) on the test split of the data it was trained on; training facts
    from `run_dir/last.pt` (and from its channel's run, `channel_training`)."""
    run_dir = Path(run_dir)
    data_dir = Path(loaded.config.data)
    src_path, ref_path = text_files(data_dir, "test", loaded.state.get("langs"))
    if not src_path.is_file():
        raise MtError(f"{data_dir}: no test split ({src_path.name}) to report on; prepare the data with --test, "
                      "or run from the directory the run was trained in (the data path is relative to it)")
    sources, refs = read_text(src_path), read_text(ref_path)
    hyps = list(translate_stream(loaded, sources, SearchOptions.from_config(loaded.config.decode), device))
    write_lines(run_dir / f"test{report_suffix(loaded)}.hyp.txt", hyps)
    cased, lower = score(hyps, refs), score(hyps, refs, lowercase=True)
    metrics = loaded.state.get("metrics") or {}
    tuned = metrics.get("tuned") or [{}]
    trained_here, decode = training(run_dir, data_dir), loaded.config.decode
    return {
        "run": str(run_dir),
        "checkpoint": str(final),
        "languages": loaded.state.get("langs"),
        "test": {"sentences": len(refs), "source": str(src_path), "reference": str(ref_path)},
        "bleu": cased["bleu"]["score"],
        "bleu_lc": lower["bleu"]["score"],
        "chrf": cased["chrf"]["score"],
        "ter": cased["ter"]["score"],
        "length_ratio": cased["bleu"]["length_ratio"],
        "signatures": {"bleu": cased["bleu"]["signature"], "bleu_lc": lower["bleu"]["signature"],
                       "chrf": cased["chrf"]["signature"], "ter": cased["ter"]["signature"]},
        **trained_here,
        **channel_training(loaded.state, trained_here["train_minutes"]),
        "parameters": loaded.parameters,
        "averaged_steps": metrics.get("averaged_steps"),
        "decode": {"beam": decode.beam, "len_penalty": decode.len_penalty}
                  | ({key: getattr(decode, key) for key in decode_choices(loaded.state)}
                     if decode.beam > 1 else {}),  # greedy: unused
        "valid_bleu": tuned[0].get("bleu"),
        "seed": loaded.config.train.seed,
    }


def training(run_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Minutes, steps and epochs of training, from the run's last.pt, and its median target tokens/s over the
    log's intervals; an ensemble run's added up (the speed: over all intervals) over its members, which are listed
    too (mt/train/members.py)."""
    members, speeds = [], []
    for directory in member_dirs(run_dir) or [run_dir]:
        member, speed = trained(directory, data_dir)
        members.append(member)
        speeds += speed
    total = {key: round(sum(m[key] for m in members), 1) for key in ("train_minutes", "epochs")}
    total |= {"steps": sum(m["steps"] for m in members), "tgt_tokens_per_s": median(speeds)}
    return total | ({"members": members} if len(members) > 1 else {})


def channel_training(state: dict[str, Any], minutes: float) -> dict[str, Any]:
    """{"channel": ...}: the channel model's checkpoint and, where it lies in a run directory (a recipe's final.pt),
    that run's training, and the system's training minutes: both runs' (`minutes`, the model's). {} without one."""
    if "channel" not in state:
        return {}
    path = Path(state["metrics"]["channel"]["path"])  # as `mt ensemble` was given it: relative to where it ran
    run = path.parent
    if not (run / checkpoint.LAST).is_file() and not member_dirs(run):
        return {"channel": {"checkpoint": str(path), "run": None}}
    channel = training(run, Path(state["channel"]["config"]["data"]))
    return {"channel": {"checkpoint": str(path), "run": str(run), **channel},
            "system_train_minutes": round(minutes + channel["train_minutes"], 1)}


def trained(directory: Path, data_dir: Path) -> tuple[dict[str, Any], list[float]]:
    """One model's training, from `directory`'s last.pt, and the tokens/s of its log's intervals."""
    last = checkpoint.load(directory / checkpoint.LAST)
    position, cfg = last["train"]["position"], from_dict(last["config"])
    speeds = [r["tgt_tok_per_s"] for r in read_log(directory / "log.jsonl") if "tgt_tok_per_s" in r]
    return {"train_minutes": round(position["elapsed"] / 60, 1), "steps": position["step"],
            "epochs": round(epochs_trained(cfg, data_dir, position), 1), "seed": cfg.train.seed,
            "tgt_tokens_per_s": median(speeds)}, speeds


def median(values: list[float]) -> float | None:
    return round(statistics.median(values)) if values else None


def epochs_trained(cfg: Config, data_dir: Path, position: dict) -> float:
    """Passes over the training data, fractional: whole epochs plus the share of the current one's batches."""
    split = epoch_split(train_splits(data_dir, cfg.train.two_way), position["epoch"])
    batches = epoch_batches(split, cfg.train.max_tokens, cfg.model.max_len, cfg.train.seed, position["epoch"])
    return position["epoch"] + position["batch"] / len(batches)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    write_lines(Path(path), [json.dumps(report, indent=2, ensure_ascii=False)])
