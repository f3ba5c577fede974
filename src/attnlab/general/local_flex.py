"""Local-m attention on FlexAttention's sliding window (the CUDA path).

The window of query ``i`` is the keys ``l`` with ``|l - p_i| <= D`` (and allowed by the
mask); FlexAttention's block mask skips every key block outside it, so the cost is that of
the ``2D + 1`` window keys, linear in ``n``. A query whose window is empty gets a zero
context (its log-sum-exp is ``-inf``), without a host synchronisation.

:class:`attnlab.Attention` takes this path on CUDA for local-m without the Gaussian factor
(see :mod:`attnlab.general.planner`); on CPU it runs FlexAttention's unfused reference
implementation (used by the tests). Local-p is not computed here: its Gaussian factor as a
second FlexAttention pass with a ``score_mod`` gave wrong results on an H200 (torch 2.11,
docs/benchmarks.md), so it takes the gathered window (:mod:`attnlab.general.local`).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["local_flex_attend"]

_COMPILED: dict[str, Any] = {}

#: how many band block masks (one per query / key length, window and device) are kept
_BANDS_KEPT = 64
_BANDS: dict[tuple[int, int, int, str], Any] = {}


def _flex(compiled: bool) -> Any:
    """FlexAttention, compiled (its fused kernel) or not (the unfused reference).

    Compiled with PyTorch's automatic dynamic shapes: the first sizes get a static
    kernel, and the first call with other sizes recompiles once with symbolic lengths
    that serve every later length. (``dynamic=False``, one kernel per length, recompiled
    at every new length until Dynamo's recompile limit, 8, and then ran FlexAttention
    unfused for every new length: the full score matrix, in a model fed batches of
    varying length.)"""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention)
    return _COMPILED["flex"]


def local_flex_attend(
    q: Tensor, k: Tensor, v: Tensor, scale: float, centers: Tensor, D: int,
    mask: Tensor | None = None, *, static_window: bool = False,
) -> Tensor:  # fmt: skip
    """``sum_l softmax_window(scale q^T k)_l v_l`` over ``|l - p| <= D``.

    Args:
        q: ``[B, n_q, d]``; k: ``[B, n_k, d]``; v: ``[B, n_k, d_v]`` (one dtype).
        scale: the factor of ``q^T k`` (the score's dot form).
        centers: window centres ``[B, n_q]`` (float; they only select keys: no gradient
            reaches them).
        D: half window width. mask: bool broadcastable to ``[B, n_q, n_k]``.
        static_window: the centres are the query positions ``0 .. n_q - 1`` and there is
            no mask (local-m's default): the block mask ``|i - l| <= D`` is the same for
            every call of these sizes and is kept between calls (:func:`_band`).

    Returns the context ``[B, n_q, d_v]`` in ``v``'s dtype. On CUDA FlexAttention runs
    compiled (its fused kernel), on the CPU as its unfused reference.
    """
    from torch.nn.attention.flex_attention import AuxRequest

    p = centers.detach().to(torch.float32)
    n_q, n_k = q.shape[1], k.shape[1]
    # the band |i - l| <= D has no empty window while n_q <= n_k + D: then no log-sum-exp
    # and no zeroing are needed
    may_be_empty = not (static_window and mask is None and n_q <= n_k + D)
    on_cuda = q.device.type == "cuda"
    with contextlib.nullcontext() if on_cuda else warnings.catch_warnings():
        if not on_cuda:  # the unfused CPU reference warns (catch_warnings costs host time)
            warnings.simplefilter("ignore", UserWarning)
        block = _block_mask(p, n_k, D, mask, static_window)
        flex = _flex(on_cuda)
        q4, k4, v4 = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        if not may_be_empty:
            return flex(q4, k4, v4, block_mask=block, scale=scale).squeeze(1).to(v.dtype)
        out, aux = flex(q4, k4, v4, block_mask=block, scale=scale, return_aux=AuxRequest(lse=True))
    empty = (aux.lse == float("-inf")).unsqueeze(-1)  # a window with no allowed key
    return torch.where(empty, out.new_zeros(()), out).squeeze(1).to(v.dtype)


def _block_mask(p: Tensor, n_k: int, D: int, mask: Tensor | None, static_window: bool) -> Any:
    """FlexAttention's block mask of the windows ``|l - p_i| <= D`` (``p`` ``[B, n_q]``,
    detached) and ``mask``; with ``static_window`` (and no mask) the band ``|i - l| <= D``,
    kept for the last ``_BANDS_KEPT`` sizes (:func:`_band`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, n_q = p.shape
    if static_window and mask is None:
        return _band(n_q, n_k, D, str(p.device))
    full = None if mask is None else torch.broadcast_to(mask, (B, n_q, n_k))

    def window(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        inside = (ki - p[b, qi]).abs() <= D
        return inside if full is None else inside & full[b, qi, ki]

    # data-dependent centres: built per call, on CUDA without materialising [B, n_q, n_k]
    # (compiled once; the compiled function is reused for every closure)
    if p.device.type != "cuda":
        return create_block_mask(window, B, None, n_q, n_k, device=p.device)
    if "block_mask" not in _COMPILED:
        _COMPILED["block_mask"] = torch.compile(create_block_mask)
    return _COMPILED["block_mask"](window, B, None, n_q, n_k, device=p.device)


def _band(n_q: int, n_k: int, D: int, device: str) -> Any:
    """The block mask of the band ``|i - l| <= D`` for these sizes: built once and kept in
    eager mode (the last ``_BANDS_KEPT`` sizes, so a model fed batches of every length
    keeps a bounded number); built in the graph under ``torch.compile`` (a cache keyed by
    symbolic sizes would make them constants: a graph per length)."""
    if torch.compiler.is_compiling():
        return _make_band(n_q, n_k, D, device)
    key = (n_q, n_k, D, device)
    band = _BANDS.pop(key, None)
    if band is None:
        band = _make_band(n_q, n_k, D, device)
    _BANDS[key] = band  # the most recently used last
    while len(_BANDS) > _BANDS_KEPT:
        del _BANDS[next(iter(_BANDS))]
    return band


def _make_band(n_q: int, n_k: int, D: int, device: str) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    def band(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return (ki - qi).abs() <= D

    return create_block_mask(band, None, None, n_q, n_k, device=device)
