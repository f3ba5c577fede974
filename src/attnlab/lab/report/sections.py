"""The default sections of the page, in order, and :func:`add_section` to change them."""

from __future__ import annotations

from attnlab.lab.report.context import Section
from attnlab.lab.report.curves import section_curves
from attnlab.lab.report.examples import section_examples
from attnlab.lab.report.explanation import section_explanation
from attnlab.lab.report.overview import section_overview
from attnlab.lab.report.tables import (
    section_analysis,
    section_cost,
    section_failed,
    section_table,
)
from attnlab.lab.report.viewer import VIEWER_SECTION

__all__ = ["SECTIONS", "add_section"]

SECTIONS: list[Section] = [
    Section("overview", "Overview", section_overview),
    Section("ablation", "Ablation table", section_table),
    Section("analysis", "Ablation analysis: paired tests over seeds", section_analysis),
    Section("failed", "Failed or unfinished runs", section_failed),
    Section("curves", "Learning curves", section_curves),
    Section("attention", "Attention on test examples", section_examples),
    VIEWER_SECTION,
    Section("explanation", "Is attention explanation?", section_explanation),
    Section("cost", "Cost per mechanism", section_cost),
]
"""The default sections, in page order (:func:`add_section` changes it)."""


def add_section(
    section: Section, *, before: str | None = None, after: str | None = None
) -> Section:
    """Add a section to every later report (or replace the one with the same id): at the
    end, or ``before`` / ``after`` the section with that id. Returns the section."""
    if before is not None and after is not None:
        raise ValueError("give before or after, not both")
    for i, s in enumerate(SECTIONS):
        if s.id == section.id:
            del SECTIONS[i]
            break
    ids = [s.id for s in SECTIONS]
    anchor = before if before is not None else after
    if anchor is None:
        SECTIONS.append(section)
        return section
    if anchor not in ids:
        raise KeyError(f"no section {anchor!r}; sections: {', '.join(ids)}")
    index = ids.index(anchor) + (0 if before is not None else 1)
    SECTIONS.insert(index, section)
    return section
