"""The common boundary of the Transformer variants (survey section 3.3.2, seed 003).

Transformer-XL (:mod:`attnlab.query.transformer_xl`), Reformer
(:mod:`attnlab.query.reformer`), Linformer (:mod:`attnlab.query.linformer`) and the
Synthesizer (:mod:`attnlab.query.synthesizer`) are each an attention module usable where
:class:`attnlab.query.multi_head.MultiHeadAttention` is: the same call

    forward(query [B, n_q, d_model], key=None, value=None, *, mask=None, causal=False,
            need_weights=False, average_weights=True, **extras) -> AttentionOutput

with ``key`` defaulting to ``query`` (self-attention), ``value`` to ``key``, ``mask`` a
bool tensor broadcastable to ``[B, n_q, n_k]`` (True = may attend) and the output
``context`` ``[B, n_q, d_model]``. This module holds the checks and head reshaping they
share; their common ``forward`` (the input checks that name the argument, its shape and
the expected shape) is :class:`attnlab.query._convention.HeadAttention`. It registers
nothing.

Each variant class states two capabilities as class attributes, their one home (a
module passed as an object carries them too): ``supports_cross`` (it can attend over
another sequence ``key``) and ``supports_causal`` (``causal=True`` is meaningful); the
Transformer layers of :mod:`attnlab.query.transformer` read them to refuse impossible
combinations at construction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnlab import masks as _masks
from attnlab._checks import ConfigError, check_dropout, check_int

__all__ = [
    "check_dropout",
    "head_dim_for",
    "head_mask",
    "merge_heads",
    "reduce_weights",
    "split_heads",
]


def head_dim_for(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """The per-head size: ``head_dim`` or ``d_model // num_heads`` (which must divide)."""
    check_int(d_model, "d_model")
    check_int(num_heads, "num_heads")
    if head_dim is None:
        if d_model % num_heads:
            raise ConfigError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                "pass head_dim explicitly"
            )
        return d_model // num_heads
    return check_int(head_dim, "head_dim")


def head_mask(
    mask: Tensor | None,
    batch: int,
    n_q: int,
    n_k: int,
    device: torch.device,
    *,
    causal: bool = False,
) -> Tensor | None:
    """The user's mask (validated against ``[B, n_q, n_k]``) AND the causal mask, as a
    bool tensor ``[B or 1, 1, n_q or 1, n_k or 1]`` that broadcasts over the heads."""
    return _masks.normalize_head_mask(mask, batch, 1, n_q, n_k, device=device, causal=causal)


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``[B, n, heads * d] -> [B, heads, n, d]``."""
    B, n, hd = x.shape
    return x.view(B, n, heads, hd // heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``[B, heads, n, d] -> [B, n, heads * d]``."""
    B, h, n, d = x.shape
    return x.transpose(1, 2).reshape(B, n, h * d)


def reduce_weights(weights: Tensor | None, average: bool) -> Tensor | None:
    """Per-head weights ``[B, h, n_q, n]`` averaged over the heads (or kept)."""
    if weights is None or not average:
        return weights
    return weights.mean(1)
