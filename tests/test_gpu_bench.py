"""`make gpu-bench` (benchmarks/gpu_bench.py): its plan is the GPU issue's settings scaled by the budget, a run's
first epoch is weighed against its later ones, a part past its time is stopped with what it printed kept, nothing
runs without CUDA, and (slow) on a CPU, with the tiny preset, every part runs end to end into one well-formed report."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .conftest import prepare_corpus

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_bench.py"

spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
gpu_bench = sys.modules["gpu_bench"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(gpu_bench)


def test_on_a_gpu_the_plan_is_the_issues_settings_scaled_down_by_the_budget_and_quick():
    full = gpu_bench.make_plan("cuda", False, gpu_bench.BUDGET)
    assert (full.preset, full.precision, full.shape_tokens, full.shape_batches) == ("base", "bf16", 16384, 24)
    assert full.matmul_size == 8192 and full.compile_backend == "inductor"
    assert (full.decode_precisions, full.decode_beams, full.decode_batches) == (("fp32", "bf16"), (1, 4), (64, 512))
    assert (full.src_len, full.tgt_len, full.checkpoint_lines) == (24, 24, 0)  # all of test2016
    half = gpu_bench.make_plan("cuda", False, gpu_bench.BUDGET / 2)
    assert (half.shape_batches, half.train_batches, half.decode_sentences) == (12, 8, 128)
    assert gpu_bench.make_plan("cuda", True, gpu_bench.BUDGET) == half  # --quick: half the work
    floor = gpu_bench.make_plan("cuda", True, 10)  # never below a few batches and one run
    assert (floor.shape_batches, floor.train_batches, floor.rounds, floor.runs, floor.run_epochs) == (6, 4, 1, 1, 3)
    assert gpu_bench.make_plan("cpu", False, 480) == gpu_bench.make_plan("cpu", True, 10)
    assert gpu_bench.make_plan("cpu", False, 480).preset == "tiny"


def test_a_runs_first_epoch_is_weighed_against_its_later_ones():
    log = [{"epoch": 0, "tgt_tok_per_s": 100.0}, {"epoch": 0, "tgt_tok_per_s": 300.0},
           {"epoch": 1, "tgt_tok_per_s": 200.0}, {"epoch": 2, "tgt_tok_per_s": 200.0}]
    rates = gpu_bench.epoch_rates(log)
    assert rates["first_epoch_tok_per_s"] == 150  # equal tokens in 1/100 and 1/300 of a second: tokens over seconds
    assert (rates["later_epochs_tok_per_s"], rates["first_over_later"]) == (200, 0.75)
    assert rates["epochs"]["0"] == {"intervals": 2, "tgt_tok_per_s": 150} and len(rates["interval_tok_per_s"]) == 4
    one_epoch = gpu_bench.epoch_rates(log[:2])
    assert one_epoch["later_epochs_tok_per_s"] is None and one_epoch["first_over_later"] is None
    assert gpu_bench.epoch_rates([])["first_epoch_tok_per_s"] is None


def test_a_part_past_its_time_is_stopped_with_its_children_and_what_it_printed_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_bench, "GRACE", 1)
    runner = gpu_bench.Runner(gpu_bench.make_plan("cpu", True, 60), tmp_path, 60, None)
    printed = {"part": "shapes", "what": "first sight", "first_s": 1.0, "torch": "2", "headline": True}
    hangs = (f"import json, subprocess, sys, time; print(json.dumps({printed!r}), flush=True); print('not JSON'); "
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")
    started = time.monotonic()
    record = runner.run("shapes", [sys.executable, "-c", hangs], seconds=1)
    assert time.monotonic() - started < 30  # the sleeping child was stopped too: the pipe closed
    assert record["timed_out"] and record["ok"] is False
    assert runner.records == [printed]
    assert gpu_bench.summary(runner.records) == {"shapes": [{"what": "first sight", "first_s": 1.0}]}
    failed = runner.run("decode", [sys.executable, "-c", "import sys; sys.exit('no transformers here')"], seconds=30)
    assert failed["ok"] is False and failed["exit_code"] == 1 and "no transformers here" in failed["stderr_tail"]
    assert [p["name"] for p in runner.parts] == ["shapes", "decode"]


def test_where_mt_restricts_attentions_kernels_marian_trains_both_ways_and_mt_is_compared_with_each(
        tmp_path, monkeypatch, capsys):
    """The branch of the throughput part that only a GPU takes (on a CPU mt's steps leave attention to PyTorch),
    taken on a CPU by restricting the kernels here too; in this process, on a tiny corpus, without compiling."""
    pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import mt.device

    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    monkeypatch.setattr(mt.device, "attention_backends", lambda device: kernels)
    monkeypatch.setattr(mt.device, "attention_kernels", lambda device: sdpa_kernel(kernels))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # where the part finds compare_train's Marian
    plan = dataclasses.replace(gpu_bench.make_plan("cpu", True, 60), compile_passes=0)
    gpu_bench.part_throughput(gpu_bench.Part("throughput", plan, prepare_corpus(tmp_path), tmp_path, None, 600))
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    systems = {r["system"]: r for r in records if r["what"] == "throughput"}
    assert list(systems) == ["mt", "marian", "marian_mt_kernels"]
    assert systems["marian"]["attention"] == "PyTorch's choice"
    assert systems["marian_mt_kernels"]["attention"] == ["FLASH_ATTENTION", "MATH"] == systems["mt"]["attention"]
    (ratio,) = [r for r in records if r["what"] == "throughput ratio"]
    assert ratio["mt_over_best_marian"] == min(ratio["mt_over_marian"], ratio["mt_over_marian_mt_kernels"]) > 0
    assert not [r for r in records if r["what"].startswith("compiled")]  # compile_passes=0


def test_without_cuda_it_says_so_in_one_line_runs_nothing_and_exits_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_bench.Runner, "part", lambda *args: pytest.fail("ran a part without CUDA"))
    assert gpu_bench.main(["--out", str(tmp_path / "report.json")]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and json.loads(out)["gpu_bench"] == "skipped"
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow  # 80 s on a 2 GHz core, most of it six processes importing torch and transformers
def test_every_part_runs_end_to_end_on_a_cpu_into_one_report(mirror, tmp_path):
    """The tiny plan on the real Multi30k: each part in its process, mt and Marian side by side, every result a JSON
    line on stdout and a record of the report."""
    pytest.importorskip("transformers")
    out = tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), MT_MIRROR=str(mirror))
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out),
                           "--work", str(tmp_path / "work")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["gpu_bench"] == lines[-1]["gpu_bench"] == "pass" and report["records"] == lines[:-1]
    assert [p["name"] for p in report["parts"]] == ["prepare", *gpu_bench.PARTS]
    assert all(p["ok"] for p in report["parts"]), json.dumps(report["parts"], indent=1)
    assert report["environment"]["torch"] == torch.__version__ and report["plan"]["preset"] == "tiny"
    records, plan = report["records"], report["plan"]
    assert all({"item", "part", "what", "torch", "cuda", "gpu"} <= r.keys() for r in records)
    assert not [r for r in records if "skipped" in r or "error" in r]

    def found(part: str, what: str) -> list[dict]:
        return [r for r in records if r["part"] == part and r["what"] == what]

    # Item 1: the first batches twice, each system; a short `mt train`, read from its log.
    shapes = found("shapes", "first sight")
    assert [r["system"] for r in shapes] == ["mt", "marian"]
    assert all(len(r["first_step_ms"]) == len(r["again_step_ms"]) == r["batches"] == plan["shape_batches"]
               and r["first_tok_per_s"] > 0 for r in shapes)
    (run,) = found("run", "mt train")
    assert run["exit_code"] == 0 and run["first_epoch_tok_per_s"] > 0
    # Item 3: every decoding setting, each system producing exactly tgt_len tokens a sentence; the checkpoint.
    cells = len(plan["decode_precisions"]) * len(plan["decode_beams"]) * len(plan["decode_batches"])
    assert len(found("decode", "decode ratio")) == cells and len(found("decode", "decode")) == 2 * cells
    assert all(r["exact_length"] and r["tgt_tokens"] == r["sentences"] * plan["tgt_len"]
               for r in found("decode", "decode"))
    (checkpoint,) = found("checkpoint", "checkpoint ratio")
    assert checkpoint["sentences"] == plan["checkpoint_lines"] and checkpoint["mt_over_marian_sent_per_s"] > 0
    # Item 2: mt against Marian on the same batches, then compiled.
    assert {r["system"] for r in found("throughput", "throughput")} == {"mt", "marian"}
    assert found("throughput", "throughput ratio")[0]["mt_over_best_marian"] > 0
    assert [r["pass"] for r in found("throughput", "compiled pass")] == list(range(1, plan["compile_passes"] + 1))
    assert found("throughput", "compiled")[0]["over_eager"] > 0
    assert set(report["summary"]) == set(gpu_bench.PARTS)
