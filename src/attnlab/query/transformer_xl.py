"""Transformer-XL attention (Dai et al. 2019): segment-level recurrence with a memory and
relative positional attention.

**Recurrence.** The keys and values of a segment ``x`` ``[B, n, d]`` come from
``h~ = [SG(m) ; x]``, the memory ``m`` ``[B, M, d]`` (the hidden states of the previous
segment(s), with the gradient stopped) concatenated before the segment; the queries come
from ``x`` only. The module returns the next memory, the last ``mem_len`` states of
``[m ; x]`` detached, in ``extras["memory"]``; pass it back with ``memory=`` for the next
segment. The states cached are the module's *input*: inside a Transformer layer, the
layer's input to its attention (the paper caches each layer's input hidden states).

**Relative positional attention.** With ``K = M + n`` keys, query ``i`` at absolute position
``M + i`` and key ``j`` at position ``j``, the score of each head is the paper's
decomposition

    A_ij =  q_i^T k_j                    (a) content-content
          + q_i^T W_{k,R} R_{i-j}        (b) content-position
          + u^T k_j                      (c) global content bias
          + v^T W_{k,R} R_{i-j}          (d) global position bias

    = (q_i + u)^T k_j + (q_i + v)^T r_{i-j},   q_i = W_q x_i, k_j = W_{k,E} h~_j,
                                               r_t = W_{k,R} R_t,

scaled by ``1/sqrt(d_head)``, where ``R_t`` is the sinusoidal encoding of the relative
distance ``t = (M + i) - j`` (``[sin(t w_1), .., sin(t w_{d/2}), cos(t w_1), ..]``,
``w_k = 10000^(-2(k-1)/d)``), and ``u``, ``v`` are learned per head (``content_bias`` and
``position_bias``). Then ``a = masked_softmax(A)``, ``c = W_O concat_heads(a V)``.

**The relative shift.** Terms (b)+(d) are computed once per *distance*, not per pair:
``BD~ = (Q + v) r^T`` ``[n, L]`` over the ``L`` distances ``K - 1, K - 2, .., lowest``
(``lowest = 0`` with ``causal=True``, ``-(n - 1)`` without), and the pair ``(i, j)`` reads
column ``n - 1 - i + j``. :func:`rel_shift` does that re-indexing with one zero column,
a flat view and a slice (the padding trick of the paper's implementation, generalised to
bidirectional attention): O(n L) time, one padded copy, no gather.

Shapes: ``query`` ``[B, n, d_model]`` (``key``/``value`` must be ``None`` or the query:
relative attention is self-attention); ``memory`` ``[B, M, d_model]``; ``mask`` bool
broadcastable to ``[B, n, M + n]`` -- or to ``[B, n, n]`` (the segment's keys only; the
memory is then all allowed); ``causal=True`` lets query ``i`` see the memory and keys
``<= i``. Output ``context`` ``[B, n, d_model]``; ``weights`` ``[B, n, M + n]``;
``extras["memory"]`` ``[B, min(mem_len, M + n), d_model]`` (``None`` when ``mem_len = 0``).

Cost: O(B h n (M + n) d_head) time and O(B h n (M + 2n)) memory for the scores; the
memory extends the context to ``M + n`` keys at the cost of ``M`` more keys per query,
with no backpropagation into the previous segment.

Source: Z. Dai, Z. Yang, Y. Yang, J. Carbonell, Q. V. Le, R. Salakhutdinov.
Transformer-XL: Attentive Language Models beyond a Fixed-Length Context. ACL 2019.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import check_int, check_same, check_tensor
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import (
    attended_keys,
    attending_rows,
    clear_nonfinite_rows,
    zero_rows,
)
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall
from attnlab.query.efficient import (
    head_mask,
    merge_heads,
    reduce_weights,
    split_heads,
)
from attnlab.query.multi_head import ProjectedHeadAttention
from attnlab.registry import register

__all__ = ["TransformerXLAttention", "rel_shift", "sinusoid_encoding"]


def sinusoid_encoding(positions: Tensor, d_model: int) -> Tensor:
    """``[L] -> [L, d_model]``: ``[sin(t w_1), .., sin(t w_{d/2}), cos(t w_1), ..]`` with
    ``w_k = 10000^(-2(k-1)/d_model)`` (an odd ``d_model`` drops the last cosine)."""
    half = (d_model + 1) // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) * 2.0 / d_model))
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(positions.device)[None, :]
    enc = torch.cat([angles.sin(), angles.cos()], dim=-1)[:, :d_model]
    return enc


def rel_shift(x: Tensor, n_k: int) -> Tensor:
    """Re-index scores per distance into scores per (query, key) pair.

    ``x`` ``[..., n, L]`` holds, for query ``i``, its scores against the distances
    ``n_k - 1, n_k - 2, ..`` (column ``t`` = distance ``n_k - 1 - t``). The result
    ``[..., n, n_k]`` holds at ``(i, j)`` the column ``n - 1 - i + j`` of row ``i`` -- the
    distance ``(n_k - n + i) - j`` between query ``i`` (the last ``n`` of ``n_k``
    positions) and key ``j``. Entries whose column falls outside ``[0, L)`` (future keys
    when only the distances ``>= 0`` were computed) hold arbitrary values and must be
    masked. Cost: one padded copy of ``x``; the rest are views.
    """
    n, L = x.shape[-2:]
    if n == 0 or n_k == 0:
        return x.new_zeros(*x.shape[:-2], n, n_k)
    if L < n_k:
        raise ValueError(f"x has {L} distance columns, fewer than n_k={n_k}")
    # padded row i holds L + 1 entries; (i, n-1-i+j) sits at flat index (n-1) + i*L + j
    flat = F.pad(x, (0, 1)).flatten(-2)
    return flat[..., n - 1 : n - 1 + n * L].unflatten(-1, (n, L))[..., :n_k]


@register(
    "query",
    "transformer-xl",
    aliases=("txl", "relative-xl"),
)
class TransformerXLAttention(ProjectedHeadAttention):
    """Transformer-XL multi-head attention: relative positions and a segment memory.

    Args:
        d_model: model size (query, memory and output).
        num_heads: heads ``h``.
        head_dim: per-head size (default ``d_model // num_heads``).
        mem_len: how many states the returned memory keeps (``0``: no memory is returned;
            a ``memory=`` passed in is still attended to).
        dropout: dropout on the attention weights (training only).
        bias: biases in the ``W_q``, ``W_{k,E}``, ``W_v`` projections (the paper has none)
            and ``W_O``.

    Forward: ``forward(query, key=None, value=None, *, mask=None, causal=False,
    need_weights=False, average_weights=True, memory=None)``; see the module docstring for
    the formula, the shapes and the cost. ``extras["memory"]`` is the next memory.

    Source: Dai et al. 2019, Transformer-XL: Attentive Language Models beyond a
    Fixed-Length Context (ACL).

    :formula: A_ij = (q_i + u)^T k_j + (q_i + v)^T W_kR R_{i-j}; keys/values over [SG(memory);
        x]; c = W_O concat_h(softmax(A / sqrt(d_head)) V)
    :source: Dai et al. 2019, Transformer-XL: Attentive Language Models beyond a Fixed-Length
        Context
    :cost: O(B h n (M + n) d_head) time, O(B h n (M + 2n)) score memory (M = memory length)
    """

    supports_cross = False
    supports_causal = True

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        mem_len: int = 0,
        dropout: float = 0.0,
        bias: bool = False,
    ) -> None:
        self.mem_len = check_int(mem_len, "mem_len", minimum=0)
        # q_proj, k_proj (W_{k,E}), v_proj and out_proj
        super().__init__(d_model, num_heads, head_dim, dropout=dropout, bias=bias)
        hd = self.head_dim
        self.r_proj = nn.Linear(d_model, num_heads * hd, bias=False)  # W_{k,R}
        self.content_bias = nn.Parameter(torch.empty(num_heads, hd))  # u
        self.position_bias = nn.Parameter(torch.empty(num_heads, hd))  # v
        nn.init.normal_(self.content_bias, std=0.02)
        nn.init.normal_(self.position_bias, std=0.02)

    def relative_keys(self, n: int, n_k: int, causal: bool, like: Tensor) -> Tensor:
        """``r_t = W_{k,R} R_t`` for the distances ``n_k - 1`` down to ``0`` (causal) or
        ``-(n - 1)``: ``[h, L, d_head]``."""
        lowest = 0 if causal else -(n - 1)
        dist = torch.arange(n_k - 1, lowest - 1, -1, device=like.device)
        R = sinusoid_encoding(dist, self.d_model).to(like.dtype)
        return self.r_proj(R).view(-1, self.num_heads, self.head_dim).transpose(0, 1)

    def _memory(self, memory: Tensor | None, query: Tensor) -> Tensor | None:
        if memory is None:
            return None
        check_tensor(memory, "memory")
        B = query.shape[0]
        if memory.dim() != 3 or memory.shape[0] != B or memory.shape[-1] != self.d_model:
            raise ValueError(
                f"memory has shape {tuple(memory.shape)}, expected [B, M, d_model] = "
                f"[{B}, M, {self.d_model}]"
            )
        check_same(query, "query", memory=memory)
        return memory.detach()

    def _mask(
        self, mask: Tensor | None, B: int, n: int, M: int, device: torch.device, causal: bool
    ) -> Tensor | None:
        if isinstance(mask, Tensor) and M > 0 and n > 1 and mask.dim() and mask.shape[-1] == n:
            # a mask over the segment's keys only: the memory is allowed (a last axis of
            # size 1 always broadcasts over all M + n keys)
            ones = torch.ones(*mask.shape[:-1], M, dtype=mask.dtype, device=mask.device)
            mask = torch.cat([ones, mask], dim=-1)
        return head_mask(mask, B, n, M + n, device, causal=causal)

    def _attend(self, call: AttentionCall, *, memory: Tensor | None = None) -> AttentionOutput:
        query, mask, causal = call.query, call.mask, call.causal
        need_weights, average_weights = call.need_weights, call.average_weights
        mem = self._memory(memory, query)
        B, n, _ = query.shape
        h = query if mem is None else torch.cat([mem, query], dim=1)  # h~ = [SG(m); x]
        n_k = h.shape[1]
        M = n_k - n
        hmask = self._mask(mask, B, n, M, query.device, causal)
        new_memory = h[:, n_k - min(self.mem_len, n_k) :].detach() if self.mem_len else None
        if n == 0:  # no queries: an empty output (the memory still rolls over)
            out = self.out_proj(query.new_zeros(B, 0, self.num_heads * self.head_dim))
            w = query.new_zeros(B, self.num_heads, 0, n_k) if need_weights else None
            w = reduce_weights(w, average_weights)
            return AttentionOutput(out, w, path="relative", extras={"memory": new_memory})

        if hmask is not None:
            # padding never matters, whatever it holds: padded keys (memory included) are
            # zeroed, a query row that attends nothing too, and the segment's padded query
            # rows lose their NaN / inf entries -- with where, before the projections
            keys_ok = attended_keys(hmask)
            h = zero_rows(h, keys_ok)
            query = zero_rows(query, attending_rows(hmask))
            # the segment's own keys (a key axis of size 1 broadcasts over all of them)
            segment_ok = keys_ok[:, M:] if keys_ok.shape[-1] == n_k else keys_ok
            query = clear_nonfinite_rows(query, segment_ok)
        q = split_heads(self.q_proj(query), self.num_heads)  # [B, h, n, d]
        k = split_heads(self.k_proj(h), self.num_heads)  # [B, h, K, d]
        v = split_heads(self.v_proj(h), self.num_heads)
        r = self.relative_keys(n, n_k, causal, query)  # [h, L, d]
        u = self.content_bias[None, :, None, :]
        pv = self.position_bias[None, :, None, :]
        ac = (q + u) @ k.transpose(-1, -2)  # (a) + (c)
        bd = rel_shift((q + pv) @ r.transpose(-1, -2), n_k)  # (b) + (d)
        scores = (ac + bd) * (1.0 / math.sqrt(self.head_dim))
        # with causal=True the entries for future keys hold garbage from the shift; the
        # causal mask in hmask removes them
        weights = masked_softmax(scores, hmask)
        p = self.dropout if self.training else 0.0
        attn = F.dropout(weights, p, True) if p > 0 else weights
        context = merge_heads(attn @ v)
        out = self.out_proj(context)
        w = reduce_weights(weights, average_weights) if need_weights else None
        return AttentionOutput(out, w, path="relative", extras={"memory": new_memory})
