"""Where decoding's fp32 products should go: MKL against a weight stored (in, out), or oneDNN against a weight
packed once in its own layout, by rows and weight shape, on one thread unless --threads says more (`FrozenLinear`,
`onednn_pays` in mt/model/fast_linear.py).

    python benchmarks/linear_crossover.py [--threads 1]

Prints MKL's time over oneDNN's per rows × (in → out), medians of many calls with each weight reused.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from mt.model.fast_linear import onednn_mm, pack_for_onednn

SHAPES = [(256, 256), (256, 768), (256, 1024), (1024, 256), (256, 8000),
          (512, 512), (512, 1536), (512, 2048), (2048, 512), (512, 8000)]
ROWS = [1, 2, 4, 8, 16, 32, 64, 256]


def median_us(run, calls: int = 200) -> float:
    for _ in range(10):
        run()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU {torch.backends.cpu.get_cpu_capability()}, {args.threads} thread(s): MKL time / oneDNN packed time")
    print("rows | " + " | ".join(f"{i}→{o}" for i, o in SHAPES))
    for rows in ROWS:
        cells = []
        for n_in, n_out in SHAPES:
            x, weight, bias = torch.randn(rows, n_in), torch.randn(n_out, n_in), torch.randn(n_out)
            weight_t, packed = weight.t().contiguous(), pack_for_onednn(weight)
            mkl = median_us(functools.partial(torch.addmm, bias, x, weight_t))
            onednn = median_us(functools.partial(onednn_mm, x, packed, bias))
            cells.append(f"{mkl / onednn:.2f}")
        print(f"{rows} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
