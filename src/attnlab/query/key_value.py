"""Key-value attention and concatenated key-value attention, the textbook "multi-query"
attention (seed 002, TAXONOMY section 4).

Key-value attention separates what is *matched* from what is *read*: the inputs are pairs
``(K, V) = [(k_1, v_1), ..., (k_N, v_N)]``; the query is scored against the keys and the
weights average the values:

    att((K, V), q) = sum_n a_n v_n,   a_n = exp(s(k_n, q)) / sum_j exp(s(k_j, q))

Concatenated key-value attention (the textbook's "multi-query attention") asks the same
key-value memory ``M`` questions at once and concatenates the answers:

    att((K, V), Q) = att((K, V), q_1) (+) ... (+) att((K, V), q_M)       ((+) = concat)

Both are thin compositions of the general attention model: the functions call
:func:`attnlab.functional.attend` (fused SDPA for dot-product scores), the modules wrap one
:class:`attnlab.Attention` (any score, any alignment). They are the textbook forms of the
notes in seed 002 (Qiu 2020, *Neural Networks and Deep Learning*, chapter 8); key-value
memories come from Miller et al. 2016.

*Not* Shazeer's multi-query attention: the textbook's "multi-query" means several queries
over one memory with the answers concatenated, hence the names
:class:`ConcatenatedKeyValueAttention` / :func:`concatenated_key_value_attention`. Shazeer
2019's multi-query attention (one shared key/value head for all query heads) is
``MultiHeadAttention(..., num_kv_heads=1)`` in :mod:`attnlab.query.multi_head`. The old
names ``MultiQueryAttention`` / ``multi_query_attention`` (and the keywords ``keys=``,
``values=``, ``queries=``) still work for one release, with a ``DeprecationWarning``.

Cost: O(B n_q n_k d) for dot-product scores (that of the chosen score in general), memory
O(B n_q n_k) for the weights when they are requested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import Tensor

from attnlab._checks import check_flags, check_int, check_module_dtype, check_same, check_tensor
from attnlab._deprecation import deprecated_aliases, renamed_keywords
from attnlab.functional import attend
from attnlab.general.attention import Attention
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall, ConventionAttention
from attnlab.registry import register

__all__ = [
    "ConcatenatedKeyValueAttention",
    "KeyValueAttention",
    "concatenated_key_value_attention",
    "key_value_attention",
]


def _check_kv(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_rank: tuple[int, ...],
    d_q: int | None = None,
    d_k: int | None = None,
    d_v: int | None = None,
) -> None:
    """Shapes, dtypes and devices of a key-value call, with the argument names."""
    check_tensor(key, "key")
    if key.dim() != 3 or (d_k is not None and key.shape[2] != d_k):
        raise ValueError(
            f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k] = "
            f"[B, n_k, {d_k if d_k is not None else 'd_k'}]"
        )
    B, n_k = key.shape[:2]
    check_tensor(value, "value")
    if (
        value.dim() != 3
        or value.shape[:2] != (B, n_k)
        or (d_v is not None and value.shape[2] != d_v)
    ):
        raise ValueError(
            f"value has shape {tuple(value.shape)}, expected [B, n_k, d_v] = "
            f"[{B}, {n_k}, {d_v if d_v is not None else 'd_v'}]"
        )
    check_same(key, "key", value=value)
    check_tensor(query, "query")
    if (
        query.dim() not in query_rank
        or query.shape[0] != B
        or (d_q is not None and query.shape[-1] != d_q)
    ):
        # formatted only here: a symbolic batch size in a message specialises it
        dq = d_q if d_q is not None else "d_q"
        layout = " or ".join(f"[{B}, {dq}]" if r == 2 else f"[{B}, n_q, {dq}]" for r in query_rank)
        raise ValueError(
            f"query has shape {tuple(query.shape)}, expected {layout} ([B, n_q, d_q] "
            "with the batch size of key)"
        )
    check_same(key, "key", query=query)


_RENAMES = {"keys": "key", "values": "value", "queries": "query"}


def _legacy(
    owner: str, options: dict[str, Any], called: str = ".forward()", **current: Any
) -> dict[str, Any]:
    """Take the deprecated keywords (``keys=``, ``values=``, ``queries=``) out of the
    ``**options`` of ``owner`` (a module, or a function with ``called="()"``) and map them
    onto the new names."""
    legacy = {k: options.pop(k) for k in list(options) if k in _RENAMES}
    return renamed_keywords(owner, legacy, _RENAMES, current, called=called)


def key_value_attention(
    query: Tensor | None = None,
    key: Tensor | None = None,
    value: Tensor | None = None,
    score: str = "dot",
    *,
    mask: Tensor | None = None,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Key-value attention ``att((K, V), q) = sum_n softmax_n(s(k_n, q)) v_n``.

    Args:
        query: ``[B, d_q]`` (one query) or ``[B, n_q, d_q]`` (each query row separately).
        key: ``[B, n_k, d_k]`` (default ``query``); value: ``[B, n_k, d_v]`` (paired with
            the keys; default ``key``).
        score: any score name of :func:`attnlab.functional.attend` (default ``dot``,
            ``q^T k_n``; ``general`` with ``W=...``, ``additive`` with ``W1, W2, w``, ...).
        mask: bool broadcastable to ``[B, n_q, n_k]`` (``[B, n_k]`` for one query), True =
            may attend. A query with no allowed key gets zero weights and a zero context.
        need_weights: also return the weights ``a`` ``[B, (n_q,) n_k]``.
        **score_params: the score's parameters (``W``, ``b``, ``W1``, ``W2``, ``w``, ``act``).

    Returns :class:`~attnlab.output.AttentionOutput`, ``context`` ``[B, d_v]`` or
    ``[B, n_q, d_v]``. Cost O(B n_q n_k (d_k + d_v)) for dot-product scores (fused SDPA).
    """
    inputs = (query, key, value)
    return _attend_kv(
        "key_value_attention", inputs, (2, 3), score, mask, need_weights, score_params
    )


def _attend_kv(
    name: str,
    inputs: tuple[Tensor | None, Tensor | None, Tensor | None],
    ndims: tuple[int, ...],
    score: str,
    mask: Tensor | None,
    need_weights: bool,
    score_params: dict[str, Any],
) -> AttentionOutput:
    """The body of the two functional forms ``name``: the deprecated keywords mapped, the
    defaults filled in (``key = query``, ``value = key``), the query's rank checked against
    ``ndims``, then one :func:`attend`."""
    q, k, v = inputs
    a = _legacy(name, score_params, "()", query=q, key=k, value=v)
    query, key, value = _defaults(a["query"], a["key"], a["value"])
    _check_kv(query, key, value, ndims)
    return attend(query, key, value, score, mask=mask, need_weights=need_weights, **score_params)


def _defaults(
    query: Tensor | None, key: Tensor | None, value: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    if query is None:
        raise TypeError("missing the argument 'query'")
    key = query if key is None else key
    return query, key, key if value is None else value


def _concat(out: AttentionOutput, concat: bool) -> AttentionOutput:
    if concat:
        c = out.context
        out.context = c.reshape(c.shape[0], c.shape[1] * c.shape[2])
    return out


def concatenated_key_value_attention(
    query: Tensor | None = None,
    key: Tensor | None = None,
    value: Tensor | None = None,
    score: str = "dot",
    *,
    mask: Tensor | None = None,
    concat: bool = True,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Concatenated key-value attention (the textbook's multi-query attention)
    ``att((K, V), Q) = concat_m att((K, V), q_m)`` (seed 002).

    Args:
        query: ``Q = [q_1..q_M]`` ``[B, M, d_q]``.
        key, value, score, mask, **score_params: as in :func:`key_value_attention`
            (``mask`` broadcastable to ``[B, M, n_k]``; a key mask is ``[B, 1, n_k]``).
        concat: ``True`` (default) returns the concatenation ``[B, M d_v]`` (answer of
            ``q_1`` first); ``False`` keeps the answers apart, ``[B, M, d_v]``.
        need_weights: also return the weights ``[B, M, n_k]`` (one row per query).

    Cost: M key-value attentions in one batched call, O(B M n_k (d_k + d_v)).
    """
    name, inputs = "concatenated_key_value_attention", (query, key, value)
    return _concat(_attend_kv(name, inputs, (3,), score, mask, need_weights, score_params), concat)


@register("query", "key-value", aliases=("key-value-attention", "kv"))
class KeyValueAttention(ConventionAttention):
    """Key-value attention ``att((K, V), q) = sum_n align(s(k_n, q))_n v_n``: one
    :class:`attnlab.Attention` over separate keys and values.

    Args:
        d_q, d_k, d_v: query, key and value sizes (needed by scores with weights, e.g.
            ``general`` or ``additive``; checked at the call when given).
        score: any score (default ``dot``, ``q^T k_n``); align: any alignment (default
            ``soft``, the softmax of the formula).
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ``act``, ...).

    Shapes: ``query`` ``[B, d_q]`` or ``[B, n_q, d_q]``; ``key`` ``[B, n_k, d_k]`` (default
    ``query``); ``value`` ``[B, n_k, d_v]`` (default ``key``); ``mask`` bool broadcastable to ``[B, n_q, n_k]`` (``[B,
    n_k]`` for one query), True = may attend. Returns
    :class:`~attnlab.output.AttentionOutput`: ``context`` ``[B, d_v]`` / ``[B, n_q, d_v]``.

    Cost: that of the score; O(B n_q n_k (d_k + d_v)) on the fused SDPA path for
    dot-product scores with soft alignment.

    :formula: att((K, V), q) = sum_n softmax_n(s(k_n, q)) v_n
    :source: Miller et al. 2016, Key-Value Memory Networks for Directly Reading Documents; Qiu
        2020, Neural Networks and Deep Learning
    :cost: that of the score: O(B n_q n_k (d_k + d_v)) for dot-product scores (fused SDPA)
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

    #: the ranks ``query`` may have: ``[B, d_q]`` or ``[B, n_q, d_q]``
    query_rank: tuple[int, ...] = (2, 3)

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        """The deprecated keywords ``keys=`` / ``values=`` / ``queries=`` (one release)
        mapped onto ``key`` / ``value`` / ``query``; the defaults and the checks."""
        owner = type(self).__name__
        a = _legacy(owner, extras, query=call.query, key=call.key, value=call.value)
        query, key, value = _defaults(a["query"], a["key"], a["value"])
        att = self.attention
        _check_kv(query, key, value, self.query_rank, att.d_q, att.d_k, att.d_v)
        check_module_dtype(self, key, "key")
        return replace(call, query=query, key=key, value=value)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        return self.attention(
            call.query, call.key, call.value, mask=call.mask, need_weights=call.need_weights
        )


@register(
    "query",
    "concatenated-key-value",
    aliases=("multi-query", "multi-query-attention", "concat-key-value"),
)
class ConcatenatedKeyValueAttention(KeyValueAttention):
    """Concatenated key-value attention, the textbook's "multi-query attention": ``M``
    queries over one key-value memory, answers concatenated, ``att((K, V), Q) = concat_m
    att((K, V), q_m)`` (seed 002). Formerly ``MultiQueryAttention`` (a deprecated alias for
    one release): renamed because it is not Shazeer's multi-query attention.

    Args:
        d_q, d_k, d_v, score, align, dropout, **options: as in :class:`KeyValueAttention`
            (one shared :class:`attnlab.Attention` answers every query).
        num_queries: if given, ``queries`` must hold exactly that many rows, and the output
            size is ``num_queries * d_v`` (checked at the call).
        concat: ``True`` (default) returns ``[B, M d_v]``; ``False`` keeps ``[B, M, d_v]``.

    Shapes: ``query`` ``[B, M, d_q]``; ``key`` ``[B, n_k, d_k]`` (default ``query``);
    ``value`` ``[B, n_k, d_v]`` (default ``key``); ``mask`` bool broadcastable to ``[B, M, n_k]`` (a key mask is
    ``[B, 1, n_k]``). ``weights`` (``need_weights=True``) ``[B, M, n_k]``.

    Not Shazeer's multi-query attention (shared key/value heads): that is
    ``MultiHeadAttention(..., num_kv_heads=1)``.

    :formula: att((K, V), Q) = att((K, V), q_1) (+) ... (+) att((K, V), q_M), (+) =
        concatenation
    :source: Qiu 2020, Neural Networks and Deep Learning
    :cost: M key-value attentions: O(B M n_k (d_k + d_v)) for dot-product scores
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
        super().__init__(d_q, d_k, d_v, score=score, align=align, dropout=dropout, **options)
        if num_queries is not None:
            check_int(num_queries, "num_queries")
        self.num_queries = num_queries
        check_flags(concat=concat)
        self.concat = concat

    query_rank = (3,)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query = call.query
        if self.num_queries is not None and query.shape[1] != self.num_queries:
            raise ValueError(
                f"query has shape {tuple(query.shape)}, expected [B, M, d_q] with "
                f"M = num_queries = {self.num_queries}"
            )
        return _concat(super()._attend(call), self.concat)


#: the names renamed in 0.1 (deprecated aliases for one release, with a DeprecationWarning)
DEPRECATED_ALIASES: dict[str, Callable[[], Any]] = {
    "MultiQueryAttention": lambda: ConcatenatedKeyValueAttention,
    "multi_query_attention": lambda: concatenated_key_value_attention,
}

__getattr__ = deprecated_aliases(__name__, DEPRECATED_ALIASES)
