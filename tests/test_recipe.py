"""What a results recipe adds to training: checkpoint averaging, early stopping, decoder tuning on valid."""

import pytest
import sacrebleu
import torch

from mt import checkpoint
from mt.average import average_run, choose
from mt.checkpoint import CheckpointError, load_model
from mt.train import train
from mt.translate import Options, translate_lines
from mt.tune import grid, save_tuned, tune

from .test_train import prepared, small_config  # noqa: F401  (prepared is a fixture)


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


def test_best_n_are_ranked_by_validation_bleu(run):
    bleu = {step: checkpoint.load(path)["metrics"]["valid_bleu"] for step, path in checkpoint.numbered(run)}
    top = sorted(bleu, key=lambda step: bleu[step], reverse=True)[:2]
    assert choose(run, best=2) == [run / f"checkpoint-{step}.pt" for step in sorted(top)]


def test_asking_for_more_checkpoints_than_the_run_kept_says_how_many_it_has(run, tmp_path):
    with pytest.raises(CheckpointError, match="kept 4 .*raise train.keep_checkpoints"):
        average_run(run, tmp_path / "avg.pt", last=9)
    assert not (tmp_path / "avg.pt").exists()


def test_training_stops_early_when_validation_stops_improving(prepared, tmp_path):  # noqa: F811
    # A learning rate of 1e-12 leaves the greedy output, hence validation BLEU, unchanged: no validation after
    # the first is a new best, and patience 2 stops the run at the third validation instead of step 100.
    train(small_config(prepared, max_steps=100, valid_every=5, patience=2, lr=1e-12), tmp_path, progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 15


def test_greedy_is_tried_once_whatever_the_length_penalty():
    assert grid((1, 4), (0.6, 1.0)) == [(1, 0.6), (4, 0.6), (4, 1.0)]


def test_tuning_saves_the_best_setting_as_the_checkpoint_default(run, prepared, tmp_path):  # noqa: F811
    loaded = load_model(run / "best.pt")
    sources = (prepared / "valid.src.txt").read_text(encoding="utf-8").splitlines()
    refs = (prepared / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()
    results = tune(loaded, sources, refs, torch.device("cpu"), beams=(1, 3), penalties=(0.0, 2.0), progress=False)
    assert len(results) == 3 and results[0]["bleu"] == max(r["bleu"] for r in results)
    save_tuned(loaded, results[0], results, tmp_path / "tuned.pt")
    tuned = load_model(tmp_path / "tuned.pt")
    assert (tuned.config.decode.beam, tuned.config.decode.len_penalty) == (results[0]["beam"],
                                                                           results[0]["len_penalty"])
    hyps = translate_lines(tuned, sources, Options.from_config(tuned.config.decode), torch.device("cpu"))
    texts = tuned.tgt_tok.decode([h[0].tokens for h in hyps])
    assert round(sacrebleu.corpus_bleu(texts, [refs]).score, 2) == results[0]["bleu"]
