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
from typing import Any, NoReturn

import click

__all__ = ["KIND_TITLES", "LAZY_COMMANDS", "LAZY_HELP", "TaskHelpCommand", "main", "profile_line"]

KIND_TITLES = {
    "score": "Score functions (survey 3.2.1)",
    "align": "Alignment functions (survey 3.2.2)",
    "dim": "Attention dimensionality (survey 3.2.3)",
    "attention": "Attention modules",
    "feature": "Feature-related attention (survey 3.1)",
    "query": "Query-related attention (survey 3.3)",
    "model": "Task models (survey section 0: feature, query, attention and output model)",
    "task": "Tasks of the lab (survey section 0 on real data)",
}

#: Commands defined in other modules: name -> (module, attribute). A command whose module
#: does not exist (yet) is left out; any other import error propagates.
LAZY_COMMANDS = {
    "ablate": ("attnlab.lab.ablation", "ablate_command"),
    "demo": ("attnlab.lab.demo", "demo_command"),
    "report": ("attnlab.lab.report", "report_command"),
    "aer": ("attnlab.evaluation.aer", "aer_command"),
    "explain": ("attnlab.evaluation.explain_run", "explain_command"),
    "correctness": ("attnlab.evaluation.vqa_correctness", "correctness_command"),
    "aer-table": ("attnlab.evaluation.alignment_study", "aer_table_command"),
}
#: What ``attnlab --help`` says of a lazy command without importing its module.
LAZY_HELP = {
    "ablate": "Run every attention spec x every seed on a task; resumable.",
    "demo": "The default main job: a small sentiment ablation and its report.",
    "report": "Write a self-contained HTML report of a run or an ablation.",
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
    """The top-level group: adds the lazy commands and ends quietly on a closed pipe."""

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

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except BrokenPipeError:  # e.g. `attnlab list | head`: the reader went away
            sys.stderr.close()
            return 0


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _write_rows(formatter: click.HelpFormatter, rows: Sequence[tuple[str, str]]) -> None:
    """Two columns, as ``formatter.write_dl`` but never breaking a name at its hyphen
    (``luong-concat``, ``capsule-attention`` stay whole)."""
    indent = " " * formatter.current_indent
    first = min(max(len(a) for a, _ in rows), 30)
    width = max(formatter.width - formatter.current_indent - first - 2, 20)
    for name, text in rows:
        lines = textwrap.wrap(text, width, break_on_hyphens=False) or [""]
        if len(name) > first:
            formatter.write(f"{indent}{name}\n")
        else:
            formatter.write(f"{indent}{name.ljust(first)}  {lines.pop(0)}\n")
        for line in lines:
            formatter.write(f"{indent}{' ' * (first + 2)}{line}\n")


class TaskHelpCommand(click.Command):
    """A command on a TASK (``train``, ``ablate``) whose ``--help`` ends with how lists are
    typed (``syntax``: ``(example, meaning)`` rows) and every registered task with its
    attention presets and baselines, read from the registry only when the help is shown."""

    def __init__(self, *args: Any, syntax: Sequence[tuple[str, str]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.syntax = list(syntax)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from attnlab import registry
        from attnlab.lab.config import task_presets

        if self.syntax:
            with formatter.section("Typing specs and options"):
                _write_rows(formatter, self.syntax)
        rows = [(e.name, task_presets(e.cls)) for e in registry.entries("task")]
        if rows:
            with formatter.section("Tasks: their attention presets (the default marked)"):
                _write_rows(formatter, rows)
            formatter.write_paragraph()
            formatter.write_text(
                "A task's options and their defaults, and what each preset is: "
                f"attnlab {self.name} TASK --list-options. Tasks of a plugin: add --plugin "
                "MODULE. Sources of the tasks: attnlab list --kind task."
            )
        super().format_epilog(ctx, formatter)


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
def main() -> None:
    """Attention mechanisms of the survey literature, and a lab to compare them."""


# ----------------------------------------------------------------------------- list


@main.command("list")
@click.option("--kind", metavar="KIND", help="only this kind (score, align, dim, task, ...)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def list_command(kind: str | None, as_json: bool) -> None:
    """List every registered mechanism and task with its formula, cost and source."""
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


def _parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@main.command("path")
@click.option("--score", default="scaled-dot", show_default=True)
@click.option("--align", default="soft", show_default=True)
@click.option("--dim", default="single", show_default=True)
@click.option("--d-q", "d_q", type=int, default=64, show_default=True)
@click.option("--d-k", "d_k", type=int, default=64, show_default=True)
@click.option("--need-weights", is_flag=True)
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="score/align option")
def path_command(
    score: str, align: str, dim: str, d_q: int, d_k: int, need_weights: bool, options
) -> None:
    """Say which implementation path an attention takes, and why."""
    from attnlab import Attention

    parsed = {}
    for item in options:
        if "=" not in item:
            _fail(f"--option expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        parsed[key] = _parse_value(value)
    try:
        attn = Attention(score=score, align=align, dim=dim, d_q=d_q, d_k=d_k, **parsed)
    except (ValueError, TypeError, KeyError) as err:
        _fail(str(err).strip("'\""))
    path, reason = attn.explain(need_weights=need_weights)
    click.echo(f"path:   {path}\nreason: {reason}")


# ----------------------------------------------------------------------------- train


def describe_task_of(name: str) -> str:
    """:func:`attnlab.lab.config.describe_task` of the registered task ``name`` (raises
    :class:`~attnlab._checks.ConfigError` naming the registered tasks when it is unknown)."""
    from attnlab import registry
    from attnlab._checks import ConfigError
    from attnlab.lab.config import describe_task

    try:
        cls = registry.get("task", name).cls
    except KeyError:
        known = ", ".join(registry.names("task")) or "none"
        raise ConfigError(f"unknown task {name!r}; registered tasks: {known}") from None
    return describe_task(cls)


def _import_plugins(plugins: tuple[str, ...]) -> None:
    """Import each plugin module (a dotted name, or a .py file); the current directory is
    searched too, as ``python -m`` would."""
    import os

    for plugin in plugins:
        try:
            if plugin.endswith(".py"):
                spec = importlib.util.spec_from_file_location(
                    f"attnlab_plugin_{abs(hash(plugin))}", os.path.abspath(plugin)
                )
                if spec is None or spec.loader is None or not os.path.isfile(plugin):
                    _fail(f"--plugin {plugin!r}: no such file")
                module = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = module
                spec.loader.exec_module(module)
                continue
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())
            importlib.import_module(plugin)
        except ModuleNotFoundError as error:
            _fail(f"--plugin {plugin!r}: {error}")


def _fmt_metric(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


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
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="auto (CUDA when available, else cpu), cpu, cuda, cuda:1, ...",
)
@click.option(
    "--precision",
    default="fp32",
    show_default=True,
    help="fp32, or bf16 / fp16 autocast (fp16 with a gradient scaler); kept in run.json",
)
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
@click.option("--out", metavar="DIR", help="folder of the run directories [default: runs/<task>]")
@click.option("--threads", type=int, help="torch threads for training")
@click.option("--no-progress", is_flag=True, help="no progress bars")
@click.option(
    "--profile",
    is_flag=True,
    help="print the training throughput per seed: examples per second and the share of "
    "the time spent waiting for batches (always in cost.json)",
)
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE",
    help="import a module that registers extra tasks (a dotted name or a .py file)",
)
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
    options: tuple[str, ...],
    config_file: str | None,
    out: str | None,
    threads: int | None,
    no_progress: bool,
    profile: bool,
    plugins: tuple[str, ...],
    list_options: bool,
) -> None:
    """Train TASK once per seed and print the test metrics.

    Each run is written to OUT/<attention>--seed<N> (see docs/lab/train.md). Options are
    taken from --config, then -o, then --epochs / --batch-size / --lr. The spec and the
    options are checked before any data is loaded or anything is written.
    """
    from pathlib import Path

    from attnlab._checks import ConfigError
    from attnlab.data._common import MissingDataError
    from attnlab.lab.config import (
        check_attention,
        check_option_values,
        load_config_file,
        parse_attention,
        parse_options,
    )
    from attnlab.lab.task import spec_slug
    from attnlab.lab.training import (
        resolve_device,
        resolve_precision,
        resolve_task,
        train_run,
    )

    _import_plugins(plugins)
    try:
        if list_options:
            click.echo(describe_task_of(task))
            return
        config = load_config_file(config_file) if config_file else {}
        spec = config.get("attention", {})
        if attention is not None:
            spec = parse_attention(attention)
        opts = dict(config.get("options", {}))
        opts.update(parse_options(options))
        for name, value in (("epochs", epochs), ("batch_size", batch_size), ("lr", lr)):
            if value is not None:
                opts[name] = value
        run_seeds = list(seeds) or list(config.get("seeds", [0]))
        the_task = resolve_task(task, opts)
        check_option_values(the_task, opts)
        check_attention(the_task, spec)  # before any data is loaded
        resolve_precision(precision, resolve_device(device))
    except ConfigError as error:
        _fail(str(error))
    base = Path(out) if out else Path("runs") / the_task.name
    base_is_new = not base.exists()
    results = []
    for seed in run_seeds:
        run_dir = base / f"{spec_slug(spec)}--seed{seed}"
        try:
            result = train_run(
                the_task,
                spec,
                seed=seed,
                device=device,
                precision=precision,
                out_dir=run_dir,
                progress=not no_progress,
                num_threads=threads,
            )
        except ConfigError as error:  # the task model rejects the spec or an option
            if base_is_new and base.is_dir() and not any(base.iterdir()):
                base.rmdir()  # leave nothing behind
            _fail(str(error))
        except MissingDataError as error:
            _fail(str(error), code=1)
        results.append((seed, result))
    metric_names = list(the_task.metrics)
    header = ["seed", *[f"test {m}" for m in metric_names], "best epoch", "run directory"]
    rows = [
        [
            str(seed),
            *[_fmt_metric(r.metrics["test"].get(m)) for m in metric_names],
            str(r.metrics["best_epoch"]),
            str(r.run_dir),
        ]
        for seed, r in results
    ]
    if len(results) > 1:
        cells = []
        for m in metric_names:
            values = [r.metrics["test"].get(m) for _, r in results]
            values = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
            if values:
                mean = sum(values) / len(values)
                std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))
                cells.append(f"{mean:.4f} ± {std:.4f}")
            else:
                cells.append("n/a")
        rows.append(["mean ± std", *cells, "", ""])
    click.echo(f"{the_task.name}  attention: {results[0][1].label}")
    click.echo(_table(header, rows))
    if profile:
        click.echo("")
        for seed, r in results:
            click.echo(f"seed {seed}: {profile_line(r.cost)}")


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
