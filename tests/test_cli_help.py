"""Every command, argument and option explains itself in --help (Typer adds the defaults)."""

import click
import typer
from typer.testing import CliRunner

from mt.cli import app


def all_commands(command: click.Command, path: str = "mt"):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from all_commands(sub, f"{path} {name}")


def test_every_command_and_option_has_help_text():
    root = typer.main.get_command(app)
    missing = [f"{path} {param.name}" for path, command in all_commands(root) for param in command.params
               if not getattr(param, "help", None)]
    missing += [path for path, command in all_commands(root) if not command.help]
    assert not missing, f"no help text: {', '.join(missing)}"


def test_help_lists_the_commands_and_shows_defaults():
    runner = CliRunner()
    top = runner.invoke(app, ["--help"]).stdout
    for command in ("plot", "info", "score", "translate", "--install-completion", "--version"):
        assert command in top
    assert "[default: curves.png]" in runner.invoke(app, ["plot", "--help"]).stdout
    # Defaults written into the help text by hand survive the formatting too.
    assert "[default: stdin]" in runner.invoke(app, ["translate", "--help"], terminal_width=200).stdout


def test_mt_tune_without_grid_options_tries_the_library_grid():
    # The CLI spells the grid as strings (it imports mt.tune, and torch with it, only when the command runs).
    from mt.tune import DEFAULT_BEAMS, DEFAULT_PENALTIES

    tune = typer.main.get_command(app).commands["tune"]
    defaults = {param.name: param.default for param in tune.params}
    assert tuple(int(b) for b in defaults["beams"].split(",")) == DEFAULT_BEAMS
    assert tuple(float(a) for a in defaults["len_penalties"].split(",")) == DEFAULT_PENALTIES
