"""The one ``forward`` of the call convention (``docs/call-convention.md``).

``forward(query=None, key=None, value=None, *, mask=None, need_weights=..., **extras)``:
:class:`ConventionAttention` owns it, once, for the feature-related modules
(co-attention, rotatory, hierarchical, attention-via-attention, meta-embeddings) and the
query-related modules on the plain convention (key-value, multi-hop, the learned-query
modules, attention-over-attention); :class:`TwoInputAttention` adds the checks of the
two-input mechanisms. A module implements two steps:

* ``_inputs(call, extras)`` checks and completes the :class:`AttentionCall` (defaults,
  refused arguments, the deprecated keyword names it pops from ``extras`` with
  :meth:`ConventionAttention._renamed`);
* ``_attend(call, **keywords)`` computes; its keyword parameters are the mechanism's own
  keywords (``mask1=``, ``left_mask=``, ``word_offsets=``, ``causal=``, ...), and any
  other keyword is a one-line ``TypeError`` naming the module.

The deprecated call form with the masks given positionally (``module(f1, f2, mask1,
mask2)``) is mapped by the shared ``forward`` from the class attribute
``positional_masks``. The base sits in the general layer so that both sections
(``feature/``, ``query/``) inherit it; :mod:`attnlab.query._convention` re-exports it next
to the multi-head modules' :class:`~attnlab.query._convention.HeadAttention`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from attnlab._checks import check_flags
from attnlab._deprecation import positional_masks, renamed_keywords
from attnlab.registry import Configurable

__all__ = ["AttentionCall", "ConventionAttention", "TwoInputAttention", "is_mask", "reject"]


@dataclass(frozen=True)
class AttentionCall:
    """The arguments of one ``forward`` call on the convention: the inputs (``key`` and
    ``value`` may still be ``None`` before a module's ``_inputs`` applies its defaults),
    ``mask``, ``need_weights``, and the multi-head modules' ``causal`` and
    ``average_weights``."""

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


def is_mask(x: object) -> bool:
    """A bool tensor: in an input slot, a mask given positionally (the old form)."""
    return isinstance(x, Tensor) and x.dtype == torch.bool


def reject(owner: str, name: str, value: object, why: str) -> None:
    """A convention argument the mechanism has no use for must be left out."""
    if value is not None:
        raise TypeError(f"{owner}.forward() takes no {name}: {why}")


#: the keywords each class's ``_attend`` takes (see :func:`_attend_keywords`; ``None``: any)
_ATTEND_KEYWORDS: dict[type, frozenset[str] | None] = {}


def _attend_keywords(cls: type) -> frozenset[str] | None:
    """The keywords ``cls._attend`` takes: its keyword parameters, or ``cls.keywords``
    where it takes ``**keywords`` (``None``: any)."""
    if cls not in _ATTEND_KEYWORDS:
        params = list(inspect.signature(cls._attend).parameters.values())[2:]  # type: ignore[attr-defined]
        named = frozenset(
            p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        if any(p.kind is p.VAR_KEYWORD for p in params):
            declared = cls.keywords  # type: ignore[attr-defined]
            named = None if declared is None else named | frozenset(declared)
        _ATTEND_KEYWORDS[cls] = named
    return _ATTEND_KEYWORDS[cls]


class ConventionAttention(Configurable):
    """Base of the modules on the plain convention -- the one ``forward``

        forward(query=None, key=None, value=None, *, mask=None, need_weights=..., **extras)

    of key-value, concatenated key-value and multi-hop attention, the modules whose query
    is learned, attention-over-attention and the feature-related modules (co-attention,
    rotatory, hierarchical, attention-via-attention and meta-embeddings). ``_inputs`` checks the call --
    an :class:`AttentionCall` whose tensors may still be ``None`` -- and maps the
    deprecated names (popped from ``extras``, see :meth:`_renamed`); ``_attend`` computes,
    with the mechanism's keywords (``causal=``, ``mask1=``, ``left_mask=``,
    ``word_offsets=``, ...) as its keyword parameters: they arrive through ``extras``, and
    a keyword ``_attend`` does not take is a one-line ``TypeError`` naming the module (a
    mechanism whose ``_attend`` takes ``**keywords`` lists them in ``keywords``).
    ``need_weights_default`` is ``True`` where the weights are part of the result
    (multi-hop, capsule attention).

    ``positional_masks`` serves the deprecated call form with the masks given
    positionally (``module(f1, f2, mask1, mask2)``): the keywords the masks stand for, in
    order, and the 1-based position of the first (2: the ``key`` slot, 3: ``value``, 4:
    after the inputs). The form is recognised by a bool tensor in a mask slot or an
    argument after ``value``; the masks are mapped with a ``DeprecationWarning``
    (:func:`attnlab._deprecation.positional_masks`). ``None`` (the default): the module
    takes no more than the three inputs positionally."""

    need_weights_default: bool = False
    positional_masks: tuple[tuple[str, ...], int] | None = None
    #: the mechanism's own keywords where ``_attend`` takes them as ``**keywords``
    keywords: tuple[str, ...] | None = None

    def forward(
        self,
        query: Tensor | None = None,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *legacy_masks: Tensor | None,
        mask: Tensor | None = None,
        need_weights: bool | None = None,
        **extras: Any,
    ) -> Any:
        """``extras``: the mechanism's keywords and the deprecated argument names (one
        release, ``DeprecationWarning``); ``legacy_masks``: the masks given positionally
        (the deprecated form, see ``positional_masks``)."""
        if need_weights is None:
            need_weights = self.need_weights_default
        check_flags(need_weights=need_weights)
        raw = AttentionCall(query, key, value, mask, need_weights=need_weights)  # type: ignore[arg-type]
        if legacy_masks or self.positional_masks is not None:
            raw = self._masks_given_positionally(raw, legacy_masks, extras)
        call = self._inputs(raw, extras)
        if extras:
            self._check_keywords(extras)
        return self._attend(call, **extras)

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        raise NotImplementedError

    def _attend(self, call: AttentionCall, **extras: Any) -> Any:
        raise NotImplementedError

    def _check_keywords(self, extras: dict[str, Any]) -> None:
        """Every keyword left in ``extras`` is one that ``_attend`` takes."""
        takes = _attend_keywords(type(self))
        unknown = [k for k in extras if takes is not None and k not in takes]
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.forward() got an unexpected keyword argument {unknown[0]!r}"
            )

    def _masks_given_positionally(
        self, call: AttentionCall, legacy: tuple[Tensor | None, ...], extras: dict[str, Any]
    ) -> AttentionCall:
        """``call`` and ``extras`` with the masks given positionally under their keywords
        (``positional_masks``); the call unchanged when the form is not used."""
        owner = type(self).__name__
        if self.positional_masks is None:
            raise TypeError(
                f"{owner}.forward() takes from 1 to 4 positional arguments but "
                f"{4 + len(legacy)} were given"
            )
        names, position = self.positional_masks
        slots = (call.key, call.value)[position - 2 :]
        if not legacy and not any(is_mask(s) for s in slots):
            return call
        masks = (*slots, *legacy)
        while len(masks) > len(names) and masks[-1] is None:
            masks = masks[:-1]
        current = {n: call.mask if n == "mask" else extras.get(n) for n in names}
        given = positional_masks(owner, masks, names, current, position=position)
        extras.update((n, m) for n, m in given.items() if n != "mask" and m is not None)
        cleared = dict.fromkeys(("key", "value")[position - 2 :])  # the slots the masks took
        return replace(call, mask=given.get("mask", call.mask), **cleared)

    def _renamed(
        self,
        call: AttentionCall,
        extras: dict[str, Any],
        renames: Mapping[str, str],
        *,
        style: Literal["quoted", "keyword"] = "keyword",
    ) -> AttentionCall:
        """``call`` and ``extras`` with the deprecated keywords ``renames`` (old -> new: an
        input, ``mask`` or a keyword of the mechanism) popped from ``extras`` and given
        their new names, with a ``DeprecationWarning``
        (:func:`attnlab._deprecation.renamed_keywords`, in the wording ``style``)."""
        legacy = {old: extras.pop(old) for old in renames if old in extras}
        if not legacy:
            return call
        current = {
            new: getattr(call, new) if new in _CALL_INPUTS else extras.get(new)
            for new in renames.values()
        }
        args = renamed_keywords(type(self).__name__, legacy, renames, current, style=style)
        inputs = {k: v for k, v in args.items() if k in _CALL_INPUTS}
        extras.update((k, v) for k, v in args.items() if k not in _CALL_INPUTS and v is not None)
        return replace(call, **inputs)


#: the arguments of the convention that are fields of :class:`AttentionCall`
_CALL_INPUTS = ("query", "key", "value", "mask")


class TwoInputAttention(ConventionAttention):
    """Base of the mechanisms over two inputs of equal standing (co-attention,
    attention-over-attention; ``docs/call-convention.md``, "Two inputs"):

        forward(query, key, *, mask1=None, mask2=None, need_weights=False)

    ``query`` and ``key`` are the two inputs in the order of the paper, ``mask1`` /
    ``mask2`` their key masks (bool, True = real); each input is its own values, so
    ``value`` and the single ``mask`` are refused with a ``TypeError``. The masks given
    positionally (``module(x1, x2, mask1, mask2)``) and the deprecated keyword names
    ``renames`` (old -> new, in the wording ``rename_style``) work for one release with a
    ``DeprecationWarning``. ``input_names`` is how the messages name the two inputs.
    Subclasses define ``_attend(call, *, mask1=None, mask2=None)``."""

    positional_masks = (("mask1", "mask2"), 3)
    input_names: tuple[str, str] = ("F1", "F2")
    renames: ClassVar[Mapping[str, str]] = MappingProxyType({})
    rename_style: Literal["quoted", "keyword"] = "keyword"

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        owner = type(self).__name__
        first, second = self.input_names
        call = self._renamed(call, extras, self.renames, style=self.rename_style)
        why = f"the features are their own values (give {second} as key)"
        reject(owner, "value", call.value, why)
        reject(owner, "mask", call.mask, "give one mask per input, mask1= and mask2=")
        if call.query is None or call.key is None:
            raise TypeError(
                f"{owner}.forward() needs both inputs: query ({first}) and key ({second})"
            )
        return call
