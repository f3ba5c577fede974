"""Deprecated names and call forms, kept working for one release.

The one home of attnlab's deprecation helpers (layer 0: it imports nothing of attnlab).
Every helper warns with a :class:`DeprecationWarning` that names the old and the new form
and the release that removes the old one (:data:`REMOVED_IN`), attributed to the caller's
line: the first frame outside attnlab and torch, whatever wrappers (``Module.__call__``,
``attnlab.build``, a functional twin) stand between the caller and the helper.

* :func:`renamed_keywords`: an old keyword argument of a call now has a new name;
* :func:`positional_masks`: masks given positionally now go by keyword (``mask=``,
  ``mask1=`` / ``mask2=``, ...);
* :func:`renamed_init_arguments`: a class decorator for a renamed constructor argument,
  with :class:`deprecated_attribute` for the attribute that goes with it;
* :func:`deprecated_aliases`: a module ``__getattr__`` serving renamed module-level names.

The old and new forms are listed in ``docs/call-convention.md`` ("Deprecated forms").
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

__all__ = [
    "REMOVED_IN",
    "REMOVED_NOTE",
    "deprecated_aliases",
    "deprecated_attribute",
    "positional_masks",
    "renamed_init_arguments",
    "renamed_keywords",
    "warn_deprecated",
]

#: the release in which the deprecated names and call forms go away
REMOVED_IN = "0.2.0"

#: the end of every deprecation message (what tells attnlab's deprecations from others')
REMOVED_NOTE = f"(removed in attnlab {REMOVED_IN})"

#: the frames a warning is not attributed to: attnlab's own and torch's (Module.__call__)
_INTERNAL = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
)

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def warn_deprecated(message: str) -> None:
    """Warn ``"MESSAGE (removed in attnlab REMOVED_IN)"`` as a ``DeprecationWarning``
    attributed to the first frame outside attnlab and torch (the user's call)."""
    frame, stacklevel = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(f"{message} {REMOVED_NOTE}", DeprecationWarning, stacklevel=stacklevel)


def _listed(names: list[str], suffix: str = "") -> str:
    return ", ".join(f"{n}{suffix}" for n in names)


def renamed_keywords(
    owner: str,
    legacy: Mapping[str, Any],
    renames: Mapping[str, str],
    current: Mapping[str, Any],
    *,
    style: Literal["quoted", "keyword"] = "quoted",
    called: str = ".forward()",
) -> dict[str, Any]:
    """``current`` (new name -> value, as passed) updated with the deprecated keyword
    arguments ``legacy`` (old name -> value: the ``**kwargs`` of a ``forward``) under their
    new names ``renames`` (old -> new), with a ``DeprecationWarning``.

    A keyword that is not an old name raises ``TypeError`` ("unexpected keyword
    argument"), as does an old name given with its new one; the error names the call as
    ``owner`` (a class or function name) followed by ``called`` (``".forward()"``; ``"()"``
    for a function, ``""`` for a constructor). ``style`` is how the messages spell the
    names, kept stable because callers match them: ``"quoted"`` (``'keys'``; a warning per
    old name: ``"KeyValueAttention: the argument 'keys' is deprecated; use 'key'"``) or
    ``"keyword"`` (``f1=``; one warning a call listing every old name:
    ``"ParallelCoAttention: f1=, f2= are deprecated; use query=, key="``).
    """
    out = dict(current)
    for old, value in legacy.items():
        new = renames.get(old)
        if new is None:
            raise TypeError(f"{owner}{called} got an unexpected keyword argument {old!r}")
        if out.get(new) is not None:
            both = f"{old!r} and its new name {new!r}"
            if style == "keyword":
                both = f"{new}= and its deprecated name {old}="
            raise TypeError(f"{owner}{called} got both {both}")
        out[new] = value
    olds = list(legacy)
    if style == "keyword" and olds:
        verb = "is" if len(olds) == 1 else "are"
        news = _listed([renames[o] for o in olds], "=")
        warn_deprecated(f"{owner}: {_listed(olds, '=')} {verb} deprecated; use {news}")
    elif style == "quoted":
        for old in olds:
            warn_deprecated(f"{owner}: the argument {old!r} is deprecated; use {renames[old]!r}")
    return out


def positional_masks(
    owner: str,
    masks: tuple[Any, ...],
    names: tuple[str, ...],
    current: Mapping[str, Any],
    *,
    position: int,
) -> dict[str, Any]:
    """``current`` (keyword -> value, as passed) updated with the masks given positionally
    (the old ``module(x1, x2, mask1, mask2)``): ``masks``, the positional arguments from
    the ``position``-th on (1-based, the inputs first), are the keywords ``names`` in
    order, with a ``DeprecationWarning`` ``"passing masks positionally is deprecated (the
    mask as the second positional argument); use mask="``. A ``None`` mask is skipped;
    more masks than ``names``, or a mask given both ways, raise ``TypeError``."""
    if len(masks) > len(names):
        raise TypeError(
            f"{owner}.forward() takes at most {len(names)} masks, got {len(masks)} positional ones"
        )
    out = dict(current)
    for name, m in zip(names, masks, strict=False):
        if m is None:
            continue
        if out.get(name) is not None:
            raise TypeError(f"{owner}.forward() got {name} both positionally and as {name}=")
        out[name] = m
    places = [
        _ORDINALS[i] if i < len(_ORDINALS) else f"{i + 1}th"
        for i in range(position - 1, position - 1 + len(names))
    ]
    where = f"the {names[0]} as the {places[0]} positional argument"
    if len(names) > 1:
        where = f"{', '.join(names)} as the {', '.join(places[:-1])} and {places[-1]} "
        where += "positional arguments"
    warn_deprecated(
        f"{owner}: passing masks positionally is deprecated ({where}); "
        f"use {_listed(list(names), '=')}"
    )
    return out


def renamed_init_arguments(
    renames: Mapping[str, str], *, attributes: bool = False
) -> Callable[[type], type]:
    """Class decorator: the constructor accepts the old keyword names ``renames`` (old ->
    new) with a ``DeprecationWarning`` (``"CapsuleAttention: the argument 'd_k' is
    deprecated; use 'd_features'"``); an old name given as ``None`` is ignored, an old and
    a new name together raise ``TypeError``. The old names stay in the signature
    (keyword-only, default ``None``) so that ``attnlab.build`` accepts an old config; the
    recorded config uses the new names. ``attributes=True``: the old names are also
    read-only attributes (:class:`deprecated_attribute`) of the instances."""

    def deco(cls: type) -> type:
        init = cls.__init__
        signature = inspect.signature(init)

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kw: Any) -> None:
            for old in [o for o in renames if o in kw and kw[o] is None]:
                del kw[old]
            legacy = {old: kw.pop(old) for old in renames if old in kw}
            if legacy:
                current = {new: kw[new] for new in renames.values() if new in kw}
                kw.update(renamed_keywords(cls.__name__, legacy, renames, current, called=""))
            init(self, *args, **kw)

        params = list(signature.parameters.values())
        at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
        params[at:at] = [
            inspect.Parameter(old, inspect.Parameter.KEYWORD_ONLY, default=None) for old in renames
        ]
        __init__.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        if attributes:
            for old, new in renames.items():
                setattr(cls, old, deprecated_attribute(old, new))
        return cls

    return deco


class deprecated_attribute:
    """A read-only attribute ``old`` that returns the attribute ``new``, with a
    ``DeprecationWarning`` (``"CapsuleAttention.d_k is deprecated; use .d_features"``)."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is None:
            return self
        warn_deprecated(f"{owner.__name__}.{self.old} is deprecated; use .{self.new}")
        return getattr(obj, self.new)


def deprecated_aliases(
    module_name: str, aliases: Mapping[str, Callable[[], Any]]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` (``__getattr__ = deprecated_aliases(__name__, {...})``)
    serving the old names ``aliases`` (old name -> a function returning the new object,
    called at lookup so that the alias may name what is defined later) with a
    ``DeprecationWarning`` (``"attnlab.query.MultiQueryAttention is deprecated; use
    ConcatenatedKeyValueAttention"``); any other name raises ``AttributeError``."""

    def __getattr__(name: str) -> Any:
        if name in aliases:
            target = aliases[name]()
            warn_deprecated(f"{module_name}.{name} is deprecated; use {target.__name__}")
            return target
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
