"""Intersection over union between a thresholded attention map and an object's mask: does
the attention of an object word fall on that object (attention correctness of image
captioning, survey section 4.2)?

An attention map ``a`` over an ``h x w`` grid of image cells (summing to 1) is turned into
a region of cells by a threshold, the region is spread to the pixels its cells cover, and
compared with the object's pixel mask ``M`` (``[H, W]`` bool, ``H, W`` multiples of
``h, w``)::

    A = union of the cells k with a_k >= t * max_j a_j     (threshold="relative", t = 0.5)
    A = the fewest largest cells holding >= t of the mass  (threshold="mass", t = 0.5)
    IoU = |A ∩ M| / |A ∪ M|   (pixels; NaN when both are empty)

Uniform attention keeps every cell (relative) or half of them in index order (mass), so
its relative IoU is the object's area fraction: the floor a model's map must beat. Cost
O(h w log(h w) + H W) per map.

Sources: IoU (the Jaccard index) is the overlap measure of object localisation (e.g. the
PASCAL VOC challenge, Everingham et al. 2010); applied to attention maps and object masks
for captioning by C. Liu, J. Mao, F. Sha and A. Yuille, "Attention Correctness in Neural
Image Captioning", AAAI 2017 (who report the attention mass inside the region, see
:mod:`attnlab.evaluation.correctness`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnlab.evaluation._measures import as_array, check_weights

__all__ = ["THRESHOLDS", "attention_iou", "attention_region"]

THRESHOLDS = ("relative", "mass")


def attention_region(
    weights: Any, grid: tuple[int, int], threshold: str = "relative", t: float = 0.5
) -> np.ndarray:
    """The cells kept by the threshold: ``[h, w]`` bool (see the module docstring).

    ``weights`` ``[h * w]`` (row-major cells) or ``[h, w]``; non-negative. A map of all
    zeros keeps no cell."""
    a = as_array(weights)
    h, w = (int(grid[0]), int(grid[1]))
    if h <= 0 or w <= 0:
        raise ValueError(f"grid must hold two positive ints, got {grid}")
    if a.size != h * w:
        raise ValueError(f"weights has {a.size} entries but the grid {h}x{w} has {h * w} cells")
    if threshold not in THRESHOLDS:
        raise ValueError(f"threshold must be one of {THRESHOLDS}, got {threshold!r}")
    if not 0.0 < t <= 1.0:
        raise ValueError(f"t must be in (0, 1], got {t}")
    a = a.reshape(-1)
    check_weights(a)
    keep = np.zeros(a.size, dtype=bool)
    top = float(a.max()) if a.size else 0.0
    if top <= 0.0:
        return keep.reshape(h, w)
    if threshold == "relative":
        keep = a >= t * top
    else:
        order = np.argsort(-a, kind="stable")
        cum = np.cumsum(a[order]) / a.sum()
        count = int(np.searchsorted(cum, t - 1e-12) + 1)
        keep[order[:count]] = True
    return keep.reshape(h, w)


def attention_iou(
    weights: Any,
    mask: Any,
    grid: tuple[int, int],
    threshold: str = "relative",
    t: float = 0.5,
) -> float:
    """IoU in pixels between the thresholded attention map and ``mask``.

    Args:
        weights: ``[h * w]`` or ``[h, w]`` attention over the grid's cells.
        mask: ``[H, W]`` bool, the object's pixels; ``H`` and ``W`` multiples of ``h``, ``w``.
        grid: ``(h, w)``.
        threshold, t: ``"relative"`` keeps the cells of weight ``>= t * max``; ``"mass"``
            the fewest cells of largest weight that hold ``>= t`` of the mass.

    Returns the IoU in [0, 1] (NaN when the region and the mask are both empty).

    >>> m = np.zeros((4, 4), dtype=bool); m[:2, :2] = True
    >>> attention_iou([0.7, 0.1, 0.1, 0.1], m, (2, 2))
    1.0
    """
    m = as_array(mask, None)
    if m.dtype != bool:
        raise TypeError(f"mask must be a bool array [H, W], got dtype {m.dtype}")
    if m.ndim != 2:
        raise ValueError(f"mask has shape {m.shape}, expected [H, W]")
    h, w = int(grid[0]), int(grid[1])
    H, W = m.shape
    if h <= 0 or w <= 0 or H % h or W % w:
        raise ValueError(f"a {H}x{W} mask cannot be split into a {h}x{w} grid of equal cells")
    cells = attention_region(weights, (h, w), threshold, t)
    region = np.kron(cells, np.ones((H // h, W // w), dtype=bool)).astype(bool)
    union = int((region | m).sum())
    if union == 0:
        return float("nan")
    return float((region & m).sum() / union)
