"""A tiny generated task, registered as ``"toy"``, for the tests of the lab.

STABLE: other tests (ablation, report, demo) use this task by its name ``"toy"`` and this
module path ``tests.lab.toy_task`` (``attnlab train toy --plugin tests.lab.toy_task``, or
``import tests.lab.toy_task``). Keep both, and keep the options below working.

The data: sequences of 3..``max_len`` token ids drawn from ``2..vocab_size-1``; the label
is 1 when the flag token (id 2) occurs, which about half the sequences do. The model is
:class:`attnlab.models.sentence.SentenceClassifier` with the averaged-embedding encoder
(a few hundred parameters), so a run of 5 epochs takes well under a second.

Options (all small): ``n_train`` (240), ``n_eval`` (80 for dev and for test),
``vocab_size`` (16), ``max_len`` (8), ``hidden_size`` (8), ``encoder`` (``"average"``),
``data_seed`` (0), ``dropout`` (0.0: the classifier's dropout, which draws from torch's
global random state), and two for failure tests: ``fail_after_steps`` (raise RuntimeError in
the loss after that many training steps; None = never) and ``step_sleep`` (seconds to
sleep in every training step, to make a run slow enough to kill).
Presets: ``tanh`` (default), ``dot`` (scaled dot with a learned query), ``sparsemax``;
baselines ``mean`` and ``uniform``. Metrics: ``accuracy`` (selection) and ``f1``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.models.sentence import SentenceClassifier

__all__ = ["FLAG", "ToyTask", "register_once"]

T = TypeVar("T", bound=Task)

FLAG = 2


def _make_split(n: int, vocab_size: int, max_len: int, g: torch.Generator):
    seqs, labels = [], []
    for i in range(n):
        length = int(torch.randint(3, max_len + 1, (1,), generator=g))
        seq = torch.randint(FLAG + 1, vocab_size, (length,), generator=g)
        label = i % 2
        if label:
            seq[int(torch.randint(0, length, (1,), generator=g))] = FLAG
        seqs.append(tuple(seq.tolist()))
        labels.append(label)
    perm = torch.randperm(n, generator=g).tolist()
    return [seqs[i] for i in perm], [labels[i] for i in perm]


class ToyTask(Task):
    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "f1")
    higher_is_better: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 5,
        "batch_size": 32,
        "lr": 0.02,
        "n_train": 240,
        "n_eval": 80,
        "vocab_size": 16,
        "max_len": 8,
        "hidden_size": 8,
        "encoder": "average",
        "data_seed": 0,
        "dropout": 0.0,
        "fail_after_steps": None,
        "step_sleep": 0.0,
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "queryless", "align": "soft"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tanh": {"score": "queryless", "align": "soft"},
        "dot": {"score": "scaled-dot", "align": "soft"},
        "sparsemax": {"score": "queryless", "align": "sparsemax"},
    }
    data_source = "generated (does the flag token occur?)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.steps = 0

    def load_data(self) -> TaskData:
        o = self.options
        g = torch.Generator().manual_seed(int(o["data_seed"]))
        splits = [
            _make_split(n, o["vocab_size"], o["max_len"], g)
            for n in (o["n_train"], o["n_eval"], o["n_eval"])
        ]
        return TaskData(*splits, info={"vocab_size": o["vocab_size"]})

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        spec = dict(attention)
        name = spec.pop("name", None)
        if name == "mean":
            att: Any = "mean"
        elif name == "uniform":
            att = {**self.default_attention, **spec, "uniform": True}
        else:
            att = spec
        o = self.options
        return SentenceClassifier(
            o["vocab_size"],
            2,
            embed_dim=8,
            encoder=o["encoder"],
            hidden_size=o["hidden_size"],
            dropout=float(o["dropout"]),
            attention=att,
        )

    def batches(
        self,
        data: TaskData,
        split: str,
        batch_size: int,
        *,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
    ) -> Iterator[dict[str, Tensor]]:
        seqs, labels = data.split(split)
        n = len(seqs)
        order = torch.randperm(n, generator=generator).tolist() if shuffle else range(n)
        order = list(order)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            lengths = [len(seqs[i]) for i in idx]
            tokens = torch.zeros(len(idx), max(lengths), dtype=torch.long)
            for row, i in enumerate(idx):
                tokens[row, : lengths[row]] = torch.tensor(seqs[i])
            yield {
                "tokens": tokens,
                "lengths": torch.tensor(lengths),
                "labels": torch.tensor([labels[i] for i in idx]),
            }

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        self.steps += 1
        limit = self.options["fail_after_steps"]
        if limit is not None and self.steps > limit:
            raise RuntimeError(f"toy task: failing on purpose after {limit} steps")
        if self.options["step_sleep"]:
            time.sleep(float(self.options["step_sleep"]))
        out = model(batch["tokens"], batch["lengths"])
        return F.cross_entropy(out.logits, batch["labels"])

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        device = next(model.parameters()).device
        tp = fp = fn = correct = total = 0
        for batch in self.batches(data, split, 64):
            out = model(batch["tokens"].to(device), batch["lengths"].to(device))
            pred = out.logits.argmax(-1).cpu()
            y = batch["labels"]
            correct += int((pred == y).sum())
            total += len(y)
            tp += int(((pred == 1) & (y == 1)).sum())
            fp += int(((pred == 1) & (y == 0)).sum())
            fn += int(((pred == 0) & (y == 1)).sum())
        f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
        return {"accuracy": correct / max(total, 1), "f1": f1}

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        device = next(model.parameters()).device
        seqs, labels = data.test
        batch = next(self.batches(data, "test", n))
        out = model(batch["tokens"].to(device), batch["lengths"].to(device))
        pred = out.logits.argmax(-1).tolist()
        examples = []
        for row in range(min(n, len(seqs))):
            length = len(seqs[row])
            if out.weights is None:
                weights = [1.0 / length] * length
            else:
                weights = out.weights[row, :length].float().cpu().tolist()
            examples.append(
                AttentionExample(
                    title=f"test #{row}",
                    rows=["attention"],
                    cols=[f"t{t}" for t in seqs[row]],
                    weights=[weights],
                    label=str(labels[row]),
                    prediction=str(pred[row]),
                )
            )
        return examples


def register_once(name: str, cls: type[T], **meta: Any) -> type[T]:
    """Register the task class ``cls`` as ``name`` (``meta``: register_task's formula,
    source, ...) once, also when its file is imported under a second module name (pytest
    may put tests/lab on sys.path): the class registered first under ``name`` with the
    same qualified name is returned instead of registering a copy."""
    from attnlab import registry

    existing = registry._REGISTRY.get("task", {}).get(name)
    if existing is not None and existing.cls.__qualname__ == cls.__qualname__:
        return existing.cls
    return register_task(name, **meta)(cls)


ToyTask = register_once(  # type: ignore[misc]  # the registered class
    "toy",
    ToyTask,
    formula="y = W_o sum_t a_t ReLU(W E[w_t]) (does the flag token occur?)",
    source="generated test task of attnlab (tests/lab/toy_task.py), 2024",
    cost="O(n d) per sequence",
)
