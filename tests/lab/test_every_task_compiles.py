"""Every task model of the lab under ``torch.compile(fullgraph=True)`` with AOTAutograd
(``backend="aot_eager"``: the joint forward and backward graph that the default Inductor
backend compiles, run by eager kernels): one graph, and the task's loss and every
parameter's gradient on the first batches of its tiny data equal eager mode's.

It found three things, fixed: the CPU LSTM failure that
``attnlab._recurrent._in_weights_graph`` works around (the target-sentiment model's frozen
embeddings in front of its LSTM encoders); graph breaks at every ``nn.LSTM`` / ``nn.GRU``
the sentence, translation, VQA and speech models called themselves (Dynamo refuses to
trace them; they now run their weights through ``attnlab._recurrent`` when traced, as
``MaskedRNN`` does); and the speech model's check of its lengths' values under
compilation."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable

import pytest
import torch
from tiny_tasks import TASKS, tiny_task

from attnlab.lab.task import Task
from attnlab.lab.training import seed_everything


def _tiny(module: str, cls: str) -> Callable[[], Task]:
    """The task ``cls`` of ``attnlab.lab.tasks`` on the ``TINY`` options of its test module
    (tests/lab/tasks, on ``sys.path`` through ``tiny_tasks``)."""

    def make() -> Task:
        options = importlib.import_module(module).TINY
        return getattr(importlib.import_module("attnlab.lab.tasks"), cls)(**options)

    return make


BUILDERS: dict[str, Callable[[], Task]] = {
    **{name: (lambda name=name: tiny_task(name)) for name in TASKS},
    "captioning": _tiny("test_captioning", "CaptioningTask"),
    "inpainting": _tiny("test_inpainting", "InpaintingTask"),
    "speech": _tiny("test_speech_task", "SpeechTask"),
}


def _loss_and_gradients(task: Task, model, step, batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    loss = task.loss(step, batch)
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


def test_every_task_of_the_lab_is_here():
    import attnlab.lab.tasks  # noqa: F401  (registers the tasks)
    from attnlab import registry

    # the lab's own tasks (other tests register plugin tasks in the same process)
    own = {
        e.name.replace("-", "_")
        for e in registry.entries("task")
        if e.cls.__module__.startswith("attnlab.lab.tasks.")
    }
    assert len(own) == 11 and own <= set(BUILDERS), sorted(own - set(BUILDERS))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_task_model_compiles_in_one_graph_through_aot_autograd(name):
    missing = importlib.import_module("test_speech_task")._MISSING  # its own skip reasons
    if name == "speech" and missing:
        pytest.skip("; ".join(missing))
    task = BUILDERS[name]()
    seed_everything(0)
    data = task.load_data()
    # evaluation mode: no dropout (Dynamo's graph draws its own dropout masks)
    model = task.build_model(data, task.resolve_attention(None)).eval()
    compiled = copy.copy(model)  # the same parameters; compile() wraps only this copy
    compiled.compile(backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    for batch in list(task.batches(data, "train", 4))[:3]:
        want_loss, want = _loss_and_gradients(task, model, model, batch)
        got_loss, got = _loss_and_gradients(task, model, compiled, batch)
        torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
        for k in want.keys() | got.keys():
            if k not in want or k not in got:
                # an empty document reaches no weight: no gradient in eager mode, a zero
                # one on the compiled padded path
                assert (got[k] if k in got else want[k]).abs().max() == 0, k
                continue
            torch.testing.assert_close(
                got[k], want[k], atol=1e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}"
            )
