"""Triton kernels behind :mod:`attnlab.general.local_triton` (import that module instead).

Like :mod:`attnlab._flash_kernels`, this module lives outside ``attnlab.general`` because it
imports triton at import time (the registry imports every module of that package); it is
imported on the first kernel call, and its kernels are built in the mode Triton's
interpreter switch had then (:data:`INTERPRETED`).

Local attention (Luong et al. 2015) of query ``i`` over the window of its centre ``p_i``:
the slots ``l = ceil(p_i - D) + j``, ``j = 0 .. 2D``, that exist (``0 <= l < n_k``), lie
within ``D`` of the centre and are allowed by the mask;

    e_l = scale * q_i . k_l,   s = softmax over the window,   a_l = s_l g_l,
    g_l = exp(-(l - p_i)^2 / (2 sigma^2)) (or 1 without the Gaussian),   c_i = sum_l a_l v_l.

A program owns ``BLOCK_M`` query rows of one batch element and their ``W_PAD >= 2D + 1``
window slots: the keys and values of the windows are loaded row by row from their indices
(``[BLOCK_M, W_PAD, BLOCK_D]`` tiles, ``BLOCK_D`` features at a time), never copied into a
window tensor in memory. Everything is computed in float32. An invalid slot is never loaded
(what padding holds, NaN included, never reaches a result) and has weight 0.

* :func:`local_fwd` writes the context ``O`` and the window weights ``A`` ``[B, n_q, W]``
  (float32, kept for the backward pass).
* :func:`local_bwd` recomputes the window from the centres and reads ``A``: it writes the
  query gradient ``DQ`` and the centre gradient ``DC`` (through the Gaussian only: the
  window's membership is a step function of the centre) of its own rows, and adds the key
  and value gradients of each slot to ``DK`` and ``DV`` (float32) with atomic adds, since
  the windows of different programs overlap. The sums are therefore not deterministic in
  their last bits.

Strides come in the order batch, row, column; the mask is a uint8 view with stride 0 where
it broadcasts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnlab._flash_kernels import INTERPRETED

__all__ = ["INTERPRETED", "local_bwd", "local_fwd"]


@triton.jit
def _window(
    C, M8, n_q, n_k, D, scb, scm, smb, smm, smn,
    BLOCK_M: tl.constexpr, W_PAD: tl.constexpr, HAS_MASK: tl.constexpr,
):  # fmt: skip
    """This program's batch element ``b`` and query rows ``offs_m``, and the slots of the
    rows: key indices ``[BLOCK_M, W_PAD]`` (0 where invalid), distances ``l - p``
    (float32) and validity. A NaN centre has no valid slot."""
    b = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row = offs_m < n_q
    p = tl.load(C + b * scb + offs_m * scm, mask=row, other=0.0).to(tl.float32)
    j = tl.arange(0, W_PAD)
    pos = tl.ceil(p - D)[:, None] + j[None, :].to(tl.float32)
    dist = pos - p[:, None]
    valid = (j[None, :] <= 2 * D) & (tl.abs(dist) <= D) & (pos >= 0) & (pos < n_k)
    valid = valid & row[:, None]
    idx = tl.where(valid, pos, 0.0).to(tl.int32)
    if HAS_MASK:
        allowed = tl.load(M8 + b * smb + offs_m[:, None] * smm + idx * smn, mask=valid, other=0)
        valid = valid & (allowed != 0)
    return b, offs_m, idx, dist, valid


@triton.jit
def _rows(X, b, offs_m, n_q, c0, n_cols, sb, sm, sd, BLOCK: tl.constexpr):
    """Columns ``c0 .. c0 + BLOCK`` of the rows ``offs_m`` of ``X[b]`` in float32, 0 outside."""
    offs = c0 + tl.arange(0, BLOCK)
    ptr = X + b * sb + offs_m[:, None] * sm + offs[None, :] * sd
    return tl.load(ptr, mask=(offs_m < n_q)[:, None] & (offs < n_cols)[None, :], other=0.0).to(
        tl.float32
    )


@triton.jit
def _slot_ptrs(X, b, idx, valid, c0, n_cols, sb, sn, sd, BLOCK: tl.constexpr):
    """Pointers ``[BLOCK_M, W_PAD, BLOCK]`` to columns ``c0 ..`` of the slots' rows of
    ``X[b]``, and where they may be read."""
    offs = c0 + tl.arange(0, BLOCK)
    ptr = X + b * sb + idx[:, :, None] * sn + offs[None, None, :] * sd
    return ptr, valid[:, :, None] & (offs < n_cols)[None, None, :]


@triton.jit
def _gaussian(dist, valid, inv_two_var, GAUSS: tl.constexpr):
    """``exp(-(l - p)^2 / (2 sigma^2))`` on valid slots, 1 elsewhere (and without it)."""
    if GAUSS:
        return tl.where(valid, tl.exp(-dist * dist * inv_two_var), 1.0)
    return tl.where(valid, 1.0, 1.0)


@triton.jit
def local_fwd(
    Q, K, V, C, M8, O, A,
    n_q, n_k, d, dv, D, scale, inv_two_var,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, scb, scm, smb, smm, smn,
    sob, som, sod, sab, sam, saw,
    GAUSS: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
    W_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    b, offs_m, idx, dist, valid = _window(C, M8, n_q, n_k, D, scb, scm, smb, smm, smn, BLOCK_M, W_PAD, HAS_MASK)  # fmt: skip
    e = tl.zeros([BLOCK_M, W_PAD], dtype=tl.float32)
    for c0 in range(0, d, BLOCK_D):
        q = _rows(Q, b, offs_m, n_q, c0, d, sqb, sqm, sqd, BLOCK_D)
        ptr, ok = _slot_ptrs(K, b, idx, valid, c0, d, skb, skn, skd, BLOCK_D)
        k = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
        e += tl.sum(q[:, None, :] * k, axis=2)
    e = tl.where(valid, e * scale, float("-inf"))
    top = tl.max(e, axis=1)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(valid, tl.exp(e - top[:, None]), 0.0)
    total = tl.sum(w, axis=1)
    a = w / tl.where(total > 0, total, 1.0)[:, None] * _gaussian(dist, valid, inv_two_var, GAUSS)
    j = tl.arange(0, W_PAD)
    a_ptr = A + b * sab + offs_m[:, None] * sam + j[None, :] * saw
    tl.store(a_ptr, a, mask=(offs_m < n_q)[:, None] & (j[None, :] <= 2 * D))
    offs_v = tl.arange(0, BLOCK_DV)
    for c0 in range(0, dv, BLOCK_DV):
        ptr, ok = _slot_ptrs(V, b, idx, valid, c0, dv, svb, svn, svd, BLOCK_DV)
        v = tl.load(ptr, mask=ok, other=0.0).to(tl.float32)
        o = tl.sum(a[:, :, None] * v, axis=1)
        o_ptr = O + b * sob + offs_m[:, None] * som + (c0 + offs_v)[None, :] * sod
        o_ok = (offs_m < n_q)[:, None] & ((c0 + offs_v) < dv)[None, :]
        tl.store(o_ptr, o.to(O.dtype.element_ty), mask=o_ok)


@triton.jit
def local_bwd(
    Q, K, V, C, M8, A, G, DQ, DK, DV, DC,
    n_q, n_k, d, dv, D, scale, inv_two_var,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, scb, scm, smb, smm, smn,
    sab, sam, saw, sgb, sgm, sgd, sdqb, sdqm, sdqd, sdkb, sdkn, sdkd, sdvb, sdvn, sdvd,
    GAUSS: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
    W_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    b, offs_m, idx, dist, valid = _window(C, M8, n_q, n_k, D, scb, scm, smb, smm, smn, BLOCK_M, W_PAD, HAS_MASK)  # fmt: skip
    j = tl.arange(0, W_PAD)
    a_ptr = A + b * sab + offs_m[:, None] * sam + j[None, :] * saw
    a = tl.load(a_ptr, mask=valid, other=0.0)
    # dL/da_l = dO . v_l; the values' gradient a_l dO goes to every slot's row
    da = tl.zeros([BLOCK_M, W_PAD], dtype=tl.float32)
    for c0 in range(0, dv, BLOCK_DV):
        g = _rows(G, b, offs_m, n_q, c0, dv, sgb, sgm, sgd, BLOCK_DV)
        ptr, ok = _slot_ptrs(V, b, idx, valid, c0, dv, svb, svn, svd, BLOCK_DV)
        da += tl.sum(g[:, None, :] * tl.load(ptr, mask=ok, other=0.0).to(tl.float32), axis=2)
        ptr, ok = _slot_ptrs(DV, b, idx, valid, c0, dv, sdvb, sdvn, sdvd, BLOCK_DV)
        tl.atomic_add(ptr, a[:, :, None] * g[:, None, :], mask=ok)
    # a = s g: the centre moves g (dg/dp = g (l - p) / sigma^2), the softmax takes da * g
    gauss = _gaussian(dist, valid, inv_two_var, GAUSS)
    if GAUSS:
        dc = tl.sum(tl.where(valid, da * a * dist, 0.0), axis=1) * (2.0 * inv_two_var)
        tl.store(DC + b * scb + offs_m * scm, dc, mask=offs_m < n_q)
    s = a / gauss
    ds = da * gauss
    de = tl.where(valid, s * (ds - tl.sum(s * ds, axis=1)[:, None]) * scale, 0.0)
    offs_d = tl.arange(0, BLOCK_D)
    for c0 in range(0, d, BLOCK_D):
        q = _rows(Q, b, offs_m, n_q, c0, d, sqb, sqm, sqd, BLOCK_D)
        ptr, ok = _slot_ptrs(K, b, idx, valid, c0, d, skb, skn, skd, BLOCK_D)
        dq = tl.sum(de[:, :, None] * tl.load(ptr, mask=ok, other=0.0).to(tl.float32), axis=1)
        q_ptr = DQ + b * sdqb + offs_m[:, None] * sdqm + (c0 + offs_d)[None, :] * sdqd
        tl.store(q_ptr, dq, mask=(offs_m < n_q)[:, None] & ((c0 + offs_d) < d)[None, :])
        ptr, ok = _slot_ptrs(DK, b, idx, valid, c0, d, sdkb, sdkn, sdkd, BLOCK_D)
        tl.atomic_add(ptr, de[:, :, None] * q[:, None, :], mask=ok)
