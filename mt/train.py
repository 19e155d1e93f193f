"""The training loop: token-budget batches, Adam with warmup + inverse-sqrt decay, label-smoothed loss,
mixed precision on GPU, validation (loss and BLEU), `last.pt` / `best.pt` checkpoints, and resume.

A run directory holds `last.pt` (everything needed to resume), `best.pt` (best validation BLEU, weights and
config only), `config.yaml` (the resolved config) and `log.jsonl` (one JSON object per log or validation).
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
import torch.nn.functional as F
import yaml
from tqdm import tqdm

from mt import checkpoint
from mt.config import Config, ConfigError, from_dict, set_value, to_dict, validate
from mt.data import Batch, Split, batch_by_tokens, collate, epoch_batches
from mt.model import Transformer, count_parameters
from mt.tokenizer import PAD, Tokenizer
from mt.translate import Options, translate_ids


class TrainError(Exception):
    """A run that cannot start or continue; the message says what to do."""


@dataclass
class Position:
    """Where training is: optimizer steps taken, and the next batch of which epoch."""

    step: int = 0
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
    """Summed label-smoothed cross-entropy over non-padding target tokens (normalised by the caller)."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1), ignore_index=PAD,
                           label_smoothing=smoothing, reduction="sum")


def train(cfg: Config, out_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train per `cfg`, writing into `out_dir`; returns the last validation metrics."""
    out_dir = Path(out_dir)
    data_dir = Path(cfg.data)
    last_path = out_dir / "last.pt"
    state = None
    if resume:
        state = checkpoint.load(last_path)
    elif last_path.is_file():
        raise TrainError(f"{out_dir} already holds a run; pass --resume to continue it, or choose another --out")

    src_tok, tgt_tok, meta = load_tokenizers(data_dir)
    fit_vocab(cfg, src_tok, tgt_tok, meta.get("joint", True))
    if state is not None and to_dict(cfg)["model"] != state["config"]["model"]:
        raise TrainError(f"{last_path}: the model config differs from the run's; a resumed run keeps its model")
    t = cfg.train
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

    def save_last(metrics: dict) -> None:
        s = snapshot(metrics)
        s["train"] = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                      "position": vars(pos) | {"elapsed": pos.elapsed + time.time() - started},
                      "best_bleu": best_bleu, "rng": rng_state()}
        checkpoint.save(s, last_path)

    def validate_and_save() -> dict:
        nonlocal best_bleu
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
    interval = {"loss": 0.0, "tokens": 0, "start": time.time()}
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
            loss = train_step(model, optimizer, scaler, group, cfg, device, amp_dtype,
                              learning_rate(pos.step + 1, t.lr, t.warmup))
            pos.step += 1
            pos.batch += t.accumulate
            interval["loss"] += loss
            interval["tokens"] += sum(b.n_tgt_tokens for b in group)
            bar.update(1)
            if pos.step % t.log_every == 0:
                report = log_interval(interval, pos, optimizer)
                log.write(json.dumps(report) + "\n")
                bar.set_postfix(loss=f"{report['loss']:.3f}", lr=f"{report['lr']:.2e}",
                                tok_s=f"{report['tgt_tok_per_s']:.0f}")
                if bar.disable:  # no live bar: one log line per interval instead
                    say(f"step {pos.step} · epoch {pos.epoch} · loss {report['loss']:.3f} · "
                        f"lr {report['lr']:.2e} · {report['tgt_tok_per_s']:.0f} tgt tok/s")
            if pos.step % t.valid_every == 0:
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
    """The config a run started with (from its last.pt), with `overrides` applied; the model cannot change."""
    last_path = Path(out_dir) / "last.pt"
    if not last_path.is_file():
        raise TrainError(f"{last_path}: nothing to resume; drop --resume to start a new run")
    cfg = from_dict(checkpoint.load(last_path)["config"])
    for item in overrides:
        key, sep, value = item.partition("=")
        if key.strip().startswith("model."):
            raise ConfigError(f"--set {item}: the model of a resumed run cannot change")
        set_value(cfg, key.strip(), yaml.safe_load(value) if sep and value.strip() else value)
    validate(cfg)
    return cfg


def finished(t, pos: Position, started: float) -> bool:
    if pos.step >= t.max_steps:
        return True
    if t.max_epochs and pos.epoch >= t.max_epochs:
        return True
    return bool(t.max_minutes) and pos.elapsed + time.time() - started >= 60 * t.max_minutes


def train_step(model: Transformer, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
               group: list[Batch], cfg: Config, device: torch.device, amp_dtype: torch.dtype | None,
               lr: float) -> float:
    """One optimizer step over `group` (accumulated micro-batches). Returns the summed loss (a float)."""
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
    if t.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total


def log_interval(interval: dict, pos: Position, optimizer: torch.optim.Optimizer) -> dict:
    seconds = time.time() - interval["start"]
    report = {"step": pos.step, "epoch": pos.epoch, "loss": interval["loss"] / max(interval["tokens"], 1),
              "lr": optimizer.param_groups[0]["lr"], "tgt_tok_per_s": interval["tokens"] / max(seconds, 1e-9)}
    interval.update(loss=0.0, tokens=0, start=time.time())
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
