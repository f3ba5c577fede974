"""Shared test configuration.

The tests run tiny tensors, for which PyTorch's intra-op thread pool costs more than it
saves (on a shared 2-core machine a tiny op took 10-30 ms with two threads and 0.1 ms with
one), so the whole suite runs single-threaded. Tests assert correctness, never timings.

Without a CUDA GPU the Triton kernels can only run on Triton's CPU interpreter, and Triton
reads ``TRITON_INTERPRET`` once, when it is first imported -- by whichever test imports it
first (torch.compile's tests import it too). So it is set here, before any test runs; on a
GPU machine it is left alone and the kernels run on the GPU.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def pytest_configure(config) -> None:
    torch.set_num_threads(1)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a test with one intra-op thread and restore the setting afterwards (a learning
    test that a caller runs outside this suite's single-threaded configuration)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def assert_padding_invariant(module, call, inputs, padding, values=(float("nan"), float("inf"))):
    """Padding never matters: with ``values`` (NaN, inf) written into the padded entries
    of ``inputs`` instead of zeros, ``call(module, **inputs)`` (a tensor: the outputs at
    the positions that are not padding) and the gradients of every floating input and
    parameter are exactly those with zeros there, and finite.

    ``padding`` maps an input's name to a bool tensor that broadcasts to it, True at the
    padded entries. The loss is a fixed random projection of the outputs."""

    def run(fill: float):
        args = {}
        for name, x in inputs.items():
            if name in padding:
                x = x.masked_fill(padding[name], fill)
            if x.dtype.is_floating_point:
                x = x.detach().clone().requires_grad_()
            args[name] = x
        module.zero_grad(set_to_none=True)
        out = call(module, **args)
        r = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
        (out * r).sum().backward()
        grads = {n: a.grad for n, a in args.items() if a.dtype.is_floating_point}
        grads.update({f"param {n}": p.grad for n, p in module.named_parameters()})
        return out.detach(), grads

    want, want_grads = run(0.0)
    for value in values:
        got, got_grads = run(value)
        assert torch.isfinite(got).all(), f"non-finite outputs with {value} in the padding"
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        for name, g in want_grads.items():
            h = got_grads[name]
            if g is None:
                assert h is None or not h.any(), name
                continue
            assert h is not None and torch.isfinite(h).all(), f"{name}: non-finite gradient"
            torch.testing.assert_close(h, g, rtol=0, atol=0, msg=f"{name} ({value} in padding)")


@pytest.fixture
def padding_invariant():
    """:func:`assert_padding_invariant`, for the test modules of any folder."""
    return assert_padding_invariant
