import json
import os
import subprocess
import sys

import pytest
import torch

import mt.bench
from mt.bench import (
    bench_translate,
    markdown_table,
    matmul_peak,
    preset_model,
    train_markdown_table,
    write_readme_table,
)
from mt.data.batches import pad
from mt.data.tokenizer import EOS
from mt.decode.search import beam_search, greedy
from mt.options import TranslateBench


def test_fixed_output_length_makes_random_weights_do_full_work():
    model = preset_model("small")
    src = pad([[5, 6, 7, 8], [9, 10]], [], [EOS])
    for h in greedy(model, src, 0.0, 7, min_len=6):
        assert len(h.tokens) == 6
    for hs in beam_search(model, src, 3, 0.6, 0.0, 7, min_len=6):
        assert len(hs[0].tokens) == 6


def test_bench_reports_throughput_and_settings():
    result = bench_translate(TranslateBench(preset="small", beam=2, batch=4, sentences=4, src_len=6, tgt_len=5, runs=1))
    assert result["tgt_tokens"] == 4 * 5  # every sentence decoded to exactly tgt_len tokens
    assert (result["sentences"], result["beam"], result["batch"]) == (4, 2, 4)
    assert "| small | 2 | 4 | fp32 |" in markdown_table([result])


def test_readme_table_is_replaced_in_place(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nintro\n")
    write_readme_table(readme, "translate", "| a |", "cmd one")
    write_readme_table(readme, "translate", "| b |", "cmd two")
    text = readme.read_text()
    assert text.count("<!-- bench:translate -->") == 1 and "| b |" in text and "| a |" not in text
    assert text.startswith("# x\n\nintro\n")
    missing = tmp_path / "docs" / "benchmarks.md"  # any markdown file, made if missing
    missing.parent.mkdir()
    write_readme_table(missing, "train", "| c |", "cmd three")
    assert missing.read_text() == "<!-- bench:train -->\n`cmd three`\n\n| c |\n<!-- /bench:train -->\n"


def test_cli_json_output():
    out = subprocess.run([sys.executable, "-m", "mt", "bench", "translate", "--preset", "small", "--beam", "1",
                          "--batch", "2", "--src-len", "5", "--tgt-len", "4", "--runs", "1", "--json"],
                         capture_output=True, text=True, check=True,  # PyTorch's step: the C step's crossovers,
                         env=os.environ | {"MT_NATIVE": "0"}).stdout  # timed as a user's process times, cost 10 s
    result = json.loads(out)
    assert {"tgt_tok_per_s", "sent_per_s", "median_s", "peak_rss_mb", "preset", "beam", "batch"} <= result.keys()


@pytest.fixture
def small_peak(monkeypatch):
    """The MFU's denominator from 512² products, not 2,048²: a number to divide by, not this machine's peak (4 s
    of a slow CPU's time a bench)."""
    monkeypatch.setattr(mt.bench, "matmul_peak", lambda precision, device: matmul_peak(precision, device, size=512))


def test_train_bench_counts_flops_and_padding(small_peak):
    from mt.bench import bench_train, train_flops
    from mt.config import ModelConfig
    from mt.options import TrainBench

    result = bench_train(TrainBench(preset="small", batch=4, src_len=6, tgt_len=5, steps=2, warmup=1))
    assert result["tgt_tok_per_s"] > 0 and 0 < result["mfu"] < 1.5
    assert result["padding_fraction"] == 0.0  # fixed-shape batches have no padding
    cfg = ModelConfig(d_model=8, d_ff=16, n_enc_layers=1, n_dec_layers=1, n_heads=2, src_vocab_size=10,
                      tgt_vocab_size=10)
    # One source and one target token, length 1: encoder 4·64+2·128+2·8, decoder 6·64+2·128+2·8+2·8 + 2·64,
    # output 8·10 multiply-adds; × 2 FLOPs each × 3 for forward + backward.
    assert train_flops(cfg, 1, 1, 1, 1) == 6 * ((256 + 256 + 16) + (384 + 256 + 16 + 16 + 128) + 80)


def test_train_bench_on_real_batches_reports_padding(tmp_path, small_peak):
    import numpy as np

    from mt.bench import bench_train
    from mt.options import TrainBench

    rng = np.random.default_rng(0)
    for side in ("src", "tgt"):
        lengths = rng.integers(3, 20, size=200)
        np.save(tmp_path / f"train.{side}.ids.npy", rng.integers(4, 100, size=lengths.sum()).astype(np.uint16))
        np.save(tmp_path / f"train.{side}.offsets.npy", np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
    result = bench_train(TrainBench(preset="small", data=str(tmp_path), max_tokens=256, steps=2, warmup=1))
    assert 0 < result["padding_fraction"] < 0.5
    assert 0 <= result["data_loading_fraction"] < 1
    assert f"| small | {tmp_path.name}, 256 tokens | fp32 |" in train_markdown_table([result])


def test_grid_settings_reach_the_isolated_process(monkeypatch):
    from mt.bench import run_isolated
    from mt.options import TrainBench

    monkeypatch.setenv("MT_CPU_MATMUL", "mkl")  # one kernel: no products timed in the process, as a user's would time

    result = run_isolated("train", TrainBench(preset="small", batch=2, src_len=4, tgt_len=3, steps=1))
    assert (result["batch"], result["src_len"], result["tgt_len"], result["steps"]) == (2, 4, 3, 1)
    assert {"tgt_tok_per_s", "flops_per_tgt_token", "mfu", "padding_fraction", "peak_rss_mb"} <= result.keys()
    assert "| small | 2 × (4 + 3) | fp32 |" in train_markdown_table([result])


def test_grid_writes_its_table_and_the_command_that_made_it_into_the_given_file(tmp_path, monkeypatch):
    import mt.bench

    def fake_run(kind, setting):
        return {"preset": setting.preset, "beam": setting.beam, "batch": setting.batch,
                "precision": setting.precision, "tgt_tok_per_s": 1000.0, "sent_per_s": 40.0, "median_s": 0.5,
                "peak_rss_mb": 300.0}

    monkeypatch.setattr(mt.bench, "run_isolated", fake_run)
    shown = []
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text("# Benchmarks\n\n<!-- bench:translate -->\nold\n<!-- /bench:translate -->\n\nafter\n")
    mt.bench.run_grid("translate", 2, None, doc, False, lambda line, err: shown.append((line, err)))
    text = doc.read_text()
    assert f"`mt bench translate --grid --readme {doc}`" in text and "old" not in text
    assert text.startswith("# Benchmarks") and text.endswith("after\n")
    rows = [line for line in text.splitlines() if line.startswith("| small") or line.startswith("| base")]
    assert len(rows) == len(mt.bench.grid()) and all(err for _, err in shown[:-1]) and not shown[-1][1]


def test_a_bad_setting_is_a_user_error_not_a_traceback():
    from mt.bench import bench_train
    from mt.errors import MtError
    from mt.options import TrainBench

    with pytest.raises(MtError, match="preset must be one of"):
        bench_translate(TranslateBench(preset="huge"))
    with pytest.raises(MtError, match="preset must be one of"):
        bench_train(TrainBench(preset="huge"))
    with pytest.raises(MtError, match="fp32 or bf16"):
        bench_train(TrainBench(precision="fp16"))
    with pytest.raises(MtError, match="--checkpoint needs --input"):
        bench_translate(TranslateBench(checkpoint="x.pt"))


@pytest.mark.numerics  # which kernels exist hangs on the CPU: make test runs this again as an AVX2-only CPU would
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_mfu_peak_is_measured_in_every_precision_on_any_cpu(precision):
    """`mt bench train` and `make gpu-bench --device cpu` divide by it: it must not need a kernel this CPU lacks
    (oneDNN's linear has no bf16 under AVX2)."""
    assert matmul_peak(precision, torch.device("cpu"), size=128, runs=1) > 0
