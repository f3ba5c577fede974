"""Names -> mechanisms: the registry behind build-by-name, config dicts and ``attnlab list``.

Every mechanism registers itself with a *kind* (``"score"``, ``"align"``, ``"dim"``,
``"attention"``, and the later ``"feature"`` / ``"query"`` kinds), a name, its formula,
its source paper and its cost. ``build(config)`` turns a plain dict into a module:

* ``{"name": "additive", "kind": "score", "d_q": 8, "d_k": 8}`` builds a registered
  component;
* a dict without ``"name"`` (e.g. ``{"score": "additive", "align": "local-p", ...}``)
  builds the general :class:`attnlab.Attention` (the ``"attention"`` registered as
  ``"general"``).

The registry is the bottom of the library (docs/architecture.md, "Layers"): it imports no
other attnlab module. On its first lookup it loads the modules of the core mechanism
packages (:data:`CORE_PACKAGES`: general, feature and query attention); everything above
them registers when its own package is imported -- the task models when
:mod:`attnlab.models` is imported, the lab's tasks with :mod:`attnlab.lab.tasks`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "CARD_FIELDS",
    "CORE_PACKAGES",
    "DEFAULT_ATTENTION",
    "Configurable",
    "Entry",
    "build",
    "card_from_docstring",
    "entries",
    "get",
    "names",
    "register",
    "unregister",
]


@dataclass(frozen=True)
class Entry:
    """One registered mechanism."""

    kind: str
    name: str
    cls: type
    formula: str
    source: str
    cost: str = ""
    aliases: tuple[str, ...] = ()
    capabilities: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, dict[str, Entry]] = {}
_ALIASES: dict[str, dict[str, str]] = {}


CARD_FIELDS = ("formula", "source", "cost")


def card_from_docstring(cls: type) -> dict[str, str]:
    """The ``:formula:``, ``:source:`` and ``:cost:`` fields of ``cls``'s own docstring.

    A field is a reST field line, ``:formula: e_l = q^T k_l``; the lines indented below it
    continue it (joined with one space). The card lives once, in the docstring that
    ``help()`` shows, and the registry reads it from there.

    >>> class Toy:
    ...     '''A toy.
    ...
    ...     :formula: e = q^T k
    ...     :source: Nobody 2024,
    ...         A Toy
    ...     '''
    >>> card_from_docstring(Toy)
    {'formula': 'e = q^T k', 'source': 'Nobody 2024, A Toy'}
    """
    card: dict[str, str] = {}
    current: str | None = None
    for line in inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines():
        stripped = line.strip()
        head = stripped.split(":", 2)
        if stripped.startswith(":") and len(head) == 3 and head[1] in CARD_FIELDS:
            current = head[1]
            card[current] = head[2].strip()
        elif current is not None and stripped and line[:1].isspace():
            card[current] = f"{card[current]} {stripped}"
        else:
            current = None
    return card


def register(
    kind: str,
    name: str,
    *,
    formula: str | None = None,
    source: str | None = None,
    cost: str | None = None,
    aliases: tuple[str, ...] = (),
    **capabilities: Any,
):
    """Class decorator adding a mechanism to the registry under ``kind``/``name``.

    Its card (formula, source paper, cost) comes from the keywords or, where they are left
    out, from the ``:formula:``/``:source:``/``:cost:`` fields of the class docstring
    (:func:`card_from_docstring`); a formula and a source are required.
    """

    def deco(cls: type) -> type:
        if not isinstance(cls, type):  # a function or an instance: built by calling it, later
            raise TypeError(f"register({kind!r}, {name!r}) decorates a class, got {cls!r}")
        card = card_from_docstring(cls)
        given = {"formula": formula, "source": source, "cost": cost}
        card.update({k: v for k, v in given.items() if v is not None})
        missing = [k for k in ("formula", "source") if not card.get(k)]
        if missing:
            raise ValueError(
                f"{kind} {name!r} ({cls.__qualname__}) has no {' and no '.join(missing)}: "
                f"give {missing[0]}= or a ':{missing[0]}:' line in its docstring"
            )
        table = _REGISTRY.setdefault(kind, {})
        alias_table = _ALIASES.setdefault(kind, {})
        if name in table and table[name].cls is not cls:
            raise ValueError(f"{kind} {name!r} is already registered to {table[name].cls}")
        _check_aliases(kind, name, tuple(aliases), table, alias_table)
        entry = Entry(
            kind,
            name,
            cls,
            card["formula"],
            card["source"],
            card.get("cost", ""),
            tuple(aliases),
            dict(capabilities),
        )
        table[name] = entry
        for alias in aliases:
            alias_table[alias] = name
        cls.registry_name = name
        cls.registry_kind = kind
        return cls

    return deco


def _check_aliases(
    kind: str,
    name: str,
    aliases: tuple[str, ...],
    table: dict[str, Entry],
    alias_table: dict[str, str],
) -> None:
    """An alias must name nothing else of its kind: not the entry itself, not another
    entry, not another entry's alias (it would be taken from it without a word); and a
    new name must not be another entry's alias (the name would hide it). Names and aliases
    are written as lookups see them, lower case with ``-`` (``get`` folds case and ``_``:
    ``"My_Score"`` could never be found as ``"my-score"``)."""
    for word in (name, *aliases):
        if not isinstance(word, str) or not word or word != _fold(word):
            folded = f" ({_fold(word)!r})" if isinstance(word, str) and word else ""
            raise ValueError(
                f"{kind} names and aliases are written lower case with '-', got {word!r}{folded}"
            )
    if alias_table.get(name, name) != name:
        raise ValueError(f"{kind} {name!r} is already an alias of {alias_table[name]!r}")
    for alias in aliases:
        if alias == name:
            raise ValueError(f"{kind} {name!r} lists its own name among its aliases")
        if alias in table:
            raise ValueError(f"{kind} alias {alias!r} of {name!r} is the name of another {kind}")
        if alias_table.get(alias, name) != name:
            raise ValueError(
                f"{kind} alias {alias!r} of {name!r} is already an alias of {alias_table[alias]!r}"
            )


def unregister(kind: str, name: str) -> Entry:
    """Remove the mechanism registered as ``kind``/``name`` (and its aliases); returns its
    entry. For plugins and tests that register a mechanism for a while. A name that is not
    registered (an alias is not enough) is a ``KeyError`` that says so."""
    if name not in _REGISTRY.get(kind, {}):
        raise KeyError(f"no {kind} {name!r} is registered (give its name, not an alias)")
    entry = _REGISTRY[kind].pop(name)
    aliases = _ALIASES.get(kind, {})
    for alias in entry.aliases:
        if aliases.get(alias) == name:
            del aliases[alias]
    return entry


def _fold(name: str) -> str:
    """``name`` as lookups compare it: lower case, ``_`` as ``-``."""
    return name.lower().replace("_", "-")


def _canonical(kind: str, name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"a {kind} name must be text, got {name!r}")
    key = _fold(name)
    aliases = _ALIASES.get(kind, {})
    table = _REGISTRY.get(kind, {})
    if key in table:
        return key
    if key in aliases:
        return aliases[key]
    if name in aliases:
        return aliases[name]
    if name in table:
        return name
    raise KeyError(
        f"unknown {kind} {name!r}; registered {kind}s: {', '.join(sorted(table)) or 'none'}"
    )


def get(kind: str, name: str) -> Entry:
    """The entry registered as ``name`` (or one of its aliases) under ``kind``."""
    _ensure_loaded()
    if not isinstance(kind, str):
        raise TypeError(f"kind must be text, got {kind!r}")
    if kind not in _REGISTRY:
        raise KeyError(
            f"unknown kind {kind!r}; known kinds: {', '.join(sorted(_REGISTRY))} ({_ABOVE_CORE})"
        )
    return _REGISTRY[kind][_canonical(kind, name)]


def names(kind: str) -> list[str]:
    """Registered names of one kind."""
    _ensure_loaded()
    return sorted(_REGISTRY.get(kind, {}))


def entries(kind: str | None = None) -> list[Entry]:
    """All entries (of one kind), in registration order."""
    _ensure_loaded()
    kinds = [kind] if kind is not None else list(_REGISTRY)
    return [e for k in kinds for e in _REGISTRY.get(k, {}).values()]


def build(config: dict[str, Any]) -> nn.Module:
    """Build a module from a plain config dict (see the module docstring)."""
    _ensure_loaded()
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    cfg = dict(config)
    name = cfg.pop("name", None)
    kind = cfg.pop("kind", None)
    for key, value in (("name", name), ("kind", kind)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"config {key!r} must be text, got {value!r}")
    if name is None:
        if kind not in (None, "attention"):
            raise ValueError(
                f"config has kind={kind!r} but no 'name'; add the {kind} name (one of "
                f"{names(kind) if kind in _REGISTRY else 'none: unknown kind'}), or drop "
                "'kind' to build the general Attention"
            )
        return get("attention", DEFAULT_ATTENTION).cls(**cfg)
    if kind is None:
        matches = [k for k, table in _REGISTRY.items() if _try_canonical(k, name) in table]
        if not matches:
            known = "; ".join(f"{k}: {', '.join(sorted(t))}" for k, t in _REGISTRY.items())
            raise KeyError(
                f"no mechanism is registered as {name!r}; registered names: {known} ({_ABOVE_CORE})"
            )
        if len(matches) > 1:
            raise KeyError(f"{name!r} is registered under several kinds {matches}; add 'kind'")
        kind = matches[0]
    entry = get(kind, name)
    params = inspect.signature(entry.cls).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    unknown = [k for k in cfg if k not in params]
    if unknown and not takes_kwargs:
        raise TypeError(
            f"{kind} {entry.name!r} ({entry.cls.__name__}) got unknown config keys {unknown}; "
            f"it takes {[p for p in params if p != 'self']}"
        )
    return entry.cls(**cfg)


def _try_canonical(kind: str, name: str) -> str | None:
    try:
        return _canonical(kind, name)
    except KeyError:
        return None


#: The packages of the core mechanisms (survey 3.2, 3.1, 3.3): every module in them is
#: imported on the first lookup, so that ``build`` and ``attnlab list`` know all of them,
#: not only those that ``import attnlab`` happens to pull in. Nothing above the core is
#: loaded here: task models and tasks register when their packages are imported.
CORE_PACKAGES = ("attnlab.general", "attnlab.feature", "attnlab.query")
#: Said where a name is not found: what registers only when its package is imported.
_ABOVE_CORE = "task models register when attnlab.models is imported, tasks with attnlab.lab.tasks"
#: What a config without ``"name"`` builds: the ``"attention"`` registered under this name.
DEFAULT_ATTENTION = "general"
_loaded = False


def _ensure_loaded() -> None:
    """Import every module of :data:`CORE_PACKAGES` once (by name: the registry imports no
    module above it)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for pkg_name in CORE_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, pkg_name + "."):
            importlib.import_module(info.name)


def _short_repr(value: Any, width: int = 60) -> str:
    """A constructor argument in a module's one-line summary: a tensor by its shape, a
    module by its class, a sequence of those item by item, anything else by its ``repr``
    cut to ``width`` characters."""
    if isinstance(value, Tensor):
        return f"tensor{list(value.shape)}"
    if isinstance(value, nn.Module):
        return f"{type(value).__name__}(...)"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (Tensor, nn.Module)) for v in value):
        return "[" + ", ".join(_short_repr(v, width) for v in value) + "]"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _outermost_init(cls: type) -> type:
    """The first class of ``cls``'s MRO that defines ``__init__``: whose constructor a call
    ``cls(...)`` runs first, and so whose arguments are the instance's config."""
    return next(c for c in cls.__mro__ if "__init__" in c.__dict__)


class Configurable(nn.Module):
    """Base class that records its constructor arguments, so that
    ``build(module.get_config())`` rebuilds an equivalent (freshly initialised) module."""

    registry_name: str = ""
    registry_kind: str = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            return
        original = cls.__init__
        signature = inspect.signature(original)

        def __init__(self, *args: Any, **kw: Any) -> None:
            try:
                bound = signature.bind(self, *args, **kw)
            except TypeError as error:  # bind's message names no function: name the class
                raise TypeError(f"{type(self).__name__}.__init__() {error}") from None
            bound.apply_defaults()
            config = {k: v for k, v in list(bound.arguments.items())[1:]}
            var_kw = [p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
            for name in var_kw:
                config.update(config.pop(name, {}))
            original(self, *args, **kw)
            # the arguments of the outermost constructor win: the first in the class's MRO
            # to define __init__ (a subclass without one is built by its base's)
            if _outermost_init(type(self)) is cls or not hasattr(self, "_config"):
                self._config = config

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__doc__ = original.__doc__
        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]

    def extra_repr(self) -> str:
        """The constructor arguments that differ from their defaults, in the signature's
        order (tensors and modules by shape and class), so that ``print(model)`` tells an
        additive multi-dimensional attention from a dot-product one:
        ``Attention(score='additive', dim='multi', d_q=4, d_k=4, ...)``."""
        config = getattr(self, "_config", {})
        defaults = {
            name: p.default
            for name, p in inspect.signature(type(self)).parameters.items()
            if p.default is not p.empty
        }
        shown = []
        for name, value in config.items():
            default = defaults.get(name, inspect.Parameter.empty)
            try:
                same = default is not inspect.Parameter.empty and bool(default == value)
            except Exception:  # a tensor or an object without a plain equality
                same = default is value
            if not same:
                shown.append(f"{name}={_short_repr(value)}")
        return ", ".join(shown)

    def reset_parameters(self) -> None:
        """Initialise every parameter and buffer again as the constructor does: a module
        of the same constructor arguments is built on the device of this one's tensors
        and its values copied in (in this module's dtypes; the draw follows the global
        seed). For the meta-device pattern of large models::

            with torch.device("meta"):
                model = attnlab.MultiHeadAttention(1024, 16)   # no memory, no values
            model.to_empty(device="cuda")                      # memory, garbage values
            model.reset_parameters()                           # the constructor's values

        ``nn.Module.to_empty`` alone leaves garbage in the modules' own parameters and in
        buffers computed at construction (positions, rotations), which torch's layers'
        own ``reset_parameters`` do not cover. Cost: one construction of the module."""
        tensors = [*self.parameters(), *self.buffers()]
        device = tensors[0].device if tensors else torch.device("cpu")
        if device.type == "meta":
            raise RuntimeError(
                f"{type(self).__name__} is on the meta device: move it first "
                "(module.to_empty(device=...)), then reset its parameters"
            )
        with torch.device(device):
            fresh = type(self)(**getattr(self, "_config", {}))
        mine = dict(self.named_parameters()) | dict(self.named_buffers())
        theirs = dict(fresh.named_parameters()) | dict(fresh.named_buffers())
        if mine.keys() != theirs.keys():  # a module changed after construction
            raise RuntimeError(
                f"{type(self).__name__} no longer has the tensors its constructor makes; "
                f"differing names: {sorted(mine.keys() ^ theirs.keys())}"
            )
        with torch.no_grad():
            for name, tensor in mine.items():
                tensor.copy_(theirs[name])

    def get_config(self) -> dict[str, Any]:
        """The constructor arguments plus ``name`` and ``kind``, for :func:`build`."""
        cfg = dict(getattr(self, "_config", {}))
        if self.registry_name and type(self).__dict__.get("registry_name") == self.registry_name:
            cfg = {"name": self.registry_name, "kind": self.registry_kind, **cfg}
        return cfg
