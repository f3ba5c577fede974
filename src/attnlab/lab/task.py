"""The contract between a task of the lab and the trainer, the ablation runner and the report.

A *task* (TAXONOMY section 0) bundles real data, a task model that takes any compatible
attention, a training loss and the task's metrics. The trainer
(:func:`attnlab.lab.training.train_run`) only talks to a task through this interface, so a
new task is one subclass of :class:`Task` registered with
``@register_task("name")`` with ``:formula:`` and ``:source:`` fields in the docstring.

Attention specs: an ablation swaps only the attention, given as a plain dict (what
``--attention score=additive,align=soft,dim=multi`` parses to). Two keys are reserved:

* ``"name"``: a preset of the task (e.g. ``"tanh"`` for the sentence classifier,
  ``"bahdanau"`` for the translator) or one of the baselines ``"mean"`` (unweighted average
  of the features) and ``"uniform"`` (the default attention with its weights replaced by
  ``1/n`` over the real items); the other keys refine the preset.
* everything else is passed to the attention the task model builds (``score``, ``align``,
  ``dim`` and their options).

:func:`spec_label` gives the canonical text label of a spec (used as the mechanism's name
in tables and run ids).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_choice, check_int, check_number
from attnlab.data._common import SPLIT_NAMES, check_split
from attnlab.lab.batching import batch_order, check_bucket
from attnlab.registry import register

#: metric names read as lower-is-better: these words anywhere in the name, and these
#: abbreviations as a whole word of it (``per`` is the phone error rate, not "percent")
_LOWER_WORDS = ("loss", "error", "perplexity", "hamming", "invalid")
_LOWER_ABBREVIATIONS = frozenset({"ppl", "aer", "wer", "cer", "per", "mse", "mae", "rmse"})

__all__ = [
    "AttentionExample",
    "Task",
    "TaskData",
    "lower_is_better",
    "register_task",
    "spec_label",
    "spec_slug",
]

Batch = dict[str, Any]


def lower_is_better(metric: str) -> bool:
    """Whether a metric is an error (lower is better), read from its name: ``loss``,
    ``error``, ``perplexity``, ``hamming``, ``invalid`` anywhere in it, or one of ``ppl``, ``aer``,
    ``wer``, ``cer``, ``per``, ``mse``, ``mae``, ``rmse`` as a whole word (``mse_masked``,
    ``per``, ``val_wer``; not ``percent_correct``). The trainer's ``select_metric`` and the
    report's tables read directions from this one rule."""
    lowered = metric.lower()
    if any(word in lowered for word in _LOWER_WORDS):
        return True
    return any(part in _LOWER_ABBREVIATIONS for part in re.split(r"[^a-z0-9]+", lowered))


def register_task(name: str, **card_and_caps: Any):
    """Register a :class:`Task` subclass under kind ``"task"`` (``attnlab list --kind task``);
    its card as for :func:`attnlab.registry.register`: the docstring's ``:formula:``,
    ``:source:`` and ``:cost:`` fields, or the keywords. Anything but a ``Task`` subclass is
    a ``TypeError`` (it would fail only when a run builds it)."""
    add = register("task", name, **card_and_caps)

    def deco(cls: Any) -> Any:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task({name!r}) takes a Task subclass, got {cls!r}")
        return add(cls)

    return deco


def spec_label(spec: Mapping[str, Any]) -> str:
    """Canonical label of an attention spec: ``name`` first, then ``key=value`` sorted.

    >>> spec_label({"align": "soft", "score": "additive"})
    'align=soft,score=additive'
    >>> spec_label({"name": "mean"})
    'mean'
    """
    spec = dict(spec)
    parts = []
    name = spec.pop("name", None)
    if name is not None:
        parts.append(str(name))
    parts += [f"{k}={_fmt(v)}" for k, v in sorted(spec.items())]
    return ",".join(parts) or "default"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ";".join(_fmt(v) for v in value) + "]"
    return str(value)


def spec_slug(spec: Mapping[str, Any]) -> str:
    """A file-name safe version of :func:`spec_label` (used in run directory names)."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", spec_label(spec).replace(",", "__"))


@dataclass
class TaskData:
    """A task's prepared data: the three splits (any sequence the task's :meth:`Task.batches`
    understands) and whatever the model needs to be built (vocabularies, embeddings, sizes).
    """

    train: Any
    dev: Any
    test: Any
    info: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> Any:
        check_split(name, SPLIT_NAMES, none=False)
        return getattr(self, name)


@dataclass
class AttentionExample:
    """One attention map on a test example, as the report draws it.

    Attributes:
        title: a short heading (e.g. ``"test #12"``).
        rows: labels of the rows (queries: target words, hops, or ``["attention"]`` for a
            pooling attention over one sequence).
        cols: labels of the columns (keys: source tokens, image patches, ...).
        weights: ``len(rows) x len(cols)`` attention weights.
        label: the gold answer as text (or None).
        prediction: the model's answer as text (or None).
        kind: ``"tokens"`` (one row over a token sequence: drawn as a highlighted sentence),
            ``"matrix"`` (a heatmap of rows x cols) or ``"image"`` (cols are the cells of a
            ``grid`` = (height, width) image; drawn as an overlay).
        grid: for ``kind="image"``, the (height, width) of the attention grid.
        image: for ``kind="image"``, the picture as ``H x W x 3`` floats in [0, 1] (or None).
        extra: anything else worth showing (e.g. ``{"sentence_weights": [...]}``).
    """

    title: str
    rows: list[str]
    cols: list[str]
    weights: list[list[float]]
    label: str | None = None
    prediction: str | None = None
    kind: str = "tokens"
    grid: tuple[int, int] | None = None
    image: list | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in ("tokens", "matrix", "image"):
            raise ValueError(f"kind must be 'tokens', 'matrix' or 'image', got {self.kind!r}")
        if len(self.weights) != len(self.rows):
            raise ValueError(f"weights has {len(self.weights)} rows, rows has {len(self.rows)}")
        for i, row in enumerate(self.weights):
            if len(row) != len(self.cols):
                raise ValueError(f"weights row {i} has {len(row)} entries, cols {len(self.cols)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> AttentionExample:
        data = dict(payload)
        if data.get("grid") is not None:
            data["grid"] = tuple(data["grid"])
        return cls(**data)


class Task(abc.ABC):
    """A task of the lab. Subclasses set the class attributes and implement the methods.

    Class attributes:
        name: set by :func:`register_task`.
        metrics: the metric names :meth:`evaluate` returns; the first is the one the trainer
            selects the best epoch by (on the dev split).
        higher_is_better: direction of the first metric.
        defaults: the task's options and their default values: training hyper-parameters
            (``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``) where they
            differ from the lab's (:attr:`_TRAINING_DEFAULTS`, which every task inherits:
            also ``select_metric``, ``amsgrad`` (Adam's AMSGrad variant),
            ``attention_weight_decay`` (the weight decay of the model's attention
            parameters, :func:`~attnlab.lab.training.parameter_groups`; none: the same as
            ``weight_decay``), ``select_from_epoch`` (the first epoch the best-epoch
            selection may keep) and ``patience`` (early stopping: stop after that many
            epochs without a better selection metric; none: train every epoch))
            and data / model options (e.g. ``max_train``, ``hidden_size``, ``encoder``).
            Every option a user may pass must appear here or there; unknown options raise
            :class:`ConfigError`.
        default_attention: the paper's attention for this task, as a spec dict.
        presets: named attention specs (besides the baselines).
        baselines: the attention-free references the task supports: ``mean`` (unweighted
            average) and ``uniform`` (the attention with weights ``1/n``) everywhere, and
            e.g. ``max`` (no attention: max-pooling over time) where the model has it.
        data_source: one line naming the data and the package it comes from.
        option_presets: named sets of options, chosen with the option ``preset``
            (``-o preset=paper``): ``"paper"`` holds the model sizes and training length of
            the task's paper where the data allows. The preset's values sit between the
            defaults and the options given with it; ``preset`` itself is kept in
            :attr:`options` (only when given).

    Instance attributes:
        options: the resolved options (defaults, then the preset, then the given ones).
        progress: whether :meth:`load_data` may show a progress bar on stderr while it
            prepares slow data (e.g. speech synthesis); False by default. The trainer and
            the ablation runner call :meth:`load_data_showing` with their own
            ``progress`` flag, which sets it for that call only.
    """

    registry_name: ClassVar[str] = ""
    registry_kind: ClassVar[str] = ""
    metrics: ClassVar[tuple[str, ...]] = ("accuracy",)
    higher_is_better: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {}
    default_attention: ClassVar[dict[str, Any]] = {}
    presets: ClassVar[dict[str, dict[str, Any]]] = {}
    baselines: ClassVar[tuple[str, ...]] = ("mean", "uniform")
    data_source: ClassVar[str] = ""
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {}

    _TRAINING_DEFAULTS: ClassVar[dict[str, Any]] = {
        "epochs": 5,
        "batch_size": 32,
        "lr": 1e-3,
        "weight_decay": 0.0,
        "grad_clip": 5.0,
        "select_metric": None,
        "amsgrad": False,
        "attention_weight_decay": None,
        "select_from_epoch": 1,
        "patience": None,
    }

    def __init__(self, **options: Any) -> None:
        known = {**self._TRAINING_DEFAULTS, **self.defaults}
        preset = options.get("preset")
        if preset is not None:
            if not isinstance(preset, str) or preset not in self.option_presets:
                names = ", ".join(sorted(self.option_presets)) or "none"
                raise ConfigError(
                    f"task {self.registry_name!r} has no option preset {preset!r}; its "
                    f"option presets: {names}"
                )
            options = {**self.option_presets[preset], **options}
        else:
            options = {k: v for k, v in options.items() if k != "preset"}
        unknown = sorted(set(options) - set(known) - {"preset"})
        if unknown:
            raise ConfigError(
                f"task {self.registry_name!r} has no option(s) {', '.join(unknown)}; "
                f"its options: {', '.join(sorted(known))}"
            )
        self.options: dict[str, Any] = {**known, **options}
        self.progress = False
        if "reinforce_weight" in self.options:  # every task with hard attention has it
            self.check_number_options("reinforce_weight", low=0.0)
        # the data seeds (data_seed, split_seed) seed Python's and NumPy's generators: an
        # int >= 0 (Python's random takes -1 as 1, NumPy refuses it deep in the data)
        self.check_int_options(*(n for n in self.options if n.endswith("_seed")), minimum=0)

    @property
    def name(self) -> str:
        return self.registry_name

    def selection(self) -> tuple[str, bool]:
        """The dev metric the trainer selects the best epoch by, and whether higher is
        better: the first of :attr:`metrics` unless the option ``select_metric`` names
        another (e.g. ``roc_auc``, as Jain & Wallace select their models)."""
        chosen = self.options.get("select_metric")
        if chosen is None or chosen == self.metrics[0]:
            return self.metrics[0], bool(self.higher_is_better)
        if chosen not in self.metrics:
            raise ConfigError(
                f"select_metric={chosen!r} is not a metric of task {self.registry_name!r}; "
                f"its metrics: {', '.join(self.metrics)}"
            )
        return chosen, not lower_is_better(chosen)

    # ------------------------------------------------------------------ to implement

    @abc.abstractmethod
    def load_data(self) -> TaskData:
        """Load and prepare the data (may raise ``attnlab.data.MissingDataError``)."""

    def load_data_showing(self, progress: bool) -> TaskData:
        """:meth:`load_data` with :attr:`progress` set to ``progress`` for this call only:
        the task's own flag is restored afterwards, whatever happens."""
        before, self.progress = self.progress, progress
        try:
            return self.load_data()
        finally:
            self.progress = before

    @abc.abstractmethod
    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        """The task model with the attention given by ``attention`` (a spec dict)."""

    def batches(
        self,
        data: TaskData,
        split: str,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[Batch]:
        """Mini-batches of one split as dicts of tensors (on the CPU; the trainer moves every
        tensor value to the device).

        The skeleton every task shares: the example indices of each batch come from
        :meth:`batch_indices` (shuffled from ``generator`` or in order, length-bucketed
        with the option ``bucket``), and :meth:`make_batch` pads those examples into
        tensors. A task implements :meth:`make_batch` (and :meth:`example_size` if it
        buckets), or overrides this method."""
        part = data.split(split)
        for idx in self.batch_indices(part, batch_size, shuffle=shuffle, generator=generator):
            yield self.make_batch(data, part, idx)

    def batch_indices(
        self,
        part: Any,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[list[int]]:
        """The example indices of each batch of the split ``part``
        (:func:`attnlab.lab.batching.batch_order`; with the option ``bucket``, where the
        task has one, sorted by :meth:`example_size` within pools)."""
        bucket = check_bucket(self.options["bucket"]) if "bucket" in self.options else False
        sizes = [self.example_size(part, i) for i in range(len(part))] if bucket else None
        return batch_order(len(part), batch_size, shuffle, generator, lengths=sizes, bucket=bucket)

    def make_batch(self, data: TaskData, part: Any, idx: list[int]) -> Batch:
        """The batch of the examples ``idx`` of the split ``part`` (see :meth:`batches`)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither batches nor make_batch"
        )

    def example_size(self, part: Any, i: int) -> Any:
        """What padding example ``i`` of ``part`` costs (its length, or a tuple of lengths
        compared in order), for length bucketing."""
        return 0

    @abc.abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """The training loss of one batch (a scalar; includes REINFORCE terms when the
        attention samples)."""

    @abc.abstractmethod
    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        """The task's metrics on one split (the model is in eval mode, under no_grad).
        The trainer moves batches to the device only for :meth:`loss`; here (and in
        :meth:`attention_examples`) move them to the model's device yourself
        (``attnlab.lab.training.move_batch``)."""

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """Attention maps on the first ``n`` test examples, for the report."""
        return []

    # ------------------------------------------------------------------ helpers

    def check_int_options(self, *names: str, minimum: int = 1, optional: bool = False) -> None:
        """Each option ``names`` an int ``>= minimum`` (or None where ``optional``):
        ``ConfigError`` "option NAME must be an int >= MIN[ or None], got V"."""
        for name in names:
            value = self.options[name]
            if optional and value is None:
                continue
            try:
                check_int(value, f"option {name}", minimum)
            except ConfigError as error:
                if not optional:
                    raise
                raise ConfigError(
                    f"option {name} must be an int >= {minimum} or None, got {value!r}"
                ) from error

    def check_number_options(
        self,
        *names: str,
        low: float | None = None,
        high: float | None = None,
        open_low: bool = False,
        open_high: bool = False,
    ) -> None:
        """Each option ``names`` a finite number (not a bool) in the range ``low .. high``
        (bounds left out: unbounded; ``open_low`` / ``open_high``: the bound itself is
        excluded): ``ConfigError`` "option NAME must be a number in (0, 1), got V"
        (:func:`attnlab._checks.check_number`)."""
        for name in names:
            check_number(
                self.options[name],
                f"option {name}",
                low=low,
                high=high,
                open_low=open_low,
                open_high=open_high,
            )

    def check_option_choice(self, name: str, choices: tuple[Any, ...]) -> None:
        """The option ``name`` one of ``choices`` (``ConfigError`` "option NAME must be one
        of 'A', 'B', 'C', got V", :func:`attnlab._checks.check_choice`)."""
        check_choice(self.options[name], f"option {name}", choices)

    def generated_data(self, make: Callable[[int, int], Any], info: dict[str, Any]) -> TaskData:
        """The three splits of a task whose data is generated: ``make(size, offset)`` with
        the options ``train_size``, ``dev_size``, ``test_size`` and the offsets 0, 1, 2 (added
        to the data seed, so that the splits differ)."""
        o = self.options
        return TaskData(
            make(int(o["train_size"]), 0),
            make(int(o["dev_size"]), 1),
            make(int(o["test_size"]), 2),
            info,
        )

    def model_attention(self, spec: Mapping[str, Any]) -> str | dict[str, Any]:
        """The ``attention`` argument of the task model for a resolved spec: a baseline
        without attention (``mean``, ``max``, ...) as its name, ``uniform`` as the default
        attention (refined by the spec) with ``"uniform": True``, anything else as the spec
        dict. The task models (sentence, document, target, VQA) all read this form."""
        spec = dict(spec)
        name = spec.pop("name", None)
        if name == "uniform":
            return {**self.default_attention, **spec, "uniform": True}
        if name in self.baselines:
            if spec:
                raise ConfigError(f"the {name} baseline takes no attention options, got {spec}")
            return str(name)
        if name is not None:  # resolve_attention expands presets; anything else is unknown
            raise ConfigError(f"unknown attention preset {name!r}")
        return spec

    def resolve_attention(self, attention: Mapping[str, Any] | None) -> dict[str, Any]:
        """Expand a spec: ``{}``/None -> :attr:`default_attention`; ``{"name": preset, ...}``
        -> the preset updated by the other keys; baselines are kept as ``{"name": ...}``."""
        spec = dict(attention or {})
        if not spec:
            return dict(self.default_attention)
        name = spec.get("name")
        if name is None or name in self.baselines:
            return spec
        if name not in self.presets:
            raise ConfigError(
                f"task {self.registry_name!r} has no attention preset {name!r}; presets: "
                f"{', '.join(sorted(self.presets)) or 'none'}, baselines: "
                f"{', '.join(self.baselines)}, "
                "or give score=..., align=..., dim=..."
            )
        rest = {k: v for k, v in spec.items() if k != "name"}
        return {**self.presets[name], **rest}
