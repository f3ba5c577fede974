"""The fused path: attention that is mathematically a scaled dot product runs on
:func:`torch.nn.functional.scaled_dot_product_attention` (SDPA).

The dot, scaled-dot, general, biased-general and cosine scores all reduce to
``scale * q'^T k'_l`` after transforming the query (and, for cosine, the keys); with soft
alignment and single-dimensional weights the whole attention is then one SDPA call, which
picks PyTorch's best kernel (flash / memory-efficient / math) for the device.

Two differences from calling SDPA yourself are handled here:

* a query row whose mask allows no key gets a zero context (SDPA would return NaN or a
  uniform average): such rows are opened for the kernel and zeroed afterwards, so their
  gradients are zero as well;
* ``need_weights=True`` also returns the weights, computed with the same scores by an
  explicit masked softmax (the context still comes from SDPA, so asking for the weights
  does not change the numbers). Those scores are computed in float32 for half-precision
  inputs, as the kernel does internally: ``|q^T k|`` beyond float16's 65504 does not
  overflow;
* padding cannot leak: a key that no query may attend and a query row that may attend
  nothing are set to zero with ``torch.where`` before the kernel runs (the kernel
  multiplies the zero weight of a masked key by its value, and ``0 * NaN = NaN``), so a
  NaN or inf stored there reaches neither the context nor the gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab._checks import softmax_dtype
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import clear_heads

__all__ = ["sdpa_attend"]


def sdpa_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``softmax(scale * q k^T, masked) v`` on the fused kernel.

    Args:
        q: ``[..., n_q, d]``; k: ``[..., n_k, d]``; v: ``[..., n_k, d_v]``.
        scale: the factor multiplying ``q^T k``.
        mask: bool, broadcastable to ``[..., n_q, n_k]``, True = may attend.
        dropout_p: dropout on the weights (pass 0 in evaluation).
        need_weights: also return the weights ``[..., n_q, n_k]`` (before dropout).

    Returns ``(context [..., n_q, d_v], weights or None)``. Masked-out keys and values
    (no query attends them) and fully masked query rows never matter, whatever they hold.
    Cost: O(n_q n_k d) time; memory O(n_q d) on the flash / memory-efficient kernels.
    """
    return _sdpa_attend(q, k, v, scale, mask, dropout_p, need_weights, clear=True)


def _sdpa_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    mask: Tensor | None,
    dropout_p: float,
    need_weights: bool,
    *,
    clear: bool,
) -> tuple[Tensor, Tensor | None]:
    """:func:`sdpa_attend`; ``clear=False`` skips clearing the padding, for callers that
    cleared their raw inputs already (before projections, whose gradients need it)."""
    row_ok = None
    if mask is not None and mask.dim() < 2:  # SDPA wants at least [n_q, n_k]
        mask = mask.reshape(1, -1)
    attn_mask = mask
    if mask is not None:
        row_ok = mask.any(-1, keepdim=True)
        if clear:
            q, k, v = clear_heads(q, k, v, mask)
        if not bool(row_ok.all()):
            attn_mask = mask | ~row_ok
        else:
            row_ok = None
    context = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale
    )
    if row_ok is not None:
        # where, not a product: an opened row must come back as exactly 0 even if a key it
        # was opened to holds NaN or inf (0 * NaN = NaN)
        context = torch.where(row_ok, context, context.new_zeros(()))
    weights = None
    if need_weights:
        work = softmax_dtype(q.dtype)
        e = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
        weights = masked_softmax(e, mask).to(v.dtype)
    return context, weights
