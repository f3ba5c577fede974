"""CUDA tests (issue 12, item 6): every score x alignment x dimensionality of
``attnlab.Attention`` and the query / feature modules run forward + backward on CUDA in
float32 and bfloat16 and agree with the CPU float64 result.

Tolerances (against CPU float64, with the inputs and the parameters rounded to the tested
dtype, so that the reference computes exactly what the device was given):

* float32: ``rtol = 1e-4`` and ``atol = 1e-4 * max(1, max |ref|)`` (TF32 is switched off
  for the test). The absolute part scales with the tensor, as the bf16 bound does: a
  gradient summed over hundreds of positions carries float32 rounding of about
  ``1e-6 * max |ref|`` in every element, its small elements included (local-p's centre
  gradients reach 1,600 at ``n = 300``, their rounding 0.007);
* bfloat16: ``max |diff| <= 0.05 * max(1, max |ref|)`` for outputs and gradients. bf16 has
  an 8-bit significand (relative step 2^-8 = 0.004); the projections, scores and weighted
  sums each round once more, and gradients go through several such products.
* discrete choices (hard and reinforced alignments, LSH buckets) can flip between a bf16
  and a float64 run when two candidates are within bf16's rounding: in bf16 these cases
  check shapes and finiteness only.

Everything here is marked ``cuda`` and skipped without a CUDA device.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from test_attention import VALID, ids

from attnlab import Attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TESTS = Path(__file__).resolve().parents[1]
FP32_TOL = 1e-4
BF16_TOL = 0.05
DISCRETE_ALIGNS = {"hard", "reinforced"}
DISCRETE_CASES = {"reformer"}


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _load(rel: str, device: str) -> ModuleType:
    """A fresh copy of a test module whose tensor globals (masks) live on ``device``."""
    path = TESTS / rel
    name = f"_cuda_copy_{path.stem}_{device}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    if device != "cpu":
        for key, value in list(vars(mod).items()):
            if isinstance(value, torch.Tensor):
                setattr(mod, key, value.to(device))
        if hasattr(mod, "_cross_mask"):
            cpu_mask = mod._cross_mask.__globals__["KEY_MASK"].cpu()
            rows = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]
            mask = (cpu_mask & rows[:, :, None]).to(device)
            mod._cross_mask = lambda: mask
    return mod


def _run(module, call, inputs, device, dtype):
    """Outputs and gradients (inputs and parameters) of a fixed projection of the outputs."""
    module = copy.deepcopy(module).to(device=device, dtype=dtype)
    args = {}
    for name, x in inputs.items():
        x = x.to(device)
        if x.dtype.is_floating_point:
            x = x.to(dtype).detach().requires_grad_()
        args[name] = x
    out = call(module, **args)
    r = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    (out.double() * r.to(device)).sum().backward()
    grads = {n: a.grad for n, a in args.items() if a.dtype.is_floating_point}
    grads.update({f"param {n}": p.grad for n, p in module.named_parameters()})
    return out.detach().double().cpu(), {
        n: None if g is None else g.double().cpu() for n, g in grads.items()
    }


def _close(got, want, dtype, what):
    scale = max(1.0, want.abs().max().item()) if want.numel() else 1.0
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=FP32_TOL * scale, rtol=FP32_TOL, msg=what)
    else:
        err = (got - want).abs().max().item() if want.numel() else 0.0
        assert err <= BF16_TOL * scale, f"{what}: bf16 max error {err:.3g} (scale {scale:.3g})"


def _check(module, call, inputs, dtype, discrete=False, inputs_cuda=None, call_cuda=None):
    # the reference sees the inputs and the parameters rounded to the tested dtype, in
    # float64 on the CPU: with the parameters unrounded, a bf16 local-p centre S sigmoid(.)
    # at S = 299 moved by 0.11 positions from W_p's rounding alone, and the context by 0.71
    rounded = {
        n: x.to(dtype).double() if x.dtype.is_floating_point else x for n, x in inputs.items()
    }
    reference = copy.deepcopy(module).to(dtype)
    want, want_g = _run(reference, call, rounded, "cpu", torch.float64)
    got, got_g = _run(module, call_cuda or call, inputs_cuda or inputs, "cuda", dtype)
    assert got.shape == want.shape
    assert torch.isfinite(got).all() == torch.isfinite(want).all()
    if discrete and dtype == torch.bfloat16:
        for g in got_g.values():
            assert g is None or torch.isfinite(g).all()
        return
    _close(got, want, dtype, "output")
    for name, g in want_g.items():
        h = got_g[name]
        if g is None:
            assert h is None or not h.any(), name
            continue
        assert h is not None, name
        _close(h, g, dtype, f"gradient of {name}")


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("combo", VALID, ids=[ids(c) for c in VALID])
def test_every_attention_combination_on_cuda(combo, dtype):
    score, align, dim = combo
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=4, d_k=4).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "q": torch.randn(2, 3, 4, generator=g),
        "k": torch.randn(2, 6, 4, generator=g),
        "v": torch.randn(2, 6, 4, generator=g),
    }

    def call(m, q, k, v):
        return m(q, k, v).context

    _check(attn, call, inputs, dtype, discrete=align in DISCRETE_ALIGNS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_sdpa_on_cuda_keeps_a_bad_query_row_nan_on_every_kernel(dtype, bad, masked):
    """The sdpa path adds no NaN guard on CUDA (the CPU fused kernel needs one): each CUDA
    kernel that SDPA may pick itself gives a NaN context to a query row holding NaN or
    inf, and leaves the other rows finite."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    attn = Attention("scaled-dot").cuda()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 128, 64, generator=g).to("cuda", dtype) for _ in range(3))
    q[0, 5, 7] = bad
    mask = None
    if masked:  # padding of the second row's keys
        mask = (torch.arange(128, device="cuda") < torch.tensor([[128], [100]], device="cuda"))[
            :, None, :
        ]
    ran = []
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        try:
            with sdpa_kernel([backend]):
                res = attn(q, k, v, mask=mask)
        except RuntimeError as err:  # this kernel does not take this dtype or mask
            assert "kernel" in str(err).lower(), err
            continue
        ran.append(backend.name)
        assert res.path == "sdpa"
        out = res.context
        assert torch.isnan(out[0, 5]).all(), backend
        rest = torch.ones(2, 128, dtype=torch.bool, device="cuda")
        rest[0, 5] = False
        assert torch.isfinite(out[rest]).all(), backend
    assert "MATH" in ran and len(ran) >= 2, ran


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mha_causal_on_cuda_uses_is_causal_without_sync(dtype):
    from attnlab.query.multi_head import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2).eval()
    x = torch.randn(2, 9, 16)
    _check(mha, lambda m, x: m(x, causal=True).context, {"x": x}, dtype)
    m = copy.deepcopy(mha).to(device="cuda", dtype=dtype)
    xc = x.to("cuda", dtype)
    m(xc, causal=True)  # warm-up (kernel selection may synchronise once)
    torch.cuda.set_sync_debug_mode("error")
    try:
        m(xc, causal=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "align,gaussian,path",
    [
        ("local-m", False, "local-flex"),
        ("local-m", True, "local-triton"),
        ("local-p", True, "local-triton"),
    ],
    ids=str,
)
def test_local_paths_on_cuda(align, gaussian, path, dtype):
    # local-m on FlexAttention (d >= 16); local-p and the Gaussian window on the local
    # Triton kernels, their centres in float32 (a bf16 centre past 256 moves by 2 positions)
    torch.manual_seed(0)
    attn = Attention("general", align, d_q=16, d_k=16, D=3, gaussian=gaussian).eval()
    assert attn.explain(device="cuda")[0] == path
    g = torch.Generator().manual_seed(1)
    n = 300  # beyond bf16's exact integers
    inputs = {k: torch.randn(2, n, 16, generator=g) for k in ("q", "k", "v")}

    def call(m, q, k, v):
        out = m(q, k, v)
        assert out.path == (path if q.is_cuda else "local-window")
        return out.context

    _check(attn, call, inputs, dtype)


def test_local_flex_on_cuda_serves_twelve_lengths_compiled():
    """Batches of twelve lengths through local-m's FlexAttention path, as a model with
    unpadded batches sees them: every call stays on the compiled kernel (with an error at
    Dynamo's recompile limit, 8, instead of a fall-back to the unfused function, which a
    kernel per length reached at the ninth length) and equals the window path on the
    CPU."""
    torch.manual_seed(0)
    attn = Attention("general", "local-m", d_q=16, d_k=16, D=3, gaussian=False).eval()
    names = torch._dynamo.config.get_config_copy()
    fail = "fail_on_recompile_limit_hit"
    if fail not in names:
        pytest.skip("this torch cannot raise at Dynamo's recompile limit")
    g = torch.Generator().manual_seed(2)
    with torch._dynamo.config.patch({fail: True}), torch.no_grad():
        for n in (40, 64, 100, 127, 128, 129, 200, 255, 300, 333, 512, 700):
            q, k, v = (torch.randn(2, n, 16, generator=g) for _ in range(3))
            out = attn.cuda()(q.cuda(), k.cuda(), v.cuda())
            assert out.path == "local-flex"
            want = attn.cpu()(q, k, v).context
            torch.testing.assert_close(out.context.cpu(), want, atol=1e-4, rtol=1e-4)


def _query_cases():
    return sorted(_load("query/test_query_padding.py", "cpu").SELF) + [
        f"cross:{c}" for c in sorted(_load("query/test_query_padding.py", "cpu").CROSS)
    ]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", _query_cases() if torch.cuda.is_available() else ["none"])
def test_query_modules_on_cuda(case, dtype):
    cpu = _load("query/test_query_padding.py", "cpu")
    dev = _load("query/test_query_padding.py", "cuda")
    table, key = ("CROSS", case[6:]) if case.startswith("cross:") else ("SELF", case)
    torch.manual_seed(0)
    module, call, inputs, _ = getattr(cpu, table)[key]()
    torch.manual_seed(0)
    _, call_cuda, _, _ = getattr(dev, table)[key]()
    _check(module.eval(), call, inputs, dtype, discrete=key in DISCRETE_CASES, call_cuda=call_cuda)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(_load("query/test_query_padding.py", "cpu").INTERNAL))
def test_internal_query_modules_on_cuda(case, dtype):
    cpu = _load("query/test_query_padding.py", "cpu")
    dev = _load("query/test_query_padding.py", "cuda")
    torch.manual_seed(0)
    module, call, inputs, _ = cpu.INTERNAL[case]()
    torch.manual_seed(0)
    _, call_cuda, _, _ = dev.INTERNAL[case]()
    _check(module.eval(), call, inputs, dtype, call_cuda=call_cuda)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "case", ["alternating", "interactive", "parallel-bilinear", "multi-grained"]
)
def test_co_attention_modules_on_cuda(case, dtype):
    cpu = _load("feature/test_feature_padding.py", "cpu")
    dev = _load("feature/test_feature_padding.py", "cuda")
    torch.manual_seed(0)
    module = cpu.CO[case]().eval()
    d1 = 6 if case in ("alternating", "interactive", "parallel-bilinear") else 5
    d2 = 4 if d1 == 6 else 5
    inputs = {"f1": cpu._x(1, 5, d1), "f2": cpu._x(2, 4, d2)}
    _check(module, cpu._co_call, inputs, dtype, call_cuda=dev._co_call)


@pytest.mark.parametrize(
    ("score", "align", "dim", "kw"),
    [
        ("additive", "soft", "single", {}),  # triton
        ("additive", "soft", "multi", {}),  # triton (multi-dimensional)
        ("general", "local-m", "single", {"D": 2}),  # local-triton
        ("general", "local-m", "single", {"D": 2, "gaussian": False}),  # local-flex
    ],
    ids=["additive", "additive-multi", "local-m", "local-m-flex"],
)
def test_per_sample_gradients_on_cuda_take_the_formula(score, align, dim, kw):
    """Under torch.func the GPU kernels' paths (Triton, FlexAttention) take the formula
    they stand for: per-sample gradients (vmap(grad)) equal one backward pass per sample,
    float32, with a ragged key mask. (On the CPU the forced-path test of test_attention.py
    covers the switch; this runs the real planner and kernels.)"""
    torch.manual_seed(0)
    d = 16
    attn = Attention(score, align, dim, d_q=d, d_k=d, **kw).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(3, 4, d, device="cuda", generator=g)
    k = torch.randn(3, 6, d, device="cuda", generator=g)
    mask = torch.ones(3, 4, 6, dtype=torch.bool, device="cuda")
    mask[1, :, 4:] = False
    eager_path = attn(q, k, mask=mask).path
    params = {n: p.detach() for n, p in attn.named_parameters()}

    def loss(p, qi, ki, mi):
        return (
            torch.func.functional_call(attn, p, (qi[None], ki[None]), {"mask": mi[None]})
            .context.pow(2)
            .sum()
        )

    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0, 0))(params, q, k, mask)
    for b in range(3):
        attn.zero_grad(set_to_none=True)
        loss(dict(attn.named_parameters()), q[b], k[b], mask[b]).backward()
        for name, p in attn.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(grads[name][b], p.grad, atol=FP32_TOL, rtol=FP32_TOL)
    print(f"{score}/{align}/{dim}: eager path {eager_path}")
