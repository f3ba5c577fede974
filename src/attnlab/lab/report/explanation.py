"""The "Is attention explanation?" section: the results of ``attnlab explain``
(``RUN_DIR/explanation/explanation.json``) as tables and SVG scatters, with the PNG plots
of that folder that the SVGs do not repeat, inlined.

Jain & Wallace (2019): Kendall τ between attention, gradient and leave-one-out importance,
the permutation test and adversarial attention; Wiegreffe & Pinter (2019): uniform weights
at test time, the frozen-weight MLP, adversarial models and the variance over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attnlab.lab.report.charts import scatter_svg
from attnlab.lab.report.context import ReportContext
from attnlab.lab.report.data import RunRecord, read_json
from attnlab.lab.report.markup import esc
from attnlab.lab.report.png import PNG_SIGNATURE, data_uri
from attnlab.lab.report.statistics import as_float

__all__ = ["SVG_DRAWN_PLOTS", "read_explanation", "render_explanation", "section_explanation"]

#: The PNG plots of ``attnlab explain`` that the report draws itself as SVG (from the same
#: numbers), by the result key they come from: the PNG is left out when the SVG is drawn.
SVG_DRAWN_PLOTS = {"permutation": "permutation.png", "adversarial": "adversarial.png"}

_SUMMARY = ("mean", "std", "median", "n")

Row = tuple[str, Sequence[tuple[str, Any]]]


def read_explanation(run: RunRecord) -> dict[str, Any] | None:
    """``RUN_DIR/explanation/explanation.json`` of a run (None when there is none)."""
    if run.run_dir is None:
        return None
    path = run.run_dir / "explanation" / "explanation.json"
    if not path.is_file():
        return None
    result = read_json(path, None)
    return result if isinstance(result, dict) else None


# ----------------------------------------------------------------------------- tables


def _num_cell(value: Any, key: str, digits: int = 4) -> str:
    v = as_float(value) if not isinstance(value, bool) else float("nan")
    if value is None or not math.isfinite(v):
        return f'<td data-key="{esc(key)}" data-value="">n/a</td>'
    text = str(int(v)) if isinstance(value, int) else f"{v:.{digits}f}"
    return f'<td data-key="{esc(key)}" data-value="{v:.17g}">{esc(text)}</td>'


def _explain_table(table_id: str, head: Sequence[str], rows: Sequence[Row]) -> str:
    """A table whose first column is a text label and the others numbers (``(key, value)``
    pairs; a cell's ``data-key`` is its key, ``data-value`` its full-precision value)."""
    th = "".join(
        f'<th class="{"label" if i == 0 else ""}">{esc(h)}</th>' for i, h in enumerate(head)
    )
    body = []
    for label, cells in rows:
        tds = "".join(_num_cell(v, k) for k, v in cells)
        body.append(f'<tr data-label="{esc(label)}"><td class="label">{esc(label)}</td>{tds}</tr>')
    return (
        f'<table class="data explain" id="{esc(table_id)}"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _field_rows(items: Iterable[tuple[str, Any]], fields: Sequence[str]) -> list[Row]:
    """One row per ``(label, mapping)`` item whose value is a mapping: its ``fields``."""
    return [
        (label, [(f, value.get(f)) for f in fields])
        for label, value in items
        if isinstance(value, Mapping)
    ]


def _section(title: str, table_id: str, head: Sequence[str], rows: Sequence[Row]) -> list[str]:
    return [f"<h4>{title}</h4>", _explain_table(table_id, head, rows)]


# ----------------------------------------------------------------------------- the tests


def _kendall(p: str, result: Mapping[str, Any]) -> list[str]:
    kendall = result.get("kendall")
    if not (isinstance(kendall, Mapping) and kendall):
        return []
    rows = _field_rows(
        ((str(k), v) for k, v in kendall.items()), ("mean", "std", "significant", "n")
    )
    return _section(
        "Kendall τ between importance measures (Jain &amp; Wallace)",
        f"{p}-kendall",
        ["pair", "mean τ", "std", "fraction p ≤ 0.05", "n"],
        rows,
    )


def _permutation_adversarial(p: str, result: Mapping[str, Any]) -> list[str]:
    """The permutation test's and adversarial attention's summaries, and the bound of the
    adversarial search."""
    perm, adv = result.get("permutation"), result.get("adversarial")
    summaries: list[Row] = []
    if isinstance(perm, Mapping) and isinstance(perm.get("median_tvd"), Mapping):
        s = perm["median_tvd"]
        summaries.append(("permutation: median output TVD", [(k, s.get(k)) for k in _SUMMARY]))
    if isinstance(adv, Mapping) and isinstance(adv.get("max_jsd"), Mapping):
        s = adv["max_jsd"]
        summaries.append(
            (
                f"adversarial attention (TVD ≤ {adv.get('epsilon')}): max JSD",
                [(k, s.get(k)) for k in _SUMMARY],
            )
        )
    if not summaries:
        return []
    parts = _section(
        "Permutation and adversarial attention (Jain &amp; Wallace)",
        f"{p}-summaries",
        ["test", "mean", "std", "median", "n"],
        summaries,
    )
    if isinstance(adv, Mapping):
        bounds: list[Row] = [
            ("epsilon (TVD bound)", [("epsilon", adv.get("epsilon"))]),
            ("JSD upper bound", [("jsd_bound", adv.get("jsd_bound"))]),
            (
                "fraction with max JSD > bound / 2",
                [("fraction_above_half_bound", adv.get("fraction_above_half_bound"))],
            ),
        ]
        parts.append(_explain_table(f"{p}-adversarial", ["adversarial attention", "value"], bounds))
    return parts


#: The scatters drawn per instance: result key, title, y axis label.
_SCATTERS = (
    ("permutation", "permutation test", "median output TVD"),
    ("adversarial", "adversarial attention", "max JSD"),
)


def _scatters(result: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The per-instance scatters (max attention weight against the test's measure) and the
    result keys they draw."""
    charts, drawn = [], []
    for key, title, y_label in _SCATTERS:
        part = result.get(key)
        if not isinstance(part, Mapping):
            continue
        drawn.append(key)
        charts.append(
            scatter_svg(
                part.get("max_weight") or [],
                part.get("per_instance") or [],
                title=title,
                x_label="max attention weight",
                y_label=y_label,
            )
        )
    return ([f'<div class="charts">{"".join(charts)}</div>'] if charts else []), drawn


def _uniform(p: str, result: Mapping[str, Any]) -> list[str]:
    uni = result.get("uniform")
    if not isinstance(uni, Mapping):
        return []
    rows: list[Row] = [
        (name, [("accuracy", uni.get(f"{name}_accuracy")), ("f1", uni.get(f"{name}_f1"))])
        for name in ("learned", "uniform")
    ]
    la, ua = as_float(uni.get("learned_accuracy")), as_float(uni.get("uniform_accuracy"))
    lf, uf = as_float(uni.get("learned_f1")), as_float(uni.get("uniform_f1"))
    rows.append(("learned − uniform", [("accuracy", la - ua), ("f1", lf - uf)]))
    return _section(
        "Uniform weights at test time (Wiegreffe &amp; Pinter)",
        f"{p}-uniform",
        ["weights", "accuracy", "macro F1"],
        rows,
    )


def _frozen(p: str, result: Mapping[str, Any]) -> list[str]:
    fw = result.get("frozen_weights")
    if not (isinstance(fw, Mapping) and fw):
        return []
    return _section(
        "Frozen-weight MLP (Wiegreffe &amp; Pinter)",
        f"{p}-frozen",
        ["weights", "accuracy", "macro F1"],
        _field_rows(((str(k), v) for k, v in fw.items()), ("accuracy", "f1")),
    )


def _adversarial_models(p: str, result: Mapping[str, Any]) -> list[str]:
    sweep = result.get("adversarial_models")
    if not (isinstance(sweep, list) and sweep):
        return []
    items = ((str(s.get("lambda")), s) for s in sweep if isinstance(s, Mapping))
    return _section(
        "Adversarial models (Wiegreffe &amp; Pinter)",
        f"{p}-advmodels",
        ["λ", "mean output TVD", "mean attention JSD", "accuracy"],
        _field_rows(items, ("mean_tvd", "mean_jsd", "accuracy")),
    )


def _seed_variance(p: str, result: Mapping[str, Any]) -> list[str]:
    sv = result.get("seed_variance")
    if not isinstance(sv, Mapping):
        return []
    others = sv.get("runs") or []
    row: Row = (
        f"{len(others)} other run(s)",
        [
            ("mean_jsd", sv.get("mean_jsd")),
            ("mean_tvd", sv.get("mean_tvd")),
            ("n", len(sv.get("jsd") or [])),
        ],
    )
    parts = _section(
        "Seed variance (Wiegreffe &amp; Pinter)",
        f"{p}-seeds",
        ["against", "mean attention JSD", "mean output TVD", "instances"],
        [row],
    )
    if others:
        parts.append(
            '<p class="muted small">compared with: '
            + ", ".join(f"<code>{esc(o)}</code>" for o in others)
            + "</p>"
        )
    if sv.get("jsd") and sv.get("tvd"):
        parts.append(
            scatter_svg(
                sv["jsd"],
                sv["tvd"],
                title="seed variance per instance",
                x_label="attention JSD",
                y_label="output TVD",
            )
        )
    return parts


# ----------------------------------------------------------------------------- PNG plots


def _plain_png_name(name: str) -> bool:
    """A plain ``*.png`` file name (no folder, not hidden)."""
    return not ("/" in name or "\\" in name or name.startswith(".")) and name.endswith(".png")


def _explanation_plots(
    run: RunRecord, result: Mapping[str, Any], skip: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """(name, data URI) of the PNG plots next to explanation.json: those the JSON lists, else
    every ``*.png`` of the folder (sorted), without the names in ``skip``. Only plain file
    names inside the folder."""
    if run.run_dir is None:
        return []
    folder = run.run_dir / "explanation"
    names = result.get("plots")
    if not isinstance(names, list):
        names = sorted(p.name for p in folder.glob("*.png"))
    skipped = set(skip)
    out = []
    for name in map(str, names):
        path = folder / name
        if not _plain_png_name(name) or name in skipped or not path.is_file():
            continue
        data = path.read_bytes()
        if data.startswith(PNG_SIGNATURE):
            out.append((name, data_uri(data)))
    return out


def _plots(run: RunRecord, result: Mapping[str, Any], drawn: Sequence[str]) -> list[str]:
    plots = _explanation_plots(run, result, skip=[SVG_DRAWN_PLOTS[k] for k in drawn])
    if not plots:
        return []
    figures = [
        f'<figure><img src="{uri}" alt="{esc(name)}" class="plot">'
        f"<figcaption>{esc(name)}</figcaption></figure>"
        for name, uri in plots
    ]
    return ['<div class="plots">', *figures, "</div>"]


# ----------------------------------------------------------------------------- the section


def render_explanation(run: RunRecord, result: Mapping[str, Any], index: int) -> str:
    """One run's explanation results (``attnlab explain``) as tables, SVG scatters and the
    PNG plots that no SVG shows already (:data:`SVG_DRAWN_PLOTS`)."""
    p = f"explain-{index}"
    charts, drawn = _scatters(result)
    parts = [
        f'<div class="explanation" data-run="{esc(run.run_id)}">',
        f"<h3><code>{esc(run.label)}</code>"
        f"{'' if run.seed is None else f' (seed {esc(run.seed)})'}</h3>",
        f'<p class="muted">{esc(result.get("instances", "?"))} test instances; run '
        f"<code>{esc(run.run_id)}</code>.</p>",
        *_kendall(p, result),
        *_permutation_adversarial(p, result),
        *charts,
        *_uniform(p, result),
        *_frozen(p, result),
        *_adversarial_models(p, result),
        *_seed_variance(p, result),
        *_plots(run, result, drawn),
        "</div>",
    ]
    return "".join(parts)


def section_explanation(ctx: ReportContext) -> str:
    """Every run's explanation results, mechanisms in the table's order."""
    parts = []
    for label in ctx.data.labels:
        for run in ctx.data.runs_of(label):
            result = read_explanation(run)
            if result is not None:
                parts.append(render_explanation(run, result, len(parts)))
    if not parts:
        return ""
    note = (
        '<p class="muted">Results of <code>attnlab explain RUN_DIR</code> '
        "(<code>explanation/explanation.json</code>): Jain &amp; Wallace (2019) -- Kendall τ "
        "between attention, gradient and leave-one-out importance, the permutation test, "
        "adversarial attention; Wiegreffe &amp; Pinter (2019) -- uniform weights at test "
        "time, the frozen-weight MLP, adversarial models, seed variance. n/a: not computed "
        "(e.g. too short instances).</p>"
    )
    return note + "".join(parts)
