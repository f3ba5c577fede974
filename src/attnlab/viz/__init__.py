"""Attention visualisations: PNG figures (:mod:`.plots`, matplotlib) for matrices,
multi-head grids, co-attention, hierarchies, image overlays and per-instance scatter plots.
HTML token heatmaps and the interactive viewer are part of the report
(:mod:`attnlab.lab.report`)."""

from attnlab.viz.plots import (
    plot_coattention,
    plot_heads,
    plot_hierarchy,
    plot_image_attention,
    plot_matrix,
    plot_scatter,
)

__all__ = [
    "plot_coattention",
    "plot_heads",
    "plot_hierarchy",
    "plot_image_attention",
    "plot_matrix",
    "plot_scatter",
]
