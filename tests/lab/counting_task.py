"""The toy task registered again as ``"toy-counted"``, which appends one line per training
(``<pid> <spec label> <seed>``) to the file named by its option ``count_file``, so that a
test can count how often each run of an ablation was trained, across processes. A model
counts at its first training step, not when it is built: an ablation builds every spec's
model once before any run, only to check it.

Import it only in subprocesses (``--plugin tests.lab.counting_task``): the registry that
tests/test_docs.py parametrizes over must hold attnlab's own tasks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from attnlab.lab.task import TaskData, spec_label
from tests.lab.toy_task import ToyTask, register_once

__all__ = ["CountedToyTask", "read_counts"]


class CountedToyTask(ToyTask):
    defaults: ClassVar[dict[str, Any]] = {**ToyTask.defaults, "count_file": ""}

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        model = super().build_model(data, attention)
        model.count_label = spec_label(attention)
        return model

    def loss(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        path = self.options["count_file"]
        if path and not getattr(model, "counted", False):
            model.counted = True  # torch.initial_seed(): the run's (train_run seeds torch)
            line = f"{os.getpid()} {model.count_label} {torch.initial_seed()}\n"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one small O_APPEND write: never interleaved
            finally:
                os.close(fd)
        return super().loss(model, batch)


def read_counts(path: str | os.PathLike[str]) -> dict[tuple[str, int], int]:
    """How many times each ``(spec label, seed)`` was trained, from a ``count_file``."""
    counts: dict[tuple[str, int], int] = {}
    if not os.path.exists(path):
        return counts
    with open(path, encoding="utf-8") as f:
        for line in f:
            _pid, label, seed = line.split()
            counts[(label, int(seed))] = counts.get((label, int(seed)), 0) + 1
    return counts


CountedToyTask = register_once(  # type: ignore[misc]  # the registered class
    "toy-counted",
    CountedToyTask,
    formula="the toy task, counting its trainings",
    source="generated test task of attnlab (tests/lab/counting_task.py), 2024",
)
