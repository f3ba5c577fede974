"""Parsing what a user types: attention specs, ``-o key=value`` options and config files.

* :func:`parse_attention` reads ``--attention``: ``"score=additive,align=soft,dim=multi"``,
  a preset or baseline name (``"tanh"``, ``"mean"``), a mix (``"bahdanau,score=general"``)
  or the path of a YAML / TOML / JSON file holding the spec.
* :func:`parse_options` reads repeated ``-o key=value`` task options.
* :func:`load_config_file` reads a run configuration file with the keys ``attention``,
  ``options`` and ``seeds`` (any subset)::

      # sentiment.yaml
      attention: {score: additive, align: sparsemax}
      options: {epochs: 3, encoder: cnn}
      seeds: [0, 1, 2]

Values typed as text are coerced by :func:`coerce_value`: integers, floats, ``true`` /
``false``, ``none`` / ``null``, lists written ``[1;3;5]`` (the form
:func:`attnlab.lab.task.spec_label` writes), else the text itself. Every problem raises
:class:`~attnlab._checks.ConfigError` naming the piece that is wrong.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnlab._checks import ConfigError

__all__ = [
    "CONFIG_KEYS",
    "ConfigError",
    "coerce_value",
    "load_config_file",
    "parse_attention",
    "parse_options",
    "read_structured_file",
]

#: The top-level keys a run configuration file may hold.
CONFIG_KEYS = ("attention", "options", "seeds")
_FILE_SUFFIXES = (".yaml", ".yml", ".toml", ".json")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_INT = re.compile(r"^[+-]?\d+$")


def coerce_value(text: str) -> Any:
    """``"3"`` -> 3, ``"1e-3"`` -> 0.001, ``"true"`` -> True, ``"none"`` -> None,
    ``"[1;3]"`` -> [1, 3]; anything else stays text (surrounding spaces removed)."""
    value = text.strip()
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if _INT.match(value):
        return int(value)
    if value.startswith("[") and value.endswith("]"):
        inner = value[1:-1].strip()
        return [coerce_value(v) for v in inner.split(";")] if inner else []
    try:
        number = float(value)
    except ValueError:
        return value
    return number if low not in ("nan", "inf", "-inf", "+inf", "infinity") else value


def _is_file_spec(text: str) -> bool:
    return text.lower().endswith(_FILE_SUFFIXES)


def read_structured_file(path: str | Path) -> Any:
    """The content of a ``.yaml`` / ``.yml`` / ``.toml`` / ``.json`` file."""
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in _FILE_SUFFIXES:
        raise ConfigError(
            f"config file {str(path)!r} must end in {', '.join(_FILE_SUFFIXES)} (got {suffix!r})"
        )
    if not file.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    text = file.read_text(encoding="utf-8")
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix == ".toml":
            import tomllib

            return tomllib.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as error:  # the parsers raise their own error types
        raise ConfigError(f"cannot parse {str(path)!r}: {error}") from None


def parse_attention(text: str | None) -> dict[str, Any]:
    """The attention spec dict of an ``--attention`` value (None or ``""`` -> ``{}``).

    >>> parse_attention("score=additive,align=soft,dim=multi")
    {'score': 'additive', 'align': 'soft', 'dim': 'multi'}
    >>> parse_attention("mean")
    {'name': 'mean'}
    >>> parse_attention("bahdanau,score=general,d_w=32")
    {'name': 'bahdanau', 'score': 'general', 'd_w': 32}
    """
    if text is None:
        return {}
    if not isinstance(text, str):
        raise ConfigError(f"an attention spec must be text, got {type(text).__name__}")
    text = text.strip()
    if not text:
        return {}
    if _is_file_spec(text):
        content = read_structured_file(text)
        if isinstance(content, str):
            return parse_attention(content)
        if content is None:
            return {}
        if not isinstance(content, Mapping):
            raise ConfigError(
                f"attention file {text!r} must hold a mapping such as "
                f"{{score: additive, align: soft}}, got {type(content).__name__}"
            )
        return _check_spec(dict(content), where=f"attention file {text!r}")
    spec: dict[str, Any] = {}
    for raw in text.split(","):
        piece = raw.strip()
        if not piece:
            raise ConfigError(f"empty piece in the attention spec {text!r} (a stray comma?)")
        if "=" in piece:
            key, _, value = piece.partition("=")
            key = key.strip()
            if not _KEY.match(key):
                raise ConfigError(
                    f"bad key {key!r} in the attention spec {text!r} (piece {piece!r})"
                )
            if not value.strip():
                raise ConfigError(f"no value for {key!r} in the attention spec {text!r}")
            if key in spec:
                raise ConfigError(f"{key!r} is given twice in the attention spec {text!r}")
            spec[key] = coerce_value(value)
        else:
            if not _KEY.match(piece):
                raise ConfigError(
                    f"bad piece {piece!r} in the attention spec {text!r}: expected a name "
                    "(a preset such as 'tanh', or 'mean' / 'uniform') or key=value"
                )
            if "name" in spec:
                raise ConfigError(
                    f"two names in the attention spec {text!r}: {spec['name']!r} and "
                    f"{piece!r}; give one preset name, the rest as key=value"
                )
            spec["name"] = piece
    return spec


def _check_spec(spec: dict[str, Any], *, where: str) -> dict[str, Any]:
    bad = [k for k in spec if not isinstance(k, str) or not _KEY.match(k)]
    if bad:
        raise ConfigError(f"bad key(s) {bad} in {where}")
    return spec


def parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    """Task options from repeated ``-o key=value`` items (values coerced).

    >>> parse_options(["epochs=3", "encoder=cnn", "lr=1e-3"])
    {'epochs': 3, 'encoder': 'cnn', 'lr': 0.001}
    """
    options: dict[str, Any] = {}
    for item in items or ():
        if not isinstance(item, str) or "=" not in item:
            raise ConfigError(f"an option must be key=value, got {item!r}")
        key, _, value = item.partition("=")
        key = key.strip()
        if not _KEY.match(key):
            raise ConfigError(f"bad option name {key!r} in {item!r}")
        if key in options:
            raise ConfigError(f"option {key!r} is given twice ({item!r})")
        options[key] = coerce_value(value)
    return options


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A run configuration: ``{"attention": dict, "options": dict, "seeds": [int]}``, with
    only the keys the file has. ``attention`` may be a mapping or spec text; ``seeds`` a
    list of integers or one integer. Unknown top-level keys raise :class:`ConfigError`."""
    content = read_structured_file(path)
    if content is None:
        return {}
    if not isinstance(content, Mapping):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping with keys {', '.join(CONFIG_KEYS)}, "
            f"got {type(content).__name__}"
        )
    unknown = sorted(str(k) for k in content if k not in CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"config file {str(path)!r} has unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(CONFIG_KEYS)}"
        )
    out: dict[str, Any] = {}
    if "attention" in content:
        attention = content["attention"]
        if attention is None:
            out["attention"] = {}
        elif isinstance(attention, str):
            if _is_file_spec(attention):
                raise ConfigError(f"config file {str(path)!r}: 'attention' may not name a file")
            out["attention"] = parse_attention(attention)
        elif isinstance(attention, Mapping):
            out["attention"] = _check_spec(dict(attention), where=f"'attention' of {path}")
        else:
            raise ConfigError(
                f"config file {str(path)!r}: 'attention' must be a mapping or spec text, got "
                f"{type(attention).__name__}"
            )
    if "options" in content:
        options = content["options"]
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"config file {str(path)!r}: 'options' must be a mapping, got "
                f"{type(options).__name__}"
            )
        out["options"] = _check_spec(dict(options), where=f"'options' of {path}")
    if "seeds" in content:
        seeds = content["seeds"]
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            seeds = [seeds]
        if (
            not isinstance(seeds, list)
            or not seeds
            or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)
        ):
            raise ConfigError(
                f"config file {str(path)!r}: 'seeds' must be an integer or a non-empty list "
                f"of integers, got {seeds!r}"
            )
        out["seeds"] = list(seeds)
    return out
