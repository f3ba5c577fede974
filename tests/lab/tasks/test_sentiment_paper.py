"""The options of the task "sentiment" that follow Jain & Wallace's code and its
``preset=paper``: digits as ``qqq``, sentence markers, one sigmoid output with the
class-weighted binary cross-entropy summed over a batch, AMSGrad without weight decay on
the attention and selection from the second epoch. Each against an independent
computation, then a tiny paper-like run trained and explained with the paper protocol,
and the SST preset's data when the CSV is present."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_sentiment import _tiny_data, _tiny_task

from attnlab._checks import ConfigError
from attnlab.lab.task import TaskData
from attnlab.lab.tasks.sentiment import (
    SentenceData,
    SentimentTask,
    balanced_pos_weight,
    mask_digits,
)
from attnlab.lab.training import load_run, train_run
from attnlab.models.sentence import SigmoidOutput

SST = Path(__file__).resolve().parents[3].parent / "shared" / "datasets" / "sst" / "sst_binary.csv"

PAPER_NEW = {
    "digits": "qqq",
    "sentence_markers": True,
    "output": "sigmoid",
    "pos_weight": "balanced",
    "loss_reduction": "sum",
    "amsgrad": True,
    "attention_weight_decay": 0.0,
    "grad_clip": 0.0,
    "select_from_epoch": 2,
}


def test_the_paper_preset_sets_them_and_the_defaults_stay():
    paper = SentimentTask(preset="paper").options
    assert {k: paper[k] for k in PAPER_NEW} == PAPER_NEW
    default = SentimentTask().options
    assert {k: default[k] for k in PAPER_NEW} == {
        "digits": None,
        "sentence_markers": False,
        "output": "softmax",
        "pos_weight": None,
        "loss_reduction": "mean",
        "amsgrad": False,
        "attention_weight_decay": None,
        "grad_clip": 5.0,
        "select_from_epoch": 1,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"digits": "zero"}, "option digits must be 'qqq' or none"),
        ({"output": "tanh"}, "option output must be 'softmax' or 'sigmoid', got 'tanh'"),
        ({"loss_reduction": "max"}, "option loss_reduction must be 'mean' or 'sum', got 'max'"),
        ({"pos_weight": -1.0}, "option pos_weight must be 'balanced', a number > 0 or none"),
        ({"pos_weight": "auto"}, "option pos_weight must be 'balanced'"),
    ],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        SentimentTask(**options)


# ----------------------------------------------------------------------------- tokens


def test_mask_digits():
    assert mask_digits(("the", "1920", "s", "21st", "x2", "two", "")) == (
        "the", "qqq", "s", "qqq", "qqq", "two", "",
    )  # fmt: skip


def _csv(tmp_path: Path, n: int = 12) -> Path:
    rows = ["text,label"]
    good = ["a great fun film of 2002", "good acting and a great plot", "fun , fun , 10/10"]
    bad = ["a dull awful film", "bad acting and a dull plot in 3 acts", "awful , dull"]
    for i in range(n):
        rows.append(f'"{good[i % 3]}",pos')
        rows.append(f'"{bad[i % 3]}",neg')
        if i % 2:  # more negatives: pos_weight = #neg / #pos > 1
            rows.append(f'"{bad[(i + 1) % 3]} again",neg')
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_digits_become_qqq_in_every_split(tmp_path):
    path = _csv(tmp_path)
    plain = SentimentTask(data="csv", path=str(path), embeddings="learned").load_data()
    qqq = SentimentTask(data="csv", path=str(path), embeddings="learned", digits="qqq")
    data = qqq.load_data()
    for split in ("train", "dev", "test"):
        a, b = plain.split(split), data.split(split)
        assert b.labels == a.labels
        for before, after in zip(a.tokens, b.tokens, strict=True):
            assert len(after) == len(before)
            for x, y in zip(before, after, strict=True):
                assert y == ("qqq" if any(c in "0123456789" for c in x) else x)
    assert "qqq" in data.info["vocab"].tokens and "2002" not in data.info["vocab"].tokens


# ----------------------------------------------------------------------------- loss


def _skewed_data() -> TaskData:
    """The tiny data with 2 positive and 5 negative training sentences."""
    base = _tiny_data()
    vocab = base.info["vocab"]
    rows = [(("good",), 1), (("bad",), 0), (("dull",), 0), (("awful", "plot"), 0)]
    rows += [(("the", "bad", "film"), 0), (("great", "fun"), 1), (("the", "plot"), 0)]
    train = SentenceData(
        tokens=tuple(t for t, _ in rows),
        ids=tuple(tuple(vocab.encode(t)) for t, _ in rows),
        labels=tuple(y for _, y in rows),
    )
    return TaskData(train, base.dev, base.test, base.info)


def test_balanced_pos_weight_by_hand():
    assert balanced_pos_weight([1, 0, 0, 0, 1, 0]) == pytest.approx(4 / 2)
    assert balanced_pos_weight(_skewed_data().train.labels) == pytest.approx(5 / 2)
    with pytest.raises(ConfigError, match="both classes"):
        balanced_pos_weight([0, 0, 0])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sigmoid_loss_is_the_class_weighted_bce(reduction):
    task = _tiny_task(output="sigmoid", pos_weight="balanced", loss_reduction=reduction)
    data = _skewed_data()
    torch.manual_seed(0)
    model = task.build_model(data, task.resolve_attention(None))
    assert isinstance(model.output, SigmoidOutput)
    batch = next(task.batches(data, "train", 7))
    loss = task.loss(model, batch)
    out = model(batch["tokens"], batch["lengths"])
    z = model.output.linear(out.pooled)[:, 0]  # the one logit, by hand
    y = batch["labels"].float()
    pos_weight = torch.tensor(5 / 2)  # 5 negatives, 2 positives
    expected = F.binary_cross_entropy_with_logits(z, y, pos_weight=pos_weight, reduction=reduction)
    torch.testing.assert_close(loss, expected)
    # the same written out: -[w y log s + (1 - y) log(1 - s)]
    s = torch.sigmoid(z)
    by_hand = -(2.5 * y * s.log() + (1 - y) * (1 - s).log())
    torch.testing.assert_close(loss, by_hand.sum() if reduction == "sum" else by_hand.mean())


def test_unweighted_sigmoid_and_weighted_softmax_losses():
    data = _skewed_data()
    batch = next(_tiny_task().batches(data, "train", 7))
    y = batch["labels"]
    plain = _tiny_task(output="sigmoid")
    torch.manual_seed(0)
    model = plain.build_model(data, plain.resolve_attention(None))
    z = model(batch["tokens"], batch["lengths"]).logits[:, 1]
    expected = F.binary_cross_entropy_with_logits(z, y.float())
    torch.testing.assert_close(plain.loss(model, batch), expected)
    weighted = _tiny_task(pos_weight=3.0)
    torch.manual_seed(0)
    model = weighted.build_model(data, weighted.resolve_attention(None))
    logits = model(batch["tokens"], batch["lengths"]).logits
    ce = F.cross_entropy(logits, y, reduction="none")
    expected = (ce * torch.where(y == 1, 3.0, 1.0)).mean()
    torch.testing.assert_close(weighted.loss(model, batch), expected)
    default = _tiny_task()  # today's loss: the mean cross-entropy
    torch.testing.assert_close(default.loss(model, batch), F.cross_entropy(logits, y))


def test_binary_options_refuse_more_classes():
    data = _tiny_data()
    data.info["num_classes"] = 3
    for options in ({"output": "sigmoid"}, {"pos_weight": 2.0}):
        task = _tiny_task(**options)
        with pytest.raises(ConfigError, match="need binary data, got 3 classes"):
            task.build_model(data, task.resolve_attention(None))


def test_the_loss_needs_the_built_weight():
    task = _tiny_task(output="sigmoid", pos_weight="balanced")
    other = _tiny_task(output="sigmoid")
    data = _tiny_data()
    model = other.build_model(data, other.resolve_attention(None))
    with pytest.raises(RuntimeError, match="set by build_model"):
        task.loss(model, next(task.batches(data, "train", 4)))


def test_class_weights_are_the_positive_weight_on_the_positive_examples():
    """What Wiegreffe & Pinter's adversarial models weigh their loss by: #neg / #pos on the
    positive examples (5 / 2 on the skewed data), 1 on the others; all ones without
    pos_weight; refused before build_model fixed the weight."""
    labels = torch.tensor([1, 0, 1, 0, 0])
    task = _tiny_task(output="sigmoid", pos_weight="balanced")
    with pytest.raises(RuntimeError, match="set by build_model"):
        task.class_weights(labels)
    task.build_model(_skewed_data(), task.resolve_attention(None))
    assert task.class_weights(labels).tolist() == [2.5, 1.0, 2.5, 1.0, 1.0]
    plain = _tiny_task()
    plain.build_model(_skewed_data(), plain.resolve_attention(None))
    assert plain.class_weights(labels).tolist() == [1.0] * 5


# ----------------------------------------------------------------------------- end to end


def test_a_paper_like_run_trains_and_explains(tmp_path):
    """``preset=paper`` with every new option, on a small CSV (learned embeddings, tiny
    sizes), trained, reloaded, and explained with the paper protocol."""
    from attnlab.lab.studies.explanation import explain_run

    options = {
        "preset": "paper",
        "data": "csv",
        "path": str(_csv(tmp_path)),
        "length_filter": None,
        "embeddings": "learned",
        "embed_dim": 6,
        "hidden_size": 4,
        "epochs": 3,
        "batch_size": 8,
    }
    result = train_run("sentiment", "tanh", options=options, out_dir=tmp_path / "r", progress=False)
    assert result.metrics["best_epoch"] >= 2  # the first epoch is never kept
    assert all(math.isfinite(h["train_loss"]) for h in result.history)
    task, data, model = load_run(result.run_dir)
    assert task.options["output"] == "sigmoid" and model.markers is not None
    assert isinstance(model.output, SigmoidOutput)
    assert any("qqq" in t for t in data.train.tokens)
    with torch.no_grad():
        again = task.evaluate(model, data, "test")
    assert again["accuracy"] == result.metrics["test"]["accuracy"]
    r = explain_run(
        result.run_dir,
        protocol="paper",
        permutations=3,
        adversarial_steps=3,
        lambdas=(1.0,),
        mlp_epochs=1,
        adversarial_epochs=2,
        progress=False,
        plots=False,
    )
    n_test = len(data.test)
    assert r["instances"] == r["test_split_size"] == n_test
    assert set(r["kendall"]) == {"attention-gradient", "attention-loo", "gradient-loo"}
    assert all(0 < v["n"] <= n_test for v in r["kendall"].values())
    assert len(r["permutation"]["per_instance"]) == sum(len(t) >= 2 for t in data.test.tokens)
    assert len(r["adversarial"]["per_instance"]) == n_test
    assert all(0.0 <= v <= math.log(2) + 1e-6 for v in r["adversarial"]["per_instance"])
    assert [m["lambda"] for m in r["adversarial_models"]] == [1.0]
    assert 0.0 <= r["frozen_weights"]["transferred"]["accuracy"] <= 1.0


# ----------------------------------------------------------------------------- SST


def test_sst_paper_preset_data():
    if not SST.is_file():
        pytest.skip("reference data for maintainers is absent (the SST binary CSV)")
    task = SentimentTask(preset="paper", path=str(SST), embeddings="learned")
    data = task.load_data()
    # Jain & Wallace's filtered splits are unchanged by the digit mapping
    assert (len(data.train), len(data.test)) == (6355, 1725)
    tokens = [t for part in (data.train, data.dev, data.test) for s in part.tokens for t in s]
    assert "qqq" in tokens and not any(c.isdigit() for t in tokens for c in t)
    pos = sum(data.train.labels)
    torch.manual_seed(0)
    task.build_model(data, task.resolve_attention(None))
    assert task._pos_weight == pytest.approx((len(data.train) - pos) / pos)
