"""The mean and sample standard deviation over seeds, in one place: the ablation's summary
(:meth:`attnlab.lab.store.ResultsStore.summary`), the report's tables, the table of
``attnlab train --seeds`` and the alignment study all summarise runs with it, so they agree
on what counts.

What counts is the finite numbers: a metric a run could not compute (``None``, e.g.
METEOR without NLTK), a NaN or an infinity, a bool and anything that is not a number are
left out, and :attr:`MeanStd.n` says how many values remained.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from statistics import fmean, stdev
from typing import Any, NamedTuple

__all__ = ["MeanStd", "finite", "mean_std"]


class MeanStd(NamedTuple):
    """``mean``, sample ``std`` (n - 1 in the denominator) and ``n``, the number of finite
    values they are computed from; ``mean`` is None without any, ``std`` is None with
    fewer than two."""

    mean: float | None
    std: float | None
    n: int


def finite(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` (bools and non-numbers left out), as floats."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out.append(float(v))
    return out


def mean_std(values: Iterable[Any]) -> MeanStd:
    """The :class:`MeanStd` of the finite numbers among ``values``."""
    xs = finite(values)
    if not xs:
        return MeanStd(None, None, 0)
    return MeanStd(fmean(xs), stdev(xs) if len(xs) > 1 else None, len(xs))
