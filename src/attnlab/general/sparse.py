"""Sparse alternatives to the softmax: sparsemax and 1.5-entmax.

Both map scores to a probability vector that can hold exact zeros.

* sparsemax (Martins & Astudillo 2016): ``a = argmin_{p in simplex} |p - e|^2``, i.e.
  ``a_l = max(e_l - tau, 0)`` with ``tau`` chosen so the weights sum to 1.
* 1.5-entmax (Peters, Niculae & Martins 2019): ``a_l = max(e_l / 2 - tau, 0)^2`` with
  ``tau`` chosen so the weights sum to 1.

Both thresholds are found exactly by sorting (O(n log n) per row); the backward passes
are the closed forms of the two papers. Masked positions get weight 0; a row with no
allowed position gets all-zero weights.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx

from attnlab._checks import softmax_dtype

__all__ = ["entmax15", "sparsemax"]

# Any score this far below the row maximum lies outside the support of both mappings
# (sparsemax drops scores below max - 1, 1.5-entmax below max - 2).
_OUTSIDE = 10.0


class _Sparsemax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, z: Tensor) -> Tensor:  # type: ignore[override]
        n = z.shape[-1]
        z_sorted, _ = torch.sort(z, dim=-1, descending=True)
        cumsum = z_sorted.cumsum(-1) - 1
        ks = torch.arange(1, n + 1, device=z.device, dtype=z.dtype)
        support = ks * z_sorted > cumsum
        k_z = support.sum(-1, keepdim=True)
        tau = cumsum.gather(-1, k_z - 1) / k_z.to(z.dtype)
        p = torch.clamp(z - tau, min=0)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        supp = (p > 0).to(grad.dtype)
        g = grad * supp
        mean = g.sum(-1, keepdim=True) / supp.sum(-1, keepdim=True).clamp(min=1)
        return supp * (grad - mean)


class _Entmax15(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, z: Tensor) -> Tensor:  # type: ignore[override]
        z = z / 2
        z = z - z.max(dim=-1, keepdim=True).values
        n = z.shape[-1]
        z_sorted, _ = torch.sort(z, dim=-1, descending=True)
        ks = torch.arange(1, n + 1, device=z.device, dtype=z.dtype)
        mean = z_sorted.cumsum(-1) / ks
        mean_sq = (z_sorted**2).cumsum(-1) / ks
        ss = ks * (mean_sq - mean**2)
        delta = torch.clamp((1 - ss) / ks, min=0)
        tau = mean - torch.sqrt(delta)
        k_z = (tau <= z_sorted).sum(-1, keepdim=True)
        tau_star = tau.gather(-1, k_z - 1)
        p = torch.clamp(z - tau_star, min=0) ** 2
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        s = p.sqrt()
        gs = grad * s
        denom = s.sum(-1, keepdim=True)
        q = gs.sum(-1, keepdim=True) / torch.where(denom > 0, denom, torch.ones_like(denom))
        # d entmax15(z) / dz = diag(s) - s s^T / sum(s), with s = sqrt(p)
        return gs - q * s


def _masked(fn: type[torch.autograd.Function], e: Tensor, mask: Tensor | None, dim: int) -> Tensor:
    work = e.to(softmax_dtype(e.dtype)).movedim(dim, -1)
    if e.shape[dim] == 0:
        return e.clone()
    if mask is None:
        return fn.apply(work).movedim(-1, dim).to(e.dtype)
    m = torch.broadcast_to(mask, e.shape).movedim(dim, -1)
    allowed_max = work.masked_fill(~m, float("-inf")).amax(-1, keepdim=True)
    allowed_max = torch.where(
        torch.isfinite(allowed_max), allowed_max, torch.zeros_like(allowed_max)
    )
    filled = torch.where(m, work, (allowed_max - _OUTSIDE).detach())
    p = fn.apply(filled) * m
    return p.movedim(-1, dim).to(e.dtype)


def sparsemax(e: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Sparsemax over ``dim`` (Martins & Astudillo 2016, "From Softmax to Sparsemax").

    ``a_l = max(e_l - tau, 0)``, ``sum_l a_l = 1``. ``mask`` (bool, True = allowed) must
    broadcast to ``e``. Cost O(n log n) per row (a sort). Half-precision inputs are
    computed in float32.
    """
    return _masked(_Sparsemax, e, mask, dim)


def entmax15(e: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """1.5-entmax over ``dim`` (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence
    Models"): ``a_l = max(e_l / 2 - tau, 0)^2``, ``sum_l a_l = 1``; sparser than softmax,
    smoother than sparsemax. Cost O(n log n) per row."""
    return _masked(_Entmax15, e, mask, dim)
