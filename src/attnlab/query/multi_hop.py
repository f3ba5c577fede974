"""Multi-hop (multi-step) attention (Yang et al. 2016, SAN; Tran & Niederee 2018, MAN;
survey section 3.3.2, TAXONOMY section 3.2).

The query is refined over ``S`` attention steps ("hops"); each hop reads the features with
the current query and the answer changes the query of the next hop:

    c^(0)   = mean of the values (masked: the mean over the positions the query may see)
    for s = 0 .. S-1:
        q^(s+1) = transform(q^(s), c^(s))
        query   = q^(s+1)                      (query_form="state", default)
                  concat(q^(s+1), c^(s))       (query_form="concat", the survey's form)
        e^(s+1)_l = score(query, k_l);  a^(s+1) = align(e^(s+1))
        c^(s+1) = sum_l a^(s+1)_l v_l
    output: c^(S) (and q^(S), every hop's weights a^(1..S))

Transforms (``d_q`` = query size, ``d_c`` = value size; see :data:`TRANSFORMS`):

* ``"sum"``: ``q' = q + c`` (SAN's ``u^k = u^(k-1) + v~^k``; needs ``d_c = d_q``; no
  parameters);
* ``"linear"``: ``q' = W_q q + W_c c + b`` (an affine map of both; ``W_q`` ``[d_q, d_q]``,
  ``W_c`` ``[d_q, d_c]``; with ``W_q = H``, ``W_c = I`` it is MemN2N's ``H u + o``);
* ``"gru"``: ``q' = GRUCell(input=c, hidden=q)`` (``torch.nn.GRUCell(d_c, d_q)``: the
  query is the recurrent state, the context its input);
* ``"concat"`` (default): ``q' = tanh(W [q; c] + b)`` (concatenate, project back to
  ``d_q``, squash; ``W`` ``[d_q, d_q + d_c]``);
* any callable ``f(q, c) -> q'`` (an ``nn.Module`` is registered and trained).

Each hop is an :class:`attnlab.Attention` (any score and alignment); ``share_weights=True``
(default) uses one attention and one transform in every hop, ``False`` gives each hop its
own (S times the parameters).

**The start ``c^(0)`` differs from SAN and MemN2N.** The schedule is the survey's: the
first hop already scores with ``transform(q, c^(0))``, ``c^(0)`` the mean of the values.
SAN (and MemN2N) attend first with the question itself, ``u^0 = q``, and update after
each hop, ``u^k = u^(k-1) + v~^k``. So ``transform="sum"`` applies SAN's update rule to
another start: its hop ``s`` scores with ``q + c^(0) + c^(1) + .. + c^(s-1)``, SAN's hop
``s`` with ``q + v~^1 + .. + v~^(s-1)`` (no mean term). SAN's answer feature is its last
query ``u^S = u^(S-1) + v~^S`` (the analogue here is ``q^(S) + c^(S)``, the module returns
``c^(S)`` and ``q^(S)``); SAN also gives every hop its own weights (``share_weights=False``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from attnlab import masks as _masks
from attnlab._checks import ConfigError, check_int, check_module_dtype, check_same, check_tensor
from attnlab._deprecation import renamed_keywords
from attnlab.general.padding import (
    attended_keys,
    attending_rows,
    clear_attention_inputs,
    clear_nonfinite_rows,
    zero_rows,
)
from attnlab.output import AttentionOutput, joint_log_prob
from attnlab.query._convention import AttentionCall, ConventionAttention, query_scored_attention
from attnlab.registry import register

__all__ = ["TRANSFORMS", "MultiHopAttention", "masked_mean_values"]


class _Sum(nn.Module):
    def forward(self, q: Tensor, c: Tensor) -> Tensor:
        return q + c


class _Linear(nn.Module):
    def __init__(self, d_q: int, d_c: int, act: bool) -> None:
        super().__init__()
        self.proj = nn.Linear(d_q + d_c, d_q)
        self.act = act

    def forward(self, q: Tensor, c: Tensor) -> Tensor:
        out = self.proj(torch.cat([q, c], -1))
        return torch.tanh(out) if self.act else out


class _GRU(nn.Module):
    def __init__(self, d_q: int, d_c: int) -> None:
        super().__init__()
        self.cell = nn.GRUCell(d_c, d_q)

    def forward(self, q: Tensor, c: Tensor) -> Tensor:
        lead = q.shape[:-1]
        out = self.cell(c.reshape(-1, c.shape[-1]), q.reshape(-1, q.shape[-1]))
        return out.reshape(*lead, q.shape[-1])


#: The named query transforms ``q^(s+1) = transform(q^(s), c^(s))``.
TRANSFORMS = {
    "sum": "q' = q + c (needs d_c = d_q)",
    "linear": "q' = W_q q + W_c c + b",
    "gru": "q' = GRUCell(input=c, hidden=q)",
    "concat": "q' = tanh(W [q; c] + b)",
}


def _make_transform(
    transform: str | Callable[[Tensor, Tensor], Tensor], d_q: int, d_c: int
) -> nn.Module | Callable[[Tensor, Tensor], Tensor]:
    if callable(transform):
        return transform
    if transform == "sum":
        if d_c != d_q:
            raise ConfigError(
                f"transform='sum' adds the context to the query, so it needs d_v == d_q; got "
                f"d_v={d_c}, d_q={d_q} (use 'linear', 'gru' or 'concat')"
            )
        return _Sum()
    if transform == "linear":
        return _Linear(d_q, d_c, act=False)
    if transform == "concat":
        return _Linear(d_q, d_c, act=True)
    if transform == "gru":
        return _GRU(d_q, d_c)
    raise ConfigError(
        f"transform must be one of {sorted(TRANSFORMS)} or a callable f(q, c) -> q', got "
        f"{transform!r}"
    )


def masked_mean_values(values: Tensor, mask: Tensor | None, n_q: int) -> Tensor:
    """``c^(0)``: for each query row, the mean of the values it may attend to.

    ``values`` ``[B, n_k, d_v]``; ``mask`` bool broadcastable to ``[B, n_q, n_k]`` (or
    ``None``). Returns ``[B, n_q, d_v]``; a row with no allowed value (or ``n_k = 0``) gets
    zeros. Values that no query may attend never matter, whatever they hold."""
    B, n_k = values.shape[:2]
    if mask is None:
        allowed = values.new_ones(B, n_q, n_k)
    else:
        allowed = mask.expand(B, n_q, n_k).to(values.dtype)
        # a value no query may attend never matters (where, not 0 * v: 0 * NaN = NaN)
        values = zero_rows(values, attended_keys(mask))
    return (allowed / allowed.sum(-1, keepdim=True).clamp(min=1)) @ values


@register("query", "multi-hop", aliases=("multi-step", "multihop", "stacked-attention"))
class MultiHopAttention(ConventionAttention):
    """Multi-hop attention: ``S`` attention steps, each refining the query with the last
    context (see the module docstring for the recursion and the transforms).

    Args:
        d_q: query size. d_k: feature / key size. d_v: value size (default ``d_k``).
        hops: number of hops ``S`` (>= 1).
        transform: ``"concat"`` (default), ``"gru"``, ``"linear"``, ``"sum"`` or a callable
            ``f(q, c) -> q'`` (module docstring; a callable is shared by all hops).
        share_weights: one attention and one transform for every hop (default) or one per
            hop.
        query_form: ``"state"`` (default): hop ``s+1`` scores with ``q^(s+1)``;
            ``"concat"``: it scores with ``concat(q^(s+1), c^(s))`` (the survey's form
            ``e^(s)_l = score(concat(q^(s+1), c^(s)), k_l)``; the score then sees
            ``d_q + d_v`` inputs).
        score: any score taking a query (default ``additive``, SAN's
            ``w^T tanh(W_1 q + W_2 k_l + b)``); align: any alignment (default ``soft``)
            but ``local-m``, which needs queries that are positions (``ConfigError``).
        key_dim: if given, every hop's attention projects the keys ``W_K F`` to that size.
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ``act``, ...).

    Call: ``forward(query, key=None, value=None, *, mask=None, need_weights=True)``
    (``need_weights`` defaults to ``True`` here: the per-hop weights are part of the
    result). Shapes: ``query`` ``[B, d_q]`` or ``[B, n_q, d_q]``; ``key`` ``[B, n_k, d_k]``
    (default ``query``); ``value`` ``[B, n_k, d_v]`` (default: the keys); ``mask`` bool broadcastable to
    ``[B, n_q, n_k]`` (``[B, n_k]`` for one query), True = may attend. Returns
    :class:`~attnlab.output.AttentionOutput` with ``context`` ``c^(S)`` ``[B, d_v]`` /
    ``[B, n_q, d_v]``, ``weights`` (every hop, with ``need_weights=True``, the default)
    ``[B, S, n_k]`` / ``[B, S, n_q, n_k]``, and ``extras``: ``"query"`` (``q^(S)``),
    ``"queries"`` (``[q^(1), ..., q^(S)]``), ``"contexts"`` (``[c^(0), ..., c^(S)]``); with
    a stochastic alignment ``log_prob``, the sum of the hops' log-probabilities. A
    row with nothing to attend to has ``c^(s) = 0`` for every ``s`` (zero weights).

    Cost: S hops of the chosen attention (O(B n_q n_k d_w) each for the additive score)
    plus S transforms O(B n_q d_q (d_q + d_v)); the hops are sequential.

    :formula: c^(0) = mean(V); q^(s+1) = transform(q^(s), c^(s)); e^(s+1)_l = score(q^(s+1) or
        [q^(s+1); c^(s)], k_l); c^(s+1) = sum_l align(e^(s+1))_l v_l
    :source: Yang et al. 2016, Stacked Attention Networks for Image Question Answering (SAN);
        Tran & Niederee 2018, Multihop Attention Networks for Question Answer Matching
    :cost: S times one attention plus S transforms: O(S B n_q (n_k cost_score + d_q (d_q +
        d_v)))
    """

    need_weights_default = True

    def __init__(
        self,
        d_q: int,
        d_k: int,
        d_v: int | None = None,
        hops: int = 2,
        *,
        transform: str | Callable[[Tensor, Tensor], Tensor] = "concat",
        share_weights: bool = True,
        query_form: str = "state",
        score: str = "additive",
        align: str = "soft",
        key_dim: int | None = None,
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(hops, "hops")
        if query_form not in ("state", "concat"):
            raise ConfigError(f"query_form must be 'state' or 'concat', got {query_form!r}")
        d_v = d_k if d_v is None else d_v
        self.d_q, self.d_k, self.d_v, self.hops = d_q, d_k, d_v, hops
        self.query_form = query_form
        d_score = d_q if query_form == "state" else d_q + d_v
        n = 1 if share_weights else hops
        self.attentions = nn.ModuleList(
            [
                query_scored_attention(
                    "multi-hop attention",
                    score,
                    align,
                    d_q=d_score,
                    d_k=d_k,
                    d_v=d_v,
                    key_dim=key_dim,
                    dropout=dropout,
                    **options,
                )
                for _ in range(n)
            ]
        )
        transforms = [_make_transform(transform, d_q, d_v) for _ in range(n)]
        if all(isinstance(t, nn.Module) for t in transforms):
            self.transforms: nn.ModuleList | list[Any] = nn.ModuleList(transforms)
        else:
            self.transforms = transforms

    def _check(
        self, query: Tensor, key: Tensor, value: Tensor | None
    ) -> tuple[Tensor, bool, Tensor]:
        check_tensor(key, "key")
        if key.dim() != 3 or key.shape[2] != self.d_k:
            raise ValueError(
                f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k] = [B, n_k, {self.d_k}]"
            )
        B, n_k = key.shape[:2]
        check_tensor(query, "query")
        if query.dim() not in (2, 3) or query.shape[0] != B or query.shape[-1] != self.d_q:
            raise ValueError(
                f"query has shape {tuple(query.shape)}, expected [B, d_q] = [{B}, {self.d_q}] "
                f"or [B, n_q, d_q] = [{B}, n_q, {self.d_q}]"
            )
        if value is None:
            if self.d_v != self.d_k:
                raise ValueError(
                    f"value is None, so the values are the keys {tuple(key.shape)}, but this "
                    f"module has d_v={self.d_v}; pass value [B, n_k, d_v] = [{B}, {n_k}, "
                    f"{self.d_v}]"
                )
            value = key
        else:
            check_tensor(value, "value")
            if value.dim() != 3 or value.shape != (B, n_k, self.d_v):
                raise ValueError(
                    f"value has shape {tuple(value.shape)}, expected [B, n_k, d_v] = "
                    f"[{B}, {n_k}, {self.d_v}]"
                )
        check_same(key, "key", query=query, value=value)
        check_module_dtype(self, key, "key")
        single = query.dim() == 2
        return (query.unsqueeze(1) if single else query), single, value

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        """The deprecated keywords ``keys=`` / ``values=`` (one release) mapped onto
        ``key`` / ``value``; ``key`` defaults to ``query``."""
        legacy = {k: extras.pop(k) for k in ("keys", "values") if k in extras}
        renames = {"keys": "key", "values": "value"}
        current = {"key": call.key, "value": call.value}
        a = renamed_keywords(type(self).__name__, legacy, renames, current)
        if call.query is None:
            raise TypeError(f"{type(self).__name__}.forward() missing the argument 'query'")
        keys = call.query if a["key"] is None else a["key"]
        _, _, values = self._check(call.query, keys, a["value"])
        return replace(call, key=keys, value=values)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query, keys, values, mask = call.query, call.key, call.value, call.mask
        need_weights = call.need_weights
        single = query.dim() == 2
        q = query.unsqueeze(1) if single else query
        B, n_q = q.shape[:2]
        n_k = keys.shape[1]
        m = _masks.normalize_mask(mask, B, n_q, n_k, device=keys.device, single_query=single)
        if m is not None:
            # padding never matters: padded keys / values are zeroed (where, not a
            # product), and a query row that may attend nothing -- still transformed hop by
            # hop, its states reported in extras -- loses its NaN / inf entries
            _, keys, values = clear_attention_inputs(None, keys, values, m)
            q = clear_nonfinite_rows(q, attending_rows(m))
        c = masked_mean_values(values, m, n_q)
        queries: list[Tensor] = []
        contexts: list[Tensor] = [c]
        hop_weights: list[Tensor] = []
        hop_outs: list[AttentionOutput] = []
        for s in range(self.hops):
            transform = self.transforms[s % len(self.transforms)]
            attention = self.attentions[s % len(self.attentions)]
            q_new = transform(q, c)
            if not isinstance(q_new, Tensor) or q_new.shape != q.shape:
                got = tuple(q_new.shape) if isinstance(q_new, Tensor) else type(q_new).__name__
                raise ValueError(
                    f"transform returned {got}, expected the query shape {tuple(q.shape)}"
                )
            q = q_new
            hop_query = q if self.query_form == "state" else torch.cat([q, c], -1)
            out = attention(hop_query, keys, values, mask=m, need_weights=need_weights)
            c = out.context
            hop_outs.append(out)
            queries.append(q)
            contexts.append(c)
            if need_weights:
                hop_weights.append(out.weights)  # type: ignore[arg-type]
        weights = torch.stack(hop_weights, 1) if need_weights else None
        log_prob = joint_log_prob(hop_outs)  # stochastic hops: their draws together
        if single:
            if log_prob is not None and log_prob.dim() == 2:  # hard: [B, 1]; reinforced: [B]
                log_prob = log_prob.squeeze(1)
            squeeze = [t.squeeze(1) for t in queries]
            contexts = [t.squeeze(1) for t in contexts]
            queries = squeeze
            if weights is not None:
                weights = weights.squeeze(2)
        extras = {"query": queries[-1], "queries": queries, "contexts": contexts}
        return AttentionOutput(contexts[-1], weights, log_prob, "multi-hop", extras)
