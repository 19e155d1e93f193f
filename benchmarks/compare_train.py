"""Side by side: an `mt` training step against Hugging Face `MarianMTModel` at the same architecture.

Both train on the same batches (dropout 0.1, label smoothing 0.1, the same fused Adam): forward, loss, backward,
optimizer step. By default a fixed-shape batch of random ids (`--batch` pairs of `--src-len` + `--tgt-len` tokens);
with `--data DIR`, a prepared corpus's real batches as `mt train` makes them (`--max-tokens`, length-grouped, padded
per batch), the same sequence for every system. Steps alternate between the systems so machine noise hits them alike;
the medians of each step's target tokens per second are compared. Needs `pip install -e '.[bench]'`.
`marian` and `marian_step` are also the Marian side of benchmarks/gpu_bench.py.

Each system runs as its users run it on this CPU: Hugging Face in one process with a thread per core (as its
Trainer does); `mt` likewise ("mt"), and, with `--procs N` > 1 (by default one per core, as `make recipe` trains on
a CPU), also as N single-thread processes that each take an equal share of the batch, their gradients averaged by
DistributedDataParallel over gloo ("mt-per-core", through mt's own mt/train/distributed.py). `--hf-procs N` runs
Hugging Face that way too, like for like.

    python benchmarks/compare_train.py --preset small --precision fp32
    python benchmarks/compare_train.py --preset base --data data/prepared/multi30k_de_en

Prints one JSON object per system and their ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing.connection
import os
import signal
import socket
import statistics
import time
from contextlib import nullcontext

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from mt.bench import PRESETS, VOCAB, covering_vocab, train_batches
from mt.config import Config, ModelConfig
from mt.data.batches import Batch, collate, epoch_batches
from mt.data.ids import Split
from mt.data.tokenizer import EOS, PAD
from mt.fast.paths import for_training
from mt.memory import keep_freed_memory
from mt.model.transformer import Transformer
from mt.options import TrainBench
from mt.train import distributed
from mt.train.loop import train_step
from mt.train.optim import adam

WARMUP = 2  # untimed steps of each system before the timed ones


def marian(preset: str, vocab: int = VOCAB):
    from transformers import MarianConfig, MarianMTModel

    p = PRESETS[preset]
    config = MarianConfig(
        vocab_size=vocab, d_model=p["d_model"], encoder_layers=p["n_enc_layers"], decoder_layers=p["n_dec_layers"],
        encoder_attention_heads=p["n_heads"], decoder_attention_heads=p["n_heads"], encoder_ffn_dim=p["d_ff"],
        decoder_ffn_dim=p["d_ff"], activation_function="relu", max_position_embeddings=256, scale_embedding=True,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, eos_token_id=EOS,
        decoder_start_token_id=0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    return MarianMTModel(config).train()


def marian_step(hf, optimizer: torch.optim.Optimizer, batch: Batch, amp: torch.dtype | None) -> None:
    """One training step of Hugging Face's model as its users write it: forward under autocast, label-smoothed loss
    per target token, backward, clipping to norm 1, Adam. Padded sources are masked; targets are right-padded, so
    the causal mask alone keeps real positions from seeing padding (as in mt), and no decoder mask is passed.
    Under DDP each process's loss is per its own tokens; DDP averages equal shares into the whole batch's."""
    device = batch.src.device
    with torch.autocast(device.type, dtype=amp) if amp else nullcontext():
        logits = hf(input_ids=batch.src, attention_mask=(batch.src != PAD).long(),
                    decoder_input_ids=batch.tgt_in).logits
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch.tgt_out.reshape(-1), label_smoothing=0.1,
                           ignore_index=PAD, reduction="sum") / batch.n_tgt_tokens
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def workload(args: argparse.Namespace) -> tuple[list[Batch], ModelConfig]:
    """The whole batches of the run's steps in order (one fixed-shape batch, or the first real ones of a prepared
    corpus's epoch that every process of a per-core run can take rows of: a long sentence may be alone in its
    batch), and the model's config, its vocabulary covering the batches' ids."""
    steps = WARMUP + args.steps
    cfg = Config(model=ModelConfig(**PRESETS[args.preset], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=0.1))
    if not args.data:
        setting = TrainBench(preset=args.preset, batch=args.batch, src_len=args.src_len, tgt_len=args.tgt_len,
                             steps=steps, warmup=0)
        return train_batches(setting, cfg)[0], cfg.model
    split = Split(args.data, "train")
    most = max(args.procs, args.hf_procs)
    order = [idx for idx in epoch_batches(split, args.max_tokens, cfg.model.max_len, seed=0, epoch=0)
             if len(idx) >= most][:steps]
    if len(order) < steps:
        raise SystemExit(f"--data {args.data}: fewer than {steps} batches of {most} sentences or more")
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = covering_vocab(split)
    return [collate(split, idx, cfg.model.max_len) for idx in order], cfg.model


def share(batch: Batch, rank: int, world: int) -> Batch:
    """Rank `rank`'s equal share of the batch's rows."""
    rows = slice(rank * batch.src.size(0) // world, (rank + 1) * batch.src.size(0) // world)
    return Batch(batch.src[rows], batch.tgt_in[rows], batch.tgt_out[rows], int((batch.tgt_out[rows] != PAD).sum()))


def trainer(system: str, args: argparse.Namespace, batches: list[Batch], model_cfg: ModelConfig, rank: int = 0,
            world: int = 1):
    """One process's training step of `system` ("mt" or "hf") on its share of step i's batch of `batches` (the
    `workload`), as a function of i; with world > 1, inside the process group, its gradients averaged by DDP."""
    torch.manual_seed(0)
    amp = torch.bfloat16 if args.precision == "bf16" else None
    cfg = Config(model=model_cfg)
    cfg.train.clip_norm = 1.0  # as the Hugging Face step
    mine = [share(batch, rank, world) for batch in batches]
    if system == "mt":
        model = for_training(Transformer(cfg.model).train())  # as `mt train` builds it
        optimizer = adam(list(model.parameters()), cfg.train)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        ddp = distributed.wrap(model, torch.device("cpu"))
        return lambda i: train_step(ddp or model, optimizer, scaler, [mine[i]], cfg, torch.device("cpu"), amp, 1e-4,
                                    n_tokens=batches[i].n_tgt_tokens, ddp=ddp)
    hf = marian(args.preset, cfg.model.tgt_vocab_size)
    optimizer = adam(list(hf.parameters()), cfg.train)
    hf = distributed.wrap(hf, torch.device("cpu")) or hf  # DDP as mt's, when in a group
    return lambda i: marian_step(hf, optimizer, mine[i], amp)


def processes(args: argparse.Namespace, system: str) -> int:
    """How many single-thread processes train `system` in its per-core run."""
    return args.procs if system == "mt" else args.hf_procs


def worker(rank: int, system: str, args: argparse.Namespace, port: int,
           conn: multiprocessing.connection.Connection) -> None:
    """One of `args.procs` single-thread processes: joins the group as torchrun would set it up, then takes a
    training step each time it is told to."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(processes(args, system)))
    keep_freed_memory()
    torch.set_num_threads(1)
    distributed.start(torch.device("cpu"))
    step = trainer(system, args, *workload(args), rank, distributed.world_size())
    conn.send(True)  # ready: the timed steps of the other systems wait for every worker's start-up to end
    while (i := conn.recv()) is not None:
        step(i)
        conn.send(True)
    distributed.stop()


def free_ports(n: int) -> list[int]:
    """n distinct free ports, one for each group to meet at (held open together, so none is given twice)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class PerCore:
    """`system` trained by single-thread worker processes, one step at a time on demand. A worker that dies (at
    start or in a step) ends the benchmark, the others with it, rather than leaving them waiting for it."""

    def __init__(self, system: str, args: argparse.Namespace, port: int):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for rank in range(processes(args, system)):
            ours, theirs = ctx.Pipe()
            self.conns.append(ours)
            self.procs.append(ctx.Process(target=worker, args=(rank, system, args, port, theirs), daemon=True))
            self.procs[-1].start()
        self.answered()  # each set up (torch, the group, the model): no system is timed while one starts

    def __call__(self, i: int) -> None:
        try:
            for conn in self.conns:
                conn.send(i)
        except BrokenPipeError:
            self.failed()
        self.answered()

    def answered(self) -> None:
        """Waits for a message from every worker."""
        waiting = list(self.conns)
        while waiting:
            ready = multiprocessing.connection.wait(waiting + [proc.sentinel for proc in self.procs])
            if any(proc.sentinel in ready for proc in self.procs):
                self.failed()
            for conn in ready:
                try:
                    conn.recv()
                except (EOFError, ConnectionError):  # its process is on its way out
                    self.failed()
                waiting.remove(conn)

    def failed(self) -> None:
        self.close()
        ours = (0, -signal.SIGTERM)  # ended by `close`
        codes = {rank: proc.exitcode for rank, proc in enumerate(self.procs) if proc.exitcode not in ours}
        raise SystemExit(f"training processes failed (rank: exit code {codes}); their errors are above")

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if proc.is_alive():
                try:
                    conn.send(None)
                except BrokenPipeError:
                    pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():  # waiting in the group for one that died
                proc.terminate()
                proc.join()


def main() -> None:
    cores = len(os.sched_getaffinity(0))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=list(PRESETS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--tgt-len", type=int, default=24)
    ap.add_argument("--data", default=None, help="a prepared corpus: its real batches instead of the fixed shape")
    ap.add_argument("--max-tokens", type=int, default=4096, help="of each real batch, as `mt train`'s")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="of the one-process systems")
    ap.add_argument("--procs", type=int, default=None,
                    help="single-thread processes of mt-per-core (default: one per core, or the most up to that "
                         "which divide --batch; 1: none)")
    ap.add_argument("--hf-procs", type=int, default=1, help="the same for Hugging Face (default 1: none)")
    args = ap.parse_args()
    if args.procs is None:  # real batches are split as evenly as their rows allow
        args.procs = cores if args.data else max(n for n in range(1, cores + 1) if args.batch % n == 0)
    for flag, procs in (("--procs", args.procs), ("--hf-procs", args.hf_procs)):
        if procs > 1 and args.batch % procs and not args.data:
            ap.error(f"{flag} {procs} must divide --batch {args.batch}: each process takes an equal share")
    keep_freed_memory()  # as `mt` sets it, for both systems: they share this process
    torch.set_num_threads(args.threads)

    batches, model_cfg = workload(args)
    systems = {system: trainer(system, args, batches, model_cfg) for system in ("mt", "hf")}
    per_core = [system for system, procs in (("mt", args.procs), ("hf", args.hf_procs)) if procs > 1]
    workers = []
    for system, port in zip(per_core, free_ports(len(per_core)), strict=True):
        workers.append(PerCore(system, args, port))
        systems[f"{system}-per-core"] = workers[-1]
    times = {name: [] for name in systems}
    try:
        for i in range(WARMUP + args.steps):
            for name, step in systems.items():
                start = time.perf_counter()
                step(i)
                if i >= WARMUP:
                    times[name].append(time.perf_counter() - start)
    finally:
        for w in workers:
            w.close()
    tokens = [batch.n_tgt_tokens for batch in batches[WARMUP:]]
    made_of = f"{os.path.basename(os.path.normpath(args.data))}, {args.max_tokens} tokens" if args.data else (
        f"{args.batch} x ({args.src_len} + {args.tgt_len})")
    rates = {}
    for name, ts in times.items():
        rates[name] = statistics.median(n / t for n, t in zip(tokens, ts, strict=True))
        procs = processes(args, name.split("-")[0]) if name.endswith("per-core") else 1
        print(json.dumps({"system": name, "preset": args.preset, "precision": args.precision, "batches": made_of,
                          "processes": procs, "threads": 1 if procs > 1 else args.threads,
                          "median_step_s": statistics.median(ts), "tgt_tok_per_s": rates[name]}))
    ratios = {f"ratio_{name.replace('-', '_')}_over_hf": round(rate / rates["hf"], 2)
              for name, rate in rates.items() if name.startswith("mt")}
    if "hf-per-core" in rates and "mt-per-core" in rates:
        ratios["ratio_mt_per_core_over_hf_per_core"] = round(rates["mt-per-core"] / rates["hf-per-core"], 2)
    print(json.dumps(ratios))


if __name__ == "__main__":
    main()
