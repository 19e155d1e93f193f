"""benchmarks/compare_train.py on a prepared corpus (`--data`): every system trains on the same real batches, and
a batch too small to give each process of a per-core run a sentence is left out rather than crashing it."""

import importlib.util
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from .conftest import prepare_corpus

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compare_train.py"

spec = importlib.util.spec_from_file_location("compare_train", SCRIPT)
compare_train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_train)


def options(data: Path, **changes) -> Namespace:
    return Namespace(**{"preset": "tiny", "data": str(data), "batch": 64, "src_len": 24, "tgt_len": 24,
                        "max_tokens": 24, "steps": 3, "procs": 2, "hf_procs": 1, **changes})


def test_real_batches_are_the_corpus_first_ones_that_every_process_can_share(tmp_path):
    data = prepare_corpus(tmp_path)
    epoch, _ = compare_train.workload(options(data, procs=1, steps=40))  # one process: the epoch's first batches
    assert min(b.src.size(0) for b in epoch) == 1  # max_tokens 24 leaves some long sentence alone
    batches, model = compare_train.workload(options(data))
    assert len(batches) == compare_train.WARMUP + 3
    assert [b.src.tolist() for b in batches] == [b.src.tolist() for b in epoch if b.src.size(0) >= 2][:5]
    assert model.tgt_vocab_size > max(int(b.tgt_out.max()) for b in batches)


@pytest.mark.slow  # 25 s: four processes importing torch and transformers
def test_every_system_trains_on_the_real_batches_one_process_and_per_core(tmp_path):
    pytest.importorskip("transformers")
    data = prepare_corpus(tmp_path)
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny", "--data", str(data), "--max-tokens", "24",
                           "--steps", "2", "--procs", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    trained = [r for r in rows if "system" in r]
    assert {r["system"]: r["processes"] for r in trained} == {"mt": 1, "hf": 1, "mt-per-core": 2}
    assert all(r["batches"] == "data, 24 tokens" and r["tgt_tok_per_s"] > 0 for r in trained)
    assert sorted(rows[-1]) == ["ratio_mt_over_hf", "ratio_mt_per_core_over_hf"]
