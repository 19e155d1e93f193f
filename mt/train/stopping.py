"""When a run stops: its budgets, patience, SIGINT/SIGTERM and divergence, agreed on by every rank."""

from __future__ import annotations

import signal
from enum import IntEnum
from pathlib import Path

from mt import checkpoint
from mt.config import TrainConfig
from mt.errors import MtError
from mt.train import distributed
from mt.train.state import Position


class Stop(IntEnum):
    """What the ranks agree on after each step: the largest wins (`distributed.agree_max`)."""

    NO = 0
    FINISH = 1  # the time budget is spent, or patience ran out: validate the last step and end as usual
    SIGNAL = 2  # SIGINT/SIGTERM: save last.pt and raise `TrainInterrupted`


def agree(stop: Stop) -> Stop:
    """The most urgent of every rank's `stop`, so that all of them act on it after the same step."""
    return Stop(distributed.agree_max(stop))


def finished(train_cfg: TrainConfig, pos: Position) -> bool:
    """Whether the step or epoch limit is reached: a function of the position, so every rank agrees."""
    return pos.step >= train_cfg.max_steps or bool(train_cfg.max_epochs) and pos.epoch >= train_cfg.max_epochs


def out_of_patience(train_cfg: TrainConfig, pos: Position) -> bool:
    """Whether early stopping is due (counted on rank 0, whose answer is the one acted on)."""
    return bool(train_cfg.patience) and pos.validations_since_best >= train_cfg.patience


def out_of_time(train_cfg: TrainConfig, elapsed: float) -> bool:
    """Whether the wall-clock budget is spent. Clocks differ between ranks: rank 0's answer is the one acted on."""
    return bool(train_cfg.max_minutes) and elapsed >= 60 * train_cfg.max_minutes


class StopSignals:
    """SIGINT/SIGTERM ask training to stop after the current step; a second Ctrl-C stops at once."""

    def __init__(self):
        self.received = ""
        self.previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class TrainInterrupted(MtError):
    """Ctrl-C or SIGTERM: the run stopped at a step boundary after saving `last.pt`."""

    exit_code = 130


def diverged_advice(out_dir: Path) -> str:
    """What to try after the loss diverged; the checkpoints on disk are all finite (see `train.check_finite`)."""
    fixes = "try a lower train.lr, gradient clipping (train.clip_norm=1.0) or train.precision=fp32"
    if (out_dir / checkpoint.LAST).is_file():
        return f"To go on, {fixes}: mt train --resume --out {out_dir} --set train.lr=..."
    return f"No checkpoint was saved; start again and {fixes}."
