"""Multi-head attention (Vaswani et al. 2017) with any score and alignment per head.

Per head ``j``: ``q_j = W_q^(j) q``, ``K_j = W_K^(j) F``, ``V_j = W_V^(j) F``; the head runs
the general attention model ``c_j = sum_l align(score_j(q_j, k_jl)) v_jl``; the output is
``W_O concat(c_1, ..., c_h)``. With the scaled-dot score and soft alignment this is the
Transformer's attention and runs as ONE call of PyTorch's fused
``scaled_dot_product_attention`` over all heads. Any other score or alignment is a
per-head :class:`attnlab.Attention`, so every head owns its score parameters (additive,
general, ...). Heads whose score reduces to a dot product (general, biased-general,
cosine) are still fused: each head transforms its query, then one SDPA call runs them all.

Grouped-query attention (Ainslie et al. 2023): ``num_kv_heads`` key/value heads shared by
groups of query heads; ``num_kv_heads=1`` is multi-query attention (Shazeer 2019).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab import masks as _masks
from attnlab._checks import ConfigError
from attnlab.general.attention import Attention
from attnlab.general.padding import clear_attention_inputs
from attnlab.general.planner import Plan, plan_heads
from attnlab.general.sdpa import _sdpa_attend
from attnlab.output import AttentionOutput, joint_log_prob
from attnlab.query._convention import AttentionCall, HeadAttention
from attnlab.query.efficient import check_dropout
from attnlab.registry import register

__all__ = ["MultiHeadAttention"]


class ProjectedHeadAttention(HeadAttention):
    """Base of the multi-head modules that project their inputs per head (multi-head,
    relative-position, Linformer, Synthesizer, Reformer, Transformer-XL): the constructor
    part they share.

    It checks and sets ``d_model``, ``num_heads`` and ``head_dim`` (default
    ``d_model // num_heads``), the weight dropout ``dropout`` (a float in ``[0, 1)``),
    ``d_k`` (default ``d_model``) and ``d_v`` (default ``d_k``), and builds the projections
    of multi-head attention, in this order: ``<x>_proj`` for each ``x`` of ``inputs`` --
    ``q_proj = nn.Linear(d_model, h d_head)``, ``k_proj = nn.Linear(d_k, h_kv d_head)``,
    ``v_proj = nn.Linear(d_v, h_kv d_head)`` (a mechanism that synthesises its scores, or
    shares ``W_q`` with the keys, leaves some out; ``h_kv = num_kv_heads``, default ``h``,
    must divide ``h``) -- and ``out_proj = nn.Linear(h d_head, out_dim or d_model)``
    (``W_O``). Cost of each projection: O(B n d_in h d_head)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        inputs: tuple[str, ...] = ("q", "k", "v"),
        d_k: int | None = None,
        d_v: int | None = None,
        num_kv_heads: int | None = None,
        out_dim: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        hd = self._init_heads(d_model, num_heads, head_dim)
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if kv_heads < 1 or num_heads % kv_heads:
            raise ConfigError(
                f"num_kv_heads={kv_heads} must be >= 1 and divide num_heads={num_heads}"
            )
        self.dropout = check_dropout(dropout)
        self.d_k = d_model if d_k is None else d_k
        self.d_v = self.d_k if d_v is None else d_v
        self.num_kv_heads = kv_heads
        sizes = {"q": (d_model, num_heads), "k": (self.d_k, kv_heads), "v": (self.d_v, kv_heads)}
        for name in inputs:
            d_in, heads = sizes[name]
            setattr(self, f"{name}_proj", nn.Linear(d_in, heads * hd, bias=bias))
        self.out_proj = nn.Linear(num_heads * hd, out_dim or d_model, bias=bias)


@register("query", "multi-head", aliases=("mha", "multihead"))
class MultiHeadAttention(ProjectedHeadAttention):
    """Multi-head attention with any score and alignment per head.

    Args:
        d_model: query size and (by default) output size.
        num_heads: number of query heads ``h``.
        d_k: key feature size (default ``d_model``); d_v: value feature size (default
            ``d_k``).
        head_dim: size of each head (default ``d_model // num_heads``).
        num_kv_heads: key/value heads (default ``num_heads``); must divide ``num_heads``.
            ``1`` gives multi-query attention, ``1 < num_kv_heads < num_heads``
            grouped-query attention.
        score, align, **options: the general attention each head runs (default
            ``scaled-dot`` / ``soft``); options go to the score/alignment (e.g. ``d_w``).
        dropout: dropout on the attention weights (training only).
        bias: biases in the projections (default True, as ``torch.nn.MultiheadAttention``;
            Vaswani et al.'s projections have none: ``bias=False``).
        out_dim: output size (default ``d_model``).

    Shapes: ``query`` ``[B, n_q, d_model]``; ``key`` ``[B, n_k, d_k]`` (default ``query``:
    self-attention); ``value`` ``[B, n_k, d_v]`` (default ``key``); ``mask`` bool
    broadcastable to ``[B, n_q, n_k]`` (or ``[B, h, n_q, n_k]``), True = may attend;
    ``causal=True`` adds the causal mask. Returns :class:`AttentionOutput` with
    ``context`` ``[B, n_q, out_dim]`` and, with ``need_weights``, the weights averaged over
    heads ``[B, n_q, n_k]`` (``average_weights=False``: ``[B, h, n_q, n_k]``). With a
    stochastic alignment (``hard``, ``reinforced``) ``log_prob`` is the sum of the heads'
    log-probabilities (independent draws), what a REINFORCE loss trains the projections
    and the scores with.

    Cost: O(B h n_q n_k d_head) for the scores plus the projections; the fused path needs
    O(B h n_q d_head) memory beyond the inputs when no weights are requested.

    :formula: c = W_O concat(c_1..c_h), c_j = attend(W_q^(j) q, W_K^(j) F, W_V^(j) F) with any
        score/align
    :source: Vaswani et al. 2017, Attention Is All You Need
    :cost: O(B h n_q n_k d_head) (+ projections O(B (n_q + n_k) d_model^2))
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        d_k: int | None = None,
        d_v: int | None = None,
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
        score: str = "scaled-dot",
        align: str = "soft",
        dropout: float = 0.0,
        bias: bool = True,
        out_dim: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            d_model,
            num_heads,
            head_dim,
            d_k=d_k,
            d_v=d_v,
            num_kv_heads=num_kv_heads,
            out_dim=out_dim,
            dropout=dropout,
            bias=bias,
        )
        head_dim = self.head_dim
        self.heads = nn.ModuleList(
            [
                Attention(score, align, d_q=head_dim, d_k=head_dim, dropout=dropout, **options)
                for _ in range(num_heads)
            ]
        )
        if self.heads[0].multi:
            raise ConfigError("multi-head attention combines scalar weights; use dim='single'")
        # the planner decides: fused when every head plans the SDPA path
        self._fused = all(h.plan().path == "sdpa" for h in self.heads)
        self._parameter_free = self._fused and not any(
            p.numel() for h in self.heads for p in h.parameters()
        )

    def plan(
        self,
        need_weights: bool = False,
        *,
        causal: bool = False,
        has_mask: bool = False,
        n_q: int | None = None,
        n_k: int | None = None,
        device: torch.device | str | None = None,
    ) -> Plan:
        """The :class:`~attnlab.general.planner.Plan` of a call with these settings."""
        head = self.heads[0].plan(need_weights, n_k, device=device)
        return plan_heads(
            head,
            fusable=self._fused,
            causal=causal,
            has_mask=has_mask,
            n_q=n_q,
            n_k=n_k,
            need_weights=need_weights,
        )

    def explain(
        self,
        need_weights: bool = False,
        *,
        causal: bool = False,
        device: torch.device | str | None = None,
    ) -> tuple[str, str]:
        """``(path, reason)`` of a call without a mask (``causal=True``: causal
        self-attention) on ``device`` (default: that of the parameters)."""
        plan = self.plan(need_weights, causal=causal, device=device)
        return plan.path, plan.reason

    # ------------------------------------------------------------------ torch interop

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build the equivalent module from a ``torch.nn.MultiheadAttention`` (same weights).

        The result is batch-first whatever ``mha.batch_first`` is; it gives the same outputs
        and the same head-averaged weights. ``add_bias_kv`` and ``add_zero_attn`` are not
        supported (``ValueError``).
        """
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"mha must be a torch.nn.MultiheadAttention, got {type(mha).__name__}")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv / add_zero_attn are not supported by from_torch")
        E = mha.embed_dim
        has_bias = mha.in_proj_bias is not None
        out = cls(E, mha.num_heads, d_k=mha.kdim, d_v=mha.vdim, dropout=mha.dropout, bias=has_bias)
        w = mha.in_proj_weight
        if w is not None:
            q_w, k_w, v_w = w.detach().chunk(3)
        else:
            q_w, k_w, v_w = (
                mha.q_proj_weight.detach(),
                mha.k_proj_weight.detach(),
                mha.v_proj_weight.detach(),
            )
        ref = mha.out_proj.weight
        out = out.to(device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            out.q_proj.weight.copy_(q_w)
            out.k_proj.weight.copy_(k_w)
            out.v_proj.weight.copy_(v_w)
            out.out_proj.weight.copy_(mha.out_proj.weight)
            if has_bias:
                qb, kb, vb = mha.in_proj_bias.detach().chunk(3)
                out.q_proj.bias.copy_(qb)
                out.k_proj.bias.copy_(kb)
                out.v_proj.bias.copy_(vb)
                out.out_proj.bias.copy_(mha.out_proj.bias)
        out.train(mha.training)
        return out

    # ------------------------------------------------------------------ forward

    def _split(self, x: Tensor, heads: int) -> Tensor:
        B, n, _ = x.shape
        return x.view(B, n, heads, self.head_dim).transpose(1, 2)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query, key, value = call.query, call.key, call.value
        mask, causal, need_weights = call.mask, call.causal, call.need_weights
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        # the heads' plan for this call's device and dtype, without plan()'s checks of
        # its settings (check_call did them) and walk over the parameters (3-5 us a call)
        head = self.heads[0]._plan(need_weights, n_k, query.device, query.dtype, None, None)
        plan = plan_heads(
            head,
            fusable=self._fused,
            causal=causal,
            has_mask=mask is not None,
            n_q=n_q,
            n_k=n_k,
            need_weights=need_weights,
        )
        # SDPA's is_causal kernel instead of a materialised causal mask
        hmask = _masks.normalize_head_mask(
            mask,
            B,
            self.num_heads,
            n_q,
            n_k,
            device=query.device,
            causal=causal and not plan.causal_kernel,
        )
        # padding never matters: padded keys / values and query rows that attend nothing
        # are cleared before the projections (whose weight gradients would multiply them)
        query, key, value = clear_attention_inputs(
            query, key, value, hmask, self_attention=key is query
        )  # type: ignore[assignment]

        q = self._split(self.q_proj(query), self.num_heads)  # [B, h, n_q, hd]
        k = self._split(self.k_proj(key), self.num_kv_heads)
        v = self._split(self.v_proj(value), self.num_kv_heads)
        group = self.num_heads // self.num_kv_heads
        if group > 1:  # grouped-query: each kv head serves `group` query heads (a view)
            k = k[:, :, None].expand(B, self.num_kv_heads, group, n_k, self.head_dim)
            k = k.reshape(B, self.num_heads, n_k, self.head_dim)
            v = v[:, :, None].expand(B, self.num_kv_heads, group, n_k, self.head_dim)
            v = v.reshape(B, self.num_heads, n_k, self.head_dim)

        p = self.dropout if self.training else 0.0
        if plan.path == "sdpa":
            if self._parameter_free:
                q2, k2, scale = self.heads[0].score.dot_form(q, k)
            else:
                forms = [h.score.dot_form(q[:, j], k[:, j]) for j, h in enumerate(self.heads)]
                q2 = torch.stack([f[0] for f in forms], 1)
                k2 = torch.stack([f[1] for f in forms], 1)
                scale = forms[0][2]
            # the raw inputs were cleared above: no second pass over the padding
            context, weights = _sdpa_attend(
                q2, k2, v, scale, hmask, p, need_weights, clear=False, causal=plan.causal_kernel
            )
            path, log_prob = "sdpa", None
        else:
            outs = []
            for j, head in enumerate(self.heads):
                m = None if hmask is None else hmask[:, min(j, hmask.shape[1] - 1)]
                outs.append(head(q[:, j], k[:, j], v[:, j], mask=m, need_weights=need_weights))
            context = torch.stack([o.context for o in outs], 1)
            weights = torch.stack([o.weights for o in outs], 1) if need_weights else None
            log_prob = joint_log_prob(outs)  # stochastic heads: their draws together
            path = f"per-head:{outs[0].path}"
        context = context.transpose(1, 2).reshape(B, n_q, self.num_heads * self.head_dim)
        output = self.out_proj(context)
        if weights is not None and call.average_weights:
            weights = weights.mean(1)
        return AttentionOutput(output, weights if need_weights else None, log_prob, path)
