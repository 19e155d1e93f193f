"""`mt translate --format text` against line by line, on Multi30k test2016: what the document mode costs.

The source sentences are joined, `--per` at a time with one space, into paragraphs (blank lines between them), and
translated as a text document; the same sentences are translated line by line, and each paragraph's translations
joined with a space. Both are scored at paragraph level against the references joined alike (sacreBLEU), and both
are timed, `--runs` times each, alternating in one process; medians of the wall time and of the process's CPU time
(steadier on a shared machine). Also timed alone: the document mode's own work, reading the document, cutting it
into sentences, counting their pieces and putting the translations back (without the model).

    python benchmarks/documents_multi30k.py CHECKPOINT [--mirror ../shared/data] [--per 5] [--runs 3] [--threads N]

Needs the documents extra (`pip install -e '.[documents]'`). One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import time
from pathlib import Path

import sacrebleu
import torch

from mt.decode.search import SearchOptions
from mt.decode.translate import load_any, plan_documents, translate_documents, translate_stream
from mt.device import pick_device
from mt.documents.formats import read_document
from mt.documents.sentences import finish


def read(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def cpu() -> str:
    lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "unknown")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--src", default="de")
    parser.add_argument("--tgt", default="en")
    parser.add_argument("--per", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src = read(args.mirror / "multi30k" / f"test_2016_flickr.{args.src}.gz")
    ref = read(args.mirror / "multi30k" / f"test_2016_flickr.{args.tgt}.gz")
    n = len(src) // args.per * args.per
    groups = range(0, n, args.per)
    paragraphs = [" ".join(s.strip() for s in src[i:i + args.per]) for i in groups]
    refs = [" ".join(r.strip() for r in ref[i:i + args.per]) for i in groups]
    lines = "\n\n".join(paragraphs).split("\n")

    device = pick_device("cpu")
    loaded = load_any(args.checkpoint, device)
    opts = SearchOptions.from_config(loaded.config.decode)
    sentences = plan_documents(loaded, [read_document("text", lines, "test2016")]).sentences[0]
    found = [len(unit) for unit in sentences]

    def by_line() -> list[str]:
        out = list(translate_stream(loaded, src[:n], opts, device))
        return [" ".join(out[i:i + args.per]) for i in groups]

    def as_document() -> list[str]:
        [text] = translate_documents(loaded, [read_document("text", lines, "test2016")], opts, device)
        return text.split("\n\n")

    def own_work() -> None:  # the document mode without the model: its translations are its sources
        todo = plan_documents(loaded, [read_document("text", lines, "test2016")])
        finish(todo, todo.parts)

    times: dict[str, list[float]] = {"lines": [], "document": [], "document_own_work": []}
    cpu_times: dict[str, list[float]] = {name: [] for name in times}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.runs):
        for name, run in (("lines", by_line), ("document", as_document), ("document_own_work", own_work)):
            started, started_cpu = time.perf_counter(), time.process_time()
            outputs[name] = run()
            times[name].append(time.perf_counter() - started)
            cpu_times[name].append(time.process_time() - started_cpu)
    del outputs["document_own_work"]
    bleu = {name: round(sacrebleu.corpus_bleu(out, [refs]).score, 2) for name, out in outputs.items()}
    medians = {name: round(statistics.median(t), 3) for name, t in times.items()}
    cpu_medians = {name: round(statistics.median(t), 3) for name, t in cpu_times.items()}
    print(json.dumps({
        "checkpoint": str(args.checkpoint), "paragraphs": len(paragraphs), "per": args.per,
        "paragraphs_split_into_their_sentences": sum(k == args.per for k in found),
        "sentences_found": sum(found), "sentences": n, "bleu": bleu, "seconds_median": medians,
        "cpu_seconds_median": cpu_medians, "seconds": {name: [round(x, 3) for x in t] for name, t in times.items()},
        "cpu_seconds": {name: [round(x, 3) for x in t] for name, t in cpu_times.items()},
        "document_over_lines": round(medians["document"] / medians["lines"], 3),
        "beam": opts.beam, "cpu": cpu(), "threads": torch.get_num_threads()}, indent=1))


if __name__ == "__main__":
    main()
