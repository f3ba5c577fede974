"""The checks every task test repeats, in one place (like Keras' ``run_layer_test``).

For a task, its data and an attention spec:

* :func:`run_spec` builds the model from a seed, trains it on a few shuffled batches
  (:func:`train_steps`: every loss a finite scalar), evaluates a split and draws the
  attention examples the report shows (:func:`evaluate_and_draw`: eval mode, no_grad,
  every example JSON-safe and equal to itself after a round trip);
* :func:`check_metrics` checks the metrics dict (names in order, values in a range);
* :func:`check_deterministic` checks that one seed gives one model and one loss history;
* :func:`check_train_run` runs ``attnlab.lab.training.train_run`` end to end and checks the
  files of the run (``run.json``, ``metrics.json``, ``history.json``, ``examples.json``);
* :func:`run_spec_on_splits` trains a spec in order and checks the metrics of several
  splits, :func:`run_every_spec` runs and checks a list of specs in one test (the
  real-data tests);
* :func:`real_data` and :func:`load_or_skip` give the real data or skip with the loader's
  message; :func:`check_bad_options` and :func:`check_bad_specs` check that bad task
  options and bad attention specs are refused.

Each task's test file keeps its own checks of what only that task draws or computes.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.data import MissingDataError
from attnlab.lab.task import AttentionExample, Task, TaskData


def spec_id(spec: Mapping[str, Any]) -> str:
    """A readable pytest id of an attention spec."""
    return ",".join(f"{k}={v}" for k, v in spec.items())


def load_or_skip(task: Task) -> TaskData:
    """The task's data, or skip the test with the loader's message when it is missing."""
    try:
        return task.load_data()
    except MissingDataError as error:
        pytest.skip(str(error))


def build(task: Task, data: TaskData, spec: Mapping[str, Any], seed: int = 0) -> torch.nn.Module:
    """The task's model for the (resolved) spec, its parameters drawn after ``seed``."""
    torch.manual_seed(seed)
    return task.build_model(data, task.resolve_attention(spec))


def train_steps(
    task: Task,
    data: TaskData,
    model: torch.nn.Module,
    batch_size: int,
    *,
    steps: int | None = None,
    shuffle: bool = True,
    generator_seed: int | None = 0,
    lr: float = 1e-2,
    epochs: int | None = 1,
    grad_clip: float | None = None,
) -> list[float]:
    """Adam over the trainable parameters on the train batches (shuffled by a generator
    seeded with ``generator_seed``, or a fresh unseeded one for None), at most ``steps``
    of them over at most ``epochs`` passes (None: as many as ``steps`` needs), the
    gradient norm clipped to ``grad_clip`` if given; every loss must be a finite scalar.
    Returns the losses."""
    if steps is None and epochs is None:
        raise ValueError("train_steps needs steps or epochs")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator()
    if generator_seed is not None:
        gen.manual_seed(generator_seed)
    model.train()
    losses = []
    passes = itertools.count() if epochs is None else range(epochs)
    batches = itertools.chain.from_iterable(
        task.batches(data, "train", batch_size, shuffle=shuffle, generator=gen) for _ in passes
    )
    for batch in itertools.islice(batches, steps):
        loss = task.loss(model, batch)
        assert loss.dim() == 0 and torch.isfinite(loss), loss
        opt.zero_grad()
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
    assert losses and all(math.isfinite(x) for x in losses)
    return losses


def check_examples_json(examples: Iterable[AttentionExample]) -> None:
    """Every example an :class:`AttentionExample` that survives a JSON round trip."""
    for ex in examples:
        assert isinstance(ex, AttentionExample)
        assert AttentionExample.from_json(json.loads(json.dumps(ex.to_json()))) == ex


def evaluate_and_draw(
    task: Task, model: torch.nn.Module, data: TaskData, split: str = "test", n: int | None = None
) -> tuple[dict[str, float], list[AttentionExample]]:
    """(the metrics of ``split``, the attention examples -- ``n`` of them, or the task's
    default number) in eval mode under no_grad; the examples are JSON-safe."""
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model, data, split)
        examples = (
            task.attention_examples(model, data)
            if n is None
            else task.attention_examples(model, data, n=n)
        )
    assert not model.training
    check_examples_json(examples)
    return metrics, examples


def check_metrics(
    metrics: Mapping[str, float],
    names: Iterable[str] | None = None,
    *,
    exact: bool = True,
    low: float = 0.0,
    high: float = 1.0,
) -> None:
    """The metric ``names`` (in this order when ``exact``, else at least them) with values
    in ``[low, high]``."""
    names = list(metrics) if names is None else list(names)
    if exact:
        assert list(metrics) == names, metrics
    else:
        assert set(names) <= set(metrics), metrics
    for name in names:
        assert low <= metrics[name] <= high, (name, metrics[name])


def run_spec(
    task: Task,
    data: TaskData,
    spec: Mapping[str, Any],
    batch_size: int,
    *,
    model_type: type | None = None,
    steps: int | None = None,
    shuffle: bool = True,
    generator_seed: int | None = 0,
    split: str = "test",
    n: int | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, dict[str, float], list[AttentionExample]]:
    """Build, train a few steps (``shuffle``: see :func:`train_steps`), evaluate and draw
    (see the module docstring). Returns (the model, the metrics of ``split``, the
    examples)."""
    model = build(task, data, spec, seed)
    if model_type is not None:
        assert isinstance(model, model_type)
    train_steps(
        task,
        data,
        model,
        batch_size,
        steps=steps,
        shuffle=shuffle,
        generator_seed=generator_seed,
    )
    metrics, examples = evaluate_and_draw(task, model, data, split, n)
    return model, metrics, examples


def check_deterministic(
    task: Task, data: TaskData, spec: Mapping[str, Any], batch_size: int, *, steps: int = 2
) -> None:
    """One seed, one model: two builds from seed 0 hold the same parameters and train to
    the same losses and metrics; seed 1 gives other parameters (when there are any)."""
    runs = []
    for _ in range(2):
        model = build(task, data, spec, seed=0)
        params = [p.detach().clone() for p in model.parameters()]
        losses = train_steps(task, data, model, batch_size, steps=steps)
        metrics, _ = evaluate_and_draw(task, model, data, "test")
        runs.append((params, losses, metrics))
    (p0, l0, m0), (p1, l1, m1) = runs
    assert len(p0) == len(p1) and all(torch.equal(a, b) for a, b in zip(p0, p1, strict=True))
    assert l0 == l1
    assert m0.keys() == m1.keys()
    for k in m0:
        assert m0[k] == m1[k] or (math.isnan(m0[k]) and math.isnan(m1[k])), k
    other = [p.detach() for p in build(task, data, spec, seed=1).parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(p0, other, strict=True))


def check_train_run(
    task: Task | str,
    spec: Mapping[str, Any] | str,
    out_dir: Path,
    *,
    task_name: str | None = None,
    primary: str | None = None,
    metric_names: Iterable[str] | None = None,
    epochs: int | None = None,
    example_kind: str | None = None,
    **kwargs: Any,
) -> tuple[Any, list[dict[str, Any]]]:
    """``train_run(task, spec, out_dir=out_dir, progress=False, **kwargs)`` (seed 0 unless
    given) and the checks of its files: the run is done (and of ``task_name``), the test
    metrics of ``metrics.json`` are the result's, hold ``metric_names`` and have
    ``primary``; ``history.json`` has ``epochs`` entries; ``examples.json`` is not empty
    and its first example has ``example_kind``. Returns (the result, the examples)."""
    from attnlab.lab.training import train_run

    kwargs.setdefault("seed", 0)
    result = train_run(task, spec, out_dir=out_dir, progress=False, **kwargs)
    run = json.loads((out_dir / "run.json").read_text())
    assert run["status"] == "done"
    if task_name is not None:
        assert run["task"] == task_name
    metrics = json.loads((out_dir / "metrics.json").read_text())
    # metrics.json writes an undefined metric (NaN) as null
    test = {
        k: None if isinstance(v, float) and math.isnan(v) else v
        for k, v in result.metrics["test"].items()
    }
    assert test == metrics["test"]
    if primary is not None:
        assert metrics["primary"] == primary
    if metric_names is not None:
        assert set(metric_names) <= set(metrics["test"])
    if epochs is not None:
        assert len(json.loads((out_dir / "history.json").read_text())) == epochs
    examples = json.loads((out_dir / "examples.json").read_text())
    if example_kind is not None:
        assert examples and examples[0]["kind"] == example_kind
    return result, examples


def real_data(task: Task) -> tuple[Task, TaskData]:
    """(``task``, its data) for a module-scoped real-data fixture; the test is skipped with
    the loader's message when the data is missing (see :func:`load_or_skip`)."""
    return task, load_or_skip(task)


def check_bad_options(
    task_cls: type[Task],
    options: Mapping[str, Any],
    match: str,
    error: type[Exception] = ConfigError,
) -> None:
    """Building ``task_cls(**options)`` raises ``error`` (a ConfigError unless given) whose
    message the regular expression ``match`` finds (as ``pytest.raises(match=...)``)."""
    with pytest.raises(error, match=match):
        task_cls(**options)


def run_spec_on_splits(
    task: Task,
    data: TaskData,
    spec: Mapping[str, Any],
    batch_size: int,
    names: Iterable[str],
    *,
    steps: int = 2,
    splits: Iterable[str] = ("dev", "test"),
    n: int | None = None,
    seed: int = 0,
) -> tuple[torch.nn.Module, list[AttentionExample]]:
    """:func:`run_spec` with ``steps`` batches in order (not shuffled) on the first of
    ``splits``, then evaluate and draw (:func:`evaluate_and_draw`) each other split; the
    metrics of each are checked: the
    ``names`` in this order, every value in [0, 1]. Returns (the model, the examples of the
    last split)."""
    names, (first, *rest) = list(names), list(splits)
    model, metrics, examples = run_spec(
        task, data, spec, batch_size, steps=steps, shuffle=False, split=first, n=n, seed=seed
    )
    check_metrics(metrics, names)
    for split in rest:
        metrics, examples = evaluate_and_draw(task, model, data, split, n)
        check_metrics(metrics, names)
    assert examples, "no example drawn"
    return model, examples


def check_bad_specs(
    task: Task, data: TaskData, cases: Iterable[tuple[Mapping[str, Any], str | None]]
) -> None:
    """For each (spec, match) of ``cases``: ``task.build_model(data, spec)``, the spec as
    given (not resolved), raises a ConfigError whose message the regular expression
    ``match`` finds (any message when ``match`` is None)."""
    for spec, match in cases:
        with pytest.raises(ConfigError, match=match):
            task.build_model(data, spec)


def run_every_spec(
    task: Task,
    data: TaskData,
    specs: Iterable[Mapping[str, Any]],
    batch_size: int,
    names: Iterable[str],
    check_examples: Callable[[list[AttentionExample]], None],
    **kwargs: Any,
) -> None:
    """:func:`run_spec` for each of ``specs`` in one test (``kwargs`` passed on: steps,
    split, ...): its metrics checked by :func:`check_metrics` (the ``names`` in this order,
    every value in [0, 1]) and its examples by ``check_examples``."""
    names = list(names)
    for spec in specs:
        _, metrics, examples = run_spec(task, data, spec, batch_size, **kwargs)
        check_metrics(metrics, names)
        check_examples(examples)
