"""Every task model of the lab exports with ``torch.export.export`` (how a trained model
is handed to a deployment runtime): the program, traced on a test batch of the task's own
loss call, returns the model's output type with the eager values. The value checks that
read the host (ids in range, lengths within the padding) are skipped in the trace, as under
``torch.compile``, and the recurrent encoders run over the padded rows there."""

from __future__ import annotations

import pytest
import torch
from attention_harness import onnx_session
from tiny_tasks import TASKS, model_and_call
from torch.utils._pytree import tree_flatten


# nn.LSTM re-reads its flat weights when export swaps the parameters (PyTorch's own doing)
@pytest.mark.filterwarnings("ignore:The tensor attributes .* were assigned during export")
@pytest.mark.parametrize(
    "name",
    TASKS,
)
def test_task_model_exports(name):
    model, args, kwargs = model_and_call(name)
    program = torch.export.export(model, args, kwargs, strict=False)
    with torch.no_grad():
        got, want = program.module()(*args, **kwargs), model(*args, **kwargs)
    assert type(got) is type(want)
    flat_got, spec_got = tree_flatten(got)
    flat_want, spec_want = tree_flatten(want)
    assert spec_got == spec_want
    assert any(isinstance(w, torch.Tensor) for w in flat_want)
    for g, w in zip(flat_got, flat_want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The tensor attributes .* were assigned during export")
@pytest.mark.parametrize("name", TASKS)
def test_task_model_exports_to_onnx(name):
    """``torch.onnx.export(..., dynamo=True)`` of every task model on its test batch, run in
    ONNX Runtime: every tensor of the output, in order, with the eager values (fp32,
    ``atol = rtol = 1e-4``). Needs the ``onnx`` extra."""
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript ('.[onnx]')")
    pytest.importorskip("onnxruntime", reason="the graph runs in onnxruntime ('.[onnx]')")
    model, args, kwargs = model_and_call(name)
    session = onnx_session(model, args, kwargs)
    feeds = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    names = [i.name for i in session.get_inputs()]
    assert len(names) == len(feeds), f"the ONNX graph takes {names}"
    got = session.run(None, {k: t.numpy() for k, t in zip(names, feeds, strict=True)})
    with torch.no_grad():
        out = model(*args, **kwargs)
    want = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-4, rtol=1e-4, equal_nan=True)
