"""Shared parts of the evaluation measures: the result record, the pairing check, and the
conversion of the maps a measure reads (tensors or arrays) to NumPy."""

from __future__ import annotations

import dataclasses
from collections.abc import Sized
from typing import Any

import numpy as np
import torch


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


def as_array(x: Any, dtype: Any = np.float64) -> np.ndarray:
    """``x`` as a NumPy array of ``dtype`` (``None``: keep the element type). ``x`` may be a
    tensor on any device, of any dtype (bfloat16 included, which NumPy lacks), with or
    without autograd, an array or nested lists: what a model's output holds at evaluation."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        x = x.numpy()
    return np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)


def check_weights(a: Any, name: str = "weights", note: str = "") -> Any:
    """``a`` (an array or a tensor) itself when every entry is finite and non-negative,
    else a ``ValueError`` "NAME must be finite and non-negative" (``note`` ends it)."""
    if isinstance(a, torch.Tensor):
        bad = a.numel() > 0 and (not bool(torch.isfinite(a).all()) or bool((a < 0).any()))
    else:
        bad = not np.all(np.isfinite(a)) or bool((a < 0).any())
    if bad:
        raise ValueError(f"{name} must be finite and non-negative{note}")
    return a
