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
  their last bits (``ATOMIC``). Without ``ATOMIC`` it writes the score gradients ``E``
  ``[B, n_q, W]`` instead, and :func:`local_bwd_kv` sums ``dk`` and ``dv`` key block by key
  block over the queries sorted by centre (those whose windows may hold the block form
  one run of the sorted order): no atomics, deterministic results.

Strides come in the order batch, row, column; the mask is a uint8 view with stride 0 where
it broadcasts.
"""

from __future__ import annotations

import triton
import triton.language as tl

from attnlab._flash_kernels import INTERPRETED

__all__ = ["INTERPRETED", "local_bwd", "local_bwd_kv", "local_fwd"]


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
    Q, K, V, C, M8, A, E, G, DQ, DK, DV, DC,
    n_q, n_k, d, dv, D, scale, inv_two_var,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, scb, scm, smb, smm, smn,
    sab, sam, saw, sgb, sgm, sgd, sdqb, sdqm, sdqd, sdkb, sdkn, sdkd, sdvb, sdvn, sdvd,
    GAUSS: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
    W_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, ATOMIC: tl.constexpr,
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
        if ATOMIC:
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
    if not ATOMIC:  # the key-side pass (local_bwd_kv) reads the score gradients
        e_ptr = E + b * sab + offs_m[:, None] * sam + j[None, :] * saw
        tl.store(e_ptr, de, mask=(offs_m < n_q)[:, None] & (j[None, :] <= 2 * D))
    offs_d = tl.arange(0, BLOCK_D)
    for c0 in range(0, d, BLOCK_D):
        q = _rows(Q, b, offs_m, n_q, c0, d, sqb, sqm, sqd, BLOCK_D)
        ptr, ok = _slot_ptrs(K, b, idx, valid, c0, d, skb, skn, skd, BLOCK_D)
        dq = tl.sum(de[:, :, None] * tl.load(ptr, mask=ok, other=0.0).to(tl.float32), axis=1)
        q_ptr = DQ + b * sdqb + offs_m[:, None] * sdqm + (c0 + offs_d)[None, :] * sdqd
        tl.store(q_ptr, dq, mask=(offs_m < n_q)[:, None] & ((c0 + offs_d) < d)[None, :])
        if ATOMIC:
            ptr, ok = _slot_ptrs(DK, b, idx, valid, c0, d, sdkb, sdkn, sdkd, BLOCK_D)
            tl.atomic_add(ptr, de[:, :, None] * q[:, None, :], mask=ok)


@triton.jit
def _slot_values(X, C, P, b, offs_s, hi, offs_n, D, sxb, sxm, sxw, scb, scm, spb, spm):
    """For the sorted queries ``offs_s`` (< ``hi``) and the keys ``offs_n``: the query
    indices ``i = P[b, offs_s]`` and ``X[b, i, l - start_i]`` ``[BLOCK_M, BLOCK_N]`` where
    key ``l`` is a slot of query ``i``'s window (``0 <= l - start_i <= 2D``), else 0."""
    ok_s = offs_s < hi
    i = tl.load(P + b * spb + offs_s * spm, mask=ok_s, other=0)
    p = tl.load(C + b * scb + i * scm, mask=ok_s, other=0.0).to(tl.float32)
    slot = offs_n[None, :].to(tl.float32) - tl.ceil(p - D)[:, None]
    ok = ok_s[:, None] & (slot >= 0) & (slot <= 2 * D)
    jj = tl.where(ok, slot, 0.0).to(tl.int32)
    return i, tl.load(X + b * sxb + i[:, None] * sxm + jj * sxw, mask=ok, other=0.0)


@triton.jit
def _key_side_sum(
    X, R, C, P, b, lo, hi, offs_n, c0, n_q, n_cols, D,
    sxb, sxm, sxw, srb, srm, srd, scb, scm, spb, spm,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """``sum_i X[b, i, l - start_i] R[b, i, c0:c0 + BLOCK]`` for the keys ``offs_n`` over
    the sorted queries ``lo .. hi``: ``[BLOCK_N, BLOCK]``, one tensor-core product per
    ``BLOCK_M`` queries."""
    acc = tl.zeros([BLOCK_N, BLOCK], dtype=tl.float32)
    for s0 in range(lo, hi, BLOCK_M):
        offs_s = s0 + tl.arange(0, BLOCK_M)
        i, w = _slot_values(X, C, P, b, offs_s, hi, offs_n, D, sxb, sxm, sxw, scb, scm, spb, spm)  # fmt: skip
        r = _rows(R, b, i, n_q, c0, n_cols, srb, srm, srd, BLOCK)
        r = tl.where((offs_s < hi)[:, None], r, 0.0)
        acc += tl.dot(tl.trans(w), r, input_precision="ieee")
    return acc


@triton.jit
def local_bwd_kv(
    Q, G, C, A, E, P, LO, HI, DK, DV,
    n_q, n_k, d, dv, D,
    sqb, sqm, sqd, sgb, sgm, sgd, scb, scm, sab, sam, saw, spb, spm, slb, sln,
    sdkb, sdkn, sdkd, sdvb, sdvn, sdvd,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The deterministic key-side pass: a program owns ``BLOCK_N`` keys of one batch
    element and sums, over the queries whose windows may hold them (``LO .. HI`` of the
    queries sorted by centre, ``P``), ``dk_l = sum_i de_{i,l} q_i`` and
    ``dv_l = sum_i a_{i,l} dO_i``; every key's rows are written by one program."""
    kb = tl.program_id(0)
    b = tl.program_id(1)
    offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)
    lo = tl.load(LO + b * slb + kb * sln)
    hi = tl.load(HI + b * slb + kb * sln)
    offs = tl.arange(0, BLOCK_D)
    for c0 in range(0, d, BLOCK_D):
        acc = _key_side_sum(E, Q, C, P, b, lo, hi, offs_n, c0, n_q, d, D, sab, sam, saw, sqb, sqm, sqd, scb, scm, spb, spm, BLOCK_N, BLOCK_M, BLOCK_D)  # fmt: skip
        ptr = DK + b * sdkb + offs_n[:, None] * sdkn + (c0 + offs)[None, :] * sdkd
        tl.store(ptr, acc, mask=(offs_n < n_k)[:, None] & ((c0 + offs) < d)[None, :])
    for c0 in range(0, dv, BLOCK_D):
        acc = _key_side_sum(A, G, C, P, b, lo, hi, offs_n, c0, n_q, dv, D, sab, sam, saw, sgb, sgm, sgd, scb, scm, spb, spm, BLOCK_N, BLOCK_M, BLOCK_D)  # fmt: skip
        ptr = DV + b * sdvb + offs_n[:, None] * sdvn + (c0 + offs)[None, :] * sdvd
        tl.store(ptr, acc, mask=(offs_n < n_k)[:, None] & ((c0 + offs) < dv)[None, :])
