"""Shared parts of the evaluation measures: the result record and the pairing check."""

from __future__ import annotations

import dataclasses
from collections.abc import Sized
from typing import Any


class Record:
    """A mixin for the frozen dataclasses that measures return: :meth:`as_dict`."""

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (for JSON and tables)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def check_paired(references: Sized, hypotheses: Sized, *, references_are: str, give: str) -> None:
    """One hypothesis per reference entry; otherwise a ``ValueError`` "N REFERENCES_ARE but
    M hypotheses; give one GIVE"."""
    if len(references) != len(hypotheses):
        raise ValueError(
            f"{len(references)} {references_are} but {len(hypotheses)} hypotheses; give one {give}"
        )
