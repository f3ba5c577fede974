"""Self-attention in the three forms of the survey (Brauwers & Frasincar 2023, section
3.3.1; TAXONOMY section 3.1): the query is not given, it comes from the model itself.

| form | query | module |
| --- | --- | --- |
| constant query | folded into a query-less score ``e_l = w^T act(W k_l + b)`` | :class:`ConstantQuerySelfAttention` |
| learned query | ``r`` trainable vectors ``q_1..q_r``, any score ``e_jl = score(q_j, k_l)`` | :class:`LearnedQuerySelfAttention` |
| relational | ``Q = W_Q F``: every position asks its own question, any score | :class:`RelationalSelfAttention` |

The several-query learned form is the structured self-attentive sentence embedding of Lin
et al. 2017: ``A = softmax(W_s2 tanh(W_s1 H^T))`` (``r`` rows), ``M = A H``, trained with
the penalty ``P = ||A A^T - I||_F^2`` (:func:`orthogonality_penalty`) that makes the rows
attend to different positions.

Relational self-attention updates the features: ``f_new = c`` (``update="replace"``) or
``f_new = Normalize(f_old + c)`` (``update="residual"``, the Transformer's add & norm;
LayerNorm by default).

Every form is one :class:`attnlab.Attention` (any score and alignment the formula allows);
this module only builds the queries and the feature update.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attnlab import masks as _masks
from attnlab._checks import ConfigError, check_int, check_optional_int, check_tensor
from attnlab._deprecation import renamed_init_arguments
from attnlab.general.activations import get_activation
from attnlab.general.attention import Attention
from attnlab.general.padding import attended_keys, clear_nonfinite_rows, zero_rows
from attnlab.general.scoring import Score
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall, SequenceAttention, query_scored_attention
from attnlab.registry import register

__all__ = [
    "ConstantQuerySelfAttention",
    "LearnedQuerySelfAttention",
    "RelationalSelfAttention",
    "orthogonality_penalty",
]


# ----------------------------------------------------------------------------- helpers

#: what a learned-query module's message offers instead of a query-less score
_QUERYLESS_HINT = "; for a query-less score use ConstantQuerySelfAttention"


def check_position_mask(mask: object) -> None:
    """``mask`` is a bool tensor, True = real position (the mask of the modules whose
    queries are internal: learned-query, constant-query and capsule attention)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask has dtype {mask.dtype}, expected torch.bool (True = real position)")


def _key_mask(mask: Tensor | None, B: int, n_q: int, n: int, device: torch.device) -> Tensor | None:
    """A mask for attention whose queries are internal: ``[B, n]`` (True = real position)
    is a key mask, read as ``[B, 1, n]``; anything else must broadcast to ``[B, n_q, n]``."""
    if mask is None:
        return None
    check_position_mask(mask)
    if mask.dim() == 2:
        if tuple(mask.shape) != (B, n):
            raise ValueError(
                f"mask has shape {tuple(mask.shape)}, expected a key mask [B, n] = [{B}, {n}] "
                f"or a shape broadcastable to [B, n_q, n] = [{B}, {n_q}, {n}]"
            )
        mask = mask[:, None, :]
    return _masks.normalize_mask(mask, B, n_q, n, device=device)


class _PoolingSelfAttention(SequenceAttention):
    """The shared inputs of constant- and learned-query self-attention: ``query`` is the
    sequence ``F`` ``[B, n, d_features]``; an explicit ``key`` (what is scored) and
    ``value`` (what is averaged) are other views of the same ``n`` positions, so ``key``
    must have the batch and length of ``query`` (``value`` those of ``key``), else a
    one-line ``ValueError`` naming both."""

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        call = super()._inputs(call, extras)
        query, key = call.query, call.key
        if key is not query and key.shape[:2] != query.shape[:2]:
            B, n = query.shape[:2]
            raise ValueError(
                f"key has shape {tuple(key.shape)} but query has shape {tuple(query.shape)}; "
                f"key scores the positions of query: expected [B, n, d_features] = "
                f"[{B}, {n}, {self.d_features}]"
            )
        return call


def orthogonality_penalty(weights: Tensor, reduction: str = "mean") -> Tensor:
    """The penalty of Lin et al. 2017, ``P = ||A A^T - I||_F^2`` per example.

    Args:
        weights: the attention matrix ``A`` ``[B, r, n]`` (``r`` queries over ``n``
            positions), or ``[B, n]`` for one query.
        reduction: ``"mean"`` (over the batch, default), ``"sum"`` or ``"none"`` (``[B]``).

    Masked rows: a query row with no allowed position has all-zero weights; its diagonal
    entry of ``I`` is dropped (``I`` becomes ``diag(row has weight)``), so a fully masked
    example has penalty 0 instead of ``r``. Rows are recognised by a positive weight sum.

    Minimising ``P`` pushes every row towards one position (``||a_j||^2 -> 1``) and
    different rows towards different positions (``a_i . a_j -> 0``). Cost O(B r^2 n).
    """
    check_tensor(weights, "weights")
    if weights.dim() == 2:
        weights = weights.unsqueeze(1)
    if weights.dim() != 3:
        raise ValueError(
            f"weights has shape {tuple(weights.shape)}, expected [B, r, n] (or [B, n])"
        )
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    valid = (weights.detach().sum(-1) > 0).to(weights.dtype)  # [B, r]
    gram = weights @ weights.transpose(1, 2)  # [B, r, r]
    per_example = (gram - torch.diag_embed(valid)).pow(2).sum((1, 2))
    if reduction == "none":
        return per_example
    if reduction == "sum":
        return per_example.sum()
    if per_example.numel() == 0:
        return per_example.sum()
    return per_example.mean()


# ----------------------------------------------------------------------------- constant query


@register("query", "constant-query-self-attention", aliases=("constant-query", "self-attentive"))
@renamed_init_arguments({"d_k": "d_features"}, attributes=True)
class ConstantQuerySelfAttention(_PoolingSelfAttention):
    """Self-attention with a constant query: the question ("which class is this
    document?") never changes, so it is folded into the query-less score
    ``e_l = w^T act(W f_l + b)``; ``c = sum_l align(e)_l v_l``.

    Args:
        d_features: size of the features ``f_l`` (formerly ``d_k``, a deprecated keyword
            for one release).
        d_w: hidden size of the score (default ``d_features``); act: its activation (``tanh``);
            bias: the bias ``b``.
        align: any alignment without a query (default ``soft``; ``sparsemax``,
            ``entmax15``, ``hard``, ``reinforced`` work too; local ones need a query).
        dim: ``"single"`` (default) or ``"multi"`` (DiSAN's source2token vector score).
        value_dim: if given, the values are ``W_V f_l`` of that size; else the features.
        score: ``"queryless"`` or any query-less :class:`~attnlab.general.scoring.Score`.
        dropout: dropout on the weights (training only).
        **options: passed to the alignment (e.g. ``tau`` for hard attention).

    Call: ``forward(query, key=None, value=None, *, mask=None, need_weights=False)``: the
    sequence ``F`` ``[B, n, d_features]`` is ``query`` (the learned query is inside the
    score); the scores read ``key`` (default ``F``), the context averages ``value``
    (default ``key``), both over the positions of ``F``: ``key`` ``[B, n, d_features]`` and
    ``value`` ``[B, n, d_v]`` with the ``B`` and ``n`` of ``F`` (else a ``ValueError``
    naming both); ``mask`` bool ``[B, n]`` (True = real position) or ``[B, 1, n]``.
    Returns :class:`~attnlab.output.AttentionOutput` with ``context`` ``[B, d_v]`` and, with ``need_weights``, ``weights`` ``[B, n]`` (``[B, n, d_v]`` for
    ``dim="multi"``). A fully masked or empty sequence gives zero weights and a zero
    context.

    Cost: O(B n d_features d_w) time, O(B n) memory for the weights (``dim="multi"``: O(B n d_v)).

    :formula: e_l = w^T act(W f_l + b); a = align(e); c = sum_l a_l v_l
    :source: Lin et al. 2017, A Structured Self-attentive Sentence Embedding; Yang et al. 2016,
        Hierarchical Attention Networks for Document Classification
    :cost: O(B n d_f d_w)
    """

    def __init__(
        self,
        d_features: int,
        *,
        d_w: int | None = None,
        act: str = "tanh",
        bias: bool = True,
        align: str = "soft",
        dim: str = "single",
        value_dim: int | None = None,
        score: str | Score = "queryless",
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(d_features, "d_features", owner="ConstantQuerySelfAttention")
        if isinstance(score, Score):
            if score.needs_query:
                raise ConfigError(
                    f"a constant-query self-attention needs a query-less score; "
                    f"{type(score).__name__} needs a query"
                )
            own: dict[str, Any] = {}  # a built score has its own d_w, act and bias
        else:
            if score not in ("queryless", "query-less", "self-attentive", "constant-query"):
                raise ConfigError(
                    f"score must be 'queryless' (or a query-less Score module), got {score!r}"
                )
            score, own = "queryless", {"d_w": d_w, "act": act, "bias": bias}
        self.attention = Attention(
            score,
            align,
            dim,
            d_k=d_features,
            value_dim=value_dim,
            dropout=dropout,
            **own,
            **options,
        )
        self.d_features = d_features

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        key, value, mask, need_weights = call.key, call.value, call.mask, call.need_weights
        B, n = key.shape[:2]
        m = _key_mask(mask, B, 1, n, key.device)
        return self.attention(None, key, value, mask=m, need_weights=need_weights)


# ----------------------------------------------------------------------------- learned query


@register(
    "query",
    "learned-query-self-attention",
    aliases=("learned-query", "structured-self-attention"),
)
@renamed_init_arguments({"d_k": "d_features"}, attributes=True)
class LearnedQuerySelfAttention(_PoolingSelfAttention):
    """Self-attention with one or several trainable queries ``q_1..q_r`` (Lin et al. 2017).

    ``K = act(W_1 F)`` when ``key_dim`` is given (``W_1`` ``[key_dim, d_features]``, no bias),
    else ``K = F``; ``e_jl = score(q_j, k_l)``; ``a_j = align(e_j)``; ``c_j = sum_l a_jl
    v_l`` with ``V = F`` (or ``W_V F``). With ``key_dim = d_a``, the default ``dot`` score and
    ``act = tanh`` this is exactly Lin et al.'s ``A = softmax(W_s2 tanh(W_s1 H^T))``,
    ``M = A H``: the rows of ``W_s2`` are the queries. Train it with
    ``loss + coef * module.penalty(out.weights)`` (:func:`orthogonality_penalty`).

    Args:
        d_features: size of the features (formerly ``d_k``, a deprecated keyword for one
            release).
        num_queries: ``r`` (default 1).
        d_q: size of each query (default: the key size).
        score: any score taking a query (default ``dot``); align: any alignment
            (default ``soft``) but ``local-m``, which needs queries that are positions
            (a ``ConfigError``; ``local-p`` predicts the centre).
        key_dim: ``d_a`` of Lin et al. (keys ``act(W_1 F)``); ``None`` (default): keys are
            the features. key_act: the activation of the key projection (``tanh``).
        value_dim: if given, values are ``W_V F`` of that size.
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ...).

    Call: ``forward(query, key=None, value=None, *, mask=None, need_weights=False)``: the
    sequence ``F`` ``[B, n, d_features]`` is ``query`` (the queries ``q_1..q_r`` are
    parameters); the keys are computed from ``key`` (default ``F``), the context averages
    ``value`` (default ``key``), both with the ``B`` and ``n`` of ``F`` (else a
    ``ValueError`` naming both); ``mask`` bool ``[B, n]`` (True = real position) or
    broadcastable to ``[B, r, n]``. Returns :class:`~attnlab.output.AttentionOutput`:
    ``context`` ``[B, r, d_v]`` (``[B, d_v]`` when ``r = 1``), ``weights`` ``[B, r, n]``
    (``[B, n]``). ``out.context.flatten(1)`` is Lin et al.'s sentence embedding.

    Cost: O(B r n d) for dot-product scores (SDPA path) plus O(B n d_features d_a) for the key
    projection; memory O(B r n) for the weights.

    :formula: K = act(W_1 F) (or F); e_jl = score(q_j, k_l) for trainable q_1..q_r; a_j =
        align(e_j); c_j = sum_l a_jl v_l; penalty ||A A^T - I||_F^2
    :source: Lin et al. 2017, A Structured Self-attentive Sentence Embedding
    :cost: O(B r n d_k) for dot scores (+ O(B n d_features d_a) for the key projection)
    """

    def __init__(
        self,
        d_features: int,
        num_queries: int = 1,
        *,
        d_q: int | None = None,
        score: str | Score = "dot",
        align: str = "soft",
        key_dim: int | None = None,
        key_act: str = "tanh",
        value_dim: int | None = None,
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        owner = "LearnedQuerySelfAttention"
        check_int(d_features, "d_features", owner=owner)
        check_optional_int(d_q, "d_q", owner=owner)
        check_optional_int(key_dim, "key_dim", owner=owner)
        self.d_features, self.num_queries = d_features, check_int(num_queries, "num_queries")
        if key_dim is not None:
            self.key_proj: nn.Linear | None = nn.Linear(d_features, key_dim, bias=False)
            self.key_act = key_act
            get_activation(key_act, "key_act")
        else:
            self.key_proj = None
            self.key_act = key_act
        key_size = key_dim if key_dim is not None else d_features
        d_q = key_size if d_q is None else d_q
        self.d_q = d_q
        self.attention = query_scored_attention(
            "learned-query self-attention",
            score,
            align,
            hint=_QUERYLESS_HINT,
            d_q=d_q,
            d_k=key_size,
            d_v=d_features,
            value_dim=value_dim,
            dropout=dropout,
            **options,
        )
        bound = 1.0 / math.sqrt(d_q)
        self.queries = nn.Parameter(torch.empty(num_queries, d_q).uniform_(-bound, bound))

    def keys(self, features: Tensor) -> Tensor:
        """The keys ``act(W_1 F)`` (or ``F``)."""
        if self.key_proj is None:
            return features
        return get_activation(self.key_act)(self.key_proj(features))

    def penalty(self, weights: Tensor, reduction: str = "mean") -> Tensor:
        """Lin et al.'s ``||A A^T - I||_F^2`` of the weights of a call
        (:func:`orthogonality_penalty`)."""
        return orthogonality_penalty(weights, reduction)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        key, value, mask, need_weights = call.key, call.value, call.mask, call.need_weights
        B, n = key.shape[:2]
        r = self.num_queries
        m = _key_mask(mask, B, r, n, key.device)
        if m is not None:
            # padding never matters: cleared (where) before the key projection, whose
            # weight gradient would multiply it
            keep = attended_keys(m)
            cleared = zero_rows(key, keep)
            value = cleared if value is key else zero_rows(value, keep)
            key = cleared
        if r == 1:
            q = self.queries.expand(B, self.d_q)
            if m is not None:
                m = m.expand(B, 1, n)
        else:
            q = self.queries.unsqueeze(0).expand(B, r, self.d_q)
        return self.attention(q, self.keys(key), value, mask=m, need_weights=need_weights)


# ----------------------------------------------------------------------------- relational


_NORMS = ("layernorm", "none")


@register(
    "query",
    "relational-self-attention",
    aliases=("relational", "self-attention", "qkv-self-attention"),
)
class RelationalSelfAttention(SequenceAttention):
    """Relational self-attention: every position queries all positions.

    ``Q = W_Q F``, ``K = W_K F``, ``V = W_V F``; ``c_i = sum_l align(score(q_i, k_l))_l
    v_l``; then the feature update ``f_new_i = c_i`` (``update="replace"``) or
    ``f_new_i = Normalize(f_i + c_i)`` (``update="residual"``, default).

    Args:
        d_f: feature size.
        d_qk: size of queries and keys (default ``d_f``).
        d_v: size of the values (default ``d_f``; must be ``d_f`` for the residual update).
        score: any score taking a query (default ``scaled-dot``, which runs on PyTorch's
            fused SDPA kernel); align: any alignment (default ``soft``; ``local-m`` uses
            the position itself as the window centre).
        dim: ``"single"`` or ``"multi"`` (DiSAN-style vector scores with ``additive``).
        update: ``"residual"`` (default) or ``"replace"``.
        norm: the ``Normalize`` of the residual update: ``"layernorm"`` (default, a
            trainable ``nn.LayerNorm(d_f)``), ``"none"`` / ``None`` (``f + c``), or any
            callable / ``nn.Module`` mapping ``[B, n, d_f]`` to the same shape.
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ``D``, ...).

    Call: ``forward(query, key=None, value=None, *, mask=None, causal=False,
    need_weights=False)``: the features ``F`` ``[B, n, d_f]`` are ``query`` (self-attention
    only: ``key`` / ``value`` must be ``None`` or ``F``); ``mask`` bool broadcastable to
    ``[B, n, n]``
    (True = position i may attend to position l; a padding mask is ``[B, 1, n]``, e.g.
    ``attnlab.masks.from_lengths(lengths)``; a 2-D mask is ``[n, n]``); ``causal=True``
    adds the causal mask (position i attends to l <= i). Returns
    :class:`~attnlab.output.AttentionOutput` with ``context`` = the new features
    ``[B, n, d_f]`` (``[B, n, d_v]`` for ``update="replace"``), ``weights`` ``[B, n, n]``
    with ``need_weights``, and ``extras["attended"]`` = ``c`` before the update. Padding
    positions still get (finite) outputs; ignore them downstream. A row with nothing to
    attend to has ``c = 0``, so its update is ``Normalize(f_i)``.

    Cost: O(B n^2 d_qk) for the scores plus O(B n d_f (2 d_qk + d_v)) for the
    projections; the fused SDPA path keeps memory at O(B n d) when no weights are asked.

    Inside :class:`attnlab.query.transformer.TransformerEncoderLayer` (which adds the
    residual and the norm itself) use ``update="replace"``.

    :formula: Q = W_Q F, K = W_K F, V = W_V F; c_i = sum_l align(score(q_i, k_l))_l v_l; f_new =
        c_i or Normalize(f_i + c_i)
    :source: Vaswani et al. 2017, Attention Is All You Need; Lin et al. 2017, A Structured
        Self-attentive Sentence Embedding
    :cost: O(B n^2 d_qk + B n d_f (2 d_qk + d_v)) time; O(B n d) memory on the fused path
    """

    supports_cross = False  # self-attention only: no separate key sequence
    supports_causal = True
    self_only = True

    def __init__(
        self,
        d_f: int,
        *,
        d_qk: int | None = None,
        d_v: int | None = None,
        score: str | Score = "scaled-dot",
        align: str = "soft",
        dim: str = "single",
        update: str = "residual",
        norm: str | Callable[[Tensor], Tensor] | None = "layernorm",
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(d_f, "d_f", owner="RelationalSelfAttention")
        check_optional_int(d_qk, "d_qk", owner="RelationalSelfAttention")
        check_optional_int(d_v, "d_v", owner="RelationalSelfAttention")
        d_qk = d_f if d_qk is None else d_qk
        d_v = d_f if d_v is None else d_v
        if update not in ("residual", "replace"):
            raise ConfigError(f"update must be 'residual' or 'replace', got {update!r}")
        if update == "residual" and d_v != d_f:
            raise ConfigError(
                f"update='residual' adds c to the features, so d_v must equal d_f; got "
                f"d_v={d_v}, d_f={d_f} (use update='replace' or d_v=d_f)"
            )
        self.d_f, self.d_qk, self.d_v, self.update = d_f, d_qk, d_v, update
        self.d_features = d_f
        self.query_proj = nn.Linear(d_f, d_qk)
        self.attention = query_scored_attention(
            "relational self-attention",
            score,
            align,
            dim,
            query_name="the query (Q = W_Q F)",
            hint=_QUERYLESS_HINT,
            positioned=True,  # query i is position i of the sequence: local-m is p_i = i
            d_q=d_qk,
            d_k=d_f,
            key_dim=d_qk,
            value_dim=d_v,
            dropout=dropout,
            **options,
        )
        self.norm: nn.Module | Callable[[Tensor], Tensor] | None
        if norm is None or norm == "none":
            self.norm = None
        elif norm == "layernorm":
            self.norm = nn.LayerNorm(d_f)
        elif callable(norm):
            self.norm = norm  # an nn.Module is registered as a submodule
        else:
            raise ConfigError(f"norm must be 'layernorm', 'none', None or a callable, got {norm!r}")

    def _attend(self, call: AttentionCall, *, causal: bool = False) -> AttentionOutput:
        features, mask, need_weights = call.query, call.mask, call.need_weights
        B, n = features.shape[:2]
        m = _masks.normalize_mask(mask, B, n, n, device=features.device)
        if causal:
            m = _masks.combine(m, _masks.causal(n, n, device=features.device)[None])
        if m is not None:
            # padding never matters, whatever it holds: the padded positions (no query may
            # attend them) lose their NaN / inf entries before the projections, so that
            # their own (meaningless) outputs stay finite and cannot poison the gradients
            features = clear_nonfinite_rows(features, attended_keys(m))
        q = self.query_proj(features)
        out = self.attention(q, features, features, mask=m, need_weights=need_weights)
        c = out.context
        if self.update == "replace":
            f_new = c
        else:
            f_new = features + c
            if self.norm is not None:
                f_new = self.norm(f_new)
        extras = dict(out.extras)
        extras["attended"] = c
        return AttentionOutput(f_new, out.weights, out.log_prob, out.path, extras)
