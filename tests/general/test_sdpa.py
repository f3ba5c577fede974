"""Tests for attnlab.general.sdpa: the fused path really runs PyTorch's
scaled_dot_product_attention, agrees with an explicit softmax computed by loops, and
handles fully masked rows (zero context, zero weights, zero gradients)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab.general.sdpa import sdpa_attend


def _spy(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs | {"_args": args})
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


def _naive(q, k, v, scale, mask):
    """softmax(scale q k^T) v by loops over every leading index; rows with no allowed key
    give zeros."""
    lead = q.shape[:-2]
    qf = q.reshape(-1, *q.shape[-2:]).tolist()
    kf = k.reshape(-1, *k.shape[-2:]).tolist()
    vf = v.reshape(-1, *v.shape[-2:]).tolist()
    mf = None
    if mask is not None:
        mf = (
            torch.broadcast_to(mask, (*lead, q.shape[-2], k.shape[-2]))
            .reshape(-1, q.shape[-2], k.shape[-2])
            .tolist()
        )
    ctx, wts = [], []
    for n in range(len(qf)):
        cn, wn = [], []
        for i in range(len(qf[n])):
            allowed = [True] * len(kf[n]) if mf is None else mf[n][i]
            e = [
                scale * sum(a * b for a, b in zip(qf[n][i], kf[n][l], strict=True))
                for l in range(len(kf[n]))
            ]
            m = max((e[l] for l in range(len(e)) if allowed[l]), default=0.0)
            ex = [math.exp(e[l] - m) if allowed[l] else 0.0 for l in range(len(e))]
            z = sum(ex)
            a = [x / z if z else 0.0 for x in ex]
            wn.append(a)
            cn.append(
                [sum(a[l] * vf[n][l][f] for l in range(len(a))) for f in range(len(vf[n][0]))]
            )
        ctx.append(cn)
        wts.append(wn)
    c = torch.tensor(ctx, dtype=q.dtype).reshape(*lead, q.shape[-2], v.shape[-1])
    w = torch.tensor(wts, dtype=q.dtype).reshape(*lead, q.shape[-2], k.shape[-2])
    return c, w


def _data(shape_q=(2, 3, 4), n_k=5, d_v=3, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=g, dtype=dtype)
    k = torch.randn(*shape_q[:-2], n_k, shape_q[-1], generator=g, dtype=dtype)
    v = torch.randn(*shape_q[:-2], n_k, d_v, generator=g, dtype=dtype)
    return q, k, v


def _mask_with_empty_row():
    m = torch.ones(2, 3, 5, dtype=torch.bool)
    m[0, :, 3:] = False  # key padding
    m[1, 1] = False  # a query with nothing to attend to
    m[1, 2, 0] = False
    return m


@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / math.sqrt(4)])
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_attend_matches_loops(scale, masked):
    q, k, v = _data()
    mask = _mask_with_empty_row() if masked else None
    c, w = sdpa_attend(q, k, v, scale, mask, need_weights=True)
    want_c, want_w = _naive(q, k, v, scale, mask)
    torch.testing.assert_close(c, want_c, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


def test_sdpa_attend_broadcast_masks_and_heads():
    q, k, v = _data(shape_q=(2, 2, 3, 4))  # [B, H, n_q, d]
    masks = [
        torch.tensor([True, False, True, True, False]),  # [n_k]
        attnlab.masks.causal(3, 5),  # [n_q, n_k]
        torch.rand(2, 1, 1, 5, generator=torch.Generator().manual_seed(3)) > 0.4,  # per batch
    ]
    for mask in masks:
        c, w = sdpa_attend(q, k, v, 0.7, mask, need_weights=True)
        want_c, want_w = _naive(q, k, v, 0.7, mask)
        torch.testing.assert_close(c, want_c, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


def test_fully_masked_rows_zero_forward_and_backward():
    q, k, v = _data()
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    mask = _mask_with_empty_row()
    c, w = sdpa_attend(q, k, v, 0.5, mask, need_weights=True)
    assert torch.equal(c[1, 1], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(w[1, 1], torch.zeros(5, dtype=torch.float64))
    (c.sum() + (w * torch.arange(5.0, dtype=torch.float64)).sum()).backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[1, 1], torch.zeros(4, dtype=torch.float64))
    # masked keys receive no gradient from any query of their batch element
    assert torch.equal(k.grad[0, 3:], torch.zeros(2, 4, dtype=torch.float64))
    assert torch.equal(v.grad[0, 3:], torch.zeros(2, 3, dtype=torch.float64))


def test_fully_masked_row_stays_zero_when_a_key_holds_nan():
    # the row is opened for the kernel; the NaN it then sees must not come back
    q, k, v = _data()
    k[1, 4, 0] = float("nan")
    mask = _mask_with_empty_row()
    mask[1, :, 4] = False  # the NaN key is masked for every query of batch element 1
    c, _ = sdpa_attend(q, k, v, 0.5, mask)
    assert torch.equal(c[1, 1], torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_query_makes_its_row_nan_and_only_it(bad):
    """PyTorch's CPU kernel returns 0 for a query row holding NaN or inf; sdpa_attend
    makes it NaN, as the explicit formula does, and leaves the other rows (and, where every
    query is finite, the kernel's whole result) untouched."""
    q, k, v = _data()
    clean, _ = sdpa_attend(q, k, v, 0.5)
    assert torch.equal(clean, F.scaled_dot_product_attention(q, k, v, scale=0.5))
    q[1, 2, 0] = bad
    c, _ = sdpa_attend(q, k, v, 0.5)
    assert torch.isnan(c[1, 2]).all()
    rest = torch.ones(c.shape[:2], dtype=torch.bool)
    rest[1, 2] = False
    assert torch.equal(c[rest], clean[rest])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_finite_half_queries_whose_sum_overflows_stay_finite(dtype):
    """The term that keeps a non-finite query row NaN must not overflow: finite
    half-precision queries whose plain sum overflows give the kernel's finite result (a
    ``q.sum() * 0`` shortcut would turn those rows NaN)."""
    g = torch.Generator().manual_seed(0)
    big = torch.finfo(dtype).max / 4
    q = torch.full((2, 3, 8), big, dtype=dtype)  # every entry finite, their sum is not
    assert not q.sum().isfinite()
    k, v = (
        torch.randn(2, 5, 8, generator=g, dtype=dtype),
        torch.randn(2, 5, 4, generator=g, dtype=dtype),
    )
    c, _ = sdpa_attend(q, k, v, 1e-6)
    assert torch.isfinite(c).all()
    torch.testing.assert_close(c, F.scaled_dot_product_attention(q, k, v, scale=1e-6))


def test_gradcheck_with_fully_masked_rows():
    q, k, v = _data(shape_q=(2, 3, 2), n_k=4, d_v=2)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 1] = False
    mask[1, :, 2:] = False
    for t in (q, k, v):
        t.requires_grad_()

    def f(q, k, v):
        c, w = sdpa_attend(q, k, v, 0.8, mask, need_weights=True)
        return c, w

    assert torch.autograd.gradcheck(f, (q, k, v))


def test_need_weights_does_not_change_the_context():
    q, k, v = _data(dtype=torch.float32)
    mask = _mask_with_empty_row()
    c0, w0 = sdpa_attend(q, k, v, 0.5, mask, need_weights=False)
    c1, w1 = sdpa_attend(q, k, v, 0.5, mask, need_weights=True)
    assert w0 is None
    assert w1.shape == (2, 3, 5)
    assert torch.equal(c0, c1)


@pytest.mark.parametrize("need_weights", [False, True])
def test_sdpa_attend_calls_the_fused_kernel(monkeypatch, need_weights):
    calls = _spy(monkeypatch)
    q, k, v = _data(dtype=torch.float32)
    mask = _mask_with_empty_row()
    sdpa_attend(q, k, v, 0.25, mask, 0.0, need_weights)
    assert len(calls) == 1
    call = calls[0]
    assert call["scale"] == 0.25
    assert call["dropout_p"] == 0.0
    # the kernel never sees a row without keys (it would return NaN for it)
    assert call["attn_mask"].any(-1).all()


def test_sdpa_attend_without_mask_passes_none(monkeypatch):
    calls = _spy(monkeypatch)
    q, k, v = _data(dtype=torch.float32)
    sdpa_attend(q, k, v, 1.0)
    assert calls[0]["attn_mask"] is None


def test_sdpa_attend_dropout_is_passed_and_weights_are_before_dropout(monkeypatch):
    calls = _spy(monkeypatch)
    q, k, v = _data(dtype=torch.float32)
    torch.manual_seed(0)
    c_drop, w_drop = sdpa_attend(q, k, v, 0.5, None, 0.5, need_weights=True)
    c, w = sdpa_attend(q, k, v, 0.5, None, 0.0, need_weights=True)
    assert calls[0]["dropout_p"] == 0.5
    assert torch.equal(w_drop, w)
    assert not torch.allclose(c_drop, c)


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.bfloat16, 3e-2), (torch.float16, 3e-3)], ids=["bf16", "fp16"]
)
def test_half_precision_close_to_float32(dtype, tol):
    # SDPA supports both half types on CPU in the supported torch versions
    q, k, v = _data(dtype=torch.float32)
    mask = _mask_with_empty_row()
    c32, w32 = sdpa_attend(q, k, v, 0.5, mask, need_weights=True)
    c, w = sdpa_attend(q.to(dtype), k.to(dtype), v.to(dtype), 0.5, mask, need_weights=True)
    assert c.dtype == dtype
    assert w.dtype == dtype
    torch.testing.assert_close(c.float(), c32, rtol=tol, atol=tol)
    torch.testing.assert_close(w.float(), w32, rtol=tol, atol=tol)
    assert torch.equal(c[1, 1].float(), torch.zeros(3))


# ------------------------------------------------------------------ through Attention


@pytest.mark.parametrize("score", ["dot", "scaled-dot", "general", "biased-general", "cosine"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_sdpa_path_calls_the_fused_kernel(monkeypatch, score, need_weights):
    calls = _spy(monkeypatch)
    attn = attnlab.Attention(score, "soft", d_q=4, d_k=4, d_v=3).eval()
    q, k, v = _data(dtype=torch.float32)
    out = attn(q, k, v, mask=_mask_with_empty_row(), need_weights=need_weights)
    assert out.path == "sdpa"
    assert len(calls) == 1
    assert (out.weights is not None) == need_weights


@pytest.mark.parametrize("path", ["explicit"])
def test_attention_explicit_path_does_not_call_the_fused_kernel(monkeypatch, path):
    calls = _spy(monkeypatch)
    attn = attnlab.Attention("scaled-dot", "soft", d_q=4, d_k=4, d_v=3, path=path)
    q, k, v = _data(dtype=torch.float32)
    assert attn(q, k, v).path == "explicit"
    assert calls == []


def test_attention_sdpa_dropout_only_in_training(monkeypatch):
    calls = _spy(monkeypatch)
    attn = attnlab.Attention("scaled-dot", d_q=4, d_k=4, d_v=3, dropout=0.3)
    q, k, v = _data(dtype=torch.float32)
    attn.train()(q, k, v)
    attn.eval()(q, k, v)
    assert [c["dropout_p"] for c in calls] == [0.3, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scale": float("nan")}, ValueError, r"^scale must be a finite number, got nan$"),
        ({"scale": True}, ValueError, r"^scale must be a finite number, got True$"),
        ({"dropout_p": 1.0}, ValueError, r"^dropout_p must be in \[0, 1\), got 1\.0$"),
        ({"dropout_p": float("nan")}, ValueError, r"^dropout_p must be in \[0, 1\)"),
        ({"dropout_p": -1.0}, ValueError, r"^dropout_p must be in \[0, 1\)"),
        ({"need_weights": "no"}, TypeError, r"^need_weights must be a bool, got 'no'$"),
    ],
)
def test_sdpa_attend_checks_its_settings(kwargs: dict, error: type, message: str) -> None:
    """NaN / True scales, NaN / negative / 1.0 dropout and ``need_weights="no"`` were
    accepted (NaN contexts, dropout of everything, or weights nobody asked for)."""
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    kw = {"scale": 0.5, **kwargs}
    with pytest.raises(error, match=message):
        sdpa_attend(q, k, v, **kw)


def _bad_inputs() -> dict[str, tuple[dict, type, str]]:
    """(the arguments that replace good ones, the error, its message) of every bad input
    reported: a float mask gave NotImplementedError "bitwise_or_cpu", the int mask, the
    integer q and the v with n_k + 1 rows raw RuntimeErrors from torch, the mask of
    another shape a RuntimeError from padding.py."""
    r = torch.randn
    return {
        "float mask": (
            {"mask": torch.ones(2, 3, 5)},
            TypeError,
            r"^mask has dtype torch.float32, expected torch.bool \(for an additive float mask "
            r"use attnlab.masks.from_additive",
        ),
        "int mask": (
            {"mask": torch.ones(2, 3, 5, dtype=torch.int64)},
            TypeError,
            r"^mask has dtype torch.int64, expected torch.bool \(True = allowed\)$",
        ),
        "mask list": ({"mask": [True]}, TypeError, r"^mask must be a torch.Tensor, got list$"),
        "integer q": (
            {"q": torch.ones(2, 3, 4, dtype=torch.int64)},
            TypeError,
            r"^q has dtype torch.int64, expected a floating-point dtype$",
        ),
        "k not a tensor": ({"k": None}, TypeError, r"^k must be a torch.Tensor, got NoneType$"),
        "v of another dtype": (
            {"v": r(2, 5, 2, dtype=torch.float64)},
            TypeError,
            r"^v has dtype torch.float64 but q has dtype torch.float32; cast them to one dtype$",
        ),
        "v with n_k + 1 rows": (
            {"v": r(2, 6, 2)},
            ValueError,
            r"^v has shape \(2, 6, 2\), expected \[\.\.\., n_k, d_v\] = \[2, 5, d_v\] to match "
            r"q \(2, 3, 4\) and k \(2, 5, 4\)",
        ),
        "v of another batch": (
            {"v": r(3, 5, 2)},
            ValueError,
            r"^v has shape \(3, 5, 2\), expected \[\.\.\., n_k, d_v\] = \[2, 5, d_v\]",
        ),
        "k of another d": (
            {"k": r(2, 5, 3)},
            ValueError,
            r"^k has shape \(2, 5, 3\), expected \[\.\.\., n_k, d\] = \[2, n_k, 4\] to match "
            r"q \(2, 3, 4\)",
        ),
        "k of another batch": (
            {"k": r(3, 5, 4)},
            ValueError,
            r"^k has shape \(3, 5, 4\), expected \[\.\.\., n_k, d\] = \[2, n_k, 4\]",
        ),
        "k of another rank": (
            {"k": r(5, 4)},
            ValueError,
            r"^k has shape \(5, 4\), expected \[\.\.\., n_k, d\] = \[2, n_k, 4\]",
        ),
        "1-D q": (
            {"q": r(4), "k": r(5, 4), "v": r(5, 2)},
            ValueError,
            r"^q has shape \(4,\), expected \[\.\.\., n_q, d\] \(at least 2-D\)$",
        ),
        "mask of another n_k": (
            {"mask": torch.ones(2, 3, 4, dtype=torch.bool)},
            ValueError,
            r"^mask has shape \(2, 3, 4\), expected a shape broadcastable to "
            r"\[\.\.\., n_q, n_k\] = \[2, 3, 5\]",
        ),
        "key mask [B, n_k]": (
            {"mask": torch.ones(2, 5, dtype=torch.bool)},
            ValueError,
            r"^mask has shape \(2, 5\), expected a shape broadcastable to .* \[2, 3, 5\] "
            r"\(a key padding mask is \[\.\.\., 1, n_k\]\)$",
        ),
        "mask on another device": (
            {"mask": torch.ones(2, 3, 5, dtype=torch.bool, device="meta")},
            ValueError,
            r"^mask is on meta but the inputs are on cpu$",
        ),
        "mask enlarging the batch": (
            {"mask": torch.ones(4, 2, 3, 5, dtype=torch.bool)},
            ValueError,
            r"^mask has shape \(4, 2, 3, 5\), expected a shape broadcastable to",
        ),
    }


@pytest.mark.parametrize("case", sorted(_bad_inputs()))
def test_sdpa_attend_checks_its_tensors(case: str) -> None:
    """Every bad q, k, v or mask is one line naming the argument and what was expected
    (docs/functional.md), not an error from deep inside torch."""
    replace, error, message = _bad_inputs()[case]
    args = {"q": torch.randn(2, 3, 4), "k": torch.randn(2, 5, 4), "v": torch.randn(2, 5, 2)}
    args |= {"mask": None} | replace
    with pytest.raises(error, match=message) as info:
        sdpa_attend(args["q"], args["k"], args["v"], 0.5, args["mask"], need_weights=True)
    assert "\n" not in str(info.value)


def test_sdpa_attend_accepts_every_documented_layout():
    """What the contract allows still runs and matches the loops: no batch axis, heads,
    keys and values shared by the heads (a leading axis of 1), and masks of any rank up to
    the scores'."""
    g = torch.Generator().manual_seed(5)
    r = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    cases = [
        (r(3, 4), r(5, 4), r(5, 2), torch.tensor([True, False, True, True, True])),
        (r(2, 2, 3, 4), r(2, 1, 5, 4), r(2, 1, 5, 2), torch.rand(2, 1, 1, 5, generator=g) > 0.3),
        (r(2, 3, 4), r(1, 5, 4), r(1, 5, 2), torch.tensor(True)),
        (r(2, 3, 4), r(2, 5, 4), r(2, 5, 2), torch.rand(3, 5, generator=g) > 0.3),
    ]
    for q, k, v, mask in cases:
        c, w = sdpa_attend(q, k, v, 0.5, mask, need_weights=True)
        lead = q.shape[:-2]
        want_c, want_w = _naive(
            q, k.expand(*lead, *k.shape[-2:]), v.expand(*lead, *v.shape[-2:]), 0.5, mask
        )
        torch.testing.assert_close(c, want_c, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)


def test_sdpa_attend_checks_compile_and_export_with_symbolic_sizes():
    """The checks compare shapes only: ``torch.compile(dynamic=True, fullgraph=True)``
    traces one graph for three sizes (no size made a constant), and ``torch.export`` with
    dynamic batch and lengths gives the eager result for other sizes."""
    from torch._dynamo.testing import CompileCounter

    def call(q, k, v, mask):
        return sdpa_attend(q, k, v, 0.5, mask, need_weights=True)

    def draw(B, n_q, n_k):  # d = 8, d_v = 6: no size equal to another ("duck sizing")
        g = torch.Generator().manual_seed(B)
        q, k, v = (torch.randn(*s, generator=g) for s in ((B, n_q, 8), (B, n_k, 8), (B, n_k, 6)))
        return q, k, v, torch.rand(B, 1, n_k, generator=g) > 0.3

    counter = CompileCounter()
    compiled = torch.compile(call, backend=counter, dynamic=True, fullgraph=True)
    for sizes in ((3, 5, 7), (4, 9, 10), (5, 11, 12)):
        args = draw(*sizes)
        for got, want in zip(compiled(*args), call(*args), strict=True):
            torch.testing.assert_close(got, want)
    assert counter.frame_count == 1

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return sdpa_attend(q, k, v, 0.5, mask)[0]

    B, n_q, n_k = (torch.export.Dim(name) for name in ("B", "n_q", "n_k"))
    shapes = ({0: B, 1: n_q}, {0: B, 1: n_k}, {0: B, 1: n_k}, {0: B, 2: n_k})
    exported = torch.export.export(Sdpa(), draw(3, 5, 7), dynamic_shapes=shapes)
    args = draw(4, 9, 10)
    torch.testing.assert_close(exported.module()(*args), Sdpa()(*args))
