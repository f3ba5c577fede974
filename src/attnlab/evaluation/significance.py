"""Ablation analysis: is one mechanism better than another over seeds, and by how much?

Runs of two mechanisms with the same seed share the data order and initialisation of the
parts they have in common, so they are compared *paired by seed*: with ``d_s = x_s - y_s``
the per-seed differences (n seeds),

* paired t-test: ``t = mean(d) / (sd(d) / sqrt(n))``, two-sided p from Student's t with
  n - 1 degrees of freedom (scipy.stats.ttest_rel);
* exact sign-flip permutation test: the two-sided p-value of ``|mean(d)|`` among all
  ``2^n`` sign assignments (no normality assumption; with n seeds the smallest possible p
  is ``2 / 2^n``, so n >= 6 is needed to reach p < 0.05 -- the table says so);
* effect size: Cohen's ``d_z = mean(d) / sd(d)`` (paired), and the raw mean difference.

Cost: O(n 2^n) for the permutation test (n <= 16 enforced), O(n) otherwise.

Sources: J. Cohen, *Statistical Power Analysis for the Behavioral Sciences*, 1988 (d_z);
R. Dror, G. Baumer, S. Shlomov and R. Reichart, "The Hitchhiker's Guide to Testing
Statistical Significance in Natural Language Processing", ACL 2018.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from attnlab.evaluation._measures import Record

__all__ = ["PairedComparison", "compare_to_baseline", "paired_comparison"]


@dataclass(frozen=True)
class PairedComparison(Record):
    """The comparison of mechanism A with mechanism B on one metric, paired by seed.

    Attributes:
        n: the number of paired seeds.
        mean_a, mean_b: the means over those seeds.
        diff: ``mean(a - b)``.
        effect_size: Cohen's d_z (``diff / sd(a - b)``); inf when every difference is the
            same non-zero number (up to the rounding of the scores: ``0.3 - 0.2`` and
            ``0.4 - 0.3`` are the same difference), NaN when n < 2 or all differences
            are 0.
        t_p: two-sided p-value of the paired t-test (NaN when undefined).
        perm_p: two-sided p-value of the exact sign-flip permutation test.
        min_perm_p: the smallest p-value the permutation test can give with n seeds.
    """

    n: int
    mean_a: float
    mean_b: float
    diff: float
    effect_size: float
    t_p: float
    perm_p: float
    min_perm_p: float


def _sign_flip_p(d: np.ndarray) -> float:
    """The share of the ``2^n`` sign flips of ``d`` whose ``|mean|`` reaches the observed
    one; a flip within rounding of it (relative to the largest ``|d|``, so the p-value does
    not depend on the scores' scale) counts as a tie, that is, as reaching it."""
    n = d.size
    if n > 16:
        raise ValueError(f"the exact permutation test enumerates 2^n sign flips; n = {n} > 16")
    observed = abs(d.mean())
    reach = observed - 1e-9 * float(np.abs(d).max())
    count = 0
    for signs in itertools.product((1.0, -1.0), repeat=n):
        if abs((d * np.asarray(signs)).mean()) >= reach:
            count += 1
    return count / 2**n


def paired_comparison(a: Sequence[float], b: Sequence[float]) -> PairedComparison:
    """Compare paired scores ``a[s]`` and ``b[s]`` (same seed ``s``); see the module text."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"a and b must be 1-D and of one length, got {x.shape} and {y.shape}")
    n = x.size
    if n == 0:
        raise ValueError("no paired scores to compare")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):  # NaN gave perm_p = 0
        raise ValueError(f"a and b must be finite scores, got {a!r} and {b!r}")
    # x - y carries the rounding of the scores (0.3 - 0.2 != 0.4 - 0.3): a difference or a
    # spread below it is 0, so equal differences give d_z = inf and t_p = 0, as documented
    tol = 1e-12 * max(float(np.abs(x).max()), float(np.abs(y).max()))
    d = x - y
    d = np.where(np.abs(d) <= tol, 0.0, d)
    diff = float(d.mean())
    if abs(diff) <= tol:  # differences that cancel up to rounding: a tie, not 5.6e-17
        diff = 0.0
    sd = float(d.std(ddof=1)) if n > 1 else float("nan")
    if n > 1 and sd <= tol:
        sd = 0.0
    if n < 2 or (sd == 0 and diff == 0):
        effect = float("nan")
    elif sd == 0:
        effect = math.copysign(math.inf, diff)
    else:
        effect = diff / sd
    if n < 2 or sd == 0:
        t_p = float("nan") if diff == 0 or n < 2 else 0.0
    else:
        t_p = float(stats.ttest_rel(x, y).pvalue)
    return PairedComparison(
        n=n,
        mean_a=float(x.mean()),
        mean_b=float(y.mean()),
        diff=diff,
        effect_size=effect,
        t_p=t_p,
        perm_p=_sign_flip_p(d),
        min_perm_p=min(1.0, 2.0 / 2**n),
    )


def compare_to_baseline(
    scores: Mapping[str, Mapping[int, float]], baseline: str
) -> dict[str, PairedComparison]:
    """Each mechanism against ``baseline`` on the seeds both have.

    Args:
        scores: ``{label: {seed: metric value}}``.
        baseline: the label to compare with (e.g. ``"mean"``).
    Returns ``{label: PairedComparison}`` for every label but the baseline that shares at
    least one seed with it.
    """
    if baseline not in scores:
        raise KeyError(f"baseline {baseline!r} not among {sorted(scores)}")
    base = scores[baseline]
    out = {}
    for label, by_seed in scores.items():
        if label == baseline:
            continue
        seeds = sorted(set(by_seed) & set(base))
        if seeds:
            out[label] = paired_comparison([by_seed[s] for s in seeds], [base[s] for s in seeds])
    return out
