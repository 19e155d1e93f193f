"""Choices by measurement (mt/fast/choose.py): the faster candidate is kept, remembered by every later process on the
machine, the first answer written stands, and `mt bench` says what was chosen and how."""

import itertools
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

import mt.fast.choose
from mt.bench import summary
from mt.cli import app
from mt.fast.choose import Kept, choice, forget, made, path

from ..conftest import TIMED as measured
from ..conftest import timed_once


@pytest.fixture(autouse=True)
def timed(monkeypatch):
    """These tests time the candidates, as a user's process does (the rest of the suite times each once)."""
    monkeypatch.setattr(mt.fast.choose, "measured", measured)


@pytest.fixture
def own_file(monkeypatch, tmp_path):
    """This test's file of choices, and a process that has read none yet."""
    file = tmp_path / "choices" / "machine.json"
    monkeypatch.setattr(mt.fast.choose, "path", lambda: file)
    monkeypatch.setattr(mt.fast.choose, "_made", {})
    monkeypatch.setattr(mt.fast.choose, "_asked", {})
    monkeypatch.setattr(mt.fast.choose, "_busy", {})
    monkeypatch.setattr(mt.fast.choose, "_rounds", {})
    monkeypatch.setattr(mt.fast.choose, "STEADY", float("inf"))  # these tests time sleeps, on a machine maybe busy
    monkeypatch.setattr(mt.fast.choose, "WAITED", float("inf"))
    return file


def new_process(monkeypatch) -> None:
    """As a later process finds it: nothing read yet, and nothing may be measured."""
    monkeypatch.setattr(mt.fast.choose, "_made", {})
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: pytest.fail("measured again"))


def test_the_faster_candidate_is_chosen_and_later_processes_use_it_without_measuring(monkeypatch, own_file):
    calls = {"slow": 0, "fast": 0}

    def slow():
        calls["slow"] += 1
        time.sleep(0.002)

    def fast():
        calls["fast"] += 1

    assert choice("a product", {"slow": slow, "fast": fast}) == "fast"
    assert calls["slow"] >= 5 and calls["fast"] >= calls["slow"]  # both timed, in turn
    stored = json.loads(own_file.read_text())
    assert stored["choices"]["a product"]["choice"] == "fast" and stored["machine"]["cpu"] is not None
    new_process(monkeypatch)
    assert choice("a product", {"slow": slow, "fast": fast}) == "fast"


@pytest.mark.parametrize("times, chosen", [({"plain": 1.0, "other": 0.99}, "plain"),
                                           ({"plain": 1.0, "other": 0.9}, "other"),
                                           ({"plain": 0.5, "other": 0.9}, "plain")])
def test_the_first_named_is_kept_unless_another_is_clearly_faster(monkeypatch, own_file, times, chosen):
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: times)
    assert choice("q", {"plain": lambda: None, "other": lambda: None}) == chosen


def test_the_first_answer_written_stands(monkeypatch, own_file):
    """Two processes measuring at once may find different winners; the one that writes second takes the first's, so
    that every process on the machine computes the same."""

    def race(candidates):
        own_file.parent.mkdir(parents=True, exist_ok=True)
        own_file.write_text(json.dumps({"machine": {}, "choices": {"q": {"choice": "b", "ms": {"a": 2, "b": 1}}}}))
        return {"a": 0.001, "b": 1.0}

    monkeypatch.setattr(mt.fast.choose, "measured", race)
    assert choice("q", {"a": lambda: None, "b": lambda: None}) == "b"
    assert json.loads(own_file.read_text())["choices"]["q"]["choice"] == "b"


def test_an_unreadable_file_is_measured_again_and_replaced_whole(monkeypatch, own_file):
    own_file.parent.mkdir(parents=True)
    own_file.write_text('{"choices": {"q": ')  # cut short
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: {"a": 1.0, "b": 0.5})
    assert choice("q", {"a": lambda: None, "b": lambda: None}) == "b"
    assert json.loads(own_file.read_text())["choices"]["q"]["choice"] == "b"
    assert [p.name for p in own_file.parent.iterdir() if p.suffix == ".partial"] == []


def test_without_a_cache_to_write_the_process_keeps_its_answer(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setattr(mt.fast.choose, "path", lambda: blocked / "choices" / "machine.json")  # under a file
    monkeypatch.setattr(mt.fast.choose, "_made", {})
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: {"a": 1.0, "b": 0.5})
    assert choice("q", {"a": lambda: None, "b": lambda: None}) == "b"
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: pytest.fail("measured again"))
    assert choice("q", {"a": lambda: None, "b": lambda: None}) == "b"


def test_a_machine_whose_kernels_differ_keeps_other_choices(monkeypatch):
    here = path()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "some other ISA")
    assert path() != here and path().parent == here.parent


def test_measured_times_every_candidate_in_turn(monkeypatch):
    monkeypatch.setattr(mt.fast.choose, "STEADY", float("inf"))  # on a machine maybe busy (the suite's other worker)
    monkeypatch.setattr(mt.fast.choose, "WAITED", float("inf"))
    order = []
    times = measured({"a": lambda: order.append("a"), "b": lambda: order.append("b")})
    assert times.keys() == {"a", "b"} and all(t >= 0 for t in times.values())
    assert order[:4] == ["a", "a", "b", "b"]  # warmed up, then a first timing of each to size the repetitions


def test_timings_taken_while_the_machine_is_busy_are_not_kept(monkeypatch, own_file):
    """A candidate whose timings spread (another process took the cores): measured again, then the default is used
    and nothing is written, for a quieter process to decide."""
    monkeypatch.setattr(mt.fast.choose, "STEADY", 2.0)
    spikes = itertools.cycle([0.002, 0.002, 0.002, 0.002, 0.05, 0.002, 0.002])  # warm-up, sizing, five rounds
    tries = []
    measure = mt.fast.choose.measured
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: tries.append(1) or measure(candidates))
    assert choice("q", {"default": lambda: None, "other": lambda: time.sleep(next(spikes))}) == "default"
    assert len(tries) == mt.fast.choose.TRIES and not own_file.exists()
    assert made() == ["q: the default for now (the cores were busy; timed again later)"]  # as mt bench says
    assert choice("q", {"default": lambda: None, "other": lambda: None}) == "default"  # asked again: not timed again
    assert len(tries) == mt.fast.choose.TRIES


@pytest.fixture
def threads_waiting(monkeypatch):
    """This process's threads waiting for a core a second more at each look, far more than a timing's few
    milliseconds, as `measured` judges it."""
    monkeypatch.setattr(mt.fast.choose, "WAITED", 0.2)
    waited = itertools.count()
    monkeypatch.setattr(mt.fast.choose, "waited_s", lambda: float(next(waited)))


def test_steady_timings_taken_while_the_threads_waited_for_a_core_are_not_kept(own_file, threads_waiting):
    """Another process on this one's cores slows every timing alike (a product on two threads 30-fold): steady, but
    the threads waited for a core most of the time, so the default is used and nothing is written."""
    assert choice("q", {"default": lambda: time.sleep(0.002), "other": lambda: None}) == "default"
    assert not own_file.exists() and made() == ["q: the default for now (the cores were busy; timed again later)"]


def test_a_thread_that_shares_its_core_with_other_processes_is_counted_waiting():
    """What `measured` reads: the time this process's threads spent ready to run while other processes held the
    cores, here as many busy processes as cores beside a thread that computes."""
    if mt.fast.choose.waited_s() == 0.0:
        pytest.skip("this kernel does not count the time threads wait for a core (/proc/self/task/*/schedstat)")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        time.sleep(0.1)  # the busy processes running
        before, end = mt.fast.choose.waited_s(), time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
        assert mt.fast.choose.waited_s() - before > 0.05
    finally:
        for process in busy:
            process.kill()
            process.wait()


def test_a_busy_machine_s_default_counts_only_until_the_question_may_be_timed_again(monkeypatch, own_file):
    """A run whose first seconds were busy (say, other processes measuring beside it) gets the faster choice later:
    the callers' `Kept` answers hold the default until RETRY_S has passed, then the question is timed again."""
    timings = iter([None] * mt.fast.choose.TRIES + [{"default": 0.002, "other": 0.001}])
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: next(timings))
    kept, candidates = Kept(), {"default": lambda: None, "other": lambda: None}
    assert kept.keep("shape", choice("q", candidates), "q") == "default" and kept.get("shape") == "default"
    later = time.monotonic() + mt.fast.choose.RETRY_S
    monkeypatch.setattr(mt.fast.choose, "clock", lambda: later)
    assert kept.get("shape") is None
    assert kept.keep("shape", choice("q", candidates), "q") == "other" and kept.get("shape") == "other"
    assert json.loads(own_file.read_text())["choices"]["q"]["choice"] == "other"


def test_a_machine_busy_for_good_is_timed_ever_less_often(monkeypatch, own_file):
    """Asked every 5 s on a machine that stays busy, a question is timed again after 30 s, then 60, then 120: the
    retries cost a long run ever less."""
    now, timed = [0.0], []
    monkeypatch.setattr(mt.fast.choose, "clock", lambda: now[0])
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: timed.append(now[0]))
    for now[0] in range(0, 400, 5):
        assert choice("q", {"default": lambda: None, "other": lambda: None}) == "default"
    assert sorted(set(timed)) == [0, 30, 90, 210] and len(timed) == 4 * mt.fast.choose.TRIES


def test_threads_beyond_the_cores_waiting_for_each_other_do_not_make_the_machine_busy(monkeypatch, own_file,
                                                                                      threads_waiting):
    monkeypatch.setattr(mt.fast.choose, "cores", lambda: torch.get_num_threads() - 1)
    assert choice("q", {"default": lambda: time.sleep(0.002), "other": lambda: None}) == "other"


def test_bench_prints_the_choices_and_choose_again_forgets_them(monkeypatch, own_file):
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: {"mkl": 0.002, "onednn": 0.001})
    choice("decoding linear 8x8, 1 rows, 1 threads", {"mkl": lambda: None, "onednn": lambda: None})
    assert made() == ["decoding linear 8x8, 1 rows, 1 threads: onednn (mkl 2 ms, onednn 1 ms)"]
    result = {"bench": "train", "fast_paths": [], "choices": made(), "choices_file": str(own_file),
              "tgt_tok_per_s": 1.0, "mfu": 0.1, "peak_tflops": 1.0, "flops_per_tgt_token": 1e6,
              "padding_fraction": 0.0, "peak_rss_mb": 1.0}
    assert (f"choices by measurement on this machine ({own_file}):\n  decoding linear 8x8, 1 rows, 1 threads: "
            "onednn (mkl 2 ms, onednn 1 ms)") in summary(result)
    assert forget() == own_file and not own_file.exists() and made() == []


def test_mt_bench_choose_again_says_so(monkeypatch, own_file):
    monkeypatch.setattr(mt.fast.choose, "measured", timed_once)  # a model's hundred questions, asked as the suite asks
    own_file.parent.mkdir(parents=True)
    own_file.write_text(json.dumps({"machine": {}, "choices": {"stale": {"choice": "x", "ms": {"x": 1}}}}))
    result = CliRunner().invoke(app, ["bench", "translate", "--preset", "small", "--beam", "1", "--batch", "1",
                                      "--sentences", "1", "--src-len", "3", "--tgt-len", "2", "--runs", "1",
                                      "--choose-again"])
    assert result.exit_code == 0, result.output
    assert f"forgot this machine's kernel choices ({own_file})" in result.stderr
    assert "choices by measurement on this machine" in result.stdout and "decoding linear 256x" in result.stdout
    assert "stale" not in json.loads(own_file.read_text())["choices"]
