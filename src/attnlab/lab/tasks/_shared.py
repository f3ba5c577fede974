"""Pieces the tasks of the lab share: building a text classifier from a task's options,
the attention argument of the models that take their baselines by name, the REINFORCE
term of a sampled (hard) attention, running a model for evaluation, the predictions and
scores of a classifier, :class:`ClassifierTask`, the loss and predictions of the
tasks whose model picks one class, and :class:`SequenceTask`, the length bucketing of the
tasks whose examples are one token sequence each.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_int
from attnlab.general.alignment import reinforce_loss
from attnlab.lab.batching import token_batch
from attnlab.lab.task import AttentionExample, Task, TaskData

__all__ = [
    "ClassifierTask",
    "SequenceTask",
    "accuracy_and_f1",
    "add_reinforce",
    "check_int_list_options",
    "check_text_options",
    "evaluating",
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


def check_size_limits(task: Task, *limits: str) -> None:
    """The size limits ``max_train``, ``max_eval`` and ``limits`` of ``task``: ints ``>= 1``
    or None (no limit); ``ConfigError`` naming the option."""
    task.check_int_options("max_train", "max_eval", *limits, optional=True)


def check_int_list_options(task: Task, *names: str, minimum: int = 1) -> None:
    """Each option ``names`` a non-empty list (or tuple) of ints ``>= minimum`` (not bools,
    not floats: the layer widths ``channels`` of a CNN); ``ConfigError`` "option NAME must
    be a non-empty list of ints >= MIN, got V" (a bare ``16`` failed after the data was
    generated, ``[16.9]`` quietly became ``16``)."""
    for name in names:
        value = task.options[name]
        fine = isinstance(value, list | tuple) and len(value) > 0
        try:
            for item in value if fine else ():
                check_int(item, name, minimum)
        except ConfigError:
            fine = False
        if not fine:
            raise ConfigError(
                f"option {name} must be a non-empty list of ints >= {minimum}, got {value!r}"
            )


def check_text_options(task: Task, *limits: str) -> None:
    """The options every text classifier task checks: ``embeddings`` (``"glove"`` or
    ``"learned"``), ``embed_dim`` (an int ``>= 1``, also where GloVe's size is used instead:
    a bad value is refused, never ignored), the size limits ``max_train``, ``max_eval`` and
    ``limits`` (ints ``>= 1`` or None) and ``min_freq`` (an int); ``ConfigError`` naming the
    option."""
    task.check_option_choice("embeddings", ("glove", "learned"))
    task.check_int_options("embed_dim")
    check_size_limits(task, *limits)
    min_freq = task.options["min_freq"]
    if isinstance(min_freq, bool) or not isinstance(min_freq, int):
        raise ConfigError(f"option min_freq must be an int, got {min_freq!r}")


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


def add_reinforce(
    loss: Tensor, log_prob: Tensor | None, cost: Tensor, weight: float, model: nn.Module
) -> Tensor:
    """``loss`` plus ``weight`` times the REINFORCE term of a sampled attention: reward
    ``-cost`` ``[B]`` (each example's loss, detached), its batch mean as the baseline, and
    the log-probability ``log_prob`` ``[B]`` of the samples. Nothing is added when
    ``log_prob`` is None or no alignment of ``model`` needs REINFORCE (the straight-through
    Gumbel-softmax trains its scores through the sample: a score-function term on top
    would change the estimator)."""
    if log_prob is None or not any(getattr(m, "needs_reinforce", False) for m in model.modules()):
        return loss
    reward = -cost.detach()
    return loss + weight * reinforce_loss(log_prob, reward, reward.mean())


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode and under ``torch.no_grad`` inside; its training mode is
    restored after (also when the block raises)."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was)


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


class SequenceTask(Task):
    """A task whose examples are one token-id sequence each (``part.ids[i]``) with one
    class index (``part.labels[i]``): batches bucket and pad by the sequence's length."""

    def example_size(self, part: Any, i: int) -> int:
        return len(part.ids[i])

    def make_batch(self, data: TaskData, part: Any, idx: list[int]) -> dict[str, Tensor]:
        """The :func:`~attnlab.lab.batching.token_batch` of the examples ``idx`` (padded with
        the pad id of ``data.info["vocab"]``, 0 without one) and their ``labels`` ``[B]``."""
        pad = getattr(data.info.get("vocab"), "pad_index", None)
        batch = token_batch(part.ids, idx, pad or 0)
        return {**batch, "labels": torch.tensor([part.labels[i] for i in idx], dtype=torch.long)}


class ClassifierTask(Task):
    """A task whose model picks one class: :meth:`model_output` gives ``logits`` ``[B, C]``
    (and, for a sampled attention, ``log_prob`` ``[B]``) for the batch's ``labels`` ``[B]``.

    The loss is the cross-entropy ``CE_i = -log p(y_i | x_i)``, averaged, plus the option
    ``reinforce_weight`` times the REINFORCE term of a sampled attention (reward
    ``-CE_i``, :func:`add_reinforce`); :meth:`predict` gives the gold and arg-max classes of
    a split and :meth:`evaluate` their :meth:`scores`; :meth:`attention_examples` draws
    the first test examples with :meth:`test_example`.
    """

    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "f1")
    #: the smallest batch :meth:`predict` reads (larger batches only run faster)
    eval_batch_size: ClassVar[int] = 1

    @staticmethod
    def model_output(model: nn.Module, batch: Mapping[str, Tensor]) -> Any:
        """The model's output on one batch (with ``logits`` and, maybe, ``log_prob``)."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = self.model_output(model, batch)
        ce = F.cross_entropy(out.logits, batch["labels"], reduction="none")
        log_prob = getattr(out, "log_prob", None)
        return add_reinforce(
            ce.mean(), log_prob, ce, float(self.options["reinforce_weight"]), model
        )

    @staticmethod
    def scores(labels: np.ndarray, pred: np.ndarray, num_classes: int) -> dict[str, float]:
        """The metrics of the predictions ``pred`` of the gold ``labels``: accuracy and
        the macro F1 over all ``num_classes`` classes (:func:`accuracy_and_f1`)."""
        return accuracy_and_f1(labels, pred, range(num_classes))

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        labels, pred = self.predict(model, data, split)
        return self.scores(labels, pred, data.info["num_classes"])

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The first ``n`` test examples, each drawn by :meth:`test_example`."""
        shown = first_test_predictions(self, model, data, n, self.model_output)
        if shown is None:
            return []
        out, gold, pred = shown
        return [
            self.test_example(out, data.test, row, gold[row], pred[row]) for row in range(len(gold))
        ]

    def test_example(self, out: Any, part: Any, row: int, gold: str, pred: str) -> AttentionExample:
        """The attention map of test example ``row``: ``out`` is the model's output on the
        first test examples (``part`` the test split), ``gold`` and ``pred`` the label
        names of the example."""
        raise NotImplementedError(f"{type(self).__name__} implements no test_example")

    def predict(self, model: nn.Module, data: TaskData, split: str) -> tuple[np.ndarray, ...]:
        """``(labels, predictions)`` of one split (:func:`predict_classes`, batches of the
        option ``batch_size`` or :attr:`eval_batch_size`, whichever is larger)."""
        batch_size = max(int(self.options["batch_size"]), self.eval_batch_size)
        return predict_classes(self, model, data, split, batch_size, self.model_output)
