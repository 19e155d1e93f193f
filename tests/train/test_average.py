"""Checkpoint averaging: the mean of a run's last (or best) checkpoints, several counts chosen on valid."""

import pytest
import sacrebleu
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.data.lines import read_text
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines
from mt.errors import MtError
from mt.train.average import average, average_on_valid, average_run, choose
from mt.train.loop import train

from .test_loop import prepared, small_config  # noqa: F401  (prepared is a fixture)


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("run")
    train(small_config(prepared, max_steps=40, keep_checkpoints=4, lr=3e-3), out, progress=False)
    return out


def test_average_is_the_mean_of_the_last_checkpoints(run, tmp_path):
    state = average_run(run, tmp_path / "avg.pt", last=2)
    assert state["metrics"]["averaged_steps"] == [30, 40]
    a, b = (checkpoint.load(run / f"checkpoint-{step}.pt")["model"] for step in (30, 40))
    averaged = load_model(tmp_path / "avg.pt").state["model"]
    moved = 0
    for name, value in averaged.items():
        assert torch.allclose(value, (a[name] + b[name]) / 2, atol=1e-7), name
        moved += not torch.equal(a[name], b[name])
    assert moved, "the two checkpoints should differ, or the test proves nothing"


def test_several_counts_keep_the_average_with_the_best_valid_bleu(run, prepared, tmp_path):  # noqa: F811
    state, results = average_on_valid(run, tmp_path / "avg.pt", (1, 2, 4), torch.device("cpu"))
    assert sorted(r["last"] for r in results) == [1, 2, 4]
    assert results[0]["valid_bleu"] == max(r["valid_bleu"] for r in results)
    assert state["metrics"]["averaged_steps"] == [40, 30, 20, 10][:results[0]["last"]][::-1]
    chosen = load_model(tmp_path / "avg.pt")
    assert chosen.state["metrics"]["average_choice"] == results
    sources, refs = read_text(prepared / "valid.src.txt"), read_text(prepared / "valid.tgt.txt")
    opts = SearchOptions.from_config(chosen.config.decode, beam=1)
    hyps = translate_lines(chosen, sources, opts, torch.device("cpu"))
    texts = chosen.tgt_tok.decode([h[0].tokens for h in hyps])
    assert round(sacrebleu.corpus_bleu(texts, [refs]).score, 2) == results[0]["valid_bleu"]


def test_choosing_among_more_checkpoints_than_kept_fails_before_translating(run, tmp_path):
    with pytest.raises(MtError, match="kept 4"):
        average_on_valid(run, tmp_path / "avg.pt", (2, 8), torch.device("cpu"))
    assert not (tmp_path / "avg.pt").exists()


def fake_run(run, tmp_path, metrics_by_step: dict) -> None:
    """Checkpoints of `run`'s weights under other steps and validation metrics."""
    state = checkpoint.load(run / "last.pt")
    for step, metrics in metrics_by_step.items():
        checkpoint.save(state | {"step": step, "metrics": metrics}, tmp_path / f"checkpoint-{step}.pt")


def test_best_n_are_ranked_by_validation_bleu_else_loss(run, tmp_path):
    fake_run(run, tmp_path / "bleu", {10: {"step": 10, "valid_bleu": 30.0}, 20: {"step": 20, "valid_bleu": 12.0},
                                      30: {"step": 30, "valid_bleu": 31.0},
                                      35: {"step": 30, "valid_bleu": 31.0},  # saved on Ctrl-C: step 30's metrics
                                      40: {"step": 40, "valid_bleu": 29.0}})
    assert choose(tmp_path / "bleu", best=2) == [tmp_path / "bleu" / f"checkpoint-{s}.pt" for s in (10, 30)]
    fake_run(run, tmp_path / "loss", {10: {"step": 10, "valid_loss": 2.0}, 20: {"step": 20, "valid_loss": 1.5},
                                      30: {"step": 30, "valid_loss": 1.8}})
    assert choose(tmp_path / "loss", best=1) == [tmp_path / "loss" / "checkpoint-20.pt"]
    fake_run(run, tmp_path / "none", {10: {"step": 10}})
    with pytest.raises(MtError, match="no validation score .* --last N instead"):
        choose(tmp_path / "none", best=1)


def test_asking_for_more_checkpoints_than_the_run_kept_says_how_many_it_has(run, tmp_path):
    with pytest.raises(MtError, match="kept 4 .*raise train.keep_checkpoints"):
        average_run(run, tmp_path / "avg.pt", last=9)
    assert not (tmp_path / "avg.pt").exists()


def test_mt_average_of_several_counts_tries_those_the_run_kept_checkpoints_for(run, tmp_path):
    """A short run (say a recipe given a few minutes) keeps fewer checkpoints than `make recipe` asks to try."""
    result = CliRunner().invoke(app, ["average", str(run), "--out", str(tmp_path / "avg.pt"), "--last", "1,2,8,16"])
    assert result.exit_code == 0, result.output
    assert f"{run} kept 4 checkpoints: trying --last 1,2 of 1,2,8,16" in result.stderr
    assert sorted(r["last"] for r in load_model(tmp_path / "avg.pt").state["metrics"]["average_choice"]) == [1, 2]
    result = CliRunner().invoke(app, ["average", str(run), "--out", str(tmp_path / "none.pt"), "--last", "8,16"])
    assert result.exit_code == 2 and "asked for 8 checkpoints but the run kept 4" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--last", "2,x"], "--last '2,x': expected a count or comma-separated counts"),
    (["--last", "2,4", "--best", "2"], "several counts work with --last only"),
    (["--last", "2", "--best", "2"], "either --last N or --best N"),
    (["--last", "0,2"], "each count must be at least 1"),
])
def test_mt_average_refuses_a_choice_it_cannot_make_in_one_line(run, tmp_path, args, message):
    result = CliRunner().invoke(app, ["average", str(run), "--out", str(tmp_path / "avg.pt"), *args])
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "avg.pt").exists()


def test_checkpoints_from_before_a_model_key_existed_average_with_later_ones(run, tmp_path):
    older = checkpoint.load(run / "checkpoint-30.pt")
    del older["config"]["model"]["right_to_left"]  # written before the key existed, then the run was resumed
    checkpoint.save(older, tmp_path / "checkpoint-30.pt")
    averaged = average([tmp_path / "checkpoint-30.pt", run / "checkpoint-40.pt"])
    assert averaged["metrics"]["averaged_steps"] == [30, 40]
