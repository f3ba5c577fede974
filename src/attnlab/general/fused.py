"""Memory-lean fused kernels for additive (Bahdanau) and multi-dimensional (DiSAN) attention.

Additive attention scores every query/key pair through a small MLP,
``e[b, i, j] = w . act(q1[b, i] + k2[b, j])`` (Bahdanau et al., 2015), and
multi-dimensional attention keeps one score per feature,
``e[b, i, j, :] = act(q1[b, i] + k2[b, j]) @ W_d + b_d`` (Shen et al., 2018, DiSAN).
Written with broadcasting, both materialise the hidden pre-activation
``q1[:, :, None, :] + k2[:, None, :, :]`` of shape ``[B, n_q, n_k, d_w]``, and autograd then
keeps that tensor and several more of the same size for the backward pass. At ``B = 8``,
``n_q = n_k = 1024``, ``d_w = 64`` one such tensor is 2 GiB of float32.

**Design: chunked recompute.** The kernels here never hold a 4-D tensor. Each one is a
:class:`torch.autograd.Function` that walks over *tiles* of query rows -- a block of rows of
one batch element, or whole batch elements when a full ``[n_q, n_k, d_w]`` slab fits the
budget -- so that a tile's ``[B_tile, rows, n_k, d_w]`` intermediate has about
``chunk_elems`` elements. The forward pass reduces each tile to its small result (the scores
``[B, n_q, n_k]``, or the context ``[B, n_q, d_v]``) and saves only the small inputs (plus,
for the multi-dimensional kernel, the context and the per-row softmax normaliser,
``O(B n_q d_v)``); the backward pass recomputes each tile and reduces it straight into the
input gradients. A tile's intermediates live in a workspace that is allocated once per call
and reused, so they stay in cache and never reach the allocator.

**Parallelism.** On CPU the tiles are dealt round-robin to ``torch.get_num_threads()``
worker threads, each running single-threaded ops on its own tiles and workspace, with its own
accumulators for the key-side gradients (summed in a fixed order at the end, so results are
deterministic). PyTorch ops release the GIL, so this uses every core without an OpenMP
barrier after each small op -- which matters a lot when the machine is shared: a fork-join
per op stalls on every descheduled thread.

Per tile, the named activations ``tanh``, ``sigmoid``, ``relu`` and ``identity`` use a
hand-written backward with in-place ops on the tile buffer, and some algebra:

* ``tanh(x) = 2 sigmoid(2 x) - 1`` and ``1 - tanh(x)^2 = 4 s (1 - s)``; the factor 2 and the
  offset ``-1`` are folded into the small tensors (``q1``, ``k2``, ``w`` / ``W_d``).
* ``sigmoid(a + b) = 1 / (1 + exp(-a) exp(-b))``: ``exp(-q1)`` and ``exp(-k2)`` are computed
  once (``O((n_q + n_k) d_w)``), and a tile costs one fused multiply-add and one reciprocal
  per element instead of a transcendental function. It is used while every
  ``|q1|, |k2|`` is at most 40 (sigmoid) or 20 (tanh) in float32 -- 300 / 150 in float64 --
  so that no intermediate overflows or goes subnormal; beyond that ``sigmoid`` is applied
  to the sum.
* The contraction with ``w`` (``W_d``) is a matrix-vector (matrix-matrix) product on the
  flattened tile, and the weight gradient is the transposed product.
* Multi-dimensional only: ``b_d`` (and, for tanh, the offset ``-1``) is constant across keys
  and cancels in the softmax over ``j``: the output does not depend on ``b_d`` and its
  gradient is exactly zero. The scores are kept in base 2 (``exp2`` is cheaper than
  ``exp``), and for the bounded activations (tanh, sigmoid) the scores of feature ``f`` lie in
  an interval of width ``sum_d |W_d[d, f]|`` (times 2 for tanh) known in advance; when it is
  narrow enough for the exponentials not to underflow, the softmax is shifted by its upper
  end instead of the row maximum, which saves a reduction per tile.

Any other activation (``gelu``, ``elu``, a user callable, an ``nn.Module``, ...) falls back to
per-tile checkpointing: the tile's pre-activation is recomputed under
:func:`torch.enable_grad` and the activation is differentiated with
:func:`torch.autograd.grad`; everything around it is still hand-written.

Half-precision inputs (``bfloat16``, ``float16``) are computed in float32 (including the
softmax) and the results are cast back.

**Second derivatives.** The hand-written backward passes run without a graph. When the
caller asks for one (``create_graph=True``: gradient penalties, meta-learning,
Hessian-vector products), the backward pass differentiates the textbook broadcast formula
of the same function instead (its ``_traceable`` form, on the saved inputs), so the second
derivatives are exact; that pass holds the ``[B, n_q, n_k, d_w]`` intermediates the kernels
avoid, as the textbook formula does.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import FunctionCtx

from attnlab._checks import is_traced
from attnlab.general.activations import activation_name, get_activation
from attnlab.general.padding import clear_attention_inputs
from attnlab.masks import normalize_mask

__all__ = [
    "DEFAULT_CHUNK_ELEMS",
    "HAND_DIFFERENTIATED",
    "additive_score_lean",
    "multi_dim_attend_lean",
]

#: Default number of elements of one tile's ``[B_tile, rows, n_k, d_w]`` intermediate
#: (4 MiB of float32). Measured with ``benchmarks/tune_fused_chunks.py`` on a 2-core AMD EPYC
#: (1 MiB L2 per core, 32 MiB shared L3): ``2^19 .. 2^21`` are within noise of each other;
#: smaller tiles pay the per-op Python overhead (and GIL hand-offs) too often, larger ones
#: no longer fit the last-level cache next to the other worker's tile.
DEFAULT_CHUNK_ELEMS: int = 2**20

#: Activations whose backward pass is written by hand (the others are checkpointed).
HAND_DIFFERENTIATED: frozenset[str] = frozenset({"tanh", "sigmoid", "relu", "identity"})

# Largest width (in base-2 units) of the score interval of one feature for which the
# fixed-shift softmax of the bounded activations cannot underflow (2^-limit stays normal).
_SHIFT_LIMIT = {torch.float32: 80.0, torch.float64: 900.0}
# Largest |scale * q1|, |scale * k2| for which the product form of the logistic function keeps
# every intermediate a finite, normal number (e^(2 limit) well inside the dtype's range).
_PRODUCT_LIMIT = {torch.float32: 40.0, torch.float64: 300.0}
_LOG2E = 1.0 / math.log(2.0)
# Below this many elements per tile, a second worker costs more than it saves.
_MIN_PARALLEL_TILE = 2**15

_ALIASES: dict[object, str] = {
    torch.tanh: "tanh",
    F.tanh: "tanh",
    Tensor.tanh: "tanh",
    torch.sigmoid: "sigmoid",
    F.sigmoid: "sigmoid",
    Tensor.sigmoid: "sigmoid",
    torch.relu: "relu",
    F.relu: "relu",
    Tensor.relu: "relu",
}
_MODULE_ALIASES: tuple[tuple[type, str], ...] = (
    (nn.Tanh, "tanh"),
    (nn.Sigmoid, "sigmoid"),
    (nn.ReLU, "relu"),
    (nn.Identity, "identity"),
)

Tile = tuple[int, int, int, int]  # (b0, b1, i0, i1)
S = TypeVar("S")


# ------------------------------------------------------------------ double backward


def _differentiable_again(
    graph_backward: Callable[..., tuple[Tensor | None, ...]],
) -> Callable[[Callable[..., tuple[Tensor | None, ...]]], Callable[..., tuple[Tensor | None, ...]]]:
    """A hand-written ``backward`` that runs without a graph, except when the caller asked
    for one (``create_graph=True``) and anything could be differentiated further: then
    ``graph_backward(ctx, *grads)`` gives the gradients, with a graph."""

    def decorate(
        backward: Callable[..., tuple[Tensor | None, ...]],
    ) -> Callable[..., tuple[Tensor | None, ...]]:
        @functools.wraps(backward)
        def wrapper(ctx: FunctionCtx, *grads: Tensor) -> tuple[Tensor | None, ...]:
            if torch.is_grad_enabled():
                saved = ctx.saved_tensors  # type: ignore[attr-defined]
                if any(x is not None and x.requires_grad for x in (*grads, *saved)):
                    return graph_backward(ctx, *grads)
            with torch.no_grad():
                return backward(ctx, *grads)

        return wrapper

    return decorate


def _graph_grads(
    ctx: FunctionCtx,
    output: Callable[..., Tensor],
    inputs: tuple[Tensor | None, ...],
    grad: Tensor,
) -> list[Tensor | None]:
    """The gradients of ``output(*inputs)`` (plain tensor ops) with respect to the inputs
    the function's caller needs (``ctx.needs_input_grad``), with a graph: ``grad`` is
    propagated through the formula by autograd, so the result can be differentiated again."""
    needs = ctx.needs_input_grad  # type: ignore[attr-defined]
    want = [i for i, x in enumerate(inputs) if x is not None and needs[i]]
    with torch.enable_grad():
        taken = [x if x is None or x.requires_grad else x.detach() for x in inputs]
        out = output(*taken)
        got = torch.autograd.grad(
            out, [taken[i] for i in want], grad, create_graph=True, allow_unused=True
        )
    grads: list[Tensor | None] = [None] * len(inputs)
    for i, g in zip(want, got, strict=True):
        x = inputs[i]
        assert x is not None
        grads[i] = torch.zeros_like(x) if g is None else g
    return grads


# ---------------------------------------------------------------------- activations


@dataclass(frozen=True)
class _Act:
    """A resolved activation: ``name`` is one of :data:`HAND_DIFFERENTIATED` or ``None``
    (then ``fn`` is differentiated by autograd, tile by tile)."""

    name: str | None
    fn: Callable[[Tensor], Tensor]

    @property
    def scale(self) -> float:
        """Tiles hold ``scale * (q1 + k2)``: 2 for tanh, computed as ``sigmoid(2 x)``."""
        return 2.0 if self.name == "tanh" else 1.0

    def apply_(self, u: Tensor) -> Tensor:
        """The activation of a named kind applied in place to the tile ``u`` (for tanh the
        result is ``s = sigmoid(2 x)``; the callers account for ``tanh = 2 s - 1``)."""
        if self.name in ("tanh", "sigmoid"):
            return u.sigmoid_()
        if self.name == "relu":
            return u.relu_()
        return u  # identity

    def derivative_(self, t: Tensor) -> Tensor | None:
        """Overwrite the activated tile ``t`` with the derivative with respect to the tile's
        pre-activation (``None``: the derivative is 1).

        For tanh and sigmoid that is ``s (1 - s)``; with respect to ``x = q1 + k2`` it gets
        the factor :attr:`deriv_scale` (``d tanh(x) / dx = 4 s (1 - s)``)."""
        if self.name in ("tanh", "sigmoid"):
            return torch.addcmul(t, t, t, value=-1.0, out=t)
        if self.name == "relu":
            return t.sign_()  # relu output >= 0, so sign = 1[t > 0]
        return None

    @property
    def deriv_scale(self) -> float:
        return 4.0 if self.name == "tanh" else 1.0


def _resolve_act(act: str | Callable[[Tensor], Tensor]) -> _Act:
    fn = get_activation(act)
    name = activation_name(act)
    if name is None and _hashable(act):
        name = _ALIASES.get(act)
    if name is None:
        for cls, alias in _MODULE_ALIASES:
            if type(act) is cls:
                name = alias
    return _Act(name if name in HAND_DIFFERENTIATED else None, fn)


def _hashable(obj: object) -> bool:
    try:
        hash(obj)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------------ validation


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _check_chunk(chunk_elems: int | None) -> int:
    if chunk_elems is None:
        return DEFAULT_CHUNK_ELEMS
    if isinstance(chunk_elems, bool) or not isinstance(chunk_elems, int) or chunk_elems < 1:
        raise ValueError(f"chunk_elems must be a positive int or None, got {chunk_elems!r}")
    return chunk_elems


def _check_tensor(x: object, name: str, ref: Tensor | None) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ref is None:
        if not x.dtype.is_floating_point:
            raise TypeError(
                f"{name} has dtype {x.dtype}, expected a floating dtype "
                "(float32, float64, bfloat16 or float16)"
            )
        return x
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype}, expected {ref.dtype} (the dtype of q1)")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device}, expected {ref.device} (the device of q1)")
    return x


def _shape_error(name: str, x: Tensor, pattern: str, dims: list[int | None]) -> ValueError:
    want = ", ".join("*" if d is None else str(d) for d in dims)
    return ValueError(f"{name} has shape {tuple(x.shape)}, expected {pattern} = [{want}]")


def _check_qk(q1: object, k2: object) -> tuple[Tensor, Tensor]:
    q1 = _check_tensor(q1, "q1", None)
    if q1.dim() != 3:
        raise ValueError(f"q1 has shape {tuple(q1.shape)}, expected [B, n_q, d_w] (3-D)")
    k2 = _check_tensor(k2, "k2", q1)
    B, _, d_w = q1.shape
    if k2.dim() != 3 or k2.shape[0] != B or k2.shape[2] != d_w:
        raise _shape_error("k2", k2, "[B, n_k, d_w]", [B, None, d_w])
    return q1, k2


# ------------------------------------------------------------------ tiles and workers


def _tiles(batch: int, n_q: int, n_k: int, row_elems: int, chunk_elems: int) -> list[Tile]:
    """Split the ``[batch, n_q]`` query rows into tiles ``(b0, b1, i0, i1)`` of about
    ``chunk_elems / row_elems`` rows, balanced in size. A tile covers either whole batch
    elements or a block of rows of a single batch element, so ``x[b0:b1, i0:i1]`` of a
    contiguous ``[batch, n_q, ...]`` tensor is itself contiguous."""
    if batch == 0 or n_q == 0 or n_k == 0:
        return []
    rows = max(1, chunk_elems // max(1, row_elems))
    if rows >= n_q:
        nb = min(batch, rows // n_q)
        nb = -(-batch // -(-batch // nb))
        return [(b0, min(batch, b0 + nb), 0, n_q) for b0 in range(0, batch, nb)]
    rows = -(-n_q // -(-n_q // rows))
    return [(b, b + 1, i0, min(n_q, i0 + rows)) for b in range(batch) for i0 in range(0, n_q, rows)]


def _plan_tiles(
    batch: int, n_q: int, n_k: int, row_elems: int, chunk: int, device: torch.device
) -> tuple[list[Tile], int]:
    """Tiles and the number of workers to deal them to (CPU: up to
    ``torch.get_num_threads()``; a problem that fits one tile is split so every worker
    gets some)."""
    workers = torch.get_num_threads() if device.type == "cpu" else 1
    if workers > 1:
        total = batch * n_q * row_elems
        chunk = min(chunk, max(_MIN_PARALLEL_TILE, -(-total // workers)))
    tiles = _tiles(batch, n_q, n_k, row_elems, chunk)
    return tiles, max(1, min(workers, len(tiles)))


_POOL: ThreadPoolExecutor | None = None
_POOL_SIZE = 0
_POOL_PID = 0
_POOL_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of at least ``workers`` threads whose own intra-op parallelism is
    1 (so that they do not fight over the cores). Recreated after a fork."""
    global _POOL, _POOL_SIZE, _POOL_PID
    with _POOL_LOCK:
        if _POOL is None or _POOL_SIZE < workers or _POOL_PID != os.getpid():
            old = _POOL if _POOL_PID == os.getpid() else None
            mine = torch.get_num_threads()
            ready = threading.Barrier(workers)

            def init() -> None:
                torch.set_num_threads(1)  # this thread's ops run single-threaded

            pool = ThreadPoolExecutor(workers, "attnlab-fused", initializer=init)
            # start every thread now: each runs `init` and waits for the others
            list(pool.map(lambda _: ready.wait(timeout=60), range(workers)))
            # torch.set_num_threads also set the default for threads started later; restore
            torch.set_num_threads(mine)
            _POOL, _POOL_SIZE, _POOL_PID = pool, workers, os.getpid()
            if old is not None:
                old.shutdown(wait=False)
        return _POOL


def _run_tiles(
    tiles: list[Tile], workers: int, job: Callable[[Tile, S], None], state: Callable[[], S]
) -> list[S]:
    """Run ``job(tile, st)`` for every tile; tile ``k`` goes to worker ``k % workers``, which
    owns the state ``st = state()`` (workspace, accumulators). Returns the states in worker
    order. The jobs run with autograd off (in inference mode if the caller is)."""
    if workers <= 1:
        st = state()
        for tile in tiles:
            job(tile, st)
        return [st]

    inference = torch.is_inference_mode_enabled()  # thread-local, like grad mode

    def work(r: int) -> S:
        with torch.inference_mode() if inference else torch.no_grad():
            st = state()
            for tile in tiles[r::workers]:
                job(tile, st)
            return st

    return list(_pool(workers).map(work, range(workers)))


def _workspace(tiles: list[Tile], per_row: int, like: Tensor) -> Tensor:
    """One flat buffer for the largest tile (``per_row`` elements per query row)."""
    most = max(((b1 - b0) * (i1 - i0) for b0, b1, i0, i1 in tiles), default=0)
    return torch.empty(most * per_row, dtype=like.dtype, device=like.device)


def _mat(t: Tensor) -> Tensor:
    """A tile ``[..., n_k, d]`` as the matrix ``[rows * n_k, d]`` (also for ``d = 0``)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _contig(x: Tensor, dtype: torch.dtype, scale: float = 1.0) -> Tensor:
    x = x.to(dtype)
    if scale != 1.0:
        x = x * scale
    return x.contiguous()


def _absmax(x: Tensor) -> float:
    return float(x.detach().abs().amax()) if x.numel() else 0.0


def _sum_states(states: list[Tensor | None]) -> Tensor | None:
    if states[0] is None:
        return None
    total = states[0]
    for x in states[1:]:
        total = total + x  # type: ignore[operator]
    return total


@dataclass
class _Hidden:
    """How the tiles of hidden activations ``act(q1 + k2)`` are produced.

    ``product=False``: ``qf``/``kf`` are ``scale * q1``/``scale * k2``; a tile is their
    broadcast sum followed by the activation. ``product=True`` (tanh and sigmoid with
    moderate inputs): ``qf = exp(-scale q1)``, ``kf = exp(-scale k2)`` and
    ``sigmoid(scale (q1 + k2)) = 1 / (1 + qf kf)`` -- one fused multiply-add and one
    reciprocal per element instead of an ``exp``; accurate to a few ulp, and exact in the
    limits (``1 / (1 + inf) = 0``, ``1 / (1 + 0) = 1``)."""

    act: _Act
    qf: Tensor  # [B, n_q, d_w], compute dtype, contiguous
    kf: Tensor  # [B, n_k, d_w]
    product: bool
    one: Tensor  # 0-dim 1 in the compute dtype

    @classmethod
    def of(cls, q1: Tensor, k2: Tensor, act: _Act, ct: torch.dtype) -> _Hidden:
        qs, ks = _contig(q1, ct, act.scale), _contig(k2, ct, act.scale)
        one = torch.ones((), dtype=ct, device=q1.device)
        limit = _PRODUCT_LIMIT.get(ct, 0.0)
        if act.name in ("tanh", "sigmoid") and max(_absmax(qs), _absmax(ks)) <= limit:
            return cls(act, torch.exp(-qs), torch.exp(-ks), True, one)
        return cls(act, qs, ks, False, one)

    def tile(self, work: Tensor, tile: Tile, grad: bool = False) -> tuple[Tensor, Tensor | None]:
        """The activated tile ``[B_tile, rows, n_k, d_w]``, computed in ``work`` where
        possible (tanh and sigmoid: ``s = sigmoid(scale (q1 + k2))``); and, for a
        checkpointed activation with ``grad``, the pre-activation leaf it was computed from
        under autograd."""
        b0, b1, i0, i1 = tile
        n_k, d = self.kf.shape[1], self.kf.shape[2]
        buf = work[: (b1 - b0) * (i1 - i0) * n_k * d].view(b1 - b0, i1 - i0, n_k, d)
        a, b = self.qf[b0:b1, i0:i1, None, :], self.kf[b0:b1, None, :, :]
        if self.product:
            return torch.addcmul(self.one, a, b, out=buf).reciprocal_(), None
        u = torch.add(a, b, out=buf)
        if self.act.name is not None:
            return self.act.apply_(u), None
        if grad:
            with torch.enable_grad():
                u = u.detach().requires_grad_()
                return self.act.fn(u), u
        return self.act.fn(u), None


def _cast(x: Tensor | None, like: Tensor) -> Tensor | None:
    return None if x is None else x.to(like.dtype)


# ------------------------------------------------------------------ additive scores


def _additive_forward(q1: Tensor, k2: Tensor, w: Tensor, act: _Act, chunk: int) -> Tensor:
    B, n_q, d_w = q1.shape
    n_k = k2.shape[1]
    ct = _compute_dtype(q1.dtype)
    wc = w.to(ct)
    if act.name == "identity":  # w . (q1 + k2) splits: no 4-D intermediate at all
        qw = torch.matmul(q1.to(ct), wc)
        kw = torch.matmul(k2.to(ct), wc)
        return (qw[:, :, None] + kw[:, None, :]).to(q1.dtype)
    if d_w == 0:  # an empty sum
        return torch.zeros(B, n_q, n_k, dtype=q1.dtype, device=q1.device)
    hidden = _Hidden.of(q1, k2, act, ct)
    if act.name == "tanh":  # w . tanh(x) = (2 w) . sigmoid(2 x) - sum(w)
        w_eff, const = 2.0 * wc, -wc.sum()
    else:
        w_eff, const = wc, wc.new_zeros(())
    out = torch.empty(B, n_q, n_k, dtype=ct, device=q1.device)
    tiles, workers = _plan_tiles(B, n_q, n_k, n_k * d_w, chunk, q1.device)

    def job(tile: Tile, work: Tensor) -> None:
        b0, b1, i0, i1 = tile
        t, _ = hidden.tile(work, tile)
        torch.addmv(const, _mat(t), w_eff, out=out[b0:b1, i0:i1].view(-1))

    _run_tiles(tiles, workers, job, lambda: _workspace(tiles, n_k * d_w, hidden.qf))
    return out.to(q1.dtype)


@dataclass
class _AdditiveState:
    work: Tensor
    gk: Tensor | None
    gw: Tensor | None


def _reduce_hidden_grad(gu: Tensor, gq: Tensor | None, gk: Tensor | None, tile: Tile) -> None:
    """Add a tile's gradient ``gu`` ``[B_tile, rows, n_k, d_w]`` with respect to the hidden
    pre-activation to the query gradient (sum over keys) and the key gradient (over rows)."""
    b0, b1, i0, i1 = tile
    if gq is not None:
        torch.sum(gu, 2, out=gq[b0:b1, i0:i1])
    if gk is not None:
        gk[b0:b1] += gu.sum(1)


def _scale_(factor: Tensor | float, *xs: Tensor | None) -> None:
    for x in xs:
        if x is not None:
            x.mul_(factor)


def _additive_identity_backward(
    q1: Tensor, k2: Tensor, wc: Tensor, g: Tensor, needs: tuple[bool, bool, bool]
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The gradients of ``w . (q1 + k2)``: no tiles, the sum splits."""
    need_q, need_k, need_w = needs
    ct = wc.dtype
    gi, gj = g.sum(2), g.sum(1)  # [B, n_q], [B, n_k]
    gq = gi[:, :, None] * wc if need_q else None
    gk = gj[:, :, None] * wc if need_k else None
    gw = None
    if need_w:
        gw = torch.einsum("bi,bid->d", gi, q1.to(ct)) + torch.einsum("bj,bjd->d", gj, k2.to(ct))
    return gq, gk, gw


def _additive_backward(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    grad_e: Tensor,
    act: _Act,
    chunk: int,
    needs: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    B, n_q, d_w = q1.shape
    n_k = k2.shape[1]
    ct = _compute_dtype(q1.dtype)
    wc = w.to(ct)
    g = grad_e.to(ct).contiguous()
    if act.name == "identity":
        gq, gk, gw = _additive_identity_backward(q1, k2, wc, g, needs)
        return _cast(gq, q1), _cast(gk, k2), _cast(gw, w)
    need_q, need_k, need_w = needs
    dev = q1.device
    hidden = _Hidden.of(q1, k2, act, ct)
    gq = torch.zeros(B, n_q, d_w, dtype=ct, device=dev) if need_q else None
    need_u = need_q or need_k
    tiles, workers = _plan_tiles(B, n_q, n_k, n_k * d_w, chunk, dev)

    def state() -> _AdditiveState:
        return _AdditiveState(
            _workspace(tiles, n_k * d_w, hidden.qf),
            torch.zeros(B, n_k, d_w, dtype=ct, device=dev) if need_k else None,
            torch.zeros(d_w, dtype=ct, device=dev) if need_w else None,
        )

    def job(tile: Tile, st: _AdditiveState) -> None:
        b0, b1, i0, i1 = tile
        g_t = g[b0:b1, i0:i1]  # [B_tile, rows, n_k]
        t, u = hidden.tile(st.work, tile, grad=need_u)
        if st.gw is not None:
            st.gw.addmv_(_mat(t.detach()).t(), g_t.reshape(-1))
        if not need_u:
            return
        if u is not None:  # checkpointed activation
            (gu,) = torch.autograd.grad(t, u, g_t[..., None] * wc)
        else:
            gu = act.derivative_(t)
            assert gu is not None  # identity is handled above
            gu.mul_(g_t[..., None])  # w and the derivative's scale are applied at the end
        _reduce_hidden_grad(gu, gq, st.gk, tile)

    states = _run_tiles(tiles, workers, job, state)
    gk = _sum_states([st.gk for st in states])
    gw = _sum_states([st.gw for st in states])
    if act.name is not None:
        _scale_(act.deriv_scale * wc, gq, gk)
        if gw is not None and act.name == "tanh":  # w . tanh = (2 w) . s - sum(w)
            gw.mul_(2.0).sub_(g.sum())
    return _cast(gq, q1), _cast(gk, k2), _cast(gw, w)


def _additive_graph_backward(ctx: FunctionCtx, grad_e: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`_AdditiveScoreFn`'s gradients under ``create_graph=True``: by the broadcast
    formula, differentiable again."""
    q1, k2, w = ctx.saved_tensors  # type: ignore[attr-defined]
    act = ctx.act  # type: ignore[attr-defined]
    grads = _graph_grads(
        ctx, lambda a, b, c: _additive_traceable(a, b, c, act), (q1, k2, w), grad_e
    )
    return (*grads, None, None)


class _AdditiveScoreFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx, q1: Tensor, k2: Tensor, w: Tensor, act: _Act, chunk: int
    ) -> Tensor:
        ctx.save_for_backward(q1, k2, w)
        ctx.act, ctx.chunk = act, chunk  # type: ignore[attr-defined]
        return _additive_forward(q1, k2, w, act, chunk)

    @staticmethod
    @_differentiable_again(_additive_graph_backward)
    def backward(ctx: FunctionCtx, grad_e: Tensor) -> tuple[Tensor | None, ...]:
        q1, k2, w = ctx.saved_tensors  # type: ignore[attr-defined]
        needs = tuple(ctx.needs_input_grad[:3])  # type: ignore[attr-defined]
        act, chunk = ctx.act, ctx.chunk  # type: ignore[attr-defined]
        gq, gk, gw = _additive_backward(q1, k2, w, grad_e, act, chunk, needs)
        return gq, gk, gw, None, None


def additive_score_lean(
    q1: Tensor,
    k2: Tensor,
    w: Tensor,
    act: str | Callable[[Tensor], Tensor] = "tanh",
    chunk_elems: int | None = None,
) -> Tensor:
    """Additive (Bahdanau) attention scores without the ``[B, n_q, n_k, d_w]`` intermediate.

    ``e[b, i, j] = sum_d w[d] * act(q1[b, i, d] + k2[b, j, d])``

    This is the MLP score of Bahdanau, Cho & Bengio (2015), *Neural Machine Translation by
    Jointly Learning to Align and Translate*, ``w^T act(W1 q + W2 k + b)``, with the two
    projections already applied by the caller (they cost ``O((n_q + n_k) d d_w)`` and are
    best done once per sequence, not once per pair). The broadcast form
    ``act(q1[:, :, None] + k2[:, None]) @ w`` holds several ``[B, n_q, n_k, d_w]`` tensors for
    autograd; this kernel holds none (see the module docstring for how).

    Args:
        q1: ``[B, n_q, d_w]`` projected queries ``W1 q + b``.
        k2: ``[B, n_k, d_w]`` projected keys ``W2 k``.
        w: ``[d_w]`` the score vector.
        act: a name from :mod:`attnlab.general.activations` or a callable. ``tanh``,
            ``sigmoid``, ``relu`` and ``identity`` (also given as ``torch.tanh``,
            ``nn.Tanh()``, ...) have a hand-written backward; anything else is recomputed
            and differentiated by autograd one tile at a time.
        chunk_elems: about how many elements one tile's ``[B_tile, rows, n_k, d_w]``
            intermediate may hold (default :data:`DEFAULT_CHUNK_ELEMS`). Only speed and the
            workspace size depend on it, not the result (up to rounding).

    Returns:
        ``e``: ``[B, n_q, n_k]`` scores in the dtype of ``q1`` (``bfloat16``/``float16``
        inputs are computed in float32 and cast back).

    Cost: time ``O(B n_q n_k d_w)`` in the forward pass and about twice that in the backward
    pass (each tile is recomputed); memory ``O(B n_q n_k)`` for the scores (and their
    gradient) plus one ``chunk_elems`` workspace per worker thread -- never
    ``O(B n_q n_k d_w)``.

    Gradients flow to ``q1``, ``k2`` and ``w``; under ``create_graph=True`` the backward
    pass differentiates the broadcast formula instead (exact second derivatives, its
    memory). Empty ``n_q`` or ``n_k`` gives an empty ``[B, n_q, n_k]`` result.
    """
    amp = _autocast_device(q1)
    if amp is not None:  # as torch.nn layers: every input in the autocast dtype
        q1, k2, w = _to_autocast_dtype(amp, q1, k2, w)
    q1, k2 = _check_qk(q1, k2)
    w = _check_tensor(w, "w", q1)
    d_w = q1.shape[2]
    if w.dim() != 1 or w.shape[0] != d_w:
        raise _shape_error("w", w, "[d_w]", [d_w])
    spec = _resolve_act(act)
    chunk = _check_chunk(chunk_elems)
    # the kernels pick their own precision (float32 for half inputs): autocast off inside
    with torch.autocast(q1.device.type, enabled=False):
        if is_traced():  # torch.compile, torch.export, torch.func: the formula
            return _additive_traceable(q1, k2, w, spec)
        return _AdditiveScoreFn.apply(q1, k2, w, spec, chunk)


def _autocast_device(x: object) -> str | None:
    """The device type of ``x`` if :func:`torch.autocast` is on for it, else ``None``."""
    if isinstance(x, Tensor) and torch.is_autocast_enabled(x.device.type):
        return x.device.type
    return None


def _to_autocast_dtype(device_type: str, *xs: object) -> tuple[object, ...]:
    """Floating tensors among ``xs`` cast to the autocast dtype of ``device_type`` (the
    others unchanged), as autocast does for the inputs of a matrix product (float64 is not
    autocast-eligible and stays)."""
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        x.to(dtype)
        if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != torch.float64
        else x
        for x in xs
    )


def _additive_traceable(q1: Tensor, k2: Tensor, w: Tensor, act: _Act) -> Tensor:
    """:func:`additive_score_lean` as plain tensor ops, for :func:`torch.compile`: no worker
    threads and no host synchronisation, so the whole call is one graph (the compiler fuses
    the broadcast sum, the activation and the contraction with ``w``). Same result up to
    rounding, computed in float32 for half-precision inputs."""
    ct = _compute_dtype(q1.dtype)
    wc = w.to(ct)
    if act.name == "identity":  # w . (q1 + k2) splits
        e = torch.matmul(q1.to(ct), wc)[:, :, None] + torch.matmul(k2.to(ct), wc)[:, None, :]
        return e.to(q1.dtype)
    hidden = act.fn(q1.to(ct)[:, :, None, :] + k2.to(ct)[:, None, :, :])
    return torch.matmul(hidden, wc).to(q1.dtype)


# ------------------------------------------------------- multi-dimensional attention


@dataclass
class _MultiDimPlan:
    """Everything the tiles of the multi-dimensional kernel need, prepared once.

    Scores are kept in base 2 (``e * log2(e)``, the factor folded into ``w2``) because
    ``exp2`` is cheaper than ``exp``."""

    hidden: _Hidden
    w_eff: Tensor  # [d_w, d_v]: scores = (activated tile) @ w_eff + a per-feature constant
    w2: Tensor  # w_eff * log2(e)
    neg_bound2: Tensor | None  # [d_v] fixed softmax shift (negated, base 2), or None
    v: Tensor  # [B, n_k, d_v]
    bias: Tensor | None  # 0 / -inf, 3-D, broadcastable to [B, n_q, n_k]
    tiles: list[Tile]
    workers: int


def _multi_dim_plan(
    q1: Tensor, k2: Tensor, W_d: Tensor, v: Tensor, mask: Tensor | None, act: _Act, chunk: int
) -> _MultiDimPlan:
    ct = _compute_dtype(q1.dtype)
    B, n_q, d_w = q1.shape
    n_k, d_v = v.shape[1], v.shape[2]
    hidden = _Hidden.of(q1, k2, act, ct)
    # tanh(x) = 2 s - 1: the offset adds a per-feature constant to every score, which
    # cancels in the softmax over keys (as b_d does)
    w_eff = _contig(W_d, ct, 2.0 if act.name == "tanh" else 1.0)
    w2 = w_eff * _LOG2E
    neg_bound2 = None
    if act.name in ("tanh", "sigmoid"):  # activated values lie in [0, 1]
        if _absmax(w2.abs().sum(0)) <= _SHIFT_LIMIT.get(ct, 0.0):
            neg_bound2 = -w2.clamp(min=0).sum(0)
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=ct, device=q1.device).masked_fill_(~mask, -math.inf)
    tiles, workers = _plan_tiles(B, n_q, n_k, n_k * max(d_w, d_v), chunk, q1.device)
    return _MultiDimPlan(hidden, w_eff, w2, neg_bound2, _contig(v, ct), bias, tiles, workers)


def _scores_exp2_(
    plan: _MultiDimPlan, t: Tensor, ebuf: Tensor, tile: Tile, shift: Tensor | None, fresh: bool
) -> Tensor:
    """Unnormalised softmax numerators ``2^(e2 - shift)`` of a tile, 0 at masked keys.

    With a fixed bound the shift is folded into the matrix product. Otherwise the shift is
    the row maximum: computed here when ``fresh`` and written into ``shift`` (0 for rows
    without any allowed key), or read back from ``shift`` in the backward pass."""
    b0, b1, i0, i1 = tile
    bt, rows, n_k, _ = t.shape
    d_v = plan.w2.shape[1]
    e2 = ebuf[: bt * rows * n_k * d_v].view(bt * rows * n_k, d_v)
    if plan.neg_bound2 is not None:
        torch.addmm(plan.neg_bound2, _mat(t), plan.w2, out=e2)
    else:
        torch.mm(_mat(t), plan.w2, out=e2)
    e = e2.view(bt, rows, n_k, d_v)
    if plan.bias is not None:
        bias = plan.bias
        bias = bias[b0:b1] if bias.shape[0] > 1 else bias
        bias = bias[:, i0:i1] if bias.shape[1] > 1 else bias
        e.add_(bias[..., None])
    if plan.neg_bound2 is None:
        assert shift is not None
        m = shift[b0:b1, i0:i1]
        if fresh:
            torch.amax(e, 2, out=m)
            m.masked_fill_(m == -math.inf, 0.0)
        e.sub_(m[:, :, None])
    return e.exp2_()


def _multi_dim_forward(
    q1: Tensor, k2: Tensor, W_d: Tensor, v: Tensor, mask: Tensor | None, act: _Act, chunk: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Returns (context, softmax denominators, row shifts or None) in the compute dtype."""
    B, n_q, d_w = q1.shape
    n_k, d_v = v.shape[1], v.shape[2]
    plan = _multi_dim_plan(q1, k2, W_d, v, mask, act, chunk)
    like = plan.hidden.qf
    ctx_out = torch.zeros(B, n_q, d_v, dtype=like.dtype, device=like.device)
    den = torch.zeros_like(ctx_out)
    shift = None if plan.neg_bound2 is not None else torch.zeros_like(den)

    def state() -> tuple[Tensor, Tensor]:
        return _workspace(plan.tiles, n_k * d_w, like), _workspace(plan.tiles, n_k * d_v, like)

    def job(tile: Tile, st: tuple[Tensor, Tensor]) -> None:
        b0, b1, i0, i1 = tile
        t, _ = plan.hidden.tile(st[0], tile)
        p = _scores_exp2_(plan, t, st[1], tile, shift, fresh=True)
        torch.sum(p, 2, out=den[b0:b1, i0:i1])
        p.mul_(plan.v[b0:b1, None])
        torch.sum(p, 2, out=ctx_out[b0:b1, i0:i1])

    _run_tiles(plan.tiles, plan.workers, job, state)
    ctx_out.div_(den.masked_fill(den == 0, 1.0))
    return ctx_out, den, shift


@dataclass
class _MultiDimState:
    ubuf: Tensor
    ebuf: Tensor
    dbuf: Tensor | None
    gbuf: Tensor | None
    gk: Tensor | None
    gW: Tensor | None
    gv: Tensor | None


def _multi_dim_state(
    plan: _MultiDimPlan, act: _Act, needs: tuple[bool, bool, bool, bool], n_k: int
) -> _MultiDimState:
    """One worker's workspaces and gradient accumulators for the backward pass."""
    need_q, need_k, need_W, need_v = needs
    like = plan.hidden.qf
    B, d_w, d_v = like.shape[0], like.shape[2], plan.v.shape[2]
    need_u = need_q or need_k

    def zeros(*shape: int) -> Tensor:
        return torch.zeros(shape, dtype=like.dtype, device=like.device)

    return _MultiDimState(
        ubuf=_workspace(plan.tiles, n_k * d_w, like),
        ebuf=_workspace(plan.tiles, n_k * d_v, like),
        dbuf=_workspace(plan.tiles, n_k * d_v, like) if need_u or need_W else None,
        gbuf=_workspace(plan.tiles, n_k * d_w, like) if need_u and act.name else None,
        gk=zeros(B, n_k, d_w) if need_k else None,
        gW=zeros(d_w, d_v) if need_W else None,
        gv=zeros(B, n_k, d_v) if need_v else None,
    )


def _multi_dim_hidden_grad(
    plan: _MultiDimPlan,
    act: _Act,
    st: _MultiDimState,
    ge: Tensor,
    t_graph: Tensor,
    u: Tensor | None,
) -> Tensor:
    """The gradient with respect to a tile's pre-activation, from the gradient of its
    scores ``ge`` ``[rows * n_k, d_v]`` (``u``: the leaf of a checkpointed activation)."""
    t = t_graph.detach()
    if u is not None:  # checkpointed activation
        gt = torch.mm(ge, plan.w_eff.t()).view(t.shape)
        (gu,) = torch.autograd.grad(t_graph, u, gt)
        return gu
    assert st.gbuf is not None
    gu = torch.mm(ge, plan.w_eff.t(), out=_mat(st.gbuf[: t.numel()].view(t.shape)))
    gu = gu.view(t.shape)
    deriv = act.derivative_(t)
    if deriv is not None:
        gu.mul_(deriv)
    return gu


def _multi_dim_backward(
    q1: Tensor,
    k2: Tensor,
    W_d: Tensor,
    v: Tensor,
    mask: Tensor | None,
    ctx_out: Tensor,
    den: Tensor,
    shift: Tensor | None,
    grad_c: Tensor,
    act: _Act,
    chunk: int,
    needs: tuple[bool, bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    B, n_q, d_w = q1.shape
    n_k = v.shape[1]
    need_q, need_k = needs[0], needs[1]
    plan = _multi_dim_plan(q1, k2, W_d, v, mask, act, chunk)
    ct, dev = plan.hidden.qf.dtype, plan.hidden.qf.device
    # the softmax weights are a = 2^(e2 - shift) / den: fold 1/den into the incoming gradient
    h = grad_c.to(ct) / den.masked_fill(den == 0, 1.0)
    gq = torch.zeros(B, n_q, d_w, dtype=ct, device=dev) if need_q else None
    need_u = need_q or need_k

    def job(tile: Tile, st: _MultiDimState) -> None:
        b0, b1, i0, i1 = tile
        t_graph, u = plan.hidden.tile(st.ubuf, tile, grad=need_u)
        t = t_graph.detach()
        q = _scores_exp2_(plan, t, st.ebuf, tile, shift, fresh=False)
        q.mul_(h[b0:b1, i0:i1, None])  # q = a * grad_c
        if st.gv is not None:
            st.gv[b0:b1] += q.sum(1)
        if st.dbuf is None:  # neither the scores' inputs nor W_d need a gradient
            return
        diff = st.dbuf[: q.numel()].view(q.shape)
        torch.sub(plan.v[b0:b1, None], ctx_out[b0:b1, i0:i1, None], out=diff)
        ge = _mat(q.mul_(diff))  # gradient of the scores: a * g * (v_j - c_i)
        if st.gW is not None:
            st.gW.addmm_(_mat(t).t(), ge)
        if need_u:
            gu = _multi_dim_hidden_grad(plan, act, st, ge, t_graph, u)
            _reduce_hidden_grad(gu, gq, st.gk, tile)

    states = _run_tiles(
        plan.tiles, plan.workers, job, lambda: _multi_dim_state(plan, act, needs, n_k)
    )
    gk = _sum_states([st.gk for st in states])
    gW = _sum_states([st.gW for st in states])
    gv = _sum_states([st.gv for st in states])
    # gu is the gradient with respect to the tile's pre-activation, act.scale * (q1 + k2)
    if act.scale != 1.0:
        _scale_(act.scale, gq, gk)
    if gW is not None and act.name == "tanh":
        # e = (2 s - 1) @ W_d: dW_d = 2 s^T ge - 1^T ge, and 1^T ge = 0 (shift invariance)
        gW.mul_(2.0)
    return _cast(gq, q1), _cast(gk, k2), _cast(gW, W_d), _cast(gv, v)


def _multi_dim_graph_backward(ctx: FunctionCtx, grad_c: Tensor) -> tuple[Tensor | None, ...]:
    """:class:`_MultiDimFn`'s gradients under ``create_graph=True``: by the broadcast
    formula, differentiable again (``b_d`` cancels in the softmax: a zero gradient)."""
    q1, k2, W_d, v, mask = ctx.saved_tensors[:5]  # type: ignore[attr-defined]
    act = ctx.act  # type: ignore[attr-defined]
    gq, gk, gW, gv = _graph_grads(
        ctx,
        lambda a, b, c, d: _multi_dim_traceable(a, b, c, d, mask, act),
        (q1, k2, W_d, v),
        grad_c,
    )
    return gq, gk, gW, _bias_grad(ctx), gv, None, None, None


def _bias_grad(ctx: FunctionCtx) -> Tensor | None:
    """``b_d``'s gradient in :class:`_MultiDimFn` where it is needed."""
    needed = ctx.needs_input_grad[3]  # type: ignore[attr-defined]
    return _zero_bias_grad(ctx.b_d_meta) if needed else None  # type: ignore[attr-defined]


def _zero_bias_grad(meta: tuple[Any, ...] | None) -> Tensor | None:
    """The gradient of a score bias ``b_d`` that cancels in the softmax over the keys:
    zeros of its ``(shape, dtype, device)`` (``meta``), or ``None`` without one."""
    if meta is None:
        return None
    shape, dtype, device = meta
    return torch.zeros(shape, dtype=dtype, device=device)


class _MultiDimFn(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        q1: Tensor,
        k2: Tensor,
        W_d: Tensor,
        b_d: Tensor | None,
        v: Tensor,
        mask: Tensor | None,
        act: _Act,
        chunk: int,
    ) -> Tensor:
        c, den, shift = _multi_dim_forward(q1, k2, W_d, v, mask, act, chunk)
        ctx.save_for_backward(q1, k2, W_d, v, mask, c, den, shift)
        ctx.act, ctx.chunk = act, chunk  # type: ignore[attr-defined]
        ctx.b_d_meta = None if b_d is None else (b_d.shape, b_d.dtype, b_d.device)  # type: ignore[attr-defined]
        return c.to(q1.dtype)

    @staticmethod
    @_differentiable_again(_multi_dim_graph_backward)
    def backward(ctx: FunctionCtx, grad_c: Tensor) -> tuple[Tensor | None, ...]:
        q1, k2, W_d, v, mask, c, den, shift = ctx.saved_tensors  # type: ignore[attr-defined]
        n = ctx.needs_input_grad  # type: ignore[attr-defined]
        act, chunk = ctx.act, ctx.chunk  # type: ignore[attr-defined]
        needs = (n[0], n[1], n[2], n[4])
        gq, gk, gW, gv = _multi_dim_backward(
            q1, k2, W_d, v, mask, c, den, shift, grad_c, act, chunk, needs
        )
        return gq, gk, gW, _bias_grad(ctx), gv, None, None, None


def multi_dim_attend_lean(
    q1: Tensor,
    k2: Tensor,
    W_d: Tensor,
    b_d: Tensor | None,
    v: Tensor,
    mask: Tensor | None = None,
    act: str | Callable[[Tensor], Tensor] = "tanh",
    chunk_elems: int | None = None,
) -> Tensor:
    """Multi-dimensional (feature-wise) additive attention, fused and memory-lean.

    ``e[b, i, j, :] = act(q1[b, i] + k2[b, j]) @ W_d + b_d``;
    ``a[b, i, :, f] = softmax_j e[b, i, j, f]`` over the keys allowed by ``mask``;
    ``c[b, i, f] = sum_j a[b, i, j, f] * v[b, j, f]``.

    This is the multi-dimensional attention of Shen et al. (2018), *DiSAN: Directional
    Self-Attention Network for RNN/CNN-Free Language Understanding*: every feature ``f`` of
    the values gets its own alignment distribution over the keys. The textbook form holds
    ``[B, n_q, n_k, d_v]`` scores and weights (and ``[B, n_q, n_k, d_w]`` hidden
    activations) several times over for autograd; this kernel holds none of them (see the
    module docstring for how).

    Args:
        q1: ``[B, n_q, d_w]`` projected queries (``W1 q + b``).
        k2: ``[B, n_k, d_w]`` projected keys (``W2 k``).
        W_d: ``[d_w, d_v]`` the feature-wise score matrix.
        b_d: ``[d_v]`` score bias or ``None``. It is constant across keys and therefore
            cancels in the softmax: the output does not depend on it and its gradient is
            zero (it is accepted for parity with the paper's formula).
        v: ``[B, n_k, d_v]`` values.
        mask: bool, ``True`` = may attend, broadcastable to ``[B, n_q, n_k]`` (see
            :mod:`attnlab.masks`), or ``None``. A query row with no allowed key gets a zero
            context and zero gradients, never NaN. Keys and values that no query may
            attend, and query rows with no allowed key, never matter, whatever they hold.
        act: activation name or callable, as in :func:`additive_score_lean`.
        chunk_elems: about how many elements one tile's ``[B_tile, rows, n_k, d_w]`` (and
            ``[..., d_v]``) intermediate may hold; default :data:`DEFAULT_CHUNK_ELEMS`.

    Returns:
        ``c``: ``[B, n_q, d_v]`` in the dtype of ``q1`` (``bfloat16``/``float16`` inputs,
        softmax included, are computed in float32). ``n_k = 0`` gives zeros.

    Cost: time ``O(B n_q n_k d_w d_v)`` (the per-pair product with ``W_d``) in the forward
    pass and about three times that in the backward pass (recompute, then two products);
    memory ``O(B n_q d_v + chunk)``: the context, the softmax normalisers and a few tile
    workspaces per worker thread.

    Gradients flow to ``q1``, ``k2``, ``W_d``, ``b_d`` and ``v``; under
    ``create_graph=True`` the backward pass differentiates the broadcast formula instead
    (exact second derivatives, its memory).
    """
    amp = _autocast_device(q1)
    if amp is not None:  # as torch.nn layers: every input in the autocast dtype
        q1, k2, W_d, b_d, v = _to_autocast_dtype(amp, q1, k2, W_d, b_d, v)
    q1, k2, W_d, b_d, v = _check_multi_dim(q1, k2, W_d, b_d, v)
    B, n_q, _ = q1.shape
    mask = normalize_mask(mask, B, n_q, k2.shape[1], device=q1.device, name="mask")
    # padded keys / values and fully masked query rows may hold anything (NaN, inf): the
    # kernel multiplies zero weights by the values, so clear them first
    q1c, k2, v = clear_attention_inputs(q1, k2, v, mask)
    assert q1c is not None
    spec = _resolve_act(act)
    chunk = _check_chunk(chunk_elems)
    # the kernels pick their own precision (float32 for half inputs): autocast off inside
    with torch.autocast(q1.device.type, enabled=False):
        if is_traced():  # torch.compile, torch.export, torch.func: the formula
            return _multi_dim_traceable(q1c, k2, W_d, v, mask, spec)
        return _MultiDimFn.apply(q1c, k2, W_d, b_d, v, mask, spec, chunk)


def _check_multi_dim(
    q1: object, k2: object, W_d: object, b_d: object, v: object
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """The inputs of :func:`multi_dim_attend_lean`, checked: tensors of ``q1``'s dtype and
    device with the shapes of its docstring."""
    q1, k2 = _check_qk(q1, k2)
    B, _, d_w = q1.shape
    n_k = k2.shape[1]
    W_d = _check_tensor(W_d, "W_d", q1)
    if W_d.dim() != 2 or W_d.shape[0] != d_w:
        raise _shape_error("W_d", W_d, "[d_w, d_v]", [d_w, None])
    d_v = W_d.shape[1]
    if b_d is not None:
        b_d = _check_tensor(b_d, "b_d", q1)
        if b_d.dim() != 1 or b_d.shape[0] != d_v:
            raise _shape_error("b_d", b_d, "[d_v]", [d_v])
    v = _check_tensor(v, "v", q1)
    if v.dim() != 3 or tuple(v.shape) != (B, n_k, d_v):
        raise _shape_error("v", v, "[B, n_k, d_v]", [B, n_k, d_v])
    return q1, k2, W_d, b_d, v


def _multi_dim_traceable(
    q1: Tensor, k2: Tensor, W_d: Tensor, v: Tensor, mask: Tensor | None, act: _Act
) -> Tensor:
    """:func:`multi_dim_attend_lean` as plain tensor ops, for :func:`torch.compile` (one
    graph: no worker threads, no host synchronisation). The softmax over the keys runs in
    float32 for half-precision inputs; a query row without an allowed key gets zeros.
    (``b_d`` cancels in the softmax: it is no input here.)"""
    ct = _compute_dtype(q1.dtype)
    hidden = act.fn(q1.to(ct)[:, :, None, :] + k2.to(ct)[:, None, :, :])  # [B, n_q, n_k, d_w]
    e = torch.matmul(hidden, W_d.to(ct))  # [B, n_q, n_k, d_v]; b_d cancels in the softmax
    if mask is not None:
        e = e.masked_fill(~mask[..., None], -math.inf)
    top = e.amax(2, keepdim=True)
    p = torch.exp(e - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
    den = p.sum(2)  # [B, n_q, d_v]; 0 for a row without an allowed key
    num = (p * v.to(ct)[:, None, :, :]).sum(2)
    c = num / torch.where(den > 0, den, torch.ones_like(den))
    return c.to(q1.dtype)
