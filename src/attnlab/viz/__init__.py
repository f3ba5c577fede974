"""Attention visualisations: PNG figures (:mod:`.plots`, matplotlib) for matrices,
multi-head grids, co-attention, hierarchies, image overlays and per-instance scatter plots.
HTML token heatmaps and the interactive viewer are part of the report
(:mod:`attnlab.lab.report`)."""

from attnlab.viz import plots as _plots
from attnlab.viz.plots import *  # noqa: F403 - the figures, as listed in plots.__all__

__all__ = list(_plots.__all__)
