"""Every task model of the lab gives per-sample gradients under ``torch.func``
(``vmap(grad(loss))`` over ``functional_call``, as DP-SGD and influence studies take
them) equal to one backward pass per example: the value checks step aside under the
transform, the recurrent encoders run their cells' equations over the padded rows, and
the attention kernels their formula (docs/compile-and-precision.md, "torch.func")."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_tasks import TASKS, model_and_call
from torch.utils._pytree import tree_flatten, tree_unflatten

BATCH = 4


def _per_example(t: Any) -> bool:
    """Whether an argument runs along the examples (VQA's images do not: the examples'
    ``image_index`` points into them)."""
    return isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == BATCH


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("name", TASKS)
def test_task_model_per_sample_gradients(name):
    model, args, kwargs = model_and_call(name, BATCH)
    leaves, spec = tree_flatten((args, kwargs))
    per_example = [_per_example(t) for t in leaves]
    assert any(per_example)
    if name == "vqa":
        assert not _per_example(args[0]), "the images must not look like per-example inputs"
    state = {k: v.detach() for k, v in [*model.named_parameters(), *model.named_buffers()]}
    trained = [k for k, p in model.named_parameters() if p.requires_grad]

    def loss(params: dict[str, torch.Tensor], example: list[Any]) -> torch.Tensor:
        """The sum of the model's floating outputs on one example (a batch of one)."""
        it = iter(example)
        one = [next(it)[None] if pe else t for t, pe in zip(leaves, per_example, strict=True)]
        a, kw = tree_unflatten(one, spec)
        out = torch.func.functional_call(model, {**state, **params}, a, kw)
        floats = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return sum(t.float().sum() for t in floats if t.is_floating_point())

    examples = [t for t, pe in zip(leaves, per_example, strict=True) if pe]
    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(
        {k: state[k] for k in trained}, examples
    )
    for i in range(BATCH):
        model.zero_grad(set_to_none=True)
        loss(dict(model.named_parameters()), [t[i] for t in examples]).backward()
        compared = 0
        for k, p in model.named_parameters():
            if p.grad is not None:
                compared += 1
                torch.testing.assert_close(
                    grads[k][i], p.grad, atol=1e-5, rtol=1e-4,
                    msg=lambda m, k=k, i=i: f"{name}: per-sample gradient of {k}, example {i}: {m}",
                )  # fmt: skip
        assert compared, "no parameter has a gradient"
