"""What the tasks share (attnlab.lab.tasks._shared): the text classifier's arguments, the
attention argument of models that take baselines by name, the REINFORCE term and the
classification predictions and scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.data.vocab import Vocab
from attnlab.general.alignment import reinforce_loss
from attnlab.lab.task import AttentionExample, TaskData
from attnlab.lab.tasks._shared import (
    ClassifierTask,
    accuracy_and_f1,
    add_reinforce,
    check_int_list_options,
    check_text_options,
    evaluating,
    first_test_batch,
    first_test_predictions,
    limited_splits,
    named_attention,
    predict_classes,
    sentence_example,
    text_classifier_kwargs,
)
from attnlab.lab.tasks.multilabel import MultiLabelTask
from attnlab.lab.tasks.sentiment import SentenceData, SentimentTask


def _data(embeddings=None) -> TaskData:
    vocab = Vocab(["a", "b", "c"])
    part = SentenceData(
        tokens=(("a",), ("b", "c"), ("c",)), ids=((2,), (3, 4), (4,)), labels=(0, 1, 1)
    )
    info = {"vocab": vocab, "num_classes": 2, "embeddings": embeddings, "label_names": ("n", "p")}
    return TaskData(part, part, part, info)


def _mean_model() -> tuple[SentimentTask, TaskData, torch.nn.Module]:
    """(an averaging sentiment task, :func:`_data`, its mean-pooling model in eval mode)."""
    task = SentimentTask(embeddings="learned", embed_dim=4, hidden_size=2, encoder="average")
    data = _data()
    return task, data, task.build_model(data, {"name": "mean"}).eval()


def _forward(m, batch):
    """The forward of a sentence classifier on a batch (what the task helpers call)."""
    return m(batch["tokens"], batch["lengths"])


def test_text_classifier_kwargs_learned_or_pretrained():
    task = SentimentTask(embeddings="learned", embed_dim=6, hidden_size=4, dropout=0.1)
    kwargs = text_classifier_kwargs(task, _data(), "tanh")
    assert kwargs["vocab_size"] == len(_data().info["vocab"]) and kwargs["embed_dim"] == 6
    assert kwargs["hidden_size"] == 4 and kwargs["dropout"] == 0.1
    assert kwargs["attention"] == "tanh" and kwargs["num_classes"] == 2
    assert "embeddings" not in kwargs
    matrix = np.zeros((5, 3), dtype=np.float32)
    kwargs = text_classifier_kwargs(task, _data(matrix), {})
    assert kwargs["embeddings"] is matrix and "vocab_size" not in kwargs


def test_named_attention():
    task = MultiLabelTask()
    assert named_attention(task, None) == dict(task.default_attention)
    assert named_attention(task, {"name": "mean"}) == "mean"
    preset = next(iter(task.presets))
    assert named_attention(task, {"name": preset, "x": 1}) == {**task.presets[preset], "x": 1}
    assert named_attention(task, {"score": "dot"}) == {"score": "dot"}
    with pytest.raises(ConfigError, match="the baseline 'uniform' takes no options"):
        named_attention(task, {"name": "uniform", "align": "soft"})
    with pytest.raises(ConfigError, match="task 'multilabel' has no attention preset 'nope'"):
        named_attention(task, {"name": "nope"})


def test_add_reinforce():
    """The REINFORCE term is added where an alignment trains its scores through it (hard
    attention with REINFORCE, reinforced selection), not for the straight-through
    Gumbel-softmax, whose sample carries the gradient (a score-function term on top
    changed its estimator), nor for a model without a stochastic alignment."""
    from torch import nn

    from attnlab.general.alignment import HardAlign, ReinforcedAlign

    loss = torch.tensor(2.0)
    cost = torch.tensor([1.0, 3.0])
    log_prob = torch.tensor([-0.5, -1.5], requires_grad=True)
    reward = -cost
    want = loss + 0.5 * reinforce_loss(log_prob, reward, reward.mean())
    for align in (HardAlign(), ReinforcedAlign(d_k=2)):
        model = nn.Sequential(nn.Linear(2, 2), align)
        assert add_reinforce(loss, None, cost, 0.5, model) is loss
        torch.testing.assert_close(add_reinforce(loss, log_prob, cost, 0.5, model), want)
    for model in (nn.Sequential(nn.Linear(2, 2), HardAlign(estimator="gumbel")), nn.Linear(2, 2)):
        assert add_reinforce(loss, log_prob, cost, 0.5, model) is loss


def test_predictions_scores_and_examples():
    task, data, model = _mean_model()
    labels, pred = predict_classes(task, model, data, "test", 2, _forward)
    assert labels.tolist() == [0, 1, 1] and pred.dtype == labels.dtype == np.int64
    assert len(pred) == 3
    batch = first_test_batch(task, model, data, 2)
    assert batch["tokens"].shape[0] == 2 and batch["index"].tolist() == [0, 1]
    scores = accuracy_and_f1([0, 1, 1, 0], [0, 1, 0, 0], range(2))
    assert scores["accuracy"] == pytest.approx(0.75)
    assert scores["f1"] == pytest.approx((0.8 + 2 / 3) / 2)
    assert set(accuracy_and_f1([], [], None, "f1_macro")) == {"accuracy", "f1_macro"}
    ex = sentence_example("t", ["a", "b"], [0.25, 0.75], "n", "p", {"note": "x"})
    assert ex == AttentionExample("t", ["attention"], ["a", "b"], [[0.25, 0.75]], "n", "p",
                                  kind="tokens", extra={"note": "x"})  # fmt: skip


def test_limited_splits():
    rows = {"train": list(range(10)), "dev": list(range(5)), "test": list(range(6))}
    everything = SentimentTask()
    assert limited_splits(everything, rows.__getitem__) == (
        rows["train"],
        rows["dev"],
        rows["test"],
    )
    task = SentimentTask(max_train=4, max_eval=2, split_seed=3)
    train, dev, test = limited_splits(task, rows.__getitem__)
    assert len(train) == 4 and train == sorted(train) and set(train) <= set(rows["train"])
    assert (train, dev, test) == limited_splits(task, rows.__getitem__)  # seeded
    assert dev == [0, 1] and test == [0, 1]


def test_first_test_predictions():
    task, data, model = _mean_model()
    out, gold, pred = first_test_predictions(task, model, data, 5, _forward)  # cut to 3
    assert gold == ["n", "p", "p"] and len(pred) == 3 and set(pred) <= {"n", "p"}
    assert out.logits.shape == (3, 2)
    assert first_test_predictions(task, model, data, 0, _forward) is None


def test_evaluating_restores_the_mode_even_on_error():
    model = torch.nn.Linear(2, 2)
    with evaluating(model) as inner:
        assert inner is model and not model.training and not torch.is_grad_enabled()
    assert model.training and torch.is_grad_enabled()
    with pytest.raises(RuntimeError, match="boom"), evaluating(model):
        raise RuntimeError("boom")
    assert model.training
    model.eval()
    with evaluating(model):
        pass
    assert not model.training


def test_check_text_options():
    task = SentimentTask(max_len=None, min_freq=1)
    check_text_options(task, "max_len")
    for options, match in (
        (
            {"embeddings": "word2vec"},
            "option embeddings must be 'glove' or 'learned', got 'word2vec'",
        ),
        ({"max_eval": 0}, "option max_eval must be an int >= 1 or None, got 0"),
        ({"min_freq": 1.5}, "option min_freq must be an int, got 1.5"),
        # GloVe sets the size: a bad embed_dim is refused all the same, never ignored
        ({"embed_dim": -3}, r"^option embed_dim must be an int >= 1, got -3$"),
        ({"embed_dim": 0, "embeddings": "learned"}, "option embed_dim must be an int >= 1"),
    ):
        task.options.update(
            {"embeddings": "glove", "max_eval": None, "min_freq": 1, "embed_dim": 50, **options}
        )
        with pytest.raises(ConfigError, match=match):
            check_text_options(task, "max_len")


def test_check_int_list_options():
    task = SentimentTask()
    for fine in ([16], (8, 16), [np.int64(4)]):
        task.options["widths"] = fine
        check_int_list_options(task, "widths")
    for bad in (16, [], (), [16.9], [16.0], [True], [0], [8, -1], "16", [None], None):
        task.options["widths"] = bad
        with pytest.raises(ConfigError) as caught:
            check_int_list_options(task, "widths")
        assert str(caught.value) == (
            f"option widths must be a non-empty list of ints >= 1, got {bad!r}"
        )
    task.options["widths"] = [0, 2]
    check_int_list_options(task, "widths", minimum=0)


def test_classifier_task_defaults():
    assert ClassifierTask.metrics == ("accuracy", "f1") and ClassifierTask.eval_batch_size == 1
    scores = ClassifierTask.scores(np.array([0, 1, 1]), np.array([0, 1, 0]), 3)
    assert scores == accuracy_and_f1([0, 1, 1], [0, 1, 0], range(3))
