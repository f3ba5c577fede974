"""Padding that cannot leak: masked-out positions are cleared with ``torch.where``.

A key that no query may attend (padding) gets weight exactly 0, but ``0 * NaN = NaN``: a
NaN or inf stored in a padded key or value would still reach the context through the
weighted sum, and the gradients through every product that touches it (a projection's
weight gradient ``grad_out^T x`` included). The same holds for a query row that may attend
to nothing. The helpers here replace such rows by zeros *before* anything is computed
from them, with ``where`` (not a multiplication), so that padding never matters, whatever
it holds. They cost one elementwise pass over the inputs and a reduction of the mask.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attnlab._checks import check_flags

__all__ = [
    "attended_keys",
    "attending_rows",
    "clear_attention_inputs",
    "clear_heads",
    "clear_nonfinite_rows",
    "masked_mean",
    "zero_rows",
]


def _as_batched(mask: Tensor) -> Tensor:
    """``mask`` ``[..., n_q, n_k]`` as ``[B or 1, mid, n_q, n_k]`` (``mid`` the product of
    any axes between the batch and the query axis, e.g. heads)."""
    if mask.dim() < 2:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected [..., n_q, n_k]")
    m = mask if mask.dim() > 2 else mask[None]
    return m.reshape(m.shape[0], math.prod(m.shape[1:-2]), m.shape[-2], m.shape[-1])


def attended_keys(mask: Tensor) -> Tensor:
    """``[B or 1, n_k or 1]`` bool: True where at least one query (of any head) may attend
    the key. ``mask`` is a bool mask ``[n_q, n_k]``, ``[B, n_q, n_k]`` or
    ``[B, h, n_q, n_k]`` (any axis may be 1). False marks padding."""
    return _as_batched(mask).any(2).any(1)


def attending_rows(mask: Tensor) -> Tensor:
    """``[B or 1, n_q or 1]`` bool: True where the query row (of at least one head) may
    attend at least one key. False marks a query with nothing to attend to."""
    return _as_batched(mask).any(3).any(1)


def zero_rows(x: Tensor, keep: Tensor | None) -> Tensor:
    """``x`` ``[B, n, d]`` with the rows where ``keep`` (``[B or 1, n or 1]``) is False
    replaced by zeros (``None``: ``x`` itself). Gradients of the cleared rows are zero."""
    if keep is None:
        return x
    return torch.where(keep[..., None], x, x.new_zeros(()))


def masked_mean(x: Tensor, mask: Tensor | None, *, keepdim: bool = False) -> Tensor:
    """Mean over axis 1 of ``x`` ``[B, n, ...]`` restricted to the positions where the bool
    ``mask`` ``[B or 1, n]`` is True (real; ``None``: all). A row without a real position
    (or ``n = 0``) gives zeros. Padded positions never matter, whatever they hold: they are
    cleared with ``where`` (not a product: ``0 * NaN = NaN``) and get zero gradients.
    ``keepdim=True`` keeps axis 1 (size 1). O(B n d) time.

    The one masked mean of the library: pooling baselines, the mean key of the reinforced
    alignment's policy, co-attention's and the rotatory mechanism's mean representations,
    capsule attention's uniform contexts."""
    if mask is None:
        if x.shape[1] == 0:
            return x.new_zeros(x.shape[:1] + (1,) * keepdim + x.shape[2:])
        return x.mean(1, keepdim=keepdim)
    keep = mask.reshape(*mask.shape, *([1] * (x.dim() - 2)))
    total = torch.where(keep, x, x.new_zeros(())).sum(1, keepdim=keepdim)
    count = keep.sum(1, keepdim=keepdim).clamp(min=1).to(x.dtype)
    return total / count


def clear_nonfinite_rows(x: Tensor, keep: Tensor | None) -> Tensor:
    """``x`` ``[B, n, d]`` with the NaN and inf entries of the rows where ``keep`` is False
    replaced by zeros; finite entries are kept. For a self-attention input whose padded
    positions are also query rows: their (meaningless) outputs stay those of the finite
    input, and a non-finite one can no longer reach the gradients."""
    if keep is None:
        return x
    return torch.where(keep[..., None] | torch.isfinite(x), x, x.new_zeros(()))


def clear_attention_inputs(
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    self_attention: bool = False,
) -> tuple[Tensor | None, Tensor, Tensor]:
    """``(q, k, v)`` with the padded keys and values (no query may attend them) and the
    query rows that may attend nothing set to zero.

    ``q`` ``[B, n_q, d_q]`` (or ``None``), ``k`` ``[B, n_k, d_k]``, ``v`` ``[B, n_k, d_v]``
    (may be ``k`` itself); ``mask`` bool ``[n_q, n_k]``, ``[B, n_q, n_k]`` or
    ``[B, h, n_q, n_k]`` (any axis may be 1; ``None``: nothing to clear). Neither the
    context of an attending query nor a fully masked row's zero context depends on the
    cleared entries, so this changes no output, only what NaN or inf there could reach.

    ``self_attention=True`` says that ``q`` is the sequence ``k`` itself (``n_q = n_k``):
    the query rows at padded positions, which may still attend (a key padding mask does
    not mask them), get their NaN and inf entries set to zero
    (:func:`clear_nonfinite_rows`), so that their meaningless outputs cannot poison the
    gradients of the others. ``self_attention`` must be a bool (``TypeError``).
    """
    check_flags(self_attention=self_attention)
    if mask is None:
        return q, k, v
    keys = attended_keys(mask)
    k2 = zero_rows(k, keys)
    v2 = k2 if v is k else zero_rows(v, keys)
    if q is not None:
        q = zero_rows(q, attending_rows(mask))
        if self_attention:
            q = clear_nonfinite_rows(q, keys)
    return q, k2, v2


def clear_heads(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Like :func:`clear_attention_inputs` for tensors of any rank (per head, say):
    ``q`` ``[..., n_q, d]``, ``k`` / ``v`` ``[..., n_k, d]`` (``v`` may be ``k``), ``mask``
    bool broadcastable to ``[..., n_q, n_k]``; a key no query of its slice may attend and
    a query row that may attend nothing are set to zero."""
    if mask is None:
        return q, k, v
    key_ok = mask.any(-2).unsqueeze(-1)  # [..., n_k, 1]
    row_ok = mask.any(-1, keepdim=True)  # [..., n_q, 1]
    k2 = torch.where(key_ok, k, k.new_zeros(()))
    v2 = k2 if v is k else torch.where(key_ok, v, v.new_zeros(()))
    return torch.where(row_ok, q, q.new_zeros(())), k2, v2
