"""What the lab's commands share (attnlab.lab.commands, attnlab.lab.errors): the task help,
``--list-options``, the ``--device`` / ``--precision`` options and the one-line errors."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from attnlab._checks import ConfigError
from attnlab.lab.commands import (
    DEVICE_HELP,
    NonEmpty,
    TaskHelpCommand,
    describe_task_of,
    device_option,
    precision_option,
)
from attnlab.lab.errors import fail


@click.command("probe", cls=TaskHelpCommand, syntax=[("-a tanh", "one spec")])
@device_option()
@precision_option("fp32 or bf16.")
def probe(device: str, precision: str) -> None:
    """A command on a task."""
    click.echo(f"{device} {precision}")
    if device == "bad":
        fail("the device is bad")
    if device == "gone":
        fail("no data", code=1)


def test_the_options_and_their_defaults():
    runner = CliRunner()
    assert runner.invoke(probe, []).output == "auto fp32\n"
    assert runner.invoke(probe, ["--device", "cpu", "--precision", "bf16"]).output == "cpu bf16\n"
    help_text = runner.invoke(probe, ["--help"]).output
    assert "auto (CUDA when available" in help_text and DEVICE_HELP.startswith("auto")
    assert "fp32 or bf16." in help_text


def test_the_help_lists_the_syntax_and_the_tasks():
    text = CliRunner().invoke(probe, ["--help"]).output
    assert "Typing specs and options" in text and "-a tanh" in text
    assert "Tasks: their attention presets" in text and "sentiment" in text
    assert "attnlab probe TASK --list-options" in " ".join(text.split())


def test_fail_prints_one_error_line_and_exits():
    result = CliRunner().invoke(probe, ["--device", "bad"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == "error: the device is bad"
    assert CliRunner().invoke(probe, ["--device", "gone"]).exit_code == 1


def test_describe_task_of():
    assert describe_task_of("sentiment").startswith("task sentiment")
    with pytest.raises(ConfigError, match=r"unknown task 'nope'; registered tasks: .*sentiment"):
        describe_task_of("nope")


@pytest.mark.parametrize("value", ["", " ", "\t"])
def test_an_empty_out_is_an_error_in_every_command(tmp_path, monkeypatch, value):
    """``--out "$DIR"`` with DIR unset: an error, not the working folder or the default
    (before, ``ablate`` wrote into the working folder and ``report`` raised ValueError)."""
    from attnlab.cli import main

    monkeypatch.chdir(tmp_path)
    for argv in (
        ["train", "sentiment", "--out", value],
        ["ablate", "sentiment", "-a", "mean", "--out", value],
        ["demo", "--out", value],
        ["report", str(tmp_path), "--out", value],
    ):
        res = CliRunner().invoke(main, argv)
        assert res.exit_code == 2, (argv, res.output)
        assert (
            "Invalid value for '--out': is empty: give a path, or leave the option out for its "
            "default" in res.output
        ), argv
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_non_empty_keeps_the_inner_type():
    kind = NonEmpty(click.IntRange(min=1))
    assert kind.convert("3", None, None) == 3
    with pytest.raises(click.BadParameter, match="is empty"):
        kind.convert("", None, None)
    with pytest.raises(click.BadParameter, match="not in the range"):
        kind.convert("0", None, None)
    assert NonEmpty().convert("runs/x", None, None) == "runs/x"
