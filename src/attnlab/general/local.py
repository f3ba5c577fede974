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

import torch
from torch import Tensor

from attnlab._checks import softmax_dtype
from attnlab.general.alignment import _check_window, masked_softmax

__all__ = ["local_window_attend"]


def _gather_rows(x: Tensor, idx: Tensor) -> Tensor:
    """``x`` ``[B, n, d]``, ``idx`` ``[B, n_q, W]`` -> ``[B, n_q, W, d]``; index ``n``
    reads a row of zeros (appended here)."""
    B, n_q, W = idx.shape
    x = torch.cat([x, x.new_zeros(x.shape[0], 1, x.shape[-1])], 1)
    flat = idx.reshape(B, n_q * W, 1).expand(x.shape[0], -1, x.shape[-1])
    return x.gather(1, flat).reshape(B, n_q, W, x.shape[-1])


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
    The weights equal :func:`attnlab.general.alignment.local_align` on the full scores.
    An empty window (no existing, allowed key within ``D`` of the centre) and an empty
    key set give zero weights and a zero context. A window slot that is out of range, out
    of the window or masked for that query reads a row of zeros, not the key, and the
    query of an empty window is set to zero before it is scored: what masked positions
    hold (NaN, inf) never reaches the context or the gradients. Half-precision inputs: the window, the
    softmax and the Gaussian are computed in float32. ``D`` must be an int >= 1 and
    ``center`` ``[B, n_q]``, else ``ValueError``.
    """
    _check_window(D)
    B, n_q, _ = q.shape
    n_k = k.shape[1]
    if center.shape != (B, n_q):
        raise ValueError(
            f"center has shape {tuple(center.shape)}, expected [B, n_q] = [{B}, {n_q}]"
        )
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
    context = (a_used.unsqueeze(-2) @ v_win).squeeze(-2)
    dense = None
    if need_weights:
        dense = a.new_zeros(B, n_q, n_k)
        # invalid slots carry weight 0, so scattering them onto clamped indices is harmless
        dense = dense.scatter_add(2, safe, a * valid)
    return context, dense, a
