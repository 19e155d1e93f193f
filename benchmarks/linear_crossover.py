"""Where decoding's fp32 products go: MKL against a weight stored (in, out), or oneDNN against a weight packed once
in its own layout, by rows and weight shape, on one thread unless --threads says more: a grid of what `FrozenLinear`
measures for itself at first use (`decoding_kernel` in mt/fast/linear.py), here with --cold too.

    python benchmarks/linear_crossover.py [--threads 1] [--rows 1 2 4 ...] [--cold]

Prints MKL's time over oneDNN's per rows × (in → out), medians of many calls with each weight reused; with --cold,
each call takes the next of enough copies of the weight to fill 64 MiB, so that it comes from memory, as in a
decoding step of a model larger than the L3 cache.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from mt.fast.linear import onednn_mm, pack_for_onednn

SHAPES = [(256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000),
          (512, 512), (512, 1536), (512, 2048), (2048, 512), (512, 8000)]
ROWS = [1, 2, 4, 8, 16, 32, 64, 256]


def median_us(runs: list, calls: int = 200) -> float:
    """The median time of a call, the calls taking the functions in `runs` in turn."""
    for i in range(10):
        runs[i % len(runs)]()
    times = []
    for i in range(calls):
        start = time.perf_counter()
        runs[i % len(runs)]()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS)
    ap.add_argument("--cold", action="store_true", help="weights from memory, not from the cache")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s), weights "
          f"{'from memory' if args.cold else 'reused'}: MKL time / oneDNN packed time")
    print("rows | " + " | ".join(f"{i}→{o}" for i, o in SHAPES))
    for rows in args.rows:
        cells = []
        for n_in, n_out in SHAPES:
            copies = max(1, (64 << 20) // (4 * n_in * n_out)) if args.cold else 1
            x, bias = torch.randn(rows, n_in), torch.randn(n_out)
            weights = [torch.randn(n_out, n_in) for _ in range(copies)]
            mkl = median_us([functools.partial(torch.addmm, bias, x, w.t().contiguous()) for w in weights])
            onednn = median_us([functools.partial(onednn_mm, x, pack_for_onednn(w), bias) for w in weights])
            cells.append(f"{mkl / onednn:.2f}")
        print(f"{rows} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
