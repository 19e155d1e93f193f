"""No command writes over, or deletes, what it reads: an output that is an input, or a directory that holds one,
is one `error:` line naming both, before anything is written (mt.data.lines.check_not_input). End to end, per
command."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mt import checkpoint
from mt.cli import app

from .conftest import tiny_model, write_corpus
from .test_checkpoint import state_for


@pytest.fixture
def run(tokenizer, tmp_path) -> Path:
    """A run directory as `mt train` leaves it: best.pt and two numbered checkpoints (one tiny model each)."""
    directory = tmp_path / "run"
    checkpoint.save(state_for(tiny_model(vocab=tokenizer.vocab_size), tokenizer), directory / "best.pt")
    for step in (10, 20):
        (directory / f"checkpoint-{step}.pt").write_bytes((directory / "best.pt").read_bytes())
    (directory / "in.txt").write_text("the cat sat\na dog\n", encoding="utf-8")
    return directory


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def refused(root: Path, *args: object, output: object, given: object) -> None:
    """`mt ARGS` is refused in one line that names `output` and the input `given`, and changes nothing in `root`."""
    before = files(root)
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 2, (result.output, result.exception)
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f" {output} " in result.stderr and f"the input {given}" in result.stderr, result.stderr
    assert "choose another path" in result.stderr
    assert files(root) == before


def test_export_with_force_never_replaces_the_directory_that_holds_its_checkpoint(run):
    best = run / "best.pt"
    for force in (["--force"], []):
        refused(run.parent, "export", best, "--to", "ctranslate2", "--out", run, *force, output=run, given=best)
        refused(run.parent, "export", best, "--to", "ctranslate2", "--out", run.parent, *force, output=run.parent,
                given=best)
    refused(run.parent, "export", best, "--to", "huggingface", "--out", best, "--force", output=best, given=best)


def test_average_does_not_write_over_a_checkpoint_it_averages(run):
    out = run / "checkpoint-20.pt"
    refused(run.parent, "average", run, "--out", out, "--last", 2, output=out, given=out)


def test_ensemble_does_not_write_over_a_member(run):
    a, b = run / "checkpoint-10.pt", run / "checkpoint-20.pt"
    refused(run.parent, "ensemble", a, b, "--out", b, output=b, given=b)


def test_tune_does_not_write_over_its_held_out_text(run):
    src = run / "in.txt"
    refused(run.parent, "tune", "-c", run / "best.pt", "--out", src, "--src", src, "--ref", src, output=src, given=src)


def test_translate_writes_neither_over_its_checkpoint_nor_alignments_over_its_input(run):
    best, src = run / "best.pt", run / "in.txt"
    refused(run.parent, "translate", "-c", best, "-i", src, "--output", best, output=best, given=best)
    refused(run.parent, "translate", "-c", best, "-i", src, "--alignments", src, output=src, given=src)


def test_translate_may_still_translate_a_file_in_place(run):
    src = run / "in.txt"
    result = CliRunner().invoke(app, ["translate", "-c", str(run / "best.pt"), "-i", str(src), "-o", str(src)])
    assert result.exit_code == 0, result.output
    assert len(src.read_text(encoding="utf-8").splitlines()) == 2  # translations now, one per line as before


def test_prepare_never_replaces_a_directory_that_holds_its_corpus_or_its_tokenizer(run, tmp_path):
    corpus = write_corpus(tmp_path / "corpus", n_train=20, n_valid=5)
    refused(tmp_path, "prepare", "--train", corpus / "train", "--out", corpus, "-q", output=corpus,
            given=corpus / "train.de")
    data = tmp_path / "data"  # an earlier prepared directory, which prepare would otherwise replace
    data.mkdir()
    (data / "meta.json").write_text("{}\n", encoding="utf-8")
    (data / "spm.model").write_bytes(b"pieces")
    refused(tmp_path, "prepare", "--train", corpus / "train", "--tokenizer", data / "spm.model", "--out", data, "-q",
            output=data, given=data / "spm.model")
