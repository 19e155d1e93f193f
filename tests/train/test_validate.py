import pytest
import torch

from mt.data.ids import Split
from mt.data.lines import read_text
from mt.data.tokenizer import Tokenizer
from mt.decode.search import Hypothesis
from mt.model.transformer import Transformer
from mt.train.loop import train
from mt.train.validate import validation_metrics

from .test_loop import prepared, small_config  # noqa: F401  (prepared is a fixture)


def test_validation_loss_is_per_target_token_whatever_the_batching(prepared):  # noqa: F811
    cfg = small_config(prepared, valid_bleu=False)
    cfg.model.src_vocab_size = cfg.model.tgt_vocab_size = 40
    model = Transformer(cfg.model)
    losses = []
    for max_tokens in (32, 1024):  # one sentence a batch, and all of them in one padded batch
        cfg.train.max_tokens = max_tokens
        losses.append(validation_metrics(model, Split(prepared, "valid"), [], None, cfg, torch.device("cpu"),
                                         None)["valid_loss"])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_validation_bleu_scores_what_beam_search_returns_when_asked(prepared, tmp_path, monkeypatch):  # noqa: F811
    import mt.train.validate

    refs = read_text(prepared / "valid.tgt.txt")
    ref_ids = Tokenizer.load(prepared / "spm.model").encode(refs)
    beams = []

    def search_that_finds_the_references(model, srcs, opts, device):
        beams.append(opts.beam)
        return [[Hypothesis(ids, 0.0, 0.0)] for ids in ref_ids]

    monkeypatch.setattr(mt.train.validate, "translate_ids", search_that_finds_the_references)
    metrics = train(small_config(prepared, max_steps=5, valid_every=5, valid_beam=3), tmp_path, progress=False)
    assert beams == [3] and metrics["valid_bleu"] == pytest.approx(100.0)
