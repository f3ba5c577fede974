"""Distances between distributions used by the attention-as-explanation tests.

For distributions ``p, q`` over the same support (last dimension), with ``m = (p + q) / 2``:

    TVD(p, q) = 1/2 sum_i |p_i - q_i|                       in [0, 1]
    KL(p || q) = sum_i p_i (log p_i - log q_i)               (0 log 0 = 0)
    JSD(p, q) = 1/2 KL(p || m) + 1/2 KL(q || m)              in [0, log 2] (natural log)

Jain & Wallace (2019) measure attention weights with the JSD and model outputs with the
TVD; Wiegreffe & Pinter (2019) do the same. Cost O(n) per pair.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from attnlab._checks import broadcasts_together
from attnlab.evaluation._measures import check_weights

__all__ = ["JSD_MAX", "jsd", "kl", "tvd"]

JSD_MAX = math.log(2.0)


def _pair(p: Any, q: Any) -> tuple[Tensor, Tensor]:
    """``p, q`` as floating-point tensors over one support (the last dimension; the other
    dimensions broadcast), every entry finite and non-negative; else a one-line
    ``ValueError`` (a ``TypeError`` for what is not numbers). Not checked: that each
    distribution sums to 1 (half-precision weights miss it by their rounding)."""
    pair = []
    for name, x in (("p", p), ("q", q)):
        try:
            t = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{name} must be a tensor or array of numbers, got {x!r}") from None
        if t.dtype == torch.bool or t.is_complex() or t.dim() == 0:
            raise TypeError(
                f"{name} must hold distributions over its last dimension (real numbers, at "
                f"least one dimension), got {t.dtype} of shape {tuple(t.shape)}"
            )
        t = t if t.is_floating_point() else t.double()
        pair.append(check_weights(t, name, " (distributions)"))
    a, b = pair
    if a.shape[-1] != b.shape[-1] or not broadcasts_together(a.shape, b.shape):
        raise ValueError(
            f"p of shape {tuple(a.shape)} and q of shape {tuple(b.shape)} are not "
            "distributions over one support (same last dimension, the others broadcast)"
        )
    if a.dtype != b.dtype:
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
    return a, b


def _tvd(p: Tensor, q: Tensor) -> Tensor:
    return 0.5 * (p - q).abs().sum(-1)


def _kl(p: Tensor, q: Tensor, eps: float = 1e-12) -> Tensor:
    terms = p * (p.clamp_min(eps).log() - q.clamp_min(eps).log())
    return torch.where(p > 0, terms, torch.zeros_like(terms)).sum(-1)


def _jsd(p: Tensor, q: Tensor) -> Tensor:
    m = 0.5 * (p + q)
    return (0.5 * _kl(p, m) + 0.5 * _kl(q, m)).clamp_min(0.0)


# The studies (attnlab.evaluation.explanation, .diagnostics) call the unchecked forms on
# the softmax weights and outputs they compute, inside their search loops: a check there
# would read every tensor back to the host at every step.


def tvd(p: Any, q: Any) -> Tensor:
    """Total variation distance over the last dimension (``p``, ``q``: tensors or arrays
    of finite, non-negative numbers, the other dimensions broadcast)."""
    return _tvd(*_pair(p, q))


def kl(p: Any, q: Any, eps: float = 1e-12) -> Tensor:
    """``KL(p || q)`` over the last dimension (terms with ``p_i = 0`` are 0; ``q_i`` is
    taken as at least ``eps``)."""
    return _kl(*_pair(p, q), eps)


def jsd(p: Any, q: Any) -> Tensor:
    """Jensen-Shannon divergence over the last dimension, natural log (max ``log 2``)."""
    return _jsd(*_pair(p, q))
