"""Source trees' `mt serve` side by side, alternating: is a change to the server faster under load?

Each variant is a source tree, optionally with `mt serve` options after it ("TREE --threads 1"). Each round
translates the sentences offline once (in this process, the model loaded), then starts each variant's server in
turn (the order flips every round) and sends one-line requests at each concurrency, as
`serve_load.py` does. The report: each round as a JSON line, then per tree and concurrency the medians over the
rounds (sentences/s, p50, share of offline, lines per model call) and the fewest correct answers of any round.

    python benchmarks/serve_ab.py CHECKPOINT OLD_TREE NEW_TREE ["NEW_TREE --threads 1" ...] [--rounds 4]
                                  [--sentences 1000] [--concurrency 64,1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serve_load  # noqa: E402  (beside this file)

from mt.checkpoint import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("variants", nargs="+", help='source trees (git worktrees) of mt, each optionally with '
                                                    'mt serve options: "TREE --threads 1"')
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--concurrency", default="64,1")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    loaded = load_model(args.checkpoint)
    with gzip.open(args.mirror / "multi30k" / f"test_2016_flickr.{loaded.state['langs']['src']}.gz", "rt",
                   encoding="utf-8") as f:
        sentences = f.read().splitlines()[:args.sentences]
    trees, levels = args.variants, [int(c) for c in args.concurrency.split(",")]
    rounds = []
    for r in range(args.rounds):
        offline = serve_load.offline(loaded, sentences)
        row = {"round": r + 1, "offline": offline, "servers": {}}
        expected = offline.pop("texts")
        for tree in trees if r % 2 == 0 else trees[::-1]:
            path, *options = shlex.split(tree)
            # The server imports mt from its tree: started there, since Python puts its working directory first.
            path = str(Path(path).resolve())
            os.environ["PYTHONPATH"] = path
            for c in levels:
                row["servers"][f"{tree} {c}"] = serve_load.under_load(
                    ["-m", "mt", "serve", str(args.checkpoint.resolve()), *options], sentences, expected, c, path)
        rounds.append(row)
        print(json.dumps(row), flush=True)
    for tree in trees:
        for c in levels:
            cells = [(row["servers"][f"{tree} {c}"], row["offline"]["sentences_per_s"]) for row in rounds]
            print(json.dumps({"tree": tree, "concurrency": c,
                              "sentences_per_s": statistics.median(m["sentences_per_s"] for m, _ in cells),
                              "p50_ms": statistics.median(m["p50_ms"] for m, _ in cells),
                              "of_offline": round(statistics.median(m["sentences_per_s"] / o for m, o in cells), 3),
                              "lines_per_model_call": statistics.median(m["lines_per_model_call"] or 0
                                                                        for m, _ in cells),
                              "fewest_correct": min(m["correct"] for m, _ in cells)}))


if __name__ == "__main__":
    main()
