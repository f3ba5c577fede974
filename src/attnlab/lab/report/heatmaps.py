"""Static attention heatmaps in HTML: shaded tokens, shaded tables and weight bars, and the
main map of an example by its kind (``tokens``, ``matrix``, ``image``).

Shading is relative: a weight ``w`` is drawn at ``t = w / scale`` from white (0) to the
heat colour (1), where the scale is the largest weight of the row (of the map for
matrices), except for a uniform row (the ``mean`` and ``uniform`` baselines, every weight
1/n), which is shaded by its weights themselves (:func:`row_scale`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attnlab.lab.report.markup import esc
from attnlab.lab.report.png import png_data_uri
from attnlab.lab.report.statistics import as_float
from attnlab.lab.report.theme import HEAT_RGB, cell_style, heat_colour, rgb
from attnlab.lab.seed_stats import finite

__all__ = [
    "bar",
    "is_uniform",
    "render_image",
    "render_matrix",
    "render_tokens",
    "row_scale",
    "table_heat",
    "token_spans",
]


def is_uniform(row: Iterable[Any]) -> bool:
    """Whether every finite weight of ``row`` (at least two, positive) is the same: the
    attention of the ``uniform`` and ``mean`` baselines."""
    vals = finite(row)
    return len(vals) > 1 and vals[0] > 0 and all(abs(v - vals[0]) <= 1e-6 * vals[0] for v in vals)


def row_scale(row: Sequence[Any]) -> float:
    """What the shading of ``row`` divides by: its largest weight, so that the largest is
    drawn in full colour -- except for a uniform row, whose weights (1/n) are drawn as they
    are (else every token of a uniform row would be in full colour)."""
    if is_uniform(row):
        return 1.0
    vals = finite(row)
    top = max(vals) if vals else 0.0
    return top if top > 0 else 1.0


def _uniform_note(row: Sequence[Any]) -> str:
    """A muted note for a uniform row (else ``""``)."""
    if not is_uniform(row):
        return ""
    w = finite(row)[0]
    return f'<span class="muted small uniform"> uniform: every weight {w:.4g}</span>'


def _shade(w: float, lo: float, span: float) -> float:
    """Where ``w`` falls between ``lo`` (0) and ``lo + span`` (1); 0 for a non-finite ``w``."""
    return (w - lo) / span if math.isfinite(w) else 0.0


def token_spans(
    tokens: Sequence[Any],
    weights: Sequence[float],
    cls: str = "tok",
    *,
    scale: float | None = None,
) -> str:
    """The tokens as shaded spans (the weight in the tooltip and ``data-weight``), relative
    to ``scale`` (default :func:`row_scale` of the weights)."""
    scale = row_scale(weights) if scale is None else scale
    spans = []
    for tok, w in zip(tokens, weights, strict=False):
        t = _shade(w, 0.0, scale)
        spans.append(
            f'<span class="{cls}" style="{cell_style(t)}" title="{esc(f"{w:.4f}")}" '
            f'data-weight="{w!r}">{esc(tok)}</span>'
        )
    return " ".join(spans)


def table_heat(
    rows: Sequence[Any],
    cols: Sequence[Any],
    weights: Sequence[Sequence[float]],
    *,
    cell_cls: str,
    table_cls: str,
    lo: float = 0.0,
    span: float | None = None,
    labels: bool = True,
) -> str:
    """A table of cells shaded from ``lo`` to ``lo + span`` (default: to the largest weight),
    with row and column labels (unless ``labels`` is false) and each value in its tooltip."""
    if span is None:
        vals = finite(v for r in weights for v in r)
        hi = max(vals) if vals else 1.0
        span = hi - lo if hi > lo else 1.0
    head = (
        "<thead><tr><th></th>"
        + "".join(f'<th class="col" scope="col">{esc(c)}</th>' for c in cols)
        + "</tr></thead>"
        if labels
        else ""
    )
    body = []
    for i, row in enumerate(weights):
        cells = []
        for j, w in enumerate(row):
            name = f"{rows[i] if i < len(rows) else i} → {cols[j] if j < len(cols) else j}"
            cells.append(
                f'<td class="{cell_cls}" style="{cell_style(_shade(w, lo, span))}" '
                f'title="{esc(f"{name}: {w:.4f}")}" data-weight="{w!r}"></td>'
            )
        label = f'<th class="row" scope="row">{esc(rows[i] if i < len(rows) else "")}</th>'
        body.append(f"<tr>{label if labels else ''}{''.join(cells)}</tr>")
    return f'<table class="{table_cls}">{head}<tbody>{"".join(body)}</tbody></table>'


def bar(w: float, scale: float, width: int = 80) -> str:
    """A horizontal bar of ``width`` pixels filled to ``w / scale`` in the heat colour."""
    t = w / scale if math.isfinite(w) and scale > 0 else 0.0
    t = min(max(t, 0.0), 1.0)
    return (
        f'<span class="wbar" style="width:{width}px"><span style="width:{t * width:.1f}px;'
        f'background:{rgb(HEAT_RGB)}"></span></span>'
    )


def _labels(example: Mapping[str, Any]) -> tuple[list[Any], list[Any], list[Any]]:
    """An example's row labels, column labels and weights (empty lists when missing)."""
    return (
        list(example.get("rows") or []),
        list(example.get("cols") or []),
        example.get("weights") or [],
    )


def render_tokens(example: Mapping[str, Any]) -> str:
    """A ``tokens`` example: each row as the sentence with each token shaded by its weight
    (relative to the row's largest weight); the weight is in the tooltip."""
    rows, cols, weights = _labels(example)
    out = []
    for i, row in enumerate(weights):
        label = rows[i] if i < len(rows) else ""
        spans = token_spans(cols, [as_float(w) for w in row], scale=row_scale(row))
        head = (
            f'<span class="rowlabel">{esc(label)}</span>'
            if len(weights) > 1 or label not in ("", "attention")
            else ""
        )
        out.append(f'<p class="tokens">{head}{spans}{_uniform_note(row)}</p>')
    return "".join(out)


def render_matrix(example: Mapping[str, Any]) -> str:
    """A ``matrix`` example: a rows x cols table of cells shaded by weight (relative to the
    largest weight of the matrix), row and column labels, the value in each tooltip."""
    rows, cols, weights = _labels(example)
    every = [w for r in weights for w in r]
    table = table_heat(
        rows,
        cols,
        [[as_float(w) for w in row] for row in weights],
        cell_cls="cell",
        table_cls="heat",
        span=row_scale(every),
    )
    note = f"<div>{_uniform_note(every)}</div>" if is_uniform(every) else ""
    return table + note


def _picture(example: Mapping[str, Any], size: int) -> tuple[str, int]:
    """The example's picture as an ``<img>`` (a PNG data URI) ``size`` pixels wide and its
    height in pixels; ``""`` when there is none or it cannot be drawn."""
    image = example.get("image")
    height = size
    if not image:
        return "", height
    try:
        ih, iw = len(image), len(image[0])
        height = round(size * ih / iw) if iw else size
        return (
            f'<img src="{png_data_uri(image)}" width="{size}" height="{height}" '
            f'alt="{esc(example.get("title", "image"))}">'
        ), height
    except (TypeError, ValueError, IndexError):
        return "", height  # the height stays when only the picture cannot be encoded


def _grid_rects(
    row: Sequence[Any], cols: Sequence[Any], gw: int, cw: float, ch: float, over_image: bool
) -> str:
    """One row's attention as SVG rectangles on a grid ``gw`` cells wide: semi-transparent
    heat over a picture, else opaque shading."""
    scale = row_scale(row)
    rects = []
    for k, w in enumerate(row):
        w = as_float(w)
        t = _shade(w, 0.0, scale)
        r, c = divmod(k, gw)
        if over_image:
            fill = f'fill="{rgb(HEAT_RGB)}" fill-opacity="{0.75 * t:.3f}"'
        else:
            fill = f'fill="{rgb(heat_colour(t))}"'
        rects.append(
            f'<rect x="{c * cw:.2f}" y="{r * ch:.2f}" width="{cw:.2f}" height="{ch:.2f}" '
            f'{fill} stroke="#ffffff" stroke-opacity="0.35">'
            f"<title>{esc(cols[k] if k < len(cols) else k)}: {w:.4f}</title></rect>"
        )
    return "".join(rects)


def _grid_shape(example: Mapping[str, Any], n_cols: int) -> tuple[int, int]:
    """(rows, columns) of the image's attention grid (one row of ``n_cols`` by default)."""
    grid = example.get("grid")
    if grid and len(grid) == 2:
        return int(grid[0]), int(grid[1])
    return 1, n_cols


def render_image(example: Mapping[str, Any], *, size: int = 192, max_rows: int = 4) -> str:
    """An ``image`` example: the picture (a PNG data URI) with the attention grid drawn over
    it (one overlay per row, at most ``max_rows``); without a picture, the grid alone."""
    rows, cols, weights = _labels(example)
    gh, gw = _grid_shape(example, len(cols))
    if gh * gw != len(cols) or gh <= 0 or gw <= 0:
        return render_matrix(example)  # a grid that does not fit the columns: show the numbers
    img_html, height = _picture(example, size)
    width = size
    cw, ch = width / gw, height / gh
    boxes = []
    for i, row in enumerate(weights[:max_rows]):
        rects = _grid_rects(row, cols, gw, cw, ch, bool(img_html))
        cls = "overlay" if img_html else ""
        svg = (
            f'<svg class="{cls}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{rects}</svg>'
        )
        label = rows[i] if i < len(rows) else ""
        caption = (
            f'<div class="muted" style="font-size:11px">{esc(label)}</div>'
            if label and label != "attention"
            else ""
        )
        boxes.append(f'<div><div class="imagebox">{img_html}{svg}</div>{caption}</div>')
    more = (
        f'<div class="muted">({len(weights) - max_rows} more rows not shown)</div>'
        if len(weights) > max_rows
        else ""
    )
    return f'<div class="imagepair">{"".join(boxes)}</div>{more}'
