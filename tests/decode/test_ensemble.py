"""Ensembles (`mt ensemble`): several checkpoints of one vocabulary decoding as one model."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import from_dict, to_dict
from mt.data.tokenizer import BOS, EOS
from mt.decode.ensemble import combine
from mt.decode.forced import score_pairs
from mt.decode.load import from_state, load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines
from mt.errors import MtError
from mt.model.transformer import Transformer

from ..conftest import assert_refused, tiny_model
from ..test_checkpoint import state_for

SOURCES = ["der hund sitzt unter dem baum", "die katze", "", "rot blau groß klein läuft auf das"]


@pytest.fixture(scope="module")
def members(tmp_path_factory, trained_tiny):
    """Two checkpoints of one vocabulary: a tiny trained model, and the same with its weights moved by noise."""
    root = tmp_path_factory.mktemp("ensemble")
    a = trained_tiny(200)
    state = checkpoint.load(a)
    noise = torch.Generator().manual_seed(0)
    tables: dict[int, torch.Tensor] = {}  # tied tables (one tensor under several names) moved as one
    moved = {name: tables.setdefault(value.data_ptr(), value + 0.05 * torch.randn(value.shape, generator=noise))
             for name, value in state["model"].items()}
    b = root / "b.pt"
    checkpoint.save(state | {"model": moved}, b)
    return a, b


@torch.inference_mode()
def step_probabilities(path, source: str, tokens: list[int]) -> list[torch.Tensor]:
    """One model's next-token probabilities after BOS and after each of `tokens`, through its own KV cache."""
    loaded = load_model(path)
    model = loaded.model
    memory, src_mask = model.encode(torch.tensor([loaded.src_tok.encode([source])[0] + [EOS]]))
    cache, probs = model.start_cache(memory, src_mask), []
    for previous in [BOS] + tokens:
        logits, cache = model.decode_step(torch.tensor([previous]), cache)
        probs.append(logits[0].double().softmax(-1))
    return probs


def test_each_step_chooses_by_the_mean_of_the_members_probabilities(members):
    ensemble = from_state(combine(list(members)))
    source = SOURCES[0]
    greedy = SearchOptions.from_config(ensemble.config.decode, beam=1)
    tokens = translate_lines(ensemble, [source], greedy, torch.device("cpu"))[0][0].tokens
    a, b = (step_probabilities(path, source, tokens) for path in members)
    assert not torch.allclose(a[0], b[0], atol=1e-3), "the members should disagree, or the test proves nothing"
    mean = [(p + q) / 2 for p, q in zip(a, b, strict=True)]
    assert tokens + [EOS] == [int(p.argmax()) for p in mean]
    target = ensemble.tgt_tok.decode([tokens])[0]
    expected = sum(float(p[t].log()) for p, t in zip(mean, tokens + [EOS], strict=True))
    assert score_pairs(ensemble, [source], [target]) == pytest.approx([expected], rel=1e-4)


def test_an_ensemble_of_a_model_with_itself_translates_as_the_model(members):
    single = load_model(members[0])
    twice = from_state(combine([members[0], members[0]]))
    opts = SearchOptions.from_config(single.config.decode, beam=4, nbest=2)
    ours, theirs = (translate_lines(m, SOURCES, opts, torch.device("cpu")) for m in (twice, single))
    assert [[h.tokens for h in hyps] for hyps in ours] == [[h.tokens for h in hyps] for hyps in theirs]
    assert [h.score for hyps in ours for h in hyps] == pytest.approx([h.score for hyps in theirs for h in hyps],
                                                                     abs=1e-4)


def test_mt_ensemble_writes_one_checkpoint_that_translate_tune_and_info_take(members, tmp_path):
    runner = CliRunner()
    out = tmp_path / "ensemble.pt"
    result = runner.invoke(app, ["ensemble", *map(str, members), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "an ensemble of 2 models" in result.output
    (tmp_path / "in.txt").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    for args in (["--alignments", str(tmp_path / "align.txt")], []):
        result = runner.invoke(app, ["translate", "-c", str(out), "-i", str(tmp_path / "in.txt"), "-o",
                                     str(tmp_path / "out.txt"), *args])
        assert result.exit_code == 0, result.output
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == len(SOURCES)
    assert len((tmp_path / "align.txt").read_text(encoding="utf-8").splitlines()) == len(SOURCES)
    result = runner.invoke(app, ["tune", "--checkpoint", str(out), "--out", str(tmp_path / "tuned.pt"),
                                 "--beams", "1,2", "--len-penalties", "0.6", "--quiet"])
    assert result.exit_code == 0, result.output
    tuned = checkpoint.load(tmp_path / "tuned.pt")
    assert len(tuned["members"]) == 2 and tuned["metrics"]["tuned"]
    info = json.loads(runner.invoke(app, ["info", str(tmp_path / "tuned.pt"), "--json"]).output)
    assert [m["path"] for m in info["metrics"]["ensemble"]] == [str(p) for p in members]
    assert info["parameters"] == 2 * load_model(members[0]).parameters


def test_checkpoints_that_cannot_be_ensembled_are_refused(members, tokenizer, tmp_path):
    state = checkpoint.load(members[0])
    other_vocabulary = tmp_path / "vocab.pt"
    checkpoint.save(state_for(tiny_model(vocab=tokenizer.vocab_size), tokenizer), other_vocabulary)
    wider = tmp_path / "wider.pt"
    cfg = from_dict(state["config"])
    cfg.model.d_ff = 128
    checkpoint.save(state | {"config": to_dict(cfg), "model": Transformer(cfg.model).state_dict()}, wider)
    with pytest.raises(MtError, match="another vocabulary"):
        combine([members[0], other_vocabulary])
    with pytest.raises(MtError, match="another architecture"):
        combine([members[0], wider])
    with pytest.raises(MtError, match="at least two"):
        combine([members[0]])
    checkpoint.save(combine(list(members)), tmp_path / "e.pt")
    with pytest.raises(MtError, match="already an ensemble"):
        combine([tmp_path / "e.pt", members[0]])


def test_what_needs_one_model_refuses_an_ensemble_and_names_its_members(members, tmp_path):
    path = tmp_path / "e.pt"
    checkpoint.save(combine(list(members)), path)
    result = CliRunner().invoke(app, ["export", str(path), "--to", "ctranslate2", "--out", str(tmp_path / "ct2")])
    assert_refused(result, "an ensemble of 2 models", "--to ctranslate2 needs one model", str(members[0]))
    assert not (tmp_path / "ct2").exists()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(checkpoint.load(members[0])["config"]), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", str(tmp_path / "config.yaml"), "--init", str(path), "--out",
                                      str(tmp_path / "run"), "--set", "train.max_steps=1", "--quiet"])
    assert_refused(result, "fine-tuning needs one model")
