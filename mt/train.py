"""The training loop: token-budget batches, Adam with warmup + inverse-sqrt decay (and an optional linear
cooldown to the end of the budget), label-smoothed loss,
mixed precision on GPU, validation (loss and BLEU), `last.pt` / `best.pt` checkpoints, and resume.

A run directory holds `last.pt` (everything needed to resume) and the newest `train.keep_checkpoints`
`checkpoint-{step}.pt` (the same, for falling back when `last.pt` is damaged), `best.pt` (best validation BLEU,
weights and config only), `config.yaml` (the resolved config) and `log.jsonl` (one JSON object per log or
validation). With `train.ema`, the weights validated and saved as "model" are the exponential moving average
(mt/ema.py); the raw weights training goes on from are saved beside the optimizer, as "weights".

A step whose loss or gradients are not finite is skipped (see `train_step`): its batches are consumed, but the
weights, the optimizer and `Position.step` stay as they were, so `max_steps` and the schedule count real updates.
`train.max_bad_steps` skipped steps in a row stop the run; a checkpoint with non-finite weights is never written.

Several processes (`torchrun --nproc_per_node W -m mt train ...`; see mt/distributed.py) train one model with
DistributedDataParallel:
- Data: one optimizer step takes W × A consecutive batches of the epoch's batch list (A = train.accumulate), and
  rank r trains on the r-th, (r + W)-th, ... of them. That is the step single-process training with accumulate
  W × A takes, and the data position (epoch, batch) stays one global number, the same on every rank: a run can
  resume with another number of processes (with another W × A its steps hold more or fewer batches from then on).
- Loss: every rank divides its summed loss by the target tokens of the whole step (all ranks' batches, counted
  from the lengths on disk, so no communication) and multiplies it by W, because DDP averages the ranks'
  gradients: the result is the per-token gradient of the whole step, as one process would compute it.
- Agreement: a step is skipped on every rank when any rank's loss or gradients are not finite; rank 0's time
  budget (`train.max_minutes`) and a SIGINT/SIGTERM on any rank stop every rank after the same step; a cooldown
  by the clock follows the furthest rank's clock.
- Rank 0 alone validates, writes checkpoints, config.yaml and log.jsonl, and prints; the others wait at a barrier.
- Dropout: rank 0 draws from the single-process stream, rank r > 0 from one seeded with (seed, rank, step), so a
  run with dropout is not bitwise equal to single-process training (the equivalence tests use dropout 0).
  Checkpoints hold rank 0's random state; on resume, the other ranks reseed from (seed, rank, step).

Speed: a step has one host-device sync, reading whether to apply the update (see `train_step`); the summed loss
stays on the device until a log line needs it. The batches of the next two steps are collated (and pinned in
memory on GPU) in a background thread while the current step computes (`Prefetch`).
"""

from __future__ import annotations

import json
import math
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sacrebleu
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from mt import checkpoint, distributed
from mt.config import Config, from_dict, set_value, to_dict, validate
from mt.data import Batch, Split, batch_by_tokens, collate, epoch_batches, epoch_split, train_splits
from mt.device import autocast_dtype, pick_device
from mt.ema import WeightAverage
from mt.errors import MtError
from mt.loss import label_smoothed_nll
from mt.model import Transformer, count_parameters
from mt.tokenizer import PAD, Tokenizer
from mt.translate import Options, translate_ids


@dataclass
class Position:
    """Where training is: optimizer steps taken, and the next batch of which epoch."""

    step: int = 0  # updates applied; a skipped (non-finite) step does not count, though its batches are consumed
    epoch: int = 0
    batch: int = 0
    elapsed: float = 0.0  # seconds of training before this process started
    stale: int = 0  # validations in a row without a new best score (for train.patience)


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


def budget_progress(t, pos: Position, started: float) -> float:
    """How far through its budget the run is: by steps (train.max_steps) or wall clock (train.max_minutes),
    whichever is further. Clocks differ between ranks: all use the furthest, so every rank has the same rate."""
    progress = pos.step / t.max_steps
    if t.max_minutes:
        progress = max(progress, (pos.elapsed + time.time() - started) / (60 * t.max_minutes))
    return distributed.agree_max(round(1e6 * progress)) / 1e6 if t.cooldown else progress



def load_tokenizers(data_dir: Path) -> tuple[Tokenizer, Tokenizer, dict]:
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise MtError(f"{meta_path}: not found; run `mt prepare ... --out {data_dir}` first, or set `data:`")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("joint", True):
        tok = Tokenizer.load(data_dir / "spm.model")
        return tok, tok, meta
    return Tokenizer.load(data_dir / "spm.src.model"), Tokenizer.load(data_dir / "spm.tgt.model"), meta


def fit_vocab(cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer, joint: bool) -> None:
    """Size the model's tables to the data; a config that already names other sizes is an error."""
    m = cfg.model
    for key, have in (("src_vocab_size", src_tok.vocab_size), ("tgt_vocab_size", tgt_tok.vocab_size)):
        want = getattr(m, key)
        if want and want != have:
            raise MtError(f"model.{key}={want} but the data in {cfg.data} has a vocabulary of {have}; "
                          f"remove model.{key} (it is taken from the data) or prepare the data again")
        setattr(m, key, have)
    if m.share_embeddings and not joint:
        m.share_embeddings = False  # separate vocabularies cannot share one table


def adam(params: list[torch.nn.Parameter], t) -> torch.optim.Adam:
    """Adam as `t` (the train config) sets it, fused: one pass over each parameter's memory, on GPU and on CPU,
    where it takes a third of the foreach version's time (machine B: 20 vs 60 ms for the base model's 48M
    parameters, 3-4% of its step). Weight decay is decoupled from the gradient (AdamW, as fairseq's
    --weight-decay): each step shrinks every weight by lr * weight_decay of itself."""
    return torch.optim.Adam(params, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay,
                            decoupled_weight_decay=True, fused=True)


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over non-padding target tokens (normalised by the caller).

    Same value and gradient as F.cross_entropy(label_smoothing=...), at half its cost (see mt/loss.py)."""
    return label_smoothed_nll(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), smoothing, PAD)


def train(cfg: Config, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train per `cfg`, writing into `out_dir`; returns the last validation metrics ({} on ranks other than 0).

    Started by torchrun as one of several processes, joins their process group for the run (see the top)."""
    device = distributed.start(pick_device(cfg.train.device))
    try:
        return train_on(device, cfg, Path(out_dir), resume, progress)
    finally:
        distributed.stop()


STOP_TIME, STOP_SIGNAL = 1, 2  # what ranks agree on after each step; the larger wins (see `distributed.agree_max`)


def train_on(device: torch.device, cfg: Config, out_dir: Path, resume: bool, progress: bool) -> dict:
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    progress = progress and main
    data_dir = Path(cfg.data)
    last_path = out_dir / checkpoint.LAST
    state = None
    if resume:
        resume_path, state = resume_state(out_dir, warn=main)
    elif last_path.is_file() or checkpoint.numbered(out_dir):
        raise MtError(f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out")
    t = cfg.train
    for key, value, least in (("keep_checkpoints", t.keep_checkpoints, 0), ("max_bad_steps", t.max_bad_steps, 1)):
        if value < least:
            raise MtError(f"train.{key}={value}: must be at least {least}")

    src_tok, tgt_tok, meta = load_tokenizers(data_dir)
    if state is not None:
        check_same_vocabulary(state, resume_path, src_tok, tgt_tok, data_dir)
    fit_vocab(cfg, src_tok, tgt_tok, meta.get("joint", True))
    if state is not None and to_dict(cfg)["model"] != state["config"]["model"]:
        raise MtError(f"{resume_path}: the model config differs from the run's; a resumed run keeps its model")
    random.seed(t.seed)
    torch.manual_seed(t.seed)
    if t.threads:
        torch.set_num_threads(t.threads)
    amp_dtype = autocast_dtype(t.precision, device)

    model = Transformer(cfg.model).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = adam(params, t)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    pos = Position()
    best_bleu = -math.inf  # the best validation score: BLEU, or minus the loss when BLEU is off
    if state is not None:
        model.load_state_dict(state["train"].get("weights", state["model"]))  # raw weights, if "model" is the EMA
        optimizer.load_state_dict(state["train"]["optimizer"])
        scaler.load_state_dict(state["train"]["scaler"])
        pos = Position(**state["train"]["position"])
        best_bleu = state["train"]["best_bleu"]
        if (state["config"]["train"].get("ema", 0.0) > 0) != (t.ema > 0):
            # The best score so far was another kind of weights' (the average, or the raw model): not comparable.
            best_bleu, pos.stale = -math.inf, 0
            if main:
                print(f"note: train.ema is now {'on' if t.ema else 'off'}: validation and best.pt start afresh "
                      f"from step {pos.step}, on the {'moving average' if t.ema else 'raw weights'}",
                      file=sys.stderr)
        if main:
            restore_rng(state["train"]["rng"], device)
        steps_before = state["train"].get("world_size", 1) * state["config"]["train"]["accumulate"]
        if main and steps_before != world * t.accumulate:
            print(f"note: {resume_path} was trained with {steps_before} batches per step; from step {pos.step} on "
                  f"a step takes {world * t.accumulate} ({world} processes × train.accumulate={t.accumulate})",
                  file=sys.stderr)
    # The weights validated and saved: the moving average, kept by rank 0 alone, or the trained model itself.
    averaged = WeightAverage(model, t.ema, state["model"] if state is not None else None) if t.ema and main else None
    served = averaged.model if averaged is not None else model
    if rank > 0:  # a dropout stream of its own (see the top)
        torch.manual_seed(rank_seed(t.seed, rank, pos.step))
    ddp = distributed.wrap(model, device)  # None in a single process
    forward = ddp or model  # what the training step calls; `served` is what is validated and saved
    if t.compile:
        forward = torch.compile(forward)

    train_data = train_splits(data_dir)
    valid_split = Split(data_dir, "valid") if (data_dir / "valid.src.ids.npy").is_file() else None
    valid_refs = read_lines(data_dir / "valid.tgt.txt") if valid_split is not None else None
    log = None
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
        log = open(out_dir / "log.jsonl", "a", encoding="utf-8")
    say = (lambda msg: tqdm.write(msg, file=sys.stderr)) if progress else (lambda msg: None)
    say(f"model: {count_parameters(model):,} parameters · device {device}"
        + (f" × {world} processes" if world > 1 else "")
        + f" · precision {amp_dtype or torch.float32} · {len(train_data[0]):,} training pairs"
        + (f", {len(train_data)} sampled segmentations" if len(train_data) > 1 else ""))

    def record(entry: dict) -> None:
        if log is not None:
            log.write(json.dumps(entry) + "\n")
            log.flush()

    def snapshot(metrics: dict) -> dict:
        return {"model": served.state_dict(), "config": to_dict(cfg),
                "spm": {"src": src_tok.model_proto, "tgt": tgt_tok.model_proto},
                "langs": {"src": meta.get("src"), "tgt": meta.get("tgt")}, "step": pos.step, "metrics": metrics}

    def check_finite() -> None:
        # Checked before every save: a checkpoint with NaN weights would poison every resume and translation.
        # Every rank checks (the weights are the same on all), so all of them stop together.
        if not all_finite(model):
            raise MtError(f"step {pos.step}: the model's weights are not finite; no checkpoint written. "
                          + diverged_advice(out_dir))

    def save_last(metrics: dict) -> None:  # rank 0, after check_finite
        s = snapshot(metrics)
        s["train"] = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                      "position": vars(pos) | {"elapsed": pos.elapsed + time.time() - started},
                      "best_bleu": best_bleu, "rng": rng_state(device), "world_size": world}
        if averaged is not None:
            s["train"]["weights"] = model.state_dict()
        checkpoint.save_last(s, out_dir, t.keep_checkpoints)

    def validate_and_save() -> dict:
        nonlocal best_bleu
        check_finite()
        metrics: dict = {}
        if main:
            metrics = {"step": pos.step, "epoch": pos.epoch}
            if valid_split is not None:
                valid_started = time.time()
                with distributed.cores_of_waiting_ranks(device):
                    metrics |= validation_metrics(served, valid_split, valid_refs, tgt_tok, cfg, device, amp_dtype)
                metrics["valid_seconds"] = time.time() - valid_started
            metrics["elapsed"] = pos.elapsed + time.time() - started
            score = metrics.get("valid_bleu", -metrics.get("valid_loss", 0.0))
            if score > best_bleu or valid_split is None:
                best_bleu, pos.stale = score, 0
                checkpoint.save(snapshot(metrics), out_dir / "best.pt")
                metrics["best"] = True
            else:
                pos.stale += 1
            save_last(metrics)
            record(metrics)
            say(" · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        distributed.barrier()  # the other ranks wait while rank 0 validates and saves
        return metrics

    started = time.time()
    stop = StopSignals()
    bar = tqdm(total=t.max_steps, initial=pos.step, disable=not progress or not sys.stderr.isatty(),
               unit="step", dynamic_ncols=True)
    # The step of the latest validation, known on every rank (metrics only on rank 0). A resumed run that had
    # validated at its last step (it ended, rather than being interrupted) is not validated again.
    saved_metrics = (state or {}).get("metrics") or {}
    validated = pos.step if saved_metrics.get("step") == pos.step else -1
    metrics: dict = saved_metrics if validated == pos.step else {}
    interval = {"loss": torch.zeros((), device=device), "tokens": 0, "skipped": 0, "start": time.time()}
    bad_steps = 0  # skipped steps in a row
    per_step = world * t.accumulate
    pin = device.type == "cuda"  # pinned host memory lets the copy to the GPU run asynchronously
    steps = Prefetch((pinned(s) if pin else s for s in step_batches(train_data, cfg, pos.epoch, pos.batch, world,
                                                                    rank)), depth=2)
    try:
        halt = distributed.agree_max(STOP_TIME if main and (out_of_time(t, pos, started) or out_of_patience(t, pos))
                                     else 0)
        forward.train()
        while not halt and not finished(t, pos):
            data = steps.next()
            pos.epoch, pos.batch = data.epoch, data.batch
            if finished(t, pos):  # the data has moved on to an epoch past train.max_epochs
                break
            group = [b.to(device) for b in data.group]
            lr = learning_rate(pos.step + 1, t.lr, t.warmup) * cooldown_factor(budget_progress(t, pos, started),
                                                                                t.cooldown)
            loss, applied = train_step(forward, optimizer, scaler, group, cfg, device, amp_dtype, lr,
                                       data.n_tokens, ddp)
            pos.batch += per_step  # a skipped step's batches are consumed too: a bad batch is not retried forever
            if applied:
                pos.step += 1
                if averaged is not None:
                    averaged.update(model, pos.step)
                bad_steps = 0
                interval["loss"] += loss
                interval["tokens"] += data.n_tokens
                bar.update(1)
            else:
                bad_steps += 1
                interval["skipped"] += 1
                if bad_steps >= t.max_bad_steps:
                    record(log_interval(interval, pos, optimizer))
                    raise MtError(f"after step {pos.step}: {bad_steps} steps in a row had a non-finite loss or "
                                  f"gradients and were skipped; stopped. " + diverged_advice(out_dir))
            halt = distributed.agree_max(STOP_SIGNAL if stop.received else
                                         STOP_TIME if main and out_of_time(t, pos, started) else 0)
            if applied and pos.step % t.log_every == 0:
                report = log_interval(interval, pos, optimizer)
                record(report)
                bar.set_postfix(loss=f"{report['loss']:.3f}", lr=f"{report['lr']:.2e}",
                                tok_s=f"{report['tgt_tok_per_s']:.0f}")
                if bar.disable:  # no live bar: one log line per interval instead
                    say(f"step {pos.step} · epoch {pos.epoch} · loss {report['loss']:.3f} · "
                        f"lr {report['lr']:.2e} · {report['tgt_tok_per_s']:.0f} tgt tok/s"
                        + (f" · {report['skipped_steps']} skipped (non-finite)" if report["skipped_steps"] else ""))
            if applied and pos.step % t.valid_every == 0:
                metrics, validated = validate_and_save(), pos.step
                forward.train()
                if t.patience and not halt:
                    halt = distributed.agree_max(STOP_TIME if main and out_of_patience(t, pos) else 0)
                    if halt:
                        record({"step": pos.step, "early_stop": f"no new best in {t.patience} validations"})
                        say(f"early stop: no new best validation score in the last {t.patience} validations")
            if halt == STOP_SIGNAL:
                check_finite()
                if main:
                    save_last(metrics)
                distributed.barrier()  # nobody exits (and so has the launcher stop the others) before the save
                launcher = f"torchrun --nproc_per_node {world} -m " if world > 1 else ""
                raise TrainInterrupted(f"{stop.received or 'SIGTERM (on another process)'} at step {pos.step}: "
                                       f"saved {last_path}. Continue with: {launcher}mt train --resume --out {out_dir}")
        if validated != pos.step:
            metrics = validate_and_save()
    finally:
        steps.close()
        bar.close()
        if log is not None:
            log.close()
        stop.restore()
    return metrics


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


def resume_config(out_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run started with (from its newest readable checkpoint), with `overrides` applied; the model
    cannot change. Silent about damaged checkpoints: `train` reports them when it loads the same one."""
    last_path = Path(out_dir) / checkpoint.LAST
    if not last_path.is_file() and not checkpoint.numbered(out_dir):
        raise MtError(f"{last_path}: nothing to resume; drop --resume to start a new run")
    cfg = from_dict(checkpoint.latest_readable(out_dir)[1]["config"])
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.strip().startswith("model."):
            raise MtError(f"--set {item}: the model of a resumed run cannot change")
        set_value(cfg, key.strip(), yaml.safe_load(value) if sep and value.strip() else value)
    validate(cfg)
    return cfg


def resume_state(out_dir: Path, warn: bool = True) -> tuple[Path, dict]:
    """The newest readable checkpoint of the run in `out_dir`; says on stderr (when `warn`) which damaged ones it
    passed over."""
    path, state, problems = checkpoint.latest_readable(out_dir)
    if warn:
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        if problems:
            print(f"warning: resuming from {path} (step {state['step']}) instead; the steps after it are trained "
                  f"again", file=sys.stderr)
    if "train" not in state:
        raise MtError(f"{path}: holds no training state (optimizer, data position); it cannot be resumed")
    return path, state


def check_same_vocabulary(state: dict, path: Path, src_tok: Tokenizer, tgt_tok: Tokenizer, data_dir: Path) -> None:
    """A resumed run's ids must mean the same pieces as when it started, or it silently learns garbage."""
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        old = Tokenizer(state["spm"][side])
        if not same_pieces(old, tok):
            raise MtError(f"{data_dir}: its {side} vocabulary ({tok.vocab_size} pieces) is not the one {path} was "
                          f"trained with ({old.vocab_size} pieces); resume with the run's data "
                          f"(--set data={state['config']['data']}) or start a new run in another --out")


def same_pieces(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether every id means the same piece (piece scores may differ: they only steer segmentation)."""
    if a.model_proto == b.model_proto:
        return True
    return a.vocab_size == b.vocab_size and all(a.sp.id_to_piece(i) == b.sp.id_to_piece(i)
                                                 for i in range(a.vocab_size))


def all_finite(model: torch.nn.Module) -> bool:
    return bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all())


def diverged_advice(out_dir: Path) -> str:
    """What to try after the loss diverged; the checkpoints on disk are all finite (see `check_finite` in `train`)."""
    fixes = "try a lower train.lr, gradient clipping (train.clip_norm=1.0) or train.precision=fp32"
    if (out_dir / checkpoint.LAST).is_file():
        return f"To go on, {fixes}: mt train --resume --out {out_dir} --set train.lr=..."
    return f"No checkpoint was saved; start again and {fixes}."


def finished(t, pos: Position) -> bool:
    """Whether the step or epoch limit is reached: a function of the position, so every rank agrees."""
    return pos.step >= t.max_steps or bool(t.max_epochs) and pos.epoch >= t.max_epochs


def out_of_patience(t, pos: Position) -> bool:
    """Whether early stopping is due; `pos.stale` is counted on rank 0, so its answer is the one acted on."""
    return bool(t.patience) and pos.stale >= t.patience


def out_of_time(t, pos: Position, started: float) -> bool:
    """Whether the wall-clock budget is spent. Clocks differ between ranks: rank 0's answer is the one acted on."""
    return bool(t.max_minutes) and pos.elapsed + time.time() - started >= 60 * t.max_minutes


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               group: list[Batch], cfg: Config, device: torch.device, amp_dtype: torch.dtype | None,
               lr: float, n_tokens: int | None = None,
               ddp: DistributedDataParallel | None = None) -> tuple[torch.Tensor, bool]:
    """One optimizer step over `group` (accumulated micro-batches). Returns this rank's summed loss, left on the
    device (reading it would wait for the GPU: the caller reads it when it logs), and whether the update was
    applied: a step whose loss or gradients are not finite, on any rank, changes neither weights nor optimizer.

    `model` is what runs the forward pass (the Transformer, or its DDP or compiled wrapper). `n_tokens` is the
    number of target tokens in the whole step, on all ranks (default: those of `group`); `ddp`, in a run of several
    processes, the DDP wrapper, whose gradient all-reduce runs on the last micro-batch only.
    """
    t = cfg.train
    world = distributed.world_size()
    n_tokens = n_tokens if n_tokens is not None else sum(b.n_tgt_tokens for b in group)
    total = torch.zeros((), device=device)
    for i, batch in enumerate(group):
        with distributed.sync_gradients(ddp, last=i == len(group) - 1):
            with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext():
                loss = model(batch.src, batch.tgt_in, batch.tgt_out, t.label_smoothing)
            # Per target token of the whole step; × world because DDP averages the ranks' gradients.
            scaler.scale(loss * world / n_tokens).backward()
        total += loss.detach()
    for group_ in optimizer.param_groups:
        group_["lr"] = lr
    scaler.unscale_(optimizer)
    # One total gradient norm per step (~1% of a step): it clips, and it is not finite iff some gradient is not.
    if t.clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # The step's one host-device sync: whether to apply it, which the host must know, as it counts the steps and
    # sets the schedule. It comes after the whole backward pass is queued, so the GPU idles once per step (not
    # once per micro-batch, as reading each loss would make it), for as long as the host takes to launch the
    # optimizer step and the next forward pass, whose batches are already collated. (Fused Adam could skip the
    # update on the device without this read, but the step count would then be known only on the device.) After
    # DDP's all-reduce the gradients are the same on every rank; the losses are not, hence one more tiny all-reduce.
    bad = (~torch.isfinite(norm) | ~torch.isfinite(total)).float()
    applied = distributed.all_reduce_sum(bad).item() == 0
    if applied:
        scaler.step(optimizer)
    scaler.update()  # fp16: a non-finite step lowers the loss scale, as it would had the scaler skipped it itself
    optimizer.zero_grad(set_to_none=True)
    return total, applied


def log_interval(interval: dict, pos: Position, optimizer: torch.optim.Optimizer) -> dict:
    """The report of the steps since the last one, on every rank alike: all of them must call this together, as
    the loss is summed over ranks (the one time the loss is read from the device)."""
    seconds = time.time() - interval["start"]
    loss = distributed.all_reduce_sum(interval["loss"].clone()).item()
    report = {"step": pos.step, "epoch": pos.epoch, "loss": loss / max(interval["tokens"], 1),
              "lr": optimizer.param_groups[0]["lr"], "tgt_tok_per_s": interval["tokens"] / max(seconds, 1e-9),
              "skipped_steps": interval["skipped"]}  # skipped (non-finite) steps since the previous report
    interval.update(loss=torch.zeros_like(interval["loss"]), tokens=0, skipped=0, start=time.time())
    return report


@dataclass
class StepBatches:
    """One optimizer step's data as one rank sees it."""

    epoch: int
    batch: int  # the step's first batch in the epoch's list: the data position while the step trains
    group: list[Batch]  # this rank's micro-batches, on the host
    n_tokens: int  # target tokens of the whole step, all ranks' batches: the loss is normalised by them


def step_batches(splits: list[Split], cfg: Config, epoch: int, batch: int, world: int, rank: int
                 ) -> Iterator[StepBatches]:
    """The steps from batch `batch` of epoch `epoch` on, forever, each epoch from its `epoch_split`. Each step takes world × accumulate consecutive batches of the epoch's list, and rank r
    collates the r-th, (r + world)-th, ... of them. An epoch's tail too short for a whole step is left out (the
    next epoch's shuffle brings its examples back)."""
    t, max_len = cfg.train, cfg.model.max_len
    per_step = world * t.accumulate
    while True:
        split = epoch_split(splits, epoch)
        tgt_lens = split.tgt_lens
        batches = epoch_batches(split, t.max_tokens, max_len, t.seed, epoch)
        if len(batches) < per_step:
            raise MtError(f"an epoch has {len(batches)} batches, fewer than the {per_step} of one step "
                          f"({world} processes × train.accumulate={t.accumulate}); lower train.max_tokens or "
                          f"train.accumulate")
        while batch + per_step <= len(batches):
            mine = batches[batch + rank:batch + per_step:world]
            n_tokens = sum(target_tokens(tgt_lens, batches[i], max_len) for i in range(batch, batch + per_step))
            yield StepBatches(epoch, batch, [collate(split, idx, max_len) for idx in mine], n_tokens)
            batch += per_step
        epoch, batch = epoch + 1, 0


def target_tokens(tgt_lens: np.ndarray, indices: np.ndarray, max_len: int) -> int:
    """`collate(split, indices, max_len).n_tgt_tokens` without collating: each target's pieces, cut to fit
    `max_len`, plus its EOS. Every rank counts the whole step's tokens this way, with no communication."""
    return int(np.minimum(tgt_lens[indices], max_len - 1).sum()) + len(indices)


def pinned(step: StepBatches) -> StepBatches:
    group = [Batch(b.src.pin_memory(), b.tgt_in.pin_memory(), b.tgt_out.pin_memory(), b.n_tgt_tokens)
             for b in step.group]
    return StepBatches(step.epoch, step.batch, group, step.n_tokens)


class Prefetch:
    """Draws from `items` in a background thread, at most `depth` items ahead of `next()`, so collating the next
    steps' batches overlaps the current step's compute. Order is unchanged; an error in the thread is raised by
    the `next()` that would have returned the item."""

    def __init__(self, items: Iterator, depth: int):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self.fill, args=(items,), name="mt-prefetch", daemon=True)
        self.thread.start()

    def fill(self, items: Iterator) -> None:
        try:
            for item in items:
                if not self.put((item, None)):
                    return
        except Exception as e:  # handed to the consumer, who raises it
            self.put((None, e))

    def put(self, entry: tuple) -> bool:
        while not self.closed.is_set():
            try:
                self.queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next(self):
        item, error = self.queue.get()
        if error is not None:
            raise error
        return item

    def close(self) -> None:
        self.closed.set()
        self.thread.join(timeout=10)  # a daemon thread: should it still be collating, it does not hold up exit


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
        with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext():
            logits = model(batch.src, batch.tgt_in)
        loss += label_smoothed_loss(logits, batch.tgt_out, 0.0).item()
        tokens += batch.n_tgt_tokens
    metrics = {"valid_loss": loss / tokens, "valid_ppl": math.exp(min(loss / tokens, 50.0))}
    if cfg.train.valid_bleu:
        srcs = [split.src(i)[:cfg.model.max_len - 1].tolist() for i in range(len(split))]
        opts = Options.from_config(cfg.decode, beam=cfg.train.valid_beam)
        hyps = translate_ids(model, srcs, opts, device)
        texts = tgt_tok.decode([h[0].tokens for h in hyps])
        metrics["valid_bleu"] = sacrebleu.corpus_bleu(texts, [refs]).score
    return metrics


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The dropout seed of rank > 0 from `step` on: well mixed, so no two (seed, rank, step) share a stream."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def rng_state(device: torch.device) -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":  # the training GPU's only: asking for every GPU's would start a context on each
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        cuda = state["cuda"]
        if isinstance(cuda, list):  # checkpoints of earlier versions hold every visible GPU's
            cuda = cuda[device.index or 0]
        torch.cuda.set_rng_state(cuda, device)


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\r\n") for line in f]
