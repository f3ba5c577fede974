"""Mixed precision: every score x alignment x dimensionality of attnlab.Attention and every
registered query / feature module runs under ``torch.autocast("cpu", torch.bfloat16)`` with
float32 parameters and bfloat16 inputs, as ``torch.nn`` layers do: forward and backward
run, everything is finite, the output has the dtype autocast gives, and it is close to the
float32 result (tolerances documented in docs/compile-and-precision.md)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnlab import Attention
from tests.general.test_attention import VALID
from tests.test_checks import CASES, _inputs

B, N_Q, N_K, D = 2, 3, 5, 4

#: max |bf16 autocast - fp32| relative to max(1, max |fp32 output|): bfloat16 keeps 8
#: significant bits (relative rounding 2^-9 = 0.002 per op); measured errors are below 0.01
TOL = 0.03
#: stochastic alignments sample: their output is only checked for dtype and finiteness
STOCHASTIC = {"hard", "reinforced"}
#: modules whose last op autocast runs in float32 (as torch.nn would): a sum with a float32
#: parameter (type promotion), a squash / norm that autocast keeps in float32
FLOAT32_OUTPUT = {"capsule", "learned-positions"}
#: locality-sensitive hashing picks buckets by the sign of projections: bfloat16 rounding
#: moves keys across buckets, so the output is not close to the float32 one (by design)
NOT_CLOSE = {"reformer"}


def _first_tensor(out: Any) -> torch.Tensor:
    """The main output of a module: a tensor, the first of a tuple, or the first of the
    output object's ``context``, ``output``, ``log_probs``, ``logits`` fields."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return _first_tensor(out[0])
    for name in ("context", "output", "log_probs", "logits"):
        if hasattr(out, name):
            return getattr(out, name)
    raise TypeError(f"no tensor output in {type(out).__name__}")


def _assert_finite_like(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` is finite wherever the float32 result is (a pointer network's log-probability
    of a position it may not point at is ``-inf`` in both)."""
    finite = torch.isfinite(want)
    assert bool(torch.isfinite(got)[finite].all())
    assert torch.equal(got.float()[~finite], want[~finite])


def _assert_close_enough(got: torch.Tensor, want: torch.Tensor) -> None:
    finite = torch.isfinite(want)
    err = (got.float() - want)[finite].abs().max().item()
    assert err <= TOL * max(1.0, want[finite].abs().max().item()), err


def _assert_finite_grads(module: torch.nn.Module, *inputs: torch.Tensor | None) -> None:
    for name, p in module.named_parameters():
        assert p.dtype == torch.float32
        assert p.grad is None or bool(torch.isfinite(p.grad).all()), name
    for x in inputs:
        assert x is None or x.grad is None or bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("score,align,dim", VALID, ids="/".join)
def test_every_attention_combination_runs_under_cpu_bf16_autocast(score, align, dim):
    torch.manual_seed(0)
    module = Attention(score, align, dim, d_q=D, d_k=D)
    g = torch.Generator().manual_seed(1)
    n_q = 1 if score == "queryless" else N_Q
    q, k, v = (torch.randn(B, n, D, generator=g) for n in (n_q, N_K, N_K))
    want = module(None if score == "queryless" else q, k, v).context
    qb, kb, vb = (x.to(torch.bfloat16).requires_grad_() for x in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(None if score == "queryless" else qb, kb, vb)
    got = out.context
    assert got.dtype == torch.bfloat16
    assert out.weights is None or bool(torch.isfinite(out.weights).all())
    assert bool(torch.isfinite(got).all())
    got.float().square().sum().backward()
    _assert_finite_grads(module, qb if score != "queryless" else None, kb, vb)
    if align not in STOCHASTIC:
        _assert_close_enough(got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_query_and_feature_module_runs_under_cpu_bf16_autocast(name):
    _, build, call, _ = CASES[name]
    torch.manual_seed(0)
    module = build()
    want = _first_tensor(call(module, _inputs(torch.float32)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _first_tensor(call(module, _inputs(torch.bfloat16)))
    assert got.dtype == (torch.float32 if name in FLOAT32_OUTPUT else torch.bfloat16)
    _assert_finite_like(got, want)
    got.float().masked_fill(~torch.isfinite(want), 0.0).square().sum().backward()
    _assert_finite_grads(module)
    assert any(p.grad is not None for p in module.parameters())
    if name not in NOT_CLOSE:
        _assert_close_enough(got, want)
