"""General attention (survey section 3.2): score functions, alignment functions,
dimensionality, and the general module that composes them.

The package exports every mechanism that its modules register (``attnlab.general.<Name>``,
and through it ``attnlab.<Name>``), found by importing its modules: a new score, alignment
or dimensionality in a module of this package is exported without being named here (see
docs/architecture.md, "Add a score in three places")."""

from __future__ import annotations

import importlib
import pkgutil

from attnlab.general.alignment import Aligned, Alignment
from attnlab.general.attention import Attention
from attnlab.general.scoring import Score


def _registered_classes() -> dict[str, type]:
    """``{class name: class}`` of the mechanisms the modules of this package register."""
    found: dict[str, type] = {}
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and obj.__module__ == module.__name__
                and "registry_name" in vars(obj)
            ):
                found[obj.__name__] = obj
    return found


_MECHANISMS = _registered_classes()
globals().update(_MECHANISMS)

__all__ = ["Aligned", "Alignment", "Attention", "Score"]
__all__ += sorted(set(_MECHANISMS) - set(__all__))
