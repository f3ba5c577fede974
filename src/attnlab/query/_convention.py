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
  relative-position, Linformer, Synthesizer, Reformer, Transformer-XL): one ``forward``
  (the preamble: validation, defaults, the dtype check) that hands an
  :class:`AttentionCall` to the subclass's ``_attend``;
* :class:`ConventionAttention` does the same for the plain convention (key-value,
  concatenated key-value, multi-hop) and :class:`SequenceAttention` for the modules whose
  query is learned (:func:`sequence_inputs`);
* :func:`renamed_arguments` / :func:`renamed_init_arguments` / :func:`deprecated_aliases`
  keep old argument and class names working for one release, with a
  ``DeprecationWarning``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import check_module_dtype, check_same, check_tensor
from attnlab.output import AttentionOutput
from attnlab.query.efficient import head_dim_for
from attnlab.registry import Configurable

__all__ = [
    "AttentionCall",
    "ConventionAttention",
    "HeadAttention",
    "SequenceAttention",
    "check_call",
    "deprecated_aliases",
    "deprecated_attribute",
    "positional_masks",
    "renamed_arguments",
    "renamed_init_arguments",
    "sequence_inputs",
]

#: the release in which the deprecated names go away
REMOVED_IN = "0.2.0"


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


@dataclass(frozen=True)
class AttentionCall:
    """The validated arguments of one ``forward`` call of a :class:`HeadAttention`."""

    query: Tensor
    key: Tensor
    value: Tensor
    mask: Tensor | None = None
    causal: bool = False
    need_weights: bool = False
    average_weights: bool = True

    @property
    def self_attention(self) -> bool:
        return self.key is self.query


class HeadAttention(Configurable):
    """Base of the multi-head-style attention modules (multi-head, relative-position,
    Linformer, Synthesizer, Reformer, Transformer-XL): one ``forward``

        forward(query [B, n_q, d_model], key=None, value=None, *, mask=None,
                causal=False, need_weights=False, average_weights=True, **extras)

    that validates the call (:func:`check_call`; self-attention-only mechanisms, with
    ``supports_cross = False``, refuse a separate ``key``/``value``) and passes an
    :class:`AttentionCall` plus the mechanism's extras (``memory=``, ``generator=``) to
    ``_attend``. Subclasses set ``d_model`` (and ``d_k``/``d_v`` when they differ)."""

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
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
        **extras: Any,
    ) -> AttentionOutput:
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
        call = AttentionCall(query, key, value, mask, causal, need_weights, average_weights)
        return self._attend(call, **extras)

    def _attend(self, call: AttentionCall, **extras: Any) -> AttentionOutput:
        raise NotImplementedError


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
        query = renamed_arguments(owner, deprecated, {"features": "query"}, query=query)["query"]
    if query is None:
        raise TypeError(f"{owner}.forward() missing the argument 'query' (the sequence F)")
    if isinstance(key, Tensor) and key.dtype == torch.bool and value is None and mask is None:
        _warn(f"{owner}: the mask as the second positional argument is deprecated; pass mask=")
        key, mask = None, key
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


class ConventionAttention(Configurable):
    """Base of the modules on the plain convention

        forward(query, key=None, value=None, *, mask=None, need_weights=..., **extras)

    (key-value, concatenated key-value and multi-hop attention, and the modules whose
    query is learned): ``_inputs`` checks the call -- an :class:`AttentionCall` whose
    tensors may still be ``None`` -- and maps the deprecated names (popped from
    ``extras``); ``_attend`` computes; the mechanism's other keywords (``causal=``) pass
    through ``extras``. ``need_weights_default`` is ``True`` where the weights are part of
    the result (multi-hop, capsule attention)."""

    need_weights_default: bool = False

    def forward(
        self,
        query: Tensor | None = None,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        need_weights: bool | None = None,
        **extras: Any,
    ) -> Any:
        """``extras``: the mechanism's keywords and the deprecated argument names (one
        release, ``DeprecationWarning``)."""
        if need_weights is None:
            need_weights = self.need_weights_default
        raw = AttentionCall(query, key, value, mask, need_weights=need_weights)  # type: ignore[arg-type]
        return self._attend(self._inputs(raw, extras), **extras)

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        raise NotImplementedError

    def _attend(self, call: AttentionCall, **extras: Any) -> Any:
        raise NotImplementedError


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


# ----------------------------------------------------------------------------- deprecations


_INTERNAL = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # attnlab
    os.path.dirname(os.path.abspath(torch.__file__)),  # torch (Module.__call__)
)


def _warn(message: str, stacklevel: int | None = None) -> None:
    """A ``DeprecationWarning`` attributed to the first frame outside attnlab and torch
    (the user's call), unless ``stacklevel`` is given."""
    if stacklevel is None:
        stacklevel = 2
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
            frame = frame.f_back
            stacklevel += 1
    warnings.warn(f"{message} (removed in attnlab {REMOVED_IN})", DeprecationWarning, stacklevel)


def renamed_arguments(
    owner: str, legacy: dict[str, Any], renames: dict[str, str], **current: Any
) -> dict[str, Any]:
    """Map the deprecated keyword arguments of a call (``legacy``, the ``**kwargs`` of a
    ``forward``) onto their new names (``renames``: old -> new), warning once per use;
    ``current`` are the new-name arguments as passed. Returns ``current`` updated. An
    unknown keyword or an old and a new name together raise ``TypeError``."""
    for old, value in legacy.items():
        new = renames.get(old)
        if new is None:
            raise TypeError(f"{owner}.forward() got an unexpected keyword argument {old!r}")
        if current.get(new) is not None:
            raise TypeError(f"{owner}.forward() got both {old!r} and its new name {new!r}")
        _warn(f"{owner}: the argument {old!r} is deprecated; use {new!r}")
        current[new] = value
    return current


def positional_masks(
    owner: str,
    legacy: tuple[Tensor | None, ...],
    names: tuple[str, ...],
    current: dict[str, Any],
) -> dict[str, Any]:
    """Masks given positionally after the inputs (the old ``module(x1, x2, mask1, mask2)``)
    mapped onto their keywords ``names``, with a ``DeprecationWarning``."""
    if len(legacy) > len(names):
        raise TypeError(f"{owner}.forward() takes at most {len(names)} masks, got {len(legacy)}")
    _warn(
        f"{owner}: masks given positionally are deprecated; pass {', '.join(n + '=' for n in names)}"
    )
    for name, m in zip(names, legacy, strict=False):
        if current.get(name) is not None:
            raise TypeError(f"{owner}.forward() got {name} both positionally and by keyword")
        current[name] = m
    return current


def renamed_init_arguments(**renames: str) -> Callable[[type], type]:
    """Class decorator: the constructor accepts the old keyword names ``renames`` (old ->
    new) with a ``DeprecationWarning``; the recorded config uses the new names."""

    def deco(cls: type) -> type:
        init = cls.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            for old, new in renames.items():
                if old in kw and kw[old] is None:
                    del kw[old]
                elif old in kw:
                    if kw.get(new) is not None:
                        raise TypeError(f"{cls.__name__} got both {old!r} and its new name {new!r}")
                    _warn(f"{cls.__name__}: the argument {old!r} is deprecated; use {new!r}")
                    kw[new] = kw.pop(old)
            init(self, *args, **kw)

        # the old names stay in the signature (keyword-only, default None) so that
        # ``attnlab.build`` still accepts an old config for one release
        params = list(signature.parameters.values())
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        old_params = [
            inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=None) for old in renames
        ]
        params[at:at] = old_params
        __init__.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return deco


class deprecated_attribute:
    """A read-only attribute ``old`` that returns ``new`` with a ``DeprecationWarning``."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        _warn(f"{owner.__name__}.{self.old} is deprecated; use .{self.new}")
        return getattr(obj, self.new)


def deprecated_aliases(
    module_name: str, aliases: dict[str, Callable[[], Any]]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving the old names ``aliases`` (old name -> a function
    returning the new object) with a ``DeprecationWarning``."""

    def __getattr__(name: str) -> Any:
        if name in aliases:
            target = aliases[name]()
            _warn(f"{module_name}.{name} is deprecated; use {target.__name__}")
            return target
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
