"""The mean and sample standard deviation over seeds, in one place: the ablation's summary
(:meth:`attnlab.lab.store.ResultsStore.summary`), the report's tables, the table of
``attnlab train`` with several ``--seed`` and the alignment study all summarise runs with
it, so they agree on what counts.

What counts is the finite numbers: a metric a run could not compute (``None``, e.g.
METEOR without NLTK), a NaN or an infinity, a bool and anything that is not a number are
left out, and :attr:`MeanStd.n` says how many values remained. :func:`fmt_num` and
:func:`fmt_mean_std` write them, with the same digits in the report and on the terminal.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from statistics import fmean, stdev
from typing import Any, NamedTuple

__all__ = ["MeanStd", "finite", "fmt_mean_std", "fmt_num", "mean_std"]


class MeanStd(NamedTuple):
    """``mean``, sample ``std`` (n - 1 in the denominator) and ``n``, the number of finite
    values they are computed from; ``mean`` is None without any, ``std`` is None with
    fewer than two."""

    mean: float | None
    std: float | None
    n: int


def finite(values: Iterable[Any]) -> list[float]:
    """The finite real numbers among ``values`` (Python's and NumPy's; bools, non-numbers
    and an int too large for a float left out), as floats."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):  # NumPy's bool is no Real
            continue
        try:
            x = float(v)
        except OverflowError:  # an int beyond the floats: no finite float
            continue
        if math.isfinite(x):
            out.append(x)
    return out


def mean_std(values: Iterable[Any]) -> MeanStd:
    """The :class:`MeanStd` of the finite numbers among ``values``. Values near the
    largest float are averaged on a scaled copy (their sum overflows): the mean is then
    finite, a standard deviation beyond the floats is ``inf``."""
    xs = finite(values)
    if not xs:
        return MeanStd(None, None, 0)
    try:
        return MeanStd(fmean(xs), stdev(xs) if len(xs) > 1 else None, len(xs))
    except OverflowError:  # an intermediate sum beyond the floats
        scale = max(abs(x) for x in xs)
        ys = [x / scale for x in xs]
        std = scale * stdev(ys) if len(ys) > 1 else None
        return MeanStd(scale * fmean(ys), std, len(xs))


def fmt_num(value: float | None, missing: str = "–") -> str:
    """4 decimals below 100 (4 significant digits below 0.001, where 4 decimals would show
    a small MSE or p-value as 0.0000), 2 below 100,000, else 4 significant digits;
    ``missing`` for None (the report's ``–``; the command line's tables say ``n/a``)."""
    if value is None:
        return missing
    # to 12 significant digits first: two means of the same values summed in another
    # order (0.80625 and 0.8062499999999999) read the same, not 0.8063 and 0.8062
    value = float(f"{value:.12g}") + 0.0  # + 0.0: -0.0 (a rounded-away mean) reads 0.0000
    if 0 < abs(value) < 1e-3:
        return f"{value:.4g}"
    if abs(value) < 100:
        return f"{value:.4f}"
    if abs(value) < 1e5:
        return f"{value:.2f}"
    return f"{value:.4g}"


def fmt_mean_std(mean: float | None, std: float | None, missing: str = "–") -> str:
    """``mean ± std`` in :func:`fmt_num`'s digits (no ``±`` without a standard deviation,
    ``missing`` without a mean)."""
    if mean is None:
        return missing
    if std is None:
        return fmt_num(mean)
    return f"{fmt_num(mean)} ± {fmt_num(std)}"
