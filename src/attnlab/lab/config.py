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
:func:`attnlab.lab.task.spec_label` writes), else the text itself; :func:`format_value`
writes a value back in that form. Every problem raises
:class:`~attnlab._checks.ConfigError` naming the piece that is wrong.

Before a run is started (and before any data is loaded), :func:`check_attention` and
:func:`check_option_values` check what was typed against the task: preset, score,
alignment and dimensionality names, the keys of a spec, the types of option values and
the separators (``,`` inside a spec, one ``-o`` per option), and the ranges of the
training options (:func:`check_training_values`: ``lr > 0``, ``weight_decay >= 0``, ...).
:func:`describe_task` and :func:`task_presets` write the help that ``attnlab train`` /
``ablate`` show.

A task typed by name is looked up here too: :func:`task_class` (the registered class, or
an error naming the registered tasks) and :func:`resolve_task` (an instance with options),
which the trainer, the ablation and the command line share.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnlab._checks import ConfigError, check_dropout, check_int, check_path, finite_real
from attnlab.lab.errors import error_message

if TYPE_CHECKING:
    from attnlab.lab.task import Task

__all__ = [
    "CONFIG_KEYS",
    "ConfigError",
    "check_attention",
    "check_model_values",
    "check_option_values",
    "check_training_values",
    "coerce_value",
    "describe_task",
    "format_value",
    "load_config_file",
    "parse_attention",
    "parse_options",
    "read_structured_file",
    "resolve_task",
    "task_class",
    "task_presets",
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
        if "," in inner and ";" not in inner:  # [1,2]: one item "1,2" is surely not meant
            raise ConfigError(
                f"the items of a list are separated by ';' (',' separates the pieces of "
                f"an attention spec): write [{inner.replace(',', ';')}], not {value}"
            )
        return [coerce_value(v) for v in inner.split(";")] if inner else []
    try:
        number = float(value)
    except ValueError:
        return value
    # "nan", "-inf", "1e400", ...: not a number an option can hold, so the text (which the
    # option's check then refuses by name), however it is spelled
    return number if math.isfinite(number) else value


def format_value(value: Any) -> str:
    """A value as it is typed after ``-o key=`` (the inverse of :func:`coerce_value`):
    ``None`` -> ``none``, ``True`` -> ``true``, ``[1, 3]`` -> ``[1;3]``.

    >>> format_value(None), format_value(False), format_value([1, 3]), format_value(1e-3)
    ('none', 'false', '[1;3]', '0.001')
    """
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ";".join(format_value(v) for v in value) + "]"
    return str(value)


def _is_file_spec(text: str) -> bool:
    return text.lower().endswith(_FILE_SUFFIXES)


def read_structured_file(
    path: str | Path, *, kind: str = "config file", require_suffix: bool = True
) -> Any:
    """The content of a ``.yaml`` / ``.yml`` / ``.toml`` / ``.json`` file (``kind`` names it
    in the errors; without ``require_suffix`` a file of another suffix is read as YAML)."""
    file = check_path(path, kind)
    suffix = file.suffix.lower()
    if require_suffix and suffix not in _FILE_SUFFIXES:
        raise ConfigError(
            f"{kind} {str(path)!r} must end in {', '.join(_FILE_SUFFIXES)} (got {suffix!r})"
        )
    if not file.is_file():
        raise ConfigError(f"{kind} {str(path)!r} does not exist")
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
        raise ConfigError(f"cannot parse {str(path)!r}{_where_and_why(error)}") from None


#: The end of a ``tomllib`` message: ``(at line 2, column 5)`` or ``(at end of document)``.
_TOML_WHERE = re.compile(
    r"^(?P<why>.*?)\s*\(at "
    r"(?:line (?P<line>\d+), column (?P<col>\d+)|(?P<end>end of document))\)$"
)


def _where_and_why(error: Exception) -> str:
    """``, line L, column C: PROBLEM`` of a JSON, TOML or YAML parser's error, on one line
    (PyYAML's message spans several lines and names ``"<unicode string>"``, not the file);
    ``: MESSAGE`` for any other error."""
    mark = getattr(error, "problem_mark", None)  # yaml.MarkedYAMLError
    if mark is not None:
        why = str(getattr(error, "problem", None) or type(error).__name__)
        context, at = getattr(error, "context", None), getattr(error, "context_mark", None)
        if context:
            where = f" from line {at.line + 1}, column {at.column + 1}" if at is not None else ""
            why += f" ({context}{where})"
        return f", line {mark.line + 1}, column {mark.column + 1}: {why}"
    if isinstance(error, json.JSONDecodeError):
        return f", line {error.lineno}, column {error.colno}: {error.msg}"
    found = _TOML_WHERE.match(" ".join(str(error).split()))
    if found is not None:  # tomllib.TOMLDecodeError
        if found["end"]:
            return f", at the end: {found['why']}"
        return f", line {found['line']}, column {found['col']}: {found['why']}"
    return ": " + " ".join(str(error).split())


def _require_mapping(content: Any, what: str, example: str) -> Mapping[str, Any]:
    """``content`` when it is a mapping; else :class:`ConfigError`: ``WHAT must hold a
    mapping EXAMPLE, got TYPE``."""
    if not isinstance(content, Mapping):
        raise ConfigError(f"{what} must hold a mapping {example}, got {type(content).__name__}")
    return content


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
        return _spec_file(text)
    spec: dict[str, Any] = {}
    for raw in _split_pieces(text):
        _add_piece(spec, raw.strip(), text)
    return spec


def _split_pieces(text: str) -> list[str]:
    """The ``,``-separated pieces of spec text, a ``,`` inside ``[...]`` kept in its piece
    (so ``d_w=[1,2]`` reaches :func:`coerce_value`, which says the items take ``;``)."""
    pieces, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    if depth:
        raise ConfigError(f"a '[' is not closed in the attention spec {text!r}")
    pieces.append(text[start:])
    return pieces


def _spec_file(path: str) -> dict[str, Any]:
    """The attention spec held by the YAML / TOML / JSON file ``path`` (a mapping, spec
    text or nothing)."""
    content = read_structured_file(path)
    if isinstance(content, str):
        return parse_attention(content)
    if content is None:
        return {}
    example = "such as {score: additive, align: soft}"
    mapping = _require_mapping(content, f"attention file {path!r}", example)
    return _check_spec(dict(mapping), where=f"attention file {path!r}")


def _add_piece(spec: dict[str, Any], piece: str, text: str) -> None:
    """Add one ``,``-separated piece of the spec text ``text`` to ``spec``: ``key=value``
    or a preset name."""
    if not piece:
        raise ConfigError(f"empty piece in the attention spec {text!r} (a stray comma?)")
    if "=" not in piece:
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
        return
    key, _, value = piece.partition("=")
    key = key.strip()
    if not _KEY.match(key):
        raise ConfigError(f"bad key {key!r} in the attention spec {text!r} (piece {piece!r})")
    if not value.strip():
        raise ConfigError(f"no value for {key!r} in the attention spec {text!r}")
    if key in spec:
        raise ConfigError(f"{key!r} is given twice in the attention spec {text!r}")
    spec[key] = coerce_value(value)


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
    where = f"config file {str(path)!r}"
    content = _require_mapping(content, where, f"with keys {', '.join(CONFIG_KEYS)}")
    unknown = sorted(str(k) for k in content if k not in CONFIG_KEYS)
    if unknown:
        raise ConfigError(
            f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CONFIG_KEYS)}"
        )
    readers = {"attention": _config_attention, "options": _config_options, "seeds": _config_seeds}
    return {key: read(content[key], path) for key, read in readers.items() if key in content}


def _config_attention(attention: Any, path: str | Path) -> dict[str, Any]:
    """The ``attention`` of a config file: nothing, spec text or a mapping."""
    if attention is None:
        return {}
    if isinstance(attention, str):
        if _is_file_spec(attention):
            raise ConfigError(f"config file {str(path)!r}: 'attention' may not name a file")
        return parse_attention(attention)
    if isinstance(attention, Mapping):
        return _check_spec(dict(attention), where=f"'attention' of {path}")
    raise ConfigError(
        f"config file {str(path)!r}: 'attention' must be a mapping or spec text, got "
        f"{type(attention).__name__}"
    )


def _config_options(options: Any, path: str | Path) -> dict[str, Any]:
    """The ``options`` of a config file: nothing or a mapping. A text value is read as
    ``-o KEY=VALUE`` reads it (:func:`coerce_value`), so ``lr: 1e-3`` (text to YAML 1.1)
    is a number and ``grad_clip: none`` is None, as on the command line."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"config file {str(path)!r}: 'options' must be a mapping, got {type(options).__name__}"
        )
    read = {k: coerce_value(v) if isinstance(v, str) else v for k, v in options.items()}
    return _check_spec(read, where=f"'options' of {path}")


def _config_seeds(seeds: Any, path: str | Path) -> list[int]:
    """The ``seeds`` of a config file: one integer or a non-empty list of integers."""
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
    return list(seeds)


# ----------------------------------------------------------------------------- checks
#
# What can be checked against a task before its data is loaded: the preset and the names
# of the score, alignment and dimensionality, the keys of a spec (for tasks whose model
# passes the spec to attnlab's generic attention modules), the types of option values and
# the separators. What only the task model can tell (e.g. a combination that its model
# rejects) is checked when the trainer builds the model, still before a run directory is
# written (attnlab.lab.training.train_run).

_NAME_KINDS = (("score", "score"), ("align", "alignment"), ("dim", "dimensionality"))
# "key=" after a ',' or ';' inside a value: two pieces typed where one was expected
_JOINED = re.compile(r"[,;]\s*[A-Za-z_][A-Za-z0-9_.-]*\s*=")


def _params(cls: Any) -> set[str]:
    """The named parameters of a class's ``__init__`` (not ``self`` or ``**kwargs``)."""
    return {
        name
        for name, p in inspect.signature(cls).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    }


@functools.cache
def _generic_keys() -> frozenset[str]:
    """The spec keys that attnlab's generic attention builders read besides the options of
    the score and alignment: the arguments of ``Attention``, ``LearnedQuerySelfAttention``
    and ``HierarchicalAttention``, and ``uniform``."""
    from attnlab.feature.multilevel import HierarchicalAttention
    from attnlab.general.attention import Attention
    from attnlab.query.self_attention import LearnedQuerySelfAttention

    keys = {"uniform"}
    for cls in (Attention, LearnedQuerySelfAttention, HierarchicalAttention):
        keys |= _params(cls)
    return frozenset(keys)


def _kind_params(kind: str, name: Any = None) -> set[str]:
    """The parameters of the registered ``kind`` called ``name`` (of every one of that kind
    when ``name`` is not a registered name)."""
    from attnlab import registry

    if isinstance(name, str):
        try:
            return _params(registry.get(kind, name).cls)
        except KeyError:
            pass
    return set().union(*(_params(e.cls) for e in registry.entries(kind)))


def _uses_generic_keys(task: Task) -> bool:
    """Whether every key of the task's default attention and presets is one that attnlab's
    generic attention modules read: then its model takes any spec of that form, and a key
    outside it is a typo (tasks with their own keys -- ``hops``, ``style``, ``meta``,
    ``co_attention``, ... -- are left to their model)."""
    allowed = _generic_keys() | _kind_params("score") | _kind_params("align") | {"dim"}
    specs = [task.default_attention, *task.presets.values()]
    return all(k in allowed for spec in specs for k in spec if k != "name")


def _spec_text(spec: Mapping[str, Any]) -> str:
    """A spec as typed (``name`` first, then ``key=value`` in the given order)."""
    parts = [str(spec["name"])] if spec.get("name") is not None else []
    parts += [f"{k}={format_value(v)}" for k, v in spec.items() if k != "name"]
    return ",".join(parts) or "default"


def _check_joined(key: str, value: Any, *, option: bool) -> None:
    if not isinstance(value, str):
        return
    if option and _JOINED.search(value):
        first = re.split(r"[,;]", value, maxsplit=1)[0]
        rest = re.split(r"[,;]", value, maxsplit=1)[1].strip()
        raise ConfigError(
            f"option {key!r} has the value {value!r}: give one option per -o, repeated "
            f"(-o {key}={first} -o {rest})"
        )
    if not option and ";" in value:
        fixed = value.replace(";", ",")
        raise ConfigError(
            f"{key!r} has the value {value!r}: separate the key=value pairs of one spec "
            f"with ',' ({key}={fixed}); ';' separates the axes of ablate --grid"
        )


def check_attention(task: Task, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check an attention spec against ``task`` without its data; return the resolved spec
    (:meth:`~attnlab.lab.task.Task.resolve_attention`).

    Raises :class:`ConfigError` (one line, naming the spec and the task) for an unknown
    preset, a ``score`` / ``align`` / ``dim`` that is not registered (nor used by one of the
    task's presets), a value holding ``;`` (a typo for ``,``), and -- for tasks whose
    presets use only the keys of attnlab's generic attention modules -- a key that neither
    those modules nor the chosen score and alignment take.
    """
    given = dict(spec or {})
    try:
        resolved = task.resolve_attention(given)
    except ConfigError as error:
        raise ConfigError(str(error)) from None
    name = resolved.get("name")
    body = {k: v for k, v in resolved.items() if k != "name"}
    if name == "uniform":
        body = {**task.default_attention, **body}
    elif name is not None:  # mean, max, ...: the model checks what it takes
        return resolved
    try:
        for key, value in body.items():
            _check_joined(key, value, option=False)
        _check_names(task, body)
        if _uses_generic_keys(task):
            _check_keys(body)
    except ConfigError as error:
        where = f"attention {_spec_text(given)!r} of task {task.name!r}"
        raise ConfigError(f"{where}: {error}") from None
    return resolved


def _check_names(task: Task, body: Mapping[str, Any]) -> None:
    """The ``score`` / ``align`` / ``dim`` of a spec are registered names (or names that
    the task's own presets use)."""
    from attnlab import registry

    used = [task.default_attention, *task.presets.values()]
    for key, kind in _NAME_KINDS:
        if key not in body:
            continue
        value = body[key]
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a registered {kind} name, got {value!r}")
        if value in {s.get(key) for s in used} | set(task.presets):
            continue
        try:
            registry.get(key, value)
        except KeyError as error:
            message = error_message(error)
            raise ConfigError(f"{message} (attnlab list --kind {key})") from None


def _check_keys(body: Mapping[str, Any]) -> None:
    """Every key of a spec is one that the generic attention modules or the chosen score
    and alignment take."""
    score_takes = _kind_params("score", body.get("score"))
    align_takes = _kind_params("align", body.get("align"))
    allowed = _generic_keys() | score_takes | align_takes | {"dim"}
    unknown = [k for k in body if k not in allowed]
    if not unknown:
        return
    model_given = {"d_q", "d_k", "out_dim"}
    what = [
        f"{key} {body[key]!r} takes " + (", ".join(sorted(takes - model_given)) or "no options")
        for key, takes in (("score", score_takes), ("align", align_takes))
        if isinstance(body.get(key), str)
    ]
    raise ConfigError(
        f"unknown key(s) {', '.join(unknown)}; "
        + (
            "; ".join(what)
            or "a spec takes score, align, dim and the options of its score and alignment"
        )
        + " (attnlab list --kind score / --kind align)"
    )


def _all_defaults(task: Task | type[Task]) -> dict[str, Any]:
    from attnlab.lab.task import Task

    cls = task if isinstance(task, type) else type(task)
    return {**Task._TRAINING_DEFAULTS, **getattr(cls, "defaults", {})}


def check_option_values(task: Task | type[Task], options: Mapping[str, Any]) -> None:
    """Check the values of task options against the types of their defaults: an option
    whose default is an integer takes an integer, a float default a number, a boolean
    default ``true`` / ``false``; ``none`` is left to the task, and so are options whose
    default is text, a list or None. A text value holding ``,key=`` or ``;key=`` (two
    options typed in one ``-o``) is an error too. Unknown option names are the task's to
    report (:class:`~attnlab.lab.task.Task` lists the known ones)."""
    defaults = _all_defaults(task)
    for key, value in options.items():
        _check_joined(key, value, option=True)
        if key not in defaults or value is None or defaults[key] is None:
            continue
        default = defaults[key]
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
            kind = "an integer"
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            kind = "a number"
        else:
            continue
        if not ok:
            raise ConfigError(
                f"option {key} must be {kind} (its default is {format_value(default)}), "
                f"got {format_value(value)!r}"
            )
    check_training_values(options)
    check_model_values(options, defaults)


#: The model options many tasks share whose range is known before any data is read:
#: sizes (ints >= 1) and the dropout probability (in [0, 1)).
_MODEL_SIZES = ("hidden_size", "embed_dim")


def check_model_values(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Check the shared model options among ``options`` that the task has (``defaults``,
    not None there): ``hidden_size`` and ``embed_dim`` ints >= 1, ``dropout`` a number in
    ``[0, 1)``; otherwise only building the model, after the data is read, would find them.
    Raises :class:`ConfigError`: ``"option dropout must be in [0, 1), got 1.5"``."""

    def given(name: str) -> bool:
        return name in options and defaults.get(name) is not None

    if given("dropout"):
        check_dropout(options["dropout"], "option dropout")
    for name in _MODEL_SIZES:
        if given(name):
            check_int(options[name], f"option {name}")


#: The training options whose range the trainer needs, besides ``epochs`` and
#: ``batch_size`` (ints >= 1): name -> (lowest value, whether the lowest value itself is
#: allowed, what ``none`` means: None where it is refused).
_TRAINING_RANGES: dict[str, tuple[float, bool, str | None]] = {
    "lr": (0.0, False, None),
    "weight_decay": (0.0, True, "0 or none: no weight decay"),
    "grad_clip": (0.0, True, "0 or none: no clipping"),
    "attention_weight_decay": (0.0, True, "none: the same as weight_decay"),
}


def check_training_values(options: Mapping[str, Any]) -> None:
    """Check the ranges of the training options among ``options`` (those present):
    ``epochs`` and ``batch_size`` ints >= 1, ``lr`` a finite number > 0, ``weight_decay``
    and ``grad_clip`` finite numbers >= 0, or none (no weight decay, no clipping; a
    negative ``grad_clip`` would flip the gradients, a negative ``weight_decay`` grow the
    weights, and torch refuses a learning rate <= 0 only once the optimizer is built).
    ``attention_weight_decay`` a finite number >= 0 or none (the same as
    ``weight_decay``), ``select_from_epoch`` an int >= 1 and at most ``epochs`` (when both
    are given), ``patience`` an int >= 1 or none (no early stopping), ``amsgrad`` true or
    false.
    Raises :class:`ConfigError`: ``"option lr must be > 0, got -1.0"``."""
    for name in ("epochs", "batch_size", "select_from_epoch"):
        if name in options:
            check_int(options[name], f"option {name}")
    if options.get("patience") is not None:
        check_int(options["patience"], "option patience")
    if "amsgrad" in options and not isinstance(options["amsgrad"], bool):
        raise ConfigError(f"option amsgrad must be true or false, got {options['amsgrad']!r}")
    first, epochs = options.get("select_from_epoch"), options.get("epochs")
    if isinstance(first, int) and isinstance(epochs, int) and first > epochs:
        raise ConfigError(
            f"option select_from_epoch ({first}) exceeds epochs ({epochs}): no epoch could "
            "be selected"
        )
    for name, (low, low_ok, none) in _TRAINING_RANGES.items():
        if name not in options or (options[name] is None and none is not None):
            continue
        value = options[name]
        rule = (f">= {low:g}" if low_ok else f"> {low:g}") + (f" ({none})" if none else "")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"option {name} must be a number {rule}, got {format_value(value)!r}")
        if not finite_real(value):  # nan, inf, an int too large for a float
            raise ConfigError(f"option {name} must be finite, got {value!r}")
        if value < low or (value == low and not low_ok):
            raise ConfigError(f"option {name} must be {rule}, got {value!r}")


# ----------------------------------------------------------------------------- tasks


def task_class(name: str) -> type[Task]:
    """The task class registered as ``name``; raises :class:`ConfigError` naming the
    registered tasks when there is none."""
    import attnlab.lab.tasks  # noqa: F401  (registers the built-in tasks)
    from attnlab import registry

    try:
        return registry.get("task", name).cls
    except KeyError:
        known = ", ".join(registry.names("task")) or "none"
        raise ConfigError(
            f"unknown task {name!r}; registered tasks: {known} (a task from another module: "
            "--plugin MODULE)"
        ) from None


def resolve_task(task: str | Task | type[Task], options: Mapping[str, Any] | None = None) -> Task:
    """A :class:`~attnlab.lab.task.Task` instance from a registered name, a class or an
    instance; ``options`` update the instance's options (a new instance is made)."""
    from attnlab.lab.task import Task

    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"options must be a mapping of option names to values, got {type(options).__name__}"
        )
    options = dict(options or {})
    if isinstance(task, Task):
        return type(task)(**{**task.options, **options}) if options else task
    if isinstance(task, type) and issubclass(task, Task):
        return task(**options)
    if not isinstance(task, str):
        raise ConfigError(f"task must be a task name or a Task, got {type(task).__name__}")
    return task_class(task)(**options)


# ----------------------------------------------------------------------------- help


def task_presets(task: type[Task]) -> str:
    """One line on a task's attentions: its presets (the default marked) and baselines,
    e.g. ``tanh (default), dot, sparsemax; baselines mean, uniform``."""
    names = []
    for name, spec in task.presets.items():
        default = dict(spec) == dict(task.default_attention)
        names.append(f"{name} (default)" if default else name)
    line = ", ".join(names) or "no presets"
    if task.default_attention and not any("(default)" in n for n in names):
        line += f"; default {_spec_text(task.default_attention)}"
    return f"{line}; baselines {', '.join(task.baselines)}"


def describe_task(task: type[Task]) -> str:
    """What ``--list-options`` prints: the task's source, data, metrics, attention presets
    (with their specs) and baselines, every option with its default, and the option
    presets (``-o preset=paper``) with their values."""
    defaults = _all_defaults(task)
    name = getattr(task, "registry_name", "") or task.__name__
    lines = [f"task {name}"]
    from attnlab import registry

    try:
        entry = registry.get("task", name)
        lines.append(f"  source:  {entry.source}")
    except KeyError:
        pass
    if getattr(task, "data_source", ""):
        lines.append(f"  data:    {task.data_source}")
    metrics = list(task.metrics)
    lines.append(
        f"  metrics: {metrics[0]} (picks the best epoch; option select_metric)"
        + "".join(f", {m}" for m in metrics[1:])
    )
    lines += ["", "attention (--attention NAME, or NAME,key=value to refine a preset):"]
    rows = [("(default)", _spec_text(task.default_attention))]
    rows += [(n, _spec_text(s)) for n, s in task.presets.items()]
    rows += [(b, "baseline") for b in task.baselines]
    width = max(len(r[0]) for r in rows)
    lines += [f"  {n.ljust(width)}  {text}" for n, text in rows]
    lines += ["", "options (-o KEY=VALUE, repeat -o for several; the default after the name):"]
    width = max(len(k) for k in defaults)
    lines += [f"  {k.ljust(width)}  {format_value(v)}" for k, v in defaults.items()]
    presets = getattr(task, "option_presets", {}) or {}
    if presets:
        lines += ["", "option presets (-o preset=NAME; options given beside it win):"]
        width = max(len(n) for n in presets)
        for name, values in presets.items():
            text = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
            lines.append(f"  {name.ljust(width)}  {text or 'the defaults above'}")
    return "\n".join(lines)
