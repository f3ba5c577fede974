"""How the lab's commands end on an error in what the user typed.

:func:`fail` prints one line ``error: MESSAGE`` on stderr and exits with status 2 (or the
status given: 1 for missing data), as every ``attnlab`` command does. The lab's commands
and the top-level command line (:mod:`attnlab.cli`) share it.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import click

__all__ = ["fail"]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with status ``code`` (2: a usage error)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)
