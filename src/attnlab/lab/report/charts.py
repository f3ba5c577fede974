"""Inline SVG charts (no library): the learning curves' line chart and the explanation
section's scatter plots, on one shared frame (title, grid, ticks, axes, axis labels)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnlab.lab.report.markup import esc, fmt_num
from attnlab.lab.report.statistics import as_float
from attnlab.lab.report.theme import SERIES_COLOURS

__all__ = ["line_chart_svg", "scatter_svg"]


def _nice_step(span: float, ticks: int = 5) -> float:
    """A tick step of 1, 2, 2.5 or 5 times a power of ten giving about ``ticks`` ticks."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / ticks
    power = 10.0 ** math.floor(math.log10(raw)) if raw > 0 else 0.0
    if power == 0:  # a span among the smallest (subnormal) floats
        return span
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def _ticks(lo: float, hi: float, ticks: int = 5) -> tuple[float, float, list[float]]:
    """The axis range (rounded out to whole steps) and its tick values; for a range that
    whole steps cannot show (a span beyond the largest float, or steps below the values'
    precision, as for 1e16 and 1e16 + 4) the range itself with ``ticks`` even parts."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = max(lo - pad, -sys.float_info.max), min(hi + pad, sys.float_info.max)
    step = _nice_step(hi - lo, ticks)
    first, last = math.floor(lo / step), math.ceil(hi / step)
    if last - first <= 4 * ticks:
        first -= first * step > lo  # a quotient that underflowed to 0 (1e-194 / 5e129)
        last += last * step < hi
        values = [_clean((first + i) * step, step) for i in range(last - first + 1)]
        whole = all(math.isfinite(v) for v in values)
        if whole and len(set(values)) == len(values):  # steps above the values' precision
            return values[0], values[-1], values
    even = {lo * (1 - i / ticks) + hi * (i / ticks) for i in range(ticks + 1)}
    return lo, hi, sorted(even)


def _clean(v: float, step: float) -> float:
    """``v`` without the binary rounding error of a multiple of ``step``
    (0.30000000000000004), rounded to one digit below the step's leading digit."""
    try:
        return round(v, 1 - math.floor(math.log10(step)))
    except OverflowError:  # a multiple next to the largest float
        return v


def _value_text(v: float) -> str:
    """A data value in a tooltip: 4 decimals, or 4 significant digits from a million."""
    return f"{v:.4f}" if abs(v) < 1e6 else f"{v:.4g}"


def _tick_text(v: float) -> str:
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


@dataclass(frozen=True)
class _Style:
    """The measures of one kind of chart (pixels)."""

    cls: str
    left: int
    right: int
    top: int
    bottom: int
    title_y: int
    title_px: int
    x_ticks: int  # about how many ticks on the x axis
    whole_x: bool  # only whole-number x ticks when every x is whole (epochs)
    tick_marks: bool  # short marks under the x axis at its ticks
    tick_gap: int  # between the y axis and its tick labels
    x_tick_dy: int  # below the plot, of the x tick labels
    y_label_x: int  # of the rotated y axis label


_LINE = _Style("chart", 64, 16, 28, 44, 18, 13, 6, True, True, 6, 16, 14)
_SCATTER = _Style("scatter", 56, 14, 26, 42, 17, 12, 5, False, False, 5, 15, 13)


@dataclass(frozen=True)
class _Scale:
    """Data to pixel coordinates of a plot area."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    def x(self, x: float) -> float:
        return self.left + _fraction(x, self.x0, self.x1) * self.width

    def y(self, y: float) -> float:
        return self.top + self.height - _fraction(y, self.y0, self.y1) * self.height


def _fraction(v: float, lo: float, hi: float) -> float:
    """Where ``v`` lies between ``lo`` and ``hi`` (0 to 1); a range wider than the largest
    float is halved first, so that it does not overflow."""
    span = hi - lo
    if math.isfinite(span):
        return (v - lo) / span
    return (v / 2 - lo / 2) / (hi / 2 - lo / 2)


def _frame(
    style: _Style,
    pts: Sequence[tuple[float, float]],
    size: tuple[int, int, int],
    labels: tuple[str, str, str],
) -> tuple[list[str], _Scale | None]:
    """The opening ``<svg>``, title, grid, ticks, axes and axis labels of a chart of the
    points ``pts``, and the scale to draw the data with; without points a closed "no data"
    picture and None. ``size`` is (width, height of the plot's frame, height of the whole
    picture), ``labels`` (title, x axis label, y axis label)."""
    width, height, svg_height = size
    title, x_label, y_label = labels
    left, top = style.left, style.top
    plot_w, plot_h = width - left - style.right, height - top - style.bottom
    out = [
        f'<svg class="{style.cls}" width="{width}" height="{svg_height}" '
        f'viewBox="0 0 {width} {svg_height}" role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="{style.title_y}" '
        f'style="font-size:{style.title_px}px;font-weight:600">{esc(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{left}" y="{top + plot_h / 2:.0f}">no data</text></svg>')
        return out, None
    x0, x1, xt = _ticks(min(p[0] for p in pts), max(p[0] for p in pts), style.x_ticks)
    if style.whole_x and all(float(x).is_integer() for x, _ in pts):
        xt = [v for v in xt if float(v).is_integer()]
    y0, y1, yt = _ticks(min(p[1] for p in pts), max(p[1] for p in pts), 5)
    scale = _Scale(left, top, plot_w, plot_h, x0, x1, y0, y1)
    bottom = top + plot_h
    for v in yt:
        y = scale.y(v)
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text x="{left - style.tick_gap}" y="{y + 4:.1f}" text-anchor="end">'
            f"{esc(_tick_text(v))}</text>"
        )
    for v in xt:
        x = scale.x(v)
        if style.tick_marks:
            out.append(
                f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
            )
        out.append(
            f'<text x="{x:.1f}" y="{bottom + style.x_tick_dy}" text-anchor="middle">'
            f"{esc(_tick_text(v))}</text>"
        )
    out.append(
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{bottom}"/>'
        f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{bottom}" y2="{bottom}"/>'
        f'<text x="{left + plot_w / 2:.0f}" y="{bottom + 32}" text-anchor="middle">'
        f"{esc(x_label)}</text>"
        f'<text transform="translate({style.y_label_x},{top + plot_h / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{esc(y_label)}</text>'
    )
    return out, scale


def _finite_points(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def line_chart_svg(
    series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 540,
    height: int = 320,
) -> str:
    """An inline SVG line chart: ``series`` is ``[(name, colour, [(x, y), ...]), ...]``;
    axes with ticks, a grid, a legend; points are marked (so one-epoch runs show)."""
    pts = _finite_points([p for _, _, s in series for p in s])
    legend_h = 16 * len(series)  # a legend line per series
    out, scale = _frame(_LINE, pts, (width, height, height + legend_h), (title, x_label, y_label))
    if scale is None:
        return "".join(out)
    for i, (name, colour, s) in enumerate(series):
        good = _finite_points(s)
        if len(good) > 1:
            path = " ".join(f"{scale.x(x):.1f},{scale.y(y):.1f}" for x, y in good)
            out.append(
                f'<polyline fill="none" stroke="{esc(colour)}" stroke-width="2" points="{path}"/>'
            )
        for x, y in good:
            out.append(
                f'<circle cx="{scale.x(x):.1f}" cy="{scale.y(y):.1f}" r="3" fill="{esc(colour)}">'
                f"<title>{esc(name)}: {esc(fmt_num(y))} (epoch {esc(_tick_text(x))})</title></circle>"
            )
        ly = scale.top + scale.height + _LINE.bottom + 16 * i
        left = _LINE.left
        out.append(
            f'<line x1="{left}" x2="{left + 22}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{esc(colour)}" stroke-width="3"/>'
            f'<text x="{left + 28}" y="{ly}">{esc(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _num_or_nan(values: Any) -> list[float]:
    if not isinstance(values, (list, tuple)):
        return []
    return [as_float(v) if not isinstance(v, bool) else float("nan") for v in values]


def scatter_svg(
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 420,
    height: int = 300,
) -> str:
    """An inline SVG scatter plot of the finite ``(x, y)`` pairs (one ``circle.pt`` each, in
    input order, with the values in its tooltip)."""
    pts = _finite_points(
        [(float(x), float(y)) for x, y in zip(_num_or_nan(xs), _num_or_nan(ys), strict=False)]
    )
    out, scale = _frame(_SCATTER, pts, (width, height, height), (title, x_label, y_label))
    if scale is None:
        return "".join(out)
    for x, y in pts:
        out.append(
            f'<circle class="pt" cx="{scale.x(x):.2f}" cy="{scale.y(y):.2f}" r="3" '
            f'fill="{SERIES_COLOURS[0]}" fill-opacity="0.6">'
            f"<title>{_value_text(x)}, {_value_text(y)}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)
