"""`make gpu-check` (benchmarks/gpu_check.py): its checks catch a run that does not learn, skips steps or restarts,
it reports a failed step and goes on, it runs nothing without CUDA, and (slow) its whole pipeline passes on a CPU."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gpu_check = sys.modules["gpu_check"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(gpu_check)


def log(losses: list[float], skipped: list[int] | None = None, every: int = 25) -> list[dict]:
    """Interval reports as `mt train` writes them to log.jsonl, one per `every` steps."""
    skipped = skipped or [0] * len(losses)
    return [{"step": every * (i + 1), "epoch": 1, "loss": loss, "lr": 1e-3, "tgt_tok_per_s": 1000.0 * (i + 1),
             "skipped_steps": skips} for i, (loss, skips) in enumerate(zip(losses, skipped, strict=True))]


def test_a_run_whose_loss_falls_without_skipped_steps_passes():
    result = gpu_check.check_training(log([9.0, 7.0, 5.0, 4.0]), "bf16", steps=100)
    assert result["problems"] == []
    assert (result["first_loss"], result["last_loss"], result["steps"]) == (9.0, 4.0, 100)
    assert result["tgt_tok_per_s"] == 2500  # the median interval


def test_a_run_whose_loss_does_not_fall_fails():
    problems = gpu_check.check_training(log([9.0, 8.8, 8.6, 8.5]), "bf16", steps=100)["problems"]
    assert len(problems) == 1 and "loss did not fall" in problems[0]
    # A short run that is not meant to learn (torchrun's) is judged on its steps only.
    assert gpu_check.check_training(log([9.0, 9.0]), "bf16", steps=50, learns=False)["problems"] == []


def test_a_run_that_stopped_short_fails():
    problems = gpu_check.check_training(log([9.0, 7.0, 5.0]), "fp32", steps=100)["problems"]
    assert problems == ["stopped at step 75, not 100"]


def test_bf16_may_skip_no_step_and_fp16_only_while_the_scaler_calibrates():
    early = log([9.0, 7.0, 5.0, 4.0], skipped=[4, 0, 0, 0])
    assert "skipped" in " ".join(gpu_check.check_training(early, "bf16", steps=100)["problems"])
    assert gpu_check.check_training(early, "fp16", steps=100)["problems"] == []
    late = log([9.0, 7.0, 5.0, 4.0], skipped=[4, 0, 1, 0])
    assert "after step" in " ".join(gpu_check.check_training(late, "fp16", steps=100)["problems"])
    too_many = log([9.0, 7.0, 5.0, 4.0], skipped=[gpu_check.MAX_CALIBRATION_SKIPS + 1, 0, 0, 0])
    assert gpu_check.check_training(too_many, "fp16", steps=100)["problems"]


def test_an_empty_log_or_one_without_the_expected_fields_fails():
    assert gpu_check.check_training([], "bf16", steps=100)["problems"]
    renamed = [{k.replace("skipped_steps", "skipped"): v for k, v in e.items()} for e in log([9.0, 4.0])]
    assert "lacks ['skipped_steps']" in gpu_check.check_training(renamed, "bf16", steps=50)["problems"][0]


def test_a_resumed_run_must_continue_from_its_step_not_start_over():
    before = log([9.0, 7.0, 5.0, 4.0])  # steps 25 .. 100
    continued = before + [{**e, "step": e["step"] + 100} for e in log([3.9, 3.8])]  # 125, 150
    assert gpu_check.check_resume(continued, len(before), start=100, steps=150)["problems"] == []
    restarted = before + log([9.0, 7.0])  # 25, 50 again
    assert "do not continue" in gpu_check.check_resume(restarted, len(before), start=100, steps=150)["problems"][0]
    stopped = before + [{**log([3.9])[0], "step": 125}]
    assert "stopped at step 125" in gpu_check.check_resume(stopped, len(before), start=100, steps=150)["problems"][0]
    assert gpu_check.check_resume(before, len(before), start=100, steps=150)["problems"]


def test_translation_must_give_one_line_per_input_line(tmp_path):
    src, hyp = tmp_path / "src.txt", tmp_path / "hyp.txt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    hyp.write_text("A\nB\nC\n", encoding="utf-8")
    assert gpu_check.check_lines(hyp, src) == {"lines": 3, "problems": []}
    hyp.write_text("A\nB\n", encoding="utf-8")
    assert gpu_check.check_lines(hyp, src)["problems"] == ["2 output lines for 3 input lines"]


def test_a_benchmark_that_measured_the_cpu_fails_a_gpu_check():
    assert gpu_check.check_bench({"tgt_tok_per_s": 1.0, "device": "cuda:0"}, "cuda")["problems"] == []
    assert "measured the cpu" in gpu_check.check_bench({"tgt_tok_per_s": 1.0}, "cuda")["problems"][0]
    assert gpu_check.check_bench({"tgt_tok_per_s": 1.0}, "cuda", asked="cuda")["problems"] == []
    assert gpu_check.check_bench({"tgt_tok_per_s": 1.0}, "cpu")["problems"] == []
    assert gpu_check.check_bench(None, "cpu")["problems"] == ["printed no JSON"]


def test_a_failed_step_is_reported_with_its_stderr_and_the_steps_needing_it_are_skipped(tmp_path):
    plan = gpu_check.make_plan("cpu", None, False, False)
    check = gpu_check.Check(plan, tmp_path, None)
    failed, _ = check.run("broken", [sys.executable, "-c", "import sys; sys.exit('no such corpus')"])
    assert failed["ok"] is False and failed["exit_code"] == 1 and "no such corpus" in failed["stderr_tail"]
    skipped, _ = check.run("after", [sys.executable, "-c", "pass"], needs=("broken",))
    assert skipped["ok"] is None and skipped["skipped"] == "needs broken"
    ran, out = check.run("independent", [sys.executable, "-c", "print('{\"x\": 1}')"])
    assert ran["ok"] is True and gpu_check.parse_json(out) == {"x": 1}


def test_a_step_past_the_budget_is_stopped_and_those_after_it_are_skipped(tmp_path):
    check = gpu_check.Check(gpu_check.make_plan("cpu", None, False, False), tmp_path, None, budget=2)
    # The step's child sleeps on: stopped with it, the pipe closes and the check goes on.
    hangs = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
            "time.sleep(60)"
    started = time.monotonic()
    step, _ = check.run("hangs", [sys.executable, "-c", hangs])
    assert time.monotonic() - started < 30
    assert step["ok"] is False and step["exit_code"] is None and "timed out" in step["stderr_tail"]
    late, _ = check.run("late", [sys.executable, "-c", "raise SystemExit(3)"])
    assert late["ok"] is None and "out of time" in late["skipped"]


def test_the_report_is_printed_and_the_exit_code_is_1_when_a_step_fails(tmp_path, monkeypatch, capsys):
    def pipeline(check):
        check.run("prepare", [sys.executable, "-c", "import sys; sys.exit('mirror not found')"])
        check.run("train bf16", [sys.executable, "-c", "pass"], needs=("prepare",))

    monkeypatch.setattr(gpu_check.Check, "pipeline", pipeline)
    assert gpu_check.main(["--device", "cpu", "--work", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_check"] == "fail" and report["failed"] == ["prepare"]
    assert "mirror not found" in report["steps"][0]["stderr_tail"]
    assert report["steps"][1]["skipped"] == "needs prepare"
    assert report["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_without_cuda_it_says_so_in_one_line_runs_nothing_and_exits_0(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_check.Check, "pipeline", lambda check: pytest.fail("ran a step without CUDA"))
    assert gpu_check.main(["--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    report = json.loads(out)
    assert report["gpu_check"] == "skipped" and "no CUDA" in report["reason"]
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_the_whole_pipeline_passes_on_a_cpu(mirror, tmp_path):
    """The real CLI end to end at tiny sizes: prepare Multi30k, train in fp32 and bf16, resume, torchrun, translate
    test2016, evaluate, bench; every step passes its checks."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MT_MIRROR=str(mirror))
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--work", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps([s for s in report["steps"] if not s.get("ok")], indent=2)
    steps = {s["name"]: s for s in report["steps"]}
    assert list(steps) == ["prepare", "train fp32", "train bf16", "resume", "torchrun", "translate", "evaluate",
                           "bench train small", "bench translate small"]
    assert all(s["ok"] and s["seconds"] > 0 for s in steps.values())
    assert steps["train fp32"]["last_loss"] <= gpu_check.LOSS_FALL * steps["train fp32"]["first_loss"]
    assert steps["resume"]["logged_steps"][-1] == report["plan"]["resumed_to"]
    assert steps["translate"]["lines"] == 1000  # test2016
    assert steps["bench translate small"]["result"]["tgt_tok_per_s"] > 0
