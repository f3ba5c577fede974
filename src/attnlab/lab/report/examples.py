"""One attention example as an HTML block (its main map by kind, its extra views, gold and
prediction, the remaining extra keys), and the section of static examples."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attnlab.lab.report.context import ReportContext
from attnlab.lab.report.heatmaps import render_image, render_matrix, render_tokens
from attnlab.lab.report.markup import esc, option_text
from attnlab.lab.report.views import VIEW_RENDERERS, extra_views

__all__ = ["RENDERERS", "render_example", "section_examples"]

#: The renderer of an example's main map, by its ``kind`` (others are drawn as matrices).
RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "tokens": render_tokens,
    "matrix": render_matrix,
    "image": render_image,
}


def _views_html(views: Mapping[str, Any]) -> str:
    html = ""
    for name, view in views.items():
        try:
            html += VIEW_RENDERERS[name](view)
        except Exception as err:  # a malformed view must not lose the page
            html += f'<p class="muted">cannot draw the {esc(name)} view: {esc(err)}</p>'
    return html


def _gold_html(example: Mapping[str, Any]) -> str:
    gold = []
    if example.get("label") is not None:
        gold.append(f"gold: <b>{esc(example['label'])}</b>")
    if example.get("prediction") is not None:
        gold.append(f"predicted: <b>{esc(example['prediction'])}</b>")
    return f'<div class="gold">{" · ".join(gold)}</div>' if gold else ""


def _rest_html(extra: Any, used: set[str]) -> str:
    """The extra keys no view consumed, as ``key: value`` text."""
    rest = {k: v for k, v in extra.items() if k not in used} if isinstance(extra, Mapping) else {}
    if not rest:
        return ""
    items = ", ".join(f"{esc(k)}: {option_text(v)}" for k, v in rest.items())
    return f'<div class="gold">{items}</div>'


def render_example(example: Mapping[str, Any]) -> str:
    """One attention example (an ``AttentionExample.to_json()`` dict) as an HTML block."""
    kind = str(example.get("kind") or "tokens")
    renderer = RENDERERS.get(kind, render_matrix)
    try:
        body = renderer(example)
    except Exception as err:  # a malformed example must not lose the whole report
        body = f'<p class="muted">cannot draw this example: {esc(err)}</p>'
    views, used = extra_views(example)
    rest = _rest_html(example.get("extra") or {}, used)
    return (
        f'<div class="example" data-kind="{esc(kind)}"><h4>{esc(example.get("title", ""))}</h4>'
        f"{body}{_views_html(views)}{_gold_html(example)}{rest}</div>"
    )


def section_examples(ctx: ReportContext) -> str:
    """The attention of the first seed of each mechanism on its first test examples."""
    data = ctx.data
    parts = []
    for label in data.labels:
        runs = [r for r in data.runs_of(label) if r.examples]
        if not runs:
            continue
        first = runs[0]
        blocks = "".join(render_example(e) for e in first.examples[: ctx.max_examples])
        seed = "" if first.seed is None else f" (seed {esc(first.seed)})"
        parts.append(
            f'<div class="mechanism" data-label="{esc(label)}">'
            f'<h3><code>{esc(label)}</code>{seed}</h3><div class="examples">{blocks}</div></div>'
        )
    if not parts:
        return ""
    legend = (
        '<p class="muted">Attention on test examples (the first seed of each mechanism). '
        'Shading: 0 <span class="scale"></span> the largest weight of the row (of the map, '
        "for matrices); a uniform row (the mean and uniform baselines: every weight 1/n) is "
        "shaded by its weights themselves; hover for the value.</p>"
    )
    return legend + "".join(parts)
