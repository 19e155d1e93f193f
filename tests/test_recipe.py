"""What a results recipe adds to training: checkpoint averaging, early stopping, decoder tuning on valid."""

import pytest
import sacrebleu
import torch

from mt import checkpoint
from mt.average import average_on_valid, average_run, choose
from mt.checkpoint import load_model
from mt.errors import MtError
from mt.train import train
from mt.translate import Options, translate_ids, translate_lines
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


def test_several_counts_keep_the_average_with_the_best_valid_bleu(run, prepared, tmp_path):  # noqa: F811
    state, results = average_on_valid(run, tmp_path / "avg.pt", (1, 2, 4), torch.device("cpu"))
    assert sorted(r["last"] for r in results) == [1, 2, 4]
    assert results[0]["valid_bleu"] == max(r["valid_bleu"] for r in results)
    assert state["metrics"]["averaged_steps"] == [40, 30, 20, 10][:results[0]["last"]][::-1]
    chosen = load_model(tmp_path / "avg.pt")
    assert chosen.state["metrics"]["average_choice"] == results
    sources = (prepared / "valid.src.txt").read_text(encoding="utf-8").splitlines()
    refs = (prepared / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()
    hyps = translate_lines(chosen, sources, Options.from_config(chosen.config.decode, beam=1), torch.device("cpu"))
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


def test_training_stops_early_when_validation_stops_improving(prepared, tmp_path):  # noqa: F811
    # A learning rate of 1e-12 leaves the greedy output, hence validation BLEU, unchanged: no validation after
    # the first is a new best, and patience 2 stops the run at the third validation instead of step 100.
    train(small_config(prepared, max_steps=100, valid_every=5, patience=2, lr=1e-12), tmp_path, progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 15


def test_an_early_stopped_run_stays_stopped_on_resume(prepared, tmp_path):  # noqa: F811
    cfg = small_config(prepared, max_steps=100, valid_every=5, patience=2, lr=1e-12)
    train(cfg, tmp_path, progress=False)
    train(cfg, tmp_path, resume=True, progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 15
    assert sorted(step for step, _ in checkpoint.numbered(tmp_path)) == [5, 10, 15]  # nothing saved again


def test_patience_counts_validation_loss_when_bleu_is_off(prepared, tmp_path):  # noqa: F811
    # Without BLEU the score is minus the loss; a learning model improves it, so patience never runs out.
    train(small_config(prepared, max_steps=30, valid_every=5, patience=3, valid_bleu=False), tmp_path,
          progress=False)
    assert checkpoint.load(tmp_path / "last.pt")["step"] == 30
    assert checkpoint.load(tmp_path / "best.pt")["step"] >= 20


def test_validation_can_decode_with_beam_search(prepared, tmp_path, monkeypatch):  # noqa: F811
    import mt.train

    beams = []

    def spy(model, srcs, opts, device):
        beams.append(opts.beam)
        return translate_ids(model, srcs, opts, device)

    monkeypatch.setattr(mt.train, "translate_ids", spy)
    metrics = train(small_config(prepared, max_steps=5, valid_every=5, valid_beam=3), tmp_path, progress=False)
    assert beams == [3] and 0.0 <= metrics["valid_bleu"] <= 100.0


def test_greedy_is_tried_once_whatever_the_length_penalty():
    assert grid((1, 4), (0.6, 1.0)) == [(1, 0.6), (4, 0.6), (4, 1.0)]


def test_tuning_saves_the_best_setting_as_the_checkpoint_default(run, prepared, tmp_path):  # noqa: F811
    loaded = load_model(run / "best.pt")
    sources = (prepared / "valid.src.txt").read_text(encoding="utf-8").splitlines()
    refs = (prepared / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()
    results = tune(loaded, sources, refs, torch.device("cpu"), beams=(1, 3), penalties=(0.0, 2.0), progress=False)
    assert [(r["beam"], r["len_penalty"]) for r in sorted(results, key=lambda r: (r["beam"], r["len_penalty"]))] \
        == [(1, 0.0), (3, 0.0), (3, 2.0)]
    save_tuned(loaded, results[0], results, tmp_path / "tuned.pt")
    tuned = load_model(tmp_path / "tuned.pt")
    assert (tuned.config.decode.beam, tuned.config.decode.len_penalty) == (results[0]["beam"],
                                                                           results[0]["len_penalty"])
    hyps = translate_lines(tuned, sources, Options.from_config(tuned.config.decode), torch.device("cpu"))
    texts = tuned.tgt_tok.decode([h[0].tokens for h in hyps])
    assert round(sacrebleu.corpus_bleu(texts, [refs]).score, 2) == results[0]["bleu"]
