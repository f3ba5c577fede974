"""Attention correctness: does the attention fall where a person would look?

* :func:`attention_mass`: the attention mass inside a gold region, ``sum_{k in R} a_k``
  (Liu et al. 2017 call it *attention correctness*); 1 means all the attention is on the
  region. O(n) per map.
* :func:`rank_correlation`: Spearman's rho between an attention map and a reference map
  (e.g. human attention maps, Das et al. 2017), ties ranked by their mean rank. O(n log n).
* :func:`region_to_grid`: a pixel mask ``[H, W]`` pooled to the attention grid
  ``(h, w)``: the fraction of each cell's pixels inside the region, so the region of an
  image can be compared with attention over a grid of image cells.

Sources: C. Liu, J. Mao, F. Sha and A. Yuille, "Attention Correctness in Neural Image
Captioning", AAAI 2017; A. Das, H. Agrawal, C. L. Zitnick, D. Parikh and D. Batra, "Human
Attention in Visual Question Answering: Do Humans and Deep Networks Look at the Same
Regions?", EMNLP 2016.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from attnlab.evaluation._measures import as_array, check_weights

__all__ = ["attention_mass", "rank_correlation", "region_to_grid"]


def attention_mass(weights: Any, region: Any) -> Tensor:
    """The attention mass inside ``region`` per map.

    Args:
        weights: ``[..., n]`` attention weights (any leading dims; an image grid flattened),
            finite and non-negative (a ``ValueError`` otherwise: a mass of 1.5 or of NaN
            measures nothing).
        region: a bool mask broadcastable to ``weights`` (True inside the gold region), or
            float cell fractions in [0, 1] (then the mass is ``sum_k a_k r_k``).
    Returns ``[...]``.
    """
    w = check_weights(torch.as_tensor(weights))
    r = torch.as_tensor(region, device=w.device)
    if r.dtype == torch.bool:
        r = r.to(w.dtype if w.is_floating_point() else torch.float32)
    else:
        if r.numel() and (float(r.min()) < 0.0 or float(r.max()) > 1.0):
            raise ValueError("a float region must hold fractions in [0, 1]")
    try:
        return (w * r).sum(-1)
    except RuntimeError:
        raise ValueError(
            f"region of shape {tuple(r.shape)} does not broadcast to weights {tuple(w.shape)}"
        ) from None


def rank_correlation(attention: Any, reference: Any) -> float:
    """Spearman's rho between two maps of the same size (flattened); NaN when either map is
    constant (no ranking to compare)."""
    a, b = as_array(attention).ravel(), as_array(reference).ravel()
    if a.shape != b.shape:
        raise ValueError(f"maps have {a.size} and {b.size} cells; they must match")
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(stats.spearmanr(a, b).statistic)


def region_to_grid(mask: Any, grid: tuple[int, int]) -> np.ndarray:
    """The fraction of each grid cell's pixels that lie in ``mask`` (``[H, W]`` bool), as a
    ``[h, w]`` float array; ``H`` and ``W`` must be multiples of ``h`` and ``w``."""
    m = as_array(mask, bool)
    if m.ndim != 2:
        raise ValueError(f"mask has shape {m.shape}, expected [H, W]")
    h, w = grid
    H, W = m.shape
    if h <= 0 or w <= 0 or H % h or W % w:
        raise ValueError(f"a {H}x{W} mask cannot be pooled onto a {h}x{w} grid evenly")
    return m.reshape(h, H // h, w, W // w).mean(axis=(1, 3))
