"""Textbook references of additive-family attention shared by the tests of its fused and
Triton implementations (tests/general/test_fused.py, tests/general/test_flash_additive.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["ref_multi_dim"]


def ref_multi_dim(
    q1: Tensor,
    k2: Tensor,
    W_d: Tensor,
    b_d: Tensor | None,
    v: Tensor,
    mask: Tensor | None,
    fn: Callable[[Tensor], Tensor],
) -> tuple[Tensor, Tensor]:
    """Multi-dimensional additive attention by broadcasting: the scores ``e = fn(q1_i +
    k2_j) W_d (+ b_d)`` ``[B, n_q, n_k, d_v]``, a softmax over the keys per feature (keys
    the bool ``mask`` ``[B, n_q, n_k]`` forbids get weight 0; a row without any key gets
    zero weights), the context ``sum_j a_ij * v_j``. Returns ``(context, weights)``."""
    e = fn(q1[:, :, None, :] + k2[:, None, :, :]) @ W_d  # [B, n_q, n_k, d_v]
    if b_d is not None:
        e = e + b_d
    if mask is not None:
        e = e.masked_fill(~mask[..., None], float("-inf"))
    a = torch.softmax(e, dim=2).nan_to_num(0.0)  # rows without any key: zero weights
    return (a * v[:, None, :, :]).sum(2), a
