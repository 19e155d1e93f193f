"""One writer per run directory: the lock is refused to a second process, names its holder, and dies with it."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mt.errors import MtError
from mt.runlock import lock_run, unlock_run, writing_into

ROOT = Path(__file__).resolve().parents[1]


def hold(run: Path) -> subprocess.Popen:
    """Another process that takes `run` and keeps it until it is killed."""
    code = (f"from mt.runlock import lock_run; lock_run({str(run)!r}); print('held', flush=True); "
            "import time; time.sleep(120)")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_run_held_by_another_process_is_refused_with_its_pid_and_host(tmp_path):
    run = tmp_path / "run"
    holder = hold(run)
    try:
        with pytest.raises(MtError, match=rf"in use by process {holder.pid} on {socket.gethostname()}"):
            lock_run(run)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    run = tmp_path / "run"
    holder = hold(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    holder.stdout.close()
    lock_run(run)  # the kernel released the dead process's lock
    try:
        assert (run / ".lock").read_text() == f"process {os.getpid()} on {socket.gethostname()}\n"
    finally:
        unlock_run(run)


def test_writing_into_a_run_waits_for_no_one_but_is_refused_while_it_trains(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"")
    with writing_into(run / "final.pt"):  # nobody trains it: the block runs, holding the run meanwhile
        other = subprocess.run([sys.executable, "-c", f"from mt.runlock import lock_run; lock_run({str(run)!r})"],
                               capture_output=True, text=True, cwd=ROOT)
        assert other.returncode != 0 and f"in use by process {os.getpid()}" in other.stderr
    holder = hold(run)
    try:
        with pytest.raises(MtError, match=f"in use by process {holder.pid}"):
            with writing_into(run / "final.pt"):
                pass
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with writing_into(tmp_path / "elsewhere" / "final.pt"):  # not a run: nothing to hold
        assert not (tmp_path / "elsewhere").exists()
