"""Local-m / local-p attention on FlexAttention's sliding window (the CUDA path).

The window of query ``i`` is the keys ``l`` with ``|l - p_i| <= D`` (and allowed by the
mask); FlexAttention's block mask skips every key block outside it, so the cost is that of
the ``2D + 1`` window keys, linear in ``n``. Local-p multiplies each window weight by
``g_l = exp(-(l - p)^2 / (2 sigma^2))`` *after* the softmax, without renormalising:

    c = sum_l softmax_window(e)_l g_l v_l = out_2 * exp(lse_2 - lse_1)

where pass 1 gives ``lse_1``, the log-sum-exp of the window scores, and pass 2 runs with
the score ``e_l + log g_l`` (``out_2``, ``lse_2``). The centres and the Gaussian are in
float32 whatever the input dtype. A query whose window is empty gets a zero context
(``lse_1 = -inf``), without a host synchronisation.

:class:`attnlab.Attention` takes this path on CUDA (see :mod:`attnlab.general.planner`);
on CPU it runs FlexAttention's unfused reference implementation (used by the tests).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

__all__ = ["local_flex_attend"]

_COMPILED: dict[str, Any] = {}


def _flex(compiled: bool) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


def local_flex_attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    centers: Tensor,
    D: int,
    mask: Tensor | None = None,
    gaussian: bool = False,
    *,
    compiled: bool | None = None,
    static_window: bool = False,
) -> Tensor:
    """``sum_l softmax_window(scale q^T k)_l (g_l) v_l`` over ``|l - p| <= D``.

    Args:
        q: ``[B, n_q, d]``; k: ``[B, n_k, d]``; v: ``[B, n_k, d_v]`` (one dtype).
        scale: the factor of ``q^T k`` (the score's dot form).
        centers: window centres ``[B, n_q]`` (float; gradients reach them through the
            Gaussian).
        D: half window width. mask: bool broadcastable to ``[B, n_q, n_k]``.
        gaussian: apply local-p's Gaussian factor after the softmax.
        compiled: run ``torch.compile(flex_attention)`` (default: on CUDA).
        static_window: the centres are the query positions ``0 .. n_q - 1`` and there is
            no mask (local-m's default): the block mask ``|i - l| <= D`` is the same for
            every call of these sizes and is built once and cached.

    Returns the context ``[B, n_q, d_v]`` in ``v``'s dtype.
    """
    from torch.nn.attention.flex_attention import AuxRequest

    if compiled is None:
        compiled = q.device.type == "cuda"
    p = centers.to(torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the unfused CPU reference warns
        block = _block_mask(p.detach(), k.shape[1], D, mask, static_window)
        flex = _flex(compiled)
        q4, k4, v4 = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        out1, aux1 = flex(
            q4, k4, v4, block_mask=block, scale=scale, return_aux=AuxRequest(lse=True)
        )
        lse1 = aux1.lse  # [B, 1, n_q], float32
        if gaussian:
            ctx = _gaussian_pass(flex, q4, k4, v4, block, scale, p, D, lse1)
        else:
            ctx = out1.to(torch.float32)
    empty = (lse1 == float("-inf")).unsqueeze(-1)  # a window with no allowed key
    ctx = torch.where(empty, ctx.new_zeros(()), ctx)
    return ctx.squeeze(1).to(v.dtype)


def _block_mask(p: Tensor, n_k: int, D: int, mask: Tensor | None, static_window: bool) -> Any:
    """FlexAttention's block mask of the windows ``|l - p_i| <= D`` (``p`` ``[B, n_q]``,
    detached) and ``mask``; with ``static_window`` (and no mask) the band ``|i - l| <= D``,
    built once per size and device and cached."""
    from torch.nn.attention.flex_attention import create_block_mask

    B, n_q = p.shape
    if static_window and mask is None:
        key = ("window", n_q, n_k, D, str(p.device))
        if key not in _COMPILED:

            def band(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
                return (ki - qi).abs() <= D

            _COMPILED[key] = create_block_mask(band, None, None, n_q, n_k, device=p.device)
        return _COMPILED[key]
    full = None if mask is None else torch.broadcast_to(mask, (B, n_q, n_k))

    def window(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        inside = (ki - p[b, qi]).abs() <= D
        return inside if full is None else inside & full[b, qi, ki]

    # data-dependent centres: built per call, on CUDA without materialising [B, n_q, n_k]
    # (compiled)
    cuda = p.device.type == "cuda"
    return create_block_mask(window, B, None, n_q, n_k, device=p.device, _compile=cuda)


def _gaussian_pass(
    flex: Any,
    q4: Tensor,
    k4: Tensor,
    v4: Tensor,
    block: Any,
    scale: float,
    p: Tensor,
    D: int,
    lse1: Tensor,
) -> Tensor:
    """Local-p: the second pass, with the score ``e_l - (l - p)^2 / (2 sigma^2)``, rescaled
    by ``exp(lse_2 - lse_1)`` to the softmax of the first pass times the Gaussian (float32)."""
    from torch.nn.attention.flex_attention import AuxRequest

    inv = 1.0 / (2 * (D / 2) ** 2)

    def gauss(score: Tensor, b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return score - (ki - p[b, qi]) ** 2 * inv

    out2, aux2 = flex(
        q4, k4, v4, score_mod=gauss, block_mask=block, scale=scale, return_aux=AuxRequest(lse=True)
    )
    factor = torch.exp(aux2.lse - lse1)
    return out2.to(torch.float32) * factor.unsqueeze(-1)
