"""Translation and training throughput, measured the same way on any machine: `mt bench translate|train`.

Translation: random-weight presets do the same work as trained models because the output length is fixed (EOS
is barred until `tgt_len` tokens, then forced). With `--checkpoint C --input F`, a real model translates a real
test set at its real lengths instead. Timing: one warm-up run, then the median of `runs` timed runs.

Training: `train_step` on the model `mt train` trains (`mt.fast.paths.for_training`), on fixed-shape batches or a
prepared corpus's real ones, reported with its FLOPs and MFU against the machine's own matmul peak.
`write_readme_table` puts a table between markers in any markdown file (`--readme docs/benchmarks.md`).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

import torch

from mt.config import Config, ModelConfig
from mt.data.batches import Batch, collate, epoch_batches, pad
from mt.data.ids import Split
from mt.data.lines import read_text
from mt.data.tokenizer import EOS
from mt.decode.load import load_model
from mt.decode.search import SearchOptions, autocast, beam_search, greedy
from mt.decode.translate import compiled, translate_lines
from mt.device import autocast_dtype, native_bf16, pad_multiple, pick_device
from mt.errors import MtError
from mt.fast import choose
from mt.fast.compiled import compile_decoding
from mt.fast.linear import onednn_available, onednn_mm
from mt.fast.paths import PRECISIONS, fast_paths, for_inference, for_training
from mt.model.transformer import Transformer, count_parameters
from mt.options import TrainBench, TranslateBench
from mt.train.loop import train_step
from mt.train.optim import adam

PRESETS = {
    "tiny": dict(d_model=64, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=128),  # proves a benchmark runs; no figure
    "small": dict(d_model=256, n_heads=4, n_enc_layers=3, n_dec_layers=3, d_ff=1024),
    "base": dict(d_model=512, n_heads=8, n_enc_layers=6, n_dec_layers=6, d_ff=2048),
}
VOCAB = 8000


def preset_config(name: str, dropout: float = 0.0) -> ModelConfig:
    if name not in PRESETS:
        raise MtError(f"preset must be one of {', '.join(PRESETS)}, not {name!r}")
    return ModelConfig(**PRESETS[name], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=dropout)


def preset_model(name: str, seed: int = 0) -> Transformer:
    config = preset_config(name)
    torch.manual_seed(seed)
    return Transformer(config).eval()


def bench_translate(setting: TranslateBench) -> dict:
    """Translation throughput of one setting: the median of `runs` timed runs after a warm-up run."""
    if setting.threads:
        torch.set_num_threads(setting.threads)
    device = pick_device(setting.device)
    if setting.precision not in PRECISIONS or setting.precision == "int8" and device.type != "cpu":
        raise MtError(f"--precision {setting.precision}: fp32 or bf16, or int8 on a CPU")
    n = setting.sentences or max(setting.batch, 16)
    run, counted, parameters, paths = (checkpoint_workload if setting.checkpoint else preset_workload)(setting, n,
                                                                                                       device)
    times = timed(run, setting.runs, device)
    median = statistics.median(times)
    return {
        "bench": "translate", **asdict(setting), "device": str(device), "sentences": n,
        "threads": torch.get_num_threads(), **machine(device), "fast_paths": paths, "parameters": parameters,
        "tgt_tokens": counted[0], "median_s": median, "min_s": min(times),
        "tgt_tok_per_s": counted[0] / median, "sent_per_s": n / median, **peak_memory(device),
        "torch": torch.__version__,
    }


def checkpoint_workload(setting: TranslateBench, n: int, device: torch.device
                        ) -> tuple[Callable, list[int], int, list[str]]:
    """A trained checkpoint translating the first `n` lines of a real file, at their real lengths."""

    if not setting.input:
        raise MtError("--checkpoint needs --input FILE: the real sentences to translate")
    loaded = load_model(setting.checkpoint, device, setting.precision)
    lines = read_text(setting.input)[:n]
    opts = SearchOptions.from_config(loaded.config.decode, beam=setting.beam, precision=setting.precision)
    opts.batch_tokens = setting.batch * (sum(len(s) for s in loaded.src_tok.encode(lines)) // len(lines) + 1)
    if setting.compile:
        compiled(loaded, opts, device)
    counted: list[int] = [0]

    def run() -> None:
        results = translate_lines(loaded, lines, opts, device)
        counted[:] = [sum(len(h[0].tokens) + 1 for h in results if h)]

    return run, counted, loaded.parameters, fast_paths(loaded.model)


def preset_workload(setting: TranslateBench, n: int, device: torch.device
                    ) -> tuple[Callable, list[int], int, list[str]]:
    """A random-weight preset translating `n` random sources into exactly `tgt_len` tokens each."""
    model = preset_model(setting.preset, setting.seed).to(device)
    parameters = count_parameters(model)
    model = for_inference(model, setting.precision)
    if setting.compile:
        compile_decoding(model)  # compiled in the warm-up run
    g = torch.Generator().manual_seed(setting.seed)
    srcs = [torch.randint(4, VOCAB, (setting.src_len,), generator=g).tolist() for _ in range(n)]
    batches = [pad(srcs[i:i + setting.batch], [], [EOS]).to(device) for i in range(0, n, setting.batch)]
    limit, exact = setting.tgt_len + 1, setting.tgt_len  # EOS barred before tgt_len tokens, forced after

    def run() -> None:
        with autocast(setting.precision, device):
            for src in batches:
                if setting.beam == 1:
                    greedy(model, src, 0.0, limit, min_len=exact)
                else:
                    beam_search(model, src, setting.beam, 0.6, 0.0, limit, min_len=exact)

    return run, [n * setting.tgt_len], parameters, fast_paths(model)


def timed(run: Callable, runs: int, device: torch.device) -> list[float]:
    """Seconds of each of `runs` calls of `run`, after one untimed warm-up call (allocator, kernels, caches)."""
    run()
    times = []
    for _ in range(runs):
        synchronize(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queue, so a timer reads work done rather than work launched."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    peak = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        peak["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peak


def grid() -> list[TranslateBench]:
    """The standard grid of `make bench`: small/base × greedy/beam 4 × batch 1/64 × fp32/bf16/int8."""
    return [TranslateBench(preset=p, beam=beam, batch=batch, precision=prec, runs=3 if p == "base" else 5)
            for p in ("small", "base") for beam in (1, 4) for batch in (1, 64) for prec in ("fp32", "bf16", "int8")]


def run_isolated(kind: str, setting: TranslateBench | TrainBench) -> dict:
    """One setting in a fresh process (`mt bench KIND --json`), so no allocator, thread pool or cache state carries
    over from the settings before it. Fields left at their defaults are not passed."""
    args = [sys.executable, "-m", "mt", "bench", kind, "--json"]
    for f in fields(setting):
        value = getattr(setting, f.name)
        if value is not None and value != f.default:
            args += [f"--{f.name.replace('_', '-')}", str(value)]
    return json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)


def markdown_table(rows: list[dict]) -> str:
    head = ("| preset | beam | batch | precision | tgt tok/s | sent/s | median s | peak RSS MB |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['preset']} | {r['beam']} | {r['batch']} | {r['precision']} | {r['tgt_tok_per_s']:,.0f} | "
             f"{r['sent_per_s']:,.1f} | {r['median_s']:.3f} | {r['peak_rss_mb']:,.0f} |" for r in rows]
    return "\n".join([head, *lines])


def write_readme_table(path: Path, name: str, table: str, command: str) -> None:
    """Replace the block between `<!-- bench:NAME -->` markers in the markdown file at `path` (added at the end if
    absent; the file is created if missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n`{command}`\n\n{table}\n{end}"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    path.write_text(text, encoding="utf-8")


def train_grid(data: str | None = None) -> list[TrainBench]:
    """The training rows of `make bench`: small/base × fp32/bf16 on fixed batches of 64 pairs of 24 + 24 tokens,
    and, given a prepared corpus, small on its real length-grouped batches of 4096 tokens."""
    rows = [TrainBench(preset=p, precision=prec, steps=10 if p == "small" else 5)
            for p in ("small", "base") for prec in ("fp32", "bf16")]
    if data:
        rows.append(TrainBench(preset="small", data=data, steps=20))
    return rows


def train_markdown_table(rows: list[dict]) -> str:
    head = ("| preset | batches | precision | tgt tok/s | MFLOP/token | GFLOP/s | MFU | padding | data loading | "
            "peak RSS MB |\n|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {r['preset']} | {batches_label(r)} | {r['precision']} | {r['tgt_tok_per_s']:,.0f} | "
             f"{r['flops_per_tgt_token'] / 1e6:.1f} | {r['achieved_tflops'] * 1000:.0f} | {r['mfu']:.0%} | "
             f"{r['padding_fraction']:.1%} | {r['data_loading_fraction']:.1%} | {r['peak_rss_mb']:,.0f} |"
             for r in rows]
    return "\n".join([head, *lines])


def batches_label(r: dict) -> str:
    if r["data"]:
        return f"{Path(r['data']).name}, {r['max_tokens']} tokens"
    return f"{r['batch']} × ({r['src_len']} + {r['tgt_len']})"


def train_flops(cfg: ModelConfig, src_tokens: int, tgt_tokens: int, src_len: float, tgt_len: float) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 × forward), the convention of MFU reports.

    src_len/tgt_len are the padded lengths attention runs over. Embedding lookups, norms and softmax are not
    counted: they are not matmuls, so they do not count toward the matmul peak either.
    """
    d, f, v = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    enc = cfg.n_enc_layers * (4 * d * d + 2 * d * f + 2 * src_len * d) * src_tokens
    dec = cfg.n_dec_layers * ((6 * d * d + 2 * d * f + 2 * tgt_len * d + 2 * src_len * d) * tgt_tokens
                              + 2 * d * d * src_tokens)  # cross-attention keys/values over the source
    out = d * v * tgt_tokens
    return 3 * 2 * (enc + dec + out)


def machine(device: torch.device) -> dict:
    """What the machine's kernels are, as the fast paths chose them: the CPU's instruction set as PyTorch uses it,
    whether it multiplies bf16 in hardware (else bf16 is emulated and `auto` precision is fp32), and the choices the
    run made by measurement (mt/fast/choose.py), each with what its candidates took."""
    if device.type != "cpu":
        return {"choices": choose.made()}
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": native_bf16(),
            "choices": choose.made(), "choices_file": str(choose.path())}


def matmul_peak(precision: str, device: torch.device, size: int = 2048, runs: int = 3) -> float:
    """The machine's own measured matmul FLOP/s in this precision (the MFU denominator), multiplied as a linear
    layer multiplies (x @ W^T); in fp32 on a CPU the faster of PyTorch's two kernels, MKL and oneDNN (see
    mt/fast/linear.py), so the choice of kernel cannot flatter the MFU. Where bf16 is emulated (an AVX2-only
    CPU), `a @ b` in bf16 takes a fallback far slower than the linear layers' product, and oneDNN's linear kernel
    has no bf16 at all: neither is a peak."""

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = (torch.randn(size, size, dtype=dtype, device=device) for _ in range(2))
    kernels = [lambda: a @ b.t()]
    if device.type != "cpu":
        kernels.append(lambda: a @ b)
    elif dtype == torch.float32 and onednn_available():
        kernels.append(lambda: onednn_mm(a, b))
    return 2 * size ** 3 / min(min(timed(kernel, runs, device)) for kernel in kernels)


def bench_train(setting: TrainBench) -> dict:
    """Training throughput of one setting: `warmup` untimed steps, then `steps` timed ones."""

    if setting.precision not in ("fp32", "bf16"):
        raise MtError(f"--precision {setting.precision}: must be fp32 or bf16")
    if setting.threads:
        torch.set_num_threads(setting.threads)
    device = pick_device(setting.device)
    torch.manual_seed(0)
    cfg = Config(model=preset_config(setting.preset, setting.dropout))
    amp_dtype = autocast_dtype(setting.precision, device)
    batches, load_seconds = train_batches(setting, cfg, pad_multiple(device))
    model = for_training(Transformer(cfg.model).to(device)).train()  # the model as `mt train` trains it
    optimizer = adam(list(model.parameters()), cfg.train)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    times = []
    for i, batch in enumerate(batches):
        synchronize(device)
        start = time.perf_counter()
        train_step(model, optimizer, scaler, [batch.to(device)], cfg, device, amp_dtype, 1e-4)
        synchronize(device)
        if i >= setting.warmup:
            times.append(time.perf_counter() - start)
    timed_batches = batches[setting.warmup:]
    tgt_tokens = sum(x.n_tgt_tokens for x in timed_batches)
    src_tokens = sum(int((x.src != 0).sum()) for x in timed_batches)
    padded = sum(x.src.numel() + x.tgt_out.numel() for x in timed_batches)
    flops = sum(train_flops(cfg.model, int((x.src != 0).sum()), x.n_tgt_tokens, x.src.size(1), x.tgt_out.size(1))
                for x in timed_batches)
    seconds = sum(times)
    peak = matmul_peak(setting.precision, device)
    return {
        "bench": "train", **asdict(setting), "device": str(device), "threads": torch.get_num_threads(),
        **machine(device), "fast_paths": fast_paths(model), "parameters": count_parameters(model),
        "median_step_s": statistics.median(times), "tgt_tok_per_s": tgt_tokens / seconds,
        "src_tok_per_s": src_tokens / seconds, "flops_per_tgt_token": flops / tgt_tokens,
        "achieved_tflops": flops / seconds / 1e12, "peak_tflops": peak / 1e12, "mfu": flops / seconds / peak,
        "padding_fraction": 1 - (src_tokens + tgt_tokens) / padded,
        "data_loading_fraction": load_seconds / (seconds / len(times) + load_seconds),
        **peak_memory(device), "torch": torch.__version__,
    }


def covering_vocab(split: Split) -> int:
    """The presets' vocabulary size, or more where a prepared corpus's ids go past it."""
    return max(VOCAB, int(split.src_ids.max()) + 1, int(split.tgt_ids.max()) + 1)


def train_batches(setting: TrainBench, cfg: Config, multiple: int = 1) -> tuple[list[Batch], float]:
    """The setting's batches on the host (a prepared corpus's real ones, their lengths rounded up to a multiple of
    `multiple` as `mt train` rounds them on this device, or one fixed-shape batch repeated), and the seconds
    collating one took."""
    total = setting.warmup + setting.steps
    if not setting.data:
        g = torch.Generator().manual_seed(0)
        src = torch.randint(4, VOCAB, (setting.batch, setting.src_len), generator=g)
        tgt = torch.randint(4, VOCAB, (setting.batch, setting.tgt_len + 1), generator=g)
        src[:, -1] = EOS
        return [Batch(src, tgt[:, :-1], tgt[:, 1:], setting.batch * setting.tgt_len)] * total, 0.0
    if not Split.exists(setting.data, "train"):
        raise MtError(f"--data {setting.data}: no prepared training split there (train.src.ids.npy); run `mt "
                      "prepare` first")
    split = Split(setting.data, "train")
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = covering_vocab(split)
    order = epoch_batches(split, setting.max_tokens, cfg.model.max_len, seed=0, epoch=0)[:total]
    load_start = time.perf_counter()
    batches = [collate(split, idx, cfg.model.max_len, multiple) for idx in order]
    return batches, (time.perf_counter() - load_start) / len(batches)


def run_grid(kind: str, threads: int, data: str | None, readme: Path | None, as_json: bool,
             echo: Callable[[str, bool], None]) -> None:
    """`mt bench KIND --grid`: each standard setting in its own process, a row echoed as it finishes, then the
    table (also written between its markers in `readme`)."""
    settings = grid() if kind == "translate" else train_grid(data)
    table_of = markdown_table if kind == "translate" else train_markdown_table
    rows = []
    for setting in settings:
        setting.threads = threads
        rows.append(run_isolated(kind, setting))
        echo(json.dumps(rows[-1]) if as_json else table_of(rows[-1:]).splitlines()[-1], not as_json)
    table = table_of(rows)
    echo(table, False)
    if readme is not None:
        command = f"mt bench {kind} --grid --readme {readme}" + (f" --data {data}" if data else "")
        write_readme_table(readme, kind, table, command)


def summary(result: dict) -> str:
    """One setting's result as `mt bench` prints it without --json."""
    paths = "fast paths: " + ("; ".join(result["fast_paths"]) or "none (MT_FAST=0)")
    if "cpu_capability" in result:
        bf16 = "bf16 in hardware" if result["native_bf16"] else "bf16 emulated"
        paths += f" · CPU {result['cpu_capability']}, {bf16}"
    if result.get("choices"):
        paths += (f"\nchoices by measurement on this machine ({result.get('choices_file', 'not kept')}):\n  "
                  + "\n  ".join(result["choices"]))
    if result["bench"] == "translate":
        return markdown_table([result]) + "\n" + paths
    return (f"{result['tgt_tok_per_s']:,.0f} tgt tok/s · MFU {result['mfu']:.1%} of "
            f"{result['peak_tflops'] * 1000:.0f} GFLOP/s · {result['flops_per_tgt_token'] / 1e6:.1f} MFLOP/token"
            f" · padding {result['padding_fraction']:.1%} · peak RSS {result['peak_rss_mb']:,.0f} MB\n{paths}")
