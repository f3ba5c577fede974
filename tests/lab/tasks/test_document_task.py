"""Tests of the task "document" (attnlab.lab.tasks.document).

Without data: the model for every preset and baseline on a tiny hand-made TaskData, the
metrics against hand-computed numbers, the attention examples. With data (skipped with the
loader's message otherwise): the VADER Amazon documents with GloVe, a few training steps,
and one end-to-end run of attnlab.lab.training.train_run.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
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

from attnlab._checks import ConfigError
from attnlab.data.vocab import Vocab
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks.document import DocumentData, DocumentTask, accuracy_f1
from attnlab.models.document import DocumentClassifier

SPECS = [
    *({"name": name} for name in DocumentTask.presets),
    {"name": "mean"},
    {"name": "uniform"},
    {},
    {"score": "additive", "align": "entmax15"},
    {"align": "hard"},
]
TINY = {
    "max_train": 12,
    "max_eval": 6,
    "max_sentences": 4,
    "max_words": 8,
    "hidden_size": 4,
    "batch_size": 4,
    "epochs": 1,
}


def _tiny_data() -> TaskData:
    vocab = Vocab(["good", "great", "bad", "awful", "the", "player", "."])
    docs = [
        ((("the", "player", "good"), ("great", ".")), 1),
        ((("bad",), (), ("the", "awful", "player")), 0),  # an empty sentence
        ((("good", "good"),), 1),
        ((("awful", "unseen", "."), ("the", "bad")), 0),
        ((), 1),  # an empty document
    ]

    def split(rows):
        return DocumentData(
            tokens=tuple(d for d, _ in rows),
            ids=tuple(tuple(tuple(vocab.encode(s)) for s in d) for d, _ in rows),
            labels=tuple(y for _, y in rows),
            doc_ids=tuple(f"doc-{i}" for i in range(len(rows))),
            sentence_scores=tuple(tuple(0.5 for _ in d) for d, _ in rows),
        )

    info = {
        "vocab": vocab,
        "label_names": ("negative", "positive"),
        "num_classes": 2,
        "embeddings": None,
    }
    return TaskData(split(docs), split(docs[:3]), split(docs), info)


def _check_examples(examples, data, n):
    assert len(examples) == n
    for ex, tokens in zip(examples, data.test.tokens, strict=False):
        assert isinstance(ex, AttentionExample) and ex.kind == "tokens"
        AttentionExample.from_json(json.loads(json.dumps(ex.to_json())))  # JSON-safe
        flat = [w for s in tokens for w in s]
        assert ex.cols == flat and ex.rows == ["attention"]
        extra = ex.extra
        assert extra["sentences"] == [list(s) for s in tokens]
        assert len(extra["sentence_weights"]) == len(tokens)
        assert [len(w) for w in extra["word_weights"]] == [len(s) for s in tokens]
        if flat:  # the flattened weights are b_i a_it and sum to 1
            assert math.isclose(sum(ex.weights[0]), 1.0, abs_tol=1e-4)
            for i, s in enumerate(tokens):
                start = extra["sentence_starts"][i]
                for t in range(len(s)):
                    want = extra["sentence_weights"][i] * extra["word_weights"][i][t]
                    assert math.isclose(ex.weights[0][start + t], want, abs_tol=1e-6)
        assert all(0.0 <= w <= 1.0 + 1e-6 for w in ex.weights[0])
        assert ex.label in ("negative", "positive") and ex.prediction in ("negative", "positive")


# ----------------------------------------------------------------------------- no data


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: json.dumps(s))
def test_every_preset_and_baseline_on_tiny_data(spec):
    task = DocumentTask(embeddings="learned", embed_dim=6, hidden_size=3, batch_size=2)
    data = _tiny_data()
    _, metrics, examples = run_spec(task, data, spec, 2, model_type=DocumentClassifier, n=5)
    check_metrics(metrics, ["accuracy", "f1"])
    _check_examples(examples, data, 5)


def test_one_seed_one_model():
    task = DocumentTask(embeddings="learned", embed_dim=6, hidden_size=3, batch_size=2)
    check_deterministic(task, _tiny_data(), {"name": "han"}, 2)


def test_baselines_build_the_right_model():
    task = DocumentTask(embeddings="learned", embed_dim=6, hidden_size=3)
    data = _tiny_data()
    mean = task.build_model(data, {"name": "mean"})
    assert mean.word_attention is None and mean.sentence_attention is None
    uniform = task.build_model(data, {"name": "uniform"})
    assert uniform.uniform == (True, True) and uniform.word_attention is not None
    assert task.model_attention({"name": "uniform", "align": "sparsemax"}) == {
        "score": "queryless",
        "align": "sparsemax",
        "uniform": True,
    }
    bad = [
        ({"name": "mean", "score": "dot"}, "takes no attention options"),
        ({"name": "nope"}, "no attention preset 'nope'"),
    ]
    check_bad_specs(task, data, bad)


def test_batches_pad_documents_and_sentences():
    task = DocumentTask()
    data = _tiny_data()
    batch = next(task.batches(data, "train", 5))
    assert batch["tokens"].shape == (5, 3, 3)
    assert batch["sentence_lengths"].tolist() == [2, 3, 1, 2, 0]
    assert batch["word_lengths"][1].tolist() == [1, 0, 3]
    assert batch["tokens"][1, 1].tolist() == [0, 0, 0]
    assert batch["tokens"][3, 0, 1] == data.info["vocab"].unk_index  # "unseen"
    order = [
        b["index"].tolist()
        for b in task.batches(
            data, "train", 2, shuffle=True, generator=torch.Generator().manual_seed(3)
        )
    ]
    assert sorted(i for b in order for i in b) == [0, 1, 2, 3, 4]


def test_mean_baseline_examples_show_implicit_uniform_weights():
    task = DocumentTask(embeddings="learned", embed_dim=6, hidden_size=3)
    data = _tiny_data()
    model = task.build_model(data, {"name": "mean"}).eval()
    ex = task.attention_examples(model, data, n=2)[1]
    assert ex.extra["sentence_weights"] == [0.5, 0.0, 0.5]
    assert ex.extra["word_weights"] == [[1.0], [], [1 / 3] * 3]
    assert "mean pooling" in ex.extra["note"]


def test_accuracy_f1_against_hand_computed_values():
    labels = np.array([0, 0, 1, 1, 1])
    pred = np.array([0, 1, 1, 1, 0])
    out = accuracy_f1(labels, pred, 2)
    assert out["accuracy"] == pytest.approx(3 / 5)
    # class 0: p = 1/2, r = 1/2 -> 1/2; class 1: p = 2/3, r = 2/3 -> 2/3
    assert out["f1"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    # a class never present nor predicted counts as F1 0 in the macro average
    assert accuracy_f1(np.array([1, 1]), np.array([1, 1]), 2)["f1"] == pytest.approx(0.5)
    assert all(math.isnan(v) for v in accuracy_f1(np.zeros(0), np.zeros(0), 2).values())


@pytest.mark.parametrize(
    "options, match",
    [
        ({"source": "imdb"}, "option source must be one of"),
        ({"embeddings": "word2vec"}, "option embeddings must be"),
        ({"max_words": 0}, "option max_words must be an int >= 1"),
        ({"max_train": 2.5}, "option max_train must be an int"),
        ({"nope": 1}, "has no option"),
    ],
)
def test_bad_options(options, match):
    check_bad_options(DocumentTask, options, match)


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real():
    return real_data(DocumentTask(**TINY))


def test_real_data_loads_with_the_limits(real):
    _task, data = real
    assert (len(data.train), len(data.dev), len(data.test)) == (12, 6, 6)
    for part in (data.train, data.dev, data.test):
        assert all(len(d) <= 4 for d in part.tokens)
        assert all(len(s) <= 8 for d in part.tokens for s in d)
        assert set(part.labels) <= {0, 1}
        assert all(w == w.lower() for d in part.tokens for s in d for w in s)
    vocab = data.info["vocab"]
    assert data.info["embeddings"].shape == (len(vocab), 50)
    assert data.info["coverage"] > 0.8
    # the dev/test words GloVe knows are in the vocabulary
    assert all(
        vocab.index(w) != vocab.unk_index
        for d in data.test.tokens
        for s in d
        for w in s
        if w.isalpha() and w in vocab
    )


@pytest.mark.parametrize("spec", SPECS[:7], ids=lambda s: json.dumps(s))
def test_real_data_every_preset_trains_and_evaluates(real, spec):
    task, data = real
    model, examples = run_spec_on_splits(task, data, spec, 4, ["accuracy", "f1"], n=3)
    assert not model.embedding.weight.requires_grad  # GloVe, frozen by default
    _check_examples(examples, data, 3)
    assert examples[0].extra["document_id"].startswith("amazon-")
    assert len(examples[0].extra["sentence_scores"]) == len(data.test.tokens[0])


def test_real_data_end_to_end_train_run(real, tmp_path):
    result, examples = check_train_run(
        "document", {"name": "han"}, tmp_path / "run", options=TINY, task_name="document",
        primary="accuracy", metric_names={"accuracy", "f1"},
    )  # fmt: skip
    check_metrics(result.test, ["accuracy", "f1"])  # metrics.json's test metrics are these
    assert examples and "sentence_weights" in examples[0]["extra"]


# ----------------------------------------------------------------------------- option checks


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("encoder", "bogus"),
        ("encoder", ""),
        ("encoder", None),
        ("attention_dim", "bogus"),
        ("attention_dim", 0),
        ("attention_dim", -1),
        ("attention_dim", 1.5),
        ("attention_dim", True),
    ],
)
def test_model_options_are_checked_before_any_data(option, value):
    """``encoder`` and ``attention_dim`` failed only when the model was built, after the
    data was read (``attention_dim=bogus`` as "QuerylessScore: d_w must be a positive
    int"); now a one-line ConfigError naming the option at construction."""
    with pytest.raises(ConfigError) as caught:
        DocumentTask(**{option: value})
    message = str(caught.value)
    assert message.startswith(f"option {option} must be ") and "\n" not in message
    for encoder in DocumentClassifier.encoder_names:
        assert DocumentTask(encoder=encoder).options["encoder"] == encoder
    for dim in (None, 1, 100):
        assert DocumentTask(attention_dim=dim).options["attention_dim"] == dim
