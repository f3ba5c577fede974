"""Triton kernels behind :mod:`attnlab.general.flash_additive` (import that module instead).

This module lives outside ``attnlab.general`` on purpose: the registry imports every
module of that package to find the mechanisms, and this one imports triton (slow, and it
fixes Triton's interpreter switch for the whole process), which should happen on the first
kernel call only.

This module imports :mod:`triton` at import time and decorates its kernels then, so
Triton's interpreter switch ``TRITON_INTERPRET=1`` must be set before it is first imported
(:mod:`attnlab.general.flash_additive` imports it lazily, on the first kernel call, and
:data:`INTERPRETED` records which mode the kernels were built in).

Conventions shared by every kernel:

* A program owns one tile of query rows (``BLOCK_M``) or of keys (``BLOCK_N``) of one batch
  element (``tl.program_id(1)``) and writes only its own rows: no atomics, and the results
  do not depend on scheduling (deterministic).
* Scores are accumulated in float32 and kept in base 2 (``s * log2(e)``) so that the softmax
  uses ``exp2``; the log-sum-exp saved for the backward pass is in base 2 as well, and is
  ``+inf`` for a query row (or a (row, feature)) without any allowed key, so that every
  recomputed weight of that row is exactly 0.
* ``ACT``: 0 identity, 1 tanh, 2 sigmoid, 3 relu. ``FAST`` (CUDA only) evaluates tanh with
  the ``tanh.approx.f32`` instruction (one MUFU operation, max. relative error about
  ``2^-11``); otherwise tanh and sigmoid are built from ``exp2`` and a division, which
  runs everywhere, the interpreter included.
* ``DOT``: how a ``tl.dot`` treats its operands: 0 float32 (IEEE), 1 TF32 tensor cores,
  2 the first operand cast to the second's 16-bit dtype (tensor cores, float32
  accumulation), 3 the same rounding emulated in float32 (for the interpreter, whose
  bfloat16 ``tl.dot`` is wrong in Triton 3.9).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

try:  # Triton >= 3.4 reads its settings through triton.knobs
    from triton import knobs

    _interpret = bool(knobs.runtime.interpret)
except ImportError:  # pragma: no cover - older Triton reads the variable directly
    _interpret = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: True when the kernels below were built for Triton's CPU interpreter (``TRITON_INTERPRET=1``
#: at import time).
INTERPRETED: bool = _interpret

ACT_CODES = {"identity": 0, "tanh": 1, "sigmoid": 2, "relu": 3}

LOG2E = 1.4426950408889634
TWO_LOG2E = 2.8853900817779268


# ------------------------------------------------------------------------------ helpers


@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if FAST:
        y = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2 |x|) in (0, 1]: never overflows
        e = tl.exp2(tl.abs(x) * -2.8853900817779268)
        y = (1.0 - e) / (1.0 + e)
        y = tl.where(x < 0, -y, y)
    return y


@triton.jit
def _act(x, ACT: tl.constexpr, FAST: tl.constexpr):
    if ACT == 1:
        y = _tanh(x, FAST)
    elif ACT == 2:
        if FAST:  # sigmoid(x) = (1 + tanh(x / 2)) / 2: one MUFU operation
            y = 0.5 * _tanh(0.5 * x, FAST) + 0.5
        else:
            y = 1.0 / (1.0 + tl.exp2(x * -1.4426950408889634))
    elif ACT == 3:
        y = tl.maximum(x, 0.0)
    else:
        y = x
    return y


@triton.jit
def _act_grad(t, ACT: tl.constexpr):
    """The activation's derivative, from its output ``t``."""
    if ACT == 1:
        g = 1.0 - t * t
    elif ACT == 2:
        g = t * (1.0 - t)
    elif ACT == 3:
        g = (t > 0.0).to(tl.float32)
    else:
        g = t * 0.0 + 1.0
    return g


@triton.jit
def _dot(a, b, DOT: tl.constexpr):
    if DOT == 0:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif DOT == 1:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    elif DOT == 2:
        r = tl.dot(a.to(b.dtype), b)
    else:
        r = tl.dot(a.to(b.dtype).to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return r


@triton.jit
def _allowed(
    M,
    b,
    offs_m,
    offs_n,
    n_q,
    n_k,
    smb,
    smi,
    smj,
    causal_offset,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """``[BLOCK_M, BLOCK_N]`` bool: the pairs that exist and may attend."""
    ok = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    if HAS_MASK:
        # 64-bit offsets: a materialised [B, n_q, n_k] mask may pass 2^31 bytes
        rows = b.to(tl.int64) * smb + offs_m.to(tl.int64)[:, None] * smi
        m = tl.load(M + rows + offs_n[None, :] * smj, mask=ok, other=0)
        ok = ok & (m != 0)
    if CAUSAL:
        ok = ok & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
    return ok


@triton.jit
def _causal_hi(start_m, n_k, causal_offset, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """End of the key range a query tile starting at ``start_m`` may attend."""
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, tl.maximum(start_m + BLOCK_M + causal_offset, 0))
    return hi


@triton.jit
def _causal_lo(start_n, causal_offset, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """First query tile that may attend a key tile starting at ``start_n``."""
    lo = 0
    if CAUSAL:
        lo = (tl.maximum(start_n - causal_offset, 0) // BLOCK_M) * BLOCK_M
    return lo


# ------------------------------------------------------------------ additive attention


@triton.jit
def _additive_scores(
    Qb,
    Kb,
    W,
    offs_m,
    offs_n,
    n_q,
    n_k,
    sqm,
    sqd,
    skn,
    skd,
    D,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``s[i, j] = sum_d w[d] act(q1[i, d] + k2[j, d])`` for a tile, one hidden unit at a
    time: per unit one column of ``q1`` and one of ``k2`` are loaded (contiguous when the
    caller passes them transposed), and the tile costs one add, one activation and one
    fused multiply-add per pair."""
    row_ok = offs_m < n_q
    col_ok = offs_n < n_k
    s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d in range(0, D):
        qd = tl.load(Qb + offs_m * sqm + d * sqd, mask=row_ok, other=0.0).to(tl.float32)
        kd = tl.load(Kb + offs_n * skn + d * skd, mask=col_ok, other=0.0).to(tl.float32)
        wd = tl.load(W + d).to(tl.float32)
        s += wd * _act(qd[:, None] + kd[None, :], ACT, FAST)
    return s


@triton.jit
def additive_fwd(
    Q,
    K,
    W,
    V,
    M,
    O,
    L,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sob,
    som,
    sod,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Context ``O [B, n_q, DV]`` and base-2 log-sum-exp ``L [B, n_q]`` of one query tile:
    online softmax over the key tiles (running max ``m_i`` and normaliser ``l_i``)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    Qb = Q + b * sqb
    Kb = K + b * skb
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        s = (
            _additive_scores(
                Qb,
                Kb,
                W,
                offs_m,
                offs_n,
                n_q,
                n_k,
                sqm,
                sqd,
                skn,
                skd,
                D,
                ACT,
                FAST,
                BLOCK_M,
                BLOCK_N,
            )
            * 1.4426950408889634
        )
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            V + b * svb + offs_n[:, None] * svn + offs_dv[None, :] * svd,
            mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + _dot(p, v, DOT)
        m_i = m_new
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
    row_ok = offs_m < n_q
    tl.store(L + b * n_q + offs_m, lse, mask=row_ok)
    tl.store(
        O + b * sob + offs_m[:, None] * som + offs_dv[None, :] * sod,
        out.to(O.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
    )


@triton.jit
def additive_bwd_q(
    Q,
    K,
    W,
    V,
    M,
    L,
    DO,
    DELTA,
    DQ,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sgb,
    sgm,
    sgd,
    sdb,
    sdm,
    sdd,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """``dq1`` of one query tile: for every key tile, recompute the scores and the weights
    ``p = 2^(s2 - lse)``, form ``ds = p (dO v^T - delta)``, then run over the hidden units
    again for ``dq1[:, d] = w[d] sum_j ds act'(q1 + k2)`` (kept in registers)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    lse = tl.load(L + b * n_q + offs_m, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + b * n_q + offs_m, mask=row_ok, other=0.0)
    do = tl.load(
        DO + b * sgb + offs_m[:, None] * sgm + offs_dv[None, :] * sgd,
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    Qb = Q + b * sqb
    Kb = K + b * skb
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < n_k
        s = (
            _additive_scores(
                Qb,
                Kb,
                W,
                offs_m,
                offs_n,
                n_q,
                n_k,
                sqm,
                sqd,
                skn,
                skd,
                D,
                ACT,
                FAST,
                BLOCK_M,
                BLOCK_N,
            )
            * 1.4426950408889634
        )
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
        v = tl.load(
            V + b * svb + offs_n[:, None] * svn + offs_dv[None, :] * svd,
            mask=col_ok[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        dp = _dot(do, tl.trans(v), DOT)
        ds = p * (dp - delta[:, None])
        for d in range(0, D):
            qd = tl.load(Qb + offs_m * sqm + d * sqd, mask=row_ok, other=0.0).to(tl.float32)
            kd = tl.load(Kb + offs_n * skn + d * skd, mask=col_ok, other=0.0).to(tl.float32)
            wd = tl.load(W + d).to(tl.float32)
            t = _act(qd[:, None] + kd[None, :], ACT, FAST)
            col = tl.sum(ds * _act_grad(t, ACT), 1) * wd
            dq += tl.where(offs_d[None, :] == d, col[:, None], 0.0)
    tl.store(
        DQ + b * sdb + offs_m[:, None] * sdm + offs_d[None, :] * sdd,
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None] & (offs_d[None, :] < D),
    )


@triton.jit
def additive_bwd_kv(
    Q,
    K,
    W,
    V,
    M,
    L,
    DO,
    DELTA,
    DK,
    DV_,
    DW,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sgb,
    sgm,
    sgd,
    skgb,
    skgn,
    skgd,
    svgb,
    svgn,
    svgd,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """``dk2``, ``dv`` of one key tile and this program's share of ``dw`` (row
    ``b * num_key_tiles + pid`` of ``DW [programs, BLOCK_D]``, summed by the caller): for
    every query tile, recompute ``p`` and ``ds`` as in :func:`additive_bwd_q`, add
    ``p^T dO`` to ``dv``, then per hidden unit ``d`` add ``w[d] sum_i ds act'`` to
    ``dk2[:, d]`` and ``sum_ij ds act`` to ``dw[d]``."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_n = pid * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < n_k
    v = tl.load(
        V + b * svb + offs_n[:, None] * svn + offs_dv[None, :] * svd,
        mask=col_ok[:, None] & (offs_dv[None, :] < DV),
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    Qb = Q + b * sqb
    Kb = K + b * skb
    lo = _causal_lo(start_n, causal_offset, BLOCK_M, CAUSAL)
    for start_m in range(lo, n_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < n_q
        lse = tl.load(L + b * n_q + offs_m, mask=row_ok, other=float("inf"))
        delta = tl.load(DELTA + b * n_q + offs_m, mask=row_ok, other=0.0)
        do = tl.load(
            DO + b * sgb + offs_m[:, None] * sgm + offs_dv[None, :] * sgd,
            mask=row_ok[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        s = (
            _additive_scores(
                Qb,
                Kb,
                W,
                offs_m,
                offs_n,
                n_q,
                n_k,
                sqm,
                sqd,
                skn,
                skd,
                D,
                ACT,
                FAST,
                BLOCK_M,
                BLOCK_N,
            )
            * 1.4426950408889634
        )
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
        dv += _dot(tl.trans(p), do, DOT)
        dp = _dot(do, tl.trans(v), DOT)
        ds = p * (dp - delta[:, None])
        for d in range(0, D):
            qd = tl.load(Qb + offs_m * sqm + d * sqd, mask=row_ok, other=0.0).to(tl.float32)
            kd = tl.load(Kb + offs_n * skn + d * skd, mask=col_ok, other=0.0).to(tl.float32)
            wd = tl.load(W + d).to(tl.float32)
            t = _act(qd[:, None] + kd[None, :], ACT, FAST)
            col = tl.sum(ds * _act_grad(t, ACT), 0) * wd
            dk += tl.where(offs_d[None, :] == d, col[:, None], 0.0)
            dw += tl.where(offs_d == d, tl.sum(tl.sum(ds * t, 1), 0), 0.0)
    tl.store(
        DK + b * skgb + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
        dk.to(DK.dtype.element_ty),
        mask=col_ok[:, None] & (offs_d[None, :] < D),
    )
    tl.store(
        DV_ + b * svgb + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
        dv.to(DV_.dtype.element_ty),
        mask=col_ok[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(DW + (b * tl.num_programs(0) + pid) * BLOCK_D + offs_d, dw)


@triton.jit
def additive_weights(
    Q,
    K,
    W,
    M,
    L,
    A,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    smb,
    smi,
    smj,
    sab,
    sam,
    san,
    n_q,
    n_k,
    D,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Second pass for ``need_weights``: ``A[b, i, j] = 2^(s2 - lse)`` of one
    (query tile, key tile) -- grid ``(query tiles, B, key tiles)``."""
    b = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = (
        _additive_scores(
            Q + b * sqb,
            K + b * skb,
            W,
            offs_m,
            offs_n,
            n_q,
            n_k,
            sqm,
            sqd,
            skn,
            skd,
            D,
            ACT,
            FAST,
            BLOCK_M,
            BLOCK_N,
        )
        * 1.4426950408889634
    )
    ok = _allowed(M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL)
    lse = tl.load(L + b * n_q + offs_m, mask=offs_m < n_q, other=float("inf"))
    p = tl.where(ok, tl.exp2(s - lse[:, None]), 0.0)
    tl.store(
        A + b.to(tl.int64) * sab + offs_m.to(tl.int64)[:, None] * sam + offs_n[None, :] * san,
        p.to(A.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_n[None, :] < n_k),
    )


# ------------------------------------------------------- multi-dimensional attention


@triton.jit
def _multi_scores(
    q,
    k,
    Wd,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Hidden tile ``h = act(q1_i + k2_j)`` as ``[BLOCK_M * BLOCK_N, BLOCK_D]`` and the
    feature scores ``h @ Wd`` as ``[BLOCK_M, BLOCK_N, BLOCK_DV]`` (one tensor-core product
    per tile; padded hidden units meet zero rows of ``Wd``)."""
    h = _act(q[:, None, :] + k[None, :, :], ACT, FAST)
    h = tl.reshape(h, [BLOCK_M * BLOCK_N, BLOCK_D])
    e = tl.reshape(_dot(h, Wd, DOT), [BLOCK_M, BLOCK_N, BLOCK_DV])
    return h, e


@triton.jit
def _load_rows(X, b, offs, n, sb, sn, sd, D, BLOCK_D: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    return tl.load(
        X + b * sb + offs[:, None] * sn + offs_d[None, :] * sd,
        mask=(offs[:, None] < n) & (offs_d[None, :] < D),
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _load_wd(Wd, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    return tl.load(
        Wd + offs_d[:, None] * DV + offs_dv[None, :],
        mask=(offs_d[:, None] < D) & (offs_dv[None, :] < DV),
        other=0.0,
    ).to(tl.float32)


@triton.jit
def multi_fwd(
    Q,
    K,
    Wd,
    V,
    M,
    O,
    L,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sob,
    som,
    sod,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Context ``O [B, n_q, DV]`` and base-2 log-sum-exp ``L [B, n_q, DV]`` (one per row
    and feature) of one query tile; ``Wd`` is ``W_d * log2(e)`` (contiguous
    ``[D, DV]``)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _load_rows(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D)
    wd = _load_wd(Wd, D, DV, BLOCK_D, BLOCK_DV)
    m_i = tl.full([BLOCK_M, BLOCK_DV], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D)
        v = _load_rows(V, b, offs_n, n_k, svb, svn, svd, DV, BLOCK_DV)
        _, e = _multi_scores(q, k, wd, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        e = tl.where(ok[:, :, None], e, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(e, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(e - m_use[:, None, :])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha + tl.sum(p * v[None, :, :], 1)
        m_i = m_new
    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
    keep = (offs_m[:, None] < n_q) & (offs_dv[None, :] < DV)
    tl.store(L + (b * n_q + offs_m[:, None]) * DV + offs_dv[None, :], lse, mask=keep)
    tl.store(
        O + b * sob + offs_m[:, None] * som + offs_dv[None, :] * sod,
        out.to(O.dtype.element_ty),
        mask=keep,
    )


@triton.jit
def _multi_grad_scores(
    q,
    k,
    v,
    g,
    c,
    lse,
    ok,
    Wd2,
    WdT,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Recomputed weights ``a``, the hidden tile ``h``, the score gradient
    ``de = a g (v - c)`` (``[M * N, DV]``) and the gradient of the pre-activation
    ``dx = (de @ W_d^T) act'(h)`` (``[M, N, D]``) of one tile."""
    h, e = _multi_scores(q, k, Wd2, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    a = tl.where(ok[:, :, None], tl.exp2(e - lse[:, None, :]), 0.0)
    de = a * g[:, None, :] * (v[None, :, :] - c[:, None, :])
    de = tl.reshape(de, [BLOCK_M * BLOCK_N, BLOCK_DV])
    dx = _dot(de, WdT, DOT) * _act_grad(h, ACT)
    return a, h, de, tl.reshape(dx, [BLOCK_M, BLOCK_N, BLOCK_D])


@triton.jit
def multi_bwd_q(
    Q,
    K,
    Wd2,
    WdT,
    V,
    M,
    L,
    DO,
    C,
    DQ,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sgb,
    sgm,
    sgd,
    scb,
    scm,
    scd,
    sdb,
    sdm,
    sdd,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """``dq1`` of one query tile (``WdT`` is ``W_d^T`` contiguous ``[DV, D]``; ``C`` the
    saved context)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_rows(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D)
    g = _load_rows(DO, b, offs_m, n_q, sgb, sgm, sgd, DV, BLOCK_DV)
    c = _load_rows(C, b, offs_m, n_q, scb, scm, scd, DV, BLOCK_DV)
    lse = tl.load(
        L + (b * n_q + offs_m[:, None]) * DV + offs_dv[None, :],
        mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV),
        other=float("inf"),
    )
    wd2 = _load_wd(Wd2, D, DV, BLOCK_D, BLOCK_DV)
    wdt = _load_wd(WdT, DV, D, BLOCK_DV, BLOCK_D)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D)
        v = _load_rows(V, b, offs_n, n_k, svb, svn, svd, DV, BLOCK_DV)
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        _, _, _, dx = _multi_grad_scores(
            q,
            k,
            v,
            g,
            c,
            lse,
            ok,
            wd2,
            wdt,
            ACT,
            FAST,
            DOT,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
            BLOCK_DV,
        )
        dq += tl.sum(dx, 1)
    tl.store(
        DQ + b * sdb + offs_m[:, None] * sdm + offs_d[None, :] * sdd,
        dq.to(DQ.dtype.element_ty),
        mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < D),
    )


@triton.jit
def multi_bwd_kv(
    Q,
    K,
    Wd2,
    WdT,
    V,
    M,
    L,
    DO,
    C,
    DK,
    DV_,
    DW,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    svb,
    svn,
    svd,
    smb,
    smi,
    smj,
    sgb,
    sgm,
    sgd,
    scb,
    scm,
    scd,
    skgb,
    skgn,
    skgd,
    svgb,
    svgn,
    svgd,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """``dk2``, ``dv`` of one key tile and this program's share of ``dW_d`` (slice
    ``b * num_key_tiles + pid`` of ``DW [programs, BLOCK_D, BLOCK_DV]``)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_n = pid * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_rows(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D)
    v = _load_rows(V, b, offs_n, n_k, svb, svn, svd, DV, BLOCK_DV)
    wd2 = _load_wd(Wd2, D, DV, BLOCK_D, BLOCK_DV)
    wdt = _load_wd(WdT, DV, D, BLOCK_DV, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    dW = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    lo = _causal_lo(start_n, causal_offset, BLOCK_M, CAUSAL)
    for start_m in range(lo, n_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_rows(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D)
        g = _load_rows(DO, b, offs_m, n_q, sgb, sgm, sgd, DV, BLOCK_DV)
        c = _load_rows(C, b, offs_m, n_q, scb, scm, scd, DV, BLOCK_DV)
        lse = tl.load(
            L + (b * n_q + offs_m[:, None]) * DV + offs_dv[None, :],
            mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV),
            other=float("inf"),
        )
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        a, h, de, dx = _multi_grad_scores(
            q,
            k,
            v,
            g,
            c,
            lse,
            ok,
            wd2,
            wdt,
            ACT,
            FAST,
            DOT,
            BLOCK_M,
            BLOCK_N,
            BLOCK_D,
            BLOCK_DV,
        )
        dv += tl.sum(a * g[:, None, :], 0)
        dW += _dot(tl.trans(h), de, DOT)
        dk += tl.sum(dx, 0)
    keep_d = (offs_n[:, None] < n_k) & (offs_d[None, :] < D)
    tl.store(
        DK + b * skgb + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
        dk.to(DK.dtype.element_ty),
        mask=keep_d,
    )
    tl.store(
        DV_ + b * svgb + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
        dv.to(DV_.dtype.element_ty),
        mask=(offs_n[:, None] < n_k) & (offs_dv[None, :] < DV),
    )
    base = (b * tl.num_programs(0) + pid) * BLOCK_D * BLOCK_DV
    tl.store(DW + base + offs_d[:, None] * BLOCK_DV + offs_dv[None, :], dW)


@triton.jit
def multi_weights(
    Q,
    K,
    Wd,
    M,
    L,
    A,
    sqb,
    sqm,
    sqd,
    skb,
    skn,
    skd,
    smb,
    smi,
    smj,
    sab,
    sam,
    san,
    saf,
    n_q,
    n_k,
    D,
    DV,
    causal_offset,
    ACT: tl.constexpr,
    FAST: tl.constexpr,
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Second pass for ``need_weights``: ``A [B, n_q, n_k, DV]`` of one
    (query tile, key tile)."""
    b = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = _load_rows(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D)
    k = _load_rows(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D)
    wd = _load_wd(Wd, D, DV, BLOCK_D, BLOCK_DV)
    _, e = _multi_scores(q, k, wd, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    ok = _allowed(M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL)
    lse = tl.load(
        L + (b * n_q + offs_m[:, None]) * DV + offs_dv[None, :],
        mask=(offs_m[:, None] < n_q) & (offs_dv[None, :] < DV),
        other=float("inf"),
    )
    a = tl.where(ok[:, :, None], tl.exp2(e - lse[:, None, :]), 0.0)
    ptr = (
        A
        + b.to(tl.int64) * sab
        + offs_m.to(tl.int64)[:, None, None] * sam
        + offs_n[None, :, None] * san
        + offs_dv[None, None, :] * saf
    )
    keep = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    tl.store(ptr, a.to(A.dtype.element_ty), mask=keep[:, :, None] & (offs_dv < DV)[None, None, :])
