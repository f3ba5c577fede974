"""The call convention of the feature-related modules (issue 15).

Every module here is called ``forward(query, key=None, value=None, *, mask=None,
need_weights=False, ...)``. Each mechanism maps its own inputs onto these names (the
"Call" section of its page in ``docs/feature/``); the names its error messages use stay
the mechanism's own (``f1``/``f2``, ``left``/``target``/``right``, ``x``, ``q``/``chars``).

The old call forms are accepted for one release with a ``DeprecationWarning``: the old
keyword names (``f1=``, ``left=``, ``x=``, ``token_mask=``, ...) via
:func:`take_renamed`, and masks given positionally where the convention has ``value``
via :func:`take_positional_masks`.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import torch
from torch import Tensor

from attnlab._checks import ConfigError


def positive_int(value: object, name: str, owner: str | None = None) -> int:
    """``value`` as an int ``>= 1``, else a ``ConfigError`` ``"[owner: ]NAME must be a
    positive int, got VALUE"`` (the wording the feature modules have always used; the
    generic check is :func:`attnlab._checks.check_int`)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        prefix = f"{owner}: " if owner else ""
        raise ConfigError(f"{prefix}{name} must be a positive int, got {value!r}")
    return value


def deprecated(owner: str, old: str, new: str) -> None:
    """Warn that ``owner.forward``'s old form ``old`` (ending in "is" / "are") is now
    ``new``."""
    warnings.warn(
        f"{owner}.forward: {old} deprecated and will be removed in the next release; "
        f"use {new} (the call convention forward(query, key=None, value=None, *, mask=None, "
        "need_weights=False, ...))",
        DeprecationWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside attnlab's feature package and
    ``torch.nn`` (the caller's line, whatever wrappers PyTorch puts around ``forward``)."""
    here = os.path.dirname(__file__)
    frame, level = sys._getframe(2), 2
    while frame is not None and (
        frame.f_code.co_filename.startswith(here)
        or f"{os.sep}torch{os.sep}nn{os.sep}" in frame.f_code.co_filename
    ):
        frame, level = frame.f_back, level + 1
    return level


def take_renamed(
    owner: str, old_kwargs: dict[str, Any], renames: dict[str, str], current: dict[str, Any]
) -> dict[str, Any]:
    """``current`` (new name -> value) updated with the deprecated keywords of
    ``old_kwargs`` (old name -> value), renamed by ``renames`` (old -> new) with a
    ``DeprecationWarning`` each. A keyword that is neither old nor new is a ``TypeError``,
    as is giving both the old and the new name."""
    out = dict(current)
    for old, value in old_kwargs.items():
        if old not in renames:
            raise TypeError(f"{owner}.forward() got an unexpected keyword argument {old!r}")
        new = renames[old]
        if out.get(new) is not None:
            raise TypeError(f"{owner}.forward() got both {new}= and its deprecated name {old}=")
        out[new] = value
    if old_kwargs:  # one warning a call
        olds = ", ".join(f"{o}=" for o in old_kwargs)
        news = ", ".join(f"{renames[o]}=" for o in old_kwargs)
        deprecated(owner, olds + (" is" if len(old_kwargs) == 1 else " are"), news)
    return out


def is_mask(x: object) -> bool:
    return isinstance(x, Tensor) and x.dtype == torch.bool


def take_positional_masks(
    owner: str, slot: object, rest: tuple[Any, ...], names: tuple[str, ...], current: dict[str, Any]
) -> dict[str, Any]:
    """The old positional masks: ``slot`` (the argument now called ``value``, or ``key``)
    followed by ``rest`` were the masks ``names``; map them onto those keywords with a
    ``DeprecationWarning``. Nothing to do when ``slot`` is None and ``rest`` empty."""
    masks = (slot, *rest)
    if len(masks) > len(names):
        raise TypeError(
            f"{owner}.forward() takes at most {len(names)} masks, got {len(masks)} positional ones"
        )
    out = dict(current)
    deprecated(owner, "passing masks positionally is", ", ".join(f"{n}=" for n in names))
    for name, m in zip(names, masks, strict=False):
        if m is None:
            continue
        if out.get(name) is not None:
            raise TypeError(f"{owner}.forward() got {name} both positionally and as {name}=")
        out[name] = m
    return out


def reject(owner: str, name: str, value: object, why: str) -> None:
    """A convention argument the mechanism has no use for must be left out."""
    if value is not None:
        raise TypeError(f"{owner}.forward() takes no {name}: {why}")
