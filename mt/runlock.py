"""One writer per run directory: an exclusive OS file lock on RUN/.lock for as long as the process runs.

`flock` locks are released by the kernel when their process ends, however it ends, so a run killed with
`kill -9` never leaves a stale lock: `mt train --resume` can take the run over at once. The lock file holds the
holder's PID and host, which a refused process names in its error.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mt.errors import MtError

NAME = ".lock"
_held: dict[Path, int] = {}  # run directory -> the open lock file's descriptor, kept open while the run is ours


def lock_run(run_dir: str | Path) -> None:
    """Take the run directory (created if missing) for this process, or raise `MtError` naming who holds it.
    Taking a run this process already holds does nothing."""
    run_dir = Path(run_dir).absolute()
    if run_dir in _held:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise MtError(f"{run_dir} is in use by {holder}: a run has one writer. Wait for it to finish, or stop it "
                      "(Ctrl-C saves its last.pt), then try again") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[run_dir] = fd


def unlock_run(run_dir: str | Path) -> None:
    """Give the run directory up (the kernel does it anyway when the process ends)."""
    fd = _held.pop(Path(run_dir).absolute(), None)
    if fd is not None:
        os.close(fd)


def is_run(directory: str | Path) -> bool:
    """Whether `directory` holds a training run (its lock file, or a last.pt)."""
    directory = Path(directory)
    return (directory / NAME).is_file() or (directory / "last.pt").is_file()


@contextmanager
def writing_into(path: str | Path) -> Iterator[None]:
    """Hold the run that `path` is written into (its directory, if that is a run) while the block runs: `mt
    average` and `mt tune` write into a run only when no training writes to it."""
    directory = Path(path).absolute().parent
    if not is_run(directory) or directory in _held:
        yield
        return
    lock_run(directory)
    try:
        yield
    finally:
        unlock_run(directory)
