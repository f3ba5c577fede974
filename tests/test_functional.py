"""Tests for attnlab.functional.attend: soft attention with every score function, checked
against a naive Python loop over (batch, query, key) on tiny float64 inputs."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from attnlab import functional as AF
from attnlab import registry

B, N_Q, N_K, D_Q, D_K, D_V, D_W = 2, 3, 4, 3, 3, 2, 5

ACTS = {
    "tanh": math.tanh,
    "relu": lambda x: max(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
}


def _inputs(seed: int = 0, d_q: int = D_Q, d_k: int = D_K):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N_Q, d_q, generator=g, dtype=torch.float64)
    k = torch.randn(B, N_K, d_k, generator=g, dtype=torch.float64)
    v = torch.randn(B, N_K, D_V, generator=g, dtype=torch.float64)
    return q, k, v


def _params(name: str, seed: int = 1, d_q: int = D_Q, d_k: int = D_K) -> dict:
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if name in ("dot", "scaled-dot", "cosine"):
        return {}
    if name == "general":
        return {"W": r(d_k, d_q)}
    if name == "biased-general":
        return {"W": r(d_k, d_q), "b": r(d_k)}
    if name == "activated-general":
        return {"W": r(d_k, d_q), "b": r(()), "act": "tanh"}
    if name == "additive":
        return {"W1": r(D_W, d_q), "W2": r(D_W, d_k), "w": r(D_W), "b": r(D_W), "act": "tanh"}
    if name == "queryless":
        return {"W": r(D_W, d_k), "w": r(D_W), "b": r(D_W), "act": "tanh"}
    raise AssertionError(name)


def _naive_score(name: str, q: list, k: list, p: dict) -> float:
    """e = score(q, k) for one query vector and one key vector (Python lists)."""
    P = {key: (val.tolist() if isinstance(val, torch.Tensor) else val) for key, val in p.items()}
    dot = sum(a * b for a, b in zip(q, k, strict=True)) if len(q) == len(k) else None
    if name == "dot":
        return dot
    if name == "scaled-dot":
        return dot / math.sqrt(len(k))
    if name == "cosine":
        nq = max(math.sqrt(sum(a * a for a in q)), 1e-8)
        nk = max(math.sqrt(sum(b * b for b in k)), 1e-8)
        return dot / (nq * nk)
    if name in ("general", "biased-general", "activated-general"):
        W = P["W"]
        Wq = [sum(W[x][y] * q[y] for y in range(len(q))) for x in range(len(k))]
        if name == "biased-general":
            Wq = [Wq[x] + P["b"][x] for x in range(len(k))]
        e = sum(k[x] * Wq[x] for x in range(len(k)))
        if name == "activated-general":
            e = ACTS[P["act"]](e + P["b"])
        return e
    if name == "additive":
        act = ACTS[P["act"]]
        W1, W2, w, b = P["W1"], P["W2"], P["w"], P["b"]
        return sum(
            w[j]
            * act(
                sum(W1[j][y] * q[y] for y in range(len(q)))
                + sum(W2[j][x] * k[x] for x in range(len(k)))
                + b[j]
            )
            for j in range(len(w))
        )
    if name == "queryless":
        act = ACTS[P["act"]]
        W, w, b = P["W"], P["w"], P["b"]
        return sum(
            w[j] * act(sum(W[j][x] * k[x] for x in range(len(k))) + b[j]) for j in range(len(w))
        )
    raise AssertionError(name)


def _naive_attend(name, q, k, v, p, mask=None):
    """(context [B, n_q, d_v], weights [B, n_q, n_k]) as nested lists, by loops."""
    qs = q.tolist() if q is not None else [[[0.0]] for _ in range(k.shape[0])]
    ks, vs = k.tolist(), v.tolist()
    n_q = len(qs[0])
    ctx, wts = [], []
    for b in range(len(ks)):
        cb, wb = [], []
        for i in range(n_q):
            allowed = [
                mask is None
                or bool(mask[b if mask.shape[0] > 1 else 0, i if mask.shape[1] > 1 else 0, l])
                for l in range(len(ks[b]))
            ]
            e = [_naive_score(name, qs[b][i], ks[b][l], p) for l in range(len(ks[b]))]
            m = max((e[l] for l in range(len(e)) if allowed[l]), default=0.0)
            ex = [math.exp(e[l] - m) if allowed[l] else 0.0 for l in range(len(e))]
            z = sum(ex)
            a = [x / z if z > 0 else 0.0 for x in ex]
            wb.append(a)
            cb.append(
                [sum(a[l] * vs[b][l][f] for l in range(len(a))) for f in range(len(vs[b][0]))]
            )
        ctx.append(cb)
        wts.append(wb)
    return torch.tensor(ctx, dtype=torch.float64), torch.tensor(wts, dtype=torch.float64)


def _assert_matches(out, want_context, want_weights):
    """``out`` (an ``AttentionOutput``) has the context and weights of the naive loop, to
    a relative 1e-9 and an absolute 1e-10."""
    torch.testing.assert_close(out.context, want_context, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(out.weights, want_weights, rtol=1e-9, atol=1e-10)


# Every registered score of the library runs here (the parametrisation comes from the
# registry); _params and _naive_score hold each one's parameters and textbook formula.
# A score with an extra input (location-aware: the previous weights) has its own tests.
SCORES = [
    e.name
    for e in registry.entries("score")
    if e.cls.__module__.startswith("attnlab.") and not getattr(e.cls, "uses_prev_weights", False)
]
QUERY_SCORES = [n for n in SCORES if registry.get("score", n).cls.needs_query]
DOT_TYPE = {"dot", "scaled-dot", "general", "biased-general", "cosine"}


def _mask():
    # batch 0: key padding (3 of 4 keys); batch 1: strictly causal, query 0 sees nothing
    m = torch.ones(B, N_Q, N_K, dtype=torch.bool)
    m[0, :, 3] = False
    m[1] = torch.ones(N_Q, N_K, dtype=torch.bool).tril(-1)
    return m


@pytest.mark.parametrize("name", SCORES)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_attend_matches_the_naive_loop(name, masked):
    q, k, v = _inputs()
    p = _params(name)
    mask = _mask() if masked else None
    if name == "queryless" and masked:
        mask = mask[:, :1]  # one (constant) query
    out = AF.attend(
        None if name == "queryless" else q, k, v, name, mask=mask, need_weights=True, **p
    )
    want_c, want_w = _naive_attend(name, None if name == "queryless" else q, k, v, p, mask)
    if name == "queryless":
        want_c, want_w = want_c[:, 0], want_w[:, 0]
    _assert_matches(out, want_c, want_w)
    assert out.path == (
        "sdpa" if name in DOT_TYPE else "lean-additive" if name == "additive" else "explicit"
    )


def test_fully_masked_row_is_zero_in_attend():
    q, k, v = _inputs()
    mask = _mask()
    assert not mask[1, 0].any()
    for name in QUERY_SCORES:
        q_ = q.clone().requires_grad_()
        out = AF.attend(q_, k, v, name, mask=mask, need_weights=True, **_params(name))
        assert torch.equal(out.context[1, 0], torch.zeros(D_V, dtype=torch.float64)), name
        assert torch.equal(out.weights[1, 0], torch.zeros(N_K, dtype=torch.float64)), name
        out.context.sum().backward()
        assert torch.isfinite(q_.grad).all(), name
        assert torch.equal(q_.grad[1, 0], torch.zeros(D_Q, dtype=torch.float64)), name


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("scaled_dot", "scaled-dot"),
        ("biased_general", "biased-general"),
        ("activated_general", "activated-general"),
        ("multiplicative", "dot"),
        ("concat", "additive"),
        ("Scaled-Dot", "scaled-dot"),
    ],
)
def test_attend_accepts_underscore_names_and_aliases(alias, name):
    q, k, v = _inputs()
    p = _params(name)
    a = AF.attend(q, k, v, alias, need_weights=True, **p)
    want_c, want_w = _naive_attend(name, q, k, v, p)
    _assert_matches(a, want_c, want_w)


def test_attend_default_score_is_scaled_dot():
    q, k, v = _inputs()
    want_c, _ = _naive_attend("scaled-dot", q, k, v, {})
    torch.testing.assert_close(AF.attend(q, k, v).context, want_c, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_attend_additive_other_activations(act):
    q, k, v = _inputs()
    p = {**_params("additive"), "act": act}
    out = AF.attend(q, k, v, "additive", need_weights=True, **p)
    want_c, want_w = _naive_attend("additive", q, k, v, p)
    _assert_matches(out, want_c, want_w)


def test_attend_additive_without_bias():
    q, k, v = _inputs()
    p = _params("additive")
    p_nob = {key: val for key, val in p.items() if key != "b"}
    out = AF.attend(q, k, v, "additive", **p_nob)
    want_c, _ = _naive_attend(
        "additive", q, k, v, {**p, "b": torch.zeros(D_W, dtype=torch.float64)}
    )
    torch.testing.assert_close(out.context, want_c, rtol=1e-9, atol=1e-10)


def test_attend_general_with_d_q_not_d_k():
    q, k, v = _inputs(d_q=2, d_k=3)
    p = _params("general", d_q=2, d_k=3)
    out = AF.attend(q, k, v, "general", need_weights=True, **p)
    want_c, want_w = _naive_attend("general", q, k, v, p)
    _assert_matches(out, want_c, want_w)


def test_attend_need_weights_false_gives_none_and_same_context():
    q, k, v = _inputs()
    for name in SCORES:
        p = _params(name)
        a = AF.attend(q, k, v, name, **p)
        b = AF.attend(q, k, v, name, need_weights=True, **p)
        assert a.weights is None
        assert torch.equal(a.context, b.context), name


def test_attend_single_query():
    q, k, v = _inputs()
    mask = torch.tensor([[True, True, False, True], [False, True, True, True]])  # [B, n_k]
    for name in QUERY_SCORES:
        p = _params(name)
        out = AF.attend(q[:, 0], k, v, name, mask=mask, need_weights=True, **p)
        assert out.context.shape == (B, D_V)
        assert out.weights.shape == (B, N_K)
        want_c, want_w = _naive_attend(name, q[:, :1], k, v, p, mask[:, None, :])
        _assert_matches(out, want_c[:, 0], want_w[:, 0])


def test_attend_queryless_ignores_q():
    q, k, v = _inputs()
    p = _params("queryless")
    a = AF.attend(None, k, v, "queryless", **p)
    b = AF.attend(q, k, v, "queryless", **p)
    assert a.context.shape == (B, D_V)
    assert torch.equal(a.context, b.context)


def test_attend_empty_key_set():
    q, _, _ = _inputs()
    k = torch.zeros(B, 0, D_K, dtype=torch.float64)
    v = torch.zeros(B, 0, D_V, dtype=torch.float64, requires_grad=True)
    for name in QUERY_SCORES:
        q_ = q.clone().requires_grad_()
        out = AF.attend(q_, k, v, name, need_weights=True, **_params(name))
        assert torch.equal(out.context, torch.zeros(B, N_Q, D_V, dtype=torch.float64)), name
        assert out.weights.shape == (B, N_Q, 0)
        out.context.sum().backward()
        assert q_.grad is None or torch.equal(q_.grad, torch.zeros_like(q)), name


def _spy_sdpa(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("name", sorted(DOT_TYPE))
@pytest.mark.parametrize("need_weights", [False, True])
def test_attend_dot_type_scores_call_sdpa(monkeypatch, name, need_weights):
    calls = _spy_sdpa(monkeypatch)
    q, k, v = _inputs()
    out = AF.attend(q, k, v, name, mask=_mask(), need_weights=need_weights, **_params(name))
    assert len(calls) == 1
    assert out.path == "sdpa"


@pytest.mark.parametrize("name", ["additive", "activated-general", "queryless"])
def test_attend_other_scores_do_not_call_sdpa(monkeypatch, name):
    calls = _spy_sdpa(monkeypatch)
    q, k, v = _inputs()
    AF.attend(q, k, v, name, **_params(name))
    assert calls == []


def test_attend_errors():
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"score 'dot' needs a query q"):
        AF.attend(None, k, v, "dot")
    with pytest.raises(KeyError, match=r"unknown score 'nope'"):
        AF.attend(q, k, v, "nope")
    # a parameter the score does not take is an error on the fused path too
    with pytest.raises(TypeError, match=r"'W'"):
        AF.attend(q, k, v, "dot", W=torch.eye(3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"'W2'"):
        AF.attend(q, k, v, "general", W=torch.eye(3, dtype=torch.float64), W2=torch.eye(3))
    with pytest.raises(TypeError, match=r"W"):
        AF.attend(q, k, v, "general")  # missing W
    with pytest.raises(ValueError, match=r"W has shape \(2, 3\), expected \[d_k, d_q\] = \[3, 3\]"):
        AF.attend(q, k, v, "general", W=torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"needs d_q == d_k"):
        AF.attend(q[..., :2], k, v, "dot")
    with pytest.raises(
        ValueError, match=r"v has shape \(2, 3, 2\), expected \[B, n_k, d_v\] = \[2, 4, d_v\]"
    ):
        AF.attend(q, k, v[:, :3], "dot")
    with pytest.raises(
        ValueError, match=r"k has shape \(3, 4, 3\), expected \[B, n_k, d_k\] = \[2, n_k, d_k\]"
    ):
        AF.attend(q, torch.cat([k, k[:1]]), v, "dot")
    with pytest.raises(TypeError, match=r"k has dtype torch.float32 but q has dtype torch.float64"):
        AF.attend(q, k.float(), v, "dot")
    with pytest.raises(TypeError, match=r"v has dtype torch.float32 but k has dtype torch.float64"):
        AF.attend(q, k, v.float(), "dot")
    with pytest.raises(TypeError, match=r"mask has dtype torch.float64.*from_additive"):
        AF.attend(q, k, v, "dot", mask=torch.zeros(B, 1, N_K, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 1, 4\)"):
        AF.attend(q, k, v, "dot", mask=torch.ones(3, 1, N_K, dtype=torch.bool))


@pytest.mark.parametrize("name", AF.__all__)
def test_every_function_documents_its_shapes_and_cost(name):
    """The project's rule for the public API: each function's docstring gives the shapes
    (a shape literal such as ``[B, n_q, n_k]``, or the shape of an argument) and the cost
    (an ``O(...)``)."""
    doc = getattr(AF, name).__doc__ or ""
    assert re.search(r"``\[|\[B, |shape of", doc), f"{name}: no shapes in the docstring"
    assert "O(" in doc, f"{name}: no cost O(...) in the docstring"


def test_attend_need_weights_must_be_a_bool_and_score_a_name() -> None:
    """``need_weights="no"`` computed the weights (and ``1`` / ``None`` were taken as
    switches); ``score=5`` failed with ``'int' object has no attribute 'lower'``."""
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    for flag in ("no", 1, None):
        with pytest.raises(TypeError, match=r"^need_weights must be a bool, got"):
            AF.attend(q, k, v, need_weights=flag)
    with pytest.raises(TypeError, match=r"^score must be the name of a registered score, got int$"):
        AF.attend(q, k, v, score=5)


@pytest.mark.parametrize(
    ("score", "params", "message"),
    [
        ("scaled_dot", {"align": "sparsemax"}, r"'align': score 'scaled-dot' takes no such parameter \(its parameters: none\); attend is soft attention"),
        ("additive", {"W": 1}, r"'W': score 'additive' takes no such parameter \(its parameters: W1, W2, w, b, act, lean\)"),
    ],
)  # fmt: skip
def test_attend_names_a_keyword_its_score_does_not_take(score, params, message):
    """It was the score function's own ``TypeError`` ('scaled_dot_score() got an
    unexpected keyword argument'), which said neither what attend does nor what it takes."""
    q = torch.randn(1, 2, 4)
    with pytest.raises(TypeError, match=r"^unexpected keyword argument " + message):
        AF.attend(q, q, q, score=score, **params)


@pytest.mark.parametrize(
    ("score", "params", "message"),
    [
        ("additive", {}, r"score 'additive' is missing the parameters W1, W2, w: pass them to attend as keywords \(its parameters: W1, W2, w, b, act, lean\), or use attnlab.Attention\(score='additive'\), which learns them$"),
        ("additive", {"W1": 1, "w": 2}, r"score 'additive' is missing the parameter W2: pass it to attend as a keyword "),
        ("general", {}, r"score 'general' is missing the parameter W: pass it to attend as a keyword \(its parameters: W\)"),
        ("queryless", {"act": "tanh"}, r"score 'queryless' is missing the parameters W, w: "),
    ],
)  # fmt: skip
def test_attend_names_the_parameters_its_score_needs(score, params, message):
    """It was the score function's own ``TypeError`` ('additive_score() missing 3 required
    positional arguments'), which said neither how attend takes them nor where they are
    learned; the check runs before anything is computed."""
    q = torch.randn(1, 2, 4)
    with pytest.raises(TypeError, match=r"^" + message):
        AF.attend(q, q, q, score=score, **params)
