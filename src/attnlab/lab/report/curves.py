"""The learning-curves section: per mechanism, the mean over its seeds of the training
loss and of the primary dev metric at each epoch."""

from __future__ import annotations

from attnlab.lab.report.charts import line_chart_svg
from attnlab.lab.report.context import ReportContext
from attnlab.lab.report.statistics import mean_curve

__all__ = ["section_curves"]


def section_curves(ctx: ReportContext) -> str:
    """Two line charts (train loss; dev primary metric), ``""`` when no run has a history."""
    data = ctx.data
    if not any(r.history for r in data.done):
        return ""
    primary = data.primary
    loss, dev = [], []
    for label in data.labels:
        runs = data.runs_of(label)
        colour = ctx.colour(label)
        curve = mean_curve(runs, lambda h: h.get("train_loss"))
        if curve:
            loss.append((label, colour, curve))
        if primary:
            curve = mean_curve(runs, lambda h, p=primary: (h.get("dev") or {}).get(p))
            if curve:
                dev.append((label, colour, curve))
    charts = [
        line_chart_svg(loss, title="train loss", x_label="epoch", y_label="train loss"),
    ]
    if primary:
        charts.append(
            line_chart_svg(dev, title=f"dev {primary}", x_label="epoch", y_label=f"dev {primary}")
        )
    return (
        f'<div class="charts">{"".join(charts)}</div>'
        '<p class="muted">One line per mechanism: the mean at each epoch over its seeds '
        "that trained it (with <code>patience</code> a run may stop early).</p>"
    )
