"""A right-to-left model (`model.right_to_left`): trained on targets read last piece first, it still writes and
scores text in reading order, and what cannot turn its output around refuses it."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from mt import checkpoint
from mt.data.batches import collate, step_batches, valid_split
from mt.data.ids import Split
from mt.data.tokenizer import EOS, PAD
from mt.decode.forced import score_pairs
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines
from mt.errors import MtError
from mt.export.convert import export

from .train.test_loop import ROOT, prepared, small_config  # noqa: F401  (prepared is a fixture)


def targets(cfg) -> list[list[int]]:
    """The target pieces (EOS and padding cut) of the first training step's batches under `cfg`."""
    step = next(step_batches([Split(cfg.data, "train")], cfg, epoch=0, batch=0, world=1, rank=0))
    rows = torch.cat([b.tgt_out for b in step.batches]).tolist()
    return [[t for t in row if t not in (EOS, PAD)] for row in rows]


def test_its_training_batches_hold_every_target_last_piece_first(prepared):  # noqa: F811
    forwards, backwards = small_config(prepared), small_config(prepared)
    backwards.model.right_to_left = True
    read = targets(backwards)
    assert read == [row[::-1] for row in targets(forwards)]
    assert any(row != row[::-1] for row in read)  # not all palindromes: the test can tell the orders apart


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):  # noqa: F811
    from mt.train.loop import train

    cfg = small_config(prepared, max_steps=80, valid_every=80)  # enough to write sentences, not one piece
    cfg.model.right_to_left = True
    run = tmp_path_factory.mktemp("runs") / "r2l"
    train(cfg, run, progress=False)
    return run / "last.pt"


def sources(prepared) -> list[str]:  # noqa: F811
    return (prepared / "valid.src.txt").read_text(encoding="utf-8").splitlines()[:12]


def test_it_translates_in_reading_order(trained, prepared):  # noqa: F811
    loaded = load_model(trained, "cpu")
    opts = SearchOptions.from_config(loaded.config.decode, beam=3)
    written = [hyps[0].tokens for hyps in translate_lines(loaded, sources(prepared), opts, torch.device("cpu"))]
    loaded.model.cfg.right_to_left = False  # the same weights, their pieces shown in the order generated
    generated = [hyps[0].tokens for hyps in translate_lines(loaded, sources(prepared), opts, torch.device("cpu"))]
    assert written == [tokens[::-1] for tokens in generated]
    assert any(tokens != tokens[::-1] for tokens in written)


def test_it_scores_a_pair_as_training_read_it(trained, prepared):  # noqa: F811
    loaded = load_model(trained, "cpu")
    split = valid_split(prepared, right_to_left=True)  # as validation reads it: targets last piece first
    batch = collate(split, np.arange(12), loaded.model.cfg.max_len)
    with torch.inference_mode():
        logp = torch.log_softmax(loaded.model(batch.src, batch.tgt_in).float(), dim=-1)
    trained_on = logp.gather(-1, batch.tgt_out[:, :, None]).squeeze(-1).masked_fill(batch.tgt_out == PAD, 0).sum(1)
    refs = (prepared / "valid.tgt.txt").read_text(encoding="utf-8").splitlines()[:12]
    assert score_pairs(loaded, sources(prepared), refs) == pytest.approx(trained_on.tolist(), abs=1e-3)


def test_exporting_it_is_refused_with_the_reason(trained, tmp_path):
    with pytest.raises(MtError, match=r"right-to-left model .* export the left-to-right model"):
        export(trained, "ctranslate2", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_reranking_without_its_scores_keeps_the_beams_choice(trained, prepared, tmp_path):  # noqa: F811
    """benchmarks/rerank_valid.py, which measures the lever: at weight 0 and the search's length penalty, the
    reranked K best give what the search chose."""
    from mt.train.loop import train

    train(small_config(prepared, max_steps=80, valid_every=80), tmp_path / "l2r", progress=False)
    decode = checkpoint.load(tmp_path / "l2r" / "last.pt")["config"]["decode"]
    out = tmp_path / "chosen.txt"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rerank_valid.py"),
                             str(tmp_path / "l2r" / "last.pt"), str(trained), "--beams", str(decode["beam"]),
                             "--weights", "0,1", "--penalties", str(decode["len_penalty"]), "--out", str(out)],
                            capture_output=True, text=True, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    tuned = float(re.search(r"tuned \(.*\): ([\d.]+)", result.stdout).group(1))
    assert float(re.search(r"'w 0 a [\d.]+': ([\d.]+)", result.stdout).group(1)) == tuned
    assert (len(out.read_text(encoding="utf-8").splitlines())
            == len((prepared / "valid.src.txt").read_text().splitlines()))


def test_served_it_translates_as_mt_translate_does_and_refuses_alignments(trained, prepared, tmp_path):  # noqa: F811
    from .serve.test_app import client, mt_translate, run, serve_app

    lines = sources(prepared)[:4]
    app = serve_app(trained)

    async def go():
        async with client(app) as c:
            plain = await c.post("/v1/translate", json={"text": lines})
            aligned = await c.post("/v1/translate", json={"text": lines, "alignments": True})
            return plain.json(), aligned

    plain, aligned = run(go())
    assert [t["text"] for t in plain["translations"]] == mt_translate(trained, lines, tmp_path)
    assert aligned.status_code == 400 and "right-to-left" in aligned.json()["error"]
