"""The call convention of the feature-related modules (issue 15).

Every module here is called ``forward(query, key=None, value=None, *, mask=None,
need_weights=False, ...)``. Each mechanism maps its own inputs onto these names (the
"Call" section of its page in ``docs/feature/``); the names its error messages use stay
the mechanism's own (``f1``/``f2``, ``left``/``target``/``right``, ``x``, ``q``/``chars``).

The old call forms are accepted for one release with a ``DeprecationWarning``, through
the shared helpers of :mod:`attnlab._deprecation`: the old keyword names (``f1=``,
``left=``, ``x=``, ``token_mask=``, ...) via :func:`renamed` (the feature modules' wording
of :func:`~attnlab._deprecation.renamed_keywords`), and masks given positionally via
:func:`~attnlab._deprecation.positional_masks`. This module adds the two checks of the
convention itself: :func:`is_mask` and :func:`reject`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from attnlab._deprecation import renamed_keywords

__all__ = ["is_mask", "reject", "renamed"]


def renamed(
    owner: str, legacy: Mapping[str, Any], renames: Mapping[str, str], current: Mapping[str, Any]
) -> dict[str, Any]:
    """``current`` (new name -> value) updated with the deprecated keywords ``legacy``
    renamed by ``renames`` (old -> new): :func:`attnlab._deprecation.renamed_keywords` in
    the feature modules' wording, one warning a call naming every old keyword
    (``"f1=, f2= are deprecated; use query=, key="``)."""
    return renamed_keywords(owner, legacy, renames, current, style="keyword")


def is_mask(x: object) -> bool:
    """A bool tensor: in an input slot, a mask given positionally (the old form)."""
    return isinstance(x, Tensor) and x.dtype == torch.bool


def reject(owner: str, name: str, value: object, why: str) -> None:
    """A convention argument the mechanism has no use for must be left out."""
    if value is not None:
        raise TypeError(f"{owner}.forward() takes no {name}: {why}")
