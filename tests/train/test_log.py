import re

import mt.train.loop
from mt.train.log import Pace
from mt.train.loop import train

from .test_loop import prepared, small_config  # noqa: F401  (prepared is a fixture)


def test_the_pace_is_said_once_at_the_second_log_line_with_what_the_time_budget_buys():
    pace = Pace(max_minutes=10, max_steps=100_000, epoch_tokens=60_000)
    assert pace.seen(25, 10.0, 900.0) is None  # the first line carries the start-up: not a pace
    note = pace.seen(50, 20.0, 1_000.0)  # 25 steps in 10 s: 150 a minute, 400 target tokens a step
    assert note == ("this machine trains 150 steps a minute (1,000 target tokens/s): train.max_minutes=10 buys "
                    "about 1,500 steps, 10.0 epochs")
    assert pace.seen(75, 30.0, 1_000.0) is None  # said once


def test_after_the_first_validation_the_budget_is_said_again_with_the_validations_cost():
    pace = Pace(max_minutes=10, max_steps=100_000, epoch_tokens=60_000)
    assert pace.validated(20, 8.0, 2.0, 20) is None  # nothing to revise before the pace is said
    pace.seen(25, 10.0, 900.0)
    pace.seen(50, 20.0, 1_000.0)  # 0.4 s and 400 target tokens a step
    # Steps 25 to 300 took 110 s besides the 6 s validation (0.4 s a step); with 6 s every 300 steps, 0.42 s a step,
    # and the 474 s left buy 1,129 more.
    assert pace.validated(300, 126.0, 6.0, 300) == ("with a validation of 6.0 s every 300 steps, train.max_minutes=10 "
                                                    "buys about 1,429 steps, 9.5 epochs")
    assert pace.validated(600, 250.0, 6.0, 300) is None  # said once
    steps = Pace(max_minutes=0, max_steps=3_000, epoch_tokens=1)
    steps.seen(10, 6.0, 500.0)
    steps.seen(20, 12.0, 500.0)
    assert steps.validated(300, 180.0, 6.0, 300) is None  # a step budget: the minutes were said, no steps to buy


def test_a_step_budget_is_told_in_minutes_and_a_time_budget_never_promises_past_max_steps():
    steps = Pace(max_minutes=0, max_steps=3_000, epoch_tokens=1)
    steps.seen(10, 6.0, 500.0)
    assert steps.seen(20, 12.0, 500.0).endswith("train.max_steps=3,000 takes about 30 minutes here")
    capped = Pace(max_minutes=60, max_steps=400, epoch_tokens=4_000)
    capped.seen(10, 1.0, 500.0)
    assert "buys about 400 steps" in capped.seen(20, 2.0, 500.0)


def test_a_run_with_a_time_budget_says_its_pace_once_unless_quiet(prepared, tmp_path, capsys):  # noqa: F811
    train(small_config(prepared, max_steps=20, max_minutes=30, log_every=5, valid_every=15), tmp_path / "run",
          progress=True)
    err = capsys.readouterr().err.splitlines()
    notes = [line for line in err if "steps a minute" in line]
    assert len(notes) == 1 and re.fullmatch(r"note: this machine trains [\d,]+ steps a minute \([\d,]+ target "
                                            r"tokens/s\): train.max_minutes=30 buys about 20 steps, [\d.]+ epochs",
                                            notes[0]), notes
    revised = [line for line in err if "with a validation of" in line]  # after step 15's, not the last one's
    assert len(revised) == 1 and re.fullmatch(r"note: with a validation of [\d.]+ s every 15 steps, "
                                              r"train.max_minutes=30 buys about 20 steps, [\d.]+ epochs", revised[0])


def test_bf16_asked_on_a_cpu_that_emulates_it_is_trained_with_a_note_saying_so(prepared, tmp_path, capsys,  # noqa: F811
                                                                              monkeypatch):
    monkeypatch.setattr(mt.train.loop, "native_bf16", lambda: False)  # as on an AVX2-only CPU
    train(small_config(prepared, max_steps=2, precision="bf16"), tmp_path / "run", progress=False)
    assert "bf16 is emulated" in capsys.readouterr().err
    monkeypatch.setattr(mt.train.loop, "native_bf16", lambda: True)
    train(small_config(prepared, max_steps=2, precision="bf16"), tmp_path / "run2", progress=False)
    assert "bf16 is emulated" not in capsys.readouterr().err
