"""The report's colours and its CSS / JavaScript files (``assets/``), read when a page is built.

The stylesheets and scripts are package files (``report.css``, ``errors.js``, ``report.js``,
``viewer.css``, ``weights.js``, ``viewer.js`` under ``attnlab/lab/report/assets/``), read
with :mod:`importlib.resources` and inlined into the page, so the report opens offline and
loads nothing from elsewhere. The colours the browser tests look for in a screenshot are
the constants here; the stylesheets name them as ``@HEAD@``, ``@HEAT@`` and ``@VIEWER@``,
replaced by :func:`asset`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from importlib import resources

__all__ = [
    "HEAT_RGB",
    "SERIES_COLOURS",
    "TABLE_HEADER_RGB",
    "VIEWER_RGB",
    "asset",
    "cell_style",
    "heat_colour",
    "rgb",
]

# The table header's background and the colour of the largest attention weight of a map.
# Both are chosen so that nothing else on the page uses them (the browser test looks for
# them in a screenshot).
TABLE_HEADER_RGB = (31, 58, 95)
HEAT_RGB = (204, 17, 102)
#: The viewer toolbar's colour; nothing else on the page uses it.
VIEWER_RGB = (14, 92, 77)

# Line colours of the learning curves (one per mechanism, cycled); none is close to the
# colours above.
SERIES_COLOURS = (
    "#1b7fbf",
    "#e08a00",
    "#2e9e44",
    "#7a4fb5",
    "#8c564b",
    "#17becf",
    "#6b6b6b",
    "#bcbd22",
    "#d4589e",
    "#3b3b9e",
)


def _hex(colour: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*colour)


_PLACEHOLDERS = {"@HEAD@": TABLE_HEADER_RGB, "@HEAT@": HEAT_RGB, "@VIEWER@": VIEWER_RGB}


@functools.cache
def asset(name: str) -> str:
    """The text of ``assets/<name>`` (e.g. ``"report.css"``), with the colour placeholders
    (``@HEAD@``, ``@HEAT@``, ``@VIEWER@``) replaced by the colours above."""
    text = (resources.files(__package__) / "assets" / name).read_text(encoding="utf-8")
    for placeholder, colour in _PLACEHOLDERS.items():
        text = text.replace(placeholder, _hex(colour))
    return text


def heat_colour(t: float) -> tuple[int, int, int]:
    """White (t = 0) to the heat colour (t = 1), linearly in RGB."""
    t = 0.0 if not math.isfinite(t) else min(max(t, 0.0), 1.0)
    return tuple(round(255 + (c - 255) * t) for c in HEAT_RGB)  # type: ignore[return-value]


def rgb(colour: Sequence[int]) -> str:
    """``rgb(r,g,b)`` of a colour."""
    return "rgb({},{},{})".format(*colour)


def cell_style(t: float) -> str:
    """The inline style of a cell or token shaded to ``t`` in [0, 1] (white text on the
    darker shades)."""
    text = "#ffffff" if t > 0.6 else "#1e1e1e"
    return f"background:{rgb(heat_colour(t))};color:{text}"
