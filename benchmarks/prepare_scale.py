"""`mt prepare` at scale: throughput and peak memory on corpora of growing size.

The corpus is Multi30k's training set repeated with variation until it has the asked number of pairs: copy k of
a sentence pair gets the number k appended on both sides (so no two pairs are equal and SentencePiece sees a
growing set of distinct lines). Each size is prepared by a fresh `python -m mt prepare` process, whose peak
resident memory is read from the kernel (`wait4`) when it exits, so the figure covers SentencePiece's C++
side as well as Python.

    python benchmarks/prepare_scale.py --pairs 1000000 5000000

Prints one JSON object per size, then the memory growth from the smallest to the largest.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def write_corpus(prefix: Path, pairs: int, src: str, tgt: str) -> None:
    with gzip.open(MIRROR / f"train.{src}.gz", "rt", encoding="utf-8") as f:
        src_lines = [line.rstrip("\n") for line in f]
    with gzip.open(MIRROR / f"train.{tgt}.gz", "rt", encoding="utf-8") as f:
        tgt_lines = [line.rstrip("\n") for line in f]
    with open(f"{prefix}.{src}", "w", encoding="utf-8") as fs, open(f"{prefix}.{tgt}", "w", encoding="utf-8") as ft:
        for i in range(pairs):
            copy, j = divmod(i, len(src_lines))
            suffix = f" {copy}" if copy else ""
            fs.write(src_lines[j] + suffix + "\n")
            ft.write(tgt_lines[j] + suffix + "\n")


def run_prepare(prefix: Path, out: Path, src: str, tgt: str) -> dict:
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mt", "prepare", "--train", str(prefix), "--src", src,
                             "--tgt", tgt, "--out", str(out), "--quiet"], stdout=subprocess.PIPE, text=True)
    summary = proc.stdout.read()  # before waiting: a full pipe would block the child
    _, status, usage = os.wait4(proc.pid, 0)  # reaps the child and gives its own peak memory and CPU time
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"mt prepare failed on {prefix}")
    meta = json.loads((out / "meta.json").read_text())
    return {"seconds": round(seconds, 1), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "kept": meta["cleaning"]["kept"], "summary": summary.strip().splitlines()[:2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 5_000_000])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/mt_prepare_scale"))
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    args = parser.parse_args()
    if not (MIRROR / f"train.{args.src}.gz").is_file():
        raise SystemExit(f"needs the Multi30k mirror at {MIRROR}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for pairs in args.pairs:
        prefix = args.workdir / f"corpus{pairs}"
        write_corpus(prefix, pairs, args.src, args.tgt)
        result = {"pairs": pairs, **run_prepare(prefix, args.workdir / f"prepared{pairs}", args.src, args.tgt)}
        result["pairs_per_s"] = round(pairs / result["seconds"])
        results.append(result)
        print(json.dumps(result), flush=True)
        for path in (Path(f"{prefix}.{args.src}"), Path(f"{prefix}.{args.tgt}")):
            path.unlink()
        shutil.rmtree(args.workdir / f"prepared{pairs}")
    if len(results) > 1:
        growth = results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"] - 1
        print(json.dumps({"memory_growth": f"{growth:+.1%}", "from_pairs": results[0]["pairs"],
                          "to_pairs": results[-1]["pairs"]}))


if __name__ == "__main__":
    main()
