"""The functional layer: attention as pure functions of tensors (like ``torch.nn.functional``).

Score functions return ``e`` ``[B, n_q, n_k]``; alignment functions turn scores into
weights; :func:`attend` runs a whole soft attention with any score, on the fused path
where the score is a scaled dot product and on the memory-lean kernel for the additive
score. The modules in :mod:`attnlab.general` hold parameters and call these functions.
"""

from __future__ import annotations

import math
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from attnlab import masks as _masks
from attnlab._checks import batched_query, check_keys, check_same, check_values
from attnlab.general.alignment import (
    gumbel_softmax_align,
    hard_align,
    local_align,
    masked_softmax,
    reinforce_loss,
    soft_align,
)
from attnlab.general.dimensionality import combine_multi, combine_single, multi_dimensional_attend
from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean
from attnlab.general.local import local_window_attend
from attnlab.general.padding import clear_attention_inputs
from attnlab.general.planner import plan_attention, score_class_capabilities
from attnlab.general.scoring import (
    COSINE_EPS,
    SCORE_FUNCTIONS,
    activated_general_score,
    additive_score,
    biased_general_score,
    cosine_score,
    dot_score,
    general_score,
    multi_dimensional_additive_score,
    queryless_score,
    scaled_dot_score,
)
from attnlab.general.sdpa import _sdpa_attend, sdpa_attend
from attnlab.general.sparse import entmax15, sparsemax
from attnlab.output import AttentionOutput
from attnlab.registry import get

__all__ = [
    "activated_general_score",
    "additive_score",
    "additive_score_lean",
    "attend",
    "biased_general_score",
    "combine_multi",
    "combine_single",
    "cosine_score",
    "dot_score",
    "entmax15",
    "general_score",
    "gumbel_softmax_align",
    "hard_align",
    "local_align",
    "local_window_attend",
    "masked_softmax",
    "multi_dim_attend_lean",
    "multi_dimensional_additive_score",
    "multi_dimensional_attend",
    "queryless_score",
    "reinforce_loss",
    "scaled_dot_score",
    "sdpa_attend",
    "soft_align",
    "sparsemax",
]


def _dot_form(
    name: str, q: Tensor, k: Tensor, params: dict[str, Any]
) -> tuple[Tensor, Tensor, float]:
    if name in ("dot", "scaled-dot", "cosine") and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"score {name!r} needs d_q == d_k, but q has shape {tuple(q.shape)} and k has "
            f"shape {tuple(k.shape)}"
        )
    # validate the parameters (unknown names, shapes, dtypes) through the score function
    # on empty slices, so the fused path rejects exactly what the explicit one rejects
    SCORE_FUNCTIONS[name](q[:, :0], k[:, :0], **params)
    if name == "dot":
        return q, k, 1.0
    if name == "scaled-dot":
        return q, k, 1.0 / math.sqrt(k.shape[-1]) if k.shape[-1] else 1.0
    if name == "cosine":
        return F.normalize(q, dim=-1, eps=COSINE_EPS), F.normalize(k, dim=-1, eps=COSINE_EPS), 1.0
    return F.linear(q, params["W"], params.get("b")), k, 1.0


def attend(
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    score: str = "scaled_dot",
    mask: Tensor | None = None,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Soft attention ``c = sum_l softmax_l(score(q, k_l)) v_l`` with any score function.

    Args:
        q: ``[B, n_q, d_q]`` or ``[B, d_q]`` (ignored, may be ``None``, for ``queryless``).
        k: ``[B, n_k, d_k]``. v: ``[B, n_k, d_v]``.
        score: a score name (``dot``, ``scaled_dot``, ``general``, ``biased_general``,
            ``activated_general``, ``cosine``, ``additive``, ``queryless``).
        mask: bool broadcastable to ``[B, n_q, n_k]``, True = may attend.
        need_weights: also return the weights.
        **score_params: the score's parameters, named as in its function (``W``, ``b``,
            ``W1``, ``W2``, ``w``, ``act``).

    Dot-product scores (dot, scaled-dot, general, biased-general, cosine) run on PyTorch's
    fused ``scaled_dot_product_attention``; the additive score on the chunked kernel.
    Keys and values that no query may attend, and query rows that may attend nothing,
    never matter, whatever they hold (they are cleared with ``torch.where`` first). Half
    precision inputs: the scores and the softmax are computed in float32.
    Returns an :class:`AttentionOutput` (``context`` ``[B, n_q, d_v]`` or ``[B, d_v]``).
    """
    entry = get("score", score)
    name = entry.name
    caps = score_class_capabilities(entry.cls)
    if caps.queryless:
        check_keys(k, k.shape[0] if k.dim() == 3 else -1, "k")
        q3, single = None, True
        B, n_q = k.shape[0], 1
    else:
        if q is None:
            raise ValueError(f"score {name!r} needs a query q, got None")
        q3, single = batched_query(q, "q")
        B, n_q = q3.shape[:2]
        check_keys(k, B, "k")
        check_same(q3, "q", k=k)
    check_values(v, B, k.shape[1], "v")
    check_same(k, "k", v=v)
    n_k = k.shape[1]
    mask3 = _masks.normalize_mask(mask, B, n_q, n_k, device=k.device, single_query=single)
    # padding never matters, whatever it holds: cleared before any product touches it
    q3, k, v = clear_attention_inputs(q3, k, v, mask3, self_attention=q is k)
    plan = plan_attention(caps, need_weights=need_weights, n_k=n_k, device=k.device, dtype=k.dtype)
    if plan.path == "sdpa":
        assert q3 is not None
        q2, k2, scale = _dot_form(name, q3, k, score_params)
        context, weights = _sdpa_attend(q2, k2, v, scale, mask3, 0.0, need_weights, clear=False)
        path = "sdpa"
    else:
        if caps.queryless:
            e = queryless_score(k, **score_params)
        else:
            e = SCORE_FUNCTIONS[name](q3, k, **score_params)
        # the scores are float32 for half inputs; the weighted sum runs in the values' dtype
        weights = masked_softmax(e, mask3).to(v.dtype)
        context = combine_single(weights, v)
        # the additive score function is the chunked kernel; no other fused path here
        path = "lean-additive" if caps.additive else "explicit"
    if single:
        context = context.squeeze(1)
        weights = weights.squeeze(1) if weights is not None else None
    return AttentionOutput(context, weights if need_weights else None, path=path)
