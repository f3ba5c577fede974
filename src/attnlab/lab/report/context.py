"""What the page is made of: :class:`Section` (one part of the page) and
:class:`ReportContext` (what every section's ``render`` receives)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnlab.lab.report.data import ReportData
from attnlab.lab.report.theme import SERIES_COLOURS

__all__ = ["ReportContext", "Section"]


@dataclass
class ReportContext:
    """What a section's ``render`` receives."""

    data: ReportData
    title: str
    max_examples: int = 4
    generated: str = ""

    def colour(self, label: str) -> str:
        """The mechanism's colour (the same in every chart)."""
        labels = self.data.labels
        i = labels.index(label) if label in labels else len(labels)
        return SERIES_COLOURS[i % len(SERIES_COLOURS)]


@dataclass
class Section:
    """One part of the page. ``render(ctx)`` returns the section's inner HTML, or ``""`` to
    leave the section out; ``css`` and ``js`` are inlined once per report (``js`` runs at
    the end of the body; use ``attnlabReport.onReady(fn)`` for code that needs the DOM)."""

    id: str
    title: str
    render: Callable[[ReportContext], str]
    css: str = ""
    js: str = ""
