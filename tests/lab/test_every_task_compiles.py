"""Every task model of the lab under ``torch.compile`` with AOTAutograd (``backend=
"aot_eager"``: the joint forward and backward graph that the default Inductor backend
compiles, run by eager kernels): the task's loss and every parameter's gradient on the
first batches of its tiny data equal eager mode's. Found the CPU LSTM failure that
``attnlab._recurrent._in_weights_graph`` works around (the target-sentiment model's
frozen embeddings in front of its LSTM encoders)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_tasks import TASKS, tiny_task

from attnlab.lab.training import seed_everything


def _loss_and_gradients(task, model, step, batch) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(3)
    loss = task.loss(step, batch)
    loss.backward()
    return loss.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", TASKS)
def test_every_task_model_compiles_through_aot_autograd(name):
    task = tiny_task(name)
    seed_everything(0)
    data = task.load_data()
    # evaluation mode: no dropout (Dynamo's graph draws its own dropout masks)
    model = task.build_model(data, task.resolve_attention(None)).eval()
    compiled = copy.copy(model)  # the same parameters; compile() wraps only this copy
    compiled.compile(backend="aot_eager")
    torch._dynamo.reset()
    for batch in list(task.batches(data, "train", 4))[:3]:
        want_loss, want = _loss_and_gradients(task, model, model, batch)
        got_loss, got = _loss_and_gradients(task, model, compiled, batch)
        torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
        for k in want.keys() | got.keys():
            if k not in want or k not in got:
                # an empty document reaches no weight: no gradient in eager mode, a zero
                # one on the compiled padded path
                assert (got.get(k) if k in got else want[k]).abs().max() == 0, k
                continue
            torch.testing.assert_close(
                got[k], want[k], atol=1e-5, rtol=1e-4, msg=lambda m, k=k: f"{k}: {m}"
            )
