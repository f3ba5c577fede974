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

from attnlab._checks import (
    broadcasts_to,
    check_dropout,
    check_flags,
    check_number,
    check_same,
    check_tensor,
    softmax_dtype,
)
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import clear_heads
from attnlab.general.planner import sdpa_four_d
from attnlab.masks import _FLOAT_MASK_HINT, check_bool_mask

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

    ``q``, ``k`` and ``v`` must be floating-point tensors of one dtype and device and of
    one rank ``>= 2``; a leading axis of ``k`` or ``v`` is that of ``q`` or 1 (shared by
    ``q``'s), ``k`` has ``q``'s ``d`` and ``v`` ``k``'s ``n_k``. ``mask`` must be a bool
    tensor on their device whose shape broadcasts to ``[..., n_q, n_k]`` (``q``'s leading
    axes) without enlarging it. ``scale`` must be a finite number, ``dropout_p`` a number
    in ``[0, 1)`` and ``need_weights`` a bool. Anything else is a one-line ``TypeError``
    (a type or dtype) or ``ValueError`` (a shape, a device or a value) naming the
    argument, its shape and the shape expected. Only shapes are checked: no host
    synchronisation, and the checks hold under ``torch.compile`` / ``torch.export``.

    Returns ``(context [..., n_q, d_v], weights or None)``. Masked-out keys and values
    (no query attends them) and fully masked query rows never matter, whatever they hold.
    Cost: O(n_q n_k d) time; memory O(n_q d) on the flash / memory-efficient kernels.
    """
    check_number(scale, "scale", error=ValueError)
    check_dropout(dropout_p, "dropout_p")
    check_flags(need_weights=need_weights)
    _check_inputs(q, k, v, mask)
    return _sdpa_attend(q, k, v, scale, mask, dropout_p, need_weights, clear=True)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    """The checks of :func:`sdpa_attend`'s tensors (shapes, dtypes and devices only: the
    sizes are compared in Python, and formatted into a message only when one is wrong, so a
    symbolic size under ``torch.compile(dynamic=True)`` is not made a constant)."""
    check_tensor(q, "q")
    check_tensor(k, "k")
    check_tensor(v, "v")
    if q.dim() < 2:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected [..., n_q, d] (at least 2-D)")
    rank = q.dim()
    if k.dim() != rank or k.shape[-1] != q.shape[-1] or not _shares_lead(k, q):
        want = ", ".join([*map(str, q.shape[:-2]), "n_k", str(q.shape[-1])])
        raise ValueError(
            f"k has shape {tuple(k.shape)}, expected [..., n_k, d] = [{want}] to match q "
            f"{tuple(q.shape)} (a leading axis may be 1)"
        )
    if v.dim() != rank or v.shape[-2] != k.shape[-2] or not _shares_lead(v, q):
        want = ", ".join([*map(str, q.shape[:-2]), str(k.shape[-2]), "d_v"])
        raise ValueError(
            f"v has shape {tuple(v.shape)}, expected [..., n_k, d_v] = [{want}] to match q "
            f"{tuple(q.shape)} and k {tuple(k.shape)} (a leading axis may be 1)"
        )
    check_same(q, "q", k=k, v=v)
    if mask is None:
        return
    floating = isinstance(mask, Tensor) and mask.dtype.is_floating_point
    mask = check_bool_mask(mask, "mask", _FLOAT_MASK_HINT if floating else " (True = allowed)")
    if mask.device != q.device:
        raise ValueError(f"mask is on {mask.device} but the inputs are on {q.device}")
    target = (*q.shape[:-1], k.shape[-2])
    if not broadcasts_to(mask.shape, target):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected a shape broadcastable to "
            f"[..., n_q, n_k] = {list(target)} (a key padding mask is [..., 1, n_k])"
        )


def _shares_lead(x: Tensor, q: Tensor) -> bool:
    """Whether each leading axis of ``x`` (all but the last two) is that of ``q`` or 1.
    The equality is asked first: a symbolic size equal to ``q``'s then needs no guard on
    its being 1."""
    return all(a == b or a == 1 for a, b in zip(x.shape[:-2], q.shape[:-2], strict=True))


def _keep_bad_query_rows_nan(context: Tensor, q: Tensor) -> Tensor:
    """A NaN or inf in a query row makes its context NaN (as on the explicit path): the
    fused CPU kernel returns 0 for such a row, so ``sum(q * 0)`` (0 where q is finite,
    without overflow and without a host synchronisation) is added. The CUDA kernels
    propagate the NaN themselves (tests/general/test_cuda.py, every SDPA backend on an
    H200), so on CUDA -- and only there, the one device checked -- they are spared these
    extra kernels. ``q`` is detached: the term is 0 or NaN and carries no gradient, so the
    backward pass pays nothing for it (the kernel's own ``dq`` is unchanged)."""
    if q.device.type == "cuda":
        return context
    return context + (q.detach() * 0).sum(-1, keepdim=True).to(context.dtype)


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
    causal: bool = False,
    four_d: bool | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`sdpa_attend`; ``clear=False`` skips clearing the padding, for callers that
    cleared their raw inputs already (before projections, whose gradients need it).

    ``causal=True`` (with ``mask=None`` and ``n_q == n_k``) passes ``is_causal=True`` to
    the kernel instead of a materialised mask. A 3-D call ``[B, n, d]`` runs on the 4-D
    layout ``[B, 1, n, d]`` where ``four_d`` says so (default: on every device, and on the
    CPU in float32 and float64, see :func:`attnlab.general.planner.sdpa_four_d`), so that
    the flash / cuDNN / memory-efficient kernels (the fused CPU kernel) are eligible.
    Nothing here synchronises with the device: a fully masked row is opened for the kernel
    and zeroed afterwards with ``torch.where`` on a per-row "any allowed" tensor, whatever
    the mask holds."""
    if causal and (mask is not None or need_weights or q.shape[-2] != k.shape[-2]):
        raise ValueError(
            "causal=True needs mask=None, need_weights=False and n_q == n_k; pass the "
            "causal mask (attnlab.masks.causal) instead"
        )
    if four_d is None:
        four_d = sdpa_four_d(q.device, q.dtype)
    three_d = q.dim() == 3 and four_d
    if three_d:  # [B, n, d] -> [B, 1, n, d]: the fused kernels want 4-D inputs
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
    row_ok = None
    attn_mask = mask
    if mask is not None:
        if mask.dim() < 2:  # SDPA wants at least [n_q, n_k]
            mask = mask.reshape(1, -1)
        if three_d and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        if clear:
            q, k, v = clear_heads(q, k, v, mask)
        # no host synchronisation: every row is opened if it allows nothing, and zeroed
        # afterwards (the row test is a tensor, never a Python bool)
        row_ok = mask.any(-1, keepdim=True)
        attn_mask = mask | ~row_ok
    context = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=causal,
        scale=scale,
    )
    context = _keep_bad_query_rows_nan(context, q)
    if row_ok is not None:
        # where, not a product: an opened row must come back as exactly 0 even if a key it
        # was opened to holds NaN or inf (0 * NaN = NaN)
        context = torch.where(row_ok, context, context.new_zeros(()))
    weights = None
    if need_weights:
        work = softmax_dtype(q.dtype)
        e = (q.to(work) @ k.to(work).transpose(-1, -2)) * scale
        weights = masked_softmax(e, mask).to(v.dtype)
        if three_d:
            weights = weights.squeeze(1)
    if three_d:
        context = context.squeeze(1)
    return context, weights
