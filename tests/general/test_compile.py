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

from attnlab import CDME, Attention, HierarchicalAttention, MultiHeadAttention, PointerNetwork
from attnlab._checks import compiled_steps
from tests.general.test_attention import QUERYLESS, VALID
from tests.test_checks import CASES, _inputs
from tests.test_invariances import MECHANISMS

B, N_Q, N_K, D = 2, 3, 5, 4


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

    torch.manual_seed(1)  # the same random state as the compiled call (LSH rotations)
    want = call(module, {**base, "r": record})

    def replay(*tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        return call(module, {**base, "r": lambda *shape: next(it)})

    return module, replay, drawn, want


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_query_and_feature_module_compiles_without_graph_breaks(name):
    _, replay, drawn, want = _recorded(name)
    count, where = _breaks(replay, *drawn)
    assert count == 0, where
    torch._dynamo.reset()
    torch.manual_seed(1)
    got = torch.compile(replay, backend="eager", fullgraph=True)(*drawn)
    # the outputs are pytree nodes (attnlab.output.output_pytree): every tensor is compared
    flat_got, spec_got = torch.utils._pytree.tree_flatten(got)
    flat_want, spec_want = torch.utils._pytree.tree_flatten(want)
    assert spec_got == spec_want
    assert any(isinstance(w, torch.Tensor) for w in flat_want)
    for g, w in zip(flat_got, flat_want, strict=True):
        if isinstance(w, torch.Tensor):
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert g == w


def _same_forward_and_backward(fn: Any, *inputs: torch.Tensor, params: list) -> None:
    """``fn`` traces without graph breaks, and compiled it gives the eager output and the
    eager gradients of every input and parameter (padding included: rows of different
    lengths take the data-dependent branches)."""
    count, where = _breaks(fn, *inputs)
    assert count == 0, where
    torch._dynamo.reset()
    leaves = [*inputs, *params]
    want = fn(*inputs)
    want_grads = torch.autograd.grad(want.square().sum(), leaves)
    got = torch.compile(fn, backend="eager", fullgraph=True)(*inputs)
    got_grads = torch.autograd.grad(got.square().sum(), leaves)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("encoder", ["bigru", "gru", "bilstm", "lstm"])
def test_hierarchical_attention_with_an_rnn_encoder_compiles(encoder):
    """The MaskedRNN encoders (HAN's BiGRU) run their weights on the padded rows under
    torch.compile; an empty sentence and a short one exercise the lengths."""
    torch.manual_seed(0)
    module = HierarchicalAttention(D, encoder=encoder, encoder_hidden=3)
    x = torch.randn(B, 3, N_K, D, requires_grad=True)
    mask = torch.ones(B, 3, N_K, dtype=torch.bool)
    mask[0, 1, 2:] = False
    mask[1, 2] = False
    _same_forward_and_backward(
        lambda x: module(x, mask=mask).context, x, params=list(module.parameters())
    )


def test_cdme_with_a_token_mask_compiles():
    torch.manual_seed(0)
    module = CDME([D, 6], 4)
    a, b = torch.randn(B, N_K, D, requires_grad=True), torch.randn(B, N_K, 6)
    mask = torch.tensor([[True] * N_K, [True, True, False, False, False]])
    _same_forward_and_backward(
        lambda a: module([a, b], mask=mask).context, a, params=list(module.parameters())
    )


@pytest.mark.parametrize("layers", [1, 2])
def test_pointer_network_training_step_compiles(layers):
    """Teacher forcing (the training pass) on rows of different lengths: the encoder runs
    step by step under torch.compile, so the decoder starts from each row's own final
    state, as with the packed encoder of eager mode."""
    torch.manual_seed(0)
    module = PointerNetwork(D, 6, num_layers=layers, eos=True).train()
    x = torch.randn(B, N_K, D, requires_grad=True)
    lengths = torch.tensor([N_K, 2])
    targets = torch.tensor([[4, 0, 3, 1, 2, N_K], [1, 0, N_K, -1, -1, -1]])
    _same_forward_and_backward(
        lambda x: module.loss(x, targets, lengths=lengths, reduction="sum"),
        x,
        params=list(module.parameters()),
    )


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


#: the mechanisms that compile one graph per sequence length rounded up to a power of two
#: (``attnlab._checks.compiled_steps``: their loops over the sequence, unrolled, run that
#: many steps), and why they unroll (every other one of tests/test_invariances.py compiles
#: one graph for every batch size and length)
PER_POWER_OF_TWO = {
    **{
        name: "the CRF's forward-backward recursions step over the keys in Python"
        for name in sorted(MECHANISMS)
        if name.startswith("attention/") and name.split("/")[2] == "structured"
    },
    "pointer-network": "the encoder LSTM runs step by step, unrolled",
    "pointer-network/general": "the encoder LSTM runs step by step, unrolled",
    "hierarchical-attention/bigru": "torch.gru's decomposition under torch.compile is "
    "unrolled over the time steps (torch.lstm's is not in inference: the BiLSTM encoder is "
    "symbolic)",
}
#: (length, batch): the first call, which the symbols come from, has no size equal to a
#: fixed one of the inputs (8 features, 3 queries, 6 features of a second input, 2
#: learned queries: equal sizes share a symbol, "duck sizing"); none above the modules'
#: max_len of 5
DYNAMIC_SHAPES = ((5, 7), (3, 4), (4, 2))


#: the mechanisms that compile a second graph for some sizes, and why (bounded: no third)
TWO_GRAPHS = {
    "attention/location-aware/soft/single": "conv1d's shape function branches on n_q B >= 16",
    "linformer": "its length projections are cut to n <= max_len: n = max_len is a graph",
    "synthesizer/factorized-random": "its weights are cut to n <= max_len: n = max_len is a graph",
}
#: the mechanisms this test cannot trace, and why
NOT_HERE = {
    name: "the test's call draws LSH's rotations from a torch.Generator made in the call, "
    "which dynamo cannot trace (test_every_query_and_feature_module_compiles_without_graph_"
    "breaks compiles LSH attention with its rotations passed in)"
    for name in ("reformer", "reformer/fixed-buckets")
}


def test_compile_exemptions_name_mechanisms():
    for table in (PER_POWER_OF_TWO, TWO_GRAPHS, NOT_HERE):
        assert set(table) <= set(MECHANISMS), sorted(set(table) - set(MECHANISMS))
    assert len(PER_POWER_OF_TWO) == 14, sorted(PER_POWER_OF_TWO)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_dynamic_shapes_compile_once_and_match_eager(name):
    """``torch.compile(dynamic=True, fullgraph=True)`` (training on batches of varying
    length) traces every mechanism without a break and gives the eager outputs for three
    batch sizes and sequence lengths; the shapes are symbolic, so the later calls do not
    recompile, but for the mechanisms of ``PER_POWER_OF_TWO`` (one graph per length
    rounded up to a power of two: their lengths 5, 7 and 9 take two). A size
    turned into a constant (a symbolic size formatted into a message, compared in Python)
    makes the later calls recompile."""
    from attention_harness import _ragged_masks

    if name in NOT_HERE:
        pytest.skip(NOT_HERE[name])
    mech = MECHANISMS[name]
    torch.manual_seed(0)
    module = mech.build().eval()

    def run(x: dict, masks: dict) -> dict:
        out = mech.outputs(mech.call(module, x, masks, True))
        return {k: v for k, v in out.items() if v is not None}

    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(run, backend=counter, dynamic=True, fullgraph=True)
    # lengths across a power of two (none of these mechanisms has a max_len; the pointer
    # network's test targets need 5 inputs or more)
    shapes = ((5, 7), (7, 4), (9, 2)) if name in PER_POWER_OF_TWO else DYNAMIC_SHAPES
    for n, batch in shapes:
        x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
        masks = _ragged_masks(mech, batch, n)
        with torch.no_grad():
            torch.manual_seed(1)  # LSH attention draws its rotations in the call
            want = run(x, masks)
            torch.manual_seed(1)
            got = compiled(x, masks)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k], equal_nan=True, atol=1e-5, rtol=1e-5)
    if name in PER_POWER_OF_TWO:
        expected = len({compiled_steps(n) for n, _ in shapes})  # 8 and 16: two graphs
    else:
        expected = 2 if name in TWO_GRAPHS else 1
    assert counter.frame_count == expected, (
        f"{counter.frame_count} compilations for {len(shapes)} shapes"
    )


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("align", ["sparsemax", "entmax15"])
def test_compiled_per_sample_gradients_match_eager(align):
    """torch.compile of a torch.func transform (per-sample gradients): dynamo can neither
    trace the sparse mappings' custom jvp nor vmap an autograd.Function's backward, so they
    run their forward's ops there; one graph, and the gradients of eager torch.func."""
    torch.manual_seed(0)
    attn = Attention("general", align, d_q=4, d_k=4).eval()
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(3, 2, 4, generator=g), torch.randn(3, 5, 4, generator=g)
    params = {name: p.detach() for name, p in attn.named_parameters()}

    def loss(p: dict[str, torch.Tensor], qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(attn, p, (qi[None], ki[None])).context.pow(2).sum()

    per_sample = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    want = per_sample(params, q, k)
    got = torch.compile(per_sample, fullgraph=True, backend="eager")(params, q, k)
    assert want["score.W.weight"].abs().sum() > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)  # float32, another graph


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_forward_and_backward_compile_through_aot_autograd(name):
    """Every mechanism under ``torch.compile(backend="aot_eager", fullgraph=True)``:
    AOTAutograd traces the joint forward and backward graph (what the default Inductor
    backend compiles; the tests above trace the forward only), and the outputs and every
    gradient are the eager ones (``check_compiled_forward_and_backward``). Inductor itself,
    run once over all of them on this machine's CPU, agreed as well (17 minutes: too long
    for the suite)."""
    from attention_harness import check_compiled_forward_and_backward

    # LSH attention: the graph breaks where the test's call makes its torch.Generator
    check_compiled_forward_and_backward(MECHANISMS[name], fullgraph=name not in NOT_HERE)


class _DetachedWhenCompiled(nn.Module):
    """Multi-head self-attention whose traced path cuts the gradient of its input (a
    compile-only path with a wrong backward, as a fast path that steps aside under
    ``torch.compile`` could have)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = MultiHeadAttention(8, 2)

    def forward(self, query: torch.Tensor, *, mask: Any = None, need_weights: bool = False):
        if torch.compiler.is_compiling():
            query = query.detach()
        return self.inner(query, mask=mask, need_weights=need_weights)


def test_compiled_backward_check_fails_on_a_traced_path_with_another_backward():
    from dataclasses import replace

    from attention_harness import check_compiled_forward_and_backward

    mech = replace(MECHANISMS["multi-head"], build=_DetachedWhenCompiled)
    with pytest.raises(AssertionError, match="gradient"):
        check_compiled_forward_and_backward(mech)
