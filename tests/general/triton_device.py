"""Where the Triton kernel tests run, decided once for test_flash_additive.py and
test_local_triton.py: import this module before anything imports triton.

Triton reads ``TRITON_INTERPRET`` when it is first imported (and when the kernels are
built), so it is set here -- only where there is no CUDA device: on a GPU machine the
kernel tests run on the GPU (and the rest of the suite, collected in the same process,
keeps compiled Triton for torch.compile and FlexAttention); ``TRITON_INTERPRET=1`` there
forces the interpreter. ``DEVICE`` is ``"cpu"`` under the interpreter, else ``"cuda"``.
Importing this module skips the importing test module, with the reason, where the
kernels cannot run: triton missing, no GPU without the interpreter, or triton imported
earlier in the process without the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first built

from attnlab.general.flash_additive import (
    TRITON_INSTALL,
    triton_interpreting,
    triton_unavailable_reason,
)

pytest.importorskip("triton", reason=f"the Triton kernels need triton: {TRITON_INSTALL}")

if triton_interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "TRITON_INTERPRET is off and there is no CUDA GPU to run the kernels on",
        allow_module_level=True,
    )
_REASON = triton_unavailable_reason(DEVICE)  # e.g. triton imported before the variable
if _REASON is not None:
    pytest.skip(_REASON, allow_module_level=True)


def check_compiled_matches_eager(
    attn: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    mask: torch.Tensor,
    path: str,
    params: bool = False,
    tol: float = 1e-5,
) -> None:
    """``torch.compile(attn, fullgraph=True)`` on ``path``: one graph and no break (the
    kernels are custom operators, so dynamo traces no launch code), and the context and the
    gradients of the inputs (and of the parameters with ``params``) equal to eager, to
    ``tol`` (absolute and relative)."""
    explained = torch._dynamo.explain(attn)(*inputs, mask=mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    torch._dynamo.reset()
    compiled = torch.compile(attn, fullgraph=True)
    results = []
    for fn in (compiled, attn):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = fn(*leaves, mask=mask)
        assert out.path == path
        wrt = [*leaves, *attn.parameters()] if params else leaves
        results.append((out.context, *torch.autograd.grad(out.context.square().sum(), wrt)))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def check_eager_front_matches_op(
    run: Callable[[Any], tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]],
    front: Any,
    op: Any,
    tol: float = 1e-6,
) -> None:
    """The eager front of a custom operator (``_autograd_op`` in
    attnlab.general.flash_additive) against the operator itself: ``run(call)`` calls one
    of them on fresh leaves and returns ``(output, second output, the leaves)``. The front
    does not dispatch through the operator (its node is the plain Function's), both
    outputs are equal exactly and every gradient to ``tol``."""
    results = []
    for call in (front, op):
        out, aux, leaves = run(call)
        weights = torch.linspace(-1, 1, out.shape[-1], device=out.device)
        grads = torch.autograd.grad((out * weights).sum(), leaves)
        results.append((type(out.grad_fn).__name__, out, aux, grads))
    (eager_node, *eager), (op_node, *through_op) = results
    assert eager_node == "EagerBackward" and "attnlab" in op_node.lower()
    torch.testing.assert_close(eager[0], through_op[0], rtol=0, atol=0)
    torch.testing.assert_close(eager[1], through_op[1], rtol=0, atol=0)
    for g_eager, g_op in zip(eager[2], through_op[2], strict=True):
        torch.testing.assert_close(g_eager, g_op, rtol=tol, atol=tol)
