"""Every task of the lab on tiny data that needs no data package: the builders of the task
tests (tests/lab/tasks), gathered so that one test can train every task (on the CPU, and
on CUDA where there is a GPU)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from attnlab.lab.task import Task, TaskData

_TASK_TESTS = Path(__file__).resolve().parent / "tasks"
if str(_TASK_TESTS) not in sys.path:
    sys.path.insert(0, str(_TASK_TESTS))

#: The tasks with a tiny version here (captioning, inpainting and speech have theirs in their
#: test modules' ``TINY`` options).
TASKS = (
    "sentiment",
    "document",
    "target_sentiment",
    "translation",
    "vqa",
    "pointer",
    "multilabel",
    "meta_embedding",
)


def _with_data(task: Task, data: TaskData) -> Task:
    """``task`` whose ``load_data`` returns ``data`` (a subclass of its class, same name)."""
    cls = type(task)
    fixed = type(cls.__name__, (cls,), {"load_data": lambda self: data})
    return fixed(**task.options)


def translation_options(**options: Any) -> dict[str, Any]:
    """The options of the tiny generated translation task (``test_translation.TINY``, 1
    epoch), ``options`` over them: for the tests that run it by name (``train_run``,
    ``run_ablation``)."""
    return {**importlib.import_module("test_translation").TINY, "epochs": 1, **options}


def tiny_task(name: str, **options: Any) -> Task:
    """The task ``name`` on its tiny data with tiny model sizes, 1 epoch (``options`` over
    them)."""
    common = {"epochs": 1, **options}
    if name == "sentiment":
        mod = importlib.import_module("test_sentiment")
        return _with_data(mod._tiny_task(**{"batch_size": 4, **common}), mod._tiny_data())
    if name == "document":
        mod = importlib.import_module("test_document_task")
        task = mod.DocumentTask(**{**mod.TINY, "embeddings": "learned", **common})
        return _with_data(task, mod._tiny_data())
    if name == "target_sentiment":
        mod = importlib.import_module("test_target_sentiment")
        task = mod.TargetSentimentTask(**{**mod.TINY, "embeddings": "learned", **common})
        return _with_data(task, mod._tiny_data())
    if name == "translation":
        mod = importlib.import_module("test_translation")
        return mod.TranslationTask(**translation_options(**options))
    if name == "vqa":
        mod = importlib.import_module("test_vqa")
        return _with_data(mod.VQATask(**{**mod.TINY, **common}), mod._tiny_data())
    if name == "pointer":
        mod = importlib.import_module("test_pointer_task")
        return mod.PointerTask(problem="sort", n=6, min_points=4, **{**mod.TINY, **common})
    if name == "multilabel":
        mod = importlib.import_module("test_multilabel")
        return mod.GeneratedMultiLabel(**{**mod.TINY, **common})
    if name == "meta_embedding":
        mod = importlib.import_module("test_meta_embedding_task")
        return mod.GeneratedMeta(**{**mod.TINY, **common})
    raise KeyError(f"no tiny version of task {name!r}; tiny tasks: {', '.join(TASKS)}")


def forward_call(task: Task, model: Any, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments the task's loss passes to ``model`` on
    ``batch`` (its first call of the model), recorded without gradients."""
    import torch

    calls = []
    forward = model.forward

    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return forward(*args, **kwargs)

    model.forward = record
    try:
        with torch.no_grad():
            task.loss(model, batch)
    finally:
        del model.forward
    return calls[0]


def model_and_call(name: str, batch_size: int = 4) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The tiny task ``name``'s model (default attention, seed 0, evaluation mode) and the
    arguments its loss passes to it on the first test batch of ``batch_size`` examples:
    ``(model, args, kwargs)``."""
    from attnlab.lab.training import seed_everything

    task = tiny_task(name)
    seed_everything(0)
    data = task.load_data()
    model = task.build_model(data, task.resolve_attention(None)).eval()
    batch = next(iter(task.batches(data, "test", batch_size)))
    args, kwargs = forward_call(task, model, batch)
    return model, args, kwargs
