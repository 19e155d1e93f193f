"""Ensemble runs (`train.members`): several models trained one after another in one run, averaged, joined, reported."""

import copy
import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import load_config
from mt.data.prepare import prepare
from mt.errors import MtError
from mt.report import report_run
from mt.train.loop import train
from mt.train.members import member_dirs, train_members
from mt.train.stopping import TrainInterrupted

from ..conftest import assert_refused, write_corpus
from .test_loop import assert_same_weights, small_config


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = write_corpus(tmp_path_factory.mktemp("corpus"), n_train=200, n_valid=12)
    prepare(root / "data", "de", "en", train=str(root / "train"), valid=str(root / "valid"), test=str(root / "valid"),
            vocab_size=40, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("members") / "run"
    train(small_config(data, max_steps=12, valid_every=6, keep_checkpoints=2, members=2, max_minutes=10, seed=3),
          out, progress=False)
    return out


def test_each_member_trains_with_its_own_seed_and_its_share_of_the_time(run):
    members = member_dirs(run)
    assert [m.name for m in members] == ["member-1", "member-2"]
    lasts = [checkpoint.load(m / "last.pt") for m in members]
    assert [last["config"]["train"]["seed"] for last in lasts] == [3, 1003]
    assert [last["config"]["train"]["max_minutes"] for last in lasts] == [5.0, 5.0]
    assert [last["step"] for last in lasts] == [12, 12]
    a, b = (last["model"] for last in lasts)
    assert any(not torch.equal(a[name], b[name]) for name in a), "two seeds should train two different models"
    assert load_config(run / "config.yaml").train.members == 2


def test_a_resumed_ensemble_run_trains_only_the_members_not_yet_trained(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "member-2")  # as if stopped before the second member began
    first = (copy / "member-1" / "last.pt").read_bytes()
    result = CliRunner().invoke(app, ["train", "--resume", "--out", str(copy), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (copy / "member-1" / "last.pt").read_bytes() == first  # finished: resumed to an immediate stop
    again, before = (checkpoint.load(d / "last.pt") for d in (copy / "member-2", run / "member-2"))
    assert again["step"] == 12 and again["config"]["train"]["seed"] == 1003
    for name, value in before["model"].items():  # the same member as an uninterrupted run trains
        assert torch.equal(again["model"][name], value), name


def test_average_joins_the_averaged_members_and_report_adds_up_their_training(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    result = CliRunner().invoke(app, ["average", str(copy), "--last", "1,2", "--out", str(copy / "final.pt")])
    assert result.exit_code == 0, result.output
    assert "member-1  last" in result.output and "member-2  last" in result.output
    final = checkpoint.load(copy / "final.pt")
    assert [m["path"] for m in final["metrics"]["ensemble"]] == [str(copy / f"member-{i}" / "final.pt")
                                                                 for i in (1, 2)]
    assert all(checkpoint.load(copy / f"member-{i}" / "final.pt")["metrics"]["average_choice"] for i in (1, 2))
    report = report_run(copy, None, "cpu")
    assert json.loads((copy / "report.json").read_text(encoding="utf-8")) == report
    assert [m["steps"] for m in report["members"]] == [12, 12] and report["steps"] == 24
    assert [m["seed"] for m in report["members"]] == [3, 1003]
    assert report["test"]["sentences"] == 12


def test_what_an_ensemble_run_cannot_do_is_refused(run, data, tmp_path):
    with pytest.raises(MtError, match="already holds an ensemble run; pass --resume"):
        train(small_config(data, max_steps=1, members=2), run, progress=False)
    with pytest.raises(MtError, match="--init fine-tunes one model"):
        train(small_config(data, max_steps=1, members=2), tmp_path / "new", progress=False,
              init=run / "member-1" / "best.pt")
    result = CliRunner().invoke(app, ["train", "--resume", "--out", str(run), "--set", "train.members=3"])
    assert_refused(result, "keeps its model, members, seeds and reranker")
    with pytest.raises(MtError, match="train.members=0: must be at least 1"):
        train(small_config(data, members=0), tmp_path / "none", progress=False)


def test_an_interrupted_member_says_how_to_continue_the_whole_run(data, tmp_path):
    def interrupted(cfg, directory, **options):  # what mt.train.loop.train raises on Ctrl-C, inside member 1
        raise TrainInterrupted(f"SIGINT at step 3: saved {directory / 'last.pt'}. Continue with: mt train --resume "
                               f"--out {directory}")
    with pytest.raises(TrainInterrupted) as stopped:
        train_members(small_config(data, members=2), tmp_path / "run", False, interrupted, progress=False)
    assert str(stopped.value).endswith(f"mt train --resume --out {tmp_path / 'run'}")


def deciding(data, member_min_steps: int):
    """Two members of 12 steps in a 10-minute run, cooling down over their last quarter, the second right to left
    (the en→de recipe's form): member 1 decides at step 9 that it is on course for 12 steps (a tiny model takes
    seconds, and 12 is the step budget)."""
    return small_config(data, max_steps=12, valid_every=6, keep_checkpoints=2, members=2, cooldown=0.25,
                        max_minutes=10, seed=3, member_min_steps=member_min_steps, rerank=True)


@pytest.fixture(scope="module")
def chose_one(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("chose_one") / "run"
    train(deciding(data, member_min_steps=13), out, progress=False)
    return out


def test_members_on_course_for_too_few_steps_become_one_model_of_the_whole_budget(chose_one, data, tmp_path):
    assert member_dirs(chose_one) == [chose_one / "member-1"]
    decided = load_config(chose_one / "config.yaml").train
    assert (decided.members, decided.member_min_steps, decided.rerank) == (1, 0, False)  # kept when resumed
    last = checkpoint.load(chose_one / "member-1" / "last.pt")
    assert last["step"] == 12 and last["config"]["train"]["max_minutes"] == 10.0
    alone = tmp_path / "alone"  # member 1 went on as the one model of the whole budget would have trained
    train(small_config(data, max_steps=12, valid_every=6, keep_checkpoints=2, cooldown=0.25, max_minutes=10, seed=3),
          alone, progress=False)
    assert_same_weights(last["model"], checkpoint.load(alone / "last.pt")["model"])
    copied = tmp_path / "run"
    shutil.copytree(chose_one, copied)
    result = CliRunner().invoke(app, ["average", str(copied), "--last", "1,2", "--out", str(copied / "final.pt")])
    assert result.exit_code == 0, result.output
    final = checkpoint.load(copied / "final.pt")
    assert "members" not in final and final["step"] == 12  # one model, not an ensemble of one
    assert report_run(copied, None, "cpu")["steps"] == 12


def test_members_on_course_for_enough_steps_train_as_members(data, tmp_path):
    out = tmp_path / "run"
    train(deciding(data, member_min_steps=12), out, progress=False)
    assert [m.name for m in member_dirs(out)] == ["member-1", "member-2"]
    decided = load_config(out / "config.yaml").train
    assert (decided.members, decided.member_min_steps) == (2, 0)
    lasts = [checkpoint.load(out / f"member-{i}" / "last.pt") for i in (1, 2)]
    assert [last["step"] for last in lasts] == [12, 12]
    assert [last["config"]["train"]["max_minutes"] for last in lasts] == [5.0, 5.0]
    assert [last["config"]["model"]["right_to_left"] for last in lasts] == [False, True]


def test_a_run_stopped_before_it_decided_decides_when_resumed(chose_one, data, tmp_path):
    def stopped_at_step_4(cfg, directory, **options):  # Ctrl-C in member 1, before its decision at step 9
        early = copy.deepcopy(cfg)
        early.train.max_steps = 4
        train(early, directory, **options)
        raise TrainInterrupted(f"SIGINT at step 4: saved {directory / 'last.pt'}. Continue with: mt train --resume "
                               f"--out {directory}")
    out = tmp_path / "run"
    with pytest.raises(TrainInterrupted):
        train_members(deciding(data, member_min_steps=13), out, False, stopped_at_step_4, progress=False)
    assert load_config(out / "config.yaml").train.member_min_steps == 13  # not decided yet
    result = CliRunner().invoke(app, ["train", "--resume", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "on course for 12 steps" in result.output and "one model of the run's 10 minutes" in result.output
    assert member_dirs(out) == [out / "member-1"]
    assert_same_weights(checkpoint.load(out / "member-1" / "last.pt")["model"],
                        checkpoint.load(chose_one / "member-1" / "last.pt")["model"])
