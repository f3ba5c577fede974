"""How the lab's commands end on an error in what the user typed, and how they show notices.

* :func:`error_message` is an exception's message as the user reads it.
* :func:`fail` prints one line ``error: MESSAGE`` on stderr and exits with status 2 (or the
  status given: 1 for missing data), as every ``attnlab`` command does.
* :func:`failing_on` runs a command's work and ends it with :func:`fail` on the errors
  that mean bad input (status 2) or missing data (status 1).
* :func:`warnings_as_notes` shows the warnings attnlab raises during a command as one line
  ``note: MESSAGE`` each, once per command.

The lab's commands and the top-level command line (:mod:`attnlab.cli`) share them.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import click

from attnlab._deprecation import REMOVED_NOTE

__all__ = [
    "error_message",
    "fail",
    "failing_on",
    "notes_wanted",
    "show_warnings_as_notes",
    "warnings_as_notes",
]

#: The folder of the attnlab package: the warnings raised from a file under it are notes.
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def error_message(error: BaseException) -> str:
    """The message of ``error``: for a ``KeyError`` (the registry's unknown names) its
    text without the quotes ``str`` adds around it; a message that itself ends in a quote
    (``got 'x'``) keeps it."""
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return error.args[0]
    return str(error)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with status ``code`` (2: a usage error)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def failing_on(*errors: type[BaseException]) -> Iterator[None]:
    """Run the block; an exception of one of ``errors`` (bad input: a missing or damaged
    file, a bad value) ends the command with ``error: MESSAGE`` and status 2, missing or
    malformed data (:class:`~attnlab.data.MissingDataError`, ``DataFormatError``, whether
    listed or not) with status 1."""
    from attnlab.data._common import DataFormatError, MissingDataError

    try:
        yield
    except (MissingDataError, DataFormatError) as error:
        fail(str(error), code=1)
    except errors as error:
        fail(error_message(error))


def _from_attnlab(filename: str) -> bool:
    """Whether a warning's ``filename`` (where it was raised) is a file of attnlab."""
    try:
        return Path(filename).resolve().is_relative_to(_PACKAGE_DIR)
    except (OSError, ValueError):
        return False


def _attnlab_deprecation(message: Warning | str, category: type[Warning]) -> bool:
    """Whether a warning is one of attnlab's deprecations: those are attributed to the
    caller's frame (outside attnlab), so the file name does not tell."""
    return issubclass(category, DeprecationWarning) and REMOVED_NOTE in str(message)


def _show_deprecations() -> None:
    """Let attnlab's deprecation warnings through Python's default filters (which hide a
    ``DeprecationWarning`` not raised from ``__main__``): a command-line user sees them."""
    pattern = ".*" + re.escape(REMOVED_NOTE)
    warnings.filterwarnings("default", message=pattern, category=DeprecationWarning)


def _note_shower(python_shows: Callable[..., None]) -> Callable[..., None]:
    """A :func:`warnings.showwarning` that shows attnlab's warnings as one ``note:`` line
    each, once, and hands the others to ``python_shows``."""
    shown: set[str] = set()

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if not (_from_attnlab(filename) or _attnlab_deprecation(message, category)):
            python_shows(message, category, filename, lineno, file, line)
            return
        text = str(message)
        if text not in shown:
            shown.add(text)
            click.echo(f"note: {text}", err=True)

    return show


#: how many :func:`warnings_as_notes` blocks are open in this process
_open_blocks = 0


@contextmanager
def warnings_as_notes() -> Iterator[None]:
    """Show the warnings that attnlab raises inside the block as one line ``note: MESSAGE``
    on stderr, each message once (without the file, line and source line that Python
    prints); the warnings of other packages are shown as Python shows them.

    Only the block is affected: the filters and :func:`warnings.showwarning` are restored
    afterwards, so a program that calls the Python API gets its warnings as usual. The
    worker processes of ``attnlab ablate --jobs N`` started inside the block show their
    warnings the same way (:func:`notes_wanted`, :func:`show_warnings_as_notes`).
    """
    global _open_blocks
    with warnings.catch_warnings():
        _show_deprecations()
        warnings.showwarning = _note_shower(warnings.showwarning)
        _open_blocks += 1
        try:
            yield
        finally:
            _open_blocks -= 1


def notes_wanted() -> bool:
    """Whether a :func:`warnings_as_notes` block is open in this process: the worker
    processes it starts should then show warnings as notes too."""
    return _open_blocks > 0


def show_warnings_as_notes() -> None:
    """Show attnlab's warnings as ``note:`` lines for the rest of this process (a worker
    process of a command that shows them so: it has no block to run inside)."""
    _show_deprecations()
    warnings.showwarning = _note_shower(warnings.showwarning)
