"""benchmarks/export_multi30k.py run tiny on the real Multi30k: every engine is scored and timed, each timing in a
process of its own. Slow (a minute or two: four exports, six engines, a process per timing): `pytest -m slow`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mt.config import Config, ModelConfig
from mt.data.prepare import prepare
from mt.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "export_multi30k.py"
ENGINES = {"mt fp32", "mt int8", "ctranslate2 float32", "ctranslate2 int8", "ctranslate2 int8_float32",
           "huggingface fp32"}


@pytest.mark.slow
def test_every_engine_is_scored_and_timed_each_time_in_a_fresh_process(mirror, tmp_path):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    data = tmp_path / "data"  # Multi30k de-en, its sentences within a tiny model's positions
    prepare(data, "de", "en", corpus="multi30k", mirror=mirror, vocab_size=1000, spm_sentences=3000, progress=False)
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64))
    cfg.train.max_steps, cfg.train.valid_bleu, cfg.train.threads = 10, False, 1
    train(cfg, tmp_path / "run", progress=False)
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "run" / "best.pt"), "--mirror", str(mirror),
                           "--limit", "4", "--beams", "1,2", "--len-penalties", "1.0", "--rounds", "2"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert set(report["quality"]) == set(report["seconds"]) == ENGINES
    assert all(seconds > 0 for seconds in report["seconds"].values())
    assert all(r["beam"] in (1, 2) and r["len_penalty"] == 1.0 for r in report["quality"].values())
    assert "median of 2, each in a fresh process" in done.stderr
