"""Tests of the local-attention Triton kernels (attnlab.general.local_triton) and of the
``local-triton`` path of ``Attention``.

Without a CUDA GPU they run on the CPU under Triton's interpreter (``triton_device``,
imported first); on a GPU machine the same tests run on the GPU. Sizes are tiny but span several query blocks and, in the wide case, several feature
chunks of the kernels' 32-wide loops.

The reference is the textbook formula written out below in float64 from the same input
values: all ``n_k`` scores, the window ``|l - p| <= D`` (and the mask) as a mask, the
softmax over it, the Gaussian factor; forward and every gradient (queries, keys, values,
centres). Tolerances, of the reference's scale: float32 ``2e-5``; float16 ``5e-3``;
bfloat16 ``3e-2`` (an 8-bit significand: the inputs and the context are rounded).
"""

from __future__ import annotations

import pytest
import torch
from triton_device import (  # first: sets TRITON_INTERPRET without a GPU
    DEVICE,
    check_compiled_matches_eager,
    check_eager_front_matches_op,
)

from attnlab import Attention
from attnlab.general.local_triton import LOCAL_TRITON_MAX_WINDOW, local_triton_attend
from attnlab.general.planner import Plan, capabilities, plan_attention

TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
B, NQ, NK = 2, 37, 29  # 5 query blocks of 8 on the CPU


def reference(q, k, v, center, D, scale, mask, gaussian):
    """The local alignment on the full scores, float64."""
    n_k = k.shape[1]
    e = scale * q @ k.transpose(1, 2)  # [B, n_q, n_k]
    dist = torch.arange(n_k, dtype=e.dtype)[None, None, :] - center[..., None]
    window = dist.abs() <= D
    if mask is not None:
        window = window & mask
    w = torch.softmax(e.masked_fill(~window, float("-inf")), -1).nan_to_num(0.0)
    if gaussian:
        w = w * torch.exp(-(dist**2) / (2 * (D / 2) ** 2))
    return w @ v


def _inputs(d=12, dv=10, n_q=NQ, n_k=NK, seed=0, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(B, n_k, d, generator=g, dtype=torch.float64)
    v = torch.randn(B, n_k, dv, generator=g, dtype=torch.float64)
    # centres spread past both ends, so that windows are cut at 0 and n_k - 1
    c = torch.rand(B, n_q, generator=g, dtype=torch.float64) * (n_k + 2 * spread) - spread
    return q, k, v, c


MASKS = {
    "none": lambda: None,
    "key-padding": lambda: torch.arange(NK)[None, None, :] < torch.tensor([NK, 20])[:, None, None],
    "full": lambda: torch.rand(B, NQ, NK, generator=torch.Generator().manual_seed(3)) > 0.3,
}


def _compare(dtype, gaussian, mask, d=12, dv=10, D=3, scale=0.7, deterministic=False):
    q, k, v, c = _inputs(d, dv)
    got_in = [x.to(dtype).to(DEVICE).requires_grad_() for x in (q, k, v)]
    c_in = c.float().to(DEVICE).requires_grad_()
    ref_in = [x.detach().cpu().double().requires_grad_() for x in (*got_in, c_in)]
    m = None if mask is None else mask.to(DEVICE)
    out = local_triton_attend(*got_in, c_in, D, scale, m, gaussian, deterministic)
    want = reference(*ref_in, D, scale, mask, gaussian)
    assert out.dtype == dtype and out.shape == want.shape
    r = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out.double() * r.to(DEVICE)).sum().backward()
    (want * r).sum().backward()
    tol = TOL[dtype]
    pairs = [("context", out.detach().cpu().double(), want.detach())]
    for name, x, y in zip(("q", "k", "v", "center"), (*got_in, c_in), ref_in, strict=True):
        if name == "center" and not gaussian:
            assert x.grad is None  # the centres only choose the window
            continue
        pairs.append((f"d{name}", x.grad.cpu().double(), y.grad))
    for name, a, b in pairs:
        scale_ = max(1.0, b.abs().max().item())
        err = (a - b).abs().max().item()
        assert err <= tol * scale_, f"{name}: max error {err:.3g} (scale {scale_:.3g})"


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("gaussian", [True, False], ids=["gaussian", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_matches_the_formula(dtype, gaussian, mask):
    _compare(dtype, gaussian, MASKS[mask]())


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_deterministic_key_side_backward_matches_the_formula(dtype, mask):
    # the key and value gradients from the key-side pass over the queries sorted by centre
    _compare(dtype, True, MASKS[mask](), deterministic=True)


def test_the_key_side_backward_with_wide_features_and_nan_centres():
    # more keys than one key block, features over one chunk, and a NaN centre (no window)
    _compare(torch.float32, True, None, d=40, dv=35, D=5, deterministic=True)
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs(n_k=70))
    c = c.clone()
    c[0, 3] = float("nan")
    ins = [x.requires_grad_() for x in (q, k, v)]
    for deterministic in (True, False):
        out = local_triton_attend(*ins, c, 3, 1.0, None, True, deterministic)
        out.nan_to_num(0.0).square().sum().backward()
    got = [x.grad.clone() for x in ins]
    for x in ins:
        x.grad = None
    local_triton_attend(*ins, c, 3, 1.0, None, True, False).nan_to_num(
        0.0
    ).square().sum().backward()
    for g, x in zip(got, ins, strict=True):  # the two backward passes, summed, are twice one
        torch.testing.assert_close(g, 2 * x.grad, atol=1e-5, rtol=1e-5)


def test_deterministic_algorithms_take_the_key_side_pass(monkeypatch):
    from attnlab.general import local_triton as lt

    calls = []
    real = lt._key_side
    monkeypatch.setattr(lt, "_key_side", lambda *a: calls.append(1) or real(*a))
    q, k, v, c = (x.float().to(DEVICE).requires_grad_() for x in _inputs())
    grads = []
    for flag in (False, True):
        monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda f=flag: f)
        out = local_triton_attend(q, k, v, c, 3)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v, c)))
    assert calls == [1]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_wide_features_and_window():
    # d and d_v over the kernels' 32-wide chunks, a window of 2D + 1 = 11 slots (16 padded)
    _compare(torch.float32, True, MASKS["key-padding"](), d=40, dv=35, D=5, scale=0.3)


def test_strided_inputs_give_the_contiguous_result():
    # views with other strides (a transposed layout, every other key of a longer tensor, a
    # centre column of a wider tensor): the kernels read through the strides
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs())
    qs = q.transpose(1, 2).contiguous().transpose(1, 2)
    ks = torch.repeat_interleave(k, 2, dim=1)[:, ::2]
    vs = torch.stack([v, -v], -1)[..., 0]
    cs = torch.stack([c, c + 1], -1)[..., 0]
    assert not (qs.is_contiguous() or ks.is_contiguous() or vs.is_contiguous())
    assert not cs.is_contiguous()
    mask = MASKS["full"]().to(DEVICE)
    want = local_triton_attend(q, k, v, c, 3, 0.5, mask)
    got = local_triton_attend(qs, ks, vs, cs, 3, 0.5, mask)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_padding_never_reaches_the_results():
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs())
    mask = MASKS["key-padding"]().to(DEVICE)
    k, v = k.clone(), v.clone()
    k[1, 20:], v[1, 20:] = float("nan"), float("inf")
    ins = [x.requires_grad_() for x in (q, k, v, c)]
    out = local_triton_attend(*ins[:3], ins[3], 3, 1.0, mask, True)
    out.sum().backward()
    assert torch.isfinite(out).all()
    for x in ins:
        assert torch.isfinite(x.grad).all()
    assert not k.grad[1, 20:].any() and not v.grad[1, 20:].any()


def test_an_empty_window_gives_zero_context_and_gradients():
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs())
    c = c.clone()
    c[0, :5] = -10.0  # no key within D = 3
    c[1, :5] = NK + 10.0
    ins = [x.requires_grad_() for x in (q, k, v, c)]
    out = local_triton_attend(*ins[:3], ins[3], 3, 1.0, None, True)
    out.sum().backward()
    assert not out[:, :5].any()
    assert not ins[0].grad[:, :5].any() and not ins[3].grad[:, :5].any()
    assert out[:, 5:].abs().sum() > 0


def test_no_keys_and_no_queries():
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs())
    assert local_triton_attend(q, k[:, :0], v[:, :0], c, 3).shape == (B, NQ, v.shape[-1])
    assert not local_triton_attend(q, k[:, :0], v[:, :0], c, 3).any()
    assert local_triton_attend(q[:, :0], k, v, c[:, :0], 3).shape == (B, 0, v.shape[-1])


def _second_derivatives(run, args, mask, gaussian):
    """``d/d args`` of ``sum(r * d(out . g)/d q)``: a gradient penalty's gradient."""
    out = run(*args[:3], args[3], 3, 0.7, mask, gaussian)
    g = torch.Generator().manual_seed(3)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    (gq,) = torch.autograd.grad(out, args[0], go, create_graph=True)
    r = torch.randn(gq.shape, generator=g, dtype=torch.float64).to(gq)
    return torch.autograd.grad((gq * r).sum(), args, allow_unused=True)


@pytest.mark.parametrize("gaussian", [True, False], ids=["gaussian", "plain"])
def test_second_derivatives_match_the_formula(gaussian):
    """Under ``create_graph=True`` the kernels' backward differentiates the gathered
    window's formula: the second derivatives (a gradient penalty's gradient) with respect
    to q, k, v and the centres equal the float64 reference's (centres inside the keys, so
    that no window is empty: the reference's derivatives of an empty window are NaN), and
    with a mask that empties windows they are finite."""
    q, k, v, c = _inputs(spread=0.0)
    ins = [x.float().to(DEVICE).requires_grad_() for x in (q, k, v, c)]
    ref_ins = [x.detach().cpu().double().requires_grad_() for x in ins]
    got = _second_derivatives(local_triton_attend, ins, None, gaussian)
    want = _second_derivatives(reference, ref_ins, None, gaussian)
    for name, a, b in zip(("q", "k", "v", "center"), got, want, strict=True):
        if b is None or (name == "center" and not gaussian):
            assert a is None or not a.any(), name  # the centres only choose the window
            continue
        assert a is not None, f"no second derivative for {name}"
        scale = max(1.0, b.abs().max().item())
        err = (a.detach().cpu().double() - b).abs().max().item()
        assert err <= 1e-4 * scale, f"{name}: max error {err:.3g} (scale {scale:.3g})"
    q, k, v, c = _inputs()  # centres past both ends, and a mask: empty windows
    ins = [x.float().to(DEVICE).requires_grad_() for x in (q, k, v, c)]
    masked = _second_derivatives(local_triton_attend, ins, MASKS["full"]().to(DEVICE), gaussian)
    assert all(a is None or torch.isfinite(a).all() for a in masked)


def test_bad_input_raises_one_line():
    q, k, v, c = (x.float().to(DEVICE) for x in _inputs())
    with pytest.raises(ValueError, match="half window width"):
        local_triton_attend(q, k, v, c, 0)
    with pytest.raises(ValueError, match="center has shape"):
        local_triton_attend(q, k, v, c[:, :3], 3)
    with pytest.raises(ValueError, match="shapes do not match"):
        local_triton_attend(q, k[..., :5], v, c, 3)
    with pytest.raises(TypeError, match="dtype"):
        local_triton_attend(q.double(), k, v, c, 3)
    with pytest.raises(TypeError, match="bool"):
        local_triton_attend(q, k, v, c, 3, mask=torch.ones(B, 1, NK, device=DEVICE))
    with pytest.raises(ValueError, match="wider than the kernels take"):
        local_triton_attend(q, k, v, c, LOCAL_TRITON_MAX_WINDOW)


# ----------------------------------------------------------- the path of Attention


@pytest.mark.parametrize(
    "score,align,kw",
    [
        ("general", "local-p", {}),
        ("scaled-dot", "local-m", {"gaussian": True}),
        ("cosine", "local-p", {"D": 2}),
    ],
    ids=["general-local-p", "scaled-dot-local-m-gaussian", "cosine-local-p"],
)
def test_attention_on_the_local_triton_path_matches_explicit(score, align, kw, monkeypatch):
    torch.manual_seed(0)
    kw = {"D": 3, **kw}
    attn = Attention(score, align, d_q=12, d_k=12, **kw).to(DEVICE)
    explicit = Attention(score, align, d_q=12, d_k=12, path="explicit", **kw).to(DEVICE)
    explicit.load_state_dict(attn.state_dict())
    # the planner sends CUDA calls here; on the CPU (interpreter) the path is forced
    forced = Plan("local-triton", "forced by the test")
    monkeypatch.setattr(attn, "_plan", lambda *a, **k: forced)  # the plan forward takes
    q, k, v, _ = (x.float().to(DEVICE) for x in _inputs(dv=12))
    mask = MASKS["key-padding"]().to(DEVICE)
    outs, grads = [], []
    for m in (attn, explicit):
        ins = [x.clone().requires_grad_() for x in (q, k, v)]
        out = m(*ins, mask=mask)
        out.context.pow(2).sum().backward()
        outs.append(out)
        grads.append([x.grad for x in ins] + [p.grad.clone() for p in m.parameters()])
        m.zero_grad()
    assert outs[0].path == "local-triton" and outs[1].path == "explicit"
    torch.testing.assert_close(outs[0].context, outs[1].context, atol=2e-5, rtol=2e-5)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=5e-5)


def _plan(score, align, **call):
    attn = Attention(score, align, d_q=16, d_k=16, D=3, gaussian=call.pop("gaussian", True))
    return plan_attention(capabilities(attn.score, attn.align, attn.multi), **call).path


def test_the_planner_sends_cuda_local_calls_with_a_dot_score_to_the_kernels():
    assert _plan("general", "local-p", device="cuda", head_dim=16) == "local-triton"
    assert _plan("scaled-dot", "local-m", device="cuda", head_dim=16) == "local-triton"
    assert _plan("scaled-dot", "local-m", gaussian=False, device="cuda", head_dim=16) == (
        "local-flex"
    )
    assert _plan("general", "local-p", device="cpu") == "local-window"
    assert _plan("additive", "local-p", device="cuda") == "local-window"
    assert _plan("general", "local-p", device="cuda", need_weights=True) == "local-window"
    assert _plan("general", "local-p", device="cuda", dropout=True) == "local-window"
    assert _plan("general", "local-p", device="cuda", dtype=torch.float64) == "local-window"


# ------------------------------------------------------------------ torch.compile


def test_the_launches_are_custom_ops_that_pass_opcheck():
    """The forward and backward launches are PyTorch custom operators
    (``attnlab::local_attend*``) with fake (shape) functions and an autograd formula:
    ``torch.library.opcheck`` runs them eagerly, on fake tensors and through AOT autograd
    and compares."""
    from attnlab.general import local_triton as lt

    q, k, v, c = (x.float().to(DEVICE).requires_grad_() for x in _inputs())
    mask = MASKS["key-padding"]().to(DEVICE).expand(B, NQ, NK)
    plan = lt._launch(3, 0.5, True, q.shape[-1], v.shape[-1], DEVICE == "cuda")
    tiles = [plan.block_m, plan.w_pad, plan.block_d, plan.block_dv, 4, 4]
    for m, gaussian, det in ((mask, True, False), (None, False, False), (mask, True, True)):
        args = (q, k, v, c, m, 3, 0.5, gaussian, tiles, det)
        result = torch.library.opcheck(lt._attend_op, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_eager_calls_skip_the_custom_op_and_give_its_outputs_and_gradients():
    """In eager mode ``_attend`` runs the kernels in a plain autograd Function (the custom
    operator's dispatch is host time a step does not need); its context, its weights and
    every gradient (the centres' included) equal the custom operator's."""
    from attnlab.general import local_triton as lt

    plan = lt._launch(3, 0.5, True, 12, 10, DEVICE == "cuda")
    tiles = [plan.block_m, plan.w_pad, plan.block_d, plan.block_dv, 4, 4]
    mask = MASKS["key-padding"]().to(DEVICE).expand(B, NQ, NK)

    def run(call):
        leaves = [x.float().to(DEVICE).requires_grad_() for x in _inputs()]
        return (*call(*leaves, mask, 3, 0.5, True, tiles, False), leaves)

    check_eager_front_matches_op(run, lt._attend, lt._attend_op)


def test_compiled_local_triton_path_has_no_graph_break_and_matches_eager(monkeypatch):
    """``torch.compile(Attention("general", "local-p"), fullgraph=True)`` on the
    ``local-triton`` path: one graph, no break, forward and every gradient equal to eager."""
    torch.manual_seed(0)
    attn = Attention("general", "local-p", d_q=12, d_k=12, D=3).to(DEVICE)
    forced = Plan("local-triton", "forced by the test")
    monkeypatch.setattr(attn, "_plan", lambda *a, **k: forced)  # the plan forward takes
    q, k, v, _ = (x.float().to(DEVICE) for x in _inputs(dv=12))
    mask = MASKS["key-padding"]().to(DEVICE)
    # 1e-4: on a GPU the backward adds the key, value and centre gradients with atomics in
    # an order that changes from launch to launch, and the centre's gradient (scaled by S)
    # passes those float32 roundings on to W_p and w_p; an H200 measured 7.5e-5 (4.5e-5
    # relative) in one element of w_p's gradient between compiled and eager
    check_compiled_matches_eager(attn, (q, k, v), mask, "local-triton", params=True, tol=1e-4)
