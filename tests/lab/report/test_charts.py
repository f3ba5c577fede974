"""attnlab.lab.report.charts: the inline SVG charts' axes, and their data."""

from __future__ import annotations

import itertools
import math
import signal
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.lab.report.charts import _ticks, line_chart_svg, scatter_svg

LABELS = {"title": "t", "x_label": "x", "y_label": "y"}


@contextmanager
def _within(seconds: int):
    """Fail instead of hanging: an axis whose tick loop never ends stopped the report."""

    def stop(*_):
        raise TimeoutError(f"no axis within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_ticks_by_hand():
    assert _ticks(0.1, 0.7) == (0.0, 0.8, [0.0, 0.2, 0.4, 0.6, 0.8])
    assert _ticks(1, 10) == (0.0, 10.0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    assert _ticks(-0.37, 12.2) == (-5.0, 15.0, [-5.0, 0.0, 5.0, 10.0, 15.0])
    assert _ticks(1, 2000) == (0.0, 2000.0, [0.0, 500.0, 1000.0, 1500.0, 2000.0])
    assert _ticks(0.7, 0.1)[2] == [0.0, 0.2, 0.4, 0.6, 0.8]  # either order
    assert _ticks(3, 3) == (2.6, 3.4, [2.6, 2.8, 3.0, 3.2, 3.4])  # one value: 10 % around it
    assert _ticks(0, 0) == (-1.0, 1.0, [-1.0, -0.5, 0.0, 0.5, 1.0])
    assert _ticks(0.1, 0.3)[2] == [0.1, 0.15, 0.2, 0.25, 0.3]  # no 0.15000000000000002
    # small values keep their ticks (rounding to 12 decimals made 2.5e-12 into 2e-12 and
    # left 1.22e-11 above the axis)
    assert _ticks(0.0, 1.2234e-11) == (
        0.0,
        1.25e-11,
        [0.0, 2.5e-12, 5e-12, 7.5e-12, 1e-11, 1.25e-11],
    )
    assert _ticks(1e15, 1e15 + 10)[2] == [1e15 + 2 * i for i in range(6)]


@pytest.mark.parametrize(
    "lo, hi",
    [
        (1e16, 1e16 + 4),  # steps of 1 below the precision of 1e16 (2): looped for ever
        (-1e308, 1e308),  # a span beyond the largest float: looped over 2e308 steps
        (sys.float_info.max, sys.float_info.max),
        (-sys.float_info.max, sys.float_info.max),
        (5e-324, 1e-323),  # subnormal: no power of ten for the step
        (2.5e15, 2.5e15 + 1),
    ],
)
def test_ranges_whole_steps_cannot_show_still_get_an_axis(lo, hi):
    with _within(10):
        start, stop, values = _ticks(lo, hi)
    _check_axis(lo, hi, start, stop, values)


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(finite, finite)
def test_every_finite_range_gets_an_axis_that_covers_it(lo, hi):
    with _within(10):
        start, stop, values = _ticks(lo, hi)
    _check_axis(lo, hi, start, stop, values)


def _check_axis(lo, hi, start, stop, values):
    assert all(math.isfinite(v) for v in (start, stop, *values))
    assert start <= min(lo, hi) and stop >= max(lo, hi)
    assert start < stop
    assert values[0] == start and values[-1] == stop
    assert all(a < b for a, b in itertools.pairwise(values))  # distinct, in order
    assert 2 <= len(values) <= 21


def _circles(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)  # well-formed XML
    return [e for e in root.iter() if e.tag.endswith("circle")]


def test_line_chart_marks_every_finite_point_and_leaves_out_the_rest():
    series = [
        ("additive", "#123456", [(1, 0.5), (2, 0.6), (3, math.nan), (4, 0.7)]),
        ("dot <b>", "#654321", [(1, math.inf), (2, 0.4)]),
    ]
    svg = line_chart_svg(series, **LABELS)
    points = _circles(svg)
    assert len(points) == 4  # 3 + 1 finite
    titles = [p.find("{*}title").text if p.find("{*}title") is not None else "" for p in points]
    assert titles[0] == "additive: 0.5000 (epoch 1)"
    assert "dot <b>: 0.4000 (epoch 2)" in titles  # escaped in the SVG, read back as text
    assert svg.count("<polyline") == 1  # one point alone draws no line
    with _within(10):
        huge = line_chart_svg([("a", "#000", [(1, 1e16), (2, 1e16 + 4)])], **LABELS)
    assert len(_circles(huge)) == 2


def test_scatter_plot_points_and_no_data():
    svg = scatter_svg([0.1, 0.2, None, "x", True, 2e308], [1, 2, 3, 4, 5, 6], **LABELS)
    points = _circles(svg)
    assert [p.find("{*}title").text for p in points] == ["0.1000, 1.0000", "0.2000, 2.0000"]
    cx = [float(p.get("cx")) for p in points]
    assert cx[0] < cx[1]
    with _within(10):
        wide = scatter_svg([-1e308, 1e308], [0, 1], **LABELS)
    titles = [p.find("{*}title").text for p in _circles(wide)]
    assert titles == ["-1e+308, 0.0000", "1e+308, 1.0000"]
    tiny = scatter_svg([1e-323, 1.5e-323, 2e-323], [0, 1, 2], **LABELS)  # subnormal
    cx = [float(p.get("cx")) for p in _circles(tiny)]
    assert cx == sorted(cx) and len(set(cx)) == 3
    empty = scatter_svg([], [], **LABELS)
    assert "no data" in empty and _circles(empty) == []
