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

