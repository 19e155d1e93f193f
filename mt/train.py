"""The training loop: token-budget batches, Adam with warmup + inverse-sqrt decay, label-smoothed loss,
mixed precision on GPU, validation (loss and BLEU), `last.pt` / `best.pt` checkpoints, and resume.

A run directory holds `last.pt` (everything needed to resume) and the newest `train.keep_checkpoints`
`checkpoint-{step}.pt` (the same, for falling back when `last.pt` is damaged), `best.pt` (best validation BLEU,
weights and config only), `config.yaml` (the resolved config) and `log.jsonl` (one JSON object per log or
validation).

A step whose loss or gradients are not finite is skipped (see `train_step`): its batches are consumed, but the
weights, the optimizer and `Position.step` stay as they were, so `max_steps` and the schedule count real updates.
`train.max_bad_steps` skipped steps in a row stop the run; a checkpoint with non-finite weights is never written.
"""

from __future__ import annotations

import json
import math
import random
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
import yaml
from tqdm import tqdm

from mt import checkpoint
from mt.config import Config, ConfigError, from_dict, set_value, to_dict, validate
from mt.data import Batch, Split, batch_by_tokens, collate, epoch_batches
from mt.loss import label_smoothed_nll
from mt.model import Transformer, count_parameters
from mt.tokenizer import PAD, Tokenizer
from mt.translate import Options, translate_ids


class TrainError(Exception):
    """A run that cannot start or continue; the message says what to do."""


@dataclass
class Position:
    """Where training is: optimizer steps taken, and the next batch of which epoch."""

    step: int = 0  # updates applied; a skipped (non-finite) step does not count, though its batches are consumed
    epoch: int = 0
    batch: int = 0
    elapsed: float = 0.0  # seconds of training before this process started


def learning_rate(step: int, peak: float, warmup: int) -> float:
    """Linear warmup to `peak`, then decay with 1/sqrt(step): the paper's schedule, peak made explicit.

    The paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) is this with peak = (d_model * warmup)^-0.5.
    """
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device=cuda but no CUDA device is visible; use train.device=auto or cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """None means full fp32. auto: bf16 on GPUs that have it, else fp16 (with a grad scaler); fp32 on CPU."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise TrainError("train.precision=fp16 needs a GPU; on CPU use bf16 or fp32")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def load_tokenizers(data_dir: Path) -> tuple[Tokenizer, Tokenizer, dict]:
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise TrainError(f"{meta_path}: not found; run `mt prepare ... --out {data_dir}` first, or set `data:`")
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
            raise ConfigError(f"model.{key}={want} but the data in {cfg.data} has a vocabulary of {have}; "
                              f"remove model.{key} (it is taken from the data) or prepare the data again")
        setattr(m, key, have)
    if m.share_embeddings and not joint:
        m.share_embeddings = False  # separate vocabularies cannot share one table


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross-entropy over non-padding target tokens (normalised by the caller).

    Same value and gradient as F.cross_entropy(label_smoothing=...), at half its cost (see mt/loss.py)."""
    return label_smoothed_nll(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), smoothing, PAD)


def train(cfg: Config, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train per `cfg`, writing into `out_dir`; returns the last validation metrics."""
    out_dir = Path(out_dir)
    data_dir = Path(cfg.data)
    last_path = out_dir / checkpoint.LAST
    state = None
    if resume:
        resume_path, state = resume_state(out_dir)
    elif last_path.is_file() or checkpoint.numbered(out_dir):
        raise TrainError(f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out")
    t = cfg.train
    for key, value, least in (("keep_checkpoints", t.keep_checkpoints, 0), ("max_bad_steps", t.max_bad_steps, 1)):
        if value < least:
            raise ConfigError(f"train.{key}={value}: must be at least {least}")

    src_tok, tgt_tok, meta = load_tokenizers(data_dir)
    if state is not None:
        check_same_vocabulary(state, resume_path, src_tok, tgt_tok, data_dir)
    fit_vocab(cfg, src_tok, tgt_tok, meta.get("joint", True))
    if state is not None and to_dict(cfg)["model"] != state["config"]["model"]:
        raise TrainError(f"{resume_path}: the model config differs from the run's; a resumed run keeps its model")
    random.seed(t.seed)
    torch.manual_seed(t.seed)
    if t.threads:
        torch.set_num_threads(t.threads)
    device = pick_device(t.device)
    amp_dtype = autocast_dtype(t.precision, device)

    model = Transformer(cfg.model).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                                 weight_decay=t.weight_decay, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    pos = Position()
    best_bleu = -1.0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["train"]["optimizer"])
        scaler.load_state_dict(state["train"]["scaler"])
        pos = Position(**state["train"]["position"])
        best_bleu = state["train"]["best_bleu"]
        restore_rng(state["train"]["rng"])

    train_split = Split(data_dir, "train")
    valid_split = Split(data_dir, "valid") if (data_dir / "valid.src.ids.npy").is_file() else None
    valid_refs = read_lines(data_dir / "valid.tgt.txt") if valid_split is not None else None
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
    log = open(out_dir / "log.jsonl", "a", encoding="utf-8")
    say = (lambda msg: tqdm.write(msg, file=sys.stderr)) if progress else (lambda msg: None)
    say(f"model: {count_parameters(model):,} parameters · device {device} · "
        f"precision {amp_dtype or torch.float32} · {len(train_split):,} training pairs")

    def snapshot(metrics: dict) -> dict:
        return {"model": model.state_dict(), "config": to_dict(cfg),
                "spm": {"src": src_tok.model_proto, "tgt": tgt_tok.model_proto},
                "langs": {"src": meta.get("src"), "tgt": meta.get("tgt")}, "step": pos.step, "metrics": metrics}

    def check_finite() -> None:
        # Checked before every save: a checkpoint with NaN weights would poison every resume and translation.
        if not all_finite(model):
            raise TrainError(f"step {pos.step}: the model's weights are not finite; no checkpoint written. "
                             + diverged_advice(out_dir))

    def save_last(metrics: dict) -> None:
        check_finite()
        s = snapshot(metrics)
        s["train"] = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                      "position": vars(pos) | {"elapsed": pos.elapsed + time.time() - started},
                      "best_bleu": best_bleu, "rng": rng_state()}
        checkpoint.save_last(s, out_dir, t.keep_checkpoints)

    def validate_and_save() -> dict:
        nonlocal best_bleu
        check_finite()
        metrics = {"step": pos.step, "epoch": pos.epoch}
        if valid_split is not None:
            valid_started = time.time()
            metrics |= validation_metrics(model, valid_split, valid_refs, tgt_tok, cfg, device, amp_dtype)
            metrics["valid_seconds"] = time.time() - valid_started
        metrics["elapsed"] = pos.elapsed + time.time() - started
        score = metrics.get("valid_bleu", -metrics.get("valid_loss", 0.0))
        if score > best_bleu or valid_split is None:
            best_bleu = score
            checkpoint.save(snapshot(metrics), out_dir / "best.pt")
            metrics["best"] = True
        save_last(metrics)
        log.write(json.dumps(metrics) + "\n")
        log.flush()
        say(" · ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()))
        return metrics

    started = time.time()
    stop = StopSignals()
    bar = tqdm(total=t.max_steps, initial=pos.step, disable=not progress or not sys.stderr.isatty(),
               unit="step", dynamic_ncols=True)
    metrics: dict = {}
    interval = {"loss": 0.0, "tokens": 0, "skipped": 0, "start": time.time()}
    bad_steps = 0  # skipped steps in a row
    batches, batches_epoch = [], -1
    try:
        model.train()
        while not finished(t, pos, started):
            if batches_epoch != pos.epoch:
                batches, batches_epoch = epoch_batches(train_split, t.max_tokens, cfg.model.max_len, t.seed,
                                                       pos.epoch), pos.epoch
                if len(batches) < t.accumulate:
                    raise TrainError(f"an epoch has {len(batches)} batches, fewer than train.accumulate="
                                     f"{t.accumulate}; lower train.max_tokens or train.accumulate")
            if pos.batch + t.accumulate > len(batches):
                pos.epoch, pos.batch = pos.epoch + 1, 0
                continue
            group = [collate(train_split, batches[pos.batch + i], cfg.model.max_len).to(device)
                     for i in range(t.accumulate)]
            loss, applied = train_step(model, optimizer, scaler, group, cfg, device, amp_dtype,
                                       learning_rate(pos.step + 1, t.lr, t.warmup))
            pos.batch += t.accumulate  # a skipped step's batches are consumed too: a bad batch is not retried forever
            if applied:
                pos.step += 1
                bad_steps = 0
                interval["loss"] += loss
                interval["tokens"] += sum(b.n_tgt_tokens for b in group)
                bar.update(1)
            else:
                bad_steps += 1
                interval["skipped"] += 1
                if bad_steps >= t.max_bad_steps:
                    log.write(json.dumps(log_interval(interval, pos, optimizer)) + "\n")
                    raise TrainError(f"after step {pos.step}: {bad_steps} steps in a row had a non-finite loss or "
                                     f"gradients and were skipped; stopped. " + diverged_advice(out_dir))
            if applied and pos.step % t.log_every == 0:
                report = log_interval(interval, pos, optimizer)
                log.write(json.dumps(report) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{report['loss']:.3f}", lr=f"{report['lr']:.2e}",
                                tok_s=f"{report['tgt_tok_per_s']:.0f}")
                if bar.disable:  # no live bar: one log line per interval instead
                    say(f"step {pos.step} · epoch {pos.epoch} · loss {report['loss']:.3f} · "
                        f"lr {report['lr']:.2e} · {report['tgt_tok_per_s']:.0f} tgt tok/s"
                        + (f" · {report['skipped_steps']} skipped (non-finite)" if report["skipped_steps"] else ""))
            if applied and pos.step % t.valid_every == 0:
                metrics = validate_and_save()
                model.train()
            if stop.received:
                save_last(metrics)
                raise TrainInterrupted(f"{stop.received} at step {pos.step}: saved {last_path}. "
                                       f"Continue with: mt train --resume --out {out_dir}")
        if metrics.get("step") != pos.step:
            metrics = validate_and_save()
    finally:
        bar.close()
        log.close()
        stop.restore()
    return metrics


class TrainInterrupted(TrainError):
    """Ctrl-C or SIGTERM: the run stopped at a step boundary after saving `last.pt`."""


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
        raise TrainError(f"{last_path}: nothing to resume; drop --resume to start a new run")
    cfg = from_dict(checkpoint.latest_readable(out_dir)[1]["config"])
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.strip().startswith("model."):
            raise ConfigError(f"--set {item}: the model of a resumed run cannot change")
        set_value(cfg, key.strip(), yaml.safe_load(value) if sep and value.strip() else value)
    validate(cfg)
    return cfg


def resume_state(out_dir: Path) -> tuple[Path, dict]:
    """The newest readable checkpoint of the run in `out_dir`; says on stderr which damaged ones it passed over."""
    path, state, problems = checkpoint.latest_readable(out_dir)
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    if problems:
        print(f"warning: resuming from {path} (step {state['step']}) instead; the steps after it are trained again",
              file=sys.stderr)
    if "train" not in state:
        raise TrainError(f"{path}: holds no training state (optimizer, data position); it cannot be resumed")
    return path, state


def check_same_vocabulary(state: dict, path: Path, src_tok: Tokenizer, tgt_tok: Tokenizer, data_dir: Path) -> None:
    """A resumed run's ids must mean the same pieces as when it started, or it silently learns garbage."""
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        old = Tokenizer(state["spm"][side])
        if not same_pieces(old, tok):
            raise TrainError(f"{data_dir}: its {side} vocabulary ({tok.vocab_size} pieces) is not the one {path} was "
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


def finished(t, pos: Position, started: float) -> bool:
    if pos.step >= t.max_steps:
        return True
    if t.max_epochs and pos.epoch >= t.max_epochs:
        return True
    return bool(t.max_minutes) and pos.elapsed + time.time() - started >= 60 * t.max_minutes


def train_step(model: Transformer, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               group: list[Batch], cfg: Config, device: torch.device, amp_dtype: torch.dtype | None,
               lr: float) -> tuple[float, bool]:
    """One optimizer step over `group` (accumulated micro-batches). Returns the summed loss (a float) and whether
    the update was applied: a step whose loss or gradients are not finite changes neither weights nor optimizer."""
    t = cfg.train
    n_tokens = sum(b.n_tgt_tokens for b in group)
    total = 0.0
    for batch in group:
        with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext():
            logits = model(batch.src, batch.tgt_in)
        loss = label_smoothed_loss(logits, batch.tgt_out, t.label_smoothing)
        scaler.scale(loss / n_tokens).backward()  # per-target-token loss over the whole step
        total += loss.item()
    for group_ in optimizer.param_groups:
        group_["lr"] = lr
    scaler.unscale_(optimizer)
    # One total gradient norm per step (~1% of a step): it clips, and it is not finite iff some gradient is not.
    if t.clip_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    applied = math.isfinite(total) and bool(torch.isfinite(norm))
    if applied:
        scaler.step(optimizer)
    scaler.update()  # fp16: a non-finite step lowers the loss scale, as it would had the scaler skipped it itself
    optimizer.zero_grad(set_to_none=True)
    return total, applied


def log_interval(interval: dict, pos: Position, optimizer: torch.optim.Optimizer) -> dict:
    seconds = time.time() - interval["start"]
    report = {"step": pos.step, "epoch": pos.epoch, "loss": interval["loss"] / max(interval["tokens"], 1),
              "lr": optimizer.param_groups[0]["lr"], "tgt_tok_per_s": interval["tokens"] / max(seconds, 1e-9),
              "skipped_steps": interval["skipped"]}  # skipped (non-finite) steps since the previous report
    interval.update(loss=0.0, tokens=0, skipped=0, start=time.time())
    return report


@torch.inference_mode()
def validation_metrics(model: Transformer, split: Split, refs: list[str], tgt_tok: Tokenizer, cfg: Config,
             device: torch.device, amp_dtype: torch.dtype | None) -> dict:
    """Validation loss (per target token, label smoothing off) and greedy BLEU against the raw references."""
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
        opts = Options.from_config(cfg.decode, beam=1)
        hyps = translate_ids(model, srcs, opts, device)
        texts = tgt_tok.decode([h[0].tokens for h in hyps])
        metrics["valid_bleu"] = sacrebleu.corpus_bleu(texts, [refs]).score
    return metrics


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_lines(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\r\n") for line in f]
