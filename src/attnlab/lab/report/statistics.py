"""The report's numbers: means and standard deviations over seeds, the best mechanism per
metric, the paired tests against the baselines and the mean learning curves.

The paired tests themselves (paired t-test, exact sign-flip test, Cohen's d_z) are the pure
measures of :mod:`attnlab.evaluation.significance`; this module only gathers the scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from statistics import fmean
from typing import Any

from attnlab.lab.report.data import ReportData, RunRecord
from attnlab.lab.seed_stats import finite, mean_std

__all__ = [
    "as_float",
    "finite",
    "mean_curve",
    "mean_std",
    "paired_analysis",
    "summarize",
]

_BASELINES = ("mean", "uniform")


def as_float(value: Any) -> float:
    """``float(value)``, or NaN when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def summarize(data: ReportData) -> dict[str, dict[str, Any]]:
    """Per mechanism label: ``{"seeds": n_done, "failed": n_not_done, "test": {metric:
    (mean, std, n)}, "best": {metric, ...}}`` -- the numbers of the ablation table."""
    metrics = data.test_metrics
    table: dict[str, dict[str, Any]] = {}
    for label in data.labels:
        runs = data.runs_of(label)
        table[label] = {
            "seeds": len(runs),
            "failed": len([r for r in data.runs_of(label, done_only=False) if not r.done]),
            "test": {
                m: mean_std((r.metrics.get("test") or {}).get(m) for r in runs) for m in metrics
            },
            "best": set(),
        }
    for m in metrics:
        means = {
            lab: row["test"][m][0] for lab, row in table.items() if row["test"][m][0] is not None
        }
        if not means:
            continue
        pick = max if data.higher_is_better(m) else min
        best = pick(means.values())
        for lab, value in means.items():
            if value == best:
                table[lab]["best"].add(m)
    return table


def _scores_by_seed(data: ReportData, metric: str) -> dict[str, dict[int, float]]:
    """{label: {seed: test value}} of the finished runs with a seed and a finite value."""
    scores: dict[str, dict[int, float]] = {}
    for label in data.labels:
        for r in data.runs_of(label):
            value = (r.metrics.get("test") or {}).get(metric)
            if r.seed is not None and isinstance(value, (int, float)) and math.isfinite(value):
                scores.setdefault(label, {})[int(r.seed)] = float(value)
    return scores


def paired_analysis(data: ReportData, metric: str) -> dict[str, dict[str, Any]]:
    """Each mechanism against each baseline present (``mean``, ``uniform``) and against the
    best mechanism, on ``metric``, paired by seed (:mod:`attnlab.evaluation.significance`).
    Returns ``{reference: {label: PairedComparison.as_dict()}}``."""
    from attnlab.evaluation.significance import compare_to_baseline

    scores = _scores_by_seed(data, metric)
    refs = [b for b in _BASELINES if b in scores]
    ranked = sorted(
        (lab for lab in scores if lab not in _BASELINES),
        key=lambda lab: sum(scores[lab].values()) / len(scores[lab]),
        reverse=data.higher_is_better(metric),
    )
    if ranked:
        refs.append(ranked[0])
    return {
        ref: {k: v.as_dict() for k, v in compare_to_baseline(scores, ref).items()} for ref in refs
    }


def mean_curve(
    runs: Sequence[RunRecord], get: Callable[[Mapping[str, Any]], Any]
) -> list[tuple[float, float]]:
    """``[(epoch, mean over the runs of get(history entry)), ...]`` in epoch order (an
    entry without ``epoch`` is epoch i, counted from 1; non-finite values left out)."""
    by_epoch: dict[float, list[float]] = {}
    for r in runs:
        for i, h in enumerate(r.history, start=1):
            epoch = h.get("epoch", i)
            value = get(h)
            if finite([value]) and finite([epoch]):
                by_epoch.setdefault(float(epoch), []).append(float(value))
    return [(e, fmean(v)) for e, v in sorted(by_epoch.items())]
