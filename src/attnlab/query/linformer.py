"""Linformer attention (Wang et al. 2020): low-rank projection of the keys and values
along the sequence axis.

Per head, with ``K = W_K F`` and ``V = W_V F`` ``[n, d_head]`` and two learned projections
``E, F_p`` ``[k, n_max]`` (``k`` = ``proj_len``, sliced to the first ``n`` columns):

    K' = E K     V' = F_p V          [k, d_head]
    c_i = sum_s softmax_s(q_i^T K'_s / sqrt(d_head)) V'_s
    output = W_O concat_heads(c)

so each query scores ``k`` projected "positions" instead of ``n`` keys. ``share`` picks
the parameter sharing of the paper: ``"none"`` (``E^(j), F^(j)`` per head),
``"headwise"`` (one ``E`` and one ``F_p`` for all heads; the default) or
``"key-value"`` (one matrix, ``E = F_p``, for keys, values and all heads). The
projected attention is a plain scaled dot product and runs on the fused SDPA path.

**Padding.** Masked keys are removed *before* the projection: their rows of ``K`` and ``V``
are set to zero, so they add nothing to ``K'`` and ``V'``. The result for a sequence
padded to ``n`` equals the result for the unpadded sequence (tested). A mask must
therefore be a *key* mask: bool, broadcastable to ``[B, 1, n_k]`` (a ``[B, n_q, n_k]``
mask whose rows are all equal is accepted); a mask that differs between queries cannot
be applied after the projection mixes the positions and raises ``ValueError``. A batch
element with no allowed key gets zero weights and a zero context.

**Causal attention is not supported**: every projected position mixes all ``n`` keys,
future ones included. ``causal=True`` raises ``ValueError``.

Shapes: ``query`` ``[B, n_q, d_model]``; ``key``/``value`` ``[B, n_k, d_model]`` with
``n_k <= max_len`` (default ``query``); output ``context`` ``[B, n_q, d_model]``;
``weights`` (with ``need_weights``) are over the projected positions: ``[B, n_q, k]``.

Cost: O(B h n_q k d_head + B h k n_k d_head) time and O(B h n_q k) memory -- linear in
the sequence length for a fixed ``k``, instead of O(n_q n_k).

Source: S. Wang, B. Z. Li, M. Khabsa, H. Fang, H. Ma. Linformer: Self-Attention with
Linear Complexity. arXiv:2006.04768, 2020.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab._checks import check_choice, check_int, found_on_host, is_traced
from attnlab.general.padding import clear_attention_inputs
from attnlab.general.sdpa import sdpa_attend
from attnlab.masks import normalize_mask
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall
from attnlab.query.efficient import (
    merge_heads,
    reduce_weights,
    split_heads,
)
from attnlab.query.multi_head import ProjectedHeadAttention
from attnlab.registry import register

__all__ = ["LinformerAttention"]

_SHARING = ("none", "headwise", "key-value")


@register("query", "linformer")
class LinformerAttention(ProjectedHeadAttention):
    """Linformer multi-head attention with sequence-axis projections of keys and values.

    Args:
        d_model: model size; num_heads: heads; head_dim: per-head size (default
            ``d_model // num_heads``).
        max_len: the longest key sequence ``n_max`` (the projections are ``[k, n_max]``).
        proj_len: the projected length ``k`` (the paper's ``k``).
        share: ``"none"``, ``"headwise"`` (default) or ``"key-value"`` (see the module
            docstring).
        dropout: dropout on the attention weights (training only); bias: biases in the
            projections ``W_q, W_K, W_V, W_O``.

    See the module docstring for the formula, padding, shapes and cost.
    Source: Wang et al. 2020, Linformer: Self-Attention with Linear Complexity.

    :formula: K' = E W_K F, V' = F_p W_V F (E, F_p: [k, n]); c = softmax(q K'^T / sqrt(d_head))
        V' per head
    :source: Wang et al. 2020, Linformer: Self-Attention with Linear Complexity
    :cost: O(B h (n_q + n_k) k d_head) time, O(B h n_q k) memory
    """

    supports_cross = True
    supports_causal = False

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        max_len: int,
        proj_len: int = 64,
        share: str = "headwise",
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__(d_model, num_heads, head_dim, dropout=dropout, bias=bias)
        self.max_len = check_int(max_len, "max_len")
        self.proj_len = check_int(proj_len, "proj_len")
        self.share = check_choice(share, "share", _SHARING)
        shape = (num_heads, proj_len, max_len) if share == "none" else (proj_len, max_len)
        self.E = nn.Parameter(torch.empty(shape))
        self.F = nn.Parameter(torch.empty(shape)) if share != "key-value" else None
        for p in (self.E, self.F):
            if p is not None:
                # std 1/sqrt(k): a projected row sums ~n keys; keep K' of the order of K
                nn.init.normal_(p, std=1.0 / math.sqrt(proj_len))

    def projections(self, n_k: int) -> tuple[Tensor, Tensor]:
        """``(E, F_p)`` sliced to ``n_k`` columns, each ``[h or 1, k, n_k]``."""
        E = self.E[..., :n_k]
        Fp = E if self.F is None else self.F[..., :n_k]
        if E.dim() == 2:
            E, Fp = E[None], Fp[None]
        return E, Fp

    def _key_mask(self, mask: Tensor | None, B: int, n_q: int, n_k: int, device) -> Tensor | None:
        m = normalize_mask(mask, B, n_q, n_k, device=device)
        if m is None:
            return None
        if m.shape[1] != 1:
            if found_on_host(m != m[:, :1]):
                raise ValueError(
                    f"mask has shape {tuple(mask.shape)} and differs between queries; "
                    "linformer projects the keys along the sequence before scoring, so only a "
                    f"key mask broadcastable to [B, 1, n_k] = [{B}, 1, {n_k}] can be applied"
                )
            m = m[:, :1]
        return m[:, 0, :]  # [B or 1, n_k]

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query, key, value, mask = call.query, call.key, call.value, call.mask
        causal, need_weights, average_weights = call.causal, call.need_weights, call.average_weights
        if causal:
            raise ValueError(
                "linformer does not support causal=True: each projected position mixes all "
                "keys, future ones included (use transformer-xl, reformer, synthesizer or "
                "multi-head attention for causal attention)"
            )
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        if n_k > self.max_len:
            keys = "query (the keys of self-attention)" if key is query else "key"
            raise ValueError(
                f"{keys} has shape {tuple(key.shape)}: n_k={n_k} exceeds max_len={self.max_len} "
                "(the length of the projections E, F)"
            )
        key_ok = self._key_mask(mask, B, n_q, n_k, query.device)
        H = self.num_heads
        if key_ok is not None:
            # padding never matters, whatever it holds: the padded keys / values (and, in
            # self-attention, the non-finite entries of the padded query rows) are cleared
            # with where before the projections (0 * NaN = NaN)
            query, key, value = clear_attention_inputs(
                query, key, value, key_ok[:, None, :], self_attention=key is query
            )  # type: ignore[assignment]
        q = split_heads(self.q_proj(query), H)  # [B, h, n_q, d]
        k = split_heads(self.k_proj(key), H)  # [B, h, n_k, d]
        v = split_heads(self.v_proj(value), H)
        row_ok = None
        if key_ok is not None:
            keep = key_ok[:, None, :, None]  # masked keys -> 0 BEFORE projecting along n_k
            k = torch.where(keep, k, k.new_zeros(()))
            v = torch.where(keep, v, v.new_zeros(()))
            row_ok = key_ok.any(-1)  # [B or 1]
        if n_k == 0:
            row_ok = torch.zeros(1, dtype=torch.bool, device=query.device)
        E, Fp = self.projections(n_k)
        kp = E[None].to(k.dtype) @ k  # [B, h, k, d]
        vp = Fp[None].to(v.dtype) @ v
        # skip the mask when every row has a key (a host read: not under torch.compile)
        all_ok = row_ok is None or (not is_traced() and bool(row_ok.all()))
        amask = None if all_ok else row_ok.view(-1, 1, 1, 1)
        p = self.dropout if self.training else 0.0
        context, weights = sdpa_attend(
            q, kp, vp, 1.0 / math.sqrt(self.head_dim), amask, p, need_weights
        )
        out = self.out_proj(merge_heads(context))
        if weights is not None:
            weights = reduce_weights(weights.expand(B, H, n_q, self.proj_len), average_weights)
        return AttentionOutput(out, weights, path="linformer-sdpa")
