"""Local attention that scores only the window: O(n_q D) instead of O(n_q n_k).

Luong et al. (2015) restrict each query's alignment to the keys ``l`` with
``|l - p| <= D`` around a centre ``p`` (local-m: the output position; local-p: a predicted
position). Computing all ``n_k`` scores and masking the rest costs O(n_q n_k); this module
gathers the at most ``2D + 1`` keys of each window and scores only those, so time and
memory are O(B n_q D (d_k + d_v)) and grow linearly with ``n_k`` only through the inputs.
Any score module works: each query is scored against its own gathered window.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor

from attnlab._checks import check_dropout, check_flags, softmax_dtype
from attnlab.general.alignment import _check_window, masked_softmax

__all__ = ["local_window_attend", "window_dot_score"]


def _gather_rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x`` ``[B, n, d]``, ``idx`` ``[B, n_q, W]`` -> ``[B, n_q, W, d]``; index ``n``
    reads a row of zeros (appended here)."""
    B, n_q, W = idx.shape
    n, d = x.shape[1] + 1, x.shape[-1]
    x = torch.cat([x, x.new_zeros(x.shape[0], 1, d)], 1)
    # whole rows of the flattened [B (n + 1), d] keys: index_select copies each row at once,
    # where gather with an index expanded over the features reads element by element
    rows = idx + torch.arange(B, device=idx.device).view(B, 1, 1) * n
    return x.reshape(B * n, d).index_select(0, rows.reshape(-1)).reshape(B, n_q, W, d)


def window_dot_score(q: Tensor, k: Tensor, scale: float = 1.0) -> Tensor:
    """The score function of :func:`local_window_attend` for a dot-product score in its
    dot form: ``scale * q^T k_l`` for ``q`` ``[N, 1, d]`` and its window ``k`` ``[N, W, d]``
    -> ``[N, 1, W]``, in float32 for half-precision inputs. A product summed over the
    features, not ``N`` tiny ``[1, d] @ [d, W]`` matmuls (which CPU ``bmm`` and its
    backward run one by one)."""
    work = softmax_dtype(q.dtype)
    e = (q.to(work) * k.to(work)).sum(-1).unsqueeze(-2)
    return e * scale if scale != 1.0 else e


def _window_slots(
    p: Tensor, D: int, n_k: int, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``W = 2D + 1`` slots of the windows around the centres ``p`` ``[B, n_q]``:
    their key indices clamped into range, their distances ``l - p`` (in ``p``'s dtype) and
    whether they hold an existing, allowed key within ``D`` of the centre, each
    ``[B, n_q, W]``."""
    B, n_q = p.shape
    offsets = torch.arange(2 * D + 1, device=p.device)
    start = torch.ceil(p.detach() - D).to(torch.long)
    idx = start.unsqueeze(-1) + offsets  # [B, n_q, W]
    dist = idx.to(p.dtype) - p.unsqueeze(-1)
    valid = (dist.abs() <= D) & (idx >= 0) & (idx < n_k)
    safe = idx.clamp(0, max(n_k - 1, 0))
    if mask is not None:
        full = torch.broadcast_to(mask, (B, n_q, n_k))
        valid = valid & full.gather(2, safe)
    return safe, dist, valid


#: The most elements a window-sized temporary (``[B, rows, W, d]``) of one call may hold:
#: 16 MiB of float32, under glibc's ``mmap`` threshold (at most 32 MiB), so that the
#: temporaries come from the heap and are reused, not mapped and zero-filled afresh at every
#: call (which made the CPU time of long sequences grow faster than linearly).
WINDOW_CHUNK_ELEMENTS = 1 << 22


def _query_chunk(B: int, W: int, d: int) -> int:
    """How many query rows one chunk of :func:`local_window_attend` takes."""
    return max(1, WINDOW_CHUNK_ELEMENTS // max(1, B * W * d))


def _query_rows(mask: Tensor | None, start: int, rows: int) -> Tensor | None:
    """The rows ``start .. start + rows`` of a mask broadcastable to ``[B, n_q, n_k]``."""
    if mask is None or mask.dim() < 2 or mask.shape[-2] == 1:
        return mask
    return mask[..., start : start + rows, :]


def _check_center(center: Tensor, B: int, n_q: int) -> None:
    if center.shape != (B, n_q):
        raise ValueError(
            f"center has shape {tuple(center.shape)}, expected [B, n_q] = [{B}, {n_q}]"
        )


def _in_chunks(
    one: Callable[..., tuple[Tensor, Tensor | None, Tensor]],
    q: Tensor,
    center: Tensor,
    mask: Tensor | None,
    rows: int,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """:func:`local_window_attend`'s outputs from ``one(q=, center=, mask=)`` on chunks of
    ``rows`` query rows, concatenated (the results are those of one pass)."""
    parts = [
        one(q=q[:, s : s + rows], center=center[:, s : s + rows], mask=_query_rows(mask, s, rows))
        for s in range(0, q.shape[1], rows)
    ]
    dense = torch.cat([p[1] for p in parts], 1) if need_weights else None  # type: ignore[misc]
    return torch.cat([p[0] for p in parts], 1), dense, torch.cat([p[2] for p in parts], 1)


def _check_settings(D: int, gaussian: bool, need_weights: bool, dropout_p: float) -> None:
    """The settings of :func:`local_window_attend`, each refused with one line naming it."""
    _check_window(D)
    check_flags(gaussian=gaussian, need_weights=need_weights)
    check_dropout(dropout_p, "dropout_p")


def local_window_attend(
    score: Callable[[Tensor, Tensor], Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    center: Tensor,
    D: int,
    mask: Tensor | None = None,
    gaussian: bool = True,
    need_weights: bool = False,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Local attention over the window ``|l - p| <= D`` only.

    Args:
        score: a score function ``(q [N, 1, d_q], k [N, W, d_k]) -> [N, 1, W]``.
        q: ``[B, n_q, d_q]``; k: ``[B, n_k, d_k]``; v: ``[B, n_k, d_v]``.
        center: window centres ``[B, n_q]`` (float).
        D: half window width.
        mask: bool broadcastable to ``[B, n_q, n_k]``.
        gaussian: multiply by ``exp(-(l - p)^2 / (2 (D/2)^2))`` after the softmax.
        need_weights: also scatter the weights into a dense ``[B, n_q, n_k]`` tensor.
        dropout_p: dropout on the window weights before the weighted sum (the returned
            weights are the ones before dropout).

    Returns ``(context [B, n_q, d_v], dense weights or None, window weights [B, n_q, W])``.
    Cost: O(B n_q (2D + 1) (d_k + d_v)) time and O(B n_q (2D + 1)) memory for the window
    (``W = 2 D + 1``), plus O(B n_q n_k) for the dense weights when they are asked for.
    The weights equal :func:`attnlab.general.alignment.local_align` on the full scores. An empty
    window (no existing, allowed key within ``D`` of the centre) and an empty key set give zero
    weights and a zero context. A window slot that is out of range, out of the window or masked
    for that query reads a row of zeros, not the key, and the query of an empty window is set to
    zero before it is scored: what masked positions hold (NaN, inf) never reaches the context or
    the gradients. Half-precision inputs: the window, the softmax and the Gaussian are computed
    in float32. ``D`` must be an int >= 1, ``center`` ``[B, n_q]``, ``dropout_p`` in ``[0, 1)``
    (``ValueError``), the switches bools (``TypeError``). Long query sequences run in chunks of
    query rows whose window tensors stay under :data:`WINDOW_CHUNK_ELEMENTS` (same results).
    """
    _check_settings(D, gaussian, need_weights, dropout_p)
    B, n_q, _ = q.shape
    _check_center(center, B, n_q)
    rows = _query_chunk(B, 2 * D + 1, max(k.shape[-1], v.shape[-1]))
    if n_q > rows:  # window-sized temporaries under the allocator's threshold
        one = partial(local_window_attend, score, k=k, v=v, D=D, gaussian=gaussian)
        one = partial(one, need_weights=need_weights, dropout_p=dropout_p)
        return _in_chunks(one, q, center, mask, rows, need_weights)
    n_k = k.shape[1]
    W = 2 * D + 1
    if n_k == 0:  # no keys: every window is empty
        context = v.new_zeros(B, n_q, v.shape[-1])
        dense = v.new_zeros(B, n_q, 0) if need_weights else None
        return context, dense, v.new_zeros(B, n_q, W)
    # positions, softmax and Gaussian in float32 for half inputs (a bf16 centre would be
    # rounded to a multiple of 0.5 beyond position 128)
    work = softmax_dtype(q.dtype)
    safe, dist, valid = _window_slots(center.to(work), D, n_k, mask)
    # invalid slots read an appended zero row (where, not a zero weight times the key:
    # 0 * NaN = NaN), and a query with an empty window is cleared the same way
    slot = torch.where(valid, safe, n_k)
    k_win = _gather_rows(k, slot)
    v_win = _gather_rows(v, slot)
    q = torch.where(valid.any(-1, keepdim=True), q, q.new_zeros(()))
    e = score(q.reshape(B * n_q, 1, q.shape[-1]), k_win.reshape(B * n_q, W, k.shape[-1]))
    e = e.reshape(B, n_q, W)
    a = masked_softmax(e.to(work), valid)
    if gaussian:
        sigma = D / 2
        a = a * torch.exp(-(dist**2) / (2 * sigma**2))
    a = a.to(v.dtype)
    a_used = torch.nn.functional.dropout(a, dropout_p, True) if dropout_p > 0 else a
    # a broadcast product summed over the window, not a batched [1, W] @ [W, d_v] matmul
    # (for B n_q tiny matrices CPU bmm and its backward loop over them one by one); the
    # products are summed in float32 for half inputs, as a matmul accumulates them
    context = (a_used.to(work).unsqueeze(-1) * v_win.to(work)).sum(-2).to(v.dtype)
    dense = None
    if need_weights:
        dense = a.new_zeros(B, n_q, n_k)
        # invalid slots carry weight 0, so scattering them onto clamped indices is harmless
        dense = dense.scatter_add(2, safe, a * valid)
    return context, dense, a
