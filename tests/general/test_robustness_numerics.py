"""Numerical robustness of the attention core (issue 11, section 3, items 3, 4 and 8).

* Non-finite scores: sparsemax and 1.5-entmax (and every alignment inside ``Attention``)
  treat a row whose allowed scores have no finite maximum (``+inf``, NaN, only ``-inf``)
  like the softmax does -- NaN weights for that row, nothing else touched -- instead of
  crashing; a ``-inf`` score gets weight 0.
* Half precision with large inputs: the scores are computed in float32, so ``|q.k|`` beyond
  float16's 65504 gives finite contexts, weights and gradients that match a float32
  reference (same rounded inputs and parameters) on every score x alignment x dim.
* Padding never matters: NaN or inf in padded keys, values and fully masked query rows
  leave every output and gradient exactly as zeros there would, on every path.

The combinations and mask cases come from ``test_attention`` (imported, not copied).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_attention import (
    N_K,
    N_Q,
    QUERYLESS,
    VALID,
    B,
    D,
    _attention_and_clean_rest,
    _inputs,
    _mask,
    ids,
)

from attnlab import Attention, functional, masks
from attnlab.general.alignment import masked_softmax
from attnlab.general.dimensionality import multi_dimensional_attend
from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean
from attnlab.general.local import local_window_attend
from attnlab.general.padding import (
    attended_keys,
    attending_rows,
    clear_attention_inputs,
    clear_nonfinite_rows,
    zero_rows,
)
from attnlab.general.scoring import DotScore
from attnlab.general.sdpa import sdpa_attend
from attnlab.general.sparse import entmax15, sparsemax

INF, NAN = float("inf"), float("nan")
SPARSE = {"sparsemax": sparsemax, "entmax15": entmax15}

# The combination tests give every score the same query tensor; a query-less score ignores
# it (deprecated: attnlab 0.2.0 refuses it, see test_a_query_given_to_a_query_less_score_*).
pytestmark = pytest.mark.filterwarnings("ignore:score 'queryless' is query-less:DeprecationWarning")


# ----------------------------------------------------------- item 3: non-finite scores


def _rows_nan_or_finite(x: torch.Tensor, dims: int = 1) -> torch.Tensor:
    """[..] bool per row (the last ``dims`` axes are the row): all NaN (True) or all finite
    (False); anything mixed fails the test."""
    flat = x.reshape(*x.shape[: x.dim() - dims], -1)
    nan = torch.isnan(flat)
    assert (nan.all(-1) | torch.isfinite(flat).all(-1)).all(), "a row is partly NaN"
    return nan.all(-1)


@pytest.mark.parametrize("name", sorted(SPARSE))
@pytest.mark.parametrize("masked", [False, True])
def test_sparse_alignments_handle_non_finite_rows_like_the_softmax(name, masked):
    fn = SPARSE[name]
    e = torch.tensor(
        [
            [1.0, INF, 0.0, 2.0],  # +inf: no defined weights -> NaN
            [-INF, -INF, -INF, -INF],  # only -inf -> NaN
            [0.5, -INF, 1.0, 0.0],  # a -inf score gets weight 0
            [NAN, 0.0, 1.0, 2.0],  # NaN -> NaN
            [1.0, 2.0, 3.0, 4.0],  # ordinary
        ],
        requires_grad=True,
    )
    mask = None
    if masked:
        mask = torch.ones(5, 4, dtype=torch.bool)
        mask[4] = False  # a fully masked row stays zero
        mask[0, 3] = False
    p = fn(e, mask)  # used to raise "index -1 is out of bounds"
    soft = masked_softmax(e.detach(), mask)
    # NaN exactly in the rows where the softmax is NaN
    assert torch.equal(_rows_nan_or_finite(p), torch.isnan(soft).any(-1))
    assert _rows_nan_or_finite(p).tolist() == [True, True, False, True, False]
    # a -inf score is the limit of a very negative one
    finite = e.detach()[2].clone()
    finite[1] = -1e4
    assert torch.equal(p[2], fn(finite))
    assert p[2, 1] == 0
    if masked:
        assert torch.equal(p[4], torch.zeros(4))
    else:
        assert torch.equal(p[4], fn(e.detach()[4]))
    # gradients: finite, and zero for the NaN rows
    g = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    (torch.nan_to_num(p) * g).sum().backward()
    assert torch.isfinite(e.grad).all()
    assert not e.grad[[0, 1, 3]].any()


@pytest.mark.parametrize("name", sorted(SPARSE))
def test_sparse_alignments_clamping_far_scores_is_exact(name):
    """Scores far below the row maximum lie outside the support: -1e30 and -inf give the
    same weights and gradients as a merely very negative score."""
    fn = SPARSE[name]
    base = torch.tensor([[0.3, 1.2, -0.4, 0.9, 0.0]], dtype=torch.float64)
    outs = []
    for far in (-50.0, -1e30, -INF):
        e = base.clone()
        e[0, 2] = far
        e.requires_grad_()
        p = fn(e)
        (p * torch.arange(5.0, dtype=torch.float64)).sum().backward()
        outs.append((p.detach(), e.grad))
    for p, grad in outs[1:]:
        assert torch.equal(p, outs[0][0])
        assert torch.equal(grad, outs[0][1])


@pytest.mark.parametrize("align", ["sparsemax", "entmax15"])
def test_issue_reproducer_sparse_attention_with_an_infinite_key(align):
    torch.manual_seed(0)
    attn = Attention("dot", align, d_q=4, d_k=4).eval()
    soft = Attention("dot", "soft", d_q=4, d_k=4, path="explicit").eval()
    q, k, v = _inputs()
    clean = attn(q[1:], k[1:], v[1:], need_weights=True)
    k[0, 2, 1] = INF
    out = attn(q, k, v, need_weights=True)  # used to raise
    ref = soft(q, k, v, need_weights=True)
    # the rows whose score for key 2 is +inf are NaN, as with the softmax; in the others
    # key 2 scores -inf and gets weight 0
    nan_rows = _rows_nan_or_finite(out.weights[0])
    assert torch.equal(nan_rows, q[0, :, 1] > 0)
    assert torch.equal(nan_rows, _rows_nan_or_finite(ref.weights[0]))
    assert torch.equal(_rows_nan_or_finite(out.context[0]), nan_rows)
    assert (out.weights[0, ~nan_rows, 2] == 0).all()
    torch.testing.assert_close(out.context[1:], clean.context, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
@pytest.mark.parametrize("path", ["auto", "explicit"])
def test_an_infinite_key_never_crashes_and_stays_in_its_batch_element(score, align, dim, path):
    attn, (q, k, v), clean = _attention_and_clean_rest(score, align, dim, path)
    for value in (INF, -INF):
        k_bad = k.clone()
        k_bad[0, 2, 1] = value
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k_bad, v))
        out = attn(qg, kg, vg, need_weights=True)
        # each row of the affected element is either NaN or finite, never partly garbage
        _rows_nan_or_finite(out.weights[0], 2 if dim == "multi" else 1)
        # float32 rounding only (the lean kernel may take another code path for the batch)
        torch.testing.assert_close(out.context[1:], clean.context, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.weights[1:], clean.weights, rtol=1e-5, atol=1e-6)
        out.context[1:].sum().backward()
        for t in (qg, kg, vg):
            assert t.grad is None or torch.isfinite(t.grad[1:]).all()


# --------------------------------------------------------- item 4: float16 / bfloat16


HALF = [(torch.float16, 5e-3), (torch.bfloat16, 5e-2)]


def _large_inputs(dtype, scale=150.0, wide=torch.float32):
    """q, k ~ N(0, scale^2) (|q.k| far beyond float16's 65504), v ~ N(0, 1); rounded to
    ``dtype`` and returned with ``wide`` copies of the rounded numbers."""
    g = torch.Generator().manual_seed(11)
    q = (torch.randn(B, N_Q, D, generator=g) * scale).to(dtype)
    k = (torch.randn(B, N_K, D, generator=g) * scale).to(dtype)
    v = torch.randn(B, N_K, D, generator=g).to(dtype)
    return (q, k, v), tuple(t.to(wide) for t in (q, k, v))


def _half_and_reference(score, align, dim, dtype):
    torch.manual_seed(0)
    half = Attention(score, align, dim, d_q=D, d_k=D).eval()
    if score in ("general", "biased-general", "activated-general"):
        # an exact projection W q (identity, zero bias): the fused kernel gets W q rounded
        # to the half type, and with huge scores a rounding difference of W q could turn
        # a near tie into another argmax than the float32 reference's
        with torch.no_grad():
            half.score.W.weight.copy_(torch.eye(D))
            if getattr(half.score.W, "bias", None) is not None:
                half.score.W.bias.zero_()
    half.to(dtype)
    # the same (rounded) parameters, in float64: with scores near 1e5 a float32 reference
    # is not exact either (PyTorch's fused CPU kernel, which a float32 call takes,
    # recomputes the weights in its backward from float32 scores: gradient errors near
    # 1e-2 where the exact gradient is 0). A hard choice keeps the float32 reference: its
    # scores are float32 in both (the score functions' work dtype for half inputs), and
    # float64 scores could break a near tie the other way.
    ref = copy.deepcopy(half).to(_wide(align))
    return half, ref


def _wide(align):
    """The reference's dtype (see :func:`_half_and_reference`)."""
    return torch.float32 if align in ("hard", "reinforced") else torch.float64


def _close(got, want, tol, what):
    """``got`` (half) against ``want`` (float32 or float64) with ``tol`` relative to ``want``'s scale."""
    assert torch.isfinite(got).all(), f"{what} is not finite"
    scale = max(float(want.detach().abs().max()), 1.0) if want.numel() else 1.0
    torch.testing.assert_close(got.to(want.dtype), want, rtol=tol, atol=tol * scale, msg=what)


@pytest.mark.parametrize(("dtype", "tol"), HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
def test_large_half_inputs_match_a_wide_reference(score, align, dim, dtype, tol):
    half, ref = _half_and_reference(score, align, dim, dtype)
    (q, k, v), (qf, kf, vf) = _large_inputs(dtype, wide=_wide(align))
    mask = _mask("fully-masked-row", score)
    for t in (q, k, v, qf, kf, vf):
        t.requires_grad_()
    got = half(q, k, v, mask=mask, need_weights=True)
    want = ref(qf, kf, vf, mask=mask, need_weights=True)
    assert got.path == want.path
    assert got.context.dtype == dtype and got.weights.dtype == dtype
    _close(got.context, want.context, tol, "context")
    _close(got.weights, want.weights, tol, "weights")
    r = torch.randn(want.context.shape, generator=torch.Generator().manual_seed(3))
    (got.context.float() * r).sum().backward()
    (want.context * r.to(want.context.dtype)).sum().backward()
    for name, tg, tw in (("q", q, qf), ("k", k, kf), ("v", v, vf)):
        if tw.grad is not None:
            _close(tg.grad, tw.grad, tol, f"{name}.grad")
    for (name, pg), pw in zip(half.named_parameters(), ref.parameters(), strict=True):
        if pw.grad is not None:
            _close(pg.grad, pw.grad, tol, f"{name}.grad")


def test_issue_reproducer_sdpa_weights_in_float16():
    torch.manual_seed(0)
    attn = Attention("scaled-dot", "soft", d_q=D, d_k=D).half()
    (q, k, v), (qf, kf, _) = _large_inputs(torch.float16)
    assert float((qf @ kf.transpose(1, 2)).abs().max()) > 65504
    out = attn(q, k, v, need_weights=True)
    assert out.path == "sdpa"
    assert torch.isfinite(out.weights).all()  # used to be all NaN beside a correct context
    want = masked_softmax(qf @ kf.transpose(1, 2) / 2)
    torch.testing.assert_close(out.weights.float(), want, rtol=0, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_score_functions_return_float32_for_half_inputs(dtype):
    (q, k, _), (qf, kf, _) = _large_inputs(dtype)
    for fn in (functional.dot_score, functional.scaled_dot_score, functional.cosine_score):
        e = fn(q, k)
        assert e.dtype == torch.float32
        assert torch.isfinite(e).all()
        torch.testing.assert_close(e, fn(qf, kf), rtol=1e-5, atol=1e-5)
    W = torch.eye(D, dtype=dtype)
    e = functional.general_score(q, k, W)
    assert e.dtype == torch.float32 and torch.isfinite(e).all()
    w = torch.ones(D, dtype=dtype)
    e = functional.additive_score(q, k, W, W, w, act="relu")
    assert e.dtype == torch.float32
    torch.testing.assert_close(
        e, functional.additive_score(qf, kf, *(x.float() for x in (W, W, w)), act="relu")
    )
    assert additive_score_lean(q, k, w, "relu").dtype == dtype  # the kernel keeps its dtype


# --------------------------------------------------------------- item 8: padding


def _padding_mask(score: str) -> torch.Tensor:
    """Key padding (batch element 1 has 3 keys) and, with real queries, padded query rows
    (batch element 1 has 2 queries): those rows may attend nothing."""
    keys = masks.from_lengths(torch.tensor([N_K, 3]))
    if score in QUERYLESS:
        return keys
    rows = torch.arange(N_Q)[None, :] < torch.tensor([N_Q, 2])[:, None]
    return keys & rows[:, :, None]


def _fill_padding(q, k, v, mask, value):
    """Copies of q, k, v with ``value`` in every padded key, value and query row."""
    q, k, v = q.clone(), k.clone(), v.clone()
    keys = attended_keys(mask)  # [B, n_k]
    k[~keys.expand(B, -1)] = value
    v[~keys.expand(B, -1)] = -value
    rows = attending_rows(mask).expand(B, -1)
    if rows.shape[1] == q.shape[1]:
        q[~rows] = value
    return q, k, v


def _run(attn, q, k, v, mask, seed=5):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    attn.zero_grad()
    out = attn(q, k, v, mask=mask, need_weights=True)
    r = torch.randn(out.context.shape, generator=torch.Generator().manual_seed(seed))
    (out.context * r).sum().backward()
    grads = [t.grad for t in (q, k, v)]
    params = [None if p.grad is None else p.grad.clone() for p in attn.parameters()]
    return out, grads, params


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
@pytest.mark.parametrize("path", ["auto", "explicit"])
@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
def test_padding_never_matters(score, align, dim, path, value):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D, path=path).eval()
    mask = _padding_mask(score)
    q, k, v = _inputs()
    zq, zk, zv = _fill_padding(q, k, v, mask, 0.0)
    bq, bk, bv = _fill_padding(q, k, v, mask, value)
    want, want_g, want_p = _run(attn, zq, zk, zv, mask)
    got, got_g, got_p = _run(attn, bq, bk, bv, mask)
    assert got.path == want.path
    for name, a, b in (
        ("context", got.context, want.context),
        ("weights", got.weights, want.weights),
    ):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    if want.log_prob is not None:
        torch.testing.assert_close(got.log_prob, want.log_prob, rtol=0, atol=0)
    for name, a, b in zip("qkv", got_g, want_g, strict=True):
        if b is None:
            assert a is None or not a.any()
            continue
        assert torch.isfinite(a).all(), f"{name}.grad"
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name}.grad")
    for (name, _), a, b in zip(attn.named_parameters(), got_p, want_p, strict=True):
        if b is not None:
            assert torch.isfinite(a).all(), name
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_padding_never_matters_with_projections_and_self_attention():
    """Key / value projections (whose weight gradients multiply the padding), and q = k:
    the padded positions are then also query rows that a key padding mask does not mask."""
    torch.manual_seed(0)
    attn = Attention("additive", "soft", d_q=D, d_k=D, key_dim=3, value_dim=5).eval()
    mask = masks.from_lengths(torch.tensor([N_K, 3]))
    x = torch.randn(B, N_K, D, generator=torch.Generator().manual_seed(2))
    results = []
    for value in (0.0, NAN, INF):
        xv = x.clone()
        xv[1, 3:] = value
        xv.requires_grad_()
        attn.zero_grad()
        out = attn(xv, xv, mask=mask).context
        loss = out[0].sum() + out[1, :3].sum()  # the padded rows' outputs are not used
        loss.backward()
        results.append((out, xv.grad, [p.grad.clone() for p in attn.parameters()]))
    (c0, g0, p0) = results[0]
    for c, g, p in results[1:]:
        assert torch.isfinite(c).all()
        torch.testing.assert_close(c[0], c0[0], rtol=0, atol=0)
        torch.testing.assert_close(c[1, :3], c0[1, :3], rtol=0, atol=0)
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g0, rtol=0, atol=0)
        for a, b in zip(p, p0, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def _check_same(fn, clean_args, dirty_args, grad_idx):
    """``fn(*args)`` -> a tensor; outputs and the gradients of ``args[i]`` (i in
    ``grad_idx``) equal with clean and dirty padding, and finite."""
    results = []
    for args in (clean_args, dirty_args):
        args = [a.clone().requires_grad_() if i in grad_idx else a for i, a in enumerate(args)]
        out = fn(*args)
        r = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out * r).sum().backward()
        results.append((out, [args[i].grad for i in grad_idx]))
    (want, want_g), (got, got_g) = results
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(got_g, want_g, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("value", [NAN, INF], ids=["nan", "inf"])
def test_padding_never_matters_in_the_public_kernels(value):
    mask = _padding_mask("dot")
    q, k, v = _inputs()
    clean = _fill_padding(q, k, v, mask, 0.0)
    dirty = _fill_padding(q, k, v, mask, value)
    # SDPA, with and without the weights
    for need in (False, True):
        _check_same(
            lambda q, k, v, need=need: torch.cat(
                [x.flatten() for x in sdpa_attend(q, k, v, 0.5, mask, 0.0, need) if x is not None]
            ),
            clean,
            dirty,
            (0, 1, 2),
        )
    # the functional API, every score
    W = torch.randn(D, D, generator=torch.Generator().manual_seed(4))
    params = {
        "dot": {},
        "scaled-dot": {},
        "cosine": {},
        "general": {"W": W},
        "biased-general": {"W": W, "b": W[0]},
        "activated-general": {"W": W, "b": 0.1},
        "additive": {"W1": W, "W2": W.T.contiguous(), "w": W[1]},
    }
    for score, kw in params.items():
        _check_same(
            lambda q, k, v, score=score, kw=kw: (
                functional.attend(q, k, v, score, mask, **kw).context
            ),
            clean,
            dirty,
            (0, 1, 2),
        )
    # the lean multi-dimensional kernel (projected queries / keys stand in for q1, k2)
    W_d = torch.randn(D, D, generator=torch.Generator().manual_seed(6))
    _check_same(
        lambda q, k, v: multi_dim_attend_lean(q, k, W_d, None, v, mask), clean, dirty, (0, 1, 2)
    )
    # local attention on the window (centres 0..n_q-1)
    center = torch.arange(N_Q, dtype=torch.float32).expand(B, N_Q)
    _check_same(
        lambda q, k, v: local_window_attend(DotScore(), q, k, v, center, 2, mask, True, True)[0],
        clean,
        dirty,
        (0, 1, 2),
    )
    # multi-dimensional attention from given vector scores
    scores = torch.randn(B, N_Q, N_K, D, generator=torch.Generator().manual_seed(8))
    _check_same(
        lambda v: multi_dimensional_attend(scores, v, mask).context, [clean[2]], [dirty[2]], (0,)
    )


def test_local_window_slots_outside_the_window_read_zeros():
    """A NaN in a key / value that query 0 may not attend (another query may) does not
    reach query 0, even when its window slot covers that position."""
    q, k, v = _inputs(n_q=2, n_k=4)
    mask = torch.ones(B, 2, 4, dtype=torch.bool)
    mask[:, 0, 1] = False  # key 1 is hidden from query 0 only
    center = torch.tensor([[0.5, 1.0]]).expand(B, 2)  # slot 2 of query 0 is outside D = 1
    k, v = k.clone(), v.clone()
    k[:, 1] = NAN
    v[:, 1] = NAN
    v[:, 2] = NAN  # in query 0's slots (ceil(0.5 - 1) = 0 .. 2) but |2 - 0.5| > D
    ctx, dense, _ = local_window_attend(DotScore(), q, k, v, center, 1, mask, False, True)
    assert torch.isfinite(ctx[:, 0]).all() and torch.isfinite(dense[:, 0]).all()
    assert torch.isnan(ctx[:, 1]).all()  # query 1 may attend key 1: NaN, as documented


def test_padding_helpers():
    m = torch.tensor([[[True, False, False], [False, False, False]]])  # [1, 2, 3]
    assert attended_keys(m).tolist() == [[True, False, False]]
    assert attending_rows(m).tolist() == [[True, False]]
    head = torch.zeros(2, 3, 2, 4, dtype=torch.bool)  # [B, h, n_q, n_k]
    head[1, 2, 0, 3] = True
    assert attended_keys(head).tolist() == [[False] * 4, [False, False, False, True]]
    assert attending_rows(head).tolist() == [[False, False], [True, False]]
    assert attended_keys(torch.ones(2, 3, dtype=torch.bool)).shape == (1, 3)
    assert attended_keys(torch.ones(3, 0, 0, dtype=torch.bool)).shape == (3, 0)
    with pytest.raises(ValueError, match=r"mask has shape \(3,\), expected \[..., n_q, n_k\]"):
        attended_keys(torch.ones(3, dtype=torch.bool))
    x = torch.tensor([[[1.0, NAN], [INF, 2.0], [3.0, 4.0]]])
    keep = torch.tensor([[True, False, False]])
    z = zero_rows(x, keep)
    assert torch.isnan(z[0, 0, 1]) and z[0, 1:].eq(0).all()
    c = clear_nonfinite_rows(x, keep)
    assert torch.isnan(c[0, 0, 1])  # kept rows are untouched, NaN included
    assert c[0, 1].tolist() == [0.0, 2.0] and c[0, 2].tolist() == [3.0, 4.0]
    assert zero_rows(x, None) is x and clear_nonfinite_rows(x, None) is x
    q, k, v = clear_attention_inputs(x, x, x, None)
    assert q is x and k is x and v is x
    m3 = torch.tensor([[[True, False, False], [False, False, False], [True, False, False]]])
    y = x.clone()
    y[0, 2, 0] = INF
    q, k, v = clear_attention_inputs(y, y, y, m3, self_attention=True)
    assert k is v and not k[0, 1:].any() and torch.isnan(k[0, 0, 1])
    assert q[0, 1].eq(0).all()  # a query row with nothing to attend to
    assert q[0, 2].tolist() == [0.0, 4.0]  # a padded position's query row: non-finite cleared
    q, _, _ = clear_attention_inputs(y, y, y, m3)
    assert q[0, 2, 0] == INF  # not self-attention: an attending query row is left alone
