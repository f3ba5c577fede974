"""The execution planner (issue 12): one decision for Attention, functional.attend and
MultiHeadAttention, per device; the SDPA path on the 4-D layout, with is_causal and
without host synchronisation; local-m / local-p on FlexAttention's window."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import attnlab
from attnlab import Attention, masks
from attnlab.general import flash_additive, planner
from attnlab.general.local import local_window_attend
from attnlab.general.local_flex import local_flex_attend
from attnlab.general.planner import Plan, plan_attention, score_class_capabilities
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.registry import get

DOT_SCORES = ["dot", "scaled-dot", "general", "biased-general", "cosine"]


class _NoHostSync(TorchDispatchMode):
    """Raises on any op that copies a tensor value to the host (``.item()``,
    ``bool(t)``, ``float(t)``, ``t.tolist()``, ``torch.nonzero``...)."""

    SYNC_OPS: ClassVar[set[str]] = {
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::nonzero",
        "aten::equal",
    }

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func._schema.name in self.SYNC_OPS:
            raise AssertionError(f"host synchronisation: {func._schema.name}")
        return func(*args, **(kwargs or {}))


def test_the_sync_detector_detects_a_sync():
    with pytest.raises(AssertionError, match="host synchronisation"), _NoHostSync():
        bool(torch.ones(2).all())


class _Spy:
    """Records the arguments of F.scaled_dot_product_attention and calls it."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.real = F.scaled_dot_product_attention

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.real(*args, **kwargs)


@pytest.fixture
def sdpa_spy(monkeypatch):
    spy = _Spy()
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return spy


def _qkv(B=2, n_q=5, n_k=7, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, n, d, generator=g) for n in (n_q, n_k, n_k))


# ------------------------------------------------------------------ SDPA path


@pytest.fixture
def four_d(monkeypatch):
    """The layout decision of a CUDA call (4-D), on CPU tensors."""
    from attnlab.general import sdpa

    monkeypatch.setattr(sdpa, "sdpa_four_d", lambda device, dtype=None: True)


def test_the_3d_layout_is_kept_for_half_precision_on_the_cpu_only():
    """4-D on CUDA in every dtype and on the CPU in float32 and float64 (the fused CPU
    kernel, faster than the 3-D call's math kernel); 3-D on the CPU in half precision and
    under CPU autocast (the math kernel's half-precision backward is the accurate one)."""
    for dtype in (None, torch.float32, torch.float16, torch.bfloat16, torch.float64):
        assert planner.sdpa_four_d("cuda", dtype)
    assert planner.sdpa_four_d("cpu") and planner.sdpa_four_d("cpu", torch.float64)
    assert planner.sdpa_four_d(torch.device("cpu"), torch.float32)
    assert not planner.sdpa_four_d("cpu", torch.float16)
    assert not planner.sdpa_four_d("cpu", torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not planner.sdpa_four_d("cpu", torch.float32)
        assert "[B, n, d] (the CPU math kernel" in Attention("scaled-dot").explain()[1]
    assert "[B, 1, n, d] (the fused CPU kernel)" in Attention("scaled-dot").explain()[1]


@pytest.mark.parametrize(
    ("dtype", "dims"), [(torch.float32, 4), (torch.float64, 4), (torch.bfloat16, 3)]
)
def test_a_cpu_call_takes_the_layout_of_its_dtype_and_matches_explicit(dtype, dims, sdpa_spy):
    """Without a patched layout: a float32 / float64 call on the CPU reaches SDPA as
    ``[B, 1, n, d]`` (the fused CPU kernel), a bfloat16 one as ``[B, n, d]``; the context,
    the weights and the gradients equal the explicit path's (fp32: 1e-5; fp64: 1e-10;
    bf16: 2e-2)."""
    tol = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 2e-2}[dtype]
    torch.manual_seed(0)
    fast = Attention("scaled-dot", d_q=4, d_k=4).to(dtype)
    slow = Attention("scaled-dot", d_q=4, d_k=4, path="explicit").to(dtype)
    slow.load_state_dict(fast.state_dict())
    mask = torch.rand(2, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 1] = False  # a fully masked row
    for m in (None, mask):
        grads = []
        for attn in (fast, slow):
            q, k, v = (t.to(dtype).requires_grad_() for t in _qkv())
            out = attn(q, k, v, mask=m, need_weights=True)
            out.context.pow(2).sum().backward()
            grads.append((out.context, out.weights, q.grad, k.grad, v.grad))
        assert sdpa_spy.calls[-1][0][0].dim() == dims
        for got, want in zip(*grads, strict=True):
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_an_exported_call_takes_the_4d_layout_on_the_cpu_too():
    """Under ``torch.export`` (what ``torch.onnx.export`` traces: ONNX translates only a
    4-D SDPA) the CPU call is 4-D as well; the program gives the eager outputs."""
    torch.manual_seed(0)
    attn = Attention("scaled-dot", d_q=4, d_k=4).eval()
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])[:, None, :]
    program = torch.export.export(attn, (q, k), {"mask": mask}, strict=False)
    sdpa_nodes = [
        node
        for node in program.graph.nodes
        if node.target is torch.ops.aten.scaled_dot_product_attention.default
    ]
    assert sdpa_nodes, "the exported call does not run on SDPA"
    assert all(node.args[0].meta["val"].dim() == 4 for node in sdpa_nodes)
    with torch.no_grad():
        got = program.module()(q, k, mask=mask).context
    torch.testing.assert_close(got, attn(q, k, mask=mask).context)


@pytest.mark.parametrize("score", DOT_SCORES)
def test_attention_sdpa_runs_4d_and_matches_explicit(score, sdpa_spy, four_d):
    torch.manual_seed(0)
    fast = Attention(score, d_q=4, d_k=4).eval()
    slow = Attention(score, d_q=4, d_k=4, path="explicit").eval()
    slow.load_state_dict(fast.state_dict())
    q, k, v = _qkv()
    mask = torch.rand(2, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.4
    mask[0, 1] = False
    for m in (None, mask):
        out = fast(q, k, v, mask=m, need_weights=True)
        assert out.path == "sdpa"
        args = sdpa_spy.calls[-1][0]
        assert all(t.dim() == 4 and t.shape[1] == 1 for t in args[:3])
        want = slow(q, k, v, mask=m, need_weights=True)
        torch.testing.assert_close(out.context, want.context, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.weights, want.weights, atol=1e-5, rtol=1e-5)


def test_4d_sdpa_keeps_a_nan_query_row_nan(four_d):
    # the CPU flash kernel returns 0 for a NaN query row; the contract is NaN
    attn = Attention("scaled-dot", d_q=4, d_k=4)
    q, k, v = _qkv()
    q[0, 1, 2] = float("nan")
    out = attn(q, k, v).context
    assert torch.isnan(out[0, 1]).all()
    assert torch.isfinite(out[0, [0, 2, 3, 4]]).all() and torch.isfinite(out[1]).all()


@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_paths_do_not_synchronise_with_the_device(masked, four_d):
    torch.manual_seed(0)
    attn = Attention("scaled-dot", d_q=4, d_k=4)
    q, k, v = _qkv()
    mask = None
    if masked:  # padding and a fully masked query row
        mask = (torch.arange(7) < torch.tensor([[7], [3]]))[:, None, :].expand(2, 5, 7).clone()
        mask[0, 2] = False
    with _NoHostSync():
        out = attn(q, k, v, mask=mask)
    assert out.path == "sdpa"
    if masked:  # the guarantee stays: a zero context, never NaN
        assert torch.equal(out.context[0, 2], torch.zeros(4))
        assert torch.isfinite(out.context).all()


def test_fully_masked_row_backward_is_zero_without_sync(four_d):
    torch.manual_seed(0)
    attn = Attention("scaled-dot", d_q=4, d_k=4)
    q, k, v = (t.requires_grad_() for t in _qkv())
    mask = torch.ones(2, 5, 7, dtype=torch.bool)
    mask[1, 0] = False
    with _NoHostSync():
        out = attn(q, k, v, mask=mask)
        out.context.sum().backward()
    assert torch.equal(out.context[1, 0], torch.zeros(4))
    assert torch.equal(q.grad[1, 0], torch.zeros(4))


def test_mha_causal_uses_is_causal_and_no_mask(sdpa_spy):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 6, 8)
    with _NoHostSync():
        out = mha(x, causal=True)
    kwargs = sdpa_spy.calls[-1][1]
    assert kwargs["is_causal"] is True and kwargs["attn_mask"] is None
    ref = mha(x, mask=masks.causal(6))  # the materialised mask
    assert sdpa_spy.calls[-1][1]["is_causal"] is False
    torch.testing.assert_close(out.context, ref.context, atol=1e-6, rtol=1e-6)
    assert "is_causal=True" in mha.explain(causal=True)[1]


@pytest.mark.parametrize(
    "kw",
    [
        {"mask": torch.ones(2, 6, 6, dtype=torch.bool).tril()},  # another mask
        {"need_weights": True},  # the weights need the mask
    ],
)
def test_mha_causal_falls_back_to_the_mask(kw, sdpa_spy):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 6, 8)
    out = mha(x, causal=True, **kw)
    assert sdpa_spy.calls[-1][1]["is_causal"] is False
    ref = mha(x, mask=masks.causal(6) & kw.get("mask", torch.tensor(True)))
    torch.testing.assert_close(out.context, ref.context, atol=1e-6, rtol=1e-6)


def test_mha_causal_cross_attention_keeps_the_mask(sdpa_spy):
    # attnlab's causal mask is bottom-right aligned; SDPA's is_causal is top-left: they
    # agree only for n_q == n_k
    mha = MultiHeadAttention(8, 2).eval()
    out = mha(torch.randn(1, 3, 8), torch.randn(1, 5, 8), causal=True)
    assert sdpa_spy.calls[-1][1]["is_causal"] is False
    assert sdpa_spy.calls[-1][1]["attn_mask"] is not None
    assert out.path == "sdpa"


# ------------------------------------------------------------------ one planner


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "general", "cosine", "additive"])
def test_functional_attend_follows_the_planner(name):
    cls = get("score", name).cls
    want = plan_attention(score_class_capabilities(cls), n_k=5).path
    q, k, v = _qkv(n_k=5)
    params = {}
    if name == "general":
        params = {"W": torch.randn(4, 4)}
    if name == "additive":
        params = {"W1": torch.randn(3, 4), "W2": torch.randn(3, 4), "w": torch.randn(3)}
    assert attnlab.functional.attend(q, k, v, score=name, **params).path == want


def test_explain_is_per_device():
    local_dot = Attention("general", "local-m", d_q=4, d_k=4, D=2)
    assert local_dot.explain()[0] == "local-window"
    want = "local-flex" if planner.flex_available() else "local-window"
    assert local_dot.explain(device="cuda")[0] == want
    assert local_dot.explain(need_weights=True, device="cuda")[0] == "local-window"
    # FlexAttention's CUDA kernels take keys / values of at least 16 features; narrower
    # calls take the local Triton kernels where triton is installed
    kernels = "local-triton" if planner.triton_available() else "local-window"
    assert local_dot.plan(device="cuda", head_dim=8).path == kernels
    assert local_dot.plan(device="cuda", head_dim=16).path == want
    # the additive score has no dot form: FlexAttention cannot compute it
    local_add = Attention("additive", "local-p", d_q=4, d_k=4, D=2)
    assert local_add.explain(device="cuda")[0] == "local-window"
    # local-p's learned centres and any Gaussian factor take the local Triton kernels on
    # CUDA (FlexAttention would need a slow second score_mod pass, docs/benchmarks.md)
    for align, kw in (("local-p", {}), ("local-m", {"gaussian": True})):
        local = Attention("general", align, d_q=16, d_k=16, D=2, **kw)
        assert local.plan(device="cuda", head_dim=16).path == kernels, align
        assert local.plan(device="cuda", need_weights=True).path == "local-window", align
    sd = Attention("scaled-dot")
    assert "flash" in sd.explain(device="cuda")[1] and "fused CPU" in sd.explain()[1]


def test_mha_fuses_when_every_head_plans_sdpa():
    assert MultiHeadAttention(8, 2, score="general").explain()[0] == "sdpa"
    assert MultiHeadAttention(8, 2, score="additive", d_w=4).explain()[0] == (
        "per-head:lean-additive"
    )


def test_plan_unpacks_as_a_pair():
    path, reason = Plan("sdpa", "why")
    assert (path, reason) == ("sdpa", "why")


# ------------------------------------------------------------------ FlexAttention window


def test_local_flex_matches_the_window_path_on_cpu():
    # FlexAttention's unfused reference runs on CPU (forward only: no CPU backward)
    g = torch.Generator().manual_seed(3)
    B, n, d, D = 2, 24, 4, 2
    q, k = torch.randn(B, n, d, generator=g), torch.randn(B, n, d, generator=g)
    v = torch.randn(B, n, d, generator=g)
    centers = torch.rand(B, n, generator=g) * (n + 4) - 2  # some windows off the ends
    mask = torch.rand(B, 1, n, generator=g) > 0.3
    mask[1, 0, :] = False  # every window of batch 1 is empty
    scale = 0.5

    def score(qq, kk):
        return scale * qq @ kk.transpose(-1, -2)

    ref, _, _ = local_window_attend(score, q, k, v, centers, D, mask, False)
    with torch.no_grad():
        out = local_flex_attend(q, k, v, scale, centers, D, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[1], torch.zeros(n, d))


def test_attention_local_flex_path_matches_local_window(monkeypatch):
    torch.manual_seed(0)
    attn = Attention("general", "local-m", d_q=4, d_k=4, D=2).eval()
    q, k, v = _qkv(n_q=9, n_k=9)
    with torch.no_grad():
        ref = attn(q, k, v)
        assert ref.path == "local-window"
        monkeypatch.setattr(
            Attention, "_plan", lambda self, *a, **kw: Plan("local-flex", "forced for the test")
        )
        out = attn(q, k, v)
    assert out.path == "local-flex"
    torch.testing.assert_close(out.context, ref.context, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.extras["centers"], ref.extras["centers"])


def test_local_flex_static_window_is_the_position_window():
    # local-m's default window |i - l| <= D: a cached block mask, same result as the
    # per-call one built from the centres
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 12, 4, generator=g)
    v = torch.randn(2, 12, 3, generator=g)
    centers = torch.arange(5.0).expand(2, 5)
    with torch.no_grad():
        dynamic = local_flex_attend(q, k, v, 0.5, centers, 2)
        static = local_flex_attend(q, k, v, 0.5, centers, 2, static_window=True)
        again = local_flex_attend(q, k, v, 0.5, centers, 2, static_window=True)  # cached
    torch.testing.assert_close(static, dynamic, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(again, static, atol=0, rtol=0)
    # more queries than keys + D: the last windows are empty and get a zero context
    q9 = torch.randn(2, 9, 4, generator=g)
    k3, v3 = k[:, :3], v[:, :3]
    with torch.no_grad():
        static = local_flex_attend(
            q9, k3, v3, 0.5, torch.arange(9.0).expand(2, 9), 2, static_window=True
        )
        dynamic = local_flex_attend(q9, k3, v3, 0.5, torch.arange(9.0).expand(2, 9), 2)
    torch.testing.assert_close(static, dynamic, atol=1e-6, rtol=1e-6)
    assert torch.equal(static[:, 5:], torch.zeros(2, 4, 3)) and static[:, :5].abs().sum() > 0


def test_availability_look_ups_are_constants_to_torch_compile():
    """The planner asks whether triton / FlexAttention are installed on every CUDA call;
    the look-up (importlib's find_spec, an import) cannot be traced, so it is a constant
    to dynamo: no graph break (on an H200, compiling Attention("additive") broke there)."""

    def f(x):
        if planner.triton_available() and planner.flex_available():
            return x * 2
        return x * 3

    explained = torch._dynamo.explain(f)(torch.ones(3))
    assert explained.graph_break_count == 0
    assert planner.triton_available() is flash_additive.triton_available()


def test_availability_is_looked_up_once_at_import(monkeypatch):
    # a call never looks again (dynamo in torch 2.11 could not trace the look-up)
    import importlib.util

    def no_look_up(*a, **kw):
        raise AssertionError("looked up at call time")

    monkeypatch.setattr(importlib.util, "find_spec", no_look_up)
    assert planner.triton_available() in (True, False)
    assert planner.flex_available() in (True, False)


def test_plan_attention_refuses_bad_settings() -> None:
    """An unknown mode planned the auto path, a truthy string switched need_weights or
    dropout on, and sizes were taken as they came."""
    caps = score_class_capabilities(get("score", "additive").cls)
    with pytest.raises(attnlab.ConfigError, match=r"^mode must be one of 'auto'"):
        plan_attention(caps, mode="bogus")
    with pytest.raises(TypeError, match=r"^need_weights must be a bool, got 'no'$"):
        plan_attention(caps, need_weights="no")
    with pytest.raises(TypeError, match=r"^dropout must be a bool, got 1$"):
        plan_attention(caps, dropout=1)
    with pytest.raises(ValueError, match=r"^n_k must be an int >= 0 or None, got -1$"):
        plan_attention(caps, n_k=-1)
    with pytest.raises(ValueError, match=r"^head_dim must be an int >= 0 or None, got True$"):
        plan_attention(caps, head_dim=True)
    # torch's own error listed two dozen backends
    bad_name = r"^device 'bogus' is not a device name \(try 'cpu', 'cuda' or 'cuda:0'\)$"
    with pytest.raises(ValueError, match=bad_name):
        plan_attention(caps, device="bogus")
    with pytest.raises(ValueError, match=bad_name):
        Attention("scaled-dot").explain(device="bogus")
    with pytest.raises(TypeError, match=r"^device must be a torch.device or its name, got int$"):
        Attention("scaled-dot").plan(device=0)
    assert plan_attention(caps, device=torch.device("cpu")).path == "lean-additive"
