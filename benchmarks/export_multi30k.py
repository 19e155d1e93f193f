"""`mt export` on a Multi30k model: do the exports translate as mt does, how well, and how fast?

1. Greedy test2016 translations of mt, the float32 CTranslate2 export and the Hugging Face export, with one fixed
   output limit for all: the lines whose tokens differ from mt's are listed.
2. Each engine's beam size and length penalty chosen on valid (its own penalty: GNMT for mt, length^alpha for the
   others), then test2016 BLEU with that choice; mt int8 and CTranslate2 int8 / int8_float32 beside them.
3. The time to translate the 1,000 test sentences with that choice: each engine in a fresh process, one untimed
   run, then one timed; the engines in turn, `--rounds` times; medians. (In one process, an engine run after
   CTranslate2 ran slower: docs/benchmarks.md, machine C.)

    python benchmarks/export_multi30k.py CHECKPOINT [--mirror ../shared/data] [--limit N] > export.json

Needs the export extra (`pip install -e '.[export]'`). One JSON object on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch

from mt.data.tokenizer import EOS
from mt.decode.ctranslate2 import load as load_exported
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines
from mt.export.convert import export

FIXED_LIMIT = 128  # the one output limit of the token-for-token comparison
ENGINES = ("mt fp32", "mt int8", "ctranslate2 float32", "ctranslate2 int8", "ctranslate2 int8_float32",
           "huggingface fp32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--limit", type=int, default=0, help="only the first N sentences of each set (a dry run)")
    parser.add_argument("--beams", default="4,5")
    parser.add_argument("--len-penalties", default="0.6,1.0,1.4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time", nargs=4, metavar=("ENGINE", "EXPORTS", "BEAM", "LEN_PENALTY"),
                        help=argparse.SUPPRESS)  # in a timing process of its own: one engine, its seconds printed
    args = parser.parse_args()
    langs = load_model(args.checkpoint).state["langs"]
    sets = {name: [read(args.mirror / "multi30k" / f"{name}.{lang}.gz", args.limit) for lang in langs.values()]
            for name in ("val", "test_2016_flickr")}
    if args.time:
        name, exports, beam, len_penalty = args.time
        print(json.dumps({"seconds": timed_once(load_engine(name, args.checkpoint, Path(exports)),
                                                sets["test_2016_flickr"][0], int(beam), float(len_penalty))}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        export_all(args.checkpoint, Path(tmp))
        engines = {name: load_engine(name, args.checkpoint, Path(tmp)) for name in ENGINES}
        report = {"checkpoint": str(args.checkpoint), "threads": torch.get_num_threads(),
                  "identical_greedy": identical_greedy(engines, sets["test_2016_flickr"][0])}
        grid = [(b, lp) for b in map(int, args.beams.split(",")) for lp in map(float, args.len_penalties.split(","))]
        report["quality"] = quality(engines, sets, grid)
        del engines  # their memory, while the timing processes run
        report["seconds"] = timings(args, Path(tmp), report["quality"])
    json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
    print()


def read(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit] if limit else lines


def export_all(checkpoint: Path, exports: Path) -> None:
    """The CTranslate2 exports, one per quantization, and the Hugging Face one, into `exports`."""
    for quantization in ("float32", "int8", "int8_float32"):
        export(checkpoint, "ctranslate2", exports / f"ctranslate2-{quantization}", quantization)
    export(checkpoint, "huggingface", exports / "huggingface")


def load_engine(name: str, checkpoint: Path, exports: Path):
    """Engine `name` (one of ENGINES) as a function (lines, beam, len_penalty, max_len_a, max_len_b) → [token ids
    per line]; the exported ones from `export_all`'s folder."""
    family, kind = name.split()
    if family == "mt":
        return mt_engine(load_model(checkpoint, precision=kind))
    if family == "ctranslate2":
        return mt_engine(load_exported(exports / f"ctranslate2-{kind}"))
    return huggingface_engine(exports / "huggingface")


def mt_engine(loaded):
    def run(lines, beam, len_penalty, max_len_a=1.5, max_len_b=10):
        opts = SearchOptions(beam, len_penalty, max_len_a, max_len_b, batch_tokens=4096)
        return [hyps[0].tokens if hyps else [] for hyps in translate_lines(loaded, lines, opts, torch.device("cpu"))]
    run.decode = loaded.tgt_tok.decode
    return run


def huggingface_engine(directory: Path, batch: int = 64):
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer, model = MarianTokenizer.from_pretrained(directory), MarianMTModel.from_pretrained(directory).eval()

    def run(lines, beam, len_penalty, max_len_a=1.5, max_len_b=10):
        order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
        out: list[list[int]] = [[] for _ in lines]
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            inputs = tokenizer([lines[i] for i in idx], return_tensors="pt", padding=True)
            longest = int(inputs["attention_mask"].sum(1).max())
            with torch.inference_mode():
                generated = model.generate(**inputs, num_beams=beam, length_penalty=len_penalty,
                                           max_length=int(max_len_a * longest + max_len_b) + 1)
            for i, row in zip(idx, generated.tolist(), strict=True):
                row = row[1:]
                out[i] = row[:row.index(EOS)] if EOS in row else row
        return out
    run.decode = lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True)
    return run


def identical_greedy(engines: dict, sources: list[str]) -> dict:
    """Greedy, one fixed limit for all: the share of lines whose tokens equal mt's, and the lines that differ."""
    mine = engines["mt fp32"](sources, 1, 0.0, 0.0, FIXED_LIMIT)
    result = {}
    for name in ("ctranslate2 float32", "huggingface fp32"):
        theirs = engines[name](sources, 1, 0.0, 0.0, FIXED_LIMIT)
        differ = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        result[name] = {"identical": 1 - len(differ) / len(sources), "differ": [
            {"line": i + 1, "mt": engines["mt fp32"].decode([mine[i]])[0], name: engines[name].decode([theirs[i]])[0]}
            for i in differ]}
        log(f"{name}: {len(sources) - len(differ)}/{len(sources)} greedy lines identical to mt's")
    return result


def quality(engines: dict, sets: dict, grid: list[tuple[int, float]]) -> dict:
    """Per engine: the setting with the best valid BLEU (chosen for the fp32 engines; the int8 ones take their
    fp32 sibling's), and test BLEU with it."""
    chosen, result = {}, {}
    for name, run in engines.items():
        family = name.split()[0]
        if family not in chosen:
            scores = {(b, lp): bleu(run, sets["val"], b, lp) for b, lp in grid}
            chosen[family] = max(scores, key=scores.get)
            log(f"{family}: valid BLEU by (beam, len_penalty) {scores}")
        beam, len_penalty = chosen[family]
        result[name] = {"beam": beam, "len_penalty": len_penalty, "test_bleu": bleu(run, sets["test_2016_flickr"],
                                                                                     beam, len_penalty)}
        log(f"{name}: {result[name]}")
    return result


def bleu(run, pair: list[list[str]], beam: int, len_penalty: float) -> float:
    sources, refs = pair
    return round(sacrebleu.corpus_bleu(run.decode(run(sources, beam, len_penalty)), [refs]).score, 2)


def timings(args: argparse.Namespace, exports: Path, settings: dict) -> dict:
    """Seconds to translate test2016 with each engine's chosen setting, each time in a fresh process (`timed_once`),
    the engines in turn; the median of `args.rounds`."""
    times: dict[str, list[float]] = {name: [] for name in ENGINES}
    for _ in range(args.rounds):
        for name in ENGINES:
            command = [sys.executable, __file__, str(args.checkpoint), "--mirror", str(args.mirror), "--limit",
                       str(args.limit), "--time", name, str(exports), str(settings[name]["beam"]),
                       str(settings[name]["len_penalty"])]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"timing {name} failed:\n{done.stderr[-2000:]}")
            times[name].append(json.loads(done.stdout)["seconds"])
    medians = {name: round(statistics.median(t), 2) for name, t in times.items()}
    log(f"seconds (median of {args.rounds}, each in a fresh process): {medians}")
    return medians


def timed_once(run, sources: list[str], beam: int, len_penalty: float) -> float:
    """The seconds of one run over `sources`, after an untimed one (which loads what loads lazily)."""
    run(sources, beam, len_penalty)
    started = time.perf_counter()
    run(sources, beam, len_penalty)
    return time.perf_counter() - started


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
