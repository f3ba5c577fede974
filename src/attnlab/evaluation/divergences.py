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

import torch
from torch import Tensor

__all__ = ["JSD_MAX", "jsd", "kl", "tvd"]

JSD_MAX = math.log(2.0)


def tvd(p: Tensor, q: Tensor) -> Tensor:
    """Total variation distance over the last dimension."""
    return 0.5 * (p - q).abs().sum(-1)


def kl(p: Tensor, q: Tensor, eps: float = 1e-12) -> Tensor:
    """``KL(p || q)`` over the last dimension (terms with ``p_i = 0`` are 0)."""
    terms = p * (p.clamp_min(eps).log() - q.clamp_min(eps).log())
    return torch.where(p > 0, terms, torch.zeros_like(terms)).sum(-1)


def jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence over the last dimension, natural log (max ``log 2``)."""
    m = 0.5 * (p + q)
    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).clamp_min(0.0)
