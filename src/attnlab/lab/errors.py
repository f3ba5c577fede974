"""How the lab's commands end on an error in what the user typed, and how they show notices.

* :func:`fail` prints one line ``error: MESSAGE`` on stderr and exits with status 2 (or the
  status given: 1 for missing data), as every ``attnlab`` command does.
* :func:`failing_on` runs a command's work and ends it with :func:`fail` on the errors
  that mean bad input (status 2) or missing data (status 1).
* :func:`warnings_as_notes` shows the warnings attnlab raises during a command as one line
  ``note: MESSAGE`` each, once per command.

The lab's commands and the top-level command line (:mod:`attnlab.cli`) share them.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

__all__ = ["fail", "failing_on", "warnings_as_notes"]

#: The folder of the attnlab package: the warnings raised from a file under it are notes.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with status ``code`` (2: a usage error)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def failing_on(*errors: type[BaseException]) -> Iterator[None]:
    """Run the block; an exception of one of ``errors`` (bad input: a missing or damaged
    file, a bad value) ends the command with ``error: MESSAGE`` and status 2, missing data
    (:class:`~attnlab.data.MissingDataError`, whether listed or not) with status 1."""
    from attnlab.data._common import MissingDataError

    try:
        yield
    except MissingDataError as error:
        fail(str(error), code=1)
    except errors as error:
        fail(str(error))


def _from_attnlab(filename: str) -> bool:
    """Whether a warning's ``filename`` (where it was raised) is a file of attnlab."""
    try:
        return Path(filename).resolve().is_relative_to(_PACKAGE_DIR)
    except (OSError, ValueError):
        return False


@contextmanager
def warnings_as_notes() -> Iterator[None]:
    """Show the warnings that attnlab raises inside the block as one line ``note: MESSAGE``
    on stderr, each message once (without the file, line and source line that Python
    prints); the warnings of other packages are shown as Python shows them.

    Only the block is affected: the filters and :func:`warnings.showwarning` are restored
    afterwards, so a program that calls the Python API gets its warnings as usual.
    """
    shown: set[str] = set()
    with warnings.catch_warnings():
        python_shows = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if not _from_attnlab(filename):
                python_shows(message, category, filename, lineno, file, line)
                return
            text = str(message)
            if text not in shown:
                shown.add(text)
                click.echo(f"note: {text}", err=True)

        warnings.showwarning = show
        yield
