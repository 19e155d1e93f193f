"""The training loop: `train` opens the run, builds its state, loops over steps, validates and saves, and ends
with a final validation (or `TrainInterrupted` after a signal). Beside it: mt/train/state.py (what a run holds),
mt/train/optim.py (optimizer and schedule), mt/train/stopping.py (when a run stops), mt/train/log.py (its log),
mt/train/validate.py, mt/checkpoint.py (`last.pt` to resume, `best.pt`) and mt/train/distributed.py (several
processes, one run).

A step whose loss or gradients are not finite is skipped (see `train_step`): its batches are consumed, but the
weights, the optimizer and `Position.step` stay as they were, so `max_steps` and the schedule count real updates.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import NoReturn

import torch
from torch.nn.parallel import DistributedDataParallel

from mt import checkpoint
from mt.config import Config, from_dict, to_dict, validate
from mt.data.batches import (
    Batch,
    Prefetch,
    epoch_tokens,
    fit_vocab,
    load_tokenizers,
    pinned,
    step_batches,
    train_splits,
    valid_split,
)
from mt.data.ids import Split
from mt.data.lines import check_output_dir, read_text
from mt.device import attention_kernels, autocast, autocast_dtype, native_bf16, pad_multiple, pick_device
from mt.errors import MtError
from mt.fast.compiled import cpu_options
from mt.fast.paths import for_training
from mt.model.transformer import Transformer, count_parameters
from mt.runlock import lock_run, unlock_run
from mt.train import distributed
from mt.train.finetune import NOT_WITH_RESUME, load_init
from mt.train.log import Interval, Pace, RunLog
from mt.train.members import member_dirs, train_members
from mt.train.optim import LateDropout, adam, step_rate
from mt.train.resume import check_same_vocabulary, restore_rng, rng_state
from mt.train.state import Position, Run, TrainState
from mt.train.stopping import (
    Stop,
    StopSignals,
    TrainInterrupted,
    agree,
    diverged_advice,
    finished,
    out_of_patience,
    out_of_time,
)
from mt.train.validate import validation_metrics


def train(cfg: Config, out_dir: str | Path, resume: bool = False, progress: bool = True,
          init: str | Path | None = None) -> dict:
    """Train per `cfg`, writing into `out_dir`; returns the last validation metrics ({} on ranks other than 0).
    `init`: a checkpoint whose weights a new run starts from (mt/train/finetune.py).

    Started by torchrun as one of several processes, joins their process group for the run (mt/train/distributed.py).
    With train.members > 1, trains that many models one after another (mt/train/members.py)."""
    if cfg.train.members > 1 or (resume and member_dirs(out_dir)):  # one that chose one model keeps its layout
        return train_members(cfg, Path(out_dir), resume, train, progress=progress, init=init)
    device = distributed.start(pick_device(cfg.train.device))
    try:
        run = open_run(cfg, Path(out_dir), device, resume, progress, Path(init) if init is not None else None)
        if run.main:  # one writer per run: a second process is refused here, before it writes anything
            lock_run(run.out_dir)
        state = build_state(run)
        start_log(run, state)
        try:
            return loop(run, state)
        finally:
            run.log.close()
    finally:
        unlock_run(out_dir)
        distributed.stop()


def open_run(cfg: Config, out_dir: Path, device: torch.device, resume: bool, progress: bool,
             init_path: Path | None = None) -> Run:
    """Check the config, the data and the checkpoint to go on from (on resume) or start from (`init_path`);
    nothing is written yet."""
    rank, world = distributed.rank(), distributed.world_size()
    resumed_from, saved, init = None, None, None
    if resume and init_path is not None:
        raise MtError(NOT_WITH_RESUME)
    if resume:
        resumed_from, saved = checkpoint.latest_resumable(out_dir, warn=rank == 0)
    elif (out_dir / checkpoint.LAST).is_file() or checkpoint.numbered(out_dir):
        raise MtError(f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out")
    check_output_dir(out_dir, "--out")
    validate(cfg)  # as load_config does, for a config built in code
    data_dir = Path(cfg.data)
    src_tok, tgt_tok, meta = load_tokenizers(data_dir)
    if saved is not None:
        check_same_vocabulary(saved, resumed_from, src_tok, tgt_tok, data_dir)
    fit_vocab(cfg, src_tok, tgt_tok, meta.get("joint", True))
    if saved is not None and from_dict(saved["config"]).model != cfg.model:  # keys added since count as defaults
        raise MtError(f"{resumed_from}: the model config differs from the run's; a resumed run keeps its model")
    if init_path is not None:
        init = load_init(init_path, cfg, src_tok, tgt_tok, meta)
    has_valid = Split.exists(data_dir, "valid")
    return Run(cfg, out_dir, device, autocast_dtype(cfg.train.precision, device), rank, world, src_tok, tgt_tok,
               {"src": meta.get("src"), "tgt": meta.get("tgt")}, train_splits(data_dir, cfg.train.two_way),
               valid_split(data_dir, cfg.train.two_way, cfg.model.right_to_left) if has_valid else None,
               read_text(data_dir / "valid.tgt.txt") if has_valid else None,
               RunLog(rank == 0, progress), resumed_from, saved, init)


def build_state(run: Run) -> TrainState:
    """The model (with the training fast paths of mt/fast/), its optimizer and grad scaler, seeded; on resume,
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
    elif run.init is not None:
        model.load_state_dict(run.init.weights)
        run.init.weights = {}  # loaded: not held twice for the whole run
    if run.rank > 0:  # a dropout stream of its own (see mt/train/distributed.py)
        torch.manual_seed(distributed.rank_seed(train_cfg.seed, run.rank, state.position.step))
    state.ddp = distributed.wrap(model, run.device)  # None in a single process
    state.wrapped = state.ddp or model
    if train_cfg.compile:
        state.wrapped = torch.compile(state.wrapped, options=cpu_options() if run.device.type == "cpu" else None)
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
        run.log.note(f"{run.resumed_from} kept a moving average of the weights (train.ema, since removed): training "
                     f"goes on from the raw weights, and validation and best.pt start afresh from step {step}")
    if run.main:
        restore_rng(saved["rng"], run.device)
    batches_before = saved.get("world_size", 1) * run.saved["config"]["train"]["accumulate"]
    batches_now = run.world * run.cfg.train.accumulate
    if batches_before != batches_now:
        run.log.note(f"{run.resumed_from} was trained with {batches_before} batches per step; from step {step} on a "
                     f"step takes {batches_now} ({run.world} processes × train.accumulate={run.cfg.train.accumulate})")
    # A run that validated at its last step (it ended, rather than being interrupted) is not validated again.
    metrics = run.saved.get("metrics") or {}
    if metrics.get("step") == step:
        state.metrics, state.validated = metrics, step


def start_log(run: Run, state: TrainState) -> None:
    """Rank 0 writes the resolved config, opens log.jsonl and says what trains where."""
    run.log.open(run.out_dir, run.cfg)
    pairs, copies = len(run.train_data[0]), len(run.train_data)
    run.log.say(f"model: {count_parameters(state.model):,} parameters · device {run.device}"
                + (f" × {run.world} processes" if run.world > 1 else "")
                + f" · precision {run.amp_dtype or torch.float32} · {pairs:,} training pairs"
                + (f", {copies} sampled segmentations" if copies > 1 else ""))
    if run.init_record is not None:
        run.log.say(f"weights initialized from {run.init_record['from']} (step {run.init_record['step']:,})")
    if run.device.type == "cpu" and run.amp_dtype == torch.bfloat16 and not native_bf16():
        run.log.note("this CPU has no bf16 instructions: bf16 is emulated, many times slower than fp32 "
                     "(docs/performance.md); train.precision auto or fp32 trains faster here")


def loop(run: Run, state: TrainState) -> dict:
    """Train until the step, epoch or time budget, or patience, runs out, or a signal stops the run; returns the
    last validation's metrics."""
    train_cfg, pos, device = run.cfg.train, state.position, run.device
    batches_per_step = run.world * train_cfg.accumulate
    on_gpu = device.type == "cuda"  # pinned host memory lets the copy to the GPU run asynchronously
    steps = Prefetch((pinned(s) if on_gpu else s for s in step_batches(run.train_data, run.cfg, pos.epoch, pos.batch,
                                                                        run.world, run.rank, pad_multiple(device))),
                     depth=2)
    signals = StopSignals()
    bar = run.log.progress_bar(train_cfg.max_steps, pos.step)
    interval = Interval(torch.zeros((), device=device))
    pace = Pace(train_cfg.max_minutes, train_cfg.max_steps, epoch_tokens(run.train_data, run.cfg.model.max_len))
    late_dropout = LateDropout(state.model, train_cfg.late_dropout)
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
            lr = step_rate(train_cfg, pos.step, state.elapsed())
            late_dropout.at(pos.epoch)
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
                report = interval.report(pos.step, pos.epoch, state.optimizer)
                run.log.log_progress(report, bar)
                if note := pace.seen(pos.step, state.elapsed(), report["tgt_tok_per_s"]):
                    run.log.say(f"note: {note}")
            if applied and pos.step % train_cfg.valid_every == 0:
                stop = validate_midway(run, state, pace, stop)
            if stop == Stop.SIGNAL:
                stop_interrupted(run, state, signals.received)
        if state.validated != pos.step:
            validate_and_save(run, state)
    finally:
        steps.close()
        bar.close()
        signals.restore()
    return state.metrics


def validate_midway(run: Run, state: TrainState, pace: Pace, stop: Stop) -> Stop:
    """A validation every train.valid_every steps: validate and save, say the budget again after the first, back to
    training; the run stops early once its patience runs out."""
    validate_and_save(run, state)
    if "valid_seconds" in state.metrics and (note := pace.validated(
            state.position.step, state.elapsed(), state.metrics["valid_seconds"], run.cfg.train.valid_every)):
        run.log.say(f"note: {note}")
    state.wrapped.train()
    return stop_early(run, state) if run.cfg.train.patience and not stop else stop


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
        run.log.record(metrics)
        run.log.say(" · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        state.metrics = metrics
    distributed.barrier()  # the other ranks wait while rank 0 validates and saves


def check_finite(run: Run, state: TrainState) -> None:
    """Checked before every save: a checkpoint with NaN weights would poison every resume and translation. Every
    rank checks (the weights are the same on all), so all of them stop together."""
    if not bool(torch.stack([torch.isfinite(p).all() for p in state.model.parameters()]).all()):
        raise MtError(f"step {state.position.step}: the model's weights are not finite; no checkpoint written. "
                      + diverged_advice(run.out_dir))


def snapshot(run: Run, state: TrainState, metrics: dict) -> dict:
    """What best.pt holds, and every checkpoint: weights, config, tokenizers, languages, step, metrics, and where
    a fine-tuned run's weights started."""
    saved = {"model": state.model.state_dict(), "config": to_dict(run.cfg),
             "spm": {"src": run.src_tok.model_proto, "tgt": run.tgt_tok.model_proto}, "langs": run.langs,
             "step": state.position.step, "metrics": metrics}
    if run.init_record is not None:
        saved["init"] = run.init_record
    return saved


def save_last(run: Run, state: TrainState, metrics: dict) -> None:
    """Rank 0, after `check_finite`: last.pt (and a numbered copy), with everything needed to resume."""
    saved = snapshot(run, state, metrics)
    saved["train"] = {"optimizer": state.optimizer.state_dict(), "scaler": state.scaler.state_dict(),
                      "position": vars(state.position) | {"elapsed": state.elapsed()},
                      "best_score": state.best_score, "rng": rng_state(run.device), "world_size": run.world}
    checkpoint.save_last(saved, run.out_dir, run.cfg.train.keep_checkpoints)


def stop_early(run: Run, state: TrainState) -> Stop:
    """Whether patience ran out; rank 0 counts the validations, so its answer is the one acted on."""
    stop = agree(Stop.FINISH if run.main and out_of_patience(run.cfg.train, state.position) else Stop.NO)
    if stop:
        patience = run.cfg.train.patience
        run.log.record({"step": state.position.step, "early_stop": f"no new best in {patience} validations"})
        run.log.say(f"early stop: no new best validation score in the last {patience} validations")
    return stop


def stop_diverged(run: Run, state: TrainState, interval: Interval, bad_steps: int) -> NoReturn:
    run.log.record(interval.report(state.position.step, state.position.epoch, state.optimizer))
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


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               batches: list[Batch], cfg: Config, device: torch.device, amp_dtype: torch.dtype | None,
               lr: float, n_tokens: int | None = None,
               ddp: DistributedDataParallel | None = None) -> tuple[torch.Tensor, bool]:
    """One optimizer step over `batches` (accumulated micro-batches) of `model` (the Transformer, or its DDP or
    compiled wrapper). Returns this rank's summed loss, left on the device (the caller reads it when it logs), and
    whether the update was applied: a step whose loss or gradients are not finite, on any rank, changes neither
    weights nor optimizer. `n_tokens`: the target tokens of the whole step on all ranks (default: `batches`');
    `ddp`: the DDP wrapper of a run of several processes, whose all-reduce runs on the last micro-batch only."""
    world = distributed.world_size()
    n_tokens = n_tokens if n_tokens is not None else sum(b.n_tgt_tokens for b in batches)
    total = torch.zeros((), device=device)
    for i, batch in enumerate(batches):
        with distributed.sync_gradients(ddp, last=i == len(batches) - 1):
            with autocast(amp_dtype, device), attention_kernels(device):
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
    # The step's one host-device sync, after the whole backward pass is queued: whether to apply it (the host
    # counts the steps). After DDP's all-reduce the gradients agree on every rank; the losses do not, hence this.
    bad = (~torch.isfinite(norm) | ~torch.isfinite(total)).float()
    applied = distributed.all_reduce_sum(bad).item() == 0
    if applied:
        scaler.step(optimizer)
    scaler.update()  # fp16: a non-finite step lowers the loss scale, as it would had the scaler skipped it itself
    optimizer.zero_grad(set_to_none=True)
    return total, applied
