"""The report of a finished run: test scores with signatures, training time, steps and epochs, written once."""

import json
import statistics

import pytest
import sacrebleu

from mt import checkpoint
from mt.data.lines import read_text
from mt.data.prepare import prepare
from mt.decode.evaluate import score
from mt.errors import MtError
from mt.report import report_run
from mt.train.log import read_log
from mt.train.loop import train

from .conftest import write_corpus
from .train.test_loop import small_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = write_corpus(tmp_path_factory.mktemp("corpus"), n_train=200, n_valid=12)
    data = root / "data"
    prepare(data, "de", "en", train=str(root / "train"), valid=str(root / "valid"), test=str(root / "valid"),
            vocab_size=40, progress=False)
    out = root / "run"
    train(small_config(data, max_steps=12, valid_every=6), out, progress=False)
    return out


def test_the_report_scores_the_test_split_and_is_written_beside_the_run(run):
    report = report_run(run, run / "best.pt", "cpu")
    assert json.loads((run / "report.json").read_text(encoding="utf-8")) == report
    data = checkpoint.load(run / "best.pt")["config"]["data"]
    hyps, refs = read_text(run / "test.hyp.txt"), read_text(f"{data}/test.tgt.txt")
    assert report["test"]["sentences"] == len(refs) == len(hyps) == 12
    cased, lower = score(hyps, refs), score(hyps, refs, lowercase=True)
    assert (report["bleu"], report["bleu_lc"], report["chrf"]) == (cased["bleu"]["score"],
                                                                  lower["bleu"]["score"], cased["chrf"]["score"])
    assert report["signatures"]["bleu_lc"] == lower["bleu"]["signature"]
    bleu = sacrebleu.corpus_bleu(hyps, [refs])  # its tokens: output length over the reference's
    assert report["length_ratio"] == round(bleu.sys_len / bleu.ref_len, 3)
    last = checkpoint.load(run / "last.pt")["train"]["position"]
    assert report["steps"] == last["step"] == 12
    assert last["epoch"] <= report["epochs"] <= last["epoch"] + 1  # whole epochs and a share of the current one
    speeds = [r["tgt_tok_per_s"] for r in read_log(run / "log.jsonl") if "tgt_tok_per_s" in r]
    assert len(speeds) >= 2 and report["tgt_tokens_per_s"] == round(statistics.median(speeds))


def test_a_missing_final_checkpoint_says_how_to_make_it(run):
    with pytest.raises(MtError, match=rf"{run / 'final.pt'}: not found; make it first, e.g. `mt average"):
        report_run(run, None, "cpu")


def test_data_without_a_test_split_is_a_clear_error(tmp_path, run):
    state = checkpoint.load(run / "best.pt")
    state["config"] = {**state["config"], "data": str(tmp_path)}
    checkpoint.save(state, tmp_path / "final.pt")
    with pytest.raises(MtError, match="no test split .*prepare the data with --test"):
        report_run(run, tmp_path / "final.pt", "cpu")
