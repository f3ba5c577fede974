"""Escaping and number formatting shared by every part of the page."""

from __future__ import annotations

import html
import json
from typing import Any

__all__ = ["esc", "fmt_mean_std", "fmt_num", "option_text"]


def esc(value: Any) -> str:
    """HTML-escape any value (quotes included); ``None`` is the empty text."""
    return html.escape("" if value is None else str(value), quote=True)


def option_text(value: Any) -> str:
    """A value of the run's options or an example's ``extra`` as text: strings as they
    are, anything else as JSON (escaped)."""
    return esc(value if isinstance(value, str) else json.dumps(value))


def fmt_num(value: float | None) -> str:
    """4 decimals below 100 (4 significant digits below 0.001, where 4 decimals would show
    a small MSE or p-value as 0.0000), 2 below 100,000, else 4 significant digits; ``–``
    for None."""
    if value is None:
        return "–"
    value = value + 0.0  # -0.0 (a rounded-away mean) reads 0.0000
    if 0 < abs(value) < 1e-3:
        return f"{value:.4g}"
    if abs(value) < 100:
        return f"{value:.4f}"
    if abs(value) < 1e5:
        return f"{value:.2f}"
    return f"{value:.4g}"


def fmt_mean_std(mean: float | None, std: float | None) -> str:
    """``mean ± std`` (no ``±`` without a standard deviation, ``–`` without a mean)."""
    if mean is None:
        return "–"
    if std is None:
        return fmt_num(mean)
    return f"{fmt_num(mean)} ± {fmt_num(std)}"
