"""Key-value attention and (textbook) multi-query attention (seed 002, TAXONOMY section 4).

Key-value attention separates what is *matched* from what is *read*: the inputs are pairs
``(K, V) = [(k_1, v_1), ..., (k_N, v_N)]``; the query is scored against the keys and the
weights average the values:

    att((K, V), q) = sum_n a_n v_n,   a_n = exp(s(k_n, q)) / sum_j exp(s(k_j, q))

Multi-query attention asks the same key-value memory ``M`` questions at once and
concatenates the answers:

    att((K, V), Q) = att((K, V), q_1) (+) ... (+) att((K, V), q_M)       ((+) = concat)

Both are thin compositions of the general attention model: the functions call
:func:`attnlab.functional.attend` (fused SDPA for dot-product scores), the modules wrap one
:class:`attnlab.Attention` (any score, any alignment). They are the textbook forms of the
notes in seed 002 (Qiu 2020, *Neural Networks and Deep Learning*, chapter 8); key-value
memories come from Miller et al. 2016.

*Not* Shazeer's multi-query attention: "multi-query" here means several queries over one
memory with the answers concatenated (the textbook item). Shazeer 2019's multi-query
attention (one shared key/value head for all query heads) is
``MultiHeadAttention(..., num_kv_heads=1)`` in :mod:`attnlab.query.multi_head`.

Cost: O(B n_q n_k d) for dot-product scores (that of the chosen score in general), memory
O(B n_q n_k) for the weights when they are requested.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from attnlab._checks import ConfigError, check_module_dtype, check_same, check_tensor
from attnlab.functional import attend
from attnlab.general.attention import Attention
from attnlab.output import AttentionOutput
from attnlab.registry import Configurable, register

__all__ = [
    "KeyValueAttention",
    "MultiQueryAttention",
    "key_value_attention",
    "multi_query_attention",
]


def _check_kv(
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    query_rank: tuple[int, ...],
    d_q: int | None = None,
    d_k: int | None = None,
    d_v: int | None = None,
    query_name: str = "query",
) -> None:
    """Shapes, dtypes and devices of a key-value call, with the argument names."""
    check_tensor(keys, "keys")
    if keys.dim() != 3 or (d_k is not None and keys.shape[2] != d_k):
        raise ValueError(
            f"keys has shape {tuple(keys.shape)}, expected [B, n_k, d_k] = "
            f"[B, n_k, {d_k if d_k is not None else 'd_k'}]"
        )
    B, n_k = keys.shape[:2]
    check_tensor(values, "values")
    if (
        values.dim() != 3
        or values.shape[:2] != (B, n_k)
        or (d_v is not None and values.shape[2] != d_v)
    ):
        raise ValueError(
            f"values has shape {tuple(values.shape)}, expected [B, n_k, d_v] = "
            f"[{B}, {n_k}, {d_v if d_v is not None else 'd_v'}]"
        )
    check_same(keys, "keys", values=values)
    check_tensor(query, query_name)
    dq = d_q if d_q is not None else "d_q"
    layout = " or ".join(f"[{B}, {dq}]" if r == 2 else f"[{B}, n_q, {dq}]" for r in query_rank)
    if (
        query.dim() not in query_rank
        or query.shape[0] != B
        or (d_q is not None and query.shape[-1] != d_q)
    ):
        raise ValueError(
            f"{query_name} has shape {tuple(query.shape)}, expected {layout} ([B, n_q, d_q] "
            "with the batch size of keys)"
        )
    check_same(keys, "keys", **{query_name: query})


def key_value_attention(
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    score: str = "dot",
    *,
    mask: Tensor | None = None,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Key-value attention ``att((K, V), q) = sum_n softmax_n(s(k_n, q)) v_n``.

    Args:
        query: ``[B, d_q]`` (one query) or ``[B, n_q, d_q]`` (each query row separately).
        keys: ``[B, n_k, d_k]``; values: ``[B, n_k, d_v]`` (paired with the keys).
        score: any score name of :func:`attnlab.functional.attend` (default ``dot``,
            ``q^T k_n``; ``general`` with ``W=...``, ``additive`` with ``W1, W2, w``, ...).
        mask: bool broadcastable to ``[B, n_q, n_k]`` (``[B, n_k]`` for one query), True =
            may attend. A query with no allowed key gets zero weights and a zero context.
        need_weights: also return the weights ``a`` ``[B, (n_q,) n_k]``.
        **score_params: the score's parameters (``W``, ``b``, ``W1``, ``W2``, ``w``, ``act``).

    Returns :class:`~attnlab.output.AttentionOutput`, ``context`` ``[B, d_v]`` or
    ``[B, n_q, d_v]``. Cost O(B n_q n_k (d_k + d_v)) for dot-product scores (fused SDPA).
    """
    _check_kv(query, keys, values, (2, 3))
    return attend(query, keys, values, score, mask=mask, need_weights=need_weights, **score_params)


def _concat(out: AttentionOutput, concat: bool) -> AttentionOutput:
    if concat:
        c = out.context
        out.context = c.reshape(c.shape[0], c.shape[1] * c.shape[2])
    return out


def multi_query_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    score: str = "dot",
    *,
    mask: Tensor | None = None,
    concat: bool = True,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Multi-query attention ``att((K, V), Q) = concat_m att((K, V), q_m)`` (seed 002).

    Args:
        queries: ``Q = [q_1..q_M]`` ``[B, M, d_q]``.
        keys, values, score, mask, **score_params: as in :func:`key_value_attention`
            (``mask`` broadcastable to ``[B, M, n_k]``; a key mask is ``[B, 1, n_k]``).
        concat: ``True`` (default) returns the concatenation ``[B, M d_v]`` (answer of
            ``q_1`` first); ``False`` keeps the answers apart, ``[B, M, d_v]``.
        need_weights: also return the weights ``[B, M, n_k]`` (one row per query).

    Cost: M key-value attentions in one batched call, O(B M n_k (d_k + d_v)).
    """
    _check_kv(queries, keys, values, (3,), query_name="queries")
    out = attend(queries, keys, values, score, mask=mask, need_weights=need_weights, **score_params)
    return _concat(out, concat)


@register(
    "query",
    "key-value",
    formula="att((K, V), q) = sum_n softmax_n(s(k_n, q)) v_n",
    source="Miller et al. 2016, Key-Value Memory Networks for Directly Reading Documents; Qiu 2020, Neural Networks and Deep Learning",
    cost="that of the score: O(B n_q n_k (d_k + d_v)) for dot-product scores (fused SDPA)",
    aliases=("key-value-attention", "kv"),
)
class KeyValueAttention(Configurable):
    """Key-value attention ``att((K, V), q) = sum_n align(s(k_n, q))_n v_n``: one
    :class:`attnlab.Attention` over separate keys and values.

    Args:
        d_q, d_k, d_v: query, key and value sizes (needed by scores with weights, e.g.
            ``general`` or ``additive``; checked at the call when given).
        score: any score (default ``dot``, ``q^T k_n``); align: any alignment (default
            ``soft``, the softmax of the formula).
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ``act``, ...).

    Shapes: ``query`` ``[B, d_q]`` or ``[B, n_q, d_q]``; ``keys`` ``[B, n_k, d_k]``;
    ``values`` ``[B, n_k, d_v]``; ``mask`` bool broadcastable to ``[B, n_q, n_k]`` (``[B,
    n_k]`` for one query), True = may attend. Returns
    :class:`~attnlab.output.AttentionOutput`: ``context`` ``[B, d_v]`` / ``[B, n_q, d_v]``.

    Cost: that of the score; O(B n_q n_k (d_k + d_v)) on the fused SDPA path for
    dot-product scores with soft alignment.
    """

    def __init__(
        self,
        d_q: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        *,
        score: str = "dot",
        align: str = "soft",
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        self.attention = Attention(
            score, align, d_q=d_q, d_k=d_k, d_v=d_v, dropout=dropout, **options
        )

    def forward(
        self,
        query: Tensor,
        keys: Tensor,
        values: Tensor,
        *,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        a = self.attention
        _check_kv(query, keys, values, (2, 3), a.d_q, a.d_k, a.d_v)
        check_module_dtype(self, keys, "keys")
        return self.attention(query, keys, values, mask=mask, need_weights=need_weights)


@register(
    "query",
    "multi-query",
    formula="att((K, V), Q) = att((K, V), q_1) (+) ... (+) att((K, V), q_M), (+) = concatenation",
    source="Qiu 2020, Neural Networks and Deep Learning",
    cost="M key-value attentions: O(B M n_k (d_k + d_v)) for dot-product scores",
    aliases=("multi-query-attention",),
)
class MultiQueryAttention(Configurable):
    """Textbook multi-query attention: ``M`` queries over one key-value memory, answers
    concatenated, ``att((K, V), Q) = concat_m att((K, V), q_m)`` (seed 002).

    Args:
        d_q, d_k, d_v, score, align, dropout, **options: as in :class:`KeyValueAttention`
            (one shared :class:`attnlab.Attention` answers every query).
        num_queries: if given, ``queries`` must hold exactly that many rows, and the output
            size is ``num_queries * d_v`` (checked at the call).
        concat: ``True`` (default) returns ``[B, M d_v]``; ``False`` keeps ``[B, M, d_v]``.

    Shapes: ``queries`` ``[B, M, d_q]``; ``keys`` ``[B, n_k, d_k]``; ``values``
    ``[B, n_k, d_v]``; ``mask`` bool broadcastable to ``[B, M, n_k]`` (a key mask is
    ``[B, 1, n_k]``). ``weights`` (``need_weights=True``) ``[B, M, n_k]``.

    Not Shazeer's multi-query attention (shared key/value heads): that is
    ``MultiHeadAttention(..., num_kv_heads=1)``.
    """

    def __init__(
        self,
        d_q: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        *,
        num_queries: int | None = None,
        concat: bool = True,
        score: str = "dot",
        align: str = "soft",
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        if num_queries is not None and (
            isinstance(num_queries, bool) or not isinstance(num_queries, int) or num_queries < 1
        ):
            raise ConfigError(f"num_queries must be an int >= 1 or None, got {num_queries!r}")
        self.num_queries = num_queries
        self.concat = bool(concat)
        self.attention = Attention(
            score, align, d_q=d_q, d_k=d_k, d_v=d_v, dropout=dropout, **options
        )

    def forward(
        self,
        queries: Tensor,
        keys: Tensor,
        values: Tensor,
        *,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        a = self.attention
        _check_kv(queries, keys, values, (3,), a.d_q, a.d_k, a.d_v, query_name="queries")
        check_module_dtype(self, keys, "keys")
        if self.num_queries is not None and queries.shape[1] != self.num_queries:
            raise ValueError(
                f"queries has shape {tuple(queries.shape)}, expected [B, M, d_q] with "
                f"M = num_queries = {self.num_queries}"
            )
        out = self.attention(queries, keys, values, mask=mask, need_weights=need_weights)
        return _concat(out, self.concat)
