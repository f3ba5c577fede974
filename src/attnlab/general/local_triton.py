"""Local attention in Triton kernels: the window of each query read in place, on CUDA.

The ``local-triton`` path of :class:`attnlab.Attention` for local-m and local-p
(Luong et al. 2015) with a dot-product score:

    e_l = scale q'_i . k'_l   for the slots l of the window |l - p_i| <= D,
    a = softmax_window(e) * exp(-(l - p_i)^2 / (2 sigma^2)),  sigma = D / 2,
    c_i = sum_l a_l v_l,

with ``q' , k'`` the score's dot form (:meth:`~attnlab.general.scoring.Score.dot_form`)
and ``p`` the alignment's centres (local-p's predicted ones receive their gradient
through the Gaussian). The result is that of :func:`attnlab.general.local.local_window_attend`
(and of the explicit path); the difference is where the window lives. The gathered path
copies the ``2D + 1`` keys and values of every window into ``[B, n_q, 2D + 1, d]`` tensors
(in float32 for half inputs, and its backward scatters their gradients back row by row);
the kernels of :mod:`attnlab._local_kernels` load each window's rows straight from the keys
and values, keep the scores and weights in registers and write only the context and the
``[B, n_q, 2D + 1]`` weights. Time O(B n_q D (d + d_v)); memory O(B n_q D) besides the
inputs and their gradients.

Requirements: the ``triton`` package (``pip install 'attnlab[triton]'``); CUDA tensors, or
CPU tensors under ``TRITON_INTERPRET=1`` (for tests). Inputs in float32, bfloat16 or
float16, computed in float32. Under ``create_graph=True`` the backward pass differentiates
the gathered window's formula (second derivatives, its memory). The key and value gradients are
summed with atomic adds (windows overlap), so their last bits may vary from run to run;
under ``torch.use_deterministic_algorithms(True)`` (or ``deterministic=True``) a key-side
pass over the queries sorted by centre sums them instead, the same every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnlab.general.alignment import _check_window
from attnlab.general.flash_additive import TRITON_DTYPES, _autograd_op, _custom_op, _kernels
from attnlab.general.fused import _differentiable_again, _graph_grads
from attnlab.general.local import local_window_attend

__all__ = ["LOCAL_TRITON_MAX_WINDOW", "local_triton_attend"]

#: The widest window (``2D + 1``, rounded up to a power of two) the kernels take: a
#: program holds ``[BLOCK_M, window, BLOCK_D]`` tiles in registers.
LOCAL_TRITON_MAX_WINDOW = 256


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass
class _Launch:
    """Sizes, tiles and constants shared by the forward and the backward kernels."""

    D: int
    scale: float
    gaussian: bool
    block_m: int
    w_pad: int
    block_d: int
    block_dv: int
    num_warps: int  # of the forward kernel
    bwd_warps: int  # of the backward kernel

    def scalars(self) -> tuple[Any, ...]:
        # sigma = D / 2: 1 / (2 sigma^2) = 2 / D^2
        return self.D, self.scale, 2.0 / self.D**2

    def consts(self, has_mask: bool, backward: bool = False) -> dict[str, Any]:
        return {
            "GAUSS": self.gaussian,
            "HAS_MASK": has_mask,
            "BLOCK_M": self.block_m,
            "W_PAD": self.w_pad,
            "BLOCK_D": self.block_d,
            "BLOCK_DV": self.block_dv,
            "num_warps": self.bwd_warps if backward else self.num_warps,
        }


def _launch(D: int, scale: float, gaussian: bool, d: int, dv: int, on_gpu: bool) -> _Launch:
    """The tiles: ``BLOCK_M * W_PAD`` window slots per program, ``BLOCK_D`` features of
    them at a time. On a GPU 256 slots, the forward kernel in 4 warps and the backward
    kernel in 8: the fastest forward + backward of the tiles timed on an H100 (B=4,
    n=16384, D=8, d=64; 256 / 512 / 1024 slots x 4 / 8 warps, docs/kernels.md)."""
    w_pad = max(2, _pow2(2 * D + 1))
    slots = 256 if on_gpu else 64
    block_m = max(1, slots // w_pad)
    block_d = min(32, max(2, _pow2(d)))
    block_dv = min(32, max(2, _pow2(dv)))
    fwd, bwd = (4, 8) if on_gpu else (4, 4)
    return _Launch(D, scale, gaussian, block_m, w_pad, block_d, block_dv, fwd, bwd)


def _s2(x: Tensor) -> tuple[int, int]:
    return x.stride(0), x.stride(1)


def _s3(x: Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


# The launches are PyTorch custom operators (``attnlab::local_attend`` and its backward),
# so that torch.compile puts them in its graph as they are instead of tracing the launch
# code; eager calls run the same impls in a plain autograd.Function (``_autograd_op``).
# ``tiles``: block_m, w_pad, block_d, block_dv, forward warps, backward warps;
# ``deterministic``: the backward sums dk and dv in the key-side pass, not by atomics.
_SCHEMA_ARGS = "int D, float scale, bool gaussian, int[] tiles, bool deterministic"


def _plan_of(D: int, scale: float, gaussian: bool, tiles: list[int]) -> _Launch:
    return _Launch(D, scale, gaussian, *tiles)  # type: ignore[arg-type]


def _mask_u8(mask: Tensor | None, q: Tensor) -> Tensor:
    if mask is None:  # never read (HAS_MASK is off): allocated, not filled (no launch)
        return torch.empty(1, 1, 1, dtype=torch.uint8, device=q.device)
    return mask.view(torch.uint8)


def _attend_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    center: Tensor,
    mask: Tensor | None,
    D: int,
    scale: float,
    gaussian: bool,
    tiles: list[int],
    deterministic: bool,
) -> tuple[Tensor, Tensor]:
    plan, K = _plan_of(D, scale, gaussian, tiles), _kernels(q.device, "attnlab._local_kernels")
    (B, n_q, d), (n_k, dv) = q.shape, (k.shape[1], v.shape[-1])
    out = torch.empty(B, n_q, dv, device=q.device, dtype=v.dtype)
    a = torch.empty(B, n_q, 2 * D + 1, device=q.device, dtype=torch.float32)
    m8 = _mask_u8(mask, q)
    K.local_fwd[(triton_cdiv(n_q, plan.block_m), B)](
        q, k, v, center, m8, out, a,
        n_q, n_k, d, dv, *plan.scalars(),
        *_s3(q), *_s3(k), *_s3(v), *_s2(center), *_s3(m8), *_s3(out), *_s3(a),
        **plan.consts(mask is not None),
    )  # fmt: skip
    return out, a


def _attend_fake(
    q: Tensor, k: Tensor, v: Tensor, center: Tensor, *rest: Any
) -> tuple[Tensor, Tensor]:
    D = rest[1]
    (B, n_q), dv = q.shape[:2], v.shape[-1]
    return q.new_empty(B, n_q, dv, dtype=v.dtype), q.new_empty(
        B, n_q, 2 * D + 1, dtype=torch.float32
    )


#: Keys per program of the deterministic key-side pass, and sorted queries per product.
KEY_BLOCK = 32


def _key_side(
    K: Any,
    q: Tensor,
    g: Tensor,
    center: Tensor,
    a: Tensor,
    e: Tensor,
    dk: Tensor,
    dv: Tensor,
    D: int,
) -> None:
    """``dk``, ``dv`` by :func:`attnlab._local_kernels.local_bwd_kv`: the queries sorted by
    centre, and for each block of keys the run of them whose windows may hold it
    (centres in ``[l0 - D, l0 + KEY_BLOCK - 1 + D]``, by binary search)."""
    (B, n_q), n_k, d, d_v = center.shape, dk.shape[1], q.shape[-1], g.shape[-1]
    ordered, perm = torch.sort(center, dim=1)  # NaN last: their windows are empty anyway
    starts = torch.arange(0, n_k, KEY_BLOCK, device=q.device, dtype=center.dtype)
    lo = torch.searchsorted(ordered, (starts - D).expand(B, -1).contiguous())
    hi = torch.searchsorted(ordered, (starts + KEY_BLOCK - 1 + D).expand(B, -1).contiguous(), right=True)  # fmt: skip
    perm, lo, hi = perm.to(torch.int32), lo.to(torch.int32), hi.to(torch.int32)
    K.local_bwd_kv[(starts.numel(), B)](
        q, g, center, a, e, perm, lo, hi, dk, dv,
        n_q, n_k, d, d_v, D,
        *_s3(q), *_s3(g), *_s2(center), *_s3(a), *_s2(perm), *_s2(lo), *_s3(dk), *_s3(dv),
        BLOCK_N=KEY_BLOCK, BLOCK_M=KEY_BLOCK, BLOCK_D=32, num_warps=4,
    )  # fmt: skip


def _backward_impl(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    center: Tensor,
    mask: Tensor | None,
    a: Tensor,
    grad: Tensor,
    D: int,
    scale: float,
    gaussian: bool,
    tiles: list[int],
    deterministic: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    plan, K = _plan_of(D, scale, gaussian, tiles), _kernels(q.device, "attnlab._local_kernels")
    (B, n_q, d), (n_k, dv) = q.shape, (k.shape[1], v.shape[-1])
    grad, a = grad.contiguous(), a.contiguous()
    new = torch.empty if deterministic else torch.zeros  # the key-side pass writes every row
    dq = torch.empty(B, n_q, d, device=q.device, dtype=torch.float32)
    dk = new(B, n_k, d, device=q.device, dtype=torch.float32)
    dvv = new(B, n_k, dv, device=q.device, dtype=torch.float32)
    dc = torch.zeros_like(center)
    e = torch.empty_like(a) if deterministic else a  # the score gradients, for that pass
    m8 = _mask_u8(mask, q)
    K.local_bwd[(triton_cdiv(n_q, plan.block_m), B)](
        q, k, v, center, m8, a, e, grad, dq, dk, dvv, dc,
        n_q, n_k, d, dv, *plan.scalars(),
        *_s3(q), *_s3(k), *_s3(v), *_s2(center), *_s3(m8), *_s3(a), *_s3(grad),
        *_s3(dq), *_s3(dk), *_s3(dvv),
        ATOMIC=not deterministic, **plan.consts(mask is not None, backward=True),
    )  # fmt: skip
    if deterministic:
        _key_side(K, q, grad, center, a, e, dk, dvv, D)
    return dq, dk, dvv, dc


def _backward_fake(
    q: Tensor, k: Tensor, v: Tensor, center: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return tuple(x.new_empty(x.shape, dtype=torch.float32) for x in (q, k, v, center))  # type: ignore[return-value]


_attend_op = _custom_op(
    "local_attend",
    _attend_impl,
    _attend_fake,
    f"(Tensor q, Tensor k, Tensor v, Tensor center, Tensor? mask, {_SCHEMA_ARGS})"
    " -> (Tensor, Tensor)",
)
_backward_op = _custom_op(
    "local_attend_backward",
    _backward_impl,
    _backward_fake,
    "(Tensor q, Tensor k, Tensor v, Tensor center, Tensor? mask, Tensor a, Tensor grad, "
    f"{_SCHEMA_ARGS}) -> (Tensor, Tensor, Tensor, Tensor)",
)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, center, mask, *args = inputs
    ctx.save_for_backward(q, k, v, center, mask, output[1])
    ctx.args = tuple(args)
    ctx.mark_non_differentiable(output[1])


def _graph_backward(ctx: Any, grad: Tensor, _grad_a: Tensor | None) -> tuple[Any, ...]:
    """The op's gradients under ``create_graph=True``: by the gathered window's formula
    (:func:`attnlab.general.local.local_window_attend`, the path the kernels replace),
    differentiable again (the kernels' own backward runs without a graph)."""
    q, k, v, center, mask = ctx.saved_tensors[:5]
    D, scale, gaussian = ctx.args[:3]

    def score(qw: Tensor, kw: Tensor) -> Tensor:  # the kernels' scaled dot, in float32
        return scale * (qw.float() @ kw.float().transpose(-1, -2))

    def formula(qq: Tensor, kk: Tensor, vv: Tensor, cc: Tensor) -> Tensor:
        return local_window_attend(score, qq, kk, vv, cc, D, mask, gaussian)[0]

    gq, gk, gv, gc = _graph_grads(ctx, formula, (q, k, v, center), grad)
    nones = (None,) * (1 + len(ctx.args))  # the mask and the other arguments
    return gq, gk, gv, gc if gaussian else None, *nones


def _backward(run: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
    """The backward of the forward op, with ``run`` the backward op or its impl."""

    @_differentiable_again(_graph_backward)
    def backward(ctx: Any, grad: Tensor, _grad_a: Tensor | None) -> tuple[Any, ...]:
        q, k, v, center, mask, a = ctx.saved_tensors
        dq, dk, dv, dc = run(q, k, v, center, mask, a, grad, *ctx.args)
        # without the Gaussian the centres only choose the window: no gradient
        gc = dc if ctx.args[2] else None
        nones = (None,) * (1 + len(ctx.args))  # the mask and the other arguments
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), gc, *nones

    return backward


_attend = _autograd_op(_attend_op, _attend_impl, _setup, _backward, _backward_op, _backward_impl)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check(q: Tensor, k: Tensor, v: Tensor, center: Tensor, mask: Tensor | None) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be [B, n, d], got shape {tuple(x.shape)}")
        if x.dtype not in TRITON_DTYPES:
            raise TypeError(f"{name} has dtype {x.dtype}; the kernels take float32/16, bfloat16")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device}, q on {q.device}")
    B, n_q = q.shape[:2]
    if k.shape[0] != B or v.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            " (want q [B, n_q, d], k [B, n_k, d], v [B, n_k, d_v])"
        )
    if center.shape != (B, n_q):
        raise ValueError(
            f"center has shape {tuple(center.shape)}, expected [B, n_q] = [{B}, {n_q}]"
        )
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")


def local_triton_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    center: Tensor,
    D: int,
    scale: float = 1.0,
    mask: Tensor | None = None,
    gaussian: bool = True,
    deterministic: bool | None = None,
) -> Tensor:
    """Local attention over the window ``|l - p| <= D`` of each query, in Triton kernels.

    Args:
        q: the queries in the score's dot form ``[B, n_q, d]``; k: ``[B, n_k, d]``;
            v: ``[B, n_k, d_v]``.
        center: window centres ``[B, n_q]`` (any float dtype; computed in float32).
        D: half window width, an int >= 1 with ``2D + 1 <= LOCAL_TRITON_MAX_WINDOW``.
        scale: the score is ``scale * q . k``.
        mask: bool broadcastable to ``[B, n_q, n_k]``, ``True`` = may attend.
        gaussian: multiply the window softmax by ``exp(-(l - p)^2 / (2 (D/2)^2))``.
        deterministic: sum the key and value gradients in a key-side pass over the queries
            sorted by centre (bitwise the same from run to run) instead of by atomic adds
            (whose order varies); default (``None``): when
            ``torch.are_deterministic_algorithms_enabled()``.

    Returns the context ``[B, n_q, d_v]`` in ``v``'s dtype, equal to
    :func:`attnlab.general.local.local_window_attend`'s (an empty window, or no keys at
    all, gives a zero context). Gradients reach ``q``, ``k``, ``v`` and, through the
    Gaussian, ``center``. Cost O(B n_q D (d + d_v)) time, O(B n_q D) memory.
    Wrong shapes, dtypes or ``D`` raise ``ValueError`` / ``TypeError``; a device the
    kernels cannot run on raises ``RuntimeError`` naming the fix.
    """
    _check_window(D)
    _check(q, k, v, center, mask)
    if _pow2(2 * D + 1) > LOCAL_TRITON_MAX_WINDOW:
        raise ValueError(
            f"D = {D}: the window 2D + 1 = {2 * D + 1} is wider than the kernels take "
            f"({LOCAL_TRITON_MAX_WINDOW}); use local_window_attend"
        )
    B, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    if n_k == 0 or n_q == 0:  # nothing to attend: a zero context (as the gathered path)
        return v.new_zeros(B, n_q, v.shape[-1])
    mask3 = None if mask is None else torch.broadcast_to(mask.to(q.device), (B, n_q, n_k))
    plan = _launch(D, float(scale), gaussian, q.shape[-1], v.shape[-1], q.is_cuda)
    c32 = center.to(torch.float32).contiguous()
    tiles = [plan.block_m, plan.w_pad, plan.block_d, plan.block_dv]
    tiles += [plan.num_warps, plan.bwd_warps]
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    out, _ = _attend(q, k, v, c32, mask3, D, float(scale), gaussian, tiles, deterministic)
    return out  # type: ignore[no-any-return]
