"""Choosing the decoder's beam size and length penalty on held-out data, saved as the checkpoint's defaults."""

import pytest
import sacrebleu
import torch
from typer.testing import CliRunner

from mt.cli import app
from mt.data.lines import read_text
from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import translate_lines
from mt.decode.tune import grid, held_out, parse_finish, parse_grid, save_tuned, tune
from mt.errors import MtError
from mt.train.loop import train

from ..train.test_loop import prepared, small_config  # noqa: F401  (prepared is a fixture)


@pytest.fixture(scope="module")
def best(prepared, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("run")
    train(small_config(prepared, max_steps=40, lr=3e-3), out, progress=False)
    return out / "best.pt"


def test_greedy_is_tried_once_whatever_the_length_penalty():
    assert grid((1, 4), (0.6, 1.0)) == [(1, 0.6, None, None, None), (4, 0.6, None, None, None),
                                        (4, 1.0, None, None, None)]
    assert grid((1, 4), (0.6,), (0.5, 1.0)) == [(1, 0.6, 0.5, None, None), (4, 0.6, 0.5, None, None),
                                                (4, 0.6, 1.0, None, None)]  # a reranker's weights
    assert grid((1, 4), (0.6,), (None,), (0.0, 0.25)) == [(1, 0.6, None, 0.0, None), (4, 0.6, None, 0.0, None),
                                                          (4, 0.6, None, 0.25, None)]  # a channel model's
    assert grid((1, 4), (0.6,), finish=(False, True)) == [(1, 0.6, None, None, False), (4, 0.6, None, None, False),
                                                          (4, 0.6, None, None, True)]  # a plain beam's stop


def test_the_grid_options_parse_as_numbers_or_fail_in_one_line():
    assert parse_grid("1,5", "0.6,1", "0.5,1") == ((1, 5), (0.6, 1.0), (0.5, 1.0))
    with pytest.raises(MtError, match="expected comma-separated numbers"):
        parse_grid("1,five", "0.6")
    with pytest.raises(MtError, match="at least 1"):
        parse_grid("0,4", "0.6")
    assert parse_finish("no,yes") == (False, True) and parse_finish("yes") == (True,)
    with pytest.raises(MtError, match=r"--finish-all 'true': expected no, yes, or no,yes"):
        parse_finish("true")


def test_tuning_saves_the_best_setting_as_the_checkpoint_default(best, prepared, tmp_path):  # noqa: F811
    loaded = load_model(best)
    sources, refs = read_text(prepared / "valid.src.txt"), read_text(prepared / "valid.tgt.txt")
    results = tune(loaded, sources, refs, torch.device("cpu"), beams=(1, 3), penalties=(0.0, 2.0), progress=False)
    tried = sorted((r["beam"], r["len_penalty"], r.get("finish_all")) for r in results if r["beam"] > 1)
    assert tried == [(3, 0.0, False), (3, 0.0, True), (3, 2.0, False), (3, 2.0, True)]
    assert sum(r["beam"] == 1 for r in results) == 1  # greedy: once
    save_tuned(loaded, results[0], results, tmp_path / "tuned.pt")
    tuned = load_model(tmp_path / "tuned.pt")
    assert (tuned.config.decode.beam, tuned.config.decode.len_penalty) == (results[0]["beam"],
                                                                           results[0]["len_penalty"])
    assert tuned.config.decode.finish_all == results[0].get("finish_all", False)
    hyps = translate_lines(tuned, sources, SearchOptions.from_config(tuned.config.decode), torch.device("cpu"))
    texts = tuned.tgt_tok.decode([h[0].tokens for h in hyps])
    bleu = sacrebleu.corpus_bleu(texts, [refs])
    assert (round(bleu.score, 2), round(bleu.sys_len / bleu.ref_len, 3)) == (results[0]["bleu"],
                                                                             results[0]["length_ratio"])


def test_held_out_data_is_the_valid_split_or_two_aligned_files(best, prepared, tmp_path):  # noqa: F811
    loaded = load_model(best)
    sources, refs = held_out(loaded)
    assert (sources, refs) == (read_text(prepared / "valid.src.txt"), read_text(prepared / "valid.tgt.txt"))
    (tmp_path / "src").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "ref").write_text("one\n", encoding="utf-8")
    with pytest.raises(MtError, match=r"src has 2 lines but .*ref has 1; they must be line-aligned"):
        held_out(loaded, tmp_path / "src", tmp_path / "ref")


def test_mt_tune_prints_each_setting_best_first_and_the_choice(best, tmp_path):
    out = tmp_path / "tuned.pt"
    result = CliRunner().invoke(app, ["tune", "-c", str(best), "-o", str(out), "--beams", "1,2",
                                      "--len-penalties", "0.6,1.0", "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.stderr
    *settings, choice = result.stdout.splitlines()
    assert len(settings) == 5  # greedy once, beam 2 with each penalty, stopping at the best or finishing both
    bleus = [float(line.split()[-1]) for line in settings]
    assert bleus == sorted(bleus, reverse=True)
    decode = load_model(out).config.decode
    assert choice == f"{out}: decodes with beam {decode.beam}, len_penalty {decode.len_penalty}" \
        + (f", finish_all {decode.finish_all}" if decode.beam > 1 else "")
    assert settings[0].split()[1:4:2] == [str(decode.beam), f"{decode.len_penalty:.2f}"]
