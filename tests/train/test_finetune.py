"""Fine-tuning (`mt train --init`): a new run that starts from a trained model's weights and nothing else."""

import json
import re
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import Config, ModelConfig, to_dict
from mt.data.prepare import prepare
from mt.errors import MtError
from mt.info import describe
from mt.train.loop import train
from mt.train.optim import learning_rate

from ..conftest import LEXICON, assert_refused, write_corpus

# The in-domain data: other sentences, and some words translated otherwise.
NEW_LEXICON = LEXICON | {"hund": "hound", "baum": "bush", "rot": "ruby"}


def config(data: Path, **train_changes) -> Config:
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                   dropout=0.0, max_len=32))
    train_cfg = cfg.train
    train_cfg.max_tokens, train_cfg.warmup, train_cfg.valid_every, train_cfg.log_every = 256, 20, 50, 10
    train_cfg.valid_bleu, train_cfg.threads, train_cfg.lr = False, 1, 3e-3
    for key, value in train_changes.items():
        setattr(train_cfg, key, value)
    return cfg


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tiny de→en model trained on the first corpus: its best.pt."""
    root = tmp_path_factory.mktemp("source")
    corpus = write_corpus(root / "corpus", seed=0)
    prepare(root / "data", "de", "en", train=str(corpus / "train"), valid=str(corpus / "valid"), vocab_size=40,
            progress=False)
    train(config(root / "data", max_steps=150), root / "run", progress=False)
    return root / "run" / "best.pt"


@pytest.fixture(scope="module")
def new_data(source, tmp_path_factory) -> Path:
    """The in-domain corpus, prepared with the source model's vocabulary."""
    root = tmp_path_factory.mktemp("new")
    corpus = write_corpus(root / "corpus", NEW_LEXICON, seed=1, n_train=300, n_valid=40)
    prepare(root / "data", "de", "en", train=str(corpus / "train"), valid=str(corpus / "valid"), tokenizer=source,
            progress=False)
    return root / "data"


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def test_a_fine_tuned_run_starts_from_the_weights_and_nothing_else(source, new_data, tmp_path):
    # A time budget spent before the first step: the run saves its step-0 state and ends.
    train(config(new_data, max_minutes=1e-9), tmp_path / "zero", progress=False, init=source)
    at_zero = checkpoint.load(tmp_path / "zero" / "last.pt")
    for name, tensor in checkpoint.load(source)["model"].items():
        assert torch.equal(at_zero["model"][name], tensor), name
    assert at_zero["step"] == 0 and at_zero["train"]["optimizer"]["state"] == {}

    cfg = config(new_data, max_steps=1, log_every=1)
    train(cfg, tmp_path / "one", progress=False, init=source)
    first = next(r for r in log_records(tmp_path / "one") if "lr" in r)
    assert first["step"] == 1 and first["lr"] == pytest.approx(learning_rate(1, cfg.train.lr, cfg.train.warmup))
    saved = checkpoint.load(tmp_path / "one" / "last.pt")
    assert {float(s["step"]) for s in saved["train"]["optimizer"]["state"].values()} == {1.0}  # Adam's own count
    assert saved["train"]["position"]["epoch"] == 0 and saved["train"]["position"]["batch"] == 1
    assert saved["init"] == {"from": str(source), "step": checkpoint.load(source)["step"]}


def test_fine_tuning_learns_new_data_faster_than_training_from_scratch(source, new_data, tmp_path):
    tuned = train(config(new_data, max_steps=200), tmp_path / "tuned", progress=False, init=source)
    scratch = train(config(new_data, max_steps=200), tmp_path / "scratch", progress=False)
    assert tuned["valid_loss"] < scratch["valid_loss"]


def test_a_fine_tuned_run_resumes_as_any_run_and_remembers_where_it_started(source, new_data, tmp_path):
    run = tmp_path / "run"
    train(config(new_data, max_steps=20, dropout=0.0), run, progress=False, init=source)
    cfg = config(new_data, max_steps=40)
    train(cfg, run, resume=True, progress=False)
    last = checkpoint.load(run / "last.pt")
    assert last["step"] == 40 and last["init"]["from"] == str(source)
    assert describe(run / "last.pt")["initialized_from"] == last["init"]
    info = CliRunner().invoke(app, ["info", str(run / "best.pt")])
    assert re.search(rf"^init +{re.escape(str(source))} \(step \d+; fine-tuned from it\)$",
                     info.output, re.M), info.output


def test_dropout_may_change_but_the_architecture_may_not(source, new_data, tmp_path):
    cfg = config(new_data, max_minutes=1e-9)
    cfg.model.dropout, cfg.model.attn_dropout = 0.3, 0.1
    train(cfg, tmp_path / "dropout", progress=False, init=source)
    cfg.model.d_model, cfg.model.norm = 64, "pre"
    with pytest.raises(MtError, match=r"model\.d_model=64 \(the checkpoint's: 32\), model\.norm=pre"):
        train(cfg, tmp_path / "wider", progress=False, init=source)
    assert not (tmp_path / "wider").exists()


def cli_train(tmp_path: Path, cfg: Config, *args: str):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)), encoding="utf-8")
    return CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "run"), "-q", *args])


def test_data_with_another_vocabulary_is_refused_with_the_command_that_fixes_it(source, new_data, tmp_path):
    corpus = new_data.parent / "corpus"
    own = tmp_path / "own"
    prepare(own, "de", "en", train=str(corpus / "train"), valid=str(corpus / "valid"), vocab_size=48, progress=False)
    result = cli_train(tmp_path, config(own, max_steps=1), "--init", str(source))
    assert_refused(result, f"{own}: prepared with another src vocabulary than {source}", "48 pieces",
                   f"--tokenizer {source} --out {own}")
    assert not (tmp_path / "run").exists()


def test_data_whose_recorded_tokenizer_hash_differs_is_refused(source, new_data, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for path in new_data.iterdir():
        (data / path.name).write_bytes(path.read_bytes())
    meta = json.loads((data / "meta.json").read_text())
    meta["tokenizer"]["sha256"]["tgt"] = "0" * 64  # as if encoded with another model's vocabulary
    (data / "meta.json").write_text(json.dumps(meta))
    assert_refused(cli_train(tmp_path, config(data, max_steps=1), "--init", str(source)),
                   "another tgt vocabulary", "--tokenizer")


def test_data_in_other_languages_is_refused(source, new_data, tmp_path):
    corpus = new_data.parent / "corpus"
    swapped = tmp_path / "en_de"
    prepare(swapped, "en", "de", train=str(corpus / "train"), valid=str(corpus / "valid"), tokenizer=source,
            progress=False)
    assert_refused(cli_train(tmp_path, config(swapped, max_steps=1), "--init", str(source)),
                   "its languages are en→de", "translates de→en")
    assert not (tmp_path / "run").exists()


def test_init_with_resume_and_a_file_that_is_not_a_checkpoint_are_refused(source, new_data, tmp_path):
    result = CliRunner().invoke(app, ["train", "--resume", "--out", str(tmp_path), "--init", str(source)])
    assert_refused(result, "--init starts a new run", "give one of them")
    junk = tmp_path / "notes.pt"
    junk.write_text("not a checkpoint\n")
    assert_refused(cli_train(tmp_path, config(new_data, max_steps=1), "--init", str(junk)),
                   f"{junk}: not a readable mt checkpoint")
    assert not (tmp_path / "run").exists()
