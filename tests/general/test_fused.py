"""Tests of the memory-lean fused kernels (attnlab.general.fused).

Every kernel is compared with the textbook broadcast formula, written out independently
here, in the forward and the backward pass, for every hand-differentiated activation and
for checkpointed ones, across tile sizes that put tile boundaries in different places.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from additive_references import ref_multi_dim
from torch import nn

from attnlab.general import fused
from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean

NAMED = ["tanh", "sigmoid", "relu", "identity"]
REFERENCE_ACTS = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "identity": lambda x: x,
    "gelu": F.gelu,
    "elu": F.elu,
}
B, NQ, NK, DW, DV = 3, 5, 7, 4, 6
ROW = NK * max(DW, DV)  # elements of one query row of one batch element
# 1 row per tile; 2 rows (uneven split of 5); whole batch elements, 2 per tile (3 = 2 + 1);
# everything in one tile.
CHUNKS = [1, 2 * ROW, 2 * NQ * ROW, 10**9]


def _leaves(dtype=torch.float64, seed=0, b=B, nq=NQ, nk=NK, dw=DW, dv=DV, w_scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    t = {
        "q1": r(b, nq, dw),
        "k2": r(b, nk, dw),
        "w": r(dw, scale=0.5),
        "W_d": r(dw, dv, scale=0.5 * w_scale),
        "b_d": r(dv),
        "v": r(b, nk, dv),
    }
    return {k: x.requires_grad_() for k, x in t.items()}


def _random_mask(seed=1, b=B, nq=NQ, nk=NK):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, nq, nk, generator=g) > 0.4
    mask[:, :, 0] = True  # every row keeps a key ...
    mask[1, 2] = False  # ... except this one
    return mask


def naive_additive(q1, k2, w, fn):
    return fn(q1[:, :, None, :] + k2[:, None, :, :]) @ w


def naive_multi_dim(q1, k2, W_d, b_d, v, mask, fn):
    """The context of :func:`ref_multi_dim`."""
    return ref_multi_dim(q1, k2, W_d, b_d, v, mask, fn)[0]


def _grads(out, inputs, seed=5):
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad(out, inputs, go)


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-8}


def _act_arg(name):
    return F.gelu if name == "gelu" else name  # a callable and a name of the fallback path


# ----------------------------------------------------------------------- additive


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("act", [*NAMED, "gelu", "elu"])
def test_additive_matches_naive(act, chunk, dtype):
    t = _leaves(dtype)
    ins = [t["q1"], t["k2"], t["w"]]
    e = additive_score_lean(*ins, act=_act_arg(act), chunk_elems=chunk)
    ref = naive_additive(*ins, REFERENCE_ACTS[act])
    assert e.shape == (B, NQ, NK) and e.dtype == dtype
    torch.testing.assert_close(e, ref, **_tol(dtype))
    for got, want in zip(_grads(e, ins), _grads(ref, ins), strict=True):
        torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "relu", "identity", "gelu"])
def test_additive_gradcheck(act):
    t = _leaves(torch.float64, b=2, nq=3, nk=4, dw=3)
    fn = _act_arg(act)
    assert torch.autograd.gradcheck(
        lambda q1, k2, w: additive_score_lean(q1, k2, w, act=fn, chunk_elems=8),
        (t["q1"], t["k2"], t["w"]),
    )


def test_additive_partial_requires_grad():
    t = _leaves()
    k2 = t["k2"].detach()
    w = t["w"].detach()
    e = additive_score_lean(t["q1"], k2, w)
    (gq,) = _grads(e, [t["q1"]])
    (want,) = _grads(naive_additive(t["q1"], k2, w, torch.tanh), [t["q1"]])
    torch.testing.assert_close(gq, want)


# ------------------------------------------------------------ multi-dimensional


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("act", [*NAMED, "gelu", "elu"])
def test_multi_dim_matches_naive(act, chunk, dtype):
    t = _leaves(dtype)
    mask = _random_mask()
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    c = multi_dim_attend_lean(*ins, mask=mask, act=_act_arg(act), chunk_elems=chunk)
    ref = naive_multi_dim(*ins, mask, REFERENCE_ACTS[act])
    assert c.shape == (B, NQ, DV) and c.dtype == dtype
    torch.testing.assert_close(c, ref, **_tol(dtype))
    for got, want in zip(_grads(c, ins), _grads(ref, ins), strict=True):
        torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "relu"])
@pytest.mark.parametrize("mask_kind", ["none", "key-padding", "causal"])
def test_multi_dim_masks_and_large_weights(act, mask_kind):
    # W_d scaled up so that the fixed-shift softmax of tanh/sigmoid must fall back to the
    # row maximum; broadcast masks of the shapes attnlab.masks produces.
    t = _leaves(torch.float64, w_scale=200.0)
    mask = {
        "none": None,
        "key-padding": torch.arange(NK)[None, None, :] < torch.tensor([7, 3, 1])[:, None, None],
        "causal": torch.ones(NQ, NK, dtype=torch.bool).tril(diagonal=NK - NQ),
    }[mask_kind]
    ins = [t["q1"], t["k2"], t["W_d"], None, t["v"]]
    c = multi_dim_attend_lean(*ins, mask=mask, act=act, chunk_elems=ROW * 2)
    ref = naive_multi_dim(
        *ins, None if mask is None else mask.expand(B, NQ, NK), REFERENCE_ACTS[act]
    )
    torch.testing.assert_close(c, ref)
    leaves = [t["q1"], t["k2"], t["W_d"], t["v"]]
    for got, want in zip(_grads(c, leaves), _grads(ref, leaves), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "relu", "identity", "gelu"])
def test_multi_dim_gradcheck(act):
    t = _leaves(torch.float64, b=2, nq=3, nk=4, dw=3, dv=2)
    mask = _random_mask(b=2, nq=3, nk=4)
    mask[0, 1] = False
    fn = _act_arg(act)
    assert torch.autograd.gradcheck(
        lambda q1, k2, W_d, b_d, v: multi_dim_attend_lean(
            q1, k2, W_d, b_d, v, mask=mask, act=fn, chunk_elems=8
        ),
        (t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]),
    )


def test_multi_dim_fully_masked_row_is_zero_with_finite_zero_grads():
    t = _leaves(torch.float32)
    mask = _random_mask()  # row (1, 2) has no key
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    c = multi_dim_attend_lean(*ins, mask=mask, chunk_elems=ROW)
    assert torch.isfinite(c).all()
    assert (c[1, 2] == 0).all()
    grads = _grads(c, ins)
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][1, 2] == 0).all()  # nothing flows into that query's q1
    assert (grads[3] == 0).all()  # b_d cancels in the softmax over keys

    everything_masked = torch.zeros(B, 1, NK, dtype=torch.bool)
    for act in ["relu", F.gelu]:  # the row-maximum path and the checkpointed path
        c = multi_dim_attend_lean(*ins, mask=everything_masked, act=act)
        assert (c == 0).all()
        assert all((g == 0).all() for g in _grads(c, ins))


def test_multi_dim_partial_requires_grad():
    t = _leaves()
    q1, W_d = t["q1"].detach(), t["W_d"].detach()
    ins = [q1, t["k2"], W_d, None, t["v"]]
    c = multi_dim_attend_lean(*ins, act="tanh")
    ref = naive_multi_dim(*ins, None, torch.tanh)
    for got, want in zip(_grads(c, [t["k2"], t["v"]]), _grads(ref, [t["k2"], t["v"]]), strict=True):
        torch.testing.assert_close(got, want)
    c = multi_dim_attend_lean(q1, k2 := t["k2"].detach(), W_d, None, t["v"])
    (gv,) = _grads(c, [t["v"]])
    (want,) = _grads(naive_multi_dim(q1, k2, W_d, None, t["v"], None, torch.tanh), [t["v"]])
    torch.testing.assert_close(gv, want)


# ----------------------------------------------------------- activations, dtypes


@pytest.mark.parametrize(
    ("act", "name"),
    [
        ("tanh", "tanh"),
        (torch.tanh, "tanh"),
        (F.tanh, "tanh"),
        (nn.Tanh(), "tanh"),
        (torch.sigmoid, "sigmoid"),
        (nn.ReLU(), "relu"),
        (F.relu, "relu"),
        (nn.Identity(), "identity"),
        ("gelu", None),
        (F.gelu, None),
        (lambda x: x * torch.sigmoid(x), None),
    ],
)
def test_activation_dispatch(act, name):
    assert fused._resolve_act(act).name == name


def test_user_callable_activation():
    t = _leaves()

    def swish(x):
        return x * torch.sigmoid(x)

    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    c = multi_dim_attend_lean(*ins, act=swish, chunk_elems=ROW)
    ref = naive_multi_dim(*ins, None, swish)
    torch.testing.assert_close(c, ref)
    for got, want in zip(_grads(c, ins), _grads(ref, ins), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("act", ["tanh", "relu", "gelu"])
def test_bfloat16_close_to_float32(act):
    t = _leaves(torch.bfloat16)
    ins16 = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    ins32 = [x.detach().float().requires_grad_() for x in ins16]
    mask = _random_mask()
    c16 = multi_dim_attend_lean(*ins16, mask=mask, act=act, chunk_elems=ROW)
    c32 = multi_dim_attend_lean(*ins32, mask=mask, act=act, chunk_elems=ROW)
    assert c16.dtype == torch.bfloat16
    torch.testing.assert_close(c16.float(), c32, atol=2e-2, rtol=2e-2)
    for g16, g32 in zip(_grads(c16, ins16), _grads(c32, ins32), strict=True):
        assert g16.dtype == torch.bfloat16
        torch.testing.assert_close(g16.float(), g32, atol=3e-2, rtol=3e-2)

    a16 = [t["q1"], t["k2"], t["w"]]
    a32 = [x.detach().float().requires_grad_() for x in a16]
    e16 = additive_score_lean(*a16, act=act, chunk_elems=ROW)
    e32 = additive_score_lean(*a32, act=act, chunk_elems=ROW)
    assert e16.dtype == torch.bfloat16
    torch.testing.assert_close(e16.float(), e32, atol=2e-2, rtol=2e-2)
    for g16, g32 in zip(_grads(e16, a16), _grads(e32, a32), strict=True):
        assert g16.dtype == torch.bfloat16
        torch.testing.assert_close(g16.float(), g32, atol=5e-2, rtol=3e-2)


def test_chunk_size_does_not_change_the_result():
    t = _leaves(torch.float32, b=2, nq=33, nk=17, dw=8, dv=8)
    mask = torch.rand(2, 33, 17, generator=torch.Generator().manual_seed(3)) > 0.3
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    outs = [multi_dim_attend_lean(*ins, mask=mask, chunk_elems=c) for c in (1, 500, None)]
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[2])
    es = [additive_score_lean(t["q1"], t["k2"], t["w"], chunk_elems=c) for c in (1, 500, None)]
    torch.testing.assert_close(es[0], es[1])
    torch.testing.assert_close(es[0], es[2])


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
def test_large_inputs_leave_the_product_form(act):
    # |q1| beyond the product form's range: the kernels apply sigmoid to the sum instead
    t = _leaves(torch.float32)
    with torch.no_grad():
        t["q1"].mul_(40.0)
    spec = fused._resolve_act(act)
    assert not fused._Hidden.of(t["q1"], t["k2"], spec, torch.float32).product
    assert fused._Hidden.of(t["q1"] / 40, t["k2"], spec, torch.float32).product
    mask = _random_mask()
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    c = multi_dim_attend_lean(*ins, mask=mask, act=act, chunk_elems=ROW)
    ref = naive_multi_dim(*ins, mask, REFERENCE_ACTS[act])
    torch.testing.assert_close(c, ref, **_tol(torch.float32))
    for got, want in zip(_grads(c, ins), _grads(ref, ins), strict=True):
        torch.testing.assert_close(got, want, **_tol(torch.float32))
    a = [t["q1"], t["k2"], t["w"]]
    e = additive_score_lean(*a, act=act, chunk_elems=ROW)
    ref = naive_additive(*a, REFERENCE_ACTS[act])
    torch.testing.assert_close(e, ref, **_tol(torch.float32))
    for got, want in zip(_grads(e, a), _grads(ref, a), strict=True):
        torch.testing.assert_close(got, want, **_tol(torch.float32))


def test_worker_threads_match_one_thread_and_are_deterministic():
    t = _leaves(torch.float32, b=2, nq=40, nk=30, dw=16, dv=8)
    mask = torch.rand(2, 40, 30, generator=torch.Generator().manual_seed(4)) > 0.2
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    a = [t["q1"], t["k2"], t["w"]]

    def run():
        c = multi_dim_attend_lean(*ins, mask=mask, chunk_elems=2000)
        e = additive_score_lean(*a, act="gelu", chunk_elems=2000)
        return [c, e, *_grads(c, ins), *_grads(e, a)]

    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run()
        torch.set_num_threads(3)
        first, second = run(), run()
    finally:
        torch.set_num_threads(n)
    for x, y, z in zip(single, first, second, strict=True):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)  # summation order differs
        assert torch.equal(y, z)  # fixed tile-to-worker assignment: bitwise reproducible


def test_inference_mode():
    t = {k: x.detach() for k, x in _leaves(torch.float32, nq=40, nk=30).items()}
    with torch.inference_mode():
        e = additive_score_lean(t["q1"], t["k2"], t["w"], chunk_elems=ROW)
        c = multi_dim_attend_lean(t["q1"], t["k2"], t["W_d"], None, t["v"], chunk_elems=ROW)
    torch.testing.assert_close(e, naive_additive(t["q1"], t["k2"], t["w"], torch.tanh))
    ref = naive_multi_dim(t["q1"], t["k2"], t["W_d"], None, t["v"], None, torch.tanh)
    torch.testing.assert_close(c, ref)


@pytest.mark.parametrize("act", ["tanh", "identity", "gelu"])
def test_second_derivatives_are_exact(act):
    """Under ``create_graph=True`` the kernels' backward differentiates the broadcast
    formula: gradgradcheck (numerical, independent of it) passes for every input, with a
    mask and a fully masked query row for the multi-dimensional kernel, and the first-order
    gradients with a graph equal the hand-written ones."""
    t = _leaves(torch.float64, b=2, nq=3, nk=4, dw=3, dv=2)
    mask = _random_mask(b=2, nq=3, nk=4)
    mask[1, 2] = False  # a query row with no allowed key
    torch.autograd.gradgradcheck(
        lambda q1, k2, w: additive_score_lean(q1, k2, w, act=act), (t["q1"], t["k2"], t["w"])
    )
    torch.autograd.gradgradcheck(
        lambda q1, k2, W_d, b_d, v: multi_dim_attend_lean(q1, k2, W_d, b_d, v, mask, act=act),
        (t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]),
    )
    for out in (
        additive_score_lean(t["q1"], t["k2"], t["w"], act=act),
        multi_dim_attend_lean(t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"], mask, act=act),
    ):
        inputs = [t[k] for k in ("q1", "k2", "w", "W_d", "v")]
        g_out = torch.randn_like(out)
        plain = torch.autograd.grad(out, inputs, g_out, retain_graph=True, allow_unused=True)
        graph = torch.autograd.grad(out, inputs, g_out, create_graph=True, allow_unused=True)
        for a, b in zip(plain, graph, strict=True):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
                assert b.requires_grad  # differentiable again


def test_second_derivative_reaches_the_inputs_through_autograd_grad():
    """``torch.autograd.grad(g, inputs)`` (the engine prunes nodes that lead to no input)
    gives the second derivative of the broadcast formula, never one without the kernel's
    part (nor "appears to not have been used in the graph")."""
    t = _leaves(torch.float64, b=2, nq=3, nk=4, dw=3)
    q1, k2, w = t["q1"], t["k2"], t["w"]
    want_e = naive_additive(q1, k2, w, torch.tanh)
    got_e = additive_score_lean(q1, k2, w)
    second = []
    for e in (got_e, want_e):
        (g,) = torch.autograd.grad(e.pow(2).sum(), q1, create_graph=True)
        second.append(torch.autograd.grad(g.pow(2).sum(), (q1, k2, w)))
    for got, want in zip(*second, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def test_torch_func_transforms_take_the_formula():
    """Under ``torch.func`` (no rule for a hand-written autograd.Function) both kernels
    compute their formula as plain ops: ``vmap`` over the batch gives the kernels' batched
    result, ``jacfwd`` (forward mode) equals ``jacrev`` and the Jacobian of the broadcast
    formula, with a mask and a fully masked query row."""
    t = _leaves(torch.float64, b=2, nq=3, nk=4, dw=3, dv=2)
    q1, k2, w, W_d, b_d, v = (t[k].detach() for k in ("q1", "k2", "w", "W_d", "b_d", "v"))
    mask = _random_mask(b=2, nq=3, nk=4)
    mask[1, 2] = False

    def multi(q: torch.Tensor, k: torch.Tensor, vv: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return multi_dim_attend_lean(q[None], k[None], W_d, b_d, vv[None], m[None])[0]

    torch.testing.assert_close(
        torch.func.vmap(lambda q, k: additive_score_lean(q[None], k[None], w)[0])(q1, k2),
        additive_score_lean(q1, k2, w),
    )
    torch.testing.assert_close(
        torch.func.vmap(multi)(q1, k2, v, mask), multi_dim_attend_lean(q1, k2, W_d, b_d, v, mask)
    )
    fwd = torch.func.jacfwd(lambda q: additive_score_lean(q, k2, w))(q1)
    torch.testing.assert_close(fwd, torch.func.jacrev(lambda q: additive_score_lean(q, k2, w))(q1))
    want = torch.func.jacrev(lambda q: naive_additive(q, k2, w, torch.tanh))(q1)
    torch.testing.assert_close(fwd, want)
    fwd = torch.func.jacfwd(lambda q: multi_dim_attend_lean(q, k2, W_d, b_d, v, mask))(q1)
    want = torch.func.jacrev(lambda q: ref_multi_dim(q, k2, W_d, b_d, v, mask, torch.tanh)[0])(q1)
    torch.testing.assert_close(fwd, want)


# ------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize(("nq", "nk"), [(0, NK), (NQ, 0), (0, 0)])
@pytest.mark.parametrize("act", ["tanh", "identity", "gelu"])
def test_empty_inputs(nq, nk, act):
    t = _leaves(torch.float32, nq=nq, nk=nk)
    e = additive_score_lean(t["q1"], t["k2"], t["w"], act=act)
    assert e.shape == (B, nq, nk)
    e.sum().backward()
    assert t["q1"].grad.shape == (B, nq, DW) and (t["q1"].grad == 0).all()
    assert (t["k2"].grad == 0).all() and (t["w"].grad == 0).all()

    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    c = multi_dim_attend_lean(*ins, mask=torch.ones(B, nq, nk, dtype=torch.bool), act=act)
    assert c.shape == (B, nq, DV) and (c == 0).all()
    grads = torch.autograd.grad(c.sum(), ins)
    assert [g.shape for g in grads] == [x.shape for x in ins]
    assert all((g == 0).all() for g in grads)


# ------------------------------------------------------------------- bad inputs


def test_bad_shapes_name_the_argument():
    q1 = torch.randn(2, 5, 8)
    with pytest.raises(
        ValueError, match=r"k2 has shape \(2, 5, 7\), expected \[B, n_k, d_w\] = \[2, \*, 8\]"
    ):
        additive_score_lean(q1, torch.randn(2, 5, 7), torch.randn(8))
    with pytest.raises(ValueError, match=r"k2 has shape \(3, 5, 8\)"):
        additive_score_lean(q1, torch.randn(3, 5, 8), torch.randn(8))
    with pytest.raises(ValueError, match=r"w has shape \(7,\), expected \[d_w\] = \[8\]"):
        additive_score_lean(q1, torch.randn(2, 5, 8), torch.randn(7))
    with pytest.raises(ValueError, match=r"q1 has shape \(5, 8\), expected \[B, n_q, d_w\]"):
        additive_score_lean(torch.randn(5, 8), torch.randn(2, 5, 8), torch.randn(8))

    k2, v = torch.randn(2, 4, 8), torch.randn(2, 4, 3)
    W_d, b_d = torch.randn(8, 3), torch.randn(3)
    with pytest.raises(
        ValueError, match=r"W_d has shape \(7, 3\), expected \[d_w, d_v\] = \[8, \*\]"
    ):
        multi_dim_attend_lean(q1, k2, torch.randn(7, 3), b_d, v)
    with pytest.raises(ValueError, match=r"b_d has shape \(4,\), expected \[d_v\] = \[3\]"):
        multi_dim_attend_lean(q1, k2, W_d, torch.randn(4), v)
    with pytest.raises(
        ValueError, match=r"v has shape \(2, 5, 3\), expected \[B, n_k, d_v\] = \[2, 4, 3\]"
    ):
        multi_dim_attend_lean(q1, k2, W_d, b_d, torch.randn(2, 5, 3))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 5, 5\)"):
        multi_dim_attend_lean(q1, k2, W_d, b_d, v, mask=torch.ones(2, 5, 5, dtype=torch.bool))


def test_bad_dtypes_and_arguments():
    q1, k2, w = torch.randn(2, 5, 8), torch.randn(2, 4, 8), torch.randn(8)
    with pytest.raises(TypeError, match=r"k2 has dtype torch.float64, expected torch.float32"):
        additive_score_lean(q1, k2.double(), w)
    with pytest.raises(TypeError, match=r"q1 has dtype torch.int64"):
        additive_score_lean(q1.long(), k2.long(), w.long())
    with pytest.raises(TypeError, match=r"w must be a torch.Tensor"):
        additive_score_lean(q1, k2, [1.0] * 8)
    with pytest.raises(ValueError, match="chunk_elems"):
        additive_score_lean(q1, k2, w, chunk_elems=0)
    with pytest.raises(ValueError, match="not a known activation"):
        additive_score_lean(q1, k2, w, act="tanhh")
    v = torch.randn(2, 4, 3)
    with pytest.raises(TypeError, match=r"mask has dtype torch.float32, expected torch.bool"):
        multi_dim_attend_lean(q1, k2, torch.randn(8, 3), None, v, mask=torch.ones(2, 5, 4))
    with pytest.raises(TypeError, match=r"v has dtype torch.float64"):
        multi_dim_attend_lean(q1, k2, torch.randn(8, 3), None, v.double())


def test_tiles_cover_every_row_once():
    for batch, n_q, row, chunk in [(3, 5, 7, 1), (3, 5, 7, 14), (3, 5, 7, 70), (4, 5, 7, 10**6)]:
        seen = torch.zeros(batch, n_q, dtype=torch.int64)
        for b0, b1, i0, i1 in fused._tiles(batch, n_q, 1, row, chunk):
            assert (b1 - b0 == 1) or (i0 == 0 and i1 == n_q)  # contiguous slices
            assert (b1 - b0) * (i1 - i0) * row <= max(chunk, row)
            seen[b0:b1, i0:i1] += 1
        assert (seen == 1).all()


# -------------------------------------------------------------------------- memory

_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean

    def status_mib(key):
        # VmRSS / VmHWM of this process. (ru_maxrss is no good here: a child started by
        # subprocess inherits its parent's peak.)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise KeyError(key)

    def reset_peak():
        try:  # Linux >= 4.0: restart VmHWM from the current RSS
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # VmHWM then only grows; each phase below still allocates beyond it

    torch.set_num_threads(2)  # two workers, each with its own workspace
    torch.manual_seed(0)
    B, n, d = 4, 512, 128  # one [B, n, n, d] float32 tensor is 512 MiB
    q1, k2 = (torch.randn(B, n, d, requires_grad=True) for _ in range(2))
    w = torch.randn(d, requires_grad=True)
    d_v = 8  # keeps the multi-dimensional kernel's matrix products cheap
    W_d = (torch.randn(d, d_v) / d**0.5).requires_grad_()
    v = torch.randn(B, n, d_v, requires_grad=True)
    mask = torch.rand(B, 1, n) > 0.1
    # warm up the kernels, the thread pool and the allocator at a small size
    additive_score_lean(q1[:, :64], k2[:, :64], w).sum().backward()
    multi_dim_attend_lean(q1[:, :64], k2[:, :64], W_d, None, v[:, :64]).sum().backward()
    reset_peak()
    before = status_mib("VmRSS")
    additive_score_lean(q1, k2, w).sum().backward()
    multi_dim_attend_lean(q1, k2, W_d, None, v, mask).sum().backward()
    lean = status_mib("VmHWM") - before
    # then the broadcast form, to show that the measurement does see a 4-D tensor
    reset_peak()
    before = status_mib("VmRSS")
    with torch.no_grad():
        (q1[:, :, None, :] + k2[:, None, :, :]).sum()
    print(json.dumps({"lean": lean, "naive": status_mib("VmHWM") - before}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_far_below_the_4d_tensor():
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    growth = json.loads(out.stdout.strip().splitlines()[-1])
    four_d_mib = 4 * 512 * 512 * 128 * 4 / 2**20  # 512 MiB
    assert growth["naive"] > 0.9 * four_d_mib  # the harness can see a 4-D tensor
    assert growth["lean"] < four_d_mib / 8, f"peak RSS grew by {growth['lean']:.0f} MiB"


def test_lean_kernels_take_fp32_parameters_under_autocast_and_leave_float64_alone():
    """Under CPU bf16 autocast, bf16 activations meet fp32 parameters (as in nn.Linear): the
    result is bf16 and close to fp32; float64 inputs are not autocast-eligible and stay."""
    g = torch.Generator().manual_seed(0)
    q1, k2, v = (torch.randn(2, n, 4, generator=g) for n in (3, 5, 5))
    w, W_d = torch.randn(4, generator=g), torch.randn(4, 4, generator=g)
    want_e = additive_score_lean(q1, k2, w)
    want_c = multi_dim_attend_lean(q1, k2, W_d, None, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        e = additive_score_lean(q1.bfloat16(), k2.bfloat16(), w)
        c = multi_dim_attend_lean(q1.bfloat16(), k2.bfloat16(), W_d, None, v)
        e64 = additive_score_lean(q1.double(), k2.double(), w.double())
    assert e.dtype == c.dtype == torch.bfloat16
    torch.testing.assert_close(e.float(), want_e, atol=0.05, rtol=0.02)
    torch.testing.assert_close(c.float(), want_c, atol=0.05, rtol=0.02)
    assert e64.dtype == torch.float64
    torch.testing.assert_close(e64, want_e.double(), atol=1e-5, rtol=1e-5)
