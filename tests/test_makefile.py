"""The Makefile's recipes: how `make recipe` launches training (one process, or on a CPU one single-thread process per
core), `make gpu-check` runs with the Python it finds, `make bench` writes docs/benchmarks.md."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mt.device import cpuinfo

ROOT = Path(__file__).resolve().parents[1]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def train_command(*variables: str) -> str:
    """The command `make recipe` would train a new run with (`make -n` prints it without running anything)."""
    # --no-print-directory: under `make test`, a nested make would announce the directory it enters.
    out = subprocess.run(["make", "--no-print-directory", "-n", "recipe", "NAME=multi30k_en_de", "SEED=7", "GPU=",
                          *variables],  # a CPU machine's unless the variables say otherwise
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if line.startswith("else "))


@needs_make
def test_on_a_cpu_each_process_takes_its_share_of_the_configs_batch():
    command = train_command("PROCS=2")
    assert "OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 -m mt train" in command
    assert "configs/multi30k_en_de.yaml --out runs/multi30k_en_de_s7 --set train.seed=7" in command
    assert "--set train.threads=1" in command
    # The share, computed as the shell will compute it (with this interpreter): half the config's 4,096 tokens.
    share = re.search(r"--set train\.max_tokens=\$\((.+?)\) --set", command).group(1)
    share = share.replace(".venv/bin/python", sys.executable)
    assert subprocess.run(share, shell=True, cwd=ROOT, capture_output=True, text=True).stdout.strip() == "2048"


@needs_make
def test_one_process_trains_with_the_config_as_it_is():
    command = train_command("PROCS=1")
    assert "torchrun" not in command and "max_tokens" not in command
    assert ".venv/bin/mt train configs/multi30k_en_de.yaml --out runs/multi30k_en_de_s7 --set train.seed=7" in command


@needs_make
def test_on_a_gpu_machine_the_recipe_trains_its_gpu_config_in_one_process():
    command = train_command("GPU=yes", "TRAIN_SET=--set train.max_minutes=3")
    assert (".venv/bin/mt train configs/multi30k_en_de.gpu.yaml --out runs/multi30k_en_de_s7 --set train.seed=7  "
            "--set train.max_minutes=3") in command
    assert "torchrun" not in command and "max_tokens" not in command


@needs_make
def test_no_venv_runs_the_python_found_with_the_repo_on_its_path_and_installs_nothing():
    commands = dry_run("recipe", "NAME=multi30k_en_de", "GPU=yes", "NO_VENV=1", "PYTHON=/opt/py/bin/python")
    on_path = f"PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} /opt/py/bin/python -m mt"
    assert not any("pip install" in c or "-m venv" in c or ".venv/" in c for c in commands)
    assert any(c.startswith(f"else {on_path} train configs/multi30k_en_de.gpu.yaml") for c in commands)
    assert f"{on_path} report runs/multi30k_en_de" in commands


def dry_run(target: str, *variables: str) -> list[str]:
    """The commands `make TARGET` would run, without running them."""
    out = subprocess.run(["make", "--no-print-directory", "-n", target, *variables], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    return out.stdout.splitlines()


@needs_make
def test_test_any_cpu_runs_the_whole_suite_as_each_other_kind_of_cpu_computes_it():
    suite = ".venv/bin/python -m pytest -q -n auto --dist worksteal"
    avx2 = "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CT2_FORCE_CPU_ISA=AVX2"
    others = [f"{avx2} {suite}", f"{avx2} MT_CPU_MATMUL=mkl {suite}"]
    if "avx512f" in cpuinfo("flags").split():  # where AVX-512 is there to be capped
        others.append(f"ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI CT2_FORCE_CPU_ISA=AVX512 MT_CPU_MATMUL=mkl {suite}")
    assert [c for c in dry_run("test-any-cpu") if "pytest" in c] == others


@needs_make
def test_gpu_check_runs_the_python_it_is_given_with_the_repo_on_its_path_and_installs_nothing():
    commands = dry_run("gpu-check", "PYTHON=/opt/torch/bin/python3", "GPU_CHECK=--quick")
    assert commands == [f"PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} /opt/torch/bin/python3 "
                        "benchmarks/gpu_check.py --quick"]


@needs_make
def test_gpu_bench_runs_the_python_it_is_given_with_the_repo_on_its_path_and_writes_its_report_where_asked():
    commands = dry_run("gpu-bench", "PYTHON=/opt/torch/bin/python3", "GPU_BENCH=--quick", "GPU_BENCH_OUT=/out/r.json")
    assert commands == [f"PYTHONPATH={ROOT}${{PYTHONPATH:+:$PYTHONPATH}} /opt/torch/bin/python3 "
                        "benchmarks/gpu_bench.py --out /out/r.json --quick"]


@needs_make
def test_gpu_check_without_cuda_says_so_and_succeeds():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")} | {"CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["make", "-s", "gpu-check", f"PYTHON={sys.executable}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    assert json.loads(done.stdout)["gpu_check"] == "skipped"


@needs_make
def test_bench_writes_its_tables_into_the_docs_not_the_readme():
    commands = [c for c in dry_run("bench") if " bench " in c]
    assert len(commands) == 2 and all("--grid --readme docs/benchmarks.md" in c for c in commands)


@needs_make
def test_the_channel_recipe_trains_each_direction_not_yet_reported_then_reranks_each_by_the_other():
    commands = dry_run("recipe", "NAME=multi30k_en_de_channel", "SEED=7")
    assert "test -f runs/multi30k_en_de_s7/report.json || make recipe NAME=multi30k_en_de SEED=7" in commands
    assert "test -f runs/multi30k_de_en_s7/report.json || make recipe NAME=multi30k_de_en SEED=7" in commands
    joined = [c.split(" ", 1)[1] for c in commands if c.startswith(".venv/bin/mt ensemble")]
    assert joined == [
        "ensemble runs/multi30k_en_de_s7/final.pt runs/multi30k_de_en_s7/final.pt "
        "--out runs/multi30k_en_de_s7/final.channel.pt",
        "ensemble runs/multi30k_de_en_s7/final.pt runs/multi30k_en_de_s7/final.pt "
        "--out runs/multi30k_de_en_s7/final.channel.pt"]
    assert ".venv/bin/mt report runs/multi30k_de_en_s7 --checkpoint runs/multi30k_de_en_s7/final.channel.pt" in commands


@pytest.mark.slow  # a minute: three processes importing torch, transformers and CTranslate2
@needs_make
def test_bench_compare_times_mt_beside_hugging_face_and_ctranslate2_on_the_same_workload():
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(["make", "-s", "bench-compare", "COMPARE_PRESETS=tiny",
                           "COMPARE=--batch 2 --runs 1 --src-len 4 --tgt-len 4 --int8",
                           "COMPARE_TRAIN=--batch 2 --steps 1 --src-len 4 --tgt-len 4 --procs 1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    translated = [r for r in rows if "beam" in r]
    systems = {"mt-fp32", "mt-int8", "hf-generate-fp32", "ct2-float32", "ct2-int8"}
    for beam in (1, 4):
        assert {r["system"] for r in translated if r["beam"] == beam} == systems
    assert all(r["tgt_tokens"] == 2 * 4 for r in translated)  # every system produced the same output lengths
    trained = [r for r in rows if "median_step_s" in r]
    # One process: tests/test_compare_train.py runs mt per core too, its processes training as one.
    assert {r["system"]: r["processes"] for r in trained} == {"mt": 1, "hf": 1}
    assert sum("ratios_mt_fp32_over" in r for r in rows) == 2
    assert [sorted(r) for r in rows if "ratio_mt_over_hf" in r] == [["ratio_mt_over_hf"]]
