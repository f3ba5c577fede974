"""torch.compile of every path of attnlab.Attention and of the registered query / feature
modules: no graph breaks (``torch._dynamo.explain``), and the compiled module computes what
the eager one does. Break counts are found by dynamo, so the checks trace with
``backend="eager"`` (fast on a small CPU); one test compiles with inductor for real."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch._dynamo
from torch import nn

from attnlab import Attention
from tests.general.test_attention import QUERYLESS, VALID
from tests.test_checks import CASES, _inputs

B, N_Q, N_K, D = 2, 3, 5, 4

#: registered modules whose forward still breaks the graph, and why (documented in
#: docs/compile-and-precision.md): both run RNNs over packed sequences whose lengths are
#: data (dynamo also does not trace nn.LSTM / nn.GRU unless torch._dynamo.config.allow_rnn)
KNOWN_BREAKS = {
    "cdme": "packs the sequences for its RNN encoder (nonzero rows, lengths.cpu())",
    "pointer-network": "packs the sequences for its LSTM encoder; checks targets on the host",
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _breaks(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, list[str]]:
    """Graph breaks of ``fn(*args, **kwargs)`` as dynamo finds them, with where they are."""
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    where = [
        f"{r.reason.splitlines()[0][:120]} at "
        + (f"{r.user_stack[-1].filename}:{r.user_stack[-1].lineno}" if r.user_stack else "?")
        for r in explained.break_reasons
    ]
    return explained.graph_break_count, where


def _attention_case(score: str, align: str, dim: str, masked: bool, **kw: Any):
    torch.manual_seed(0)
    module = Attention(score, align, dim, d_q=D, d_k=D, **kw).eval()
    n_q = 1 if score in QUERYLESS else N_Q
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, D, generator=g) for n in (n_q, N_K, N_K))
    kwargs: dict[str, Any] = {}
    if masked:  # padding in row 0, and a query row without any allowed key in row 1
        mask = torch.ones(B, n_q, N_K, dtype=torch.bool)
        mask[0, :, 3:] = False
        mask[1, 0, :] = False
        kwargs["mask"] = mask
    return module, (None if score in QUERYLESS else q, k, v), kwargs


def _check_attention(module: nn.Module, args: tuple, kwargs: dict) -> None:
    count, where = _breaks(module, *args, **kwargs)
    assert count == 0, where
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="eager", fullgraph=True)
    torch.manual_seed(2)  # the stochastic alignments draw the same samples in both
    got = compiled(*args, **kwargs).context
    torch.manual_seed(2)
    want = module(*args, **kwargs).context
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("score,align,dim", VALID, ids="/".join)
def test_every_attention_combination_compiles_without_graph_breaks(score, align, dim):
    _check_attention(*_attention_case(score, align, dim, masked=False))


# one masked case per alignment and per path (sdpa, lean additive, lean multi, local,
# explicit): masks take the data-dependent branches (fully masked rows, NaN screens)
MASKED = [
    ("scaled-dot", "soft", "single", {}),
    ("scaled-dot", "soft", "single", {"path": "explicit"}),
    ("additive", "soft", "single", {}),
    ("additive", "soft", "multi", {}),
    ("general", "local-m", "single", {}),
    ("additive", "local-p", "single", {}),
    ("general", "sparsemax", "single", {}),
    ("additive", "entmax15", "multi", {}),
    ("cosine", "hard", "single", {}),
    ("general", "reinforced", "single", {}),
]


@pytest.mark.parametrize(
    "score,align,dim,kw", MASKED, ids=[f"{s}/{a}/{d}/{kw}" for s, a, d, kw in MASKED]
)
def test_masked_attention_compiles_without_graph_breaks(score, align, dim, kw):
    _check_attention(*_attention_case(score, align, dim, masked=True, **kw))


@pytest.mark.parametrize("score,dim", [("additive", "single"), ("additive", "multi")])
def test_explicit_path_compiles_without_graph_breaks(score, dim):
    _check_attention(*_attention_case(score, "soft", dim, masked=False, path="explicit"))


def _recorded(name: str) -> tuple[nn.Module, Any, list[torch.Tensor], Any]:
    """A module of the per-module table of tests/test_checks.py, the random inputs its call
    draws (recorded once, so that the traced call can be given them as arguments) and the
    eager result."""
    _, build, call, _ = CASES[name]
    torch.manual_seed(0)
    module = build().eval()
    base = _inputs(torch.float32)
    drawn: list[torch.Tensor] = []

    def record(*shape: int) -> torch.Tensor:
        drawn.append(base["r"](*shape))
        return drawn[-1]

    want = call(module, {**base, "r": record})

    def replay(*tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        return call(module, {**base, "r": lambda *shape: next(it)})

    return module, replay, drawn, want


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_BREAKS[n], strict=True))
        if n in KNOWN_BREAKS
        else n
        for n in sorted(CASES)
    ],
)
def test_every_query_and_feature_module_compiles_without_graph_breaks(name):
    _, replay, drawn, want = _recorded(name)
    count, where = _breaks(replay, *drawn)
    assert count == 0, where
    torch._dynamo.reset()
    got = torch.compile(replay, backend="eager", fullgraph=True)(*drawn)
    flat_got, _ = torch.utils._pytree.tree_flatten(got)
    flat_want, _ = torch.utils._pytree.tree_flatten(want)
    for g, w in zip(flat_got, flat_want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.slow
def test_inductor_compiles_additive_attention_to_the_eager_result():
    """The one real compilation (inductor): ``Attention(score="additive")`` forward and
    backward agree with eager; the compile time is printed (see the docs for the figure)."""
    torch.manual_seed(0)
    module = Attention("additive", d_q=D, d_k=D)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, n, D, generator=g, requires_grad=True) for n in (N_Q, N_K, N_K))
    start = time.perf_counter()
    got = torch.compile(module, fullgraph=True)(q, k, v).context
    print(f"torch.compile(Attention('additive')) first call: {time.perf_counter() - start:.1f} s")
    got_grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want = module(q, k, v).context
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)
