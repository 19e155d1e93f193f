"""The whole pipeline through the command line on a slice of Multi30k: prepare → train → translate → evaluate, the
first two each a process of its own, the later steps through Typer's runner (a real process's stdin and stdout are
tests/decode/test_translate.py's)."""

import gzip
import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from mt.cli import app


def mt(*args, stdin=None, cwd=None, check=True):
    result = subprocess.run([sys.executable, "-m", "mt", *map(str, args)], input=stdin, capture_output=True,
                            text=True, cwd=cwd, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"mt {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


def mt_here(*args, stdin=None):
    """A command in this process, through Typer's runner: for the pipeline's later commands, as each process of its
    own costs seconds of importing PyTorch, and the commands before them cross the process boundary already."""
    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    assert result.exit_code == 0, f"mt {' '.join(map(str, args))} exited {result.exit_code}:\n{result.output}"
    return result


def slice_corpus(mirror, out, split, lang, n):
    with gzip.open(mirror / "multi30k" / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(n)]
    (out / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")


def test_prepare_train_translate_evaluate(mirror, tmp_path):
    for split, n in (("train", 3000), ("val", 60), ("test_2016_flickr", 50)):
        for lang in ("de", "en"):
            slice_corpus(mirror, tmp_path, split, lang, n)
    data = tmp_path / "data"
    out = mt("prepare", "--train", tmp_path / "train", "--valid", tmp_path / "val",
             "--test", tmp_path / "test_2016_flickr", "--src", "de", "--tgt", "en", "--vocab-size", 1000,
             "--out", data, "--quiet")
    assert "3,000" in out.stdout or "2,99" in out.stdout
    meta = json.loads((data / "meta.json").read_text())
    assert meta["splits"]["test"]["pairs"] == 50

    run = tmp_path / "run"
    settings = ["model.d_model=64", "model.n_heads=4", "model.n_enc_layers=1", "model.n_dec_layers=1",
                "model.d_ff=128", "train.max_steps=40", "train.valid_every=20", "train.warmup=10",
                "train.max_tokens=1024", f"data={data}"]
    mt("train", "configs/demo.yaml", "--out", run, *[x for s in settings for x in ("--set", s)], "--quiet",
       cwd=None)
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    valids = [entry for entry in log if "valid_loss" in entry]
    assert [v["step"] for v in valids] == [20, 40]
    assert valids[-1]["valid_loss"] < valids[0]["valid_loss"]
    assert (run / "best.pt").is_file() and (run / "last.pt").is_file()

    source = (data / "test.src.txt").read_text(encoding="utf-8").splitlines()[:5]
    text = "\n".join(source[:2] + ["", "   "] + source[2:]) + "\n"
    result = mt_here("translate", "--checkpoint", run / "best.pt", "--beam", 2, stdin=text)
    lines = result.stdout.split("\n")[:-1]
    assert len(lines) == 7 and lines[2] == "" and lines[3] == ""
    assert all(lines[i] for i in (0, 1, 4, 5, 6))

    hyp = tmp_path / "hyp.en"
    mt_here("translate", "--checkpoint", run / "best.pt", "--input", data / "test.src.txt", "--output", hyp)
    assert len(hyp.read_text(encoding="utf-8").splitlines()) == 50
    report = mt_here("evaluate", "--hyp", hyp, "--ref", data / "test.tgt.txt", "--json")
    scores = json.loads(report.stdout)
    assert "nrefs:1" in scores["bleu"]["signature"] and scores["sentences"] == 50
    direct = mt_here("evaluate", "--checkpoint", run / "best.pt", "--src", data / "test.src.txt",
                     "--ref", data / "test.tgt.txt", "--json")
    assert json.loads(direct.stdout)["bleu"]["score"] == pytest.approx(scores["bleu"]["score"])

    mt_here("train", "--resume", "--out", run, "--set", "train.max_steps=60", "--quiet")

    # The recipe's last steps: average, choose the decoder on valid, report on test.
    averaged = mt_here("average", run, "--last", 2, "--out", run / "final.pt")
    assert "steps 40, 60" in averaged.stdout
    tuned = mt_here("tune", "--checkpoint", run / "final.pt", "--out", run / "final.pt", "--beams", "1,2",
                    "--len-penalties", "0.6,1.0", "--quiet").stdout.splitlines()
    assert len(tuned) == 6  # greedy once, beam 2 with each penalty and each stop (finish_all), and the choice
    report = json.loads(mt_here("report", run).stdout)
    assert report == json.loads((run / "report.json").read_text())
    assert report["steps"] == 60 and report["test"]["sentences"] == 50 and report["averaged_steps"] == [40, 60]
    assert report["bleu_lc"] >= report["bleu"] and "case:lc" in report["signatures"]["bleu_lc"]
    best = tuned[0].split()  # "beam B  len_penalty A  [finish_all]  BLEU X  length R", best first
    assert report["decode"] == {"beam": int(best[1]), "len_penalty": float(best[3])} \
        | ({"finish_all": "finish_all" in best} if int(best[1]) > 1 else {})
    assert len((run / "test.hyp.txt").read_text(encoding="utf-8").splitlines()) == 50


def test_bad_input_is_a_one_line_error_with_exit_code_2(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\n")
    result = mt("prepare", "--train", tmp_path / "a", "--out", tmp_path / "out", "--quiet", check=False)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "a.de" in result.stderr and "a.en" in result.stderr
    assert not (tmp_path / "out").exists()
    result = mt("train", tmp_path / "missing.yaml", check=False)
    assert result.returncode == 2 and "missing.yaml" in result.stderr
    result = mt("translate", "--checkpoint", tmp_path / "none.pt", stdin="x\n", check=False)
    assert result.returncode == 2 and "none.pt" in result.stderr


def test_version_and_each_commands_usage_from_the_installed_entry_point():
    from mt import __version__

    assert mt("--version").stdout == f"mt {__version__}\n"
    for command in ("prepare", "train", "translate", "evaluate", "average", "tune", "report", "score"):
        assert mt(command, "--help").stdout.startswith(f"Usage: mt {command} [OPTIONS]")


def test_the_command_line_starts_without_importing_torch():
    # `mt --help` and the defaults the CLI reads from the library must not wait for torch to load.
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", "import mt.cli"], capture_output=True,
                            text=True, check=True)
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "mt.data.prepare" in imported and "mt.decode.tune" in imported
    assert not [name for name in imported if name.split(".")[0] == "torch"]
