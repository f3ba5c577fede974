"""Triton kernels behind :mod:`attnlab.general.flash_additive` (import that module instead).

This module lives outside ``attnlab.general`` on purpose: the registry imports every
module of that package to find the mechanisms, and this one imports triton (slow, and it
fixes Triton's interpreter switch for the whole process), which should happen on the first
kernel call only.

This module imports :mod:`triton` at import time and decorates its kernels then, so
Triton's interpreter switch ``TRITON_INTERPRET=1`` must be set before it is first imported
(:mod:`attnlab.general.flash_additive` imports it lazily, on the first kernel call, and
:data:`INTERPRETED` records which mode the kernels were built in).

One kernel per direction serves both scores -- :func:`attend_fwd` (forward),
:func:`attend_bwd_q` (backward over query tiles), :func:`attend_bwd_kv` (backward over key
tiles) and :func:`attend_weights` (the second pass for ``need_weights``) -- and the
``MULTI`` switch (a ``tl.constexpr``, so each kind is compiled on its own, without
branches) picks the score kind:

* ``MULTI=False``, additive (Bahdanau): one weight per key, ``s[i, j] = w . act(q1_i +
  k2_j)``; the score tile ``[BLOCK_M, BLOCK_N]`` is accumulated one hidden unit at a time
  from one column of ``q1`` and one of ``k2`` (so registers hold 2-D tiles only), and the
  weighted sums with ``v`` / ``dO`` are ``tl.dot`` products; the log-sum-exp is
  ``[B, n_q]``.
* ``MULTI=True``, multi-dimensional (DiSAN): one weight per key and feature,
  ``e[i, j, :] = act(q1_i + k2_j) @ W_d``; the hidden tile ``[BLOCK_M * BLOCK_N,
  BLOCK_D]`` is formed at once and multiplied by ``W_d`` (one tensor-core product per
  tile), the softmax statistics are ``[BLOCK_M, BLOCK_DV]`` and the log-sum-exp is
  ``[B, n_q, DV]``.

The helpers ``_scores``, ``_online_softmax``, ``_softmax_finish``, ``_score_grad``,
``_act_grads`` and ``_value_grad`` hold the two variants of each step side
by side; everything else (tile loads with masks, the activation and its derivative, the
mask and causal tests, the online softmax in base 2, the log-sum-exp) is one piece of code.

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
* Operands: ``Q``, ``K`` are ``q1``, ``k2`` in float32 (column-major for the additive
  kernels, row-major for the multi-dimensional ones); ``W`` is ``w [D]`` (additive) or
  ``W_d * log2(e)`` contiguous ``[D, DV]`` (multi); ``WT`` is ``W_d^T`` contiguous
  ``[DV, D]`` (multi; the additive kernels ignore it); ``AUX`` is ``delta_i = dO_i . O_i``
  ``[B, n_q, 1]`` (additive) or the context ``O`` (multi). Strides come in the order
  batch, row, column.
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


# ----------------------------------------------------------------- elementwise pieces


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


# ------------------------------------------------------------------- masks and tiles


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
def _per_score(x, MULTI: tl.constexpr):
    """A ``[BLOCK_M, BLOCK_N]`` tile shaped to broadcast against the scores (a trailing
    feature axis for the multi-dimensional ones)."""
    if MULTI:
        y = x[:, :, None]
    else:
        y = x
    return y


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


@triton.jit
def _load_tile(X, b, offs, n, sb, sn, sd, D, BLOCK_D: tl.constexpr, F32: tl.constexpr):
    """Rows ``offs`` of ``X[b]`` and their first ``D`` columns, ``[len(offs), BLOCK_D]``,
    0 outside; in float32 when ``F32``, else in ``X``'s dtype."""
    offs_d = tl.arange(0, BLOCK_D)
    x = tl.load(
        X + b * sb + offs[:, None] * sn + offs_d[None, :] * sd,
        mask=(offs[:, None] < n) & (offs_d[None, :] < D),
        other=0.0,
    )
    if F32:
        x = x.to(tl.float32)
    return x


@triton.jit
def _store_tile(X, x, b, offs, n, sb, sn, sd, D, BLOCK_D: tl.constexpr):
    """Write ``x [len(offs), BLOCK_D]`` to the rows ``offs`` (< ``n``) and first ``D``
    columns of ``X[b]``, in ``X``'s dtype."""
    offs_d = tl.arange(0, BLOCK_D)
    tl.store(
        X + b * sb + offs[:, None] * sn + offs_d[None, :] * sd,
        x.to(X.dtype.element_ty),
        mask=(offs[:, None] < n) & (offs_d[None, :] < D),
    )


@triton.jit
def _operand(X, b, offs, n, sb, sn, sd, D, BLOCK_D: tl.constexpr, MULTI: tl.constexpr):
    """``q1`` or ``k2`` as the score helpers take it: the float32 rows ``offs`` of
    ``X[b]`` (multi), or the base pointer of ``X[b]`` (additive: its helpers load one
    column per hidden unit)."""
    if MULTI:
        x = _load_tile(X, b, offs, n, sb, sn, sd, D, BLOCK_D, True)
    else:
        x = X + b * sb
    return x


@triton.jit
def _key_tile(K, V, b, start_n, n_k, skb, skn, skd, svb, svn, svd, D, DV, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):  # fmt: skip
    """The key tile starting at ``start_n``: its row offsets, ``k2`` as the score helpers
    take it (:func:`_operand`) and the value rows ``[BLOCK_N, BLOCK_DV]`` (float32 for
    multi-dimensional scores, else in ``V``'s dtype)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _operand(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D, MULTI)
    v = _load_tile(V, b, offs_n, n_k, svb, svn, svd, DV, BLOCK_DV, MULTI)
    return offs_n, k, v


@triton.jit
def _weight_operand(W, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):
    """The score weights as the score helpers take them: ``W_d`` as a float32
    ``[BLOCK_D, BLOCK_DV]`` tile, 0-padded (multi), or the pointer to ``w`` (additive)."""
    if MULTI:
        w = _load_tile(W, 0, tl.arange(0, BLOCK_D), D, 0, DV, 1, DV, BLOCK_DV, True)
    else:
        w = W
    return w


@triton.jit
def _lse_at(L, b, offs_m, n_q, DV, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):
    """Pointers to, and bounds of, the log-sum-exp of the rows ``offs_m`` in ``L``:
    ``[B, n_q]`` (additive) or ``[B, n_q, DV]`` (multi), contiguous."""
    if MULTI:
        offs_dv = tl.arange(0, BLOCK_DV)
        ptr = L + (b * n_q + offs_m[:, None]) * DV + offs_dv[None, :]
        ok = (offs_m[:, None] < n_q) & (offs_dv[None, :] < DV)
    else:
        ptr = L + b * n_q + offs_m
        ok = offs_m < n_q
    return ptr, ok


@triton.jit
def _load_lse(L, b, offs_m, n_q, DV, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):
    ptr, ok = _lse_at(L, b, offs_m, n_q, DV, BLOCK_DV, MULTI)
    return tl.load(ptr, mask=ok, other=float("inf"))


@triton.jit
def _row_stats(AUX, b, offs_m, n_q, scb, scm, scd, DV, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):
    """What the score gradient subtracts per query row: the float32 context rows
    ``[BLOCK_M, BLOCK_DV]`` (multi) or ``delta_i = dO_i . O_i`` ``[BLOCK_M]`` (additive)."""
    if MULTI:
        x = _load_tile(AUX, b, offs_m, n_q, scb, scm, scd, DV, BLOCK_DV, True)
    else:
        x = tl.load(AUX + b * scb + offs_m * scm, mask=offs_m < n_q, other=0.0)
    return x


# --------------------------------------------------------------------------- scores


@triton.jit
def _query_grad_tile(
    Q, DO, AUX, L, b, start_m, n_q, sqb, sqm, sqd, sgb, sgm, sgd, scb, scm, scd, D, DV,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr,
):  # fmt: skip
    """What the backward kernels read of the query tile at ``start_m``: its positions
    ``offs_m``, its queries (:func:`_operand`), the output gradient ``dO`` rows, the row
    statistics (:func:`_row_stats`) and the log-sum-exp."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _operand(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D, MULTI)
    g = _load_tile(DO, b, offs_m, n_q, sgb, sgm, sgd, DV, BLOCK_DV, MULTI)
    c = _row_stats(AUX, b, offs_m, n_q, scb, scm, scd, DV, BLOCK_DV, MULTI)
    lse = _load_lse(L, b, offs_m, n_q, DV, BLOCK_DV, MULTI)
    return offs_m, q, g, c, lse


@triton.jit
def _unit(Qb, Kb, W, d, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, ACT: tl.constexpr, FAST: tl.constexpr):  # fmt: skip
    """Hidden unit ``d`` of an additive tile: ``t = act(q1[:, d] + k2[:, d]^T)``
    ``[BLOCK_M, BLOCK_N]`` (one column of ``q1`` and one of ``k2`` loaded, contiguous
    when the caller passes them column-major) and ``w[d]``."""
    qd = tl.load(Qb + offs_m * sqm + d * sqd, mask=offs_m < n_q, other=0.0).to(tl.float32)
    kd = tl.load(Kb + offs_n * skn + d * skd, mask=offs_n < n_k, other=0.0).to(tl.float32)
    wd = tl.load(W + d).to(tl.float32)
    return _act(qd[:, None] + kd[None, :], ACT, FAST), wd


@triton.jit
def _scores(
    q, k, w, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Base-2 scores of one tile and the hidden tile behind them.

    Multi: ``h = act(q1_i + k2_j)`` as ``[BLOCK_M * BLOCK_N, BLOCK_D]`` and ``h @ W_d``
    as ``[BLOCK_M, BLOCK_N, BLOCK_DV]`` (one tensor-core product per tile; padded hidden
    units meet zero rows of ``W_d``, which the caller scaled by ``log2(e)``).
    Additive: ``s = log2(e) sum_d w[d] act(q1[:, d] + k2[:, d]^T)`` ``[BLOCK_M,
    BLOCK_N]``, one hidden unit at a time (one add, one activation and one fused
    multiply-add per pair and unit); the second value is ``s`` again (the additive
    backward recomputes the activations unit by unit instead).
    """
    if MULTI:
        h = _act(q[:, None, :] + k[None, :, :], ACT, FAST)
        h = tl.reshape(h, [BLOCK_M * BLOCK_N, BLOCK_D])
        s = tl.reshape(_dot(h, w, DOT), [BLOCK_M, BLOCK_N, BLOCK_DV])
    else:
        s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for d in range(0, D):
            t, wd = _unit(q, k, w, d, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, ACT, FAST)
            s += wd * t
        s = s * 1.4426950408889634
        h = s
    return s, h


@triton.jit
def _recompute(
    q, k, w, lse, M, b, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, smb, smi, smj, D,
    causal_offset, MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr,
    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """The weights ``p = 2^(s2 - lse)`` of one tile from the saved base-2 log-sum-exp
    (exactly 0 where not allowed), and the hidden tile of :func:`_scores`: what the
    backward kernels recompute instead of storing. (:func:`attend_weights` writes the
    same steps out with the log-sum-exp loaded after the scores, which compiles to fewer
    registers there.)"""
    s, h = _scores(
        q, k, w, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
        MULTI, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
    )  # fmt: skip
    ok = _allowed(M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL)
    p = tl.where(_per_score(ok, MULTI), tl.exp2(s - tl.expand_dims(lse, 1)), 0.0)
    return p, h


# ----------------------------------------------------------------- online softmax


@triton.jit
def _softmax_start(BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, MULTI: tl.constexpr):
    """Running maximum ``m_i = -inf`` and normaliser ``l_i = 0`` per row (per row and
    feature for multi)."""
    if MULTI:
        m_i = tl.full([BLOCK_M, BLOCK_DV], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    return m_i, l_i


@triton.jit
def _online_softmax(m_i, l_i, acc, s, v, MULTI: tl.constexpr, DOT: tl.constexpr):
    """Fold one key tile of base-2 scores ``s`` (``-inf`` where not allowed) into the
    running maximum, normaliser and unnormalised context ``acc [BLOCK_M, BLOCK_DV]``,
    which is rescaled by ``2^(m_old - m_new)``; ``v`` is the tile's values."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - tl.expand_dims(m_use, 1))
    l_i = l_i * alpha + tl.sum(p, 1)
    if MULTI:
        acc = acc * alpha + tl.sum(p * v[None, :, :], 1)
    else:
        acc = acc * alpha[:, None] + _dot(p, v, DOT)
    return m_new, l_i, acc


@triton.jit
def _softmax_finish(m_i, l_i, acc, MULTI: tl.constexpr):
    """The context ``acc / l_i`` and the base-2 log-sum-exp ``m_i + log2(l_i)``; a row
    (feature) without any allowed key gets a zero context and ``+inf``."""
    has = l_i > 0.0
    den = tl.where(has, l_i, 1.0)
    if MULTI:
        out = acc / den
    else:
        out = acc / den[:, None]
    lse = tl.where(has, m_i + tl.log2(den), float("inf"))
    return out, lse


# ------------------------------------------------------------------------ gradients


@triton.jit
def _score_grad(p, v, g, c, MULTI: tl.constexpr, DOT: tl.constexpr):
    """Gradient of the loss with respect to the scores of one tile, from the weights
    ``p``: additive ``p (dO v^T - delta)`` (``c`` is ``delta``), multi
    ``p dO (v - c)`` per feature (``c`` the context)."""
    if MULTI:
        ds = p * g[:, None, :] * (v[None, :, :] - c[:, None, :])
    else:
        ds = p * (_dot(g, tl.trans(v), DOT) - c[:, None])
    return ds


@triton.jit
def _value_grad(dv, p, g, MULTI: tl.constexpr, DOT: tl.constexpr):
    """``dv += p^T dO`` (additive) or ``sum_i p dO`` per feature (multi)."""
    if MULTI:
        dv += tl.sum(p * g[:, None, :], 0)
    else:
        dv += _dot(tl.trans(p), g, DOT)
    return dv


@triton.jit
def _hidden_grad(ds, h, wt, ACT: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Multi: the score gradient as ``[M * N, DV]`` and the gradient of the
    pre-activation ``(de @ W_d^T) act'(h)`` as ``[M, N, D]``."""
    de = tl.reshape(ds, [BLOCK_M * BLOCK_N, BLOCK_DV])
    dx = _dot(de, wt, DOT) * _act_grad(h, ACT)
    return de, tl.reshape(dx, [BLOCK_M, BLOCK_N, BLOCK_D])


@triton.jit
def _act_grads(
    acc, dw, ds, h, q, k, w, wt, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
    AXIS: tl.constexpr, MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr,
    DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Reduce the score gradient ``ds`` of one tile through the activation: ``AXIS=1``
    sums over the keys into ``acc = dq1 [BLOCK_M, BLOCK_D]``; ``AXIS=0`` sums over the
    queries into ``acc = dk2 [BLOCK_N, BLOCK_D]`` and adds the score weights' gradient to
    ``dw`` (which ``AXIS=1`` passes through untouched).

    Multi: ``(de @ W_d^T) act'(h)`` summed, and ``dW_d += h^T de``. Additive, a second
    pass over the hidden units (the score gradient is only known once they are all
    summed): ``acc[:, d] += w[d] sum ds act'(q1 + k2)`` and ``dw[d] += sum_ij ds act``.
    """
    if MULTI:
        de, dx = _hidden_grad(ds, h, wt, ACT, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        if AXIS == 0:
            dw += _dot(tl.trans(h), de, DOT)
        acc += tl.sum(dx, AXIS)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        for d in range(0, D):
            t, wd = _unit(q, k, w, d, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, ACT, FAST)
            col = tl.sum(ds * _act_grad(t, ACT), AXIS) * wd
            acc += tl.where(offs_d[None, :] == d, col[:, None], 0.0)
            if AXIS == 0:
                dw += tl.where(offs_d == d, tl.sum(tl.sum(ds * t, 1), 0), 0.0)
    return acc, dw


@triton.jit
def _act_grads_both(
    dk, dw, ds, h, q, k, w, wt, DQ, b, sdb, sdm, sdd, offs_m, offs_n, n_q, n_k,
    sqm, sqd, skn, skd, D,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, DOT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """:func:`_act_grads` over both axes at once (the fused backward): ``dk2`` summed over
    the queries and ``dw`` as with ``AXIS=0``, and the tile's share of ``dq1`` summed over
    the keys, added to ``DQ`` (float32, zeroed by the caller) with atomics -- each
    activation is evaluated once here instead of once in each of two kernels."""
    rows = offs_m < n_q
    if MULTI:
        de, dx = _hidden_grad(ds, h, wt, ACT, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
        dw += _dot(tl.trans(h), de, DOT)
        dk += tl.sum(dx, 0)
        offs_d = tl.arange(0, BLOCK_D)
        ptr = DQ + b * sdb + offs_m[:, None] * sdm + offs_d[None, :] * sdd
        tl.atomic_add(ptr, tl.sum(dx, 1), mask=rows[:, None] & (offs_d[None, :] < D))
    else:
        offs_d = tl.arange(0, BLOCK_D)
        for d in range(0, D):
            t, wd = _unit(q, k, w, d, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, ACT, FAST)
            ga = ds * _act_grad(t, ACT)
            dk += tl.where(offs_d[None, :] == d, (tl.sum(ga, 0) * wd)[:, None], 0.0)
            dw += tl.where(offs_d == d, tl.sum(tl.sum(ds * t, 1), 0), 0.0)
            tl.atomic_add(DQ + b * sdb + offs_m * sdm + d * sdd, tl.sum(ga, 1) * wd, mask=rows)
    return dk, dw


@triton.jit
def _weight_share_start(MULTI: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """A zero share of the score weights' gradient: ``[BLOCK_D]`` (additive) or
    ``[BLOCK_D, BLOCK_DV]`` (multi)."""
    if MULTI:
        dw = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    else:
        dw = tl.zeros([BLOCK_D], dtype=tl.float32)
    return dw


@triton.jit
def _store_weight_share(DW, dw, share, MULTI: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Store a share as row ``share`` of ``DW [programs, BLOCK_D]`` (additive) or
    ``[programs, BLOCK_D, BLOCK_DV]`` (multi)."""
    offs_d = tl.arange(0, BLOCK_D)
    if MULTI:
        offs_dv = tl.arange(0, BLOCK_DV)
        base = share * BLOCK_D * BLOCK_DV
        tl.store(DW + base + offs_d[:, None] * BLOCK_DV + offs_dv[None, :], dw)
    else:
        tl.store(DW + share * BLOCK_D + offs_d, dw)


# -------------------------------------------------------------------------- kernels


@triton.jit
def attend_fwd(
    Q, K, W, V, M, O, L,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, smb, smi, smj, sob, som, sod,
    n_q, n_k, D, DV, causal_offset,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Context ``O [B, n_q, DV]`` and base-2 log-sum-exp ``L`` of one query tile: online
    softmax over the key tiles (running max ``m_i`` and normaliser ``l_i``)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _operand(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D, MULTI)
    w = _weight_operand(W, D, DV, BLOCK_D, BLOCK_DV, MULTI)
    m_i, l_i = _softmax_start(BLOCK_M, BLOCK_DV, MULTI)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n, k, v = _key_tile(
            K, V, b, start_n, n_k, skb, skn, skd, svb, svn, svd, D, DV,
            BLOCK_N, BLOCK_D, BLOCK_DV, MULTI,
        )  # fmt: skip
        s, _ = _scores(
            q, k, w, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
            MULTI, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
        ok = _allowed(
            M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL
        )
        s = tl.where(_per_score(ok, MULTI), s, float("-inf"))
        m_i, l_i, acc = _online_softmax(m_i, l_i, acc, s, v, MULTI, DOT)
    out, lse = _softmax_finish(m_i, l_i, acc, MULTI)
    lse_ptr, lse_ok = _lse_at(L, b, offs_m, n_q, DV, BLOCK_DV, MULTI)
    tl.store(lse_ptr, lse, mask=lse_ok)
    _store_tile(O, out, b, offs_m, n_q, sob, som, sod, DV, BLOCK_DV)


@triton.jit
def attend_bwd_q(
    Q, K, W, WT, V, M, L, DO, AUX, DQ,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, smb, smi, smj,
    sgb, sgm, sgd, scb, scm, scd, sdb, sdm, sdd,
    n_q, n_k, D, DV, causal_offset,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """``dq1`` of one query tile: for every key tile, recompute the scores and the weights
    ``p = 2^(s2 - lse)``, form the score gradient and reduce it through the activation
    (kept in registers)."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_m = pid * BLOCK_M
    offs_m, q, g, c, lse = _query_grad_tile(
        Q, DO, AUX, L, b, start_m, n_q, sqb, sqm, sqd, sgb, sgm, sgd, scb, scm, scd, D, DV,
        BLOCK_M, BLOCK_D, BLOCK_DV, MULTI,
    )  # fmt: skip
    w = _weight_operand(W, D, DV, BLOCK_D, BLOCK_DV, MULTI)
    wt = _weight_operand(WT, DV, D, BLOCK_DV, BLOCK_D, MULTI)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = _causal_hi(start_m, n_k, causal_offset, BLOCK_M, CAUSAL)
    for start_n in range(0, hi, BLOCK_N):
        offs_n, k, v = _key_tile(
            K, V, b, start_n, n_k, skb, skn, skd, svb, svn, svd, D, DV,
            BLOCK_N, BLOCK_D, BLOCK_DV, MULTI,
        )  # fmt: skip
        p, h = _recompute(
            q, k, w, lse, M, b, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, smb, smi, smj, D,
            causal_offset, MULTI, ACT, FAST, HAS_MASK, CAUSAL, DOT,
            BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
        ds = _score_grad(p, v, g, c, MULTI, DOT)
        dq, _ = _act_grads(
            dq, dq, ds, h, q, k, w, wt, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
            1, MULTI, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
    _store_tile(DQ, dq, b, offs_m, n_q, sdb, sdm, sdd, D, BLOCK_D)


@triton.jit
def attend_bwd_kv(
    Q, K, W, WT, V, M, L, DO, AUX, DK, DV_, DW, DQ,
    sqb, sqm, sqd, skb, skn, skd, svb, svn, svd, smb, smi, smj,
    sgb, sgm, sgd, scb, scm, scd, skgb, skgn, skgd, svgb, svgn, svgd,
    n_q, n_k, D, DV, causal_offset,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, FUSED_DQ: tl.constexpr,
):  # fmt: skip
    """``dk2``, ``dv`` of one key tile and this program's share of the score weights'
    gradient (row ``b * num_key_tiles + pid`` of ``DW``, summed by the caller): for every
    query tile, recompute ``p`` and the score gradient as in :func:`attend_bwd_q`, add
    the value gradient, then reduce through the activation.

    ``FUSED_DQ`` (the fused backward): also add each tile's share of ``dq1`` to ``DQ``
    (float32 ``[B, n_q, D]``, contiguous, zeroed by the caller) with atomics, so that
    :func:`attend_bwd_q` -- which evaluates every activation again -- is not launched.
    Without it ``DQ`` is not read."""
    pid = tl.program_id(0)
    b = tl.program_id(1)
    start_n = pid * BLOCK_N
    offs_n, k, v = _key_tile(
        K, V, b, start_n, n_k, skb, skn, skd, svb, svn, svd, D, DV,
        BLOCK_N, BLOCK_D, BLOCK_DV, MULTI,
    )  # fmt: skip
    w = _weight_operand(W, D, DV, BLOCK_D, BLOCK_DV, MULTI)
    wt = _weight_operand(WT, DV, D, BLOCK_DV, BLOCK_D, MULTI)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    dw = _weight_share_start(MULTI, BLOCK_D, BLOCK_DV)
    lo = _causal_lo(start_n, causal_offset, BLOCK_M, CAUSAL)
    for start_m in range(lo, n_q, BLOCK_M):
        offs_m, q, g, c, lse = _query_grad_tile(
            Q, DO, AUX, L, b, start_m, n_q, sqb, sqm, sqd, sgb, sgm, sgd, scb, scm, scd, D, DV,
            BLOCK_M, BLOCK_D, BLOCK_DV, MULTI,
        )  # fmt: skip
        p, h = _recompute(
            q, k, w, lse, M, b, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, smb, smi, smj, D,
            causal_offset, MULTI, ACT, FAST, HAS_MASK, CAUSAL, DOT,
            BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
        )  # fmt: skip
        dv = _value_grad(dv, p, g, MULTI, DOT)
        ds = _score_grad(p, v, g, c, MULTI, DOT)
        if FUSED_DQ:
            dk, dw = _act_grads_both(
                dk, dw, ds, h, q, k, w, wt, DQ, b, n_q * D, D, 1, offs_m, offs_n, n_q, n_k,
                sqm, sqd, skn, skd, D, MULTI, ACT, FAST, DOT,
                BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
            )  # fmt: skip
        else:
            dk, dw = _act_grads(
                dk, dw, ds, h, q, k, w, wt, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
                0, MULTI, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
            )  # fmt: skip
    _store_tile(DK, dk, b, offs_n, n_k, skgb, skgn, skgd, D, BLOCK_D)
    _store_tile(DV_, dv, b, offs_n, n_k, svgb, svgn, svgd, DV, BLOCK_DV)
    _store_weight_share(DW, dw, b * tl.num_programs(0) + pid, MULTI, BLOCK_D, BLOCK_DV)


@triton.jit
def attend_weights(
    Q, K, W, M, L, A,
    sqb, sqm, sqd, skb, skn, skd, smb, smi, smj, sab, sam, san, saf,
    n_q, n_k, D, DV, causal_offset,
    MULTI: tl.constexpr, ACT: tl.constexpr, FAST: tl.constexpr, HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr, DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    """Second pass for ``need_weights``: ``A[b, i, j] = 2^(s2 - lse)`` (``A [B, n_q, n_k]``;
    multi ``A [B, n_q, n_k, DV]``, feature stride ``saf``) of one (query tile, key tile)
    -- grid ``(query tiles, B, key tiles)``."""
    b = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    q = _operand(Q, b, offs_m, n_q, sqb, sqm, sqd, D, BLOCK_D, MULTI)
    k = _operand(K, b, offs_n, n_k, skb, skn, skd, D, BLOCK_D, MULTI)
    w = _weight_operand(W, D, DV, BLOCK_D, BLOCK_DV, MULTI)
    s, _ = _scores(
        q, k, w, offs_m, offs_n, n_q, n_k, sqm, sqd, skn, skd, D,
        MULTI, ACT, FAST, DOT, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
    )  # fmt: skip
    ok = _allowed(M, b, offs_m, offs_n, n_q, n_k, smb, smi, smj, causal_offset, HAS_MASK, CAUSAL)
    lse = _load_lse(L, b, offs_m, n_q, DV, BLOCK_DV, MULTI)
    p = tl.where(_per_score(ok, MULTI), tl.exp2(s - tl.expand_dims(lse, 1)), 0.0)
    ptr = A + b.to(tl.int64) * sab + offs_m.to(tl.int64)[:, None] * sam + offs_n[None, :] * san
    keep = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
    if MULTI:
        offs_dv = tl.arange(0, BLOCK_DV)
        ptr = ptr[:, :, None] + offs_dv[None, None, :] * saf
        keep = keep[:, :, None] & (offs_dv < DV)[None, None, :]
    tl.store(ptr, p.to(A.dtype.element_ty), mask=keep)
