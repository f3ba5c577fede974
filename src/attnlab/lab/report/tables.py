"""The page's tables of numbers: the ablation table (test metrics per mechanism), the paired
tests against the baselines, the cost per mechanism, and the failed or unfinished runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnlab.lab.report.context import ReportContext
from attnlab.lab.report.data import RunRecord
from attnlab.lab.report.markup import esc, fmt_mean_std, fmt_num
from attnlab.lab.report.statistics import paired_analysis, summarize
from attnlab.lab.seed_stats import finite, mean_std

__all__ = [
    "PEAK_MEMORY_FLOOR_MB",
    "section_analysis",
    "section_cost",
    "section_failed",
    "section_table",
]

#: CPU peak-memory means below this (MB) are shown as "< 0.1 †": the run fit in memory its
#: process already held (see :func:`section_cost`).
PEAK_MEMORY_FLOOR_MB = 0.1


def _full(value: float | None) -> str:
    """A number at full precision for a ``data-*`` attribute (``""`` for None)."""
    return "" if value is None else f"{value:.17g}"


# ----------------------------------------------------------------------------- ablation


def _metric_cell(metric: str, stats: tuple[float | None, float | None, int], best: bool) -> str:
    mean, std, n = stats
    cls = ' class="best"' if best else ""
    return (
        f'<td{cls} data-metric="{esc(metric)}" data-value="{_full(mean)}" data-std="{_full(std)}" '
        f'data-n="{n}">'
        f"{esc(fmt_mean_std(mean, std))}</td>"
    )


def section_table(ctx: ReportContext) -> str:
    """The ablation table: mean ± std of every test metric per mechanism, the best marked."""
    data = ctx.data
    metrics = data.test_metrics
    if not data.labels:
        return '<p class="muted">no runs.</p>'
    table = summarize(data)
    arrows = {m: ("↑" if data.higher_is_better(m) else "↓") for m in metrics}
    head = '<th class="label">mechanism</th>' + "".join(
        f'<th title="{"higher" if data.higher_is_better(m) else "lower"} is better">'
        f"{esc(m)} {arrows[m]}</th>"
        for m in metrics
    )
    head += "<th>seeds</th><th>failed</th>"
    body = []
    for label, row in table.items():
        cells = [f'<td class="label"><code>{esc(label)}</code></td>']
        cells += [_metric_cell(m, row["test"][m], m in row["best"]) for m in metrics]
        cells.append(f'<td data-value="{row["seeds"]}">{row["seeds"]}</td>')
        cells.append(f'<td data-value="{row["failed"]}">{row["failed"]}</td>')
        body.append(f'<tr data-label="{esc(label)}">{"".join(cells)}</tr>')
    note = (
        '<p class="muted">Test metrics, mean ± sample standard deviation over the seeds that '
        "finished (no ± with one seed). ★ marks the best mechanism per metric (↑ higher is "
        "better, ↓ lower is better).</p>"
    )
    if not metrics:
        note += '<p class="muted">No finished run has test metrics.</p>'
    return (
        f'<table class="data sortable" id="ablation-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>{note}"
    )


# ----------------------------------------------------------------------------- paired tests


def _analysis_table(ref: str, metric: str, rows: Mapping[str, Mapping[str, Any]]) -> str:
    body = []
    for label, c in rows.items():
        body.append(
            f'<tr data-label="{esc(label)}"><td class="label"><code>{esc(label)}</code></td>'
            f"<td>{c['n']}</td><td>{fmt_num(c['diff'])}</td>"
            f"<td>{fmt_num(c['effect_size'])}</td><td>{fmt_num(c['t_p'])}</td>"
            f"<td>{fmt_num(c['perm_p'])} (floor {fmt_num(c['min_perm_p'])})</td></tr>"
        )
    return (
        f"<h3>vs <code>{esc(ref)}</code> on test {esc(metric)}</h3>"
        f'<table class="data" id="analysis-{esc(ref)}"><thead><tr><th class="label">'
        "mechanism</th><th>paired seeds</th><th>mean difference</th><th>Cohen's d_z</th>"
        "<th>paired t-test p</th><th>sign-flip p</th></tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def section_analysis(ctx: ReportContext) -> str:
    """Paired tests over seeds on the primary metric (:func:`paired_analysis`)."""
    data = ctx.data
    metric = data.primary or (data.test_metrics[0] if data.test_metrics else None)
    if metric is None:
        return '<p class="muted">no finished runs with test metrics.</p>'
    analysis = paired_analysis(data, metric)
    if not any(analysis.values()):
        if data.kind == "run":
            return ""  # one run: nothing to pair it with
        return (
            '<p class="muted">No paired tests: they need at least two mechanisms with '
            "finished runs on the same seeds.</p>"
        )
    parts = [_analysis_table(ref, metric, rows) for ref, rows in analysis.items() if rows]
    note = (
        '<p class="muted">Differences are mechanism minus reference over the seeds both ran '
        "(paired by seed). d_z = mean difference / sd of the differences. The exact sign-flip "
        "test cannot go below 2/2^n with n seeds (the floor), so few seeds cannot reach "
        "p &lt; 0.05 however large the effect; read the effect size with it.</p>"
    )
    return "".join(parts) + note


# ----------------------------------------------------------------------------- cost

_COST_FIELDS = (
    ("parameters", "parameters", 0),
    ("seconds_per_epoch", "s / epoch", 3),
    ("eval_ms_per_example", "eval ms / example", 3),
    ("peak_memory_mb", "peak memory (MB)", 1),
)


def _cost_text(
    key: str, mean: float | None, digits: int, runs: Sequence[RunRecord]
) -> tuple[str, bool]:
    """A cost cell's text, and whether it is a CPU peak memory below the floor (†)."""
    if mean is None:
        return "n/a", False
    if key == "peak_memory_mb" and mean < PEAK_MEMORY_FLOOR_MB:
        if any(str(r.run.get("device") or "cpu").startswith("cuda") for r in runs):
            return f"{mean:.2g}", False  # CUDA's own count of the run's tensors
        return f"< {PEAK_MEMORY_FLOOR_MB:g} †", True
    if digits == 0:
        return f"{round(mean):,}", False
    return f"{mean:.{digits}f}", False


def _cost_cell(key: str, digits: int, runs: Sequence[RunRecord]) -> tuple[str, bool]:
    """One mechanism's mean of a cost over its runs as a table cell (the peak memory with
    each seed's value in the tooltip), and whether it carries the † note."""
    mean, _, _ = mean_std(r.cost.get(key) for r in runs)
    text, below = _cost_text(key, mean, digits, runs)
    title = ""
    if key == "peak_memory_mb" and mean is not None:
        each = ", ".join(fmt_num(v) for v in finite(r.cost.get(key) for r in runs))
        title = f' title="per seed: {esc(each)}"'
    return f'<td data-key="{key}" data-value="{_full(mean)}"{title}>{esc(text)}</td>', below


def section_cost(ctx: ReportContext) -> str:
    """Parameters, time per epoch, evaluation time per example and peak memory per
    mechanism (means over the finished seeds)."""
    data = ctx.data
    if not any(r.cost for r in data.done):
        return ""
    head = '<th class="label">mechanism</th>' + "".join(
        f"<th>{esc(t)}</th>" for _, t, _ in _COST_FIELDS
    )
    body = []
    below = False
    for label in data.labels:
        runs = data.runs_of(label)
        cells = [f'<td class="label"><code>{esc(label)}</code></td>']
        for key, _, digits in _COST_FIELDS:
            cell, under = _cost_cell(key, digits, runs)
            cells.append(cell)
            below = below or under
        body.append(f"<tr>{''.join(cells)}</tr>")
    dagger = (
        f" † Below {PEAK_MEMORY_FLOOR_MB:g} MB: the runs needed no memory beyond what their "
        "process already held -- an earlier run in the same process (an ablation with "
        "--jobs 1, a worker of --jobs N, the demo) had freed it. It does not mean the "
        "mechanism needs none."
        if below
        else ""
    )
    return (
        f'<table class="data sortable" id="cost-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
        '<p class="muted">Means over the finished seeds; n/a where the run did not measure it. '
        "Peak memory as the trainer measured it (on CUDA the peak allocated memory; on the CPU "
        "the largest increase of the resident memory over its value after the data is "
        "loaded, sampled every 10 ms: memory the process newly needed, so runs that share a "
        "process are not comparable -- the first includes one-time costs, later ones reuse "
        f"freed memory; hover a cell for the value of each seed).{esc(dagger)}</p>"
    )


# ----------------------------------------------------------------------------- failed runs


def section_failed(ctx: ReportContext) -> str:
    """The runs that did not finish and the run directories that could not be read."""
    runs = ctx.data.not_done
    if not runs and not ctx.data.unreadable:
        return ""
    entries = [(r.label, r.seed, r.status, r.run_id, r.error or "") for r in runs]
    known = {r.run_id: r for r in ctx.data.runs}
    for run_id, why in ctx.data.unreadable:  # its files are damaged; the store may know it
        r = known.get(run_id)
        note = f"{why} (the report uses its row in results.sqlite)" if r is not None else why
        label, seed = (r.label, r.seed) if r is not None else ("?", None)
        entries.append((label, seed, "unreadable", run_id, note))
    rows = [
        f'<tr class="failed"><td class="label"><code>{esc(label)}</code></td>'
        f"<td>{esc(seed if seed is not None else '')}</td>"
        f'<td class="label">{esc(status)}</td><td class="label mono">{esc(run_id)}</td>'
        f'<td class="label"><pre>{esc(error)}</pre></td></tr>'
        for label, seed, status, run_id, error in entries
    ]
    return (
        '<table class="data" id="failed-table"><thead><tr><th class="label">mechanism</th>'
        '<th>seed</th><th class="label">status</th><th class="label">run</th>'
        f'<th class="label">error</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )
