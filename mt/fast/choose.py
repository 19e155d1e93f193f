"""Kernel choices made by measurement on the machine that runs them, as FFTW's wisdom and cuDNN's benchmark mode do.

Where two implementations compute the same thing (MKL or oneDNN for a product, the C step or PyTorch's for so many
rows), the first use of a kind of shape times each candidate, a few milliseconds, and keeps the faster in a file of
this machine's choices, keyed by what decides them: the CPU's model and flags, the vector width PyTorch runs, the
library versions (`machine`). This process and every later one on the machine use it from then on, so a machine
gives the same output for the same input every run. `mt bench` prints the choices its model made and how;
`mt bench --choose-again` forgets this machine's and makes them afresh (as does deleting the file).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from mt.device import cache_dir, cpuinfo

ROUNDS = 5  # timings of each candidate, alternating; the median counts
SLICE_S = 0.002  # calls are repeated until one timing takes at least this long
CLOSE = 0.03  # a candidate must be this much faster than the first named (the default) to be chosen
STEADY = 2.0  # a candidate's slowest timing over its fastest, above which the machine was busy ...
WAITED = 0.2  # ... or its threads waited for a core this share of the timing: measured again ...
TRIES = 3  # ... this many times, then the default is used for now and nothing kept ...
RETRY_S = 30.0  # ... until the question's first use this many seconds later, which times it again (twice as long
# after each busy round: on a machine busy for good, the retries cost a long run ever less)
clock = time.monotonic  # what RETRY_S is counted on (tests move it on)


def machine() -> dict[str, str]:
    """What decides a choice besides its shape: the CPU (its model and flags), the vector width PyTorch runs and the
    one oneDNN may use, the libraries."""
    flags = hashlib.sha256(" ".join(sorted(cpuinfo("flags").split())).encode()).hexdigest()[:12]
    return {"cpu": cpuinfo("model name") or platform.processor(), "flags": flags,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "onednn_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", ""), "torch": torch.__version__}


def path() -> Path:
    """This machine's file of choices, in mt's cache (`$MT_CACHE`, default ~/.cache/mt)."""
    key = hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "choices" / f"{key}.json"


LOCK = threading.RLock()  # one measurement at a time in a process: a measurement may ask for another's choice
_made: dict[Path, dict[str, dict]] = {}  # the choices read or made in this process, per file
_asked: dict[str, None] = {}  # the questions this process asked, in order: what `mt bench` reports
_busy: dict[str, float] = {}  # questions this process could not time steadily → when they may be timed again
_rounds: dict[str, int] = {}  # ... and how many rounds of TRIES found the machine busy for each


def remembered(file: Path) -> dict[str, dict]:
    if file not in _made:
        try:
            _made[file] = json.loads(file.read_text())["choices"]
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: made again
            _made[file] = {}
    return _made[file]


def choice(question: str, candidates: Mapping[str, Callable[[], object]]) -> str:
    """The name of the fastest of `candidates` (name → a call that does the work once) for `question` (a kind of
    shape: what, its sizes, the threads) on this machine: remembered, or measured now and remembered. The first
    named is the default, kept unless another is clearly faster."""
    file = path()
    with LOCK:
        _asked.setdefault(question)
        known = remembered(file).get(question)
        if known is not None and known.get("choice") in candidates:
            _busy.pop(question, None)  # another process has since answered it
            return known["choice"]
        first = next(iter(candidates))
        if clock() < _busy.get(question, 0.0):
            return first
        for _ in range(TRIES):
            with torch.random.fork_rng(devices=[]):  # measuring draws nothing from the run's random stream
                times = measured(candidates)
            if times is not None:
                break
        else:  # another process kept the cores busy throughout: timings that would mislead every later run
            _rounds[question] = _rounds.get(question, 0) + 1
            _busy[question] = clock() + RETRY_S * 2 ** (_rounds[question] - 1)
            return first
        _busy.pop(question, None)
        best = min(times, key=times.get)
        chosen = best if times[best] < times[first] * (1 - CLOSE) else first
        return keep(file, question, {"choice": chosen, "ms": {k: round(v * 1e3, 4) for k, v in times.items()}})


def measured_limit(fixed: int | None, limits: Kept, question: Callable[[], str], sizes: tuple[int, ...],
                   plain: Callable[[int], Callable[[], object]], native: Callable[[int], Callable[[], object]]) -> int:
    """`fixed` if set; else the largest of `sizes` (ascending) up to which the C code is measured the faster at each
    size, 0 if at none, once for each thread count (kept in `limits`). `question()` names the part, its shape and the
    unit of `sizes` (made only when asked: a lone sentence's step checks the limit every step); `plain(size)` and
    `native(size)` give the calls timed."""
    if fixed is not None:
        return fixed
    threads = torch.get_num_threads()
    limit = limits.get(threads)
    if limit is None:
        part, _, unit = question().rpartition(", ")
        limit, asked = 0, []
        with torch.inference_mode():
            for size in sizes:
                asked.append(f"{part}, {threads} threads, {unit}, {size}")
                if choice(asked[-1], {"pytorch": plain(size), "c": native(size)}) != "c":
                    break
                limit = size
        limits.keep(threads, limit, *asked)
    return limit


class Kept:
    """A caller's answers by its own key (a kind of shape), so that it asks `choice` once, not at every call: each
    kept for good once measured; a busy machine's default only until its question may be timed again, so that a long
    run's later steps get the faster kernel."""

    def __init__(self):
        self.answers: dict[object, tuple[object, float]] = {}  # key → (answer, until when it counts)

    def get(self, key: object) -> object | None:
        answer, until = self.answers.get(key, (None, 0.0))
        return answer if clock() < until else None

    def keep(self, key: object, answer: object, *questions: str) -> object:
        """Keeps and returns `answer`, made from `questions`' choices."""
        self.answers[key] = (answer, min((_busy.get(q, math.inf) for q in questions), default=math.inf))
        return answer


def measured(candidates: Mapping[str, Callable[[], object]]) -> dict[str, float] | None:
    """Seconds a call of each candidate takes: warmed up, repeated to a measurable slice, the median of ROUNDS
    timings taken in turn, so that the machine's noise falls on every candidate alike; None when the machine was
    busy: a candidate's timings spread more than STEADY times, or this process's threads waited for a core WAITED
    of the time (another process on its cores slows every timing alike, a product on two threads 30-fold)."""
    reps = {}
    for name, call in candidates.items():
        call()  # the first call pays for allocation, packing and the library's own set-up
        start = time.perf_counter()
        call()
        reps[name] = max(1, int(SLICE_S / max(time.perf_counter() - start, 1e-7)))
    times: dict[str, list[float]] = {name: [] for name in candidates}
    waited, began = waited_s(), time.perf_counter()
    for _ in range(ROUNDS):
        for name, call in candidates.items():
            start = time.perf_counter()
            for _ in range(reps[name]):
                call()
            times[name].append((time.perf_counter() - start) / reps[name])
    # (threads beyond the cores wait for each other, not for another process)
    if torch.get_num_threads() <= cores() and waited_s() - waited > WAITED * (time.perf_counter() - began):
        return None
    if any(max(t) > STEADY * min(t) for t in times.values()):
        return None
    return {name: statistics.median(t) for name, t in times.items()}


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def waited_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a core (Linux's schedstat: the kernel's
    count, whatever the threads run); 0 where the kernel does not say."""
    total = 0
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for thread in threads:
        try:
            with open(f"/proc/self/task/{thread}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile, or no schedstat
            pass
    return total / 1e9


def keep(file: Path, question: str, answer: dict) -> str:
    """Writes `answer` into the file unless another process answered first, whose answer then counts (the first
    answer stands, so all processes on a machine agree); returns the choice that counts. The file is replaced whole,
    never left half written."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(file.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _made.pop(file, None)
            choices = remembered(file)
            choices.setdefault(question, answer)
            handle, partial = tempfile.mkstemp(dir=file.parent, prefix=file.name, suffix=".partial")
            with os.fdopen(handle, "w") as out:
                json.dump({"machine": machine(), "choices": choices}, out, indent=1, sort_keys=True)
            os.replace(partial, file)
    except OSError:  # no cache to write: this process keeps its answer to itself
        remembered(file).setdefault(question, answer)
    return remembered(file)[question]["choice"]


def forget() -> Path:
    """Forgets this machine's choices (`mt bench --choose-again`): they are measured again at their next use."""
    file = path()
    with LOCK:
        file.unlink(missing_ok=True)
        _made.pop(file, None)
    return file


def made() -> list[str]:
    """The choices this process asked for, each with the milliseconds its candidates took when it was measured, or
    that it could not yet be: what `mt bench` prints."""
    known = remembered(path())
    return [f"{q}: {known[q]['choice']} (" + ", ".join(f"{k} {v:g} ms" for k, v in known[q]["ms"].items()) + ")"
            if q in known else f"{q}: the default for now (the cores were busy; timed again later)"
            for q in _asked if q in known or q in _busy]


def rows_class(rows: int) -> int:
    """A kind of shape by its rows: the next power of two, so that a few measurements cover every batch."""
    return 1 << max(0, rows - 1).bit_length()

