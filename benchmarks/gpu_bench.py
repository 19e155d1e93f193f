"""`make gpu-bench`: mt against Hugging Face's MarianMTModel on one GPU, side by side, in one command (issue 66).

Each part runs in a process of its own, with mt and Marian side by side in it on the same batches; each result is a
JSON line on stdout and all of them go into one JSON report (--out), rewritten after every part:
- shapes (item 1): the first real Multi30k batches of an epoch (base preset, bf16, 16,384 tokens a batch), trained
  twice, first sight and seen again: what a new batch shape costs, mt as `mt train` runs on this device (lengths
  rounded by `mt.device.pad_multiple`, attention under `mt.device.attention_kernels`) and Marian on mt's batches.
- run (item 1): a short `mt train` of the base preset: its first epoch's tokens/s against the later epochs'.
- decode (item 3): base preset, 24-token sources into exactly 24 tokens, greedy and beam 4, batch 64 and 512, fp32
  and bf16: mt's `translate_ids` against `MarianMTModel.generate` of the same architecture.
- checkpoint (item 3): a real checkpoint (--checkpoint, else the one the run part trained) translating test2016 at its
  real lengths, against Marian with its weights (`mt export --to huggingface`).
- throughput (item 2): real batches of 16k–25k target tokens, mt against Marian (with PyTorch's choice of attention
  kernels, and with mt's): tokens/s, MFU against a measured 8192³ bf16 matmul peak, peak GPU memory; then mt under
  torch.compile as `train.compile` runs it, its compile time measured apart. Last, as compiling may outrun the budget.

A part that outruns its share of --budget is stopped and what it printed is kept. The script uses the Python and
torch it runs under and installs nothing (the repo goes on PYTHONPATH). Multi30k: --data PREPARED, or prepared here
from --mirror DIR or $MT_MIRROR (holding multi30k/*.gz). Without CUDA it says so and exits 0, unless --device cpu
runs the same parts with the tiny preset and a few batches (figures that mean nothing: how the test proves it runs).

    python benchmarks/gpu_bench.py --out gpu-bench.json                 # on a GPU machine: about 8 minutes
    python benchmarks/gpu_bench.py --device cpu --quick --out r.json    # the same parts, tiny, on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 480.0  # seconds: the whole comparison within 8 minutes of a lent GPU machine's 10 a command
# The parts in the order they run, with their share of the time: each may take its share of what is left, in
# proportion to the shares of the parts still to run; the last takes all that is left.
PARTS = {"shapes": 0.15, "run": 0.15, "decode": 0.20, "checkpoint": 0.15, "throughput": 0.35}
GRACE = 15  # seconds a part may run past its time (it skips settings to keep it) before it is stopped
NEEDS_DATA = {"shapes", "run", "checkpoint", "throughput"}
ITEMS = {"shapes": 1, "run": 1, "throughput": 2, "decode": 3, "checkpoint": 3}  # the items
LR = 1e-4  # a fixed learning rate for the timed steps: speed does not depend on it


@dataclass
class Plan:
    """How much each part does: the issue's settings on a GPU, scaled down by --budget and --quick; the tiny
    preset and a few batches on a CPU."""

    device: str
    preset: str  # base on a GPU; tiny on a CPU
    precision: str = "bf16"  # of the training parts; fp32 on a CPU, as many CPUs only emulate bf16
    shape_tokens: int = 16384  # shapes: train.max_tokens of the batches (padded tokens a batch)
    shape_batches: int = 24  # shapes: the first batches of epoch 0
    run_tokens: int = 16384  # run: train.max_tokens
    run_epochs: int = 8  # run: epochs (0: no limit) ...
    run_steps: int = 0  # ... or steps (0: no limit)
    run_log_every: int = 4
    train_tokens: int = 24576  # throughput: train.max_tokens, which gives about 16k-25k target tokens a batch
    train_batches: int = 16
    rounds: int = 3  # throughput: timed passes over its batches, per system (after one untimed pass)
    compile_backend: str = "inductor"  # torch.compile's, as train.compile uses it; "eager" on a CPU (no codegen)
    compile_passes: int = 3
    matmul_size: int = 8192  # the MFU denominator: a bf16 matmul of this size (2048³ under-reads an H200 by half)
    decode_precisions: tuple[str, ...] = ("fp32", "bf16")
    decode_beams: tuple[int, ...] = (1, 4)
    decode_batches: tuple[int, ...] = (64, 512)
    decode_sentences: int = 256  # per timed run, at least one batch
    src_len: int = 24
    tgt_len: int = 24
    runs: int = 3  # timed runs of each decoding setting, after one warm-up run; the median counts
    checkpoint_precisions: tuple[str, ...] = ("fp32", "bf16")
    checkpoint_batches: tuple[int, ...] = (64, 512)  # sentences a batch
    checkpoint_lines: int = 0  # of test2016 (0: all 1,000)
    checkpoint_runs: int = 2
    reserve: float = 15.0  # seconds a part keeps for what it must still print: it skips settings past that
    threads: int = 0  # CPU threads of every process (0: PyTorch's default); 1 on a CPU, which a test may share
    prepare_options: list[str] = field(default_factory=list)


def make_plan(device: str, quick: bool, budget: float) -> Plan:
    """The plan for `device`: on a GPU the issue's settings, each count scaled by --budget (of BUDGET) and halved by
    --quick; on a CPU the tiny one, whatever --quick and --budget say."""
    if device == "cpu":
        return Plan("cpu", "tiny", precision="fp32", shape_tokens=512, shape_batches=2, run_tokens=512,
                    run_epochs=0, run_steps=2, run_log_every=1, train_tokens=512, train_batches=1, rounds=1,
                    compile_backend="eager", compile_passes=2, matmul_size=256, decode_batches=(4,),
                    decode_sentences=4, src_len=8, tgt_len=8, runs=1, checkpoint_precisions=("fp32",),
                    checkpoint_batches=(4,), checkpoint_lines=4, checkpoint_runs=1, reserve=0.0, threads=1,
                    prepare_options=["--vocab-size", "1000", "--spm-sentences", "3000"])
    scale = min(1.0, budget / BUDGET) * (0.5 if quick else 1.0)

    def scaled(n: int, least: int) -> int:
        return max(least, round(n * scale))

    return Plan("cuda", "base", shape_batches=scaled(24, 6), run_epochs=scaled(8, 3), train_batches=scaled(16, 4),
                rounds=scaled(3, 1), decode_sentences=scaled(256, 64), runs=scaled(3, 1), checkpoint_runs=scaled(2, 1),
                checkpoint_lines=0 if scale == 1.0 else scaled(1000, 200))


# ---------------------------------------------------------------------------------------------------------------
# The parts: each runs in a process of its own and prints its records as JSON lines.

class Part:
    """What a part runs with: the plan, the device, the data, where to write, and its deadline."""

    def __init__(self, name: str, plan: Plan, data: Path | None, work: Path, checkpoint: Path | None,
                 seconds: float):
        self.name, self.plan, self.data, self.work, self.checkpoint = name, plan, data, work, checkpoint
        self.device = torch.device(plan.device)
        self.deadline = time.monotonic() + seconds
        self.names = names(self.device)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def out_of_time(self, what: str) -> bool:
        """Whether to skip `what` (and say so in a record), keeping the part's reserve for what it must print."""
        if self.left() > self.plan.reserve:
            return False
        self.emit({"what": what, "skipped": "out of time (--budget)"})
        return True

    def emit(self, record: dict) -> None:
        print(json.dumps({"item": ITEMS[self.name], "part": self.name, **record, **self.names}), flush=True)


def names(device: torch.device) -> dict:
    """The torch, CUDA and GPU (or CPU) a figure was measured with: every record carries them."""
    from mt.device import cpuinfo

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": gpu,
            "cpu": None if gpu else cpuinfo("model name") or platform.processor()}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(step: Callable, batches: list, device: torch.device) -> list[float]:
    """Each batch's training step time, in order, the GPU's queue drained around each."""
    times = []
    for batch in batches:
        synchronize(device)
        start = time.perf_counter()
        step(batch)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def peak_gpu_mb(device: torch.device, now: bool = False) -> int | None:
    """The most GPU memory PyTorch's tensors held since the last `reset_peak` (or, `now`, what they hold), in MiB."""
    if device.type != "cuda":
        return None
    return round((torch.cuda.memory_allocated if now else torch.cuda.max_memory_allocated)(device) / 2**20)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def real_batches(part: Part, max_tokens: int, n: int):
    """The model config of the plan's preset and the first `n` batches of a Multi30k epoch as `mt train` collates
    them on this device (its lengths rounded up to `pad_multiple`), on the device; the config's vocabulary fits
    the data (mt.bench.train_batches)."""
    from mt.bench import preset_config, train_batches
    from mt.config import Config
    from mt.device import pad_multiple
    from mt.options import TrainBench

    cfg = Config(model=preset_config(part.plan.preset, dropout=0.1))
    cfg.train.clip_norm = 1.0  # as Marian's step clips
    setting = TrainBench(preset=part.plan.preset, data=str(part.data), max_tokens=max_tokens, warmup=0, steps=n)
    batches, _ = train_batches(setting, cfg, pad_multiple(part.device))
    return cfg, [b.to(part.device) for b in batches]


def batch_settings(batches: list, max_tokens: int, device: torch.device) -> dict:
    from mt.device import attention_backends, pad_multiple

    tokens = [b.n_tgt_tokens for b in batches]
    backends = attention_backends(device)
    return {"batches": len(batches), "max_tokens": max_tokens, "tgt_tokens": sum(tokens),
            "tgt_tokens_per_batch": [min(tokens), round(sum(tokens) / len(tokens)), max(tokens)],
            "shapes": len({(tuple(b.src.shape), tuple(b.tgt_in.shape)) for b in batches}),
            "pad_multiple": pad_multiple(device),
            "mt_attention": [b.name for b in backends] if backends is not None else "PyTorch's choice"}


def mt_trainer(cfg, device: torch.device, amp: torch.dtype | None):
    """mt's model as `mt train` trains it (`for_training`, fused Adam, `train_step`) and its step: step(batch)
    steps the model, step(batch, module) a wrapper of it (torch.compile's) with the same optimizer."""
    from mt.fast.paths import for_training
    from mt.model.transformer import Transformer
    from mt.train.loop import train_step
    from mt.train.optim import adam

    torch.manual_seed(0)
    model = for_training(Transformer(cfg.model).to(device)).train()
    optimizer = adam(list(model.parameters()), cfg.train)
    scaler = torch.amp.GradScaler(device.type, enabled=False)

    def step(batch, module=model) -> None:
        train_step(module, optimizer, scaler, [batch], cfg, device, amp, LR)

    return model, step


def marian_trainer(preset: str, cfg, device: torch.device, amp: torch.dtype | None,
                   kernels: Callable | None = None) -> Callable:
    """Hugging Face's MarianMTModel of the same architecture and its training step (benchmarks/compare_train.py),
    under `kernels` (a context manager restricting attention's kernels) if given."""
    from compare_train import marian, marian_step

    from mt.train.optim import adam

    torch.manual_seed(0)
    hf = marian(preset)
    if hf.config.vocab_size != cfg.model.tgt_vocab_size:
        hf.resize_token_embeddings(cfg.model.tgt_vocab_size)
    hf = hf.to(device).train()
    optimizer = adam(list(hf.parameters()), cfg.train)

    def step(batch) -> None:
        if kernels is None:
            marian_step(hf, optimizer, batch, amp)
        else:
            with kernels(device):
                marian_step(hf, optimizer, batch, amp)

    return step


def warmup_batch(vocab: int, device: torch.device):
    """A batch of a shape no real batch has (lengths not multiples of 8): it loads the kernels and starts the
    allocator, so that a first pass over real batches measures their shapes only."""
    from mt.data.batches import Batch
    from mt.data.tokenizer import EOS

    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, vocab, (5, 13), generator=g), torch.randint(4, vocab, (5, 12), generator=g)
    src[:, -1] = EOS
    return Batch(src, tgt[:, :-1], tgt[:, 1:], 5 * 11).to(device)


def part_shapes(part: Part) -> None:
    """Item 1: the first batches of an epoch trained twice, first sight and seen again, mt then Marian."""
    from mt.device import autocast_dtype

    plan, device = part.plan, part.device
    cfg, batches = real_batches(part, plan.shape_tokens, plan.shape_batches)
    settings = batch_settings(batches, plan.shape_tokens, device) | {"preset": plan.preset,
                                                                     "precision": plan.precision}
    amp = autocast_dtype(plan.precision, device)
    _, mt_step = mt_trainer(cfg, device, amp)
    systems = {"mt": mt_step, "marian": marian_trainer(plan.preset, cfg, device, amp)}
    warm = warmup_batch(cfg.model.tgt_vocab_size, device)
    for name, step in systems.items():  # mt first: any shape cache the two share is warm for Marian, not for mt
        if part.out_of_time(f"first sight, {name}"):
            return
        step_seconds(step, [warm, warm], device)
        first, again = step_seconds(step, batches, device), step_seconds(step, batches, device)
        tokens = settings["tgt_tokens"]
        part.emit({"what": "first sight", "system": name, **settings,
                   "attention": settings["mt_attention"] if name == "mt" else "PyTorch's choice",
                   "first_s": round(sum(first), 3), "again_s": round(sum(again), 3),
                   "first_tok_per_s": round(tokens / sum(first)), "again_tok_per_s": round(tokens / sum(again)),
                   "first_over_again": round(sum(first) / sum(again), 3),
                   "first_step_ms": [round(t * 1e3, 1) for t in first],
                   "again_step_ms": [round(t * 1e3, 1) for t in again], "headline": True})


def part_run(part: Part) -> None:
    """Item 1: a short `mt train` of the plan's preset on Multi30k; its first epoch's tokens/s against the later
    epochs', from its log. Its checkpoint is the checkpoint part's model when no --checkpoint is given."""
    from mt.bench import PRESETS
    from mt.train.log import read_log

    plan = part.plan
    out = part.work / "run"
    shutil.rmtree(out, ignore_errors=True)  # a run an earlier gpu-bench left in --work: this one starts afresh
    config = {"data": str(part.data), "model": {**PRESETS[plan.preset], "dropout": 0.1, "max_len": 256},
              "train": {"max_tokens": plan.run_tokens, "precision": plan.precision, "device": plan.device,
                        "max_epochs": plan.run_epochs, "max_steps": plan.run_steps or 10**9, "max_minutes": 0,
                        "lr": 3e-4, "warmup": 150, "clip_norm": 1.0, "log_every": plan.run_log_every,
                        "valid_every": 10**9, "valid_bleu": False, "keep_checkpoints": 0, "seed": 1,
                        "threads": plan.threads}}
    path = part.work / "run.yaml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
    argv = [sys.executable, "-m", "mt", "train", str(path), "--out", str(out), "-q"]
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=max(1.0, part.left() - plan.reserve))
        code, err = done.returncode, done.stderr
    except subprocess.TimeoutExpired as e:
        code, err = None, (e.stderr or b"").decode(errors="replace") + "\ntimed out (--budget)"
    record = {"what": "mt train", "command": " ".join(argv), "config": config, "exit_code": code,
              "seconds": round(time.perf_counter() - started, 1)}
    entries = read_log(out / "log.jsonl") if (out / "log.jsonl").is_file() else []
    record |= epoch_rates([e for e in entries if "tgt_tok_per_s" in e])
    if code != 0:
        record["stderr_tail"] = err[-2000:]
    part.emit(record | {"headline": True})
    if code != 0:
        sys.exit(1)


def epoch_rates(intervals: list[dict]) -> dict:
    """A run's tokens/s per epoch from its log's intervals (each counted in the epoch it ends in), and its first
    epoch's against the later epochs'. An epoch's rate is the harmonic mean of its intervals' (each interval is
    `log_every` steps of about the same tokens, so this is tokens over seconds)."""
    by_epoch: dict[int, list[float]] = {}
    for entry in intervals:
        by_epoch.setdefault(entry["epoch"], []).append(entry["tgt_tok_per_s"])

    def rate(rates: list[float]) -> float:
        return len(rates) / sum(1 / r for r in rates)

    epochs = sorted(by_epoch)
    later = [r for epoch in epochs[1:] for r in by_epoch[epoch]]
    result = {"epochs": {str(e): {"intervals": len(by_epoch[e]), "tgt_tok_per_s": round(rate(by_epoch[e]))}
                         for e in epochs},
              "interval_tok_per_s": [[e["epoch"], round(e["tgt_tok_per_s"])] for e in intervals],
              "first_epoch_tok_per_s": round(rate(by_epoch[epochs[0]])) if epochs else None,
              "later_epochs_tok_per_s": round(rate(later)) if later else None}
    result["first_over_later"] = (round(rate(by_epoch[epochs[0]]) / rate(later), 3) if later else None)
    return result


def part_throughput(part: Part) -> None:
    """Item 2: real batches of 16k-25k target tokens, each system over all of them once untimed, then in `rounds`
    timed passes (the systems in turn, their order rotating); then mt compiled, as train.compile does it."""
    from mt.bench import matmul_peak, train_flops
    from mt.device import attention_backends, attention_kernels, autocast_dtype
    from mt.fast.paths import fast_paths

    plan, device = part.plan, part.device
    peak = matmul_peak("bf16", device, size=plan.matmul_size)
    part.emit({"what": "matmul peak", "precision": "bf16", "size": plan.matmul_size, "tflops": round(peak / 1e12, 1)})
    cfg, batches = real_batches(part, plan.train_tokens, plan.train_batches)
    settings = batch_settings(batches, plan.train_tokens, device) | {"preset": plan.preset,
                                                                     "precision": plan.precision}
    flops = sum(train_flops(cfg.model, int((b.src != 0).sum()), b.n_tgt_tokens, b.src.size(1), b.tgt_out.size(1))
                for b in batches)
    amp = autocast_dtype(plan.precision, device)
    model, mt_step = mt_trainer(cfg, device, amp)
    systems = {"mt": mt_step, "marian": marian_trainer(plan.preset, cfg, device, amp)}
    attention = {"mt": settings["mt_attention"], "marian": "PyTorch's choice"}
    if attention_backends(device) is not None:  # on a GPU: Marian with mt's kernels too, the fairer of the two
        systems["marian_mt_kernels"] = marian_trainer(plan.preset, cfg, device, amp, attention_kernels)
        attention["marian_mt_kernels"] = settings["mt_attention"]
    for step in systems.values():
        step_seconds(step, batches, device)  # every shape seen, cuDNN's plans built where it plans
    passes: dict[str, list[float]] = {name: [] for name in systems}
    peaks: dict[str, float | None] = {}
    resident = peak_gpu_mb(device, now=True)  # every system's weights and Adam states, there during every pass
    order = list(systems)
    for r in range(plan.rounds):
        if part.out_of_time(f"round {r + 1}"):
            break
        for name in order[r % len(order):] + order[:r % len(order)]:
            reset_peak(device)
            passes[name].append(sum(step_seconds(systems[name], batches, device)))
            peaks[name] = max(peaks.get(name) or 0, peak_gpu_mb(device) or 0) or None
    rates = {}
    for name, seconds in passes.items():
        if not seconds:
            continue
        median = statistics.median(seconds)
        rates[name] = settings["tgt_tokens"] / median
        part.emit({"what": "throughput", "system": name, "attention": attention[name], **settings,
                   "median_pass_s": round(median, 3), "passes_s": [round(s, 3) for s in seconds],
                   "tgt_tok_per_s": round(rates[name]), "mfu": round(flops / median / peak, 4),
                   "achieved_tflops": round(flops / median / 1e12, 1), "peak_gpu_mb": peaks.get(name),
                   "resident_gpu_mb": resident, **({"fast_paths": fast_paths(model)} if name == "mt" else {})})
    if "mt" in rates and len(rates) > 1:
        marians = {name: rate for name, rate in rates.items() if name != "mt"}
        part.emit({"what": "throughput ratio", "mt_tok_per_s": round(rates["mt"]),
                   "mfu": round(flops * rates["mt"] / settings["tgt_tokens"] / peak, 4),
                   "peak_gpu_mb": peaks.get("mt"), **{f"mt_over_{name}": round(rates["mt"] / rate, 3)
                                                      for name, rate in marians.items()},
                   "mt_over_best_marian": round(rates["mt"] / max(marians.values()), 3), "headline": True})
    compiled_passes(part, model, mt_step, batches, settings, flops, peak, rates)


def compiled_passes(part: Part, model, step: Callable, batches: list, settings: dict, flops: float, peak: float,
                    rates: dict) -> None:
    """mt compiled as `train.compile` compiles it (torch.compile of the model, PyTorch's automatic dynamic shapes),
    over the same batches: the first pass compiles (and recompiles for new shapes), later ones run what was
    compiled. A record after each pass, as a pass may outrun the budget."""
    plan, device = part.plan, part.device
    compiled = torch.compile(model, backend=plan.compile_backend)
    seconds = []
    for i in range(plan.compile_passes):
        if part.out_of_time(f"compiled pass {i + 1}"):
            break
        reset_peak(device)
        try:
            seconds.append(sum(step_seconds(lambda b: step(b, compiled), batches, device)))
        except Exception as e:  # a compiler that fails here (no C compiler, a graph break it cannot take) is a finding
            part.emit({"what": "compiled pass", "pass": i + 1, "backend": plan.compile_backend,
                       "error": f"{type(e).__name__}: {str(e)[:1500]}", "headline": True})
            return
        part.emit({"what": "compiled pass", "pass": i + 1, "backend": plan.compile_backend, **settings,
                   "pass_s": round(seconds[-1], 3), "tgt_tok_per_s": round(settings["tgt_tokens"] / seconds[-1]),
                   "graphs": compiled_graphs(), "peak_gpu_mb": peak_gpu_mb(device)})
    if len(seconds) < 2:
        return
    steady = min(seconds[1:])
    result = {"what": "compiled", "backend": plan.compile_backend, "compile_s": round(seconds[0] - steady, 1),
              "tgt_tok_per_s": round(settings["tgt_tokens"] / steady),
              "mfu": round(flops / steady / peak, 4), "headline": True}
    for name, rate in rates.items():
        result[f"over_{'eager' if name == 'mt' else name}"] = round(settings["tgt_tokens"] / steady / rate, 3)
    part.emit(result)


def compiled_graphs() -> int | None:
    """How many graphs torch.compile has built in this process (one per shape it compiled for), where it says."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: absent or renamed in some torch
        return None


def timed_median(run: Callable[[], list], runs: int, device: torch.device) -> tuple[float, list]:
    """The median seconds of `runs` calls of `run` after one warm-up call (mt.bench.timed), and what the last call
    returned."""
    from mt.bench import timed

    returned: list = [None]

    def call() -> None:
        returned[0] = run()

    median = statistics.median(timed(call, runs, device))
    return median, returned[0]


def mt_outputs(model, srcs: list[list[int]], opts, device: torch.device) -> list[list[int]]:
    """mt's best translation of each source (piece ids), through `translate_ids` as `mt translate` searches."""
    from mt.decode.search import translate_ids

    return [hyps[0].tokens for hyps in translate_ids(model, srcs, opts, device)]


@torch.inference_mode()
def marian_outputs(hf, batches: list[tuple[list[int], torch.Tensor]], n: int, eos: int, pad: int,
                   max_len: tuple[float, int] | None = None, **options) -> list[list[int]]:
    """Marian's translation of each source: `generate` on each (rows, padded ids) batch, each row cut at EOS.
    `max_len` (a, b): each batch's output limit a * S + b, EOS included, S its longest source (mt's is the same
    per sentence)."""
    found: list[list[int]] = [[] for _ in range(n)]
    for rows, src in batches:
        limit = {"max_length": int(max_len[0] * src.size(1) + max_len[1]) + 1} if max_len else {}  # + start token
        generated = hf.generate(input_ids=src, attention_mask=(src != pad).long(), **limit, **options)
        for i, out in zip(rows, generated[:, 1:].tolist(), strict=True):  # after the decoder's start token
            found[i] = out[:out.index(eos)] if eos in out else out
    return found


def part_decode(part: Part) -> None:
    """Item 3: random-weight presets translating random sources into exactly `tgt_len` tokens: mt's translate_ids
    (bf16 under autocast) against Marian's generate (bf16 weights), every setting of the plan."""
    from compare_translate import HF_EOS, HF_PAD, marian_generator

    from mt.bench import VOCAB, preset_model
    from mt.decode.search import SearchOptions
    from mt.fast.paths import fast_paths, for_inference

    plan, device = part.plan, part.device
    g = torch.Generator().manual_seed(0)
    longest = max(max(plan.decode_batches), plan.decode_sentences)
    sources = [torch.randint(4, VOCAB, (plan.src_len,), generator=g).tolist() for _ in range(longest)]
    for precision in plan.decode_precisions:
        model = for_inference(preset_model(plan.preset).to(device), precision)
        hf = marian_generator(plan.preset).to(device)
        hf = hf.to(torch.bfloat16) if precision == "bf16" else hf
        for beam, batch in ((beam, batch) for beam in plan.decode_beams for batch in plan.decode_batches):
            n = max(batch, plan.decode_sentences)
            setting = {"preset": plan.preset, "precision": precision, "beam": beam, "batch": batch, "sentences": n,
                       "src_len": plan.src_len, "tgt_len": plan.tgt_len, "runs": plan.runs}
            if part.out_of_time(f"decode {precision} beam {beam} batch {batch}"):
                return
            srcs = sources[:n]
            # translate_ids limits each output to a * source length + b tokens, EOS included: here tgt_len tokens
            # and EOS, unless an EOS comes earlier (none does from these models; `exact_length` says so).
            opts = SearchOptions(beam, 0.6, 0.0, plan.tgt_len + 1, batch_tokens=batch * (plan.src_len + 1),
                                 precision=precision)
            hf_batches = [(range(i, min(i + batch, n)), torch.tensor([s + [HF_EOS] for s in srcs[i:i + batch]],
                                                                     device=device)) for i in range(0, n, batch)]
            runs = {"mt": partial(mt_outputs, model, srcs, opts, device),
                    "marian": partial(marian_outputs, hf, hf_batches, n, HF_EOS, HF_PAD, num_beams=beam,
                                      do_sample=False, min_new_tokens=plan.tgt_len, max_new_tokens=plan.tgt_len)}
            rates = {}
            for name, run in runs.items():
                try:
                    median, outputs = timed_median(run, plan.runs, device)
                except Exception as e:  # e.g. out of memory: the other settings still run
                    part.emit({"what": "decode", "system": name, **setting, "error": f"{type(e).__name__}: {e}"})
                    continue
                tokens = sum(len(t) for t in outputs)
                rates[name] = tokens / median
                part.emit({"what": "decode", "system": name, **setting, "median_s": round(median, 4),
                           "tgt_tokens": tokens, "exact_length": {len(t) for t in outputs} == {plan.tgt_len},
                           "tgt_tok_per_s": round(rates[name]),
                           **({"fast_paths": fast_paths(model)} if name == "mt" else {})})
            if len(rates) == 2:
                ratio = round(rates["mt"] / rates["marian"], 3)
                part.emit({"what": "decode ratio", **setting, "mt_over_marian": ratio, "headline": True})
        del model, hf
        if device.type == "cuda":
            torch.cuda.empty_cache()


def part_checkpoint(part: Part) -> None:
    """Item 3: a trained checkpoint translating test2016 at its real lengths, from the same source ids: mt's
    translate_ids with the checkpoint's decoding settings against Marian's generate with the same weights (`mt
    export --to huggingface`: its own length penalty, the same beam and the same output limit)."""
    from transformers import MarianMTModel

    from mt.data.batches import pad
    from mt.data.lines import read_text
    from mt.data.tokenizer import EOS, PAD
    from mt.decode.load import load_model
    from mt.decode.search import SearchOptions
    from mt.export.convert import export

    plan, device = part.plan, part.device
    checkpoint = part.checkpoint or part.work / "run" / "best.pt"
    if not checkpoint.is_file():
        part.emit({"what": "checkpoint", "skipped": f"no checkpoint: {checkpoint} (--checkpoint, or the run part's)"})
        return
    exported = export(checkpoint, "huggingface", part.work / "huggingface", force=True)
    lines = read_text(part.data / "test.src.txt")[:plan.checkpoint_lines or None]
    for precision in plan.checkpoint_precisions:
        loaded = load_model(checkpoint, device, precision)
        ids = loaded.src_tok.encode(lines)
        hf = MarianMTModel.from_pretrained(exported).eval().to(device)
        hf = hf.to(torch.bfloat16) if precision == "bf16" else hf
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # as mt batches: similar lengths together
        for batch in plan.checkpoint_batches:
            if part.out_of_time(f"checkpoint {precision} batch {batch}"):
                return
            opts = SearchOptions.from_config(loaded.config.decode, precision=precision)
            opts.batch_tokens = batch * (sum(len(s) + 1 for s in ids) // len(ids) + 1)  # about `batch` sentences
            setting = {"checkpoint": str(checkpoint), "langs": loaded.state.get("langs"), "precision": precision,
                       "beam": opts.beam, "len_penalty": opts.len_penalty, "max_len": [opts.max_len_a, opts.max_len_b],
                       "batch": batch, "sentences": len(ids), "src_tokens": sum(len(s) + 1 for s in ids),
                       "runs": plan.checkpoint_runs, "parameters": loaded.parameters}
            hf_batches = []
            for start in range(0, len(order), batch):
                rows = order[start:start + batch]
                hf_batches.append((rows, pad([ids[i] for i in rows], [], [EOS]).to(device)))
            runs = {"mt": partial(mt_outputs, loaded.model, ids, opts, device),
                    "marian": partial(marian_outputs, hf, hf_batches, len(ids), EOS, PAD,
                                      (opts.max_len_a, opts.max_len_b), num_beams=opts.beam)}
            outputs, rates = {}, {}
            for name, run in runs.items():
                median, outputs[name] = timed_median(run, plan.checkpoint_runs, device)
                tokens = sum(len(t) for t in outputs[name])
                rates[name] = len(ids) / median
                part.emit({"what": "checkpoint", "system": name, **setting, "median_s": round(median, 3),
                           "tgt_tokens": tokens, "mean_tgt_len": round(tokens / len(ids), 2),
                           "sent_per_s": round(rates[name], 1), "tgt_tok_per_s": round(tokens / median)})
            same = sum(a == b for a, b in zip(outputs["mt"], outputs["marian"], strict=True)) / len(ids)
            part.emit({"what": "checkpoint ratio", **setting, "mt_over_marian_sent_per_s":
                       round(rates["mt"] / rates["marian"], 3), "identical_outputs": round(same, 3), "headline": True})
        del loaded, hf
        if device.type == "cuda":
            torch.cuda.empty_cache()


PART_FUNCTIONS = {"shapes": part_shapes, "run": part_run, "decode": part_decode, "checkpoint": part_checkpoint,
                  "throughput": part_throughput}


def run_part(args: argparse.Namespace) -> int:
    """In a part's own process: run it, its records on stdout."""
    from mt.memory import keep_freed_memory

    keep_freed_memory()  # as `mt` sets it, for both systems: they share this process
    fields = json.loads(args.plan)  # its tuples came as JSON lists
    plan = Plan(**{k: tuple(v) if isinstance(v, list) and k != "prepare_options" else v for k, v in fields.items()})
    if plan.threads:
        torch.set_num_threads(plan.threads)
    part = Part(args.part, plan, args.data, args.work, args.checkpoint, args.seconds)
    PART_FUNCTIONS[args.part](part)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# The whole run: prepare the data, each part in its process within its share of the budget, the report.

def environment() -> dict:
    """The Python, torch, CUDA, GPU and transformers this run has (gpu_check's, and the attention flags)."""
    from gpu_check import environment as base

    env = base()
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if torch.cuda.is_available():
        env["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()  # PyTorch's default; mt's steps avoid it
        env["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return env


class Runner:
    """Runs the parts, each a subprocess of this script within its share of the time, and keeps their records."""

    def __init__(self, plan: Plan, work: Path, budget: float, mirror: Path | None):
        self.plan, self.work, self.deadline = plan, work, time.monotonic() + budget
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if mirror is not None:
            self.env["MT_MIRROR"] = str(mirror)
        if plan.device == "cpu":
            self.env["CUDA_VISIBLE_DEVICES"] = ""  # nothing here sees a GPU, as the plan says
        if plan.threads:
            self.env["OMP_NUM_THREADS"] = str(plan.threads)  # the subprocesses too: mt prepare, mt train
        self.records: list[dict] = []
        self.parts: list[dict] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def prepare(self, data: Path | None) -> Path | None:
        """The prepared Multi30k de→en: --data, or prepared into the work directory (None if that failed)."""
        if data is not None:
            return data
        data = self.work / "multi30k_de_en"
        if (data / "meta.json").is_file():
            return data
        argv = [sys.executable, "-m", "mt", "prepare", "multi30k", "--src", "de", "--tgt", "en", "--out", str(data),
                "-q", *self.plan.prepare_options]
        record = {"name": "prepare", "command": " ".join(argv)}
        self.parts.append(record)
        started = time.perf_counter()
        try:
            done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=min(180, self.left()))
            record["exit_code"] = done.returncode
            if done.returncode != 0:
                record["stderr_tail"] = done.stderr[-2000:]
        except subprocess.TimeoutExpired:
            record["exit_code"] = None
        record |= {"seconds": round(time.perf_counter() - started, 1), "ok": record["exit_code"] == 0}
        return data if record["ok"] else None

    def part(self, name: str, data: Path | None, checkpoint: Path | None) -> None:
        """Part `name` in a process of its own, within its share of the time left."""
        later = list(PARTS)[list(PARTS).index(name):]
        seconds = self.left() * PARTS[name] / sum(PARTS[p] for p in later)
        if name in NEEDS_DATA and data is None:
            self.parts.append({"name": name, "item": ITEMS[name], "ok": None, "skipped": "no prepared Multi30k"})
            return
        if seconds < max(self.plan.reserve, 1):
            self.parts.append({"name": name, "item": ITEMS[name], "ok": None, "skipped": "out of time (--budget)"})
            return
        argv = [sys.executable, str(Path(__file__).resolve()), "--part", name, "--plan", json.dumps(asdict(self.plan)),
                "--work", str(self.work), "--seconds", f"{seconds:.0f}"]
        argv += ["--data", str(data)] if data is not None else []
        argv += ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
        print(f"gpu-bench: {name} (up to {seconds:.0f} s)", file=sys.stderr, flush=True)
        self.run(name, argv, seconds)

    def run(self, name: str, argv: list[str], seconds: float) -> dict:
        """Run `argv` as part `name`: its JSON lines kept as records as they come, and it is stopped (with its
        children) GRACE seconds past `seconds`, the time it was told to keep. Returns the part's record."""
        record: dict = {"name": name, "item": ITEMS[name]}
        self.parts.append(record)
        started = time.perf_counter()
        with tempfile.TemporaryFile("w+", encoding="utf-8") as err, subprocess.Popen(
                argv, env=self.env, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True) as process:
            reader = threading.Thread(target=self.read, args=(process.stdout,))
            reader.start()
            try:
                code = process.wait(timeout=seconds + GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
                record["timed_out"] = True
            reader.join()
            err.seek(0)
            tail = err.read()[-2000:]
        record |= {"exit_code": code, "seconds": round(time.perf_counter() - started, 1),
                   "ok": code == 0 and not record.get("timed_out"), "stderr_tail": tail}  # its warnings too
        return record

    def read(self, stdout) -> None:
        """A part's JSON lines, echoed as they come and kept; anything else it prints goes to stderr."""
        for line in stdout:
            try:
                record = json.loads(line)
            except ValueError:
                print(line, end="", file=sys.stderr, flush=True)
                continue
            self.records.append(record)
            print(line, end="", flush=True)


def summary(records: list[dict]) -> dict:
    """The headline records of each part (ratios, penalties, compile time), without the per-step detail."""
    detail = {"first_step_ms", "again_step_ms", "interval_tok_per_s", "config", "command", "torch", "cuda", "gpu",
              "cpu", "headline", "item", "part"}
    result: dict[str, list[dict]] = {}
    for r in records:
        if r.get("headline"):
            result.setdefault(r["part"], []).append({k: v for k, v in r.items() if k not in detail})
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same parts with the tiny preset, to test this script without a GPU")
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for everything; below "
                        f"{BUDGET:.0f} the work scales down with it [default: %(default)s]")
    parser.add_argument("--quick", action="store_true", help="half the batches, runs and epochs: a first look")
    parser.add_argument("--data", type=Path, help="a prepared Multi30k de→en [default: prepared here]")
    parser.add_argument("--mirror", type=Path, help="directory holding multi30k/*.gz [default: $MT_MIRROR]")
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint for the test2016 comparison "
                        "[default: the one the run part trains]")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-bench.json"), help="the JSON report "
                        "[default: %(default)s]")
    parser.add_argument("--work", type=Path, help="keep the data, run and export here [default: a temporary dir]")
    parser.add_argument("--part", choices=list(PARTS), help=argparse.SUPPRESS)  # inside a part's process
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.part:
        return run_part(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"gpu_bench": "skipped", "reason": "no CUDA device (torch.cuda.is_available() is False); "
                          "nothing was run", "python": platform.python_version(), "torch": torch.__version__}))
        return 0
    plan = make_plan(args.device, args.quick, args.budget)
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(plan, work, args.budget, args.mirror.resolve() if args.mirror else None)
    started = time.perf_counter()
    report = {"gpu_bench": "running", "device": plan.device, "environment": environment(), "plan": asdict(plan),
              "budget_s": args.budget}

    def write(status: str) -> None:
        report.update(gpu_bench=status, parts=runner.parts, summary=summary(runner.records), records=runner.records,
                      seconds=round(time.perf_counter() - started, 1))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    try:
        data = runner.prepare(args.data.resolve() if args.data else None)
        for name in PARTS:
            runner.part(name, data, args.checkpoint.resolve() if args.checkpoint else None)
            write("running")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [p["name"] for p in runner.parts if p.get("ok") is False]
    write("fail" if failed else "pass")
    print(json.dumps({"gpu_bench": report["gpu_bench"], "failed": failed, "out": str(args.out),
                      "seconds": report["seconds"]}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
