"""Screen training levers at equal steps: each variant's ensemble members trained side by side, then, as `make
recipe` does, each member averaged (`mt average --last 1,2,4,8`), the members ensembled and the ensemble tuned on
valid (`mt tune`). A GPU runs many members at once (--parallel 8 kept an H200 busy); a CPU has the cores for one.

    python benchmarks/lever_screen.py configs/multi30k_en_de.yaml --steps 4400 --parallel 8 --out runs/screen \\
        --variant recipe= --variant lr5=train.lr=5e-3 --variant ls1=train.label_smoothing=0.1,model.dropout=0.1

A variant is NAME=SETTINGS (`mt train --set` settings, comma-separated; none: the config as it is). Member i of
each variant trains with seed train.seed + 1000 (i - 1), the recipe's member seeds, for --steps steps with the
cooldown over its last part (train.max_minutes=0). Prints one line per variant (members' greedy valid BLEU of
their chosen averages, the tuned ensemble's valid BLEU and decoding) and writes them to OUT/screen.json.
Valid only: the test split is not read.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mt.config import load_config
from mt.members import SEED_STRIDE

BEST_COUNT = re.compile(r"last\s+(\d+)\s+valid BLEU\s+([\d.]+)")  # mt average's lines, best first
BEST_SETTING = re.compile(r"beam\s+(\d+)\s+len_penalty\s+([\d.]+)\s+BLEU\s+([\d.]+)")  # mt tune's, best first


def mt(*args: str, log: Path) -> str:
    """Run one mt command; its output goes to `log` and is returned. A failure stops the screen, naming the log."""
    result = subprocess.run([sys.executable, "-m", "mt", *args], capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    log.write_text(result.stdout + result.stderr, encoding="utf-8")
    if result.returncode != 0:
        sys.exit(f"mt {args[0]} failed (exit {result.returncode}): see {log}")
    return result.stdout


def train_member(config: str, run: Path, seed: int, settings: list[str], steps: int, average: str) -> dict:
    """Train one member for `steps` steps and average its last checkpoints (`average`: the counts to choose from);
    its chosen average's greedy BLEU."""
    sets = ["train.members=1", "train.max_minutes=0", f"train.max_steps={steps}", f"train.seed={seed}",
            "train.threads=1", *settings]
    mt("train", config, "--out", str(run), "-q", *(arg for s in sets for arg in ("--set", s)),
       log=Path(f"{run}.train.log"))
    averaged = mt("average", str(run), "--last", average, "--out", str(run / "final.pt"),
                  log=Path(f"{run}.average.log"))
    found = BEST_COUNT.search(averaged)  # none when --average names one count: mt average then scores nothing
    count, bleu = found.groups() if found else (average, None)
    return {"run": str(run), "seed": seed, "last": int(count), "greedy_valid_bleu": bleu and float(bleu)}


def tune_variant(name: str, members: list[dict], out: Path) -> dict:
    """Ensemble the variant's averaged members (one member: itself) and tune beam and length penalty on valid."""
    finals = [str(Path(m["run"]) / "final.pt") for m in members]
    checkpoint = Path(finals[0]) if len(finals) == 1 else out / f"{name}.pt"
    if len(finals) > 1:
        mt("ensemble", *finals, "--out", str(checkpoint), log=out / f"{name}.ensemble.log")
    beam, penalty, bleu = BEST_SETTING.search(mt("tune", "-c", str(checkpoint), "-o", str(checkpoint), "-q",
                                                 log=out / f"{name}.tune.log")).groups()
    return {"variant": name, "members": members, "tuned_valid_bleu": float(bleu), "beam": int(beam),
            "len_penalty": float(penalty)}


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, settings = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: write NAME=SETTINGS, e.g. lr5=train.lr=5e-3 (or "
                                         "recipe= for the config as it is)")
    return name, [s for s in settings.split(",") if s]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    parser.add_argument("--steps", type=int, required=True, help="training steps of each member")
    parser.add_argument("--members", type=int, default=2, help="members of each variant's ensemble")
    parser.add_argument("--parallel", type=int, default=1, help="members trained at once")
    parser.add_argument("--average", default="1,2,4,8", help="checkpoint counts to average, as make recipe's AVERAGE")
    parser.add_argument("--out", type=Path, default=Path("runs/screen"))
    args = parser.parse_args()
    if len({name for name, _ in args.variant}) < len(args.variant):
        parser.error("two --variant share a name")
    seed = load_config(args.config).train.seed
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, args.out / f"{name}-{i}", seed + SEED_STRIDE * (i - 1), settings)
            for name, settings in args.variant for i in range(1, args.members + 1)]
    with ThreadPoolExecutor(args.parallel) as pool:
        trained = list(pool.map(lambda job: train_member(args.config, *job[1:], args.steps, args.average), jobs))
        by_variant = {name: [m for job, m in zip(jobs, trained, strict=True) if job[0] == name]
                      for name, _ in args.variant}
        results = list(pool.map(lambda item: tune_variant(*item, args.out), by_variant.items()))
    for r in results:
        greedy = ", ".join("–" if m["greedy_valid_bleu"] is None else f"{m['greedy_valid_bleu']:.2f}"
                           for m in r["members"])
        print(f"{r['variant']:>12}  members' greedy valid {greedy}  tuned ensemble valid {r['tuned_valid_bleu']:.2f}"
              f"  (beam {r['beam']}, lp {r['len_penalty']})")
    (args.out / "screen.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
