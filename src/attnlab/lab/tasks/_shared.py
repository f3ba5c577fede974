"""Pieces the tasks of the lab share: building a text classifier from a task's options,
the attention argument of the models that take their baselines by name, the REINFORCE
term of a sampled (hard) attention, and the predictions and scores of a classifier.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.general.alignment import reinforce_loss
from attnlab.lab.task import AttentionExample, Task, TaskData

__all__ = [
    "accuracy_and_f1",
    "add_reinforce",
    "first_test_batch",
    "first_test_predictions",
    "limited_splits",
    "named_attention",
    "predict_classes",
    "sentence_example",
    "text_classifier_kwargs",
]


def text_classifier_kwargs(task: Task, data: TaskData, attention: Any) -> dict[str, Any]:
    """The keyword arguments of a text classifier (sentence, document, target) from the
    options of ``task`` (``freeze_embeddings``, ``encoder``, ``hidden_size``, ``dropout``,
    ``embed_dim``) and ``data.info`` (``num_classes``, ``vocab``, ``embeddings``): the
    pretrained matrix when the data has one, else a learned table of ``embed_dim``
    columns. ``attention`` is the model's attention argument."""
    o = task.options
    vocab = data.info["vocab"]
    kwargs: dict[str, Any] = {
        "num_classes": data.info["num_classes"],
        "padding_idx": vocab.pad_index,
        "freeze_embeddings": bool(o["freeze_embeddings"]),
        "encoder": o["encoder"],
        "hidden_size": int(o["hidden_size"]),
        "dropout": float(o["dropout"]),
        "attention": attention,
    }
    if data.info.get("embeddings") is not None:
        kwargs["embeddings"] = data.info["embeddings"]
    else:
        kwargs["vocab_size"] = len(vocab)
        kwargs["embed_dim"] = int(o["embed_dim"])
    return kwargs


def named_attention(task: Task, attention: Mapping[str, Any] | None) -> Any:
    """The attention argument of a model that takes its baselines by name: ``"mean"`` or
    ``"uniform"`` (no options), a preset of ``task`` updated by the other keys, or the spec
    itself (the task's default attention when empty)."""
    spec = dict(attention or task.default_attention)
    name = spec.pop("name", None)
    if name in ("mean", "uniform"):
        if spec:
            raise ConfigError(f"the baseline {name!r} takes no options, got {sorted(spec)}")
        return name
    if name is None:
        return spec or dict(task.default_attention)
    if name not in task.presets:
        raise ConfigError(
            f"task {task.registry_name!r} has no attention preset {name!r}; presets: "
            f"{', '.join(sorted(task.presets))}, baselines: mean, uniform"
        )
    return {**task.presets[name], **spec}


def add_reinforce(loss: Tensor, log_prob: Tensor | None, cost: Tensor, weight: float) -> Tensor:
    """``loss`` plus ``weight`` times the REINFORCE term of a sampled attention: reward
    ``-cost`` ``[B]`` (each example's loss, detached), its batch mean as the baseline, and
    the log-probability ``log_prob`` ``[B]`` of the samples (nothing to add when None)."""
    if log_prob is None:
        return loss
    reward = -cost.detach()
    return loss + weight * reinforce_loss(log_prob, reward, reward.mean())


def predict_classes(
    task: Task,
    model: nn.Module,
    data: TaskData,
    split: str,
    batch_size: int,
    forward: Callable[[nn.Module, Mapping[str, Tensor]], Any],
) -> tuple[np.ndarray, np.ndarray]:
    """(the gold ``labels``, the arg-max predictions of ``forward(model, batch).logits``)
    of one split, int64 arrays; the batches go to the model's device, under no_grad."""
    device = next(model.parameters()).device
    preds, labels = [], []
    with torch.no_grad():
        for batch in task.batches(data, split, batch_size):
            batch = {k: v.to(device) for k, v in batch.items()}
            preds.append(forward(model, batch).logits.argmax(-1).cpu())
            labels.append(batch["labels"].cpu())
    if not labels:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return torch.cat(labels).numpy(), torch.cat(preds).numpy()


def first_test_batch(task: Task, model: nn.Module, data: TaskData, n: int) -> dict[str, Any]:
    """The batch of the first ``n`` test examples (``n >= 1``), on the model's device:
    what :meth:`Task.attention_examples` shows."""
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in next(task.batches(data, "test", n)).items()}


def first_test_predictions(
    task: Task,
    model: nn.Module,
    data: TaskData,
    n: int,
    forward: Callable[[nn.Module, Mapping[str, Tensor]], Any],
) -> tuple[Any, list[str], list[str]] | None:
    """``forward(model, batch)`` on the first ``n`` test examples (fewer if the split is
    smaller) under no_grad, with their gold and predicted label names (``data.info``'s
    ``label_names``); None when there is no example to show."""
    n = min(n, len(data.test))
    if n <= 0:
        return None
    batch = first_test_batch(task, model, data, n)
    with torch.no_grad():
        out = forward(model, batch)
    names = data.info["label_names"]
    gold = [names[data.test.labels[row]] for row in range(n)]
    pred = [names[p] for p in out.logits.argmax(-1).tolist()]
    return out, gold, pred


def accuracy_and_f1(
    labels: Any, pred: Any, classes: Iterable[int] | None, f1_name: str = "f1"
) -> dict[str, float]:
    """Accuracy and macro F1 (scikit-learn, ``zero_division=0``) over ``classes`` (None:
    the classes present among the labels); NaN for an empty split."""
    from sklearn.metrics import accuracy_score, f1_score

    labels = np.asarray(labels, dtype=np.int64)
    pred = np.asarray(pred, dtype=np.int64)
    if len(labels) == 0:
        return {"accuracy": float("nan"), f1_name: float("nan")}
    f1_labels = np.unique(labels) if classes is None else list(classes)
    return {
        "accuracy": float(accuracy_score(labels, pred)),
        f1_name: float(f1_score(labels, pred, average="macro", labels=f1_labels, zero_division=0)),
    }


def sentence_example(
    title: str,
    tokens: list[str],
    weights: list[float],
    label: str,
    prediction: str,
    extra: dict[str, Any],
) -> AttentionExample:
    """A pooling attention over one token sequence as the report draws it: one row of
    ``weights`` over ``tokens`` (kind ``"tokens"``), with the gold ``label`` and the
    ``prediction`` as text."""
    return AttentionExample(
        title=title,
        rows=["attention"],
        cols=tokens,
        weights=[weights],
        label=label,
        prediction=prediction,
        kind="tokens",
        extra=extra,
    )


def limited_splits(task: Task, read: Callable[[str], list[Any]]) -> tuple[list, list, list]:
    """The rows ``read(split)`` of train, dev and test within the options ``max_train`` (a
    subsample seeded by ``split_seed``, in the original order) and ``max_eval`` (the first
    rows of dev and of test); None means all."""
    o = task.options
    train = read("train")
    if o["max_train"] is not None and len(train) > o["max_train"]:
        keep = sorted(random.Random(o["split_seed"]).sample(range(len(train)), o["max_train"]))
        train = [train[i] for i in keep]
    dev, test = read("dev"), read("test")
    if o["max_eval"] is not None:
        dev, test = dev[: o["max_eval"]], test[: o["max_eval"]]
    return train, dev, test
