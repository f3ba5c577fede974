"""Attention dimensionality: how the weights combine the values (survey section 3.2.3).

* single-dimensional: one scalar weight per key, ``c = sum_l a_l v_l``;
* multi-dimensional (Shen et al. 2018, DiSAN): a vector score ``e_l in R^{d_v}``, a softmax
  over the keys *separately for every feature* ``i``, and ``c_i = sum_l a_{l,i} v_{l,i}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from torch import Tensor

from attnlab._checks import check_same, check_tensor
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import attended_keys, zero_rows
from attnlab.masks import normalize_mask
from attnlab.output import AttentionOutput
from attnlab.registry import Configurable, register

__all__ = [
    "MultiDimensional",
    "SingleDimensional",
    "combine_multi",
    "combine_single",
    "multi_dimensional_attend",
]


def _check_values(v: Tensor, B: int, n_k: int, d_v: int | None) -> None:
    check_tensor(v, "v")
    if v.dim() != 3 or v.shape[:2] != (B, n_k) or (d_v is not None and v.shape[2] != d_v):
        want = "d_v" if d_v is None else str(d_v)
        raise ValueError(
            f"v has shape {tuple(v.shape)}, expected [B, n_k, d_v] = [{B}, {n_k}, {want}]"
        )


def _check_per_feature(x: Tensor, name: str, v: Tensor) -> None:
    """``x`` (scores or weights) ``[B, n_q, n_k, d_v]`` and the values ``v`` ``[B, n_k,
    d_v]`` that go with it, of one dtype and device."""
    check_tensor(x, name)
    if x.dim() != 4:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected [B, n_q, n_k, d_v]")
    B, _, n_k, d_v = x.shape
    _check_values(v, B, n_k, d_v)
    check_same(x, name, v=v)


def combine_single(weights: Tensor, v: Tensor) -> Tensor:
    """``c = sum_l a_l v_l``: weights ``[B, n_q, n_k]``, v ``[B, n_k, d_v]`` -> ``[B, n_q, d_v]``.
    Cost O(B n_q n_k d_v)."""
    check_tensor(weights, "weights")
    if weights.dim() != 3:
        raise ValueError(f"weights has shape {tuple(weights.shape)}, expected [B, n_q, n_k]")
    _check_values(v, weights.shape[0], weights.shape[2], None)
    check_same(weights, "weights", v=v)
    return weights @ v


def combine_multi(weights: Tensor, v: Tensor) -> Tensor:
    """``c_i = sum_l a_{l,i} v_{l,i}``: weights ``[B, n_q, n_k, d_v]``, v ``[B, n_k, d_v]``
    -> ``[B, n_q, d_v]``. Cost O(B n_q n_k d_v) time and memory."""
    _check_per_feature(weights, "weights", v)
    return (weights * v.unsqueeze(1)).sum(2)


def multi_dimensional_attend(
    scores: Tensor, v: Tensor, mask: Tensor | None = None
) -> AttentionOutput:
    """Multi-dimensional attention from vector scores (Shen et al. 2018, DiSAN).

    Args:
        scores: ``[B, n_q, n_k, d_v]`` (one score per key and feature).
        v: ``[B, n_k, d_v]``.
        mask: bool, broadcastable to ``[B, n_q, n_k]``, True = may attend.

    Returns an :class:`AttentionOutput` with ``context`` ``[B, n_q, d_v]`` and ``weights``
    ``[B, n_q, n_k, d_v]``: ``a[b, i, :, f] = softmax over allowed keys of scores[b, i, :, f]``
    and ``context[b, i, f] = sum_l a[b, i, l, f] v[b, l, f]``. Rows with no allowed key give
    zeros; values that no query may attend never matter, whatever they hold. Memory
    O(B n_q n_k d_v); :func:`attnlab.general.fused.multi_dim_attend_lean`
    computes the context of DiSAN's additive vector score without that tensor.
    """
    _check_per_feature(scores, "scores", v)
    B, n_q, n_k, _ = scores.shape
    # the mask must broadcast to [B, n_q, n_k] *without* enlarging it
    m3 = normalize_mask(mask, B, n_q, n_k, device=scores.device, name="mask")
    m4 = m3.unsqueeze(-1) if m3 is not None else None
    if m3 is not None:
        # a value no query may attend never matters (where, not 0 * v: 0 * NaN = NaN)
        v = zero_rows(v, attended_keys(m3))
    weights = masked_softmax(scores, m4, dim=2)
    return AttentionOutput(combine_multi(weights, v), weights, path="explicit")


class _Dimensionality(Configurable):
    """A registered dimensionality: ``forward(weights, v)`` combines the values with its
    functional twin ``function`` (``combine_single`` or ``combine_multi``); ``multi``
    says whether the weights have a feature axis."""

    multi: bool = False
    function: ClassVar[Callable[[Tensor, Tensor], Tensor]]

    def __init__(self) -> None:
        super().__init__()

    def forward(self, weights: Tensor, v: Tensor) -> Tensor:
        return self.function(weights, v)


@register("dim", "single", aliases=("single-dimensional", "scalar"))
class SingleDimensional(_Dimensionality):
    """Single-dimensional attention: one scalar weight per key, ``c = sum_l a_l v_l``.
    Shapes: weights ``[B, n_q, n_k]``, ``v`` ``[B, n_k, d_v]`` -> ``[B, n_q, d_v]``.

    :formula: c = sum_l a_l v_l
    :source: all (e.g. Bahdanau et al. 2015)
    :cost: O(B n_q n_k d_v)
    """

    multi = False
    function = staticmethod(combine_single)


@register("dim", "multi", aliases=("multi-dimensional", "vector", "feature-wise"))
class MultiDimensional(_Dimensionality):
    """Multi-dimensional (feature-wise) attention (Shen et al. 2018, DiSAN): weights
    ``[B, n_q, n_k, d_v]``, ``c_i = sum_l a_{l,i} v_{l,i}``. Requires a vector score
    (``additive`` or ``queryless`` built with ``out_dim = d_v``).

    :formula: e_l = W_d^T act(W1 q + W2 k_l + b) in R^{d_v}; a_{l,i} = softmax_l(e_{l,i}); c_i =
        sum_l a_{l,i} v_{l,i}
    :source: Shen et al. 2018, DiSAN: Directional Self-Attention Network
    :cost: time O(B n_q n_k d_w d_v), memory O(B n_q d_v) (fused kernel)
    """

    multi = True
    function = staticmethod(combine_multi)
