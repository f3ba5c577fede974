"""Escaping shared by every part of the page; the numbers are written by
:func:`attnlab.lab.seed_stats.fmt_num` and :func:`~attnlab.lab.seed_stats.fmt_mean_std`,
as in the command line's tables."""

from __future__ import annotations

import html
import json
from typing import Any

from attnlab.lab.seed_stats import fmt_mean_std, fmt_num

__all__ = ["esc", "fmt_mean_std", "fmt_num", "option_text"]


def esc(value: Any) -> str:
    """HTML-escape any value (quotes included); ``None`` is the empty text."""
    return html.escape("" if value is None else str(value), quote=True)


def option_text(value: Any) -> str:
    """A value of the run's options or an example's ``extra`` as text: strings as they
    are, anything else as JSON (escaped)."""
    return esc(value if isinstance(value, str) else json.dumps(value))
