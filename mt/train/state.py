"""What a training run holds: `Run`, fixed while it trains; `TrainState`, what changes; `Position`, where it is."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from mt.config import Config
from mt.data.batches import BothWays, Tagged
from mt.data.ids import Split
from mt.data.tokenizer import Tokenizer
from mt.model.transformer import Transformer
from mt.train.finetune import Init
from mt.train.log import RunLog


@dataclass
class Position:
    """Where training is: optimizer steps taken, and the next batch of which epoch."""

    step: int = 0  # updates applied; a skipped (non-finite) step does not count, though its batches are consumed
    epoch: int = 0
    batch: int = 0
    elapsed: float = 0.0  # seconds of training before this process started
    validations_since_best: int = 0  # for train.patience

    @classmethod
    def from_checkpoint(cls, saved: dict) -> Position:
        saved = dict(saved)
        if "stale" in saved:  # the name checkpoints of earlier versions use
            saved["validations_since_best"] = saved.pop("stale")
        return cls(**saved)


@dataclass
class Run:
    """What stays fixed while a run trains: its config, device, data, tokenizers and where it writes."""

    cfg: Config
    out_dir: Path
    device: torch.device
    amp_dtype: torch.dtype | None
    rank: int
    world: int
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    langs: dict
    train_data: list[Split | BothWays]
    valid_split: Split | Tagged | None
    valid_refs: list[str] | None
    log: RunLog
    resumed_from: Path | None = None
    saved: dict | None = None  # the checkpoint resumed from
    init: Init | None = None  # the checkpoint a fine-tuning run starts from (`--init`)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def init_record(self) -> dict | None:
        """Where the run's weights started, if not from scratch: kept in every checkpoint, and across resumes."""
        if self.init is not None:
            return self.init.record()
        return (self.saved or {}).get("init")


@dataclass
class TrainState:
    """What changes while a run trains."""

    model: Transformer  # what is validated and saved
    wrapped: torch.nn.Module  # what the training step runs: `model` under DDP and/or torch.compile, or itself
    ddp: DistributedDataParallel | None
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    position: Position = field(default_factory=Position)
    best_score: float = -math.inf  # the best validation score so far: BLEU, or minus the loss when BLEU is off
    metrics: dict = field(default_factory=dict)  # the latest validation's (on rank 0; {} on the others)
    validated: int = -1  # the step of the latest validation, on every rank
    started: float = field(default_factory=time.time)  # when this process began training

    def elapsed(self) -> float:
        """Seconds of training, this process's and those before it."""
        return self.position.elapsed + time.time() - self.started
