"""FlashAttention-style Triton kernels for additive and multi-dimensional soft attention.

:func:`flash_additive_attention` computes the whole soft attention of the additive
(Bahdanau) score,

    s[b, i, j] = w . act(q1[b, i] + k2[b, j])      a = softmax_j(s)      c = a @ v,

and :func:`flash_multi_dim_attention` the multi-dimensional (DiSAN) one, with one score and
one softmax per feature ``f``,

    e[b, i, j, f] = act(q1[b, i] + k2[b, j]) @ W_d[:, f] (+ b_d[f])
    c[b, i, f]   = sum_j softmax_j(e[b, i, :, f])[j] v[b, j, f],

where ``q1 = W1 q + b`` and ``k2 = W2 k`` come from two matrix products outside the kernel
(autograd differentiates them). Nothing of size ``n_q x n_k`` is written to memory: a
program owns a tile of query rows, walks over the tiles of keys with an online softmax
(running maximum and normaliser), and keeps only the context and the log-sum-exp of each
row (of each (row, feature) in the multi-dimensional case) for the backward pass. The
backward pass recomputes the score tiles: one kernel over query tiles reduces ``dq1``, one
over key tiles reduces ``dk2``, ``dv`` and a per-program share of ``dw`` (``dW_d``) that
is summed afterwards -- no atomics, deterministic results. See ``docs/kernels.md`` for the
design and the cost model.

Requirements: ``pip install 'attnlab[triton]'``. The kernels run on CUDA tensors, or on CPU
tensors under Triton's interpreter (``TRITON_INTERPRET=1``, which Triton reads when the
kernels are first built: set it before the first call; the tests do). ``import attnlab``
never imports Triton; this module imports it on the first kernel call.

Inputs may be float32, bfloat16 or float16; scores, softmax and all reductions are float32.
Activations: ``tanh``, ``sigmoid``, ``relu``, ``identity``. Masks: bool, ``True`` = may
attend, broadcastable to ``[B, n_q, n_k]`` (key padding ``[B, 1, n_k]``, causal, ...), and
``causal=True`` additionally skips the key tiles above the diagonal. A query row without
any allowed key gets zero weights, a zero context and zero (finite) gradients; keys and
values that no query may attend, and rows that may attend nothing, never matter, whatever
they hold.

The kernels' backward pass runs without a graph; under ``create_graph=True`` (second
derivatives) it differentiates the formula the kernels compute instead, as plain tensor
ops, with their ``[B, n_q, n_k, d_w]`` memory.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypedDict, Unpack

import torch
from torch import Tensor

from attnlab import masks as _masks
from attnlab.general.alignment import masked_softmax
from attnlab.general.fused import (
    _additive_traceable,
    _check_qk,
    _check_tensor,
    _differentiable_again,
    _graph_grads,
    _multi_dim_traceable,
    _resolve_act,
    _shape_error,
    _zero_bias_grad,
)
from attnlab.general.padding import clear_attention_inputs

__all__ = [
    "TRITON_ACTIVATIONS",
    "TRITON_INSTALL",
    "FlashOptions",
    "flash_additive_attention",
    "flash_multi_dim_attention",
    "triton_act_name",
    "triton_available",
    "triton_interpreting",
    "triton_unavailable_reason",
]

#: How to install the optional dependency.
TRITON_INSTALL = "pip install 'attnlab[triton]'"
#: The activations the kernels implement.
TRITON_ACTIVATIONS: frozenset[str] = frozenset({"tanh", "sigmoid", "relu", "identity"})
#: The input dtypes the kernels take (all of them compute in float32).
TRITON_DTYPES: frozenset[torch.dtype] = frozenset({torch.float32, torch.bfloat16, torch.float16})

_LOG2E = 1.0 / math.log(2.0)


# ------------------------------------------------------------------ availability


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_unavailable_reason(device: torch.device | str | None) -> str | None:
    """``None`` when the kernels can run on tensors on ``device``, else why not (one
    sentence, with the fix)."""
    if not triton_available():
        return f"the Triton kernels need the triton package ({TRITON_INSTALL})"
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type not in ("cuda", "cpu"):
        return (
            f"the Triton kernels run on CUDA (or CPU under TRITON_INTERPRET=1), not on {dev.type}"
        )
    if dev.type == "cpu" and not triton_interpreting():
        return (
            "the Triton kernels run on CUDA tensors, or on CPU tensors only under Triton's "
            "interpreter (set TRITON_INTERPRET=1 before triton is first imported)"
        )
    return _interpreter_mismatch()


def _interpreter_mismatch() -> str | None:
    """Triton decides between compiling and interpreting when each ``@triton.jit``
    function is defined -- its own standard library at ``import triton`` -- so
    ``TRITON_INTERPRET`` must already hold its final value when triton is first imported."""
    if "triton" not in sys.modules:
        return None
    try:
        import triton.language.standard as std
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - another Triton layout: trust the variable
        return None
    stdlib = isinstance(getattr(std, "zeros", None), InterpretedFunction)
    wanted = _KERNELS.INTERPRETED if _KERNELS is not None else triton_interpreting()
    if stdlib == wanted:
        return None
    if wanted:
        return (
            "triton was imported before TRITON_INTERPRET=1 was set, so its interpreter "
            "cannot run; set TRITON_INTERPRET=1 before anything imports triton"
        )
    return (
        "triton was imported with TRITON_INTERPRET=1, so it can only interpret; unset it "
        "before triton is first imported to compile for the GPU"
    )


def triton_act_name(act: str | Callable[[Tensor], Tensor]) -> str | None:
    """The kernel activation ``act`` stands for (``tanh``, ``sigmoid``, ``relu``,
    ``identity``; also given as ``torch.tanh``, ``nn.Tanh()``, ...), or ``None`` when the
    kernels do not implement it."""
    name = _resolve_act(act).name
    return name if name in TRITON_ACTIVATIONS else None


_KERNELS: ModuleType | None = None


def _kernels(device: torch.device, name: str = "attnlab._flash_kernels") -> ModuleType:
    """The kernel module ``name`` (imported on first use; :mod:`attnlab._flash_kernels`
    or :mod:`attnlab._local_kernels`), after checking that it can run on ``device``; every
    failure is one line naming the fix."""
    global _KERNELS
    reason = triton_unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(reason)
    if _KERNELS is None:
        from attnlab import _flash_kernels

        _KERNELS = _flash_kernels
    if device.type == "cpu" and not _KERNELS.INTERPRETED:
        raise RuntimeError(
            "the Triton kernels were built for the GPU (TRITON_INTERPRET was unset when they "
            "were first used), so they cannot take CPU tensors; set TRITON_INTERPRET=1 "
            "before the first kernel call in the process"
        )
    return _KERNELS if name == _KERNELS.__name__ else importlib.import_module(name)


# ------------------------------------------------------------------ launch plan


def _pow2(n: int, least: int) -> int:
    return max(least, 1 << max(0, n - 1).bit_length())


def _check_block(value: int | None, name: str, least: int) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < least
        or value & (value - 1)
    ):
        raise ValueError(f"{name} must be a power of two >= {least} or None, got {value!r}")
    return value


@dataclass
class _Plan:
    """Everything a launch needs besides the tensors (shared by forward, backward and the
    weights pass)."""

    multi: bool  # the multi-dimensional (DiSAN) score, else the additive one
    act: int
    fast: bool
    mask: Tensor  # uint8 view, [B, n_q, n_k] strides (0 where broadcast); dummy if none
    mask_strides: tuple[int, int, int]
    has_mask: bool
    causal: bool
    causal_offset: int
    dot: int  # DOT mode of the products with v / dO (additive) or with W_d (multi)
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    fused_dq: bool = False  # one backward kernel (dq1 by atomics), see FlashOptions

    def consts(self) -> dict[str, Any]:
        """The kernels' compile-time arguments and launch options."""
        return {
            "MULTI": self.multi,
            "ACT": self.act,
            "FAST": self.fast,
            "HAS_MASK": self.has_mask,
            "CAUSAL": self.causal,
            "DOT": self.dot,
            "BLOCK_M": self.block_m,
            "BLOCK_N": self.block_n,
            "BLOCK_D": self.block_d,
            "BLOCK_DV": self.block_dv,
            "num_warps": self.num_warps,
        }

    def per_row(self, d_v: int) -> tuple[int, ...]:
        """Trailing shape of what a query row keeps (log-sum-exp) or gets per key
        (weights): nothing (additive), or one per feature (multi)."""
        return (d_v,) if self.multi else ()


def _fast_tanh(fast_tanh: bool | None, on_gpu: bool, half: bool, act: str) -> bool:
    if fast_tanh is None:
        return on_gpu and half and act in ("tanh", "sigmoid")
    if fast_tanh and not on_gpu:
        raise ValueError(
            "fast_tanh=True uses the PTX instruction tanh.approx.f32, which needs a CUDA "
            "GPU (not Triton's interpreter); pass fast_tanh=None or False"
        )
    return fast_tanh


def _dot_mode(multi: bool, on_gpu: bool, half: bool, allow_tf32: bool, width: int) -> int:
    """The kernels' ``DOT`` mode: half inputs multiply ``p @ v`` on tensor cores (emulated
    in float32 by the interpreter) and the multi-dimensional ``h @ W_d`` in TF32; float32
    uses TF32 only when allowed, on a GPU, and for tiles up to :data:`TF32_MAX_WIDTH`
    (``width``: the widest tile)."""
    if half and multi:
        return 1 if on_gpu else 0
    if half:
        return 2 if on_gpu else 3
    return 1 if allow_tf32 and on_gpu and width <= TF32_MAX_WIDTH else 0


#: The widest ``max(d_w, d_v)`` (rounded up to a power of two) the kernels take on a GPU,
#: per score (``multi``): wider tiles need more shared memory than a block of an H100 has
#: (``W_d`` alone is ``d_w x d_v`` floats in the multi-dimensional kernels).
TRITON_MAX_WIDTH = {False: 1024, True: 128}


def triton_fits(multi: bool, d_w: int, d_v: int) -> bool:
    """Whether the GPU kernels take these sizes (see :data:`TRITON_MAX_WIDTH`)."""
    return max(_pow2(d_w, 16), _pow2(d_v, 16)) <= TRITON_MAX_WIDTH[multi]


#: GPU tiles ``(BLOCK_M, BLOCK_N)`` of the additive kernels by the widest tile they serve
#: (``max(d_w, d_v)`` rounded up to a power of two): ``(exact float32 products, tensor-core
#: products)``.
_ADDITIVE_GPU_TILES = (
    (128, ((32, 32), (64, 32))),
    (256, ((16, 32), (64, 32))),
    (1024, ((16, 16), (16, 32))),
)
#: The widest tile whose float32 products may use TF32: wider TF32 tiles spill registers or
#: outgrow the shared memory, where exact float32 products do not.
TF32_MAX_WIDTH = 512


def _tiles(
    multi: bool,
    on_gpu: bool,
    dot: int,
    bd: int,
    bdv: int,
    block_m: int | None,
    block_n: int | None,
) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps)``: the given tiles, else the defaults by device.

    The GPU defaults were picked with ``benchmarks/sm90_kernels.py`` (compiled for sm_90;
    on an H100 they were faster than the alternatives timed, docs/kernels.md): the largest tiles whose four kernels fit the 255 registers
    of a thread (no spills, or a few bytes; the widest half-precision tiles spill up to
    2 KiB) and an H100 block's shared memory, for d = 32 .. 1024, 8 warps. Additive: see
    :data:`_ADDITIVE_GPU_TILES`; multi-dimensional: ``16 x 2`` (``16 x 1`` past 64).
    """
    if not on_gpu:
        return block_m or 16, block_n or 16, 4
    width = max(bd, bdv)
    if multi:
        return block_m or 16, block_n or (2 if width <= 64 else 1), 8
    widest = _ADDITIVE_GPU_TILES[-1][1]  # unused on a GPU: _plan refuses wider calls first
    tiles = next((t for w, t in _ADDITIVE_GPU_TILES if width <= w), widest)
    bm, bn = tiles[0 if dot == 0 else 1]
    return block_m or bm, block_n or bn, 8


def _plan(
    K: ModuleType,
    multi: bool,
    q1: Tensor,
    mask: Tensor | None,
    act: str,
    sizes: tuple[int, int, int],
    causal: bool,
    fast_tanh: bool | None,
    allow_tf32: bool,
    block_m: int | None,
    block_n: int | None,
    *,
    on_gpu: bool | None = None,
    fused_backward: bool = False,
) -> _Plan:
    """The launch plan; ``sizes`` is ``(d_w, d_v, n_k)``. ``on_gpu`` (default: whether
    ``q1`` is on CUDA with compiled kernels) picks the GPU tiles and modes; the sm_90
    compile check (``benchmarks/sm90_kernels.py``) plans GPU launches on CPU tensors."""
    d_w, d_v, n_k = sizes
    B, n_q = q1.shape[0], q1.shape[1]
    if on_gpu is None:
        on_gpu = q1.device.type == "cuda" and not K.INTERPRETED
    half = q1.dtype in (torch.bfloat16, torch.float16)
    fast = _fast_tanh(fast_tanh, on_gpu, half, act)
    if on_gpu and not triton_fits(multi, d_w, d_v):
        public = "flash_multi_dim_attention" if multi else "flash_additive_attention"
        raise ValueError(
            f"{public}: max(d_w, d_v) = {max(d_w, d_v)} is wider than the GPU kernels take "
            f"({TRITON_MAX_WIDTH[multi]}: the tiles would need more shared memory than a "
            "block has); use the chunked kernels (Attention(path='auto') picks them)"
        )
    bd, bdv = _pow2(d_w, 16), _pow2(d_v, 16)
    dot = _dot_mode(multi, on_gpu, half, allow_tf32, max(bd, bdv))
    bm, bn, warps = _tiles(multi, on_gpu, dot, bd, bdv, block_m, block_n)
    if mask is None:  # never read (HAS_MASK is off): allocated, not filled (no launch)
        m8 = torch.empty(1, dtype=torch.uint8, device=q1.device)
        strides: tuple[int, int, int] = (0, 0, 0)
    else:
        m8 = mask.expand(B, n_q, n_k).view(torch.uint8)
        strides = (m8.stride(0), m8.stride(1), m8.stride(2))
    return _Plan(
        multi=multi,
        act=K.ACT_CODES[act],
        fast=fast,
        mask=m8,
        mask_strides=strides,
        has_mask=mask is not None,
        causal=causal,
        causal_offset=n_k - n_q,
        dot=dot,
        block_m=bm,
        block_n=bn,
        block_d=bd,
        block_dv=bdv,
        num_warps=warps,
        fused_dq=fused_backward,
    )


def _columns(x: Tensor) -> Tensor:
    """``x [B, n, d]`` as float32 with each column (hidden unit) contiguous: the additive
    kernels load one column of ``q1`` and one of ``k2`` per hidden unit."""
    return x.to(torch.float32).transpose(1, 2).contiguous().transpose(1, 2)


def _rows(x: Tensor) -> Tensor:
    return x.to(torch.float32).contiguous()


def _s(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_common(
    q1: object, k2: object, v: object, mask: Tensor | None, causal: bool, act: object
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, str]:
    q1, k2 = _check_qk(q1, k2)
    if q1.dtype not in TRITON_DTYPES:
        raise TypeError(
            f"q1 has dtype {q1.dtype}; the Triton kernels take float32, bfloat16 or float16 "
            "(use attnlab.general.fused for float64)"
        )
    v = _check_tensor(v, "v", q1)
    B, n_q, _ = q1.shape
    n_k = k2.shape[1]
    if v.dim() != 3 or v.shape[0] != B or v.shape[1] != n_k:
        raise _shape_error("v", v, "[B, n_k, d_v]", [B, n_k, None])
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    name = triton_act_name(act)  # type: ignore[arg-type]
    if name is None:
        raise ValueError(
            f"act {act!r} is not implemented by the Triton kernels (they take "
            f"{sorted(TRITON_ACTIVATIONS)}); use attnlab.general.fused for other activations"
        )
    mask3 = _masks.normalize_mask(mask, B, n_q, n_k, device=q1.device, name="mask")
    # padding never matters: keys and values no query may attend, and rows that may
    # attend nothing, are cleared (a zero weight times NaN would still be NaN)
    q1c, k2, v = clear_attention_inputs(q1, k2, v, mask3)
    assert q1c is not None
    if causal and n_k < n_q:  # the first n_q - n_k rows may attend nothing
        rows = torch.arange(n_q, device=q1.device) >= n_q - n_k
        q1c = torch.where(rows[None, :, None], q1c, q1c.new_zeros(()))
    return q1c, k2, v, mask3, name


# ------------------------------------------------------------------ the launches


def _operands(q1: Tensor, k2: Tensor, w: Tensor, p: _Plan) -> tuple[Tensor, Tensor, Tensor]:
    """The kernels' copies of ``q1``, ``k2`` and the score weights: additive ``q1``, ``k2``
    column-major and ``w`` in float32; multi ``q1``, ``k2`` row-major and
    ``W_d * log2(e)`` (the kernels keep scores in base 2)."""
    if p.multi:
        return _rows(q1), _rows(k2), (w.to(torch.float32) * _LOG2E).contiguous()
    return _columns(q1), _columns(k2), w.to(torch.float32).contiguous()


def _forward(
    K: ModuleType, q1: Tensor, k2: Tensor, w: Tensor, v: Tensor, p: _Plan
) -> tuple[Tensor, Tensor]:
    """Context ``[B, n_q, d_v]`` and base-2 log-sum-exp (``[B, n_q]``, multi
    ``[B, n_q, d_v]``)."""
    B, n_q, d_w = q1.shape
    n_k, d_v = v.shape[1], v.shape[2]
    out = torch.empty(B, n_q, d_v, dtype=v.dtype, device=v.device)
    lse = torch.empty(B, n_q, *p.per_row(d_v), dtype=torch.float32, device=v.device)
    if B * n_q == 0:
        return out, lse
    qx, kx, wx = _operands(q1, k2, w, p)
    K.attend_fwd[(_cdiv(n_q, p.block_m), B)](
        qx, kx, wx, v, p.mask, out, lse,
        *_s(qx), *_s(kx), *_s(v), *p.mask_strides, *_s(out),
        n_q, n_k, d_w, d_v, p.causal_offset, **p.consts(),
    )  # fmt: skip
    return out, lse


def _backward(
    K: ModuleType,
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    p: _Plan,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq1, dk2, dw, dv)`` in float32: one launch over query tiles, one over key tiles
    (which writes per-program shares of ``dw`` / ``dW_d``, summed here)."""
    B, n_q, d_w = q1.shape
    n_k, d_v = v.shape[1], v.shape[2]
    f32 = torch.float32
    dq = torch.zeros(B, n_q, d_w, dtype=f32, device=v.device)
    dk = torch.zeros(B, n_k, d_w, dtype=f32, device=v.device)
    dv = torch.zeros(B, n_k, d_v, dtype=f32, device=v.device)
    dw = torch.zeros(w.shape, dtype=f32, device=v.device)
    if B * n_q * n_k == 0:
        return dq, dk, dw, dv
    qx, kx, wx = _operands(q1, k2, w, p)
    if p.multi:  # W_d^T, and the context for de = a dO (v - c)
        wt, g, aux = w.to(f32).t().contiguous(), grad.contiguous(), out.contiguous()
    else:  # delta_i = sum_j p_ij dp_ij = dO_i . O_i, [B, n_q, 1]
        wt, g = wx, grad.to(v.dtype).contiguous()
        aux = (g.to(f32) * out.to(f32)).sum(-1, keepdim=True)
    common = (*_s(qx), *_s(kx), *_s(v), *p.mask_strides, *_s(g), *_s(aux))
    tail = (n_q, n_k, d_w, d_v, p.causal_offset)
    if not p.fused_dq:
        K.attend_bwd_q[(_cdiv(n_q, p.block_m), B)](
            qx, kx, wx, wt, v, p.mask, lse, g, aux, dq, *common, *_s(dq), *tail, **p.consts()
        )
    tiles = _cdiv(n_k, p.block_n)
    shares = torch.empty(B * tiles, p.block_d, *p.per_row(p.block_dv), dtype=f32, device=v.device)
    K.attend_bwd_kv[(tiles, B)](
        qx, kx, wx, wt, v, p.mask, lse, g, aux, dk, dv, shares, dq,
        *common, *_s(dk), *_s(dv), *tail, **p.consts(), FUSED_DQ=p.fused_dq,
    )  # fmt: skip
    dw = shares.sum(0)[tuple(slice(0, n) for n in w.shape)]
    return dq, dk, dw, dv


def _weights(
    K: ModuleType, q1: Tensor, k2: Tensor, w: Tensor, lse: Tensor, dtype: torch.dtype, p: _Plan
) -> Tensor:
    """The weights ``[B, n_q, n_k]`` (multi ``[B, n_q, n_k, d_v]``) from the saved
    log-sum-exp: a second pass, no gradient."""
    B, n_q, d_w = q1.shape
    n_k, d_v = k2.shape[1], w.shape[-1]
    a = torch.zeros(B, n_q, n_k, *p.per_row(d_v), dtype=dtype, device=q1.device)
    if a.numel() == 0:
        return a
    qx, kx, wx = _operands(q1, k2, w, p)
    strides = a.stride() if p.multi else (*a.stride(), 0)
    grid = (_cdiv(n_q, p.block_m), B, _cdiv(n_k, p.block_n))
    K.attend_weights[grid](
        qx, kx, wx, p.mask, lse, a,
        *_s(qx), *_s(kx), *p.mask_strides, *strides,
        n_q, n_k, d_w, d_v, p.causal_offset, **p.consts(),
    )  # fmt: skip
    return a


# The launches as PyTorch custom operators: opaque to torch.compile (dynamo never traces
# the launch code, inductor calls them as they are). Eager calls run the same impls in a
# plain autograd.Function (``_autograd_op``): the operators' dispatch was host time a step
# does not need. Each op re-derives the launch plan from its arguments (deterministically),
# so the forward, backward and weights ops agree. ``b_d`` (multi only, else None) takes part only
# to receive its gradient, which is exactly zero: constant across keys, it cancels in the
# softmax.
_FLAGS = (
    "bool multi, str act, bool causal, bool? fast_tanh, bool allow_tf32, "
    "SymInt? block_m, SymInt? block_n, bool fused_backward"
)


def _op_plan(
    q1: Tensor, mask: Tensor | None, sizes: tuple[int, int, int], flags: tuple[Any, ...]
) -> tuple[ModuleType, _Plan]:
    """The kernels and the launch plan of an op call (``sizes``: ``(d_w, d_v, n_k)``)."""
    multi, act, causal, fast_tanh, allow_tf32, block_m, block_n, fused = flags
    K = _kernels(q1.device)
    return K, _plan(
        K, multi, q1, mask, act, sizes, causal, fast_tanh, allow_tf32, block_m, block_n,
        fused_backward=fused,
    )  # fmt: skip


def _attend_impl(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    b_d: Tensor | None,
    v: Tensor,
    mask: Tensor | None,
    *flags: Any,
) -> tuple[Tensor, Tensor]:
    K, p = _op_plan(q1, mask, (q1.shape[2], v.shape[2], k2.shape[1]), flags)
    return _forward(K, q1, k2, w, v, p)


def _attend_fake(q1: Tensor, k2: Tensor, w: Tensor, *rest: Any) -> tuple[Tensor, Tensor]:
    # rest: b_d, v, mask and the flags (multi first)
    v, multi = rest[1], rest[3]
    (B, n_q), d_v = q1.shape[:2], v.shape[2]
    lse_shape = (B, n_q, d_v) if multi else (B, n_q)
    return q1.new_empty(B, n_q, d_v, dtype=v.dtype), q1.new_empty(lse_shape, dtype=torch.float32)


def _attend_backward_impl(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    v: Tensor,
    mask: Tensor | None,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    *flags: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    K, p = _op_plan(q1, mask, (q1.shape[2], v.shape[2], k2.shape[1]), flags)
    dq, dk, dw, dv = _backward(K, q1, k2, w, v, out, lse, grad, p)
    return dq, dk, dw.contiguous(), dv


def _attend_backward_fake(
    q1: Tensor, k2: Tensor, w: Tensor, v: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(x.new_empty(x.shape, dtype=torch.float32) for x in (q1, k2, w, v))  # type: ignore[return-value]


def _weights_impl(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    lse: Tensor,
    mask: Tensor | None,
    dtype: torch.dtype,
    d_v: int,
    *flags: Any,
) -> Tensor:
    K, p = _op_plan(q1, mask, (q1.shape[2], d_v, k2.shape[1]), flags)
    return _weights(K, q1, k2, w, lse, dtype, p)


def _weights_fake(q1: Tensor, k2: Tensor, w: Tensor, *rest: Any) -> Tensor:
    # rest: lse, mask, dtype, d_v and the flags (multi first)
    dtype, multi = rest[2], rest[4]
    per_row = (w.shape[-1],) if multi else ()
    return q1.new_empty(q1.shape[0], q1.shape[1], k2.shape[1], *per_row, dtype=dtype)


def _custom_op(name: str, impl: Callable[..., Any], fake: Callable[..., Any], schema: str) -> Any:
    """``attnlab::name``, a functional custom operator with its fake (shape) function."""
    op = torch.library.custom_op(f"attnlab::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


def _eager_or_op(op: Any, impl: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``op`` while torch.compile traces (the operator stays in its graph as it is),
    else ``impl`` straight away: the same kernels without the custom operator's dispatch
    (for calls that record no gradient)."""

    def call(*inputs: Any) -> Any:
        return op(*inputs) if torch.compiler.is_compiling() else impl(*inputs)

    return call


def _autograd_op(
    op: Any,
    impl: Callable[..., Any],
    setup: Callable[[Any, tuple[Any, ...], Any], None],
    backward: Callable[[Callable[..., Any]], Callable[..., tuple[Any, ...]]],
    backward_op: Any,
    backward_impl: Callable[..., Any],
) -> Callable[..., Any]:
    """The differentiable front of the custom operator ``op``: its autograd formula is
    ``backward(backward_op)`` (``setup`` saves what it needs); the function returned calls
    ``op`` while torch.compile traces and, in eager mode, runs ``impl`` and
    ``backward(backward_impl)`` in a plain :class:`torch.autograd.Function`. Same kernels,
    same gradients; the custom operator's Python dispatch (argument defaults, alias
    checks, the autograd and backend layers) cost about 0.5 ms of host time per call on an
    H200's host (cProfile): for the two calls of a local-p step, about as much as the
    local kernels' GPU time (docs/benchmarks.md)."""
    op.register_autograd(backward(backward_op), setup_context=setup)
    eager_backward = backward(backward_impl)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> Any:
            output = impl(*inputs)
            setup(ctx, inputs, output)
            return output

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> Any:
            return eager_backward(ctx, *grads)

    def call(*inputs: Any) -> Any:
        return op(*inputs) if torch.compiler.is_compiling() else Eager.apply(*inputs)

    return call


_attend_op = _custom_op(
    "flash_attend",
    _attend_impl,
    _attend_fake,
    f"(Tensor q1, Tensor k2, Tensor w, Tensor? b_d, Tensor v, Tensor? mask, {_FLAGS})"
    " -> (Tensor, Tensor)",
)
_attend_backward_op = _custom_op(
    "flash_attend_backward",
    _attend_backward_impl,
    _attend_backward_fake,
    "(Tensor q1, Tensor k2, Tensor w, Tensor v, Tensor? mask, Tensor out, Tensor lse, "
    f"Tensor grad, {_FLAGS}) -> (Tensor, Tensor, Tensor, Tensor)",
)
_weights_op = _custom_op(
    "flash_attend_weights",
    _weights_impl,
    _weights_fake,
    "(Tensor q1, Tensor k2, Tensor w, Tensor lse, Tensor? mask, ScalarType dtype, "
    f"SymInt d_v, {_FLAGS}) -> Tensor",
)


def _attend_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q1, k2, w, b_d, v, mask, *flags = inputs
    out, lse = output
    ctx.save_for_backward(q1, k2, w, v, mask, out, lse)
    ctx.flags = tuple(flags)
    ctx.b_d = None if b_d is None else (b_d.shape, b_d.dtype, b_d.device)
    ctx.mark_non_differentiable(lse)


def _attend_formula(
    q1: Tensor, k2: Tensor, w: Tensor, v: Tensor, mask: Tensor | None, flags: tuple[Any, ...]
) -> Tensor:
    """What the kernels compute, as plain tensor ops in float32 (on the inputs as the op
    takes them: padding already cleared): the scores, the causal and given masks, the
    softmax over the keys (zeros for a row with no allowed key) and the weighted sum."""
    multi, act, causal = flags[:3]
    n_q, n_k = q1.shape[1], k2.shape[1]
    allowed = mask
    if causal:
        ones = torch.ones(n_q, n_k, dtype=torch.bool, device=q1.device)
        below = ones.tril(n_k - n_q)[None]
        allowed = below if allowed is None else allowed & below
    spec = _resolve_act(act)
    q, k, wf, vf = (x.float() for x in (q1, k2, w, v))
    if multi:
        return _multi_dim_traceable(q, k, wf, vf, allowed, spec).to(v.dtype)
    e = _additive_traceable(q, k, wf, spec)
    return (masked_softmax(e, allowed) @ vf).to(v.dtype)


def _attend_graph_backward(ctx: Any, grad: Tensor, _grad_lse: Tensor | None) -> tuple[Any, ...]:
    """The op's gradients under ``create_graph=True``: by :func:`_attend_formula`,
    differentiable again (the kernels' own backward runs without a graph)."""
    q1, k2, w, v, mask = ctx.saved_tensors[:5]
    flags = ctx.flags
    gq, gk, gw, _, gv = _graph_grads(
        ctx,
        lambda a, b, c, _, d: _attend_formula(a, b, c, d, mask, flags),
        (q1, k2, w, None, v),
        grad,
    )
    nones = (None,) * (1 + len(flags))  # mask and the flags
    return (gq, gk, gw, _zero_bias_grad(ctx.b_d), gv, *nones)


def _attend_backward(run: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
    """The backward of the forward op, with ``run`` the backward op or its impl."""

    @_differentiable_again(_attend_graph_backward)
    def backward(ctx: Any, grad: Tensor, _grad_lse: Tensor | None) -> tuple[Any, ...]:
        q1, k2, w, v, mask, out, lse = ctx.saved_tensors
        dq, dk, dw, dv = run(q1, k2, w, v, mask, out, lse, grad, *ctx.flags)
        gb = _zero_bias_grad(ctx.b_d)
        nones = (None,) * (1 + len(ctx.flags))  # mask and the flags
        return (dq.to(q1.dtype), dk.to(k2.dtype), dw.to(w.dtype), gb, dv.to(v.dtype), *nones)

    return backward


_attend = _autograd_op(
    _attend_op,
    _attend_impl,
    _attend_setup,
    _attend_backward,
    _attend_backward_op,
    _attend_backward_impl,
)
_weights_call = _eager_or_op(_weights_op, _weights_impl)


class FlashOptions(TypedDict, total=False):
    """The keyword options of :func:`flash_additive_attention` and
    :func:`flash_multi_dim_attention` (every one optional).

    Attributes:
        causal: also mask key ``j > i + (n_k - n_q)`` (as :func:`attnlab.masks.causal`);
            the kernels skip the key tiles above the diagonal. Default ``False``.
        need_weights: also return the weights, from a second pass. They carry no gradient
            (use the explicit path to differentiate through weights). Default ``False``.
        fast_tanh: evaluate tanh (and sigmoid) with the ``tanh.approx.f32`` instruction
            (CUDA only; relative error about ``2^-11``). Default (``None``): on for
            bfloat16/float16 inputs on a GPU, off otherwise.
        allow_tf32: let the float32 products use TF32 tensor cores (CUDA). Default
            ``False``.
        block_m, block_n: tile sizes (powers of two >= 16); default (``None``) by device.
        fused_backward: one backward kernel over key tiles that also adds each tile's
            share of ``dq1`` with atomics, instead of a second kernel over query tiles
            that evaluates every activation again (the backward then evaluates them
            twice, not four times). Not yet timed on a GPU, so off by default; the sums
            of ``dq1`` then run in no fixed order. Default ``False``.
    """

    causal: bool
    need_weights: bool
    fast_tanh: bool | None
    allow_tf32: bool
    block_m: int | None
    block_n: int | None
    fused_backward: bool


#: the defaults of :class:`FlashOptions`
_FLASH_DEFAULTS: dict[str, Any] = {
    "causal": False,
    "need_weights": False,
    "fast_tanh": None,
    "allow_tf32": False,
    "block_m": None,
    "block_n": None,
    "fused_backward": False,
}


def _check_score_weights(
    multi: bool, q1: Tensor, v: Tensor, w: object, b_d: object
) -> tuple[Tensor, Tensor | None]:
    """``(w, None)`` (additive: ``w`` ``[d_w]``) or ``(W_d, b_d)`` (multi: ``W_d``
    ``[d_w, d_v]``, ``b_d`` ``[d_v]`` or ``None``) checked against the checked ``q1`` and
    ``v``."""
    d_w = q1.shape[2]
    if not multi:
        w = _check_tensor(w, "w", q1)
        if w.dim() != 1 or w.shape[0] != d_w:
            raise _shape_error("w", w, "[d_w]", [d_w])
        return w, None
    W_d = _check_tensor(w, "W_d", q1)
    if W_d.dim() != 2 or W_d.shape[0] != d_w:
        raise _shape_error("W_d", W_d, "[d_w, d_v]", [d_w, None])
    d_v = W_d.shape[1]
    if v.shape[2] != d_v:
        raise _shape_error("v", v, "[B, n_k, d_v]", [v.shape[0], v.shape[1], d_v])
    if b_d is not None:
        b_d = _check_tensor(b_d, "b_d", q1)
        if b_d.dim() != 1 or b_d.shape[0] != d_v:
            raise _shape_error("b_d", b_d, "[d_v]", [d_v])
    return W_d, b_d


def _launch(
    multi: bool,
    inputs: tuple[object, object, object, object, object],
    mask: Tensor | None,
    act: str | Callable[[Tensor], Tensor],
    options: dict[str, Any],
) -> tuple[Tensor, Tensor | None]:
    """The front door of both public functions: check the inputs ``(q1, k2, w or W_d,
    b_d, v)`` and the options (:class:`FlashOptions`; an unknown one is a ``TypeError``
    naming the public function), plan, run the kernels (and the weights pass if asked)."""
    unknown = [k for k in options if k not in FlashOptions.__annotations__]
    if unknown:
        public = "flash_multi_dim_attention" if multi else "flash_additive_attention"
        raise TypeError(f"{public}() got an unexpected keyword argument {unknown[0]!r}")
    o = {**_FLASH_DEFAULTS, **options}
    causal, need_weights, fast_tanh = o["causal"], o["need_weights"], o["fast_tanh"]
    allow_tf32, block_m, block_n = o["allow_tf32"], o["block_m"], o["block_n"]
    q1, k2, w, b_d, v = inputs
    q1c, k2c, vc, mask3, name = _check_common(q1, k2, v, mask, causal, act)
    w, b_d = _check_score_weights(multi, q1c, vc, w, b_d)
    bm = _check_block(block_m, "block_m", 16)
    bn = _check_block(block_n, "block_n", 1 if multi else 16)
    # the op schemas take plain bools: the options are checked here, once
    if fast_tanh is not None and not isinstance(fast_tanh, bool):
        raise TypeError(f"fast_tanh must be a bool or None, got {fast_tanh!r}")
    for key in ("allow_tf32", "fused_backward"):
        if not isinstance(o[key], bool):
            raise TypeError(f"{key} must be a bool, got {o[key]!r}")
    flags = (multi, name, causal, fast_tanh, allow_tf32, bm, bn, o["fused_backward"])
    out, lse = _attend(q1c, k2c, w, b_d, vc, mask3, *flags)
    weights = None
    if need_weights:
        with torch.no_grad():
            weights = _weights_call(q1c, k2c, w, lse, mask3, vc.dtype, vc.shape[2], *flags)
    return out, weights


# ------------------------------------------------------------------ public functions


def flash_additive_attention(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    act: str | Callable[[Tensor], Tensor] = "tanh",
    **options: Unpack[FlashOptions],
) -> tuple[Tensor, Tensor | None]:
    """Additive (Bahdanau) soft attention in one fused Triton kernel.

    ``c[b, i] = sum_j softmax_j(w . act(q1[b, i] + k2[b, j]))[j] v[b, j]`` over the keys
    allowed by ``mask`` (and by ``causal``), without ever holding the ``[B, n_q, n_k]``
    scores or the ``[B, n_q, n_k, d_w]`` hidden activations.

    Args:
        q1: ``[B, n_q, d_w]`` projected queries ``W1 q + b``.
        k2: ``[B, n_k, d_w]`` projected keys ``W2 k``.
        w: ``[d_w]`` the score vector.
        v: ``[B, n_k, d_v]`` values.
        mask: bool, ``True`` = may attend, broadcastable to ``[B, n_q, n_k]``, or ``None``.
        act: ``tanh``, ``sigmoid``, ``relu`` or ``identity`` (or ``torch.tanh``,
            ``nn.Tanh()``, ...).
        options: the keywords of :class:`FlashOptions`: ``causal``, ``need_weights``
            (the weights are ``[B, n_q, n_k]``), ``fast_tanh``, ``allow_tf32`` (it covers
            the products with ``v``), ``block_m``, ``block_n``.

    Returns:
        ``(context, weights)``: ``context`` ``[B, n_q, d_v]`` in the dtype of ``v``;
        ``weights`` ``[B, n_q, n_k]`` or ``None``.

    Gradients flow to ``q1``, ``k2``, ``w`` and ``v``; second derivatives by the formula
    (module docstring).
    """
    return _launch(False, (q1, k2, w, None, v), mask, act, dict(options))


def flash_multi_dim_attention(
    q1: Tensor,
    k2: Tensor,
    W_d: Tensor,
    b_d: Tensor | None,
    v: Tensor,
    mask: Tensor | None = None,
    act: str | Callable[[Tensor], Tensor] = "tanh",
    **options: Unpack[FlashOptions],
) -> tuple[Tensor, Tensor | None]:
    """Multi-dimensional (DiSAN) soft attention in one fused Triton kernel.

    ``e[b, i, j, :] = act(q1[b, i] + k2[b, j]) @ W_d + b_d``; one softmax over the allowed
    keys per (row, feature); ``c[b, i, f] = sum_j a[b, i, j, f] v[b, j, f]`` -- the same
    function as :func:`attnlab.general.fused.multi_dim_attend_lean`, without the
    ``[B, n_q, n_k, d_v]`` scores or weights. Per tile, the score is one tensor-core
    product ``act(q1_i + k2_j) @ W_d``.

    Args:
        q1: ``[B, n_q, d_w]``. k2: ``[B, n_k, d_w]``. W_d: ``[d_w, d_v]``.
        b_d: ``[d_v]`` or ``None``; it cancels in the softmax over keys (zero gradient).
        v: ``[B, n_k, d_v]``.
        mask, act: as in :func:`flash_additive_attention`.
        options: the keywords of :class:`FlashOptions` (``allow_tf32`` here covers the
            products with ``W_d``; ``block_n`` may be any power of two; the weights of
            ``need_weights`` are ``[B, n_q, n_k, d_v]``).

    Returns:
        ``(context, weights)``: ``context`` ``[B, n_q, d_v]`` in the dtype of ``v``.
    """
    return _launch(True, (q1, k2, W_d, b_d, v), mask, act, dict(options))
