"""What a results recipe asks of training beyond the loop: early stopping, and validation by beam search."""

import pytest

from mt import checkpoint
from mt.lines import read_text
from mt.search import Hypothesis
from mt.tokenizer import Tokenizer
from mt.train import train

from .test_train import prepared, small_config  # noqa: F401  (prepared is a fixture)


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


def test_validation_bleu_scores_what_beam_search_returns_when_asked(prepared, tmp_path, monkeypatch):  # noqa: F811
    import mt.validate

    refs = read_text(prepared / "valid.tgt.txt")
    ref_ids = Tokenizer.load(prepared / "spm.model").encode(refs)
    beams = []

    def search_that_finds_the_references(model, srcs, opts, device):
        beams.append(opts.beam)
        return [[Hypothesis(ids, 0.0, 0.0)] for ids in ref_ids]

    monkeypatch.setattr(mt.validate, "translate_ids", search_that_finds_the_references)
    metrics = train(small_config(prepared, max_steps=5, valid_every=5, valid_beam=3), tmp_path, progress=False)
    assert beams == [3] and metrics["valid_bleu"] == pytest.approx(100.0)
