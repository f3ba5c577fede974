"""Sparse alternatives to the softmax: sparsemax and 1.5-entmax.

Both map scores to a probability vector that can hold exact zeros.

* sparsemax (Martins & Astudillo 2016): ``a = argmin_{p in simplex} |p - e|^2``, i.e.
  ``a_l = max(e_l - tau, 0)`` with ``tau`` chosen so the weights sum to 1.
* 1.5-entmax (Peters, Niculae & Martins 2019): ``a_l = max(e_l / 2 - tau, 0)^2`` with
  ``tau`` chosen so the weights sum to 1.

Both thresholds are found exactly by sorting (O(n log n) per row); the backward passes
are the closed forms of the two papers. Masked positions get weight 0 whatever their
score; a row with no allowed position gets all-zero weights. A score of ``-inf`` gets weight
0; a row whose allowed scores have no finite maximum (a NaN or ``+inf`` among them, or only
``-inf``) gets NaN weights, as the softmax gives, and zero gradients -- never an error.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx

from attnlab._checks import check_tensor, is_transformed, softmax_dtype
from attnlab.masks import check_score_mask

__all__ = ["entmax15", "sparsemax"]

# Any score this far below the row maximum lies outside the support of both mappings
# (sparsemax drops scores below max - 1, 1.5-entmax below max - 2).
_OUTSIDE = 10.0


def _sparsemax_product(p: Tensor, t: Tensor) -> Tensor:
    """``J t`` for the sparsemax output ``p``: ``J = diag(s) - s s^T / |S|``, with ``s``
    the support's indicator (symmetric: also ``t^T J``)."""
    supp = (p > 0).to(t.dtype)
    mean = (t * supp).sum(-1, keepdim=True) / supp.sum(-1, keepdim=True).clamp(min=1)
    return supp * (t - mean)


def _entmax15_product(p: Tensor, t: Tensor) -> Tensor:
    """``J t`` for the 1.5-entmax output ``p``: ``J = diag(s) - s s^T / sum(s)``, with
    ``s = sqrt(p)`` (symmetric: also ``t^T J``)."""
    # sqrt(p) with a zero derivative off the support (where p = 0 stays 0 nearby):
    # p.sqrt() would make a second derivative 0 * inf = NaN there
    outside = p <= 0
    s = torch.where(outside, torch.ones_like(p), p).sqrt().masked_fill(outside, 0.0)
    ts = t * s
    denom = s.sum(-1, keepdim=True)
    q = ts.sum(-1, keepdim=True) / torch.where(denom > 0, denom, torch.ones_like(denom))
    return ts - q * s


def _save_output(ctx: FunctionCtx, inputs: tuple[Tensor], output: Tensor) -> None:
    """Both mappings' backward and forward-mode products need only the output ``p``."""
    ctx.save_for_backward(output)
    ctx.save_for_forward(output)


class _Sparsemax(torch.autograd.Function):
    """In the ``setup_context`` style with ``generate_vmap_rule``, so that every
    ``torch.func`` transform runs it; the Jacobian is symmetric, so one product is the
    backward pass and (in :class:`_SparsemaxForwardMode`) the forward-mode formula."""

    generate_vmap_rule = True
    setup_context = staticmethod(_save_output)

    @staticmethod
    def forward(z: Tensor) -> Tensor:  # type: ignore[override]
        n = z.shape[-1]
        z_sorted, _ = torch.sort(z, dim=-1, descending=True)
        cumsum = z_sorted.cumsum(-1) - 1
        ks = torch.arange(1, n + 1, device=z.device, dtype=z.dtype)
        support = ks * z_sorted > cumsum
        k_z = support.sum(-1, keepdim=True)
        tau = cumsum.gather(-1, k_z - 1) / k_z.to(z.dtype)
        return torch.clamp(z - tau, min=0)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return _sparsemax_product(p, grad)


class _Entmax15(torch.autograd.Function):
    """As :class:`_Sparsemax`."""

    generate_vmap_rule = True
    setup_context = staticmethod(_save_output)

    @staticmethod
    def forward(z: Tensor) -> Tensor:  # type: ignore[override]
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
        return torch.clamp(z - tau_star, min=0) ** 2

    @staticmethod
    def backward(ctx: FunctionCtx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return _entmax15_product(p, grad)


# The forward-mode formulas, in subclasses that run only under a torch.func transform:
# dynamo cannot trace a custom jvp (a graph break under torch.compile).


class _SparsemaxForwardMode(_Sparsemax):
    @staticmethod
    def jvp(ctx: FunctionCtx, tangent: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return _sparsemax_product(p, tangent)


class _Entmax15ForwardMode(_Entmax15):
    @staticmethod
    def jvp(ctx: FunctionCtx, tangent: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return _entmax15_product(p, tangent)


#: (the mapping, its forward-mode form): the pairs ``_masked`` takes (a tuple, not a dict
#: keyed by class: dynamo cannot hash an autograd.Function under torch.func)
_SPARSEMAX = (_Sparsemax, _SparsemaxForwardMode)
_ENTMAX15 = (_Entmax15, _Entmax15ForwardMode)


def _check(e: Tensor, mask: Tensor | None, dim: int) -> int:
    """Validate the arguments; return ``dim`` as a non-negative axis."""
    check_tensor(e, "e")
    if e.dim() == 0:
        raise ValueError("e has shape (), expected at least one axis to normalise over")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -e.dim() <= dim < e.dim():
        raise ValueError(f"dim={dim!r} is not an axis of e, which has shape {tuple(e.shape)}")
    check_score_mask(mask, e)
    return dim % e.dim()


def _masked(
    fns: tuple[type[torch.autograd.Function], type[torch.autograd.Function]],
    e: Tensor,
    mask: Tensor | None,
    dim: int,
) -> Tensor:
    dim = _check(e, mask, dim)
    if e.shape[dim] == 0:
        return e.clone()
    work = e.to(softmax_dtype(e.dtype)).movedim(dim, -1)
    m = None if mask is None else torch.broadcast_to(mask, e.shape).movedim(dim, -1)
    # Both mappings are invariant to adding a constant to a row: shift by the (allowed)
    # row maximum first, so the thresholds are computed on numbers <= 0 whatever the
    # magnitude of the scores (without the shift, float32 rounding in the cumulative sums
    # of large scores can leave the support empty).
    if m is None:
        row_max = work.amax(-1, keepdim=True)
    else:
        row_max = work.masked_fill(~m, float("-inf")).amax(-1, keepdim=True)
    # A row without a finite maximum among its allowed scores (a NaN or +inf score, or
    # only -inf ones) has no defined weights: it becomes NaN, as the softmax makes it. A
    # row without any allowed key has a -inf maximum too; it gets zero weights below.
    bad = ~torch.isfinite(row_max)
    if m is not None:
        bad = bad & m.any(-1, keepdim=True)
    finite_max = torch.isfinite(row_max)
    shifted = work - torch.where(finite_max, row_max, 0.0).detach()
    # Scores more than _OUTSIDE below the maximum (-inf included) lie outside the support
    # and get weight 0 whatever their value: clamping them is exact and keeps -inf out of
    # the sort and the cumulative sums. Masked positions go there too; bad rows are
    # replaced by zeros (finite) and overwritten with NaN at the end.
    ok = ~bad if m is None else m & ~bad
    filled = torch.where(ok, shifted.clamp(min=-_OUTSIDE), -_OUTSIDE)
    if not is_transformed():
        p = fns[0].apply(filled)
    elif not torch.compiler.is_compiling():
        p = fns[1].apply(filled)  # under torch.func: the form with a forward-mode formula
    else:
        # torch.compile of a torch.func transform: dynamo can neither trace a custom jvp
        # nor vmap the backward of an autograd.Function, so autograd differentiates the
        # forward's own ops (sort, cumulative sums, a gather, a clamp): the same Jacobian
        p = fns[0].forward(filled)
    if m is not None:
        p = torch.where(m, p, 0.0)
    p = p.masked_fill(bad, float("nan"))
    return p.movedim(-1, dim).to(e.dtype)


def sparsemax(e: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Sparsemax over ``dim`` (Martins & Astudillo 2016, "From Softmax to Sparsemax").

    ``a_l = max(e_l - tau, 0)``, ``sum_l a_l = 1``. ``mask`` (bool, True = allowed) must
    broadcast to ``e``; the weights have the shape of ``e`` (``[B, n_q, n_k]`` in
    attention). Cost O(n log n) per row (a sort). Half-precision inputs are
    computed in float32.
    """
    return _masked(_SPARSEMAX, e, mask, dim)


def entmax15(e: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """1.5-entmax over ``dim`` (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence
    Models"): ``a_l = max(e_l / 2 - tau, 0)^2``, ``sum_l a_l = 1``; sparser than softmax,
    smoother than sparsemax. ``mask`` (bool, True = allowed) must broadcast to ``e``; the
    weights have the shape of ``e``. Cost O(n log n) per row."""
    return _masked(_ENTMAX15, e, mask, dim)
