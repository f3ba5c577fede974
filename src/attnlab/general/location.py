"""Location-aware score (Chorowski et al. 2015): content plus where the previous step
attended.

A content-based score cannot tell two keys with the same content apart, and a speech
recogniser's encoder frames repeat (silence, a held vowel). Chorowski et al. add to the
additive score features of the previous step's attention weights ``a_{i-1}``, extracted by
a 1-D convolution with ``n_filters`` filters of width ``kernel_size``::

    f_i = F * a_{i-1}                                   [n_k, n_filters]
    e_{i,l} = w^T tanh(W1 q_i + W2 k_l + U f_{i,l} + b)

so the score can prefer the keys just after the ones attended before: a learned,
monotonic "move forward" that content alone cannot express.

Through :class:`attnlab.Attention` the previous weights are the ``prev_weights`` keyword of
``forward`` (``[B, n_q, n_k]``, or ``[B, n_k]`` for a single query); without them the
location term is that of all-zero weights (the convolution has no bias), so the score is
the additive score with the same ``W1``, ``W2``, ``w``, ``b``. A decoder calls the
attention one step at a time and passes the weights of the step before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    batched_query,
    check_int,
    check_keys,
    check_module_dtype,
    check_same,
    check_tensor,
)
from attnlab.general.activations import Activation, get_activation
from attnlab.general.scoring import Score, _init_additive, _linear, _work, apply_layer
from attnlab.registry import register

__all__ = ["LocationAwareScore", "location_aware_score", "location_inputs"]


def _location_features(prev: Tensor, conv: Callable[[Tensor], Tensor]) -> Tensor:
    """``F * a_{i-1}``: ``prev`` ``[B, n_q, n_k]`` convolved by ``conv`` (``[N, 1, n_k]`` ->
    ``[N, n_filters, n_k]``: odd width ``r``, zero padding, same length) -> ``[B, n_q,
    n_k, n_filters]``. ``conv1d`` is a cross-correlation, ``f[l, c] = sum_s F[c, 0, s]
    prev[l + s - r // 2]``: the paper's convolution with the filters reversed, the same
    family for learned filters."""
    B, n_q, n_k = prev.shape
    f = conv(prev.reshape(B * n_q, 1, n_k))
    return f.reshape(B, n_q, f.shape[1], n_k).transpose(2, 3)


def _hybrid_scores(
    q1: Tensor,
    k2: Tensor,
    prev: Tensor | None,
    conv: Callable[[Tensor], Tensor],
    U: Callable[[Tensor], Tensor],
    w: Tensor,
    act: str | Activation,
) -> Tensor:
    """``w^T act(q1 + k2_l + U (F * a_{i-1})_l)`` (``[B, n_q, n_k]``) from the projected
    query ``q1 = W1 q + b`` and keys ``k2 = W2 k``, the previous weights ``prev`` (``None``:
    zeros), the convolution ``conv`` and the map ``U``. With no keys (``n_k = 0``) there is
    nothing to convolve (``conv1d`` refuses an input shorter than its filters): the scores
    are the empty ``[B, n_q, 0]``."""
    h = q1[:, :, None, :] + k2[:, None, :, :]
    if prev is not None and prev.shape[-1] > 0:
        h = h + U(_location_features(prev, conv))  # [B, n_q, n_k, d_w]
    return get_activation(act)(h) @ _work(w)


def _location_call(
    q: Tensor, k: Tensor, prev_weights: Tensor | None
) -> tuple[Tensor, Tensor | None, bool]:
    """The checked ``(q [B, n_q, d_q], prev_weights [B, n_q, n_k] or None, single)``."""
    q3, single = batched_query(q, "q")
    check_keys(k, q3.shape[0], "k")
    check_same(q3, "q", k=k)
    if prev_weights is None:
        return q3, None, single
    prev = _prev_as_3d(prev_weights, q3.shape[0], q3.shape[1], k.shape[1], single)
    check_same(q3, "q", prev_weights=prev)
    return q3, prev, single


def location_aware_score(
    q: Tensor,
    k: Tensor,
    prev_weights: Tensor | None,
    W1: Tensor,
    W2: Tensor,
    U: Tensor,
    filters: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    act: str | Activation = "tanh",
) -> Tensor:
    """``e_{i,l} = w^T act(W1 q_i + W2 k_l + U (F * a_{i-1})_l + b)`` (Chorowski et al. 2015).

    Shapes: ``q`` ``[B, n_q, d_q]`` (or ``[B, d_q]``), ``k`` ``[B, n_k, d_k]``,
    ``prev_weights`` ``[B, n_q, n_k]`` (or ``[B, n_k]``; None = zeros), ``W1`` ``[d_w,
    d_q]``, ``W2`` ``[d_w, d_k]``, ``U`` ``[d_w, n_filters]``, ``filters`` ``[n_filters, 1,
    r]`` (odd ``r``), ``w`` ``[d_w]``, ``b`` ``[d_w]``. Returns ``[B, n_q, n_k]`` (``[B,
    n_k]`` for a single query). Cost: O(B n_q n_k (r n_filters + n_filters d_w + d_w));
    memory O(B n_q n_k d_w) (the pairs are materialised).
    """
    q3, prev, single = _location_call(q, k, prev_weights)
    check_same(q3, "q", W1=W1, W2=W2, U=U, filters=filters, w=w, b=b)
    d_w = W1.shape[0]
    if filters.dim() != 3 or filters.shape[1] != 1 or filters.shape[2] % 2 == 0:
        raise ValueError(
            f"filters has shape {tuple(filters.shape)}, expected [n_filters, 1, r] with odd r"
        )
    if tuple(U.shape) != (d_w, filters.shape[0]):
        raise ValueError(
            f"U has shape {tuple(U.shape)}, expected [d_w, n_filters] = [{d_w}, {filters.shape[0]}]"
        )
    r = filters.shape[-1]
    e = _hybrid_scores(
        _linear(q3, W1, b),
        _linear(k, W2),
        None if prev is None else _work(prev),
        lambda x: F.conv1d(x, _work(filters), padding=r // 2),
        lambda f: f @ _work(U).T,
        w,
        act,
    )
    return e.squeeze(1) if single else e


def _prev_as_3d(prev: Tensor, B: int, n_q: int, n_k: int, single: bool) -> Tensor:
    check_tensor(prev, "prev_weights")
    if prev.dim() == 2 and single and tuple(prev.shape) == (B, n_k):
        return prev[:, None, :]
    if tuple(prev.shape) != (B, n_q, n_k):
        want = f"[B, n_k] = [{B}, {n_k}]" if single else f"[B, n_q, n_k] = [{B}, {n_q}, {n_k}]"
        raise ValueError(
            f"prev_weights has shape {tuple(prev.shape)}, expected {want} (the attention "
            "weights of the previous step, one row per query)"
        )
    return prev


def location_inputs(
    score: nn.Module,
    prev_weights: Tensor | None,
    batch: int,
    n_q: int,
    n_k: int,
    mask: Tensor | None,
    single: bool,
) -> dict[str, Any]:
    """The extra keyword arguments :class:`attnlab.Attention` passes to its score:
    ``{"prev_weights": [B, n_q, n_k]}`` with the masked keys set to 0 (whatever they held:
    padding never matters), or ``{}`` without previous weights. A score that does not use
    them refuses them (``ValueError``)."""
    if prev_weights is None:
        return {}
    if not getattr(score, "uses_prev_weights", False):
        raise ValueError(
            f"prev_weights is only read by a location-aware score, but the score is "
            f"{type(score).__name__}; build the Attention with score='location-aware' or "
            "drop prev_weights"
        )
    prev = _prev_as_3d(prev_weights, batch, n_q, n_k, single)
    if mask is not None:
        prev = torch.where(mask, prev, torch.zeros((), dtype=prev.dtype, device=prev.device))
    return {"prev_weights": prev}


@register("score", "location-aware", aliases=("location", "chorowski", "hybrid"))
class LocationAwareScore(Score):
    """Location-aware (hybrid) score of Chorowski et al. (2015); see the module docstring.

    Args:
        d_q, d_k: query and key sizes. d_w: hidden size (default ``d_k``).
        n_filters: ``n_f``, the convolution's filters (default 8).
        kernel_size: ``r``, their width (odd; default 5).
        act: the activation (default ``tanh``).
        bias: learn ``b``.

    Parameters: ``W1`` ``[d_w, d_q]`` (``W1.weight``), ``W2`` ``[d_w, d_k]``, ``U`` ``[d_w,
    n_f]`` (``U.weight``), ``F`` ``[n_f, 1, r]`` (``conv.weight``, no bias), ``w`` ``[d_w]``,
    ``b`` ``[d_w]``.

    Shapes: ``forward(q [B, n_q, d_q], k [B, n_k, d_k], prev_weights [B, n_q, n_k] | None)``
    -> ``[B, n_q, n_k]`` (a single query ``[B, d_q]`` with ``prev_weights`` ``[B, n_k]``
    gives ``[B, n_k]``). :class:`attnlab.Attention` takes it on the ``explicit`` path (any
    alignment) and passes its ``prev_weights`` keyword.

    :formula: f_i = F * a_{i-1}; e_{i,l} = w^T tanh(W1 q_i + W2 k_l + U f_{i,l} + b)
    :source: Chorowski, Bahdanau, Serdyuk, Cho & Bengio 2015, Attention-Based Models for Speech
        Recognition
    :cost: O(B n_q n_k (r n_f + n_f d_w + d_w)), memory O(B n_q n_k d_w)
    """

    uses_prev_weights = True
    function = staticmethod(location_aware_score)

    def __init__(
        self,
        d_q: int | None = None,
        d_k: int | None = None,
        d_w: int | None = None,
        n_filters: int = 8,
        kernel_size: int = 5,
        act: str | Activation = "tanh",
        bias: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("d_q", d_q), ("d_k", d_k)):
            if value is None:
                raise ConfigError(f"LocationAwareScore needs {name} (the size of its input)")
        d_w = d_k if d_w is None else d_w
        for name, value in (("d_q", d_q), ("d_k", d_k), ("d_w", d_w), ("n_filters", n_filters)):
            check_int(value, name, owner="LocationAwareScore")
        if (
            isinstance(kernel_size, bool)
            or not isinstance(kernel_size, int)
            or kernel_size < 1
            or kernel_size % 2 == 0
        ):
            raise ConfigError(f"kernel_size must be an odd int >= 1, got {kernel_size!r}")
        _init_additive(self, d_q, d_k, d_w, act, bias)
        self.U = nn.Linear(n_filters, d_w, bias=False)
        self.conv = nn.Conv1d(1, n_filters, kernel_size, padding=kernel_size // 2, bias=False)
        bound = 1.0 / math.sqrt(d_w)
        self.w = nn.Parameter(torch.empty(d_w).uniform_(-bound, bound))

    def forward(self, q: Tensor, k: Tensor, prev_weights: Tensor | None = None) -> Tensor:
        q3, prev, single = _location_call(q, k, prev_weights)
        check_module_dtype(self, q3, "q")
        e = _hybrid_scores(
            apply_layer(self.W1, q3, self.b),
            apply_layer(self.W2, k),
            prev,
            lambda x: apply_layer(self.conv, x),
            lambda f: apply_layer(self.U, f),
            self.w,
            self.act,
        )
        return e.squeeze(1) if single else e

    def explicit(self, q: Tensor, k: Tensor, prev_weights: Tensor | None = None) -> Tensor:
        return self(q, k, prev_weights)
