"""The lab's one progress bar: a tqdm bar on stderr, or nothing when progress is off.

Training (epochs and batches), ablations (runs) and the explanation study (its tests and
the long trainings inside them) all show their progress through :class:`ProgressBar`, so
that every bar looks and behaves the same and the callers never test for ``None``.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

__all__ = ["ProgressBar"]

T = TypeVar("T")


class ProgressBar:
    """A tqdm bar on stderr with ``enabled=True``, else a no-op with the same methods.

    ``kw`` goes to :class:`tqdm.tqdm` (``total``, ``desc``, ``unit``, ``initial``,
    ``leave``, ...); the bar adapts to the terminal's width. Usable as a context manager
    (closed on exit)."""

    def __init__(self, enabled: bool, **kw: Any) -> None:
        self.bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(file=sys.stderr, dynamic_ncols=True, **kw)

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Advance by ``n``; ``postfix`` (``name=value``) replaces the values shown after
        the bar."""
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)

    def step(self, value: T) -> T:
        """Advance by one and pass ``value`` on: ``result = bar.step(work())``."""
        self.update(1)
        return value

    def note(self, text: str) -> None:
        """The text after the bar (``""`` clears it)."""
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def write(self, line: str) -> None:
        """Print ``line`` above the bar without breaking it (on stdout, as tqdm does)."""
        if self.bar is not None:
            self.bar.write(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
