"""The optimizer and its schedules: Adam; the learning rate's warmup, inverse-sqrt decay and optional linear
cooldown; late dropout."""

from __future__ import annotations

import math

import torch
from torch import nn

from mt.config import TrainConfig
from mt.model.transformer import CrossAttention, SelfAttention
from mt.train import distributed


def adam(params: list[torch.nn.Parameter], train_cfg: TrainConfig) -> torch.optim.Adam:
    """Adam as the train config sets it, fused (one pass over each parameter's memory). Weight decay is decoupled
    from the gradient (AdamW, as fairseq's --weight-decay): each step shrinks every weight by lr * weight_decay."""
    return torch.optim.Adam(params, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), eps=train_cfg.eps,
                            weight_decay=train_cfg.weight_decay, decoupled_weight_decay=True, fused=True)


def learning_rate(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak`, then decay with 1/sqrt(step): the paper's schedule, peak made explicit.

    The paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) is this with peak = (d_model * warmup)^-0.5.
    """
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def cooldown_factor(progress: float, cooldown: float) -> float:
    """The learning rate's multiplier at `progress` (0 to 1) through the budget: 1, then falling linearly to 0
    over the last `cooldown` of it (as in warmup-stable-decay schedules, Hägele et al. 2024)."""
    if cooldown <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - progress) / cooldown))


def budget_progress(train_cfg: TrainConfig, step: int, elapsed: float) -> float:
    """How far through its budget the run is: by steps (train.max_steps) or wall clock (train.max_minutes),
    whichever is further. Clocks differ between ranks: all use the furthest, so every rank has the same rate."""
    progress = step / train_cfg.max_steps
    if train_cfg.max_minutes:
        progress = max(progress, elapsed / (60 * train_cfg.max_minutes))
    return distributed.agree_max(round(1e6 * progress)) / 1e6 if train_cfg.cooldown else progress


def step_rate(train_cfg: TrainConfig, step: int, elapsed: float) -> float:
    """The learning rate of the update after `step`: the schedule, times the cooldown's factor."""
    return learning_rate(step + 1, train_cfg.lr, train_cfg.warmup) * cooldown_factor(
        budget_progress(train_cfg, step, elapsed), train_cfg.cooldown)


class LateDropout:
    """Late dropout (Liu et al., 2023): the first `train.late_dropout` epochs train without dropout, then the
    model's own rates apply. A budget that shows the data a few times (a slow machine's 10 minutes) learns faster
    without dropout; one that shows it many times still needs it against overfitting, and gets it."""

    def __init__(self, model: nn.Module, epochs: int):
        self.epochs = epochs
        self.rates = {(m, "p"): m.p for m in model.modules() if isinstance(m, nn.Dropout)}
        self.rates.update({(m, "dropout"): m.dropout for m in model.modules()
                           if isinstance(m, (SelfAttention, CrossAttention))})
        self.on: bool | None = None

    def at(self, epoch: int) -> None:
        """Sets every dropout of the model for training in `epoch` (0-based)."""
        on = epoch >= self.epochs
        if on != self.on:
            for (module, name), rate in self.rates.items():
                setattr(module, name, rate if on else 0.0)
            self.on = on
