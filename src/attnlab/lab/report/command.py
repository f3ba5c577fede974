"""``attnlab report DIR``: the click command that writes the report and prints its path."""

from __future__ import annotations

from pathlib import Path

import click

from attnlab._checks import ConfigError
from attnlab.lab.commands import NonEmpty
from attnlab.lab.errors import failing_on
from attnlab.lab.report.data import ReportError
from attnlab.lab.report.page import write_report

__all__ = ["report_command"]


@click.command("report")
@click.argument(
    "directory", metavar="DIR", type=NonEmpty(click.Path(file_okay=True, path_type=Path))
)
@click.option(
    "--out",
    type=NonEmpty(click.Path(dir_okay=False, path_type=Path)),
    default=None,
    help="The HTML file to write (default: DIR/report.html).",
)
@click.option("--title", default=None, help="The page title.")
@click.option(
    "--max-examples",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Attention examples drawn per mechanism.",
)
def report_command(directory: Path, out: Path | None, title: str | None, max_examples: int) -> None:
    """Write a self-contained HTML report of DIR -- a run directory, an ablation directory
    or a folder of run directories (runs/<task> of attnlab train) -- with the ablation
    table, learning curves, attention heatmaps on test examples and cost; print its path.

    A run of an ablation whose files cannot be read is skipped with a warning on stderr.
    """

    def warn(message: str) -> None:
        click.echo(f"warning: {message}", err=True)

    # no such directory, neither kind of directory, a damaged file of a single run, or a
    # file in the way of --out (found before anything is read): one line, exit 2
    with failing_on(FileNotFoundError, ReportError, ConfigError):
        target = write_report(
            directory, out, title=title, max_examples=max_examples, on_warning=warn
        )
    click.echo(str(target))
