"""The Task contract: options, presets, the selection metric, spec labels, examples."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.lab.batching import batch_order
from attnlab.lab.task import (
    AttentionExample,
    Task,
    TaskData,
    lower_is_better,
    spec_label,
    spec_slug,
)
from attnlab.lab.tasks.sentiment import SentimentTask


def test_unknown_option_is_named() -> None:
    with pytest.raises(ConfigError, match=r"no option.*bogus"):
        SentimentTask(bogus=1)


def test_selection_metric_default_and_chosen() -> None:
    assert SentimentTask().selection() == ("accuracy", True)
    assert SentimentTask(select_metric="roc_auc").selection() == ("roc_auc", True)
    with pytest.raises(ConfigError, match="select_metric='bleu' is not a metric"):
        SentimentTask(select_metric="bleu").selection()


def test_lower_is_better_reads_the_name() -> None:
    lower = ["loss", "val_loss", "error_rate", "per", "cer", "wer", "mse_masked", "mae",
             "perplexity", "ppl", "aer", "hamming_loss", "test-RMSE", "invalid_rate"]  # fmt: skip
    higher = ["accuracy", "f1", "micro_f1", "bleu", "meteor", "psnr_masked", "ssim",
              "roc_auc", "percent_correct", "superb", "diagonal_mass", "iou"]  # fmt: skip
    assert [m for m in lower if not lower_is_better(m)] == []
    assert [m for m in higher if lower_is_better(m)] == []


@pytest.mark.parametrize(
    ("task", "metric"),
    [
        ("speech", "per"),
        ("speech", "cer"),
        ("inpainting", "mse_masked"),
        ("multilabel", "hamming_loss"),
        ("translation", "perplexity"),
    ],
)
def test_an_error_metric_chosen_for_selection_is_lower_is_better(task, metric) -> None:
    """The trainer keeps the epoch with the lowest error (it once kept the highest PER and
    MSE: their names were not on the list)."""
    from attnlab.lab.config import resolve_task

    assert resolve_task(task, {"select_metric": metric}).selection() == (metric, False)


def test_resolve_attention_presets_and_baselines() -> None:
    task = SentimentTask()
    assert task.resolve_attention(None) == task.default_attention
    assert task.resolve_attention({"name": "mean"}) == {"name": "mean"}
    assert task.resolve_attention({"name": "dot", "align": "sparsemax"}) == {
        "score": "scaled-dot",
        "align": "sparsemax",
    }
    with pytest.raises(ConfigError, match="no attention preset 'nope'"):
        task.resolve_attention({"name": "nope"})


def test_spec_label_and_slug() -> None:
    assert spec_label({"score": "additive", "align": "soft"}) == "align=soft,score=additive"
    assert spec_label({"name": "tanh", "D": 2, "flag": True}) == "tanh,D=2,flag=true"
    assert spec_label({}) == "default"
    assert spec_slug({"name": "a/b", "x": [1, 2]}) == "a_b__x=_1_2_"


def test_attention_example_checks_and_round_trip() -> None:
    ex = AttentionExample("t", ["q"], ["a", "b"], [[0.25, 0.75]], kind="matrix")
    assert AttentionExample.from_json(ex.to_json()) == ex
    with pytest.raises(ValueError, match="kind"):
        AttentionExample("t", ["q"], ["a"], [[1.0]], kind="video")
    with pytest.raises(ValueError, match="row 0 has 1 entries"):
        AttentionExample("t", ["q"], ["a", "b"], [[1.0]])


class _Lines(Task):
    """A task whose examples are lists of ints; ``bucket`` optional."""

    defaults: ClassVar[dict[str, Any]] = {
        "bucket": False,
        "size": 3,
        "kind": "a",
        "train_size": 4,
        "dev_size": 2,
        "test_size": 1,
    }

    def load_data(self) -> TaskData:
        return self.generated_data(
            lambda count, offset: [[offset] * (i + 1) for i in range(count)], {}
        )

    def build_model(self, data, attention):
        raise NotImplementedError

    def make_batch(self, data, part, idx):
        return {"index": idx, "lengths": [len(part[i]) for i in idx]}

    def example_size(self, part, i):
        return len(part[i])

    def loss(self, model, batch):
        raise NotImplementedError

    def evaluate(self, model, data, split):
        return {}


def test_batches_skeleton_orders_then_makes_each_batch() -> None:
    task = _Lines(train_size=7, dev_size=2, test_size=1)
    data = task.load_data()
    assert [len(data.train), len(data.dev), len(data.test)] == [7, 2, 1]
    assert data.dev == [[1], [1, 1]] and data.test == [[2]]  # offsets 0, 1, 2
    plain = [b["index"] for b in task.batches(data, "train", 3)]
    assert plain == [[0, 1, 2], [3, 4, 5], [6]]
    gen = torch.Generator().manual_seed(0)
    shuffled = [b["index"] for b in task.batches(data, "train", 3, shuffle=True, generator=gen)]
    assert shuffled == list(
        batch_order(7, 3, True, torch.Generator().manual_seed(0))
    )  # the order of attnlab.lab.batching
    bucketed = _Lines(bucket=True, train_size=7, dev_size=2, test_size=1)
    gen = torch.Generator().manual_seed(0)
    batches = list(bucketed.batches(data, "train", 3, shuffle=True, generator=gen))
    for b in batches:  # sorted by length within the pool
        assert b["lengths"] == sorted(b["lengths"])
    with pytest.raises(ConfigError, match="option bucket must be true or false"):
        next(_Lines(bucket="yes").batches(data, "train", 3, shuffle=True))


def test_a_task_without_make_batch_says_so() -> None:
    class NoBatches(_Lines):
        make_batch = Task.make_batch

    task = NoBatches(train_size=2, dev_size=1, test_size=1)
    with pytest.raises(NotImplementedError, match="NoBatches implements neither batches nor"):
        next(task.batches(task.load_data(), "train", 2))


@pytest.mark.parametrize("fails", [False, True])
def test_load_data_showing_sets_progress_for_the_call_only(fails) -> None:
    seen: list[bool] = []

    class Watched(_Lines):
        def load_data(self):
            seen.append(self.progress)
            if fails:
                raise RuntimeError("no data")
            return super().load_data()

    task = Watched(train_size=2, dev_size=1, test_size=1)
    assert task.progress is False
    if fails:
        with pytest.raises(RuntimeError, match="no data"):
            task.load_data_showing(True)
    else:
        assert len(task.load_data_showing(True).train) == 2
    assert seen == [True] and task.progress is False  # restored, also after a failure


def test_option_checks() -> None:
    task = _Lines(size=0)
    with pytest.raises(ConfigError, match="option size must be an int >= 1, got 0"):
        task.check_int_options("size")
    _Lines(size=2).check_int_options("size", minimum=2)
    with pytest.raises(ConfigError, match="option size must be an int >= 3, got 2"):
        _Lines(size=2).check_int_options("size", minimum=3)
    _Lines().check_option_choice("kind", ("a", "b"))
    with pytest.raises(ConfigError, match=r"^option kind must be 'a' or 'b', got 'c'$"):
        _Lines(kind="c").check_option_choice("kind", ("a", "b"))


def test_optional_int_options() -> None:
    task = _Lines(size=None)
    task.check_int_options("size", optional=True)
    with pytest.raises(ConfigError, match="option size must be an int >= 1, got None"):
        task.check_int_options("size")
    with pytest.raises(ConfigError, match="option size must be an int >= 1 or None, got 0"):
        _Lines(size=0).check_int_options("size", optional=True)


@pytest.mark.parametrize(
    ("bounds", "fine", "refused", "wanted"),
    [
        ({}, [0, -3.5, 1e300], [float("nan"), float("inf"), "1", True, None], "a finite number"),
        ({"low": 0.0}, [0, 0.0, 2], [-1e-9, -1], "a number >= 0"),
        ({"low": 0.0, "open_low": True}, [1e-9, 3], [0, -1], "a number > 0"),
        ({"high": 1.0}, [1, -5], [1.5], "a number <= 1"),
        ({"high": 1.0, "open_high": True}, [0.999], [1], "a number < 1"),
        ({"low": 0.0, "high": 1.0}, [0, 0.5, 1], [-0.1, 1.1], "a number in [0, 1]"),
        (
            {"low": 0.0, "high": 1.0, "open_low": True, "open_high": True},
            [0.5],
            [0, 1, -1, 2],
            "a number in (0, 1)",
        ),
        ({"low": 0.0, "high": 1.0, "open_high": True}, [0], [1], "a number in [0, 1)"),
    ],
)
def test_number_options(bounds, fine, refused, wanted) -> None:
    for value in fine:
        _Lines(size=value).check_number_options("size", **bounds)
    for value in refused:
        with pytest.raises(ConfigError) as caught:
            _Lines(size=value).check_number_options("size", **bounds)
        assert str(caught.value) == f"option size must be {wanted}, got {value!r}"


@pytest.mark.parametrize(
    ("task", "options", "message"),
    [
        ("multilabel", {"threshold": -1}, "option threshold must be a number in (0, 1), got -1"),
        ("multilabel", {"threshold": 1.5}, "option threshold must be a number in (0, 1), got 1.5"),
        (
            "target-sentiment",
            {"multi_airline": "all"},
            "option multi_airline must be 'drop' or 'first', got 'all'",
        ),
        (
            "target-sentiment",
            {"min_confidence": 2},
            "option min_confidence must be a number in [0, 1], got 2",
        ),
        ("captioning", {"expected_mix": -1}, "option expected_mix must be a number in [0, 1]"),
        ("captioning", {"reinforce_weight": -1}, "option reinforce_weight must be a number >= 0"),
        ("sentiment", {"reinforce_weight": float("nan")}, "option reinforce_weight must be"),
        ("speech", {"snr_db": float("inf")}, "option snr_db must be a finite number, got inf"),
        ("speech", {"band": "wide"}, "option band must be a number in [0, 1], got 'wide'"),
    ],
)
def test_tasks_check_their_number_and_choice_options_before_reading_data(
    task, options, message
) -> None:
    """Values that ran before (every label or none above threshold 1.5, gradient ascent on
    a negative REINFORCE weight) or failed late with a traceback (a bad multi_airline)."""
    from attnlab.lab.config import resolve_task

    with pytest.raises(ConfigError) as caught:
        resolve_task(task, options)
    assert str(caught.value).startswith(message)


def _seeded_tasks() -> list[tuple[str, str]]:
    import attnlab.lab.tasks  # noqa: F401  (registers the tasks)
    from attnlab import registry

    return [
        (e.name, option)
        for e in registry.entries("task")
        for option in sorted({**e.cls._TRAINING_DEFAULTS, **e.cls.defaults})
        if option.endswith("_seed")
    ]


@pytest.mark.parametrize(("task", "option"), _seeded_tasks())
@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_a_data_seed_option_is_an_int_of_at_least_zero(task, option, bad):
    """``split_seed=-1`` gave the splits of seed 1 (Python's random takes the absolute
    value), ``1.5`` was accepted, ``data_seed=-1`` failed in NumPy after the set-up."""
    from attnlab import registry

    cls = registry.get("task", task).cls
    with pytest.raises(ConfigError, match=rf"^option {option} must be an int >= 0, got "):
        cls(**{option: bad})
    assert cls(**{option: 3}).options[option] == 3


def test_every_task_with_a_data_seed_is_checked():
    assert {task for task, _ in _seeded_tasks()} >= {"sentiment", "pointer", "translation"}


def test_register_task_takes_task_subclasses_only(monkeypatch):
    """A class that is no Task was registered and failed only when a run built it."""
    import copy

    from attnlab import registry
    from attnlab.lab.task import register_task

    monkeypatch.setattr(registry, "_REGISTRY", copy.deepcopy(registry._REGISTRY))
    monkeypatch.setattr(registry, "_ALIASES", copy.deepcopy(registry._ALIASES))
    for thing in (int, object(), lambda: None):
        with pytest.raises(TypeError, match=r"^register_task\('mine'\) takes a Task subclass"):
            register_task("mine", formula="x", source="y")(thing)
    assert "mine" not in registry.names("task")
