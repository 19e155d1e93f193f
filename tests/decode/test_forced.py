import pytest
import torch
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app
from mt.data.tokenizer import BOS, EOS
from mt.decode.forced import score_pairs
from mt.errors import MtError

from ..test_checkpoint import state_for

SOURCES = ["the cat sat on the mat", "a dog", "", "big red tree"]
TARGETS = ["a cat", "the small blue dog runs under the tree", "the", ""]


@torch.inference_mode()
def by_hand(loaded, source: str, target: str) -> float:
    """An independent path: encode once, then feed the target token by token through the KV cache."""
    model = loaded.model
    src = torch.tensor([loaded.src_tok.encode([source])[0] + [EOS]])
    memory, src_mask = model.encode(src)
    cache = model.start_cache(memory, src_mask)
    total, previous = 0.0, BOS
    for token in loaded.tgt_tok.encode([target])[0] + [EOS]:
        logits, cache = model.decode_step(torch.tensor([previous]), cache)
        total += torch.log_softmax(logits[0].double(), dim=-1)[token].item()
        previous = token
    return total


def test_scores_equal_step_by_step_decoding_in_any_batching(loaded):
    expected = [by_hand(loaded, s, t) for s, t in zip(SOURCES, TARGETS, strict=True)]
    assert score_pairs(loaded, SOURCES, TARGETS) == pytest.approx(expected, rel=1e-4)
    assert score_pairs(loaded, SOURCES, TARGETS, batch_tokens=1) == pytest.approx(expected, rel=1e-4)
    assert all(s < 0 for s in expected)


def test_too_long_or_unaligned_input_is_an_error_naming_the_line(loaded):
    with pytest.raises(MtError, match="line 2: the target has"):
        score_pairs(loaded, ["a", "b"], ["a", " ".join(["cat"] * 100)])
    with pytest.raises(MtError, match="line-aligned"):
        score_pairs(loaded, ["a", "b"], ["a"])


def test_mt_score_prints_one_score_per_line(loaded, tmp_path, tokenizer):
    checkpoint.save(state_for(loaded.model, tokenizer), tmp_path / "c.pt")
    (tmp_path / "src").write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    (tmp_path / "tgt").write_text("".join(t + "\n" for t in TARGETS), encoding="utf-8")
    runner = CliRunner()
    args = ["score", "-c", str(tmp_path / "c.pt"), "--src", str(tmp_path / "src"), "--device", "cpu"]
    result = runner.invoke(app, [*args, "--tgt", str(tmp_path / "tgt")])
    assert result.exit_code == 0, result.output
    printed = [float(line) for line in result.stdout.splitlines()]
    assert printed == pytest.approx(score_pairs(loaded, SOURCES, TARGETS), abs=1e-4)
    (tmp_path / "short").write_text("one\n", encoding="utf-8")
    result = runner.invoke(app, [*args, "--tgt", str(tmp_path / "short")])
    assert result.exit_code == 2 and "line-aligned" in result.output
