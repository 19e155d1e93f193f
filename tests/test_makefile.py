"""How `make recipe` launches training: one process, or on a CPU one single-thread process per core."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def train_command(*variables: str) -> str:
    """The command `make recipe` would train a new run with (`make -n` prints it without running anything)."""
    out = subprocess.run(["make", "-n", "recipe", "NAME=multi30k_en_de", "SEED=7", *variables], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
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
