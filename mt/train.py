"""The training loop: token-budget batches, Adam with warmup + inverse-sqrt decay (and an optional linear
cooldown to the end of the budget), label-smoothed loss, mixed precision, validation (loss and BLEU),
`last.pt` / `best.pt` checkpoints, and resume.

`train` reads in phases: `open_run` (check the config, the data and, on resume, the checkpoint), `build_state`
(model, optimizer, grad scaler, data position: one `TrainState`), `loop` (the steps), `validate_and_save`, and
the end (a final validation, or `TrainInterrupted` after a signal).

A run directory holds `last.pt` (everything needed to resume) and the newest `train.keep_checkpoints`
`checkpoint-{step}.pt` (the same, for falling back when `last.pt` is damaged), `best.pt` (best validation score,
weights and config only), `config.yaml` (the resolved config) and `log.jsonl` (one JSON object per log or
validation).

A step whose loss or gradients are not finite is skipped (see `train_step`): its batches are consumed, but the
weights, the optimizer and `Position.step` stay as they were, so `max_steps` and the schedule count real updates.
`train.max_bad_steps` skipped steps in a row stop the run; a checkpoint with non-finite weights is never written.

Several processes (`torchrun --nproc_per_node W -m mt train ...`) train one model as one process would with
W times the accumulation; mt/distributed.py says how the ranks share the data, the loss and the stops.

A step has one host-device sync, reading whether to apply the update (see `train_step`); the summed loss stays on
the device until a log line needs it. The next two steps' batches are collated in a background thread
(`mt.data.Prefetch`).
"""

from __future__ import annotations

import json
import math
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import NoReturn, TextIO

import sacrebleu
import torch
import torch.nn.functional as F
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from mt import checkpoint, distributed
from mt.config import Config, TrainConfig, to_dict, validate
from mt.data import (
    Batch,
    Prefetch,
    Split,
    batch_by_tokens,
    collate,
    fit_vocab,
    load_tokenizers,
    pinned,
    step_batches,
    train_splits,
)
from mt.device import autocast, autocast_dtype, pick_device
from mt.errors import MtError
from mt.fast import for_training
from mt.lines import read_text
from mt.model import Transformer, count_parameters
from mt.tokenizer import PAD, Tokenizer
from mt.translate import Options, translate_ids


class Stop(IntEnum):
    """What the ranks agree on after each step: the largest wins (`distributed.agree_max`)."""

    NO = 0
    FINISH = 1  # the time budget is spent, or patience ran out: validate the last step and end as usual
    SIGNAL = 2  # SIGINT/SIGTERM: save last.pt and raise `TrainInterrupted`


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
    train_data: list[Split]
    valid_split: Split | None
    valid_refs: list[str] | None
    progress: bool  # rank 0 prints log lines (and a progress bar on a terminal)
    resumed_from: Path | None = None
    saved: dict | None = None  # the checkpoint resumed from
    log: TextIO | None = None  # log.jsonl, rank 0's

    @property
    def main(self) -> bool:
        return self.rank == 0

    def record(self, entry: dict) -> None:
        if self.log is not None:
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()

    def say(self, message: str) -> None:
        if self.progress:
            tqdm.write(message, file=sys.stderr)

    def note(self, message: str) -> None:
        """A note on stderr from rank 0, also with --quiet: something about the run the user should know."""
        if self.main:
            print(f"note: {message}", file=sys.stderr)


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


def train(cfg: Config, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train per `cfg`, writing into `out_dir`; returns the last validation metrics ({} on ranks other than 0).

    Started by torchrun as one of several processes, joins their process group for the run (mt/distributed.py)."""
    device = distributed.start(pick_device(cfg.train.device))
    try:
        run = open_run(cfg, Path(out_dir), device, resume, progress)
        state = build_state(run)
        start_log(run, state)
        try:
            return loop(run, state)
        finally:
            if run.log is not None:
                run.log.close()
    finally:
        distributed.stop()


def open_run(cfg: Config, out_dir: Path, device: torch.device, resume: bool, progress: bool) -> Run:
    """Check the config, the data and (on resume) the checkpoint to go on from; nothing is written yet."""
    rank, world = distributed.rank(), distributed.world_size()
    resumed_from, saved = None, None
    if resume:
        resumed_from, saved = checkpoint.latest_resumable(out_dir, warn=rank == 0)
    elif (out_dir / checkpoint.LAST).is_file() or checkpoint.numbered(out_dir):
        raise MtError(f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out")
    validate(cfg)  # as load_config does, for a config built in code
    data_dir = Path(cfg.data)
    src_tok, tgt_tok, meta = load_tokenizers(data_dir)
    if saved is not None:
        checkpoint.check_same_vocabulary(saved, resumed_from, src_tok, tgt_tok, data_dir)
    fit_vocab(cfg, src_tok, tgt_tok, meta.get("joint", True))
    if saved is not None and to_dict(cfg)["model"] != saved["config"]["model"]:
        raise MtError(f"{resumed_from}: the model config differs from the run's; a resumed run keeps its model")
    has_valid = (data_dir / "valid.src.ids.npy").is_file()
    return Run(cfg, out_dir, device, autocast_dtype(cfg.train.precision, device), rank, world, src_tok, tgt_tok,
               {"src": meta.get("src"), "tgt": meta.get("tgt")}, train_splits(data_dir),
               Split(data_dir, "valid") if has_valid else None,
               read_text(data_dir / "valid.tgt.txt") if has_valid else None,
               progress and rank == 0, resumed_from, saved)


def build_state(run: Run) -> TrainState:
    """The model (with the training fast paths of mt/fast.py), its optimizer and grad scaler, seeded; on resume,
    everything as the checkpoint left it."""
    train_cfg = run.cfg.train
    random.seed(train_cfg.seed)
    torch.manual_seed(train_cfg.seed)
    if train_cfg.threads:
        torch.set_num_threads(train_cfg.threads)
    model = for_training(Transformer(run.cfg.model).to(run.device))
    optimizer = adam([p for p in model.parameters() if p.requires_grad], train_cfg)
    scaler = torch.amp.GradScaler(run.device.type, enabled=run.amp_dtype == torch.float16)
    state = TrainState(model, model, None, optimizer, scaler)
    if run.saved is not None:
        restore(run, state)
    if run.rank > 0:  # a dropout stream of its own (see mt/distributed.py)
        torch.manual_seed(distributed.rank_seed(train_cfg.seed, run.rank, state.position.step))
    state.ddp = distributed.wrap(model, run.device)  # None in a single process
    state.wrapped = state.ddp or model
    if train_cfg.compile:
        state.wrapped = torch.compile(state.wrapped)
    return state


def restore(run: Run, state: TrainState) -> None:
    """Load the checkpoint resumed from into `state`."""
    saved = run.saved["train"]
    # "weights": the raw weights of a run with train.ema (since removed), whose "model" was their moving average.
    state.model.load_state_dict(saved.get("weights", run.saved["model"]))
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scaler.load_state_dict(saved["scaler"])
    state.position = Position.from_checkpoint(saved["position"])
    state.best_score = saved["best_score"] if "best_score" in saved else saved["best_bleu"]  # earlier versions'
    step = state.position.step
    if "weights" in saved:  # the best score so far was the average's: not comparable
        state.best_score, state.position.validations_since_best = -math.inf, 0
        run.note(f"{run.resumed_from} kept a moving average of the weights (train.ema, since removed): training "
                 f"goes on from the raw weights, and validation and best.pt start afresh from step {step}")
    if run.main:
        checkpoint.restore_rng(saved["rng"], run.device)
    batches_before = saved.get("world_size", 1) * run.saved["config"]["train"]["accumulate"]
    batches_now = run.world * run.cfg.train.accumulate
    if batches_before != batches_now:
        run.note(f"{run.resumed_from} was trained with {batches_before} batches per step; from step {step} on a "
                 f"step takes {batches_now} ({run.world} processes × train.accumulate={run.cfg.train.accumulate})")
    # A run that validated at its last step (it ended, rather than being interrupted) is not validated again.
    metrics = run.saved.get("metrics") or {}
    if metrics.get("step") == step:
        state.metrics, state.validated = metrics, step


def start_log(run: Run, state: TrainState) -> None:
    """Rank 0 writes the resolved config, opens log.jsonl and says what trains where."""
    if run.main:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        (run.out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(run.cfg), sort_keys=False), encoding="utf-8")
        run.log = open(run.out_dir / "log.jsonl", "a", encoding="utf-8")
    pairs, copies = len(run.train_data[0]), len(run.train_data)
    run.say(f"model: {count_parameters(state.model):,} parameters · device {run.device}"
            + (f" × {run.world} processes" if run.world > 1 else "")
            + f" · precision {run.amp_dtype or torch.float32} · {pairs:,} training pairs"
            + (f", {copies} sampled segmentations" if copies > 1 else ""))


def loop(run: Run, state: TrainState) -> dict:
    """Train until the step, epoch or time budget, or patience, runs out, or a signal stops the run; returns the
    last validation's metrics."""
    train_cfg, pos, device = run.cfg.train, state.position, run.device
    batches_per_step = run.world * train_cfg.accumulate
    on_gpu = device.type == "cuda"  # pinned host memory lets the copy to the GPU run asynchronously
    steps = Prefetch((pinned(s) if on_gpu else s for s in step_batches(run.train_data, run.cfg, pos.epoch,
                                                                        pos.batch, run.world, run.rank)), depth=2)
    signals = StopSignals()
    bar = tqdm(total=train_cfg.max_steps, initial=pos.step, disable=not run.progress or not sys.stderr.isatty(),
               unit="step", dynamic_ncols=True)
    interval = Interval(torch.zeros((), device=device))
    bad_steps = 0  # skipped steps in a row
    state.started = time.time()
    try:
        stop = agree(Stop.FINISH if run.main and (out_of_time(train_cfg, state.elapsed())
                                                  or out_of_patience(train_cfg, pos)) else Stop.NO)
        state.wrapped.train()
        while not stop and not finished(train_cfg, pos):
            data = steps.next()
            pos.epoch, pos.batch = data.epoch, data.batch
            if finished(train_cfg, pos):  # the data has moved on to an epoch past train.max_epochs
                break
            lr = learning_rate(pos.step + 1, train_cfg.lr, train_cfg.warmup) * cooldown_factor(
                budget_progress(train_cfg, pos.step, state.elapsed()), train_cfg.cooldown)
            loss, applied = train_step(state.wrapped, state.optimizer, state.scaler,
                                       [b.to(device) for b in data.batches], run.cfg, device, run.amp_dtype, lr,
                                       data.n_tokens, state.ddp)
            pos.batch += batches_per_step  # a skipped step's batches are consumed too: no bad batch is retried
            interval.add(loss, data.n_tokens, applied)
            if applied:
                pos.step += 1
                bad_steps = 0
                bar.update(1)
            else:
                bad_steps += 1
                if bad_steps >= train_cfg.max_bad_steps:
                    stop_diverged(run, state, interval, bad_steps)
            stop = agree(Stop.SIGNAL if signals.received else
                         Stop.FINISH if run.main and out_of_time(train_cfg, state.elapsed()) else Stop.NO)
            if applied and pos.step % train_cfg.log_every == 0:
                log_progress(run, interval.report(pos, state.optimizer), bar)
            if applied and pos.step % train_cfg.valid_every == 0:
                validate_and_save(run, state)
                state.wrapped.train()
                if train_cfg.patience and not stop:
                    stop = stop_early(run, state)
            if stop == Stop.SIGNAL:
                stop_interrupted(run, state, signals.received)
        if state.validated != pos.step:
            validate_and_save(run, state)
    finally:
        steps.close()
        bar.close()
        signals.restore()
    return state.metrics


def agree(stop: Stop) -> Stop:
    """The most urgent of every rank's `stop`, so that all of them act on it after the same step."""
    return Stop(distributed.agree_max(stop))


def validate_and_save(run: Run, state: TrainState) -> None:
    """Rank 0 validates, saves best.pt on a new best score, and last.pt; the other ranks wait for it."""
    check_finite(run, state)
    pos = state.position
    state.metrics, state.validated = {}, pos.step
    if run.main:
        metrics = {"step": pos.step, "epoch": pos.epoch}
        if run.valid_split is not None:
            valid_started = time.time()
            with distributed.cores_of_waiting_ranks(run.device):
                metrics |= validation_metrics(state.model, run.valid_split, run.valid_refs, run.tgt_tok, run.cfg,
                                              run.device, run.amp_dtype)
            metrics["valid_seconds"] = time.time() - valid_started
        metrics["elapsed"] = state.elapsed()
        score = metrics.get("valid_bleu", -metrics.get("valid_loss", 0.0))
        if score > state.best_score or run.valid_split is None:
            state.best_score, pos.validations_since_best = score, 0
            checkpoint.save(snapshot(run, state, metrics), run.out_dir / "best.pt")
            metrics["best"] = True
        else:
            pos.validations_since_best += 1
        save_last(run, state, metrics)
        run.record(metrics)
        run.say(" · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        state.metrics = metrics
    distributed.barrier()  # the other ranks wait while rank 0 validates and saves


def check_finite(run: Run, state: TrainState) -> None:
    """Checked before every save: a checkpoint with NaN weights would poison every resume and translation. Every
    rank checks (the weights are the same on all), so all of them stop together."""
    if not bool(torch.stack([torch.isfinite(p).all() for p in state.model.parameters()]).all()):
        raise MtError(f"step {state.position.step}: the model's weights are not finite; no checkpoint written. "
                      + diverged_advice(run.out_dir))


def snapshot(run: Run, state: TrainState, metrics: dict) -> dict:
    """What best.pt holds, and every checkpoint: weights, config, tokenizers, languages, step, metrics."""
    return {"model": state.model.state_dict(), "config": to_dict(run.cfg),
            "spm": {"src": run.src_tok.model_proto, "tgt": run.tgt_tok.model_proto}, "langs": run.langs,
            "step": state.position.step, "metrics": metrics}


def save_last(run: Run, state: TrainState, metrics: dict) -> None:
    """Rank 0, after `check_finite`: last.pt (and a numbered copy), with everything needed to resume."""
    saved = snapshot(run, state, metrics)
    saved["train"] = {"optimizer": state.optimizer.state_dict(), "scaler": state.scaler.state_dict(),
                      "position": vars(state.position) | {"elapsed": state.elapsed()},
                      "best_score": state.best_score, "rng": checkpoint.rng_state(run.device), "world_size": run.world}
    checkpoint.save_last(saved, run.out_dir, run.cfg.train.keep_checkpoints)


def log_progress(run: Run, report: dict, bar: tqdm) -> None:
    run.record(report)
    bar.set_postfix(loss=f"{report['loss']:.3f}", lr=f"{report['lr']:.2e}", tok_s=f"{report['tgt_tok_per_s']:.0f}")
    if bar.disable:  # no live bar: one log line per interval instead
        run.say(f"step {report['step']} · epoch {report['epoch']} · loss {report['loss']:.3f} · "
                f"lr {report['lr']:.2e} · {report['tgt_tok_per_s']:.0f} tgt tok/s"
                + (f" · {report['skipped_steps']} skipped (non-finite)" if report["skipped_steps"] else ""))


def stop_early(run: Run, state: TrainState) -> Stop:
    """Whether patience ran out; rank 0 counts the validations, so its answer is the one acted on."""
    stop = agree(Stop.FINISH if run.main and out_of_patience(run.cfg.train, state.position) else Stop.NO)
    if stop:
        patience = run.cfg.train.patience
        run.record({"step": state.position.step, "early_stop": f"no new best in {patience} validations"})
        run.say(f"early stop: no new best validation score in the last {patience} validations")
    return stop


def stop_diverged(run: Run, state: TrainState, interval: Interval, bad_steps: int) -> NoReturn:
    run.record(interval.report(state.position, state.optimizer))
    raise MtError(f"after step {state.position.step}: {bad_steps} steps in a row had a non-finite loss or "
                  f"gradients and were skipped; stopped. " + diverged_advice(run.out_dir))


def stop_interrupted(run: Run, state: TrainState, received: str) -> NoReturn:
    """Save last.pt at this step boundary, then stop every rank with the command that continues the run."""
    check_finite(run, state)
    if run.main:
        save_last(run, state, state.metrics)
    distributed.barrier()  # nobody exits (and so has the launcher stop the others) before the save
    launcher = f"torchrun --nproc_per_node {run.world} -m " if run.world > 1 else ""
    raise TrainInterrupted(f"{received or 'SIGTERM (on another process)'} at step {state.position.step}: saved "
                           f"{run.out_dir / checkpoint.LAST}. Continue with: {launcher}mt train --resume "
                           f"--out {run.out_dir}")


def diverged_advice(out_dir: Path) -> str:
    """What to try after the loss diverged; the checkpoints on disk are all finite (see `check_finite`)."""
    fixes = "try a lower train.lr, gradient clipping (train.clip_norm=1.0) or train.precision=fp32"
    if (out_dir / checkpoint.LAST).is_file():
        return f"To go on, {fixes}: mt train --resume --out {out_dir} --set train.lr=..."
    return f"No checkpoint was saved; start again and {fixes}."


class TrainInterrupted(MtError):
    """Ctrl-C or SIGTERM: the run stopped at a step boundary after saving `last.pt`."""

    exit_code = 130


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

    def report(self, pos: Position, optimizer: torch.optim.Optimizer) -> dict:
        """The log record of the interval, on every rank alike, then a new interval: all ranks must call this
        together, as the loss is summed over ranks (the one time the loss is read from the device)."""
        seconds = time.time() - self.start
        loss = distributed.all_reduce_sum(self.loss.clone()).item()
        report = {"step": pos.step, "epoch": pos.epoch, "loss": loss / max(self.tokens, 1),
                  "lr": optimizer.param_groups[0]["lr"], "tgt_tok_per_s": self.tokens / max(seconds, 1e-9),
                  "skipped_steps": self.skipped}
        self.loss, self.tokens, self.skipped, self.start = torch.zeros_like(self.loss), 0, 0, time.time()
        return report


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               batches: list[Batch], cfg: Config, device: torch.device, amp_dtype: torch.dtype | None,
               lr: float, n_tokens: int | None = None,
               ddp: DistributedDataParallel | None = None) -> tuple[torch.Tensor, bool]:
    """One optimizer step over `batches` (accumulated micro-batches). Returns this rank's summed loss, left on the
    device (reading it would wait for the GPU: the caller reads it when it logs), and whether the update was
    applied: a step whose loss or gradients are not finite, on any rank, changes neither weights nor optimizer.

    `model` is what runs the forward pass (the Transformer, or its DDP or compiled wrapper). `n_tokens` is the
    number of target tokens in the whole step, on all ranks (default: those of `batches`); `ddp`, in a run of
    several processes, the DDP wrapper, whose gradient all-reduce runs on the last micro-batch only.
    """
    world = distributed.world_size()
    n_tokens = n_tokens if n_tokens is not None else sum(b.n_tgt_tokens for b in batches)
    total = torch.zeros((), device=device)
    for i, batch in enumerate(batches):
        with distributed.sync_gradients(ddp, last=i == len(batches) - 1):
            with autocast(amp_dtype, device):
                loss = model(batch.src, batch.tgt_in, batch.tgt_out, cfg.train.label_smoothing)
            # Per target token of the whole step; × world because DDP averages the ranks' gradients.
            scaler.scale(loss * world / n_tokens).backward()
        total += loss.detach()
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    scaler.unscale_(optimizer)
    # One total gradient norm per step: it clips, and it is not finite iff some gradient is not.
    if cfg.train.clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # The step's one host-device sync: whether to apply it, which the host must know, as it counts the steps and
    # sets the schedule. It comes after the whole backward pass is queued, so the GPU idles once per step (not
    # once per micro-batch, as reading each loss would make it). After DDP's all-reduce the gradients are the
    # same on every rank; the losses are not, hence one more tiny all-reduce.
    bad = (~torch.isfinite(norm) | ~torch.isfinite(total)).float()
    applied = distributed.all_reduce_sum(bad).item() == 0
    if applied:
        scaler.step(optimizer)
    scaler.update()  # fp16: a non-finite step lowers the loss scale, as it would had the scaler skipped it itself
    optimizer.zero_grad(set_to_none=True)
    return total, applied


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


def finished(train_cfg: TrainConfig, pos: Position) -> bool:
    """Whether the step or epoch limit is reached: a function of the position, so every rank agrees."""
    return pos.step >= train_cfg.max_steps or bool(train_cfg.max_epochs) and pos.epoch >= train_cfg.max_epochs


def out_of_patience(train_cfg: TrainConfig, pos: Position) -> bool:
    """Whether early stopping is due (counted on rank 0, whose answer is the one acted on)."""
    return bool(train_cfg.patience) and pos.validations_since_best >= train_cfg.patience


def out_of_time(train_cfg: TrainConfig, elapsed: float) -> bool:
    """Whether the wall-clock budget is spent. Clocks differ between ranks: rank 0's answer is the one acted on."""
    return bool(train_cfg.max_minutes) and elapsed >= 60 * train_cfg.max_minutes


def adam(params: list[torch.nn.Parameter], train_cfg: TrainConfig) -> torch.optim.Adam:
    """Adam as the train config sets it, fused: one pass over each parameter's memory, on GPU and on CPU. Weight
    decay is decoupled from the gradient (AdamW, as fairseq's --weight-decay): each step shrinks every weight by
    lr * weight_decay of itself."""
    return torch.optim.Adam(params, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), eps=train_cfg.eps,
                            weight_decay=train_cfg.weight_decay, decoupled_weight_decay=True, fused=True)


@torch.inference_mode()
def validation_metrics(model: Transformer, split: Split, refs: list[str], tgt_tok: Tokenizer, cfg: Config,
                       device: torch.device, amp_dtype: torch.dtype | None) -> dict:
    """Validation loss (per target token, label smoothing off) and BLEU (of greedy decoding, or beam search with
    `train.valid_beam` > 1) against the raw references."""
    model.eval()
    lengths = [max(s, t) + 1 for s, t in zip(split.src_lens, split.tgt_lens, strict=True)]
    loss, tokens = 0.0, 0
    for idx in batch_by_tokens(lengths, cfg.train.max_tokens):
        batch = collate(split, idx, cfg.model.max_len).to(device)
        with autocast(amp_dtype, device):
            logits = model(batch.src, batch.tgt_in)
        loss += F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD,
                                reduction="sum").item()
        tokens += batch.n_tgt_tokens
    metrics = {"valid_loss": loss / tokens, "valid_ppl": math.exp(min(loss / tokens, 50.0))}
    if cfg.train.valid_bleu:
        srcs = [split.src(i)[:cfg.model.max_len - 1].tolist() for i in range(len(split))]
        opts = Options.from_config(cfg.decode, beam=cfg.train.valid_beam)
        hyps = translate_ids(model, srcs, opts, device)
        texts = tgt_tok.decode([h[0].tokens for h in hyps])
        metrics["valid_bleu"] = sacrebleu.corpus_bleu(texts, [refs]).score
    return metrics
