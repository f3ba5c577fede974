"""How monotonic and diagonal an alignment is: intrinsic measures of the attention of
sequence-to-sequence models whose output follows the input in order (speech recognition,
Chorowski et al. 2015; also transliteration, monotonic translation).

For one attention matrix ``a`` ``[T, S]`` (output steps x input positions, rows summing to
1 over the real inputs) with the centroid ``c_t = sum_s s a_{t,s} / (S - 1)`` of each row
(in [0, 1]):

* :func:`forward_fraction`: the share of steps ``t >= 1`` whose centroid moves forward,
  ``c_t > c_{t-1} + eps``. A left-to-right alignment scores 1; uniform or mean-pooled
  attention (every centroid 1/2) scores 0; a random one about 1/2.
* :func:`diagonal_mass`: the mean over the steps of the attention mass within ``band``
  (a fraction of the input) of the diagonal, ``sum_{s : |s/S' - t/T'| <= band} a_{t,s}``
  with positions scaled to [0, 1] (``s' = s / (S - 1)``, ``t' = t / (T - 1)``). A diagonal
  alignment scores 1; uniform attention about ``2 band`` (the floor).
* :func:`centroid_correlation`: Pearson's r between ``t`` and ``c_t``: 1 for centroids on
  a rising line, 0 when the centroid is constant (uniform attention) -- defined as 0, not
  NaN, so that a baseline has a number.

:func:`alignment_shape` gives all three, averaged over a list of matrices (one per
utterance, each of its own size). Cost O(T S) per matrix.

Sources: J. Chorowski, D. Bahdanau, D. Serdyuk, K. Cho and Y. Bengio, "Attention-Based
Models for Speech Recognition", NeurIPS 2015 (monotonic alignments of speech); C. Raffel,
M.-T. Luong, P. J. Liu, R. J. Weiss and D. Eck, "Online and Linear-Time Attention by
Enforcing Monotonic Alignments", ICML 2017.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from attnlab.evaluation._measures import as_array, check_weights

__all__ = ["alignment_shape", "centroid_correlation", "diagonal_mass", "forward_fraction"]


def _matrix(weights: Any) -> np.ndarray:
    a = as_array(weights)
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"weights has shape {a.shape}, expected [T, S] with T, S >= 1")
    return check_weights(a)


def _centroids(a: np.ndarray) -> np.ndarray:
    S = a.shape[1]
    pos = np.arange(S) / max(S - 1, 1)
    mass = a.sum(1)
    return (a @ pos) / np.where(mass > 0, mass, 1.0)


def forward_fraction(weights: Any, eps: float = 1e-3) -> float:
    """The share of steps whose centroid moves forward by more than ``eps`` (positions in
    [0, 1]); NaN for a single step."""
    a = _matrix(weights)
    if a.shape[0] < 2:
        return float("nan")
    c = _centroids(a)
    return float(np.mean(np.diff(c) > eps))


def diagonal_mass(weights: Any, band: float = 0.1) -> float:
    """The mean attention mass within ``band`` of the diagonal (positions in [0, 1])."""
    if not 0 <= band <= 1:
        raise ValueError(f"band must be in [0, 1], got {band}")
    a = _matrix(weights)
    T, S = a.shape
    t = np.arange(T)[:, None] / max(T - 1, 1)
    s = np.arange(S)[None, :] / max(S - 1, 1)
    near = np.abs(s - t) <= band + 1e-12
    return float((a * near).sum(1).mean())


def centroid_correlation(weights: Any) -> float:
    """Pearson's r between the step and its centroid (0 when either is constant; NaN for a
    single step)."""
    a = _matrix(weights)
    if a.shape[0] < 2:
        return float("nan")
    c = _centroids(a)
    t = np.arange(a.shape[0], dtype=np.float64)
    if np.ptp(c) < 1e-12:
        return 0.0
    return float(np.corrcoef(t, c)[0, 1])


def alignment_shape(
    matrices: Sequence[Any], band: float = 0.1, eps: float = 1e-3
) -> dict[str, float]:
    """``forward_fraction``, ``diagonal_mass`` and ``centroid_correlation`` averaged over
    ``matrices`` (NaN values of single-step matrices left out)."""
    if not matrices:
        raise ValueError("no attention matrices")
    out = {
        "forward_fraction": [forward_fraction(m, eps) for m in matrices],
        "diagonal_mass": [diagonal_mass(m, band) for m in matrices],
        "centroid_correlation": [centroid_correlation(m) for m in matrices],
    }
    return {
        k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in out.items()
    }
