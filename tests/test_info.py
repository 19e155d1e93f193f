import json

import pytest
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.config import from_dict
from mt.info import describe, render
from mt.model.transformer import Transformer, count_parameters

from .conftest import tiny_model
from .test_checkpoint import state_for


@pytest.fixture
def saved(tmp_path, tokenizer):
    """A checkpoint with what `mt train` stores besides the weights: languages, step and validation metrics."""
    model = tiny_model(vocab=tokenizer.vocab_size, share_embeddings=False, tie_output=False)
    state = state_for(model, tokenizer) | {
        "langs": {"src": "de", "tgt": "en"}, "step": 1200,
        "metrics": {"step": 1000, "epoch": 3, "valid_loss": 2.5, "valid_ppl": 12.18, "valid_bleu": 31.25}}
    checkpoint.save(state, tmp_path / "best.pt")
    return tmp_path / "best.pt", state


def test_parameter_count_is_that_of_the_rebuilt_model(saved):
    path, state = saved
    d = describe(path)
    assert d["parameters"] == count_parameters(Transformer(from_dict(state["config"]).model))
    assert d["languages"] == {"src": "de", "tgt": "en"} and d["step"] == 1200
    assert d["metrics"]["valid_bleu"] == 31.25 and d["vocabulary"]["joint"]
    assert d["architecture"]["n_enc_layers"] == 2 and d["config"] == state["config"]


def test_the_table_is_aligned_and_shows_the_headlines(saved):
    path, _ = saved
    d = describe(path)
    table = render(d)
    rows = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert f"{d['parameters']:,}" in rows["parameters"]
    assert "de → en" in rows["languages"] and "1,200" in rows["step"]
    assert "31.25" in rows["valid_bleu"] and "at step 1,000" in rows["validation"]
    assert rows["model.d_model"].split()[1] == "32"
    value_columns = {len(line) - len(line.lstrip()[len(key):].lstrip()) for key, line in rows.items()
                     if len(line.split()) > 1}
    assert len(value_columns) == 1  # every value starts in the same column


def test_mt_info_command(saved, tmp_path):
    path, _ = saved
    runner = CliRunner()
    result = runner.invoke(app, ["info", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["parameters"] == describe(path)["parameters"]
    assert runner.invoke(app, ["info", str(path)]).stdout == render(describe(path)) + "\n"
    missing = runner.invoke(app, ["info", str(tmp_path / "none.pt")])
    assert missing.exit_code == 2 and "none.pt" in missing.output
