"""What the lab's click commands (``attnlab train``, ``ablate``, ``demo``) share: the command
class whose ``--help`` lists the tasks, ``--list-options``, and the options typed the same
way in every command (``--device``, ``--precision``, ``--compile``, ``--plugin``).

The module imports nothing heavy (no torch, no task): ``attnlab --help`` stays fast. The
top-level command line (:mod:`attnlab.cli`) builds on it; nothing in the lab imports the
command line.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = [
    "DEVICE_HELP",
    "PRECISION_HELP",
    "NonEmpty",
    "TaskHelpCommand",
    "compile_option",
    "describe_task_of",
    "device_option",
    "import_plugins_or_fail",
    "plugin_option",
    "precision_option",
    "write_rows",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The ``--device`` help of ``train`` and ``demo``.
DEVICE_HELP = "auto (CUDA when available, else cpu), cpu, cuda, cuda:1, ..."
#: The ``--precision`` help, without the end that differs between the commands.
PRECISION_HELP = "fp32, or bf16 / fp16 autocast (fp16 with a gradient scaler)"


class NonEmpty(click.ParamType):
    """The click type ``inner`` (text by default), refusing an empty value: ``--out ""``
    (an unset shell variable, ``--out "$DIR"``) is an error, not the working folder or the
    default folder."""

    def __init__(self, inner: click.ParamType | None = None) -> None:
        self.inner = inner if inner is not None else click.STRING
        self.name = self.inner.name

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return self.inner.get_metavar(param, ctx)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: give a path, or leave the option out for its default", param, ctx)
        return self.inner.convert(value, param, ctx)


def device_option(help: str = DEVICE_HELP) -> Callable[[F], F]:
    """``--device`` (default ``auto``): the torch device of the runs."""
    return click.option("--device", default="auto", show_default=True, help=help)


def precision_option(help: str = PRECISION_HELP) -> Callable[[F], F]:
    """``--precision`` (default ``fp32``): ``fp32``, ``bf16`` or ``fp16`` autocast."""
    return click.option("--precision", default="fp32", show_default=True, help=help)


def compile_option() -> Callable[[F], F]:
    """``--compile [BACKEND]``: compile the training steps with ``torch.compile``
    (``--compile`` alone: ``inductor``); the keyword argument is ``compile``."""
    return click.option(
        "--compile",
        "compile",
        is_flag=False,
        flag_value="inductor",
        default=None,
        metavar="[BACKEND]",
        help="compile the training steps with torch.compile: inductor (--compile alone), "
        "or another backend (aot_eager, cudagraphs, ...); kept in run.json",
    )


#: The ``--plugin`` help.
PLUGIN_HELP = (
    "import MODULE first (a dotted name or a .py file, e.g. one registering a task); repeat "
    "for several"
)


def plugin_option(help: str = PLUGIN_HELP) -> Callable[[F], F]:
    """``--plugin MODULE``, repeatable (the keyword argument is ``plugins``); the command
    calls :func:`import_plugins_or_fail` before it looks up a task."""
    return click.option("--plugin", "plugins", multiple=True, metavar="MODULE", help=help)


def import_plugins_or_fail(plugins: Sequence[str]) -> None:
    """Import each ``--plugin`` (a dotted name, searched in the working folder too, as
    ``python -m`` would, or a ``.py`` file); one that cannot be imported ends the command
    with one line ``error: --plugin 'x' cannot be imported: ...`` (status 2)."""
    import os

    from attnlab._checks import ConfigError
    from attnlab.lab.errors import fail
    from attnlab.lab.executors import import_plugins

    try:
        import_plugins(plugins, (os.getcwd(),))
    except ConfigError as error:  # "plugin 'x' cannot be imported: ..."
        fail(f"--{error}")


def write_rows(formatter: click.HelpFormatter, rows: Sequence[tuple[str, str]]) -> None:
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
        import attnlab.lab.tasks  # noqa: F401  (registers the built-in tasks)
        from attnlab import registry
        from attnlab.lab.config import task_presets

        if self.syntax:
            with formatter.section("Typing specs and options"):
                write_rows(formatter, self.syntax)
        rows = [(e.name, task_presets(e.cls)) for e in registry.entries("task")]
        if rows:
            with formatter.section("Tasks: their attention presets (the default marked)"):
                write_rows(formatter, rows)
            formatter.write_paragraph()
            formatter.write_text(
                "A task's options and their defaults, and what each preset is: "
                f"attnlab {self.name} TASK --list-options. Tasks of a plugin: add --plugin "
                "MODULE. Sources of the tasks: attnlab list --kind task."
            )
        super().format_epilog(ctx, formatter)


def describe_task_of(name: str) -> str:
    """:func:`attnlab.lab.config.describe_task` of the registered task ``name`` (raises
    :class:`~attnlab._checks.ConfigError` naming the registered tasks when it is unknown)."""
    from attnlab.lab.config import describe_task, task_class

    return describe_task(task_class(name))
