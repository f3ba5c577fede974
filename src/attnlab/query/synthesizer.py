"""Synthesizer attention (Tay et al. 2021): attention weights synthesised without
query-key dot products.

Per head, the logits ``S`` ``[n_q, n_k]`` come from one of four synthesisers, then

    a = masked_softmax(S, mask)          c_i = sum_j a_ij v_j,   v_j = W_V x_j
    output = W_O concat_heads(c)

| mode | logits of query ``i`` (row of ``S``) | parameters per head |
| --- | --- | --- |
| ``dense`` | ``W_2 relu(W_1 x_i + b_1) + b_2``, the first ``n_k`` of ``n_max`` | ``W_1`` ``[hidden, d]``, ``W_2`` ``[n_max, hidden]`` |
| ``random`` | ``R[i, :n_k]``, a learned (or fixed) ``[n_max, n_max]`` matrix | ``R`` |
| ``factorized-dense`` | ``A_i`` ``[a]`` and ``B_i`` ``[b]`` from two small projections of ``relu(W_1 x_i + b_1)``, combined as the outer product ``S_i[p b + r] = A_ip B_ir`` (``a b = n_max``) | ``W_1``, ``W_A`` ``[a, hidden]``, ``W_B`` ``[b, hidden]`` |
| ``factorized-random`` | ``R_1 R_2^T`` with ``R_1, R_2`` ``[n_max, rank]`` (low rank) | ``R_1, R_2`` |

The dense forms see only the query token ``x_i`` (and its position through the column
index), the random forms see nothing of the input: neither compares tokens with each
other. ``mix_dot=True`` mixes in dot-product attention before the softmax,
``S = alpha_1 S_syn + alpha_2 q_i^T k_j / sqrt(d_head)``, ``alpha = softmax(w)`` learned per
head (the paper's mixture of synthesizers).

Masks (padding and ``causal=True``) are applied to the synthetic logits; a row with no
allowed key gets zero weights and a zero context. The values (and, with ``mix_dot``, the
keys) may come from another sequence ``key``/``value`` of length ``n_k <= max_len``: the
synthetic logits then address its positions. The random forms index rows by the query
position too, so they also need ``n_q <= max_len``.

Shapes: ``query`` ``[B, n_q, d_model]``; ``key``, ``value`` ``[B, n_k, d_model]`` (default
``query``); ``mask`` bool broadcastable to ``[B, n_q, n_k]``; output ``context``
``[B, n_q, d_model]``; ``weights`` ``[B, n_q, n_k]`` (``average_weights=False``:
``[B, h, n_q, n_k]``).

Cost: logits O(B h n_q hidden (d_model + n_k)) (dense), O(h n_q n_k) (random, batch
independent), O(h n_q n_k rank) (factorized random); the weighted sum O(B h n_q n_k
d_head) and O(B h n_q n_k) memory in every mode -- the Synthesizer removes the
dot products, not the quadratic attention matrix. Parameters: ``h n_max hidden`` (dense),
``h n_max^2`` (random), ``h (a + b) hidden`` (factorized dense), ``2 h n_max rank``
(factorized random).

Source: Y. Tay, D. Bahri, D. Metzler, D.-C. Juan, Z. Zhao, C. Zheng. Synthesizer:
Rethinking Self-Attention for Transformer Models. ICML 2021.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_choice, check_flags, check_int
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import clear_attention_inputs
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

__all__ = ["MODES", "SynthesizerAttention", "default_factors"]

MODES = ("dense", "random", "factorized-dense", "factorized-random")


def default_factors(n: int) -> tuple[int, int]:
    """``(a, b)`` with ``a b = n`` and ``a`` the largest divisor of ``n`` not above
    ``sqrt(n)``."""
    a = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return a, n // a


@register(
    "query",
    "synthesizer",
    aliases=("synthetic-attention",),
)
class SynthesizerAttention(ProjectedHeadAttention):
    """Synthesizer multi-head attention (dense, random and the factorised forms).

    Args:
        d_model: model size; num_heads: heads; head_dim: per-head size (default
            ``d_model // num_heads``).
        max_len: the longest sequence ``n_max`` the synthetic logits address.
        mode: ``"dense"`` (default), ``"random"``, ``"factorized-dense"``,
            ``"factorized-random"``.
        hidden: hidden size of the dense synthesiser (default ``head_dim``).
        factors: ``(a, b)`` with ``a * b = max_len`` for ``factorized-dense`` (default
            :func:`default_factors`).
        rank: the rank of ``factorized-random``.
        trainable_random: the random matrices are learned (default; initialised
            ``N(0, 0.02^2)``, close to uniform attention) or a fixed buffer
            (``N(0, 1)``).
        mix_dot: mix dot-product attention into the logits with learned weights.
        dropout: dropout on the attention weights (training only); bias: biases in the
            projections.

    See the module docstring for the formulas, shapes and cost.
    Source: Tay et al. 2021, Synthesizer: Rethinking Self-Attention for Transformer Models.

    :formula: a = softmax(S), c = sum_j a_ij W_V x_j with S synthesised: dense W2 relu(W1 x_i),
        random R, factorized-dense A_i (x) B_i, factorized-random R1 R2^T (mode=...)
    :source: Tay et al. 2021, Synthesizer: Rethinking Self-Attention for Transformer Models
    :cost: O(B h n_q n_k d_head) time and O(B h n_q n_k) memory (no dot products)
    """

    supports_cross = True
    supports_causal = True

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        max_len: int,
        mode: str = "dense",
        hidden: int | None = None,
        factors: tuple[int, int] | None = None,
        rank: int = 8,
        trainable_random: bool = True,
        mix_dot: bool = False,
        head_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__(d_model, num_heads, head_dim, inputs=("v",), dropout=dropout, bias=bias)
        self.max_len = check_int(max_len, "max_len")
        self.mode = check_choice(mode, "mode", MODES)
        check_flags(mix_dot=mix_dot)
        self.mix_dot = mix_dot
        H, L, hd = num_heads, max_len, self.head_dim

        if mode in ("dense", "factorized-dense"):
            self.hidden = check_int(hd if hidden is None else hidden, "hidden")
            self.w1 = nn.Linear(d_model, H * self.hidden)
            bound = 1.0 / math.sqrt(self.hidden)
            if mode == "dense":
                self.w2 = nn.Parameter(torch.empty(H, L, self.hidden).uniform_(-bound, bound))
                self.b2 = nn.Parameter(torch.zeros(H, L))
            else:
                a, b = default_factors(L) if factors is None else tuple(factors)
                check_int(a, "factors[0]")
                check_int(b, "factors[1]")
                if a * b != L:
                    raise ConfigError(
                        f"factors={factors!r}: a * b must equal max_len={L}, got {a * b}"
                    )
                self.factors = (a, b)
                self.wa = nn.Parameter(torch.empty(H, a, self.hidden).uniform_(-bound, bound))
                self.ba = nn.Parameter(torch.zeros(H, a))
                self.wb = nn.Parameter(torch.empty(H, b, self.hidden).uniform_(-bound, bound))
                self.bb = nn.Parameter(torch.zeros(H, b))
        elif mode == "random":
            self._random("R", (H, L, L), trainable_random, std=(0.02, 1.0))
        else:
            check_int(rank, "rank")
            self.rank = rank
            # N(0, 1/sqrt(rank)) factors: R1 R2^T has entries of std rank^(-1/2)
            s = rank**-0.5
            self._random("R1", (H, L, rank), trainable_random, std=(s, s))
            self._random("R2", (H, L, rank), trainable_random, std=(s, s))
        if self.mix_dot:
            self.q_proj = nn.Linear(d_model, H * hd, bias=bias)
            self.k_proj = nn.Linear(d_model, H * hd, bias=bias)
            self.mix = nn.Parameter(torch.zeros(H, 2))  # alpha = softmax(mix): equal at start

    def _random(
        self, name: str, shape: tuple[int, ...], trainable: bool, std: tuple[float, float]
    ) -> None:
        t = torch.randn(shape) * (std[0] if trainable else std[1])
        if trainable:
            setattr(self, name, nn.Parameter(t))
        else:
            self.register_buffer(name, t)

    # ------------------------------------------------------------------ logits

    def synthetic_logits(self, query: Tensor, n_k: int) -> Tensor:
        """The synthetic logits ``[B or 1, h, n_q, n_k]`` (before masking)."""
        B, n_q, _ = query.shape
        H = self.num_heads
        if self.mode == "random":
            return self.R[:, :n_q, :n_k][None]
        if self.mode == "factorized-random":
            return (self.R1[:, :n_q] @ self.R2[:, :n_k].transpose(-1, -2))[None]
        hid = F.relu(self.w1(query)).view(B, n_q, H, self.hidden)  # [B, n_q, h, hidden]
        if self.mode == "dense":
            w2, b2 = self.w2[:, :n_k], self.b2[:, :n_k]  # only the n_k columns needed
            return torch.einsum("bnhe,hle->bhnl", hid, w2) + b2[None, :, None, :]
        A = torch.einsum("bnhe,hae->bhna", hid, self.wa) + self.ba[None, :, None, :]
        Bf = torch.einsum("bnhe,hce->bhnc", hid, self.wb) + self.bb[None, :, None, :]
        return (A[..., :, None] * Bf[..., None, :]).flatten(-2)[..., :n_k]

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query, key, value, mask = call.query, call.key, call.value, call.mask
        causal, need_weights, average_weights = call.causal, call.need_weights, call.average_weights
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        if n_k > self.max_len:
            raise ValueError(
                f"key has shape {tuple(key.shape)}: n_k={n_k} exceeds max_len={self.max_len}"
            )
        if self.mode in ("random", "factorized-random") and n_q > self.max_len:
            raise ValueError(
                f"query has shape {tuple(query.shape)}: n_q={n_q} exceeds max_len="
                f"{self.max_len} (the {self.mode} synthesizer has one row per query position)"
            )
        hmask = head_mask(mask, B, n_q, n_k, query.device, causal=causal)
        # padding never matters: padded keys / values and query rows that attend nothing
        # are cleared (where) before anything is computed from them
        query, key, value = clear_attention_inputs(
            query, key, value, hmask, self_attention=key is query
        )  # type: ignore[assignment]
        H = self.num_heads
        logits = self.synthetic_logits(query, n_k)
        if self.mix_dot:
            q = split_heads(self.q_proj(query), H)
            k = split_heads(self.k_proj(key), H)
            alpha = torch.softmax(self.mix, dim=-1)[None, :, :, None, None]
            dots = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
            logits = alpha[:, :, 0] * logits + alpha[:, :, 1] * dots
        logits = logits.expand(B, H, n_q, n_k)
        weights = masked_softmax(logits, hmask)
        v = split_heads(self.v_proj(value), H)
        p = self.dropout if self.training else 0.0
        attn = F.dropout(weights, p, True) if p > 0 else weights
        out = self.out_proj(merge_heads(attn @ v))
        w = reduce_weights(weights, average_weights) if need_weights else None
        return AttentionOutput(out, w, path=f"synthesizer-{self.mode}")
