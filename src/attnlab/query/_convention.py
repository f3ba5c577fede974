"""The call convention shared by every query-related attention module.

``forward(query, key=None, value=None, *, mask=None, need_weights=False, ...)`` returning
:class:`~attnlab.output.AttentionOutput` (or a documented subclass / output record):
``key`` defaults to ``query`` (self-attention) and ``value`` to ``key``. Modules whose
query is learned (constant-query, learned-query, relational and capsule attention, capsule
routing) take the sequence they attend over as ``query`` too, so that ``module(x)`` is
self-attention over ``x`` for every module (see ``docs/call-convention.md``).

This module holds what the modules would otherwise each repeat:

* :func:`check_call` validates ``query``/``key``/``value`` once, with messages that name
  the argument, its shape and the expected shape;
* :class:`HeadAttention` is the base of the multi-head-style modules (multi-head,
  relative-position, Linformer, Synthesizer, Reformer, Transformer-XL), on the shared
  ``forward``: its ``_inputs`` (validation, defaults, the dtype check, ``causal`` and
  ``average_weights``) hands an :class:`AttentionCall` to the subclass's ``_attend``;
* :class:`~attnlab.general._convention.ConventionAttention` (defined in the general
  layer, where the feature-related modules inherit it too, and re-exported here with
  :class:`AttentionCall`) is the one ``forward`` of the plain convention (key-value,
  concatenated key-value, multi-hop, attention-over-attention) and
  :class:`SequenceAttention` its subclass for the modules whose query is learned
  (:func:`sequence_inputs`);
* :func:`sequence_inputs` also maps the deprecated forms of the learned-query modules
  (``features=``, the positional mask) through :mod:`attnlab._deprecation`, the one home
  of the deprecation helpers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_flags,
    check_module_dtype,
    check_same,
    check_tensor,
)
from attnlab._deprecation import positional_masks, renamed_keywords
from attnlab.general._convention import AttentionCall, ConventionAttention
from attnlab.general.alignment import refuse_local_m
from attnlab.general.attention import Attention
from attnlab.output import AttentionOutput
from attnlab.query.efficient import head_dim_for

__all__ = [
    "AttentionCall",
    "ConventionAttention",
    "HeadAttention",
    "SequenceAttention",
    "check_call",
    "query_scored_attention",
    "sequence_inputs",
]


def check_call(
    query: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    *,
    d_model: int,
    d_k: int,
    d_v: int,
    module: nn.Module | None = None,
) -> tuple[Tensor, Tensor]:
    """Validate ``query``/``key``/``value`` and return ``(key, value)`` with the defaults
    applied. ``query`` is checked against the dtype/device of ``module``'s parameters."""
    check_tensor(query, "query")
    if query.dim() != 3 or query.shape[-1] != d_model:
        raise ValueError(
            f"query has shape {tuple(query.shape)}, expected [B, n_q, d_model] = "
            f"[B, n_q, {d_model}]"
        )
    key = query if key is None else key
    value = key if value is None else value
    B = query.shape[0]
    check_tensor(key, "key")
    check_tensor(value, "value")
    if key.dim() != 3 or key.shape[0] != B or key.shape[-1] != d_k:
        raise ValueError(
            f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k] = [{B}, n_k, {d_k}]"
        )
    n_k = key.shape[1]
    if value.dim() != 3 or value.shape[:2] != (B, n_k) or value.shape[-1] != d_v:
        raise ValueError(
            f"value has shape {tuple(value.shape)}, expected [B, n_k, d_v] = [{B}, {n_k}, {d_v}]"
        )
    check_same(query, "query", key=key, value=value)
    if module is not None:
        check_module_dtype(module, query, "query")
    return key, value


def check_self_only(
    mechanism: str, query: Tensor, key: Tensor | None, value: Tensor | None
) -> None:
    """A self-attention-only mechanism accepts ``key``/``value`` only as ``None`` or the
    query itself."""
    for name, t in (("key", key), ("value", value)):
        if t is not None and t is not query:
            raise ValueError(
                f"{mechanism} is self-attention only: {name} must be None (or the query "
                f"itself), got a tensor of shape {tuple(t.shape)}"
            )


class HeadAttention(ConventionAttention):
    """Base of the multi-head-style attention modules (multi-head, relative-position,
    Linformer, Synthesizer, Reformer, Transformer-XL), on the one ``forward`` of
    :class:`ConventionAttention`::

        forward(query [B, n_q, d_model], key=None, value=None, *, mask=None,
                causal=False, need_weights=False, average_weights=True, **extras)

    Its ``_inputs`` validates the call (:func:`check_call`; self-attention-only mechanisms,
    with ``supports_cross = False``, refuse a separate ``key``/``value``) and moves
    ``causal`` and ``average_weights`` into the :class:`AttentionCall`; ``_attend`` gets
    the call plus the mechanism's own keywords (``memory=``, ``generator=``). Subclasses
    set ``d_model`` (and ``d_k``/``d_v`` when they differ)."""

    supports_cross: bool = True
    supports_causal: bool = True
    d_model: int

    def _init_heads(self, d_model: int, num_heads: int, head_dim: int | None) -> int:
        """Check and set ``d_model``, ``num_heads`` and ``head_dim`` (default
        ``d_model // num_heads``, which must divide); returns ``head_dim``."""
        hd = head_dim_for(d_model, num_heads, head_dim)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, hd
        return hd

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *more: Tensor | None,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
        **extras: Any,
    ) -> AttentionOutput:
        """The convention's ``forward`` with the multi-head keywords ``causal`` and
        ``average_weights`` named in the signature; ``extras``: the mechanism's own
        keywords. A keyword the mechanism does not take, or a fourth positional argument
        (``more``), is a one-line ``TypeError`` naming the module."""
        check_flags(causal=causal, average_weights=average_weights)
        return super().forward(
            query,
            key,
            value,
            *more,
            mask=mask,
            need_weights=need_weights,
            causal=causal,
            average_weights=average_weights,
            **extras,
        )

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        query, key, value = call.query, call.key, call.value
        if self.supports_cross:
            d_k = getattr(self, "d_k", self.d_model)
            d_v = getattr(self, "d_v", d_k)
            key, value = check_call(
                query, key, value, d_model=self.d_model, d_k=d_k, d_v=d_v, module=self
            )
        else:
            check_tensor(query, "query")
            if query.dim() != 3 or query.shape[-1] != self.d_model:
                raise ValueError(
                    f"query has shape {tuple(query.shape)}, expected [B, n_q, d_model] = "
                    f"[B, n_q, {self.d_model}]"
                )
            check_self_only(self.registry_name, query, key, value)
            check_module_dtype(self, query)
            key = value = query
        causal = extras.pop("causal", False)
        average_weights = extras.pop("average_weights", True)
        return AttentionCall(
            query, key, value, call.mask, causal, call.need_weights, average_weights
        )

    def _attend(self, call: AttentionCall, **extras: Any) -> AttentionOutput:
        raise NotImplementedError


def query_scored_attention(
    mechanism: str,
    *args: Any,
    query_name: str = "the query",
    hint: str = "",
    positioned: bool = False,
    **options: Any,
) -> Attention:
    """A general :class:`~attnlab.general.attention.Attention` (``Attention(*args,
    **options)``) for a mechanism that scores its keys against a query -- a learned query
    (capsule, learned-query and relational self-attention) or a state (multi-hop). A score
    that takes no query is a one-line ``ConfigError``: "``mechanism`` needs a score that
    takes ``query_name``" followed by ``hint``. Unless the queries are positions of the
    key sequence (``positioned``: relational self-attention), ``align="local-m"`` is a
    ``ConfigError`` too: it centres query ``i``'s window on key ``i``, which for a learned
    query or a state is no position at all (the window sat on the first keys)."""
    attention = Attention(*args, **options)
    if not attention.score.needs_query:
        raise ConfigError(f"{mechanism} needs a score that takes {query_name}{hint}")
    if not positioned:
        refuse_local_m(
            attention.align,
            f"{query_name} has no position among the keys",
            "the query",
            who=f"{mechanism}: ",
        )
    return attention


# ----------------------------------------------------------------------------- learned queries


def check_sequence(x: Tensor, d: int, name: str) -> None:
    """``x`` is a float tensor ``[B, n, d]``."""
    check_tensor(x, name)
    if x.dim() != 3 or x.shape[2] != d:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected [B, n, d_f] = [B, n, {d}]")


def sequence_inputs(
    module: nn.Module,
    query: Tensor | None,
    key: Tensor | None,
    value: Tensor | None,
    mask: Tensor | None,
    deprecated: dict[str, Any],
    d_features: int,
    *,
    self_only: bool = False,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The inputs of a module whose query is learned: the sequence ``F`` is ``query``;
    ``key`` defaults to it and ``value`` to ``key`` (``self_only``: they must be ``None``
    or ``F`` itself). Accepts for one release, with a ``DeprecationWarning``, the old
    keyword ``features=`` and the old positional mask (``module(F, mask)``: a bool tensor
    in the ``key`` slot). Checks the shapes and the dtype against the parameters; returns
    ``(query, key, value, mask)``."""
    owner = type(module).__name__
    if deprecated:
        args = renamed_keywords(owner, deprecated, {"features": "query"}, {"query": query})
        query = args["query"]
    if query is None:
        raise TypeError(f"{owner}.forward() missing the argument 'query' (the sequence F)")
    if isinstance(key, Tensor) and key.dtype == torch.bool and value is None and mask is None:
        mask = positional_masks(owner, (key,), ("mask",), {}, position=2)["mask"]
        key = None
    if self_only:
        check_self_only(owner, query, key, value)
    check_sequence(query, d_features, "query")
    if key is not None and key is not query:
        check_sequence(key, d_features, "key")
        check_same(query, "query", key=key)
    key = query if key is None else key
    value = key if value is None else value
    if value is not key:
        check_tensor(value, "value")
        if value.dim() != 3 or value.shape[:2] != key.shape[:2]:
            raise ValueError(
                f"value has shape {tuple(value.shape)}, expected [B, n, d_v] = "
                f"[{key.shape[0]}, {key.shape[1]}, d_v]"
            )
        check_same(key, "key", value=value)
    check_module_dtype(module, query, "query")
    return query, key, value, mask


class SequenceAttention(ConventionAttention):
    """Base of the modules whose query is learned (constant-query, learned-query,
    relational and capsule attention, capsule routing): ``query`` is the sequence ``F``
    ``[B, n, d_features]`` (see :func:`sequence_inputs`; ``features=`` is its deprecated
    name). Subclasses set ``d_features`` and ``self_only`` (relational, capsule,
    routing)."""

    d_features: int
    self_only: bool = False

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        legacy = {"features": extras.pop("features")} if "features" in extras else {}
        query, key, value, mask = sequence_inputs(
            self,
            call.query,
            call.key,
            call.value,
            call.mask,
            legacy,
            self.d_features,
            self_only=self.self_only,
        )
        return replace(call, query=query, key=key, value=value, mask=mask)
