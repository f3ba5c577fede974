"""The ``attnlab`` command (built on click).

* ``attnlab list`` prints every registered mechanism and task with its formula, cost and
  source (``--kind``, ``--json``).
* ``attnlab path`` builds an :class:`attnlab.Attention` from options and says which
  implementation path it takes and why.
* ``attnlab train TASK`` trains one run per seed (:func:`attnlab.lab.training.train_run`)
  and prints the test metrics and the run directories.
* ``attnlab ablate``, ``attnlab demo``, ``attnlab report``, ``attnlab aer`` and
  ``attnlab explain RUN_DIR`` (the attention-as-explanation tests) come from their own
  modules (:data:`LAZY_COMMANDS`), imported only when used.

Errors in what the user typed (a bad option, spec, task or device) print ``error: ...`` on
stderr and exit with status 2; missing data exits with status 1.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from attnlab import __version__
from attnlab.lab.commands import (
    PRECISION_HELP,
    NonEmpty,
    TaskHelpCommand,
    compile_option,
    describe_task_of,
    device_option,
    import_plugins_or_fail,
    plugin_option,
    precision_option,
)
from attnlab.lab.errors import error_message, fail, warnings_as_notes

__all__ = ["KIND_TITLES", "LAZY_COMMANDS", "LAZY_HELP", "TaskHelpCommand", "main", "profile_line"]

KIND_TITLES = {
    "score": "Score functions (survey 3.2.1)",
    "align": "Alignment functions (survey 3.2.2)",
    "dim": "Attention dimensionality (survey 3.2.3)",
    "attention": "Attention modules",
    "feature": "Feature-related attention (survey 3.1)",
    "query": "Query-related attention (survey 3.3)",
    "model": "Task models (survey section 2: feature, query, attention and output model)",
    "task": "Tasks of the lab (survey section 2 on real data)",
}

#: Commands defined in other modules: name -> (module, attribute). A command whose module
#: does not exist (yet) is left out; any other import error propagates.
LAZY_COMMANDS = {
    "ablate": ("attnlab.lab.ablation", "ablate_command"),
    "demo": ("attnlab.lab.demo", "demo_command"),
    "report": ("attnlab.lab.report", "report_command"),
    "aer": ("attnlab.evaluation.aer", "aer_command"),
    "explain": ("attnlab.lab.studies.explanation", "explain_command"),
    "correctness": ("attnlab.lab.studies.vqa_correctness", "correctness_command"),
    "aer-table": ("attnlab.lab.studies.alignment", "aer_table_command"),
}
#: What ``attnlab --help`` says of a lazy command without importing its module.
LAZY_HELP = {
    "ablate": "Run every attention spec x every seed on a task; resumable.",
    "demo": "The default main job: a small sentiment ablation and its report.",
    "report": "Write a self-contained HTML report of a run, an ablation or a folder of runs.",
    "aer": "Alignment error rate of predicted word alignments against gold ones.",
    "explain": "Attention-as-explanation tests (Jain & Wallace; Wiegreffe & Pinter) on a run.",
    "correctness": "Attention correctness of a VQA run on easy-VQA (mass on the shape, Spearman).",
    "aer-table": "AER of a translation ablation's attention vs silver alignments, with baselines.",
}


def _module_missing(error: ModuleNotFoundError, module: str) -> bool:
    """Whether ``error`` says that ``module`` itself (or a package above it inside attnlab)
    does not exist, as opposed to something it imports being missing."""
    parts = module.split(".")
    own = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
    return error.name in own


def _load_lazy(name: str) -> click.Command | None:
    module, attr = LAZY_COMMANDS[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as error:
        if _module_missing(error, module):
            return None
        raise
    command = getattr(mod, attr)
    if not isinstance(command, click.Command):
        raise TypeError(f"{module}.{attr} must be a click command, got {type(command).__name__}")
    return command


class _Group(click.Group):
    """The top-level group: adds the lazy commands, shows attnlab's warnings as one line
    ``note: ...`` each (:func:`~attnlab.lab.errors.warnings_as_notes`) and ends quietly on a
    closed pipe."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = set(super().list_commands(ctx))
        for name, (module, _) in LAZY_COMMANDS.items():
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if found:
                names.add(name)
        return sorted(names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            command = _load_lazy(cmd_name)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None and not isinstance(command, click.Group):
            _refuse_repeated_options(command, ctx, name, rest)
        return name, command, rest

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # the lazy commands are described without importing them, so --help stays fast
        rows = []
        for name in self.list_commands(ctx):
            if name in LAZY_COMMANDS and name not in self.commands:
                rows.append((name, LAZY_HELP[name]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        with warnings_as_notes():
            return super().invoke(ctx)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except BrokenPipeError:  # e.g. `attnlab list | head`: the reader went away
            sys.stderr.close()
            return 0


def _refuse_repeated_options(
    command: click.Command, ctx: click.Context, name: str | None, args: list[str]
) -> None:
    """End the command with ``error: --out is given 2 times ...`` (status 2) when an option
    that takes one value is given more than once in ``args``: click would silently keep
    the last one. Arguments click cannot parse are left to its own parsing, which says why."""
    sub = click.Context(command, parent=ctx, info_name=name, resilient_parsing=True)
    try:
        _opts, _rest, order = command.make_parser(sub).parse_args(list(args))
    except click.UsageError:
        return
    single = [p for p in order if isinstance(p, click.Option) and not _takes_many(p)]
    for param in dict.fromkeys(single):
        times = single.count(param)
        if times > 1:
            fail(f"{'/'.join(param.opts)} is given {times} times; it takes one value: give it once")


def _takes_many(option: click.Option) -> bool:
    """Whether repeating ``option`` is meaningful (``multiple``, a count) or harmless (a
    flag: the last one given wins, as on/off pairs such as ``--report/--no-report`` mean)."""
    return bool(option.multiple or option.count or option.is_flag)


#: How ``--attention`` and ``-o`` are typed (the ``train`` and ``ablate`` help).
SPEC_SYNTAX = (
    (
        "-a score=additive,align=sparsemax",
        "one attention spec: key=value pairs joined by ','",
    ),
    ("-a tanh,d_w=32", "a preset, refined by key=value pairs"),
    ("-o epochs=3 -o encoder=cnn", "one task option per -o; repeat -o for several"),
    ("-o channels=[8;16]", "a list value: items joined by ';' in brackets"),
)


@click.group(name="attnlab", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="attnlab", message="%(prog)s %(version)s")
def main() -> None:
    """Attention mechanisms of the survey literature, and a lab to compare them."""


# ----------------------------------------------------------------------------- list


@main.command("list")
@click.option("--kind", metavar="KIND", help="only this kind (score, align, dim, task, ...)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_command(kind: str | None, as_json: bool) -> None:
    """List every registered mechanism and task with its formula, cost and source."""
    import attnlab.lab.tasks  # registers the tasks
    import attnlab.models  # noqa: F401  (registers the task models)
    from attnlab import registry

    all_entries = registry.entries()
    kinds_known = sorted(set(KIND_TITLES) | {e.kind for e in all_entries})
    if kind is not None and kind not in kinds_known:
        raise click.BadParameter(
            f"{kind!r} is not one of {', '.join(kinds_known)}", param_hint="'--kind'"
        )
    entries = registry.entries(kind)
    if as_json:
        rows = [
            {
                "kind": e.kind,
                "name": e.name,
                "aliases": list(e.aliases),
                "formula": e.formula,
                "cost": e.cost,
                "source": e.source,
                "class": f"{e.cls.__module__}.{e.cls.__qualname__}",
            }
            for e in entries
        ]
        click.echo(json.dumps(rows, indent=2))
        return
    # the survey's order (score, align, dim, attention, ...), then any later kinds
    kinds = [k for k in KIND_TITLES if any(e.kind == k for e in entries)]
    for e in entries:
        if e.kind not in kinds:
            kinds.append(e.kind)
    lines: list[str] = []
    for k in kinds:
        title = KIND_TITLES.get(k, k)
        lines += [title, "=" * len(title)]
        for e in (x for x in entries if x.kind == k):
            alias = f"  (aliases: {', '.join(e.aliases)})" if e.aliases else ""
            lines.append(f"{e.name}{alias}")
            lines.append(textwrap.indent(f"formula: {e.formula}", "    "))
            if e.cost:
                lines.append(textwrap.indent(f"cost:    {e.cost}", "    "))
            lines.append(textwrap.indent(f"source:  {e.source}", "    "))
        lines.append("")
    click.echo("\n".join(lines))


# ----------------------------------------------------------------------------- path


def _size_option(flag: str, vector: str) -> Any:
    """``--d-q`` / ``--d-k`` of ``attnlab path``: the size of a query or key vector, an int
    >= 1 (default 64, or the spec's value)."""
    return click.option(
        flag,
        flag.lstrip("-").replace("-", "_"),
        type=click.IntRange(min=1),
        help=f"the size of a {vector} vector  [default: 64, or the spec's]",
    )


#: What ``attnlab path`` asks about when neither ``-a`` nor an option says otherwise.
_PATH_DEFAULTS = {"score": "scaled-dot", "align": "soft", "dim": "single", "d_q": 64, "d_k": 64}


@main.command("path")
@click.option(
    "--attention",
    "-a",
    metavar="SPEC",
    help="the attention as `attnlab train -a` takes it: key=value pairs joined by ',' "
    "(score=additive,align=sparsemax,act=relu) or a .yaml/.toml/.json file; --score, "
    "--align, --dim, --d-q, --d-k and --option override its keys",
)
@click.option(
    "--score",
    help="the score function (the names: attnlab list --kind score)  [default: scaled-dot]",
)
@click.option(
    "--align",
    help="the alignment function (the names: attnlab list --kind align)  [default: soft]",
)
@click.option(
    "--dim",
    help="single: one weight per key; multi: one weight per key and feature  [default: single]",
)
@_size_option("--d-q", "query")
@_size_option("--d-k", "key")
@click.option("--need-weights", is_flag=True, help="the caller asks for the attention weights")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="score/align option")
@click.option(
    "--device",
    default="cpu",
    show_default=True,
    help="the device of the call: cuda plans as on a GPU, whether or not this machine has one",
)
def path_command(
    attention: str | None,
    score: str | None,
    align: str | None,
    dim: str | None,
    d_q: int | None,
    d_k: int | None,
    need_weights: bool,
    options: tuple[str, ...],
    device: str,
) -> None:
    """Say which implementation path an attention takes, and why."""
    from attnlab import Attention

    spec = {**_PATH_DEFAULTS, **_path_spec(attention)}
    given = {"score": score, "align": align, "dim": dim, "d_q": d_q, "d_k": d_k}
    spec.update({k: v for k, v in given.items() if v is not None})
    spec.update(_path_options(options))
    try:
        attn = Attention(**spec)
    except (ValueError, TypeError, KeyError) as err:
        fail(error_message(err))
    try:
        path, reason = attn.explain(need_weights=need_weights, device=device)
    except ValueError as err:  # a device name torch does not know
        fail(error_message(err))
    click.echo(f"path:   {path}\nreason: {reason}")


def _path_spec(attention: str | None) -> dict[str, Any]:
    """The keys of ``attnlab path -a SPEC``; a task's preset or baseline name (``tanh``,
    ``mean``) ends the command: it means something only to its task."""
    from attnlab.lab.config import parse_attention

    spec = _or_fail(parse_attention, attention)
    if "name" in spec:
        fail(
            f"--attention {attention}: {spec['name']!r} names a task's preset or baseline; "
            "path takes score=..., align=..., dim=... and their options"
        )
    return spec


def _path_options(options: tuple[str, ...]) -> dict[str, Any]:
    """The ``--option KEY=VALUE`` values of ``attnlab path``, read as ``-o`` reads them (a
    key given twice is an error, not the last value)."""
    from attnlab._checks import ConfigError
    from attnlab.lab.config import parse_options

    for item in options:
        if "=" not in item:
            fail(f"--option expects KEY=VALUE, got {item!r}")
    try:
        return parse_options(options)
    except ConfigError as err:
        fail(f"--option: {err}")


# ----------------------------------------------------------------------------- train


def _fmt_metric(value: Any) -> str:
    """A test metric of one seed, in the digits of the report (``n/a``: not computed)."""
    from attnlab.lab.seed_stats import fmt_num

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return fmt_num(value) if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


@main.command("train", cls=TaskHelpCommand, syntax=SPEC_SYNTAX)
@click.argument("task")
@click.option(
    "--attention",
    "-a",
    metavar="SPEC",
    help="the attention: a preset (tanh), a baseline (mean, uniform), key=value pairs "
    "joined by ',' (score=additive,align=sparsemax) or a .yaml/.toml/.json file",
)
@click.option("--seed", "seeds", type=int, multiple=True, help="a seed (repeat for several)")
@click.option("--epochs", type=int, help="training epochs")
@click.option("--batch-size", type=int, help="mini-batch size")
@click.option("--lr", type=float, help="learning rate (Adam)")
@device_option()
@precision_option(PRECISION_HELP + "; kept in run.json")
@compile_option()
@click.option(
    "-o",
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="a task option; repeat -o for several (the options: --list-options)",
)
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    help="a .yaml/.toml/.json file with attention, options and seeds",
)
@click.option(
    "--out",
    type=NonEmpty(),
    metavar="DIR",
    help="folder of the run directories [default: runs/<task>]",
)
@click.option("--threads", type=int, help="torch threads for training")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@click.option(
    "--restart",
    is_flag=True,
    help="train every seed from epoch 1, even one that an interrupted run of the same "
    "settings left half done (by default it goes on after its last finished epoch)",
)
@click.option(
    "--profile",
    is_flag=True,
    help="print the training throughput per seed: examples per second and the share of "
    "the time spent waiting for batches (always in cost.json)",
)
@plugin_option()
@click.option(
    "--list-options",
    is_flag=True,
    help="print TASK's options with their defaults, its presets and metrics, and exit",
)
def train_command(
    task: str,
    attention: str | None,
    seeds: tuple[int, ...],
    epochs: int | None,
    batch_size: int | None,
    lr: float | None,
    device: str,
    precision: str,
    compile: str | None,
    options: tuple[str, ...],
    config_file: str | None,
    out: str | None,
    threads: int | None,
    no_progress: bool,
    restart: bool,
    profile: bool,
    plugins: tuple[str, ...],
    list_options: bool,
) -> None:
    """Train TASK once per seed and print the test metrics.

    Each run is written to OUT/<attention>--seed<N> (see docs/lab/train.md). Options are
    taken from --config, then -o, then --epochs / --batch-size / --lr. The spec and the
    options are checked before any data is loaded or anything is written.
    """
    import_plugins_or_fail(plugins)
    if list_options:
        _or_fail(describe_task_of, task, then=click.echo)
        return
    shortcuts = {"epochs": epochs, "batch_size": batch_size, "lr": lr}
    the_task, spec, run_seeds = _or_fail(
        _train_settings, task, attention, config_file, options, shortcuts, seeds, device, precision
    )
    base = _or_fail(_out_folder, out, the_task.name)
    settings = {"device": device, "precision": precision, "threads": threads, "compile": compile}
    results = [
        (seed, _train_seed(the_task, spec, seed, base, not no_progress, not restart, **settings))
        for seed in run_seeds
    ]
    click.echo(f"{the_task.name}  attention: {results[0][1].label}")
    click.echo(_results_table(list(the_task.metrics), results, base))
    if profile:
        click.echo("")
        for seed, r in results:
            click.echo(f"seed {seed}: {profile_line(r.cost)}")


def _or_fail(function: Any, *args: Any, then: Any = None) -> Any:
    """``function(*args)`` (passed to ``then`` when given); a
    :class:`~attnlab._checks.ConfigError` ends the command with ``error: ...``."""
    from attnlab._checks import ConfigError

    try:
        value = function(*args)
    except ConfigError as error:
        fail(str(error))
    return then(value) if then is not None else value


def _train_settings(
    task: str,
    attention: str | None,
    config_file: str | None,
    options: Sequence[str],
    shortcuts: dict[str, Any],
    seeds: Sequence[int],
    device: str,
    precision: str,
) -> tuple[Any, dict[str, Any], list[int]]:
    """``(task, spec, seeds)`` of ``attnlab train``: the options taken from --config, then
    -o, then the shortcuts given; the spec, the option values, the device and the precision
    checked before any data is loaded."""
    from attnlab._checks import ConfigError, check_seed
    from attnlab.lab.config import (
        check_attention,
        check_option_values,
        load_config_file,
        parse_attention,
        parse_options,
        resolve_task,
    )
    from attnlab.lab.training import resolve_device, resolve_precision

    config = load_config_file(config_file) if config_file else {}
    spec = parse_attention(attention) if attention is not None else config.get("attention", {})
    opts = {**config.get("options", {}), **parse_options(options)}
    opts.update({k: v for k, v in shortcuts.items() if v is not None})
    the_task = resolve_task(task, opts)
    check_option_values(the_task, opts)
    check_attention(the_task, spec)  # before any data is loaded
    resolve_precision(precision, resolve_device(device))
    run_seeds = list(seeds) or list(config.get("seeds", [0]))
    for seed in run_seeds:  # before any data is loaded (train_run checks it again)
        check_seed(seed, "seed", minimum=0, error=ConfigError)
        if run_seeds.count(seed) > 1:  # both runs would write OUT/<attention>--seed<N>
            raise ConfigError(f"seed {seed} is given {run_seeds.count(seed)} times; give it once")
    return the_task, spec, run_seeds


def _out_folder(out: str | None, task: str) -> Path:
    """The folder of the run directories of ``attnlab train`` (``--out``, by default
    ``runs/<task>``), checked to be one that can be made (a
    :class:`~attnlab._checks.ConfigError` names a file in the way)."""
    from attnlab.lab.files import check_folder, check_run_home

    base = Path(out) if out else Path("runs") / task
    check_folder(base, f"--out {out}" if out else f"the run folder {base}")
    check_run_home(base, f"--out {out}" if out else f"the run folder {base}", kind="runs")
    return base


def _train_seed(
    task: Any,
    spec: dict[str, Any],
    seed: int,
    base: Path,
    progress: bool,
    resume: bool,
    *,
    device: str,
    precision: str,
    threads: int | None,
    compile: str | None = None,
) -> Any:
    """Train one seed of ``attnlab train`` into ``base/<spec slug>--seed<N>`` (``base``:
    :func:`_out_folder`), going on after the last finished epoch of an interrupted run of
    the same settings unless ``resume`` is False; an error of the task model (exit 2, an
    empty new ``base`` removed), missing or malformed data or a non-finite loss (exit 1)
    ends the command with one line."""
    from attnlab._checks import ConfigError
    from attnlab.data._common import DataFormatError, MissingDataError
    from attnlab.lab.task import spec_slug
    from attnlab.lab.training import train_run

    base_is_new = not base.exists()
    try:
        return train_run(
            task,
            spec,
            seed=seed,
            device=device,
            precision=precision,
            out_dir=base / f"{spec_slug(spec)}--seed{seed}",
            progress=progress,
            num_threads=threads,
            resume=resume,
            compile=compile,
        )
    except ConfigError as error:  # the task model rejects the spec or an option
        if base_is_new and base.is_dir() and not any(base.iterdir()):
            base.rmdir()  # leave nothing behind
        fail(str(error))
    except (MissingDataError, DataFormatError) as error:  # the data: missing or malformed
        fail(str(error), code=1)
    except FloatingPointError as error:  # a non-finite loss: run.json records the failure
        fail(f"{error} (the run is recorded as failed in {base})", code=1)


def _results_table(metric_names: list[str], results: list[tuple[int, Any]], base: Path) -> str:
    """The test metrics, best epoch and run directory of every seed (and their mean ±
    sample std when there are several seeds); a run directory is shown under ``base`` as
    the user gave it (relative by default, as ``attnlab ablate`` shows its directory)."""
    header = ["seed", *[f"test {m}" for m in metric_names], "best epoch", "run directory"]
    rows = [
        [
            str(seed),
            *[_fmt_metric(r.metrics["test"].get(m)) for m in metric_names],
            _best_epoch(r.metrics),
            str(base / Path(r.run_dir).name),
        ]
        for seed, r in results
    ]
    if len(results) > 1:
        cells = [_mean_std([r.metrics["test"].get(m) for _, r in results]) for m in metric_names]
        rows.append(["mean ± std", *cells, "", ""])
    return _table(header, rows)


def _best_epoch(metrics: dict[str, Any]) -> str:
    """``"3 of 8"``: the kept epoch of the epochs trained (fewer than ``epochs`` when the
    option ``patience`` stopped the run; runs of earlier releases show the epoch alone)."""
    trained = metrics.get("epochs_trained")
    best = str(metrics["best_epoch"])
    return best if trained is None else f"{best} of {trained}"


def _mean_std(values: list[Any]) -> str:
    """``mean ± sample std`` of the finite numbers among ``values`` (the mean alone for one,
    ``n/a`` without any), written as the report writes it (:mod:`attnlab.lab.seed_stats`)."""
    from attnlab.lab.seed_stats import fmt_mean_std, mean_std

    mean, std, _ = mean_std(values)
    return fmt_mean_std(mean, std, "n/a")


def profile_line(cost: dict[str, Any]) -> str:
    """One line on a run's training throughput from its ``cost.json``: examples per second
    and the share of the training loops spent waiting for batches."""
    rate, share = cost.get("examples_per_second"), cost.get("data_share")
    if not isinstance(rate, int | float) or not isinstance(share, int | float):
        return "no throughput recorded (a run written before attnlab measured it)"
    prefetch = cost.get("prefetch") or 0
    how = f"{prefetch} batches prefetched" if prefetch else "no prefetching"
    return (
        f"{rate:,.0f} training examples/s; {100 * share:.1f} % of the training loops "
        f"({cost.get('data_seconds', 0.0):.2f} s) waiting for batches ({how})"
    )


if __name__ == "__main__":  # pragma: no cover
    main()
