"""The run's log: log.jsonl (one JSON object per log interval or validation), the lines on stderr, and reading it
back (`mt plot`, `mt report`)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import torch
import yaml
from tqdm import tqdm

from mt.config import Config, to_dict
from mt.errors import MtError
from mt.train import distributed


class RunLog:
    """Rank 0 writes the log; `progress` (rank 0, not --quiet) also prints log lines."""

    def __init__(self, main: bool, progress: bool):
        self.main, self.progress, self.file = main, progress and main, None

    def open(self, out_dir: Path, cfg: Config) -> None:
        """Rank 0 writes the resolved config and opens log.jsonl for appending (a resumed run goes on in it)."""
        if self.main:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
            self.file = open(out_dir / "log.jsonl", "a", encoding="utf-8")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def record(self, entry: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(entry) + "\n")
            self.file.flush()

    def say(self, message: str) -> None:
        if self.progress:
            tqdm.write(message, file=sys.stderr)

    def note(self, message: str) -> None:
        """A note on stderr from rank 0, also with --quiet: something about the run the user should know."""
        if self.main:
            print(f"note: {message}", file=sys.stderr)

    def progress_bar(self, max_steps: int, step: int) -> tqdm:
        """A live bar on a terminal; elsewhere a disabled one, and `log_progress` prints lines instead."""
        return tqdm(total=max_steps, initial=step, disable=not self.progress or not sys.stderr.isatty(),
                    unit="step", dynamic_ncols=True)

    def log_progress(self, report: dict, bar: tqdm) -> None:
        self.record(report)
        bar.set_postfix(loss=f"{report['loss']:.3f}", lr=f"{report['lr']:.2e}",
                        tok_s=f"{report['tgt_tok_per_s']:.0f}")
        if bar.disable:  # no live bar: one log line per interval instead
            self.say(f"step {report['step']} · epoch {report['epoch']} · loss {report['loss']:.3f} · "
                     f"lr {report['lr']:.2e} · {report['tgt_tok_per_s']:.0f} tgt tok/s"
                     + (f" · {report['skipped_steps']} skipped (non-finite)" if report["skipped_steps"] else ""))


@dataclass
class Interval:
    """The steps since the last log line: their summed loss (left on the device), target tokens, skipped steps."""

    loss: torch.Tensor
    tokens: int = 0
    skipped: int = 0  # skipped (non-finite) steps
    start: float = field(default_factory=time.time)

    def add(self, loss: torch.Tensor, n_tokens: int, applied: bool) -> None:
        if applied:
            self.loss += loss
            self.tokens += n_tokens
        else:
            self.skipped += 1

    def report(self, step: int, epoch: int, optimizer: torch.optim.Optimizer) -> dict:
        """The log record of the interval, on every rank alike, then a new interval: all ranks must call this
        together, as the loss is summed over ranks (the one time the loss is read from the device)."""
        seconds = time.time() - self.start
        loss = distributed.all_reduce_sum(self.loss.clone()).item()
        report = {"step": step, "epoch": epoch, "loss": loss / max(self.tokens, 1),
                  "lr": optimizer.param_groups[0]["lr"], "tgt_tok_per_s": self.tokens / max(seconds, 1e-9),
                  "skipped_steps": self.skipped}
        self.loss, self.tokens, self.skipped, self.start = torch.zeros_like(self.loss), 0, 0, time.time()
        return report


@dataclass
class Pace:
    """Says once, at the second log line (the first carries the start-up), how many steps a minute this machine
    trains and what the run's budget buys at that pace: a slower machine learns it before it spends the hour. After
    the first validation it says the budget again, at the pace so far and with the validations' cost counted."""

    max_minutes: float
    max_steps: int
    epoch_tokens: int  # target tokens in one epoch of the training data
    first: tuple[int, float] | None = None  # (step, elapsed seconds) at the first log line
    said: bool = False
    tokens_per_step: float = 0.0
    revised: bool = False

    def seen(self, step: int, elapsed: float, tok_per_s: float) -> str | None:
        """The note to print at this log line, if it is the one; else None."""
        if self.said or self.first is None:
            self.first = self.first or (step, elapsed)
            return None
        self.said = True
        steps, seconds = step - self.first[0], elapsed - self.first[1]
        if steps <= 0 or seconds <= 0:
            return None
        per_minute, self.tokens_per_step = 60 * steps / seconds, tok_per_s * seconds / steps
        head = f"this machine trains {per_minute:,.0f} steps a minute ({tok_per_s:,.0f} target tokens/s)"
        if self.max_minutes:
            return f"{head}: {self.buys(step, elapsed, seconds / steps)}"
        minutes = elapsed / 60 + (self.max_steps - step) / per_minute
        return f"{head}: train.max_steps={self.max_steps:,} takes about {minutes:,.0f} minutes here"

    def validated(self, step: int, elapsed: float, seconds: float, every: int) -> str | None:
        """The note to print after a validation of `seconds` (one every `every` steps) ending at `elapsed`, if it
        is the first since the pace was said and the run has a time budget; else None."""
        if self.revised or not self.said or not self.max_minutes or step <= self.first[0]:
            return None
        self.revised = True
        per_step = (elapsed - seconds - self.first[1]) / (step - self.first[0]) + seconds / every
        return f"with a validation of {seconds:.1f} s every {every:,} steps, {self.buys(step, elapsed, per_step)}"

    def buys(self, step: int, elapsed: float, per_step: float) -> str:
        """What the rest of the time budget buys at `per_step` seconds a step."""
        total = min(self.max_steps, step + max(self.max_minutes * 60 - elapsed, 0) / max(per_step, 1e-9))
        epochs = total * self.tokens_per_step / max(self.epoch_tokens, 1)
        return f"train.max_minutes={self.max_minutes:g} buys about {total:,.0f} steps, {epochs:.1f} epochs"


def read_log(path: Path, warn: TextIO = sys.stderr) -> list[dict]:
    """The records of a `log.jsonl`, sorted by step. Malformed lines (a run killed mid-write) are skipped.

    A resumed run logs again the steps between its last checkpoint and the interruption; for each step and
    kind of record the later one wins, since it belongs to the run that went on.
    """
    if not path.is_file():
        raise MtError(f"{path}: not found; is {path.parent} a run directory written by `mt train`?")
    latest: dict[tuple[int, bool], dict] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                key = (int(record["step"]), "valid_loss" in record)
            except (ValueError, KeyError, TypeError) as e:
                print(f"warning: {path}:{number}: skipped a malformed line ({type(e).__name__})", file=warn)
                continue
            latest[key] = record
    return [latest[key] for key in sorted(latest)]
