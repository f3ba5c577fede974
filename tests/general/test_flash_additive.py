"""Tests of the Triton kernels for additive and multi-dimensional attention
(attnlab.general.flash_additive).

Without a CUDA GPU they run on the CPU under Triton's interpreter, set up by
``triton_device`` (imported first, before anything imports triton; on a GPU machine the
same tests run on the GPU; if triton was imported earlier in the process without the
variable, the module skips with that reason instead of failing inside the
interpreter). The interpreter is
slow, so the sizes are tiny -- but never multiples of the 16-wide tiles, and always more
than one tile of queries and of keys, so that tile boundaries, the online softmax across
key tiles and the reductions across tiles are all exercised.

Every kernel is compared with the textbook broadcast formula written out below (in
float64, from the same input values), forward and every gradient. Tolerances: float32
``2e-5`` of the reference's scale; float16 ``5e-3``; bfloat16 ``3e-2`` (its 8-bit
significand: the weights are rounded to bfloat16 before the product with the values, as
on the explicit path).
"""

from __future__ import annotations

import pytest
import torch
from additive_references import ref_multi_dim
from torch import nn
from triton_device import (  # first: sets TRITON_INTERPRET without a GPU
    DEVICE,
    check_compiled_matches_eager,
    check_eager_front_matches_op,
)

from attnlab import masks
from attnlab.general.flash_additive import (
    flash_additive_attention,
    flash_multi_dim_attention,
)

ACTS = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "identity": lambda x: x,
}
TOL = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}
B, NQ, NK, DW, DV = 2, 19, 23, 5, 7  # 2 query tiles and 2 key tiles of 16


# ------------------------------------------------------------------- references


def ref_additive(q1, k2, w, v, mask, fn):
    s = fn(q1[:, :, None, :] + k2[:, None, :, :]) @ w  # [B, n_q, n_k]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    a = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows without any key: zero weights
    return a @ v, a


# -------------------------------------------------------------------- helpers


def _leaves(dtype=torch.float32, seed=0, b=B, nq=NQ, nk=NK, dw=DW, dv=DV):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
        return x.to(dtype).to(DEVICE).requires_grad_()

    return {
        "q1": r(b, nq, dw),
        "k2": r(b, nk, dw),
        "w": r(dw, scale=0.7),
        "W_d": r(dw, dv, scale=0.7),
        "b_d": r(dv),
        "v": r(b, nk, dv),
    }


def _mask(kind, b=B, nq=NQ, nk=NK, seed=1):
    """``(mask argument, causal flag, the full bool mask for the reference)``."""
    if kind == "none":
        return None, False, None
    if kind == "key-padding":  # the second batch element has 3 keys
        m = masks.from_lengths(torch.tensor([nk] + [3] * (b - 1)), nk)
    elif kind == "causal":
        m = masks.causal(nq, nk)
    elif kind == "causal-flag":
        return None, True, masks.causal(nq, nk).to(DEVICE).expand(b, nq, nk)
    else:  # arbitrary, with a fully masked query row and a key no query may attend
        g = torch.Generator().manual_seed(seed)
        m = torch.rand(b, nq, nk, generator=g) > 0.4
        m[0, 2] = False
        m[:, :, 4] = False
    m = m.to(DEVICE)
    return m, False, m.expand(b, nq, nk)


def _close(got, want, dtype, name):
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    assert got.shape == want.shape, name
    assert torch.isfinite(got).all(), f"{name} is not finite"
    scale = max(1.0, float(want.abs().max()) if want.numel() else 0.0)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    assert err <= TOL[dtype] * scale, f"{name}: max |diff| {err:.2e} > {TOL[dtype]} * {scale:.2f}"


def _upcast(t):
    return {k: x.detach().double().cpu().requires_grad_() for k, x in t.items()}


def _close_grads(names, got, want, dtype, *, same_dtype=False):
    """``_close`` for each gradient, named ``grad NAME``; ``same_dtype``: each one also
    has the inputs' dtype."""
    for name, a, b in zip(names, got, want, strict=True):
        if same_dtype:
            assert a.dtype == dtype, name
        _close(a, b, dtype, f"grad {name}")


def _check(kernel_out, ref_out, kernel_ins, ref_ins, names, dtype, seed=7):
    _close(kernel_out, ref_out, dtype, "context")
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(ref_out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(kernel_out, kernel_ins, go.to(kernel_out.dtype).to(DEVICE))
    want = torch.autograd.grad(ref_out, ref_ins, go.to(ref_out.device))
    _close_grads(names, got, want, dtype, same_dtype=True)


#: per kernel: the function, its reference and the names of its differentiable inputs
KERNELS = {
    "additive": (flash_additive_attention, ref_additive, ["q1", "k2", "w", "v"]),
    "multi": (flash_multi_dim_attention, ref_multi_dim, ["q1", "k2", "W_d", "b_d", "v"]),
}


def _run(kernel, act="tanh", kind="arbitrary", dtype=torch.float32, **kw):
    """The kernel against its reference: context and every input gradient."""
    fn, ref_fn, names = KERNELS[kernel]
    shape = {k: kw.pop(k) for k in ("b", "nq", "nk", "dw", "dv") if k in kw}
    t = _leaves(dtype, **shape)
    mask, causal, full = _mask(kind, *(t["q1"].shape[:2]), t["k2"].shape[1])
    ins = [t[n] for n in names]
    out, _ = fn(*ins, mask, act=act, causal=causal, **kw)
    assert out.dtype == dtype and out.device.type == DEVICE
    r = _upcast(t)
    ref_ins = [r[n] for n in names]
    ref, _ = ref_fn(*ref_ins, None if full is None else full.cpu(), ACTS[act])
    _check(out, ref, ins, ref_ins, names, dtype)


MASK_KINDS = ["none", "key-padding", "causal", "causal-flag", "arbitrary"]


# ------------------------------------------------------------- both kernels


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_each_activation(kernel, act):
    _run(kernel, act=act)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_each_mask(kernel, kind):
    _run(kernel, kind=kind)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_half_precision(kernel, dtype):
    _run(kernel, dtype=dtype)


# the fused backward (one kernel over key tiles, dq1 by atomics) computes the same
# gradients: every mask kind, half precision, tiles that do not divide the sizes
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_fused_backward_each_mask(kernel, kind):
    _run(kernel, kind=kind, fused_backward=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_fused_backward_half_precision(kernel, dtype):
    _run(kernel, dtype=dtype, act="sigmoid", fused_backward=True)


#: per kernel: rectangular tiles (32 queries by ``block_n`` keys) that do not divide the query
#: and key counts; the multi-dimensional kernel also with other d_w and d_v
ODD_TILES = {
    "additive": {"nq": 37, "nk": 21, "block_m": 32, "block_n": 16},
    "multi": {"nq": 37, "nk": 21, "dw": 17, "dv": 3, "block_m": 32, "block_n": 8},
}


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_odd_shapes_and_tiles(kernel):
    # one query tile and three key tiles (the last one 8 wide); d_w and d_v of 1
    _run(kernel, b=1, nq=5, nk=40, dw=1, dv=1)
    _run(kernel, **ODD_TILES[kernel])
    _run(kernel, fused_backward=True, **ODD_TILES[kernel])


#: per kernel: the masks by which causality reaches it (the additive kernel also takes a
#: materialised causal mask)
CAUSAL_KINDS = {"additive": ["causal-flag", "causal"], "multi": ["causal-flag"]}


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_causal_with_more_queries_than_keys(kernel):
    # the first n_q - n_k rows may attend nothing: zero context, zero gradients
    for kind in CAUSAL_KINDS[kernel]:
        _run(kernel, kind=kind, nq=20, nk=9)


# ----------------------------------------------------------------- additive


def test_additive_need_weights():
    t = _leaves()
    mask, _, full = _mask("arbitrary")
    out, a = flash_additive_attention(t["q1"], t["k2"], t["w"], t["v"], mask, need_weights=True)
    r = _upcast(t)
    _, ref_a = ref_additive(r["q1"], r["k2"], r["w"], r["v"], full.cpu(), torch.tanh)
    _close(a, ref_a, torch.float32, "weights")
    assert not a.requires_grad
    assert float(a[0, 2].abs().sum()) == 0.0  # the fully masked row
    _close(a @ t["v"], out, torch.float32, "weights @ v vs context")


# ------------------------------------------------------- multi-dimensional


def test_multi_need_weights_and_b_d():
    t = _leaves()
    mask, _, full = _mask("arbitrary")
    ins = [t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"]]
    out, a = flash_multi_dim_attention(*ins, mask, need_weights=True)
    r = _upcast(t)
    _, ref_a = ref_multi_dim(r["q1"], r["k2"], r["W_d"], r["b_d"], r["v"], full.cpu(), torch.tanh)
    _close(a, ref_a, torch.float32, "weights")
    assert a.shape == (B, NQ, NK, DV) and not a.requires_grad
    _close((a * t["v"][:, None]).sum(2), out, torch.float32, "weights * v vs context")
    # b_d is constant across keys: no effect on the output, and a zero gradient
    out2, _ = flash_multi_dim_attention(t["q1"], t["k2"], t["W_d"], None, t["v"], mask)
    _close(out2, out, torch.float32, "context without b_d")
    (gb,) = torch.autograd.grad(out.sum(), [t["b_d"]])
    assert float(gb.abs().max()) == 0.0


# ------------------------------------------------------ padding and masked rows


@pytest.mark.parametrize("kernel", ["additive", "multi"])
def test_padding_never_matters(kernel):
    """NaN in padded keys / values and in fully masked query rows changes nothing: the
    outputs and gradients equal those of clean inputs, fully masked rows are zero."""
    t = _leaves()
    mask, _, _ = _mask("arbitrary")
    clean = {k: x.detach().clone().requires_grad_() for k, x in t.items()}
    dirty = {k: x.detach().clone() for k, x in t.items()}
    dirty["k2"][:, 4] = float("nan")  # key 4: no query may attend it
    dirty["v"][:, 4] = float("inf")
    dirty["q1"][0, 2] = float("nan")  # row (0, 2) may attend nothing
    dirty = {k: x.requires_grad_() for k, x in dirty.items()}
    fn, _, names = KERNELS[kernel]
    outs, grads = [], []
    for leaves in (clean, dirty):
        out, _ = fn(*[leaves[n] for n in names], mask)
        outs.append(out)
        grads.append(torch.autograd.grad(out.sum(), [leaves[n] for n in names]))
    assert float(outs[1][0, 2].detach().abs().max()) == 0.0
    _close(outs[1], outs[0], torch.float32, "context")
    _close_grads(names, grads[1], grads[0], torch.float32)
    assert float(grads[1][0][0, 2].abs().max()) == 0.0  # dq1 of the masked row


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")  # the interpreter's max
def test_nan_in_an_attending_query_stays_in_its_row():
    t = _leaves()
    q1 = t["q1"].detach().clone()
    q1[1, 3] = float("nan")
    out, _ = flash_additive_attention(q1, t["k2"], t["w"], t["v"])
    out = out.detach()
    assert torch.isnan(out[1, 3]).all()
    rest = torch.ones(B, NQ, dtype=torch.bool)
    rest[1, 3] = False
    assert torch.isfinite(out[rest]).all()


# --------------------------------------------------------------------- errors


def test_errors_are_one_line_and_name_the_fix():
    t = _leaves()
    q1, k2, w, v = t["q1"], t["k2"], t["w"], t["v"]
    with pytest.raises(ValueError, match="act 'gelu' is not implemented"):
        flash_additive_attention(q1, k2, w, v, act="gelu")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        d = {k: x.detach().double() for k, x in t.items()}
        flash_additive_attention(d["q1"], d["k2"], d["w"], d["v"])
    with pytest.raises(ValueError, match="block_m must be a power of two"):
        flash_additive_attention(q1, k2, w, v, block_m=24)
    with pytest.raises(ValueError, match="w has shape"):
        flash_additive_attention(q1, k2, w[:-1], v)
    with pytest.raises(ValueError, match="mask has shape"):
        bad = torch.ones(3, NQ, NK, dtype=torch.bool, device=DEVICE)
        flash_additive_attention(q1, k2, w, v, bad)
    with pytest.raises(ValueError, match="v has shape"):
        flash_multi_dim_attention(q1, k2, t["W_d"], None, v[..., :-1])
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match=r"fast_tanh=True .* needs a CUDA GPU"):
            flash_additive_attention(q1, k2, w, v, fast_tanh=True)
    with pytest.raises(
        TypeError,
        match=r"^flash_additive_attention\(\) got an unexpected keyword argument 'casual'$",
    ):
        flash_additive_attention(q1, k2, w, v, casual=True)
    with pytest.raises(
        TypeError,
        match=r"^flash_multi_dim_attention\(\) got an unexpected keyword argument 'blockm'$",
    ):
        flash_multi_dim_attention(q1, k2, t["W_d"], None, v, blockm=32)


def test_cpu_tensors_need_the_interpreter(monkeypatch):
    t = _leaves()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
        flash_additive_attention(*(t[n].detach().cpu() for n in ("q1", "k2", "w", "v")))


def test_missing_triton_names_the_install_command(monkeypatch):
    from attnlab.general import flash_additive as fa

    monkeypatch.setattr(fa, "triton_available", lambda: False)
    t = _leaves()
    with pytest.raises(RuntimeError, match=r"pip install 'attnlab\[triton\]'"):
        flash_additive_attention(t["q1"], t["k2"], t["w"], t["v"])


def _second_derivatives(out, ins, seed=3):
    """``d/d ins`` of ``sum(r * d(out . g)/d q1)``: a gradient penalty's gradient."""
    g = torch.Generator().manual_seed(seed)
    go = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
    (gq,) = torch.autograd.grad(out, ins[0], go, create_graph=True)
    r = torch.randn(gq.shape, generator=g, dtype=torch.float64).to(gq)
    return torch.autograd.grad((gq * r).sum(), ins, allow_unused=True)


@pytest.mark.parametrize("act", ["tanh", "relu"])
@pytest.mark.parametrize("kind", ["arbitrary", "causal-flag"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_second_derivatives_match_the_formula(kernel, kind, act):
    """Under ``create_graph=True`` the kernels' backward differentiates the formula they
    compute (their own backward runs without a graph): second derivatives with respect to
    every input equal the float64 reference's, with a fully masked query row (arbitrary
    mask) and causal masking; ``b_d`` cancels (zero)."""
    fn, ref_fn, names = KERNELS[kernel]
    t = _leaves(b=2, nq=5, nk=6, dw=3, dv=4)
    mask, causal, full = _mask(kind, 2, 5, 6)
    ins = [t[n] for n in names]
    out, _ = fn(*ins, mask, act=act, causal=causal)
    got = _second_derivatives(out, ins)
    r = _upcast(t)
    ref_ins = [r[n] for n in names]
    ref, _ = ref_fn(*ref_ins, None if full is None else full.cpu(), ACTS[act])
    want = _second_derivatives(ref, ref_ins)
    for name, a, b in zip(names, got, want, strict=True):
        if name == "b_d":
            assert a is None or not a.any()
            continue
        assert b is not None, name
        assert a is not None, f"no second derivative for {name}"
        assert torch.isfinite(a).all(), name
        # the reference's softmax over a row of -inf has NaN derivatives (the kernels': 0)
        ok = torch.isfinite(b)
        _close(a.detach().cpu()[ok], b[ok], torch.float32, f"second derivative {name}")


def test_activation_modules_and_functions_are_accepted():
    t = _leaves(b=1, nq=5, nk=6)
    ins = [t["q1"], t["k2"], t["w"], t["v"]]
    by_name, _ = flash_additive_attention(*ins, act="sigmoid")
    by_module, _ = flash_additive_attention(*ins, act=nn.Sigmoid())
    by_function, _ = flash_additive_attention(*ins, act=torch.sigmoid)
    assert torch.equal(by_name, by_module) and torch.equal(by_name, by_function)


# -------------------------------------------------------- dispatch (Attention)


def _pair(dim="single", dtype=torch.float32, **options):
    from attnlab import Attention

    torch.manual_seed(0)
    kw = {"d_q": 3, "d_k": 4, "d_w": 5, **options}
    fast = Attention("additive", "soft", dim, path="triton", **kw).to(DEVICE, dtype)
    ref = Attention("additive", "soft", dim, path="explicit", **kw).to(DEVICE, dtype)
    ref.load_state_dict(fast.state_dict())
    return fast, ref


@pytest.mark.parametrize("dim", ["single", "multi"])
def test_attention_path_triton_matches_explicit(dim):
    """Forward, input gradients and every parameter gradient (W1, W2, b, w / W_d, b_d)."""
    fast, ref = _pair(dim, act="tanh")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, NQ, 3, generator=g).to(DEVICE)
    k = torch.randn(B, NK, 4, generator=g).to(DEVICE)
    mask, _, _ = _mask("arbitrary")
    outs = []
    for attn in (fast, ref):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        out = attn(qq, kk, mask=mask)
        go = torch.randn(out.context.shape, generator=torch.Generator().manual_seed(4))
        params = [p for _, p in sorted(attn.named_parameters())]
        grads = torch.autograd.grad(out.context, [qq, kk, *params], go.to(DEVICE))
        outs.append((out, grads))
    (o_fast, g_fast), (o_ref, g_ref) = outs
    assert o_fast.path == "triton" and o_ref.path == "explicit"
    _close(o_fast.context, o_ref.context, torch.float32, "context")
    names = ["q", "k", *(n for n, _ in sorted(fast.named_parameters()))]
    assert {"score.W1.weight", "score.W2.weight", "score.b", "score.w"} <= set(names)
    _close_grads(names, g_fast, g_ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_path_triton_half_precision(dtype):
    fast, ref = _pair("single", dtype)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, NQ, 3, generator=g).to(DEVICE, dtype)
    k = torch.randn(B, NK, 4, generator=g).to(DEVICE, dtype)
    a, b = fast(q, k).context, ref(q, k).context
    assert a.dtype == dtype
    _close(a, b, dtype, "context")


def test_attention_path_triton_need_weights():
    fast, ref = _pair("single")
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 6, 3, generator=g).to(DEVICE)
    k = torch.randn(1, 9, 4, generator=g).to(DEVICE)
    a = fast(q, k, need_weights=True)
    r = ref(q, k, need_weights=True)
    _close(a.weights, r.weights, torch.float32, "weights")
    assert not a.weights.requires_grad
    assert "second pass and carry no gradient" in fast.explain(need_weights=True)[1]
    # a single query [B, d_q] gives [B, d_v] and [B, n_k]
    single = fast(q[:, 0], k, need_weights=True)
    assert single.context.shape == (1, 4) and single.weights.shape == (1, 9)
    _close(single.context, r.context[:, 0], torch.float32, "single-query context")


def test_explain_auto_takes_triton_on_cuda_only():
    from attnlab import Attention

    single = Attention("additive", d_q=3, d_k=4)
    multi = Attention("additive", dim="multi", d_q=3, d_k=4)
    # the CPU default stays the threaded CPU kernels, even under the interpreter
    assert single.explain()[0] == "lean-additive"
    assert multi.explain()[0] == "lean-multi"
    path, reason = single.explain(device="cuda")
    assert path == "triton" and "Triton kernels" in reason
    assert multi.explain(device="cuda")[0] == "triton"
    # what the kernels do not cover keeps the chunked kernels
    assert single.explain(need_weights=True, device="cuda")[0] == "lean-additive"
    assert multi.explain(need_weights=True, device="cuda")[0] == "explicit"
    assert Attention("additive", "sparsemax", d_q=3, d_k=4).explain(device="cuda")[0] == (
        "lean-additive"
    )
    gelu = Attention("additive", d_q=3, d_k=4, act="gelu")
    assert gelu.explain(device="cuda")[0] == "lean-additive"
    dropout = Attention("additive", d_q=3, d_k=4, dropout=0.1)
    assert dropout.train().explain(device="cuda")[0] == "lean-additive"
    assert dropout.eval().explain(device="cuda")[0] == "triton"
    assert single.double().explain(device="cuda")[0] == "lean-additive"  # float64


def test_explain_auto_without_triton_installed(monkeypatch):
    from attnlab import Attention
    from attnlab.general import planner

    monkeypatch.setattr(planner, "triton_available", lambda: False)
    assert Attention("additive", d_q=3, d_k=4).explain(device="cuda")[0] == "lean-additive"


def test_path_triton_is_refused_where_the_kernels_do_not_apply():
    from attnlab import Attention
    from attnlab._checks import ConfigError

    with pytest.raises(ConfigError, match="additive score with soft alignment only"):
        Attention("scaled-dot", path="triton")
    with pytest.raises(ConfigError, match="additive score with soft alignment only"):
        Attention("additive", "sparsemax", d_q=3, d_k=4, path="triton")
    with pytest.raises(ConfigError, match="not 'gelu'"):
        Attention("additive", d_q=3, d_k=4, act="gelu", path="triton")
    with pytest.raises(ConfigError, match="no attention dropout"):
        Attention("additive", d_q=3, d_k=4, dropout=0.1, path="triton")
    with pytest.raises(ConfigError, match="'triton' for the Triton kernels"):
        Attention("additive", d_q=3, d_k=4, path="flash")


def test_path_triton_on_cpu_without_the_interpreter_is_one_line(monkeypatch):
    fast, _ = _pair("single")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k = torch.randn(1, 2, 3), torch.randn(1, 3, 4)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1") as err:
        fast.cpu()(q, k)
    assert "\n" not in str(err.value)


def test_triton_imported_before_the_interpreter_switch_is_one_clear_line():
    """Triton builds its own library for the GPU when imported without TRITON_INTERPRET;
    its interpreter then fails deep inside with "Cannot call @triton.jit'd outside of the
    scope of a kernel". The kernels say what to do instead."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import os
        os.environ.pop("TRITON_INTERPRET", None)
        import triton  # too early
        os.environ["TRITON_INTERPRET"] = "1"
        import torch
        from attnlab.general.flash_additive import flash_additive_attention
        x = torch.randn(1, 3, 2)
        try:
            flash_additive_attention(x, x, torch.randn(2), x)
        except RuntimeError as err:
            print("ERROR:", err)
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "ERROR: triton was imported before TRITON_INTERPRET=1 was set" in run.stdout


def test_attnlab_and_its_registry_do_not_import_triton():
    """Importing triton fixes its interpreter switch for the process (and takes a while):
    only the first kernel call may do it -- not ``import attnlab``, not the registry, which
    imports every module of attnlab.general."""
    import subprocess
    import sys

    code = (
        "import sys, attnlab; from attnlab import registry; registry.entries(); "
        "attnlab.Attention('additive', d_q=2, d_k=2).explain(device='cuda'); "
        "print('triton' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


# ----------------------------------------------------------- the GPU launch plan


def _gpu_tiles() -> list[tuple[str, int, int]]:
    """The distinct ``(kernel, BLOCK_M, BLOCK_N)`` of the GPU plans, d = 16 .. the widest
    the kernels take, in every product mode."""
    from attnlab.general import flash_additive as fa

    out = set()
    for multi, dots in ((False, (0, 1, 2)), (True, (0, 1))):
        for dot in dots:
            for width in (16, 64, 128, 256, 512, 1024):
                if width <= fa.TRITON_MAX_WIDTH[multi]:
                    bm, bn, _ = fa._tiles(multi, True, dot, width, width, None, None)
                    out.add(("multi" if multi else "additive", bm, bn))
    return sorted(out)


@pytest.mark.parametrize("kernel,block_m,block_n", _gpu_tiles())
def test_the_gpu_tiles_compute_the_formula(kernel, block_m, block_n):
    """The tiles a GPU launch gets (benchmarks/sm90_kernels.py picked them), here in the
    interpreter: a full tile and a partial one each way."""
    _run(kernel, nq=block_m + 3, nk=max(2 * block_n + 1, 9), block_m=block_m, block_n=block_n)


def test_the_gpu_plan_refuses_what_its_tiles_cannot_hold():
    from attnlab.general import flash_additive as fa

    K = fa._kernels(torch.device(DEVICE))
    q1 = torch.zeros(1, 2, 4)

    def plan(multi, d_w, d_v):
        sizes = (d_w, d_v, 3)
        return fa._plan(
            K, multi, q1, None, "tanh", sizes, False, None, False, None, None, on_gpu=True
        )

    with pytest.raises(ValueError, match=r"^flash_additive_attention: max\(d_w, d_v\) = 2048 "):
        plan(False, 2048, 64)
    with pytest.raises(ValueError, match=r"wider than the GPU kernels take \(128: the tiles"):
        plan(True, 64, 256)
    assert plan(False, 1000, 1024).block_m == 16  # the widest that fits: smaller tiles
    assert plan(True, 128, 128).block_n == 1
    assert fa.triton_fits(False, 1024, 33) and not fa.triton_fits(False, 1025, 1)
    # TF32 only where its tiles fit: the widest float32 tiles multiply exactly
    assert fa._dot_mode(False, True, False, True, fa.TF32_MAX_WIDTH) == 1
    assert fa._dot_mode(False, True, False, True, 2 * fa.TF32_MAX_WIDTH) == 0
    assert fa._dot_mode(False, False, False, True, 64) == 0  # and on a GPU only
    # the interpreter has no shared memory to run out of: any width runs there
    assert fa._plan(K, True, q1, None, "tanh", (4, 256, 3), False, None, False, None, None)


def test_explain_takes_the_chunked_kernels_past_the_gpu_widths():
    from attnlab import Attention

    assert Attention("additive", d_q=3, d_k=4, d_w=1024).explain(device="cuda")[0] == "triton"
    wide = Attention("additive", d_q=3, d_k=4, d_w=2048)
    assert wide.explain(device="cuda")[0] == "lean-additive"
    single = Attention("additive", d_q=3, d_k=4)
    assert single.plan(device="cuda", value_dim=1024).path == "triton"
    assert single.plan(device="cuda", value_dim=1025).path == "lean-additive"
    assert Attention("additive", dim="multi", d_q=3, d_k=128).explain(device="cuda")[0] == "triton"
    wide_multi = Attention("additive", dim="multi", d_q=3, d_k=129)
    assert wide_multi.explain(device="cuda")[0] == "lean-multi"


# ------------------------------------------------------------------ torch.compile


def test_the_launches_are_custom_ops_that_pass_opcheck():
    """The forward, backward and weights launches are PyTorch custom operators
    (``attnlab::flash_attend*``) with fake (shape) functions and an autograd formula:
    ``torch.library.opcheck`` runs them eagerly, on fake tensors and through AOT autograd
    and compares."""
    from attnlab.general import flash_additive as fa

    t = _leaves(b=2, nq=9, nk=7, dw=16, dv=8)
    mask = masks.from_lengths(torch.tensor([7, 4]), 7).to(DEVICE).expand(2, 9, 7)
    add = (False, "tanh", False, None, False, None, None, False)
    multi = (True, "sigmoid", True, None, False, None, None, True)
    cases = [
        (fa._attend_op, (t["q1"], t["k2"], t["w"], None, t["v"], mask, *add)),
        (fa._attend_op, (t["q1"], t["k2"], t["W_d"], t["b_d"], t["v"], None, *multi)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result
    _, lse = fa._attend_op(*cases[0][1])
    with torch.no_grad():
        args = (t["q1"], t["k2"], t["w"], lse, mask, torch.float32, 8, *add)
        result = torch.library.opcheck(fa._weights_op, args, test_utils=("test_schema",))
    assert set(result.values()) == {"SUCCESS"}, result


def test_eager_calls_skip_the_custom_ops_and_give_their_outputs_and_gradients():
    """In eager mode the kernels run in a plain autograd Function and the weights pass is
    called directly (the custom operators' dispatch is host time a step does not need);
    outputs, the weights and every gradient equal the custom operators'."""
    from attnlab.general import flash_additive as fa

    mask = masks.from_lengths(torch.tensor([7, 4]), 7).to(DEVICE).expand(2, 9, 7)
    add = (False, "tanh", False, None, False, None, None, False)
    multi = (True, "sigmoid", True, None, False, None, None, True)
    for names, m, flags in (
        (("q1", "k2", "w", None, "v"), mask, add),
        (("q1", "k2", "W_d", "b_d", "v"), None, multi),
    ):

        def run(call, names=names, m=m, flags=flags):
            t = _leaves(b=2, nq=9, nk=7, dw=16, dv=8)
            inputs = [None if n is None else t[n] for n in names]
            return (*call(*inputs, m, *flags), [x for x in inputs if x is not None])

        check_eager_front_matches_op(run, fa._attend, fa._attend_op)
    t = _leaves(b=2, nq=9, nk=7, dw=16, dv=8)
    with torch.no_grad():
        _, lse = fa._attend(t["q1"], t["k2"], t["w"], None, t["v"], mask, *add)
        args = (t["q1"], t["k2"], t["w"], lse, mask, torch.float32, 8, *add)
        weights = fa._weights_call(*args)
        torch.testing.assert_close(weights, fa._weights_op(*args), rtol=0, atol=0)
    assert weights.shape == (2, 9, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 9, device=DEVICE))


@pytest.mark.parametrize("dim", ["single", "multi"])
def test_compiled_triton_path_has_no_graph_break_and_matches_eager(dim):
    """``torch.compile(Attention(score="additive", path="triton"), fullgraph=True)``: the
    kernels are custom operators, so dynamo traces no launch code (on an H200 it broke the
    graph twice before). Forward and every input gradient equal to eager."""
    from attnlab import Attention

    torch.manual_seed(0)
    attn = Attention("additive", dim=dim, d_q=16, d_k=16, path="triton").to(DEVICE)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, n, 16, generator=g).to(DEVICE) for n in (19, 21, 21))
    mask = (torch.rand(2, 19, 21, generator=g) > 0.3).to(DEVICE)
    check_compiled_matches_eager(attn, (q, k, v), mask, "triton")
