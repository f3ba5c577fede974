"""Tests of the ``multilabel`` task (debtags + capsule classifier).

Generated data (always): every preset and baseline builds and trains a few steps, the
metrics are checked against hand-computed numbers, and a run goes end to end through
``train_run``. Real data (skipped with the loader's message when the apt lists / frozen
debtags file are missing): tiny options, every preset and baseline, and ``train_run``.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from task_harness import (
    check_bad_options,
    check_bad_specs,
    check_deterministic,
    check_metrics,
    check_train_run,
    load_or_skip,
    run_every_spec,
    run_spec,
    spec_id,
)

from attnlab._checks import ConfigError
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks.multilabel import EncodedSplit, MultiLabelTask, subsample
from attnlab.models.multilabel import MultiLabelOutput
from attnlab.registry import get

TINY = {"hidden_size": 4, "d_caps": 3, "embed_dim": 6, "glove": False, "min_freq": 1}
SPECS = [
    {},
    *({"name": name} for name in MultiLabelTask.presets),
    {"name": "mean"},
    {"name": "uniform"},
    {"score": "general", "align": "entmax15"},
    {"name": "routing", "iterations": 2},
]
LABELS = ("use::editing", "works-with::image", "implemented-in::python")
CUES = ("editor", "image", "python")


def generated_splits(seed=0):
    """Texts of filler words; label l is present iff the word CUES[l] occurs."""
    rng = np.random.default_rng(seed)
    filler = [f"w{i}" for i in range(15)]
    splits = {}
    for name, size in (("train", 48), ("dev", 16), ("test", 16)):
        texts, label_sets, ids = [], [], []
        for i in range(size):
            words = list(rng.choice(filler, size=int(rng.integers(3, 8))))
            labels = tuple(lab for lab in range(3) if rng.random() < 0.4)
            for lab in labels:
                words.insert(int(rng.integers(0, len(words) + 1)), CUES[lab])
            texts.append(" ".join(words))
            label_sets.append(labels)
            ids.append(f"{name}-{i}")
        splits[name] = (texts, label_sets, ids)
    return splits


class GeneratedMultiLabel(MultiLabelTask):
    """The task on generated data (so train_run runs without the debtags corpus)."""

    def load_data(self) -> TaskData:
        return self.prepare(generated_splits(), LABELS, vectors=None)


def check_examples(examples, data, n=4):
    assert 0 < len(examples) <= n
    for ex in examples:
        assert isinstance(ex, AttentionExample) and ex.kind == "matrix"
        assert 1 <= len(ex.rows) <= 4 and ex.cols
        assert len(ex.weights) == len(ex.rows)
        assert all(len(r) == len(ex.cols) for r in ex.weights)
        assert all(0.0 <= w <= 1.0 + 1e-6 for r in ex.weights for w in r)
        assert all(r.split(" (")[0] in data.info["label_names"] for r in ex.rows)
        AttentionExample.from_json(json.loads(json.dumps(ex.to_json())))


# ----------------------------------------------------------------------------- generated data


def test_registered():
    entry = get("task", "multilabel")
    assert entry.cls is MultiLabelTask
    assert MultiLabelTask.metrics[0] == "micro_f1"


def test_prepare_encodes_and_batches():
    task = GeneratedMultiLabel(**TINY)
    data = task.load_data()
    assert len(data.train) == 48 and data.info["num_labels"] == 3
    batch = next(task.batches(data, "train", 5))
    assert batch["tokens"].shape[0] == 5 and batch["tokens"].dtype == torch.long
    for row in range(5):
        labels = data.train.labels[row]
        assert batch["targets"][row].tolist() == [float(lab in labels) for lab in range(3)]
        k = int(batch["lengths"][row])
        assert data.info["vocab"].decode(batch["tokens"][row, :k].tolist()) == list(
            data.train.tokens[row]
        )
        assert (batch["tokens"][row, k:] == 0).all()
    sizes = [len(b["index"]) for b in task.batches(data, "dev", 5)]
    assert sizes == [5, 5, 5, 1]


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline_on_generated_data(spec):
    task = GeneratedMultiLabel(**TINY)
    data = task.load_data()
    model, metrics, examples = run_spec(task, data, spec, 16, steps=2, split="dev")
    check_metrics(metrics, MultiLabelTask.metrics)
    check_examples(examples, data)
    assert not model.training


def test_one_seed_one_model():
    task = GeneratedMultiLabel(**TINY)
    check_deterministic(task, task.load_data(), {}, 16)


class FixedModel(torch.nn.Module):
    """Returns fixed probabilities for the items of a split, in order."""

    def __init__(self, probs):
        super().__init__()
        self.probs = torch.tensor(probs)
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.seen = 0

    def forward(self, tokens, lengths):
        p = self.probs[self.seen : self.seen + len(tokens)]
        self.seen += len(tokens)
        return MultiLabelOutput(p, torch.logit(p), None, torch.zeros(len(tokens), 1, 1))


def test_metrics_against_hand_computed_numbers():
    task = MultiLabelTask(batch_size=2)
    gold = [(0,), (0, 1), (2,)]
    split = EncodedSplit((("a",),) * 3, ((2,),) * 3, tuple(gold), ("x", "y", "z"))
    data = TaskData(split, split, split, {"num_labels": 3, "label_names": LABELS})
    # predictions (p > 0.5): {0}, {0}, {1, 2}
    model = FixedModel([[0.9, 0.2, 0.1], [0.6, 0.5, 0.0], [0.1, 0.7, 0.8]])
    metrics = task.evaluate(model, data, "test")
    # per label: 0: tp 2 fp 0 fn 0 -> F1 1; 1: tp 0 fp 1 fn 1 -> 0; 2: tp 1 -> F1 1
    # micro: tp 3, fp 1, fn 1 -> P = R = 3/4 -> F1 = 0.75
    assert metrics["micro_f1"] == pytest.approx(0.75)
    assert metrics["macro_f1"] == pytest.approx(2 / 3)
    assert metrics["subset_accuracy"] == pytest.approx(1 / 3)
    assert metrics["hamming_loss"] == pytest.approx(2 / 9)


def test_bad_options_and_specs():
    check_bad_options(MultiLabelTask, {"bogus": 1}, "no option")
    task = GeneratedMultiLabel(**TINY)
    data = task.load_data()
    check_bad_specs(
        task, data, [({"name": "bogus"}, "preset"), ({"name": "mean", "score": "dot"}, "baseline")]
    )
    with pytest.raises(ConfigError):
        subsample(10, 0, 0)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_max_labels_is_checked_before_any_data_is_read(value):
    """``max_labels=0`` failed once the data was read, reported as a min_count problem;
    now the early size-limit check names the option (no data is needed)."""
    with pytest.raises(ConfigError) as caught:
        MultiLabelTask(max_labels=value)
    assert str(caught.value) == f"option max_labels must be an int >= 1 or None, got {value!r}"
    for fine in (None, 1, 20):
        assert MultiLabelTask(max_labels=fine).options["max_labels"] == fine


def test_helpers():
    pick = subsample(100, 10, 3)
    assert pick == sorted(pick) and len(set(pick)) == 10 and pick == subsample(100, 10, 3)
    assert subsample(5, None, 0) == [0, 1, 2, 3, 4]


def test_train_run_end_to_end_on_generated_data(tmp_path):
    task = GeneratedMultiLabel(**TINY)
    result, _ = check_train_run(
        task, {"name": "routing"}, tmp_path / "run", options={"epochs": 2, "batch_size": 16},
        primary="micro_f1", epochs=2, example_kind="matrix",
    )  # fmt: skip
    check_metrics(result.metrics["test"], MultiLabelTask.metrics)
    assert result.metrics["primary"] == "micro_f1"
    for name in ("run.json", "metrics.json", "history.json", "cost.json", "examples.json"):
        assert (tmp_path / "run" / name).is_file()


# ----------------------------------------------------------------------------- real data

REAL = {**TINY, "glove": True, "max_train": 64, "max_eval": 32, "min_freq": 1}


def test_real_data_every_preset_and_baseline():
    task = MultiLabelTask(**REAL)
    data = load_or_skip(task)
    assert len(data.train) == 64 and len(data.dev) == 32 and len(data.test) == 32
    assert data.info["embeddings"].shape == (len(data.info["vocab"]), 50)
    assert data.info["num_labels"] >= 10
    check = functools.partial(check_examples, data=data)
    run_every_spec(task, data, SPECS, 16, MultiLabelTask.metrics, check, steps=1, split="dev")


def test_real_data_min_count_above_every_tag_is_one_config_error():
    """No tag carried by min_count packages: the task's one-line ConfigError naming the
    option (a ValueError traceback, and an empty dataset before)."""
    task = MultiLabelTask(**{**REAL, "min_count": 10**9})
    with pytest.raises(ConfigError, match=r"^option min_count: no tag .* min_count=10+ packa"):
        load_or_skip(task)


def test_real_data_train_run(tmp_path):
    load_or_skip(MultiLabelTask(**REAL))
    result, _ = check_train_run(
        "multilabel", "mean", tmp_path / "run", options={**REAL, "epochs": 1},
        task_name="multilabel",
    )  # fmt: skip
    check_metrics(result.metrics["test"], MultiLabelTask.metrics)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("encoder", "bogus"),
        ("encoder", "bilstm"),
        ("encoder", None),
        ("loss", "bogus"),
        ("loss", "ce"),
        ("loss", 1),
        ("d_caps", 0),
        ("d_caps", -1),
        ("d_caps", 1.5),
        ("d_caps", None),
        ("iterations", 0),
        ("iterations", -1),
        ("iterations", 2.5),
        ("iterations", True),
    ],
)
def test_model_options_are_checked_before_any_data(option, value):
    """``encoder``, ``loss``, ``d_caps`` and ``iterations`` failed only when the model was
    built, after the data was read; now a one-line ConfigError naming the option at
    construction."""
    with pytest.raises(ConfigError) as caught:
        MultiLabelTask(**{option: value})
    message = str(caught.value)
    assert message.startswith(f"option {option} must be ") and "\n" not in message
    for loss in (None, "margin", "bce"):
        assert MultiLabelTask(loss=loss).options["loss"] == loss
    for encoder in ("lstm", "gru"):
        assert MultiLabelTask(encoder=encoder).options["encoder"] == encoder
    assert MultiLabelTask(d_caps=1, iterations=1).options["iterations"] == 1
