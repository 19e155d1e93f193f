import io
import json

import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from mt.cli import app
from mt.errors import MtError
from mt.plot import DPI, FIGSIZE, minutes, plot_runs
from mt.train.log import read_log

from .train.test_loop import prepared, small_config  # noqa: F401  (prepared is a fixture)


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory):  # noqa: F811
    """A real (tiny) training run: its log.jsonl is what `mt plot` must read."""
    from mt.train.loop import train

    out = tmp_path_factory.mktemp("runs") / "tiny"
    train(small_config(prepared, max_steps=4, valid_every=2, log_every=1), out, progress=False)
    return out


def write_log(run_dir, lines):
    run_dir.mkdir(parents=True)
    (run_dir / "log.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return run_dir


def test_two_runs_make_one_png_of_the_expected_size(run, tmp_path):
    other = write_log(tmp_path / "other", [
        json.dumps({"step": 5, "epoch": 0, "loss": 4.0, "lr": 1e-4, "tgt_tok_per_s": 900.0}),
        json.dumps({"step": 5, "epoch": 0, "valid_loss": 3.9, "valid_ppl": 49.4, "valid_bleu": 1.5})])
    out = plot_runs([run, other], tmp_path / "plots" / "curves.png")
    image = imread(out)
    assert image.shape[:2] == (FIGSIZE[1] * DPI, FIGSIZE[0] * DPI)
    assert image.std() > 0  # something was drawn
    assert [p.name for p in out.parent.iterdir()] == ["curves.png"]  # no temporary file left behind


def test_malformed_lines_are_skipped_with_a_warning_naming_the_line(tmp_path):
    run_dir = write_log(tmp_path / "r", [json.dumps({"step": 2, "loss": 3.0}), '{"step": 4, "lo',
                                         "[1, 2]", json.dumps({"step": 4, "loss": 2.5})])
    warn = io.StringIO()
    records = read_log(run_dir / "log.jsonl", warn)
    assert [r["step"] for r in records] == [2, 4]
    assert f"{run_dir / 'log.jsonl'}:2" in warn.getvalue() and f"{run_dir / 'log.jsonl'}:3" in warn.getvalue()


def test_a_resumed_runs_repeated_steps_keep_the_later_record(tmp_path):
    run_dir = write_log(tmp_path / "r", [json.dumps({"step": 2, "loss": 3.0}), json.dumps({"step": 2, "loss": 2.0}),
                                         json.dumps({"step": 2, "valid_loss": 2.9})])
    records = read_log(run_dir / "log.jsonl")
    assert [r.get("loss") for r in records] == [2.0, None]


def test_a_directory_without_a_log_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(MtError, match="log.jsonl: not found"):
        plot_runs([tmp_path], tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_mt_plot_command(run, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["plot", str(run), "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert imread(tmp_path / "c.png").shape[:2] == (FIGSIZE[1] * DPI, FIGSIZE[0] * DPI)
    result = runner.invoke(app, ["plot", str(tmp_path / "nope"), "--out", str(tmp_path / "d.png")])
    assert result.exit_code == 2 and "nope/log.jsonl" in result.output


def test_against_minutes_each_record_is_placed_by_the_validations_elapsed_time(tmp_path):
    records = [{"step": 50, "loss": 3.0}, {"step": 100, "valid_loss": 2.9, "elapsed": 120.0},
               {"step": 150, "loss": 2.0}, {"step": 200, "valid_loss": 2.5, "elapsed": 300.0}]
    assert minutes(records) == [1.0, 2.0, 3.5, 5.0]
    run_dir = write_log(tmp_path / "r", [json.dumps(r) for r in records])
    result = CliRunner().invoke(app, ["plot", str(run_dir), "--x", "minutes", "--out", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert imread(tmp_path / "c.png").std() > 0


def test_a_log_kept_apart_from_its_run_plots_as_the_run_does(run, tmp_path):
    kept = tmp_path / "logs" / f"{run.name}.jsonl"  # docs/logs/: the runs the docs compare
    kept.parent.mkdir()
    kept.write_bytes((run / "log.jsonl").read_bytes())
    from_run = imread(plot_runs([run], tmp_path / "run.png"))
    from_log = imread(plot_runs([kept], tmp_path / "log.png"))
    assert (from_run == from_log).all()  # same curves, same legend label
