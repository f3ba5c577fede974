"""Tests for attnlab.Attention, the general attention module: every score x alignment x
dimensionality builds and runs, impossible ones fail at construction naming the conflict,
the fast paths agree with path="explicit", and bad or special inputs (empty key sets,
fully masked rows, NaN, half precision) behave as documented."""

from __future__ import annotations

import inspect
import itertools
import math
import re
import warnings
from dataclasses import replace

import pytest
import torch
from attention_harness import (
    Inputs,
    check_dropout_only_in_training,
    check_fully_masked_row,
    check_gradients,
    check_masked_keys_zero,
    check_need_weights_keeps_context,
    check_output,
    check_weights_none_unless_asked,
    check_wrong_dtype,
    naive_softmax,
)

import attnlab
from attnlab import Attention, ConfigError, masks
from attnlab.general import planner

# The combination tests give every score the same query tensor; a query-less score ignores
# it (deprecated: attnlab 0.2.0 refuses it, see test_a_query_given_to_a_query_less_score_*).
pytestmark = pytest.mark.filterwarnings("ignore:score 'queryless' is query-less:DeprecationWarning")


def _library(kind: str) -> list[attnlab.registry.Entry]:
    """The library's own registered mechanisms of one kind (not the plugins that tests
    register for a while)."""
    return [e for e in attnlab.registry.entries(kind) if e.cls.__module__.startswith("attnlab.")]


# The combinations come from the registry: a newly registered score or alignment runs in
# every test below without being named here. A score with an input the combination tests
# do not give (location-aware: the previous step's weights) is tested on its own.
SCORES = [e.name for e in _library("score") if not getattr(e.cls, "uses_prev_weights", False)]
ALIGNS = [e.name for e in _library("align")]
DIMS = [e.name for e in _library("dim")]
VECTOR_SCORES = {e.name for e in _library("score") if e.cls.supports_vector}
QUERYLESS = {e.name for e in _library("score") if not e.cls.needs_query}
PER_FEATURE_ALIGNS = {e.name for e in _library("align") if e.cls.supports_multi}
LOCAL = {e.name for e in _library("align") if e.cls.local}


def _valid(score: str, align: str, dim: str) -> bool:
    """The rules of the general model, written out independently of the code."""
    if align in LOCAL and score in QUERYLESS:
        return False
    if dim == "multi":
        return score in VECTOR_SCORES and align in PER_FEATURE_ALIGNS
    return True


ALL = list(itertools.product(SCORES, ALIGNS, DIMS))
VALID = [c for c in ALL if _valid(*c)]
INVALID = [c for c in ALL if not _valid(*c)]
ids = "/".join

B, N_Q, N_K, D = 2, 4, 6, 4


def test_the_registry_holds_these_components():
    survey_scores = {"dot", "scaled-dot", "general", "biased-general", "activated-general"}
    survey_scores |= {"cosine", "additive", "queryless"}
    survey_aligns = {"soft", "hard", "local-m", "local-p", "reinforced", "sparsemax", "entmax15"}
    assert set(SCORES) >= survey_scores
    assert set(ALIGNS) >= survey_aligns
    assert set(DIMS) == {"single", "multi"}
    assert VECTOR_SCORES >= {"additive", "queryless"} and "queryless" in QUERYLESS
    assert PER_FEATURE_ALIGNS >= {"soft", "sparsemax", "entmax15"}
    assert LOCAL == {"local-m", "local-p"}
    # the query scores with every alignment, the query-less ones without the local
    # alignments, and the vector scores with the per-feature alignments (multi)
    n_query = len(SCORES) - len(QUERYLESS)
    n_single = n_query * len(ALIGNS) + len(QUERYLESS) * (len(ALIGNS) - len(LOCAL))
    assert len(VALID) == n_single + len(VECTOR_SCORES) * len(PER_FEATURE_ALIGNS)
    assert len(VALID) >= 7 * 7 + 5 + 2 * 3  # 7 query scores, queryless without local, multi


def _pair(score, align, dim, seed=0, **kw):
    """Two modules with the same parameters: path='auto' and path='explicit'."""
    torch.manual_seed(seed)
    kw = {"d_q": D, "d_k": D, **kw}
    fast = Attention(score, align, dim, **kw).eval()
    slow = Attention(score, align, dim, path="explicit", **kw).eval()
    slow.load_state_dict(fast.state_dict())
    return fast, slow


def _inputs(seed=1, n_q=N_Q, n_k=N_K, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, n_q, D, generator=g).to(dtype)
    k = torch.randn(B, n_k, D, generator=g).to(dtype)
    v = torch.randn(B, n_k, D, generator=g).to(dtype)
    if grad:
        for t in (q, k, v):
            t.requires_grad_()
    return q, k, v


def _mask(case: str, score: str):
    """Mask cases; the query-less score has one (constant) query, so n_q = 1 for it."""
    n_q = 1 if score in QUERYLESS else N_Q
    if case == "none":
        return None
    if case == "padding":
        return masks.from_lengths(torch.tensor([N_K, 3]))
    if case == "causal":
        return masks.causal(n_q, N_K)
    if case == "fully-masked-row":
        # causal, plus key padding (batch element 1 has 2 keys), plus a first query that
        # may attend to nothing; for the query-less score batch element 1 has no key
        if score in QUERYLESS:
            return masks.from_lengths(torch.tensor([N_K, 0]))
        m = masks.combine(masks.causal(n_q, N_K), masks.from_lengths(torch.tensor([N_K, 2])))
        m = m.clone()
        m[:, 0] = False
        return m
    raise AssertionError(case)


def _empty_rows(mask, score):
    """[B, n_q] bool: rows without any allowed key."""
    n_q = 1 if score in QUERYLESS else N_Q
    if mask is None:
        return torch.zeros(B, n_q, dtype=torch.bool)
    m3 = mask if mask.dim() == 3 else mask[None]  # a 2-D mask is [n_q, n_k]
    return ~torch.broadcast_to(m3, (B, n_q, N_K)).any(-1)


# ------------------------------------------------------------------------------ building


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
def test_every_valid_combination_builds_and_runs(score, align, dim):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D)
    q, k, v = _inputs(grad=True)
    n_q_shape = () if score in QUERYLESS else (N_Q,)
    w_shape = (B, *n_q_shape, N_K) + ((D,) if dim == "multi" else ())
    for mode in ("train", "eval"):
        getattr(attn, mode)()
        # the context [B, (n_q,) d_v] and the weights [B, (n_q,) n_k (, d)], finite
        out = check_output(attn, (q, k, v), context_shape=(B, *n_q_shape, D), weights_shape=w_shape)
        if align in ("hard", "reinforced"):
            assert out.log_prob is not None
        out.context.sum().backward()


@pytest.mark.parametrize(("score", "align", "dim"), INVALID, ids=[ids(c) for c in INVALID])
def test_every_impossible_combination_raises_config_error(score, align, dim):
    with pytest.raises(ConfigError) as err:
        Attention(score, align, dim, d_q=D, d_k=D)
    msg = str(err.value)
    if dim == "multi" and score not in VECTOR_SCORES:
        assert "multi-dimensional" in msg and repr(score) in msg
    elif dim == "multi":
        assert repr(align) in msg and "dim='multi'" in msg
    else:
        assert repr(align) in msg and "query-less" in msg


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("score", ["dot", "scaled-dot", "cosine"])
def test_dot_scores_need_d_q_equal_d_k(score):
    with pytest.raises(ConfigError, match=r"d_q == d_k.*d_q=4, d_k=6"):
        Attention(score, d_q=4, d_k=6)
    # projecting the keys to the query size resolves the conflict
    attn = Attention(score, d_q=4, d_k=6, key_dim=4)
    assert attn(torch.randn(2, 3, 4), torch.randn(2, 5, 6)).context.shape == (2, 3, 6)


def test_multi_with_dot_names_the_conflict():
    with pytest.raises(ConfigError, match=r"multi-dimensional.*vector score.*'dot'"):
        Attention("dot", "soft", "multi", d_q=4, d_k=4)


@pytest.mark.parametrize("align", ["hard", "local-m", "local-p", "reinforced"])
def test_multi_with_non_per_feature_alignment_names_the_conflict(align):
    with pytest.raises(ConfigError, match=rf"alignment '{align}'.*dim='multi'"):
        Attention("additive", align, "multi", d_q=4, d_k=4)


@pytest.mark.parametrize("align", ["local-m", "local-p"])
def test_local_with_queryless_names_the_conflict(align):
    with pytest.raises(ConfigError, match=rf"local alignment '{align}'.*'queryless' is query-less"):
        Attention("queryless", align, d_q=4, d_k=4)


def test_unknown_option_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"unknown options \['hidden'\].*d_w"):
        Attention("additive", d_q=4, d_k=4, hidden=8)
    with pytest.raises(TypeError, match=r"unknown options \['D'\]"):
        Attention("dot", "soft", d_q=4, d_k=4, D=3)


def test_other_construction_errors():
    with pytest.raises(KeyError, match=r"unknown score 'bogus'"):
        Attention("bogus")
    with pytest.raises(KeyError, match=r"unknown align 'bogus'"):
        Attention("dot", "bogus")
    with pytest.raises(ConfigError, match=r"dim must be 'single' or 'multi'"):
        Attention(dim="triple")
    with pytest.raises(ConfigError, match=r"path must be 'auto' or 'explicit'"):
        Attention(path="fast")
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\)"):
        Attention(dropout=1.0)
    with pytest.raises(ConfigError, match=r"key_dim needs d_k"):
        Attention("additive", d_q=4, key_dim=3)
    with pytest.raises(ConfigError, match=r"value_dim needs d_v"):
        Attention(value_dim=3)
    with pytest.raises(ConfigError, match=r"GeneralScore needs d_q"):
        Attention("general", d_k=4)
    with pytest.raises(ConfigError, match=r"LocalPAlign needs d_q"):
        Attention("dot", "local-p")
    with pytest.raises(ConfigError, match=r"D .* must be an int >= 1"):
        Attention("dot", "local-m", D=0)


def test_modules_are_accepted_in_place_of_names():
    score = attnlab.general.AdditiveScore(d_q=4, d_k=4, d_w=3)
    align = attnlab.general.LocalMAlign(D=1)
    attn = Attention(score, align, d_q=4, d_k=4)
    assert attn.score is score
    assert attn.align is align
    assert attn.explain()[0] == "local-window"
    with pytest.raises(ConfigError, match=r"score must be a name or a Score module"):
        Attention(torch.nn.Linear(2, 2))


# ------------------------------------------------------------------- fast path vs explicit


MASK_CASES = ["none", "padding", "causal", "fully-masked-row"]


@pytest.mark.parametrize("case", MASK_CASES)
@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
def test_auto_path_agrees_with_explicit(score, align, dim, case):
    fast, slow = _pair(score, align, dim)
    mask = _mask(case, score)
    # rows with nothing to attend to: zero weights, finite context (the harness), and
    # exactly zero context, finite weights (below), never NaN
    empty = _empty_rows(mask, score)
    if score in QUERYLESS:
        empty = empty[:, 0]
    qf, kf, vf = _inputs(grad=True)
    qs, ks, vs = _inputs(grad=True)
    a = check_fully_masked_row(fast, Inputs((qf, kf, vf), {"mask": mask}), (empty,), backward=False)
    b = check_fully_masked_row(slow, Inputs((qs, ks, vs), {"mask": mask}), (empty,), backward=False)
    assert a.path == fast.explain(need_weights=True)[0]
    assert b.path == "explicit"
    torch.testing.assert_close(a.context, b.context, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=1e-5)
    if a.log_prob is not None or b.log_prob is not None:
        torch.testing.assert_close(a.log_prob, b.log_prob, rtol=1e-5, atol=1e-5)

    for out in (a, b):
        assert torch.isfinite(out.weights).all()
        assert (out.context[empty] == 0).all()

    # backward: finite, and the same gradients on both paths
    g = torch.Generator().manual_seed(7)
    r = torch.randn(a.context.shape, generator=g)
    (a.context * r).sum().backward()
    (b.context * r).sum().backward()
    for tf, ts in ((qf, qs), (kf, ks), (vf, vs)):
        if tf.grad is None:
            assert ts.grad is None or not ts.grad.any()
            continue
        assert torch.isfinite(tf.grad).all()
        torch.testing.assert_close(tf.grad, ts.grad, rtol=1e-4, atol=1e-5)
    if qf.grad is not None and score not in QUERYLESS and empty.any():
        assert (qf.grad[empty] == 0).all()
    for (name, pf), ps in zip(fast.named_parameters(), slow.parameters(), strict=True):
        if pf.grad is not None:
            assert torch.isfinite(pf.grad).all(), name
            torch.testing.assert_close(pf.grad, ps.grad, rtol=1e-4, atol=1e-5)


def test_multi_lean_path_agrees_with_explicit_without_weights():
    fast, slow = _pair("additive", "soft", "multi")
    for case in MASK_CASES:
        mask = _mask(case, "additive")
        q, k, v = _inputs()
        a = fast(q, k, v, mask=mask)
        b = slow(q, k, v, mask=mask)
        assert a.path == "lean-multi"
        torch.testing.assert_close(a.context, b.context, rtol=1e-5, atol=1e-5)


def test_agreement_with_projections_and_other_options():
    cases = [
        ("additive", "soft", "single", {"d_w": 7, "act": "relu", "key_dim": 5, "value_dim": 3}),
        ("general", "soft", "single", {"d_k": 6, "key_dim": 5, "value_dim": 3}),
        ("scaled-dot", "local-p", "single", {"D": 1, "d_p": 3}),
        ("additive", "local-m", "single", {"D": 2, "gaussian": True}),
        ("cosine", "soft", "single", {"temperature": 0.3}),
        ("additive", "soft", "multi", {"d_w": 3, "act": "sigmoid", "value_dim": 5}),
    ]
    for score, align, dim, kw in cases:
        fast, slow = _pair(score, align, dim, **kw)
        d_k = kw.get("d_k", D)
        g = torch.Generator().manual_seed(3)
        q = torch.randn(B, N_Q, D, generator=g)
        k = torch.randn(B, N_K, d_k, generator=g)
        mask = masks.from_lengths(torch.tensor([N_K, 4]))
        a = fast(q, k, mask=mask, need_weights=True)
        b = slow(q, k, mask=mask, need_weights=True)
        torch.testing.assert_close(a.context, b.context, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.weights, b.weights, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- explain


@pytest.mark.parametrize(
    ("score", "align", "dim", "need_weights", "path"),
    [
        ("scaled-dot", "soft", "single", False, "sdpa"),
        ("scaled-dot", "soft", "single", True, "sdpa"),
        ("dot", "soft", "single", False, "sdpa"),
        ("general", "soft", "single", False, "sdpa"),
        ("biased-general", "soft", "single", True, "sdpa"),
        ("cosine", "soft", "single", False, "sdpa"),
        ("additive", "soft", "single", False, "lean-additive"),
        ("additive", "soft", "single", True, "lean-additive"),
        ("additive", "sparsemax", "single", False, "lean-additive"),
        ("additive", "soft", "multi", False, "lean-multi"),
        ("additive", "soft", "multi", True, "explicit"),
        ("additive", "entmax15", "multi", False, "explicit"),
        ("queryless", "soft", "multi", False, "explicit"),
        ("dot", "local-m", "single", False, "local-window"),
        ("additive", "local-p", "single", True, "local-window"),
        ("cosine", "local-p", "single", False, "local-window"),
        ("activated-general", "soft", "single", False, "explicit"),
        ("queryless", "soft", "single", False, "explicit"),
        ("scaled-dot", "hard", "single", False, "explicit"),
        ("dot", "reinforced", "single", False, "explicit"),
        ("general", "sparsemax", "single", False, "explicit"),
        ("cosine", "entmax15", "single", False, "explicit"),
    ],
)
def test_explain_names_the_path_and_the_output_records_it(score, align, dim, need_weights, path):
    attn = Attention(score, align, dim, d_q=D, d_k=D).eval()
    got, reason = attn.explain(need_weights=need_weights)
    assert got == path
    assert isinstance(reason, str) and reason
    q, k, v = _inputs()
    assert attn(q, k, v, need_weights=need_weights).path == path
    explicit = Attention(score, align, dim, d_q=D, d_k=D, path="explicit")
    assert explicit.explain(need_weights) == ("explicit", "path='explicit' was requested")


def test_explain_reasons():
    assert "scaled_dot_product_attention" in Attention("dot", d_q=2, d_k=2).explain()[1]
    assert "[B, n_q, n_k, d_w]" in Attention("additive", d_q=2, d_k=2).explain()[1]
    assert "need_weights=True" in Attention("additive", dim="multi", d_q=2, d_k=2).explain(True)[1]
    assert "2D+1 = 7" in Attention("dot", "local-m", D=3).explain()[1]
    assert Attention("dot").explain(n_k=0)[0] == "explicit"


def test_multi_lean_with_dropout_in_training_is_explicit():
    attn = Attention("additive", "soft", "multi", d_q=D, d_k=D, dropout=0.2)
    assert attn.train().explain()[0] == "explicit"
    assert attn.eval().explain()[0] == "lean-multi"


# ---------------------------------------------------------------------------- need_weights


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
def test_need_weights_does_not_change_the_context(score, align, dim):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D).eval()
    inputs = Inputs(_inputs(), {"mask": _mask("fully-masked-row", score)})
    check_weights_none_unless_asked(attn, inputs)
    a, b = check_need_weights_keeps_context(attn, inputs, rtol=1e-6, atol=1e-7)
    if (score, align, dim) == ("additive", "soft", "multi"):
        # the only combination whose path changes: lean-multi -> explicit (documented)
        assert (a.path, b.path) == ("lean-multi", "explicit")
    else:
        assert a.path == b.path
        assert torch.equal(a.context, b.context)


# ------------------------------------------------------------------------ shapes / queries


@pytest.mark.parametrize(
    ("score", "align", "dim"),
    [
        ("scaled-dot", "soft", "single"),
        ("additive", "soft", "single"),
        ("general", "local-p", "single"),
        ("dot", "local-m", "single"),
        ("cosine", "hard", "single"),
        ("dot", "reinforced", "single"),
        ("additive", "soft", "multi"),
        ("additive", "sparsemax", "multi"),
    ],
)
def test_single_query(score, align, dim):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D).eval()
    q, k, v = _inputs()
    key_mask = torch.tensor([[True] * N_K, [True, False, True, True, False, False]])  # [B, n_k]
    # every masked key (1, 4 and 5 of example 1) gets exactly zero weight
    one = check_masked_keys_zero(attn, Inputs((q[:, 0], k, v), {"mask": key_mask}), key_mask)
    three = attn(q[:, :1], k, v, mask=key_mask[:, None, :], need_weights=True)
    assert one.context.shape == (B, D)
    assert one.weights.shape == ((B, N_K, D) if dim == "multi" else (B, N_K))
    torch.testing.assert_close(one.context, three.context[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(one.weights, three.weights[:, 0], rtol=0, atol=0)
    if one.log_prob is not None and align == "hard":
        assert one.log_prob.shape == (B,)
    if align == "local-p":
        assert one.extras["centers"].shape == (B,)
    assert (one.weights[1, 1] == 0).all()


@pytest.mark.parametrize("dim", ["single", "multi"])
def test_queryless_without_query(dim):
    torch.manual_seed(0)
    attn = Attention("queryless", "soft", dim, d_k=D, d_v=3).eval()
    _, k, _ = _inputs()
    v = torch.randn(B, N_K, 3)
    w_shape = (B, N_K, 3) if dim == "multi" else (B, N_K)
    check_output(attn, (None, k, v), context_shape=(B, 3), weights_shape=w_shape)
    out2 = attn(
        key=k, value=v, mask=torch.tensor([[True] * N_K, [True, True, False, False, False, False]])
    )
    assert out2.context.shape == (B, 3)


def test_values_default_to_the_features_and_d_v_may_differ():
    torch.manual_seed(0)
    attn = Attention("scaled-dot", d_q=D, d_k=D)
    q, k, _ = _inputs()
    assert torch.equal(attn(q, k).context, attn(q, k, k).context)
    attn_v = Attention("additive", d_q=D, d_k=D, d_v=3)
    assert attn_v(q, k, torch.randn(B, N_K, 3)).context.shape == (B, N_Q, 3)
    with pytest.raises(ValueError, match=r"value is None.*d_v=3.*\[2, 6, 3\]"):
        attn_v(q, k)


# ------------------------------------------------------------------- the call convention


def test_forward_follows_the_call_convention():
    params = list(inspect.signature(Attention.forward).parameters.values())
    assert [p.name for p in params[1:4]] == ["query", "key", "value"]
    keyword_only = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert keyword_only == {"mask", "need_weights", "positions", "prev_weights"}


def test_old_keywords_warn_at_the_callers_line_and_give_the_same_numbers():
    torch.manual_seed(0)
    attn = Attention("additive", d_q=D, d_k=D, d_v=3).eval()
    q, k, _ = _inputs()
    v = torch.randn(B, N_K, 3)
    mask = masks.from_lengths(torch.tensor([N_K, 3]))
    want = attn(q, k, v, mask=mask, need_weights=True)
    assert torch.equal(attn(query=q, key=k, value=v, mask=mask).context, want.context)
    with pytest.warns(DeprecationWarning) as caught:
        old = attn(q=q, k=k, v=v, mask=mask, need_weights=True)
    messages = [str(w.message) for w in caught]
    for o, n in (("q", "query"), ("k", "key"), ("v", "value")):
        assert f"Attention: the argument '{o}' is deprecated; use '{n}'" in " ".join(messages)
    assert all("removed in attnlab 0.2.0" in m for m in messages)
    assert {w.filename for w in caught} == {__file__}, "not attributed to the caller's line"
    assert torch.equal(old.context, want.context) and torch.equal(old.weights, want.weights)
    # mixed: old and new names in one call
    with pytest.warns(DeprecationWarning, match=r"'k' is deprecated; use 'key'"):
        mixed = attn(q, k=k, value=v, mask=mask)
    assert torch.equal(mixed.context, want.context)


def test_old_keywords_of_a_queryless_score():
    torch.manual_seed(0)
    attn = Attention("queryless", d_k=D).eval()
    _, k, _ = _inputs()
    with pytest.warns(DeprecationWarning, match=r"'k' is deprecated; use 'key'"):
        old = attn(k=k, need_weights=True)
    new = attn(key=k, need_weights=True)
    assert torch.equal(old.context, new.context) and torch.equal(old.weights, new.weights)
    assert torch.equal(attn(None, k).context, new.context)


def test_keyword_calls_compile_without_graph_breaks():
    """The deprecation handling costs a call with the new keywords nothing under
    torch.compile (the positional calls are covered by tests/general/test_compile.py)."""
    attn = Attention("additive", d_q=D, d_k=D).eval()
    q, k, v = _inputs()
    mask = masks.from_lengths(torch.tensor([N_K, 3]))
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(attn)(query=q, key=k, value=v, mask=mask)
        assert explained.graph_break_count == 0, explained.break_reasons
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda a, q, k: a(q, k, q=q), "got both 'q' and its new name 'query'"),
        (lambda a, q, k: a(query=q, key=k, q=q), "got both 'q' and its new name 'query'"),
        (lambda a, q, k: a(q, key=k, k=k), "got both 'k' and its new name 'key'"),
        (lambda a, q, k: a(q, k, k, v=k), "got both 'v' and its new name 'value'"),
        (lambda a, q, k: a(q, k, values=k), "got an unexpected keyword argument 'values'"),
    ],
)
def test_an_old_keyword_with_its_new_name_is_a_one_line_type_error(call, needle):
    attn = Attention("scaled-dot", d_q=D, d_k=D)
    q, k, _ = _inputs()
    with pytest.raises(TypeError, match=re.escape(f"Attention.forward() {needle}")) as err:
        call(attn, q, k)
    assert "\n" not in str(err.value)


def _naive_scaled_dot(q, keys, values, mask):
    """softmax(q . k / sqrt(d)) v by loops."""
    out = torch.zeros(q.shape[0], q.shape[1], values.shape[-1], dtype=q.dtype)
    d = keys.shape[-1]
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            e = {
                l: sum(float(q[b, i, x]) * float(keys[b, l, x]) for x in range(d)) / math.sqrt(d)
                for l in range(keys.shape[1])
                if bool(mask[b, 0, l])
            }
            a = naive_softmax(e)
            for f in range(values.shape[-1]):
                out[b, i, f] = sum(a_l * float(values[b, l, f]) for l, a_l in a.items())
    return out


def test_key_and_value_projections_against_loops():
    torch.manual_seed(0)
    attn = Attention("scaled-dot", d_q=3, d_k=D, d_v=5, key_dim=3, value_dim=2).double()
    assert attn.key_proj.weight.shape == (3, D)  # W_K [key_dim, d_k]
    assert attn.value_proj.weight.shape == (2, 5)  # W_V [value_dim, d_v]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(B, N_Q, 3, generator=g, dtype=torch.float64)
    f = torch.randn(B, N_K, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, N_K, 5, generator=g, dtype=torch.float64)
    mask = masks.from_lengths(torch.tensor([N_K, 4]))
    out = attn(q, f, v, mask=mask)
    assert out.context.shape == (B, N_Q, 2)
    WK, bK = attn.key_proj.weight.detach(), attn.key_proj.bias.detach()
    WV, bV = attn.value_proj.weight.detach(), attn.value_proj.bias.detach()
    keys = torch.tensor(
        [
            [
                [
                    sum(float(WK[j, x] * f[b, l, x]) for x in range(D)) + float(bK[j])
                    for j in range(3)
                ]
                for l in range(N_K)
            ]
            for b in range(B)
        ],
        dtype=torch.float64,
    )
    values = torch.tensor(
        [
            [
                [
                    sum(float(WV[j, x] * v[b, l, x]) for x in range(5)) + float(bV[j])
                    for j in range(2)
                ]
                for l in range(N_K)
            ]
            for b in range(B)
        ],
        dtype=torch.float64,
    )
    want = _naive_scaled_dot(q, keys, values, mask)
    torch.testing.assert_close(out.context, want, rtol=1e-10, atol=1e-12)


def test_scaled_dot_soft_against_loops_without_projection():
    attn = Attention("scaled-dot", d_q=D, d_k=D).double()
    q, k, v = (t.double() for t in _inputs())
    mask = masks.from_lengths(torch.tensor([N_K, 2]))
    torch.testing.assert_close(
        attn(q, k, v, mask=mask).context, _naive_scaled_dot(q, k, v, mask), rtol=1e-10, atol=1e-12
    )


# --------------------------------------------------------------------------------- dropout


@pytest.mark.parametrize(
    ("score", "align", "dim"),
    [
        ("scaled-dot", "soft", "single"),
        ("additive", "soft", "single"),
        ("dot", "local-m", "single"),
        ("additive", "soft", "multi"),
        ("general", "sparsemax", "single"),
    ],
)
def test_dropout_train_vs_eval(score, align, dim):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D, dropout=0.5)
    e1, t1, t2 = check_dropout_only_in_training(attn, _inputs(n_k=12), need_weights=True)
    # the returned weights are those before dropout
    torch.testing.assert_close(t1.weights, e1.weights, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(t2.weights, e1.weights, rtol=1e-6, atol=1e-6)


def test_no_dropout_train_equals_eval_for_deterministic_alignments():
    torch.manual_seed(0)
    attn = Attention("additive", d_q=D, d_k=D)
    q, k, v = _inputs()
    assert torch.equal(attn.train()(q, k, v).context, attn.eval()(q, k, v).context)


# ------------------------------------------------------------------------------- bad input


def _err(exc, call, *parts):
    with pytest.raises(exc) as err:
        call()
    for p in parts:
        assert p in str(err.value), (p, str(err.value))


def test_bad_shapes_name_argument_shape_and_expected_shape():
    attn = Attention("additive", d_q=D, d_k=D, d_v=3)
    q, k, _ = _inputs()
    v = torch.randn(B, N_K, 3)
    _err(ValueError, lambda: attn(q[..., :3], k, v), "query has shape (2, 4, 3)", "[2, n_q, 4]")
    _err(ValueError, lambda: attn(q[None], k, v), "query has shape (1, 2, 4, 4)", "[B, n_q, d_q]")
    _err(
        ValueError,
        lambda: attn(q[:1], k, v),
        "query has shape (1, 4, 4) and key (2, 6, 4)",
        "batch sizes differ (1 != 2)",
        "[2, n_q, 4]",
    )
    # a single query [B, d_q]: its own layout in the messages
    _err(ValueError, lambda: attn(q[:1, 0], k, v), "query has shape (1, 4)", "[B, d_q] = [2, 4]")
    _err(ValueError, lambda: attn(q[:, 0, :3], k, v), "query has shape (2, 3)", "[B, d_q] = [2, 4]")
    _err(ValueError, lambda: attn(q, k[..., :3], v), "key has shape (2, 6, 3)", "[2, 6, 4]")
    _err(ValueError, lambda: attn(q, k[0], v), "key has shape (6, 4)", "[B, n_k, d_k]")
    _err(ValueError, lambda: attn(q, k, v[:, :5]), "value has shape (2, 5, 3)", "[2, 6, 3]")
    _err(ValueError, lambda: attn(q, k, v[:1]), "value has shape (1, 6, 3)", "[2, 6, 3]")
    _err(ValueError, lambda: attn(q, k, v[..., :2]), "value has shape (2, 6, 2)", "[2, 6, 3]")
    _err(ValueError, lambda: attn(q, None, v), "key (the features / keys) is required")
    _err(ValueError, lambda: attn(None, k, v), "score 'additive' needs a query, got query=None")


def test_bad_masks():
    attn = Attention("scaled-dot", d_q=D, d_k=D)
    q, k, v = _inputs()
    _err(
        ValueError,
        lambda: attn(q, k, v, mask=torch.ones(3, 1, N_K, dtype=torch.bool)),
        "mask has shape (3, 1, 6)",
        "[2, 4, 6]",
    )
    _err(
        ValueError,
        lambda: attn(q, k, v, mask=torch.ones(B, N_K, dtype=torch.bool)),
        "mask has shape (2, 6)",
        "[2, 4, 6]",
    )
    _err(
        ValueError,
        lambda: attn(q, k, v, mask=torch.ones(B, N_Q, N_K - 1, dtype=torch.bool)),
        "mask has shape (2, 4, 5)",
    )
    # a float mask: a one-line TypeError naming the mask and the fix
    allowed = torch.ones(B, 1, N_K, dtype=torch.bool)
    err = check_wrong_dtype(
        attn, Inputs((q, k, v), {"mask": allowed}), "mask", match=r"mask has dtype torch\.float32"
    )
    assert "from_additive" in str(err.value)
    _err(
        ValueError,
        lambda: attn(q, k, v, mask=torch.ones(B, 1, N_K, dtype=torch.bool, device="meta")),
        "mask is on meta",
    )


def test_dtype_and_device_mismatch():
    attn = Attention("scaled-dot", d_q=D, d_k=D)
    q, k, v = _inputs()
    # one input of another dtype: a one-line TypeError naming it (float64 by default)
    err = check_wrong_dtype(attn, (q, k, v), "query", match=r"query has dtype torch\.float64")
    assert "key has dtype torch.float32" in str(err.value)
    check_wrong_dtype(attn, (q, k, v), "value", match=r"value has dtype torch\.float64")
    err = check_wrong_dtype(
        attn, (q, k, v), "key", dtype=torch.int64, match=r"key has dtype torch\.int64"
    )
    assert "floating-point" in str(err.value)
    _err(ValueError, lambda: attn(q.to("meta"), k, v), "query is on meta")
    # inputs of another dtype than the module's parameters: a TypeError, not a matmul crash
    with_params = Attention("general", d_q=D, d_k=D)
    _err(
        TypeError,
        lambda: with_params(q.double(), k.double(), v.double()),
        "key has dtype torch.float64",
        "parameters",
        "torch.float32",
    )
    _err(
        ValueError,
        lambda: with_params(q.to("meta"), k.to("meta"), v.to("meta")),
        "key is on meta",
        "parameters",
    )


# ---------------------------------------------------------------------------- empty key set


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_empty_key_set(score, align, dim, mode):
    torch.manual_seed(0)
    attn = getattr(Attention(score, align, dim, d_q=D, d_k=D), mode)()
    q, k, v = _inputs(n_k=0, grad=True)
    # every row may attend to nothing: finite context, finite gradients (the harness, which
    # also runs the backward pass); exactly zero context and gradients (below)
    out = check_fully_masked_row(attn, (q, k, v), (...,))
    n_q_shape = () if score in QUERYLESS else (N_Q,)
    assert out.path == "explicit"
    assert torch.equal(out.context, torch.zeros(B, *n_q_shape, D))
    assert out.weights.shape == (B, *n_q_shape, 0) + ((D,) if dim == "multi" else ())
    if align in ("hard", "reinforced"):
        assert not out.log_prob.any()
    for t in (q, k, v):
        assert t.grad is None or not t.grad.any()


# ------------------------------------------------------------------------------ NaN input


def _attention_and_clean_rest(score, align, dim, path):
    """For the tests that spoil batch element 0 of the inputs: the attention (seed 0, in
    evaluation mode), the inputs ``(q, k, v)`` and its output (with weights) on the clean
    batch elements ``1:``, to which the spoiled call's elements 1: must be equal."""
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D, path=path).eval()
    q, k, v = _inputs()
    return attn, (q, k, v), attn(q[1:], k[1:], v[1:], need_weights=True)


@pytest.mark.parametrize(("score", "align", "dim"), VALID, ids=[ids(c) for c in VALID])
@pytest.mark.parametrize("path", ["auto", "explicit"])
def test_nan_in_a_key_poisons_only_its_batch_element(score, align, dim, path):
    attn, (q, k, v), clean = _attention_and_clean_rest(score, align, dim, path)
    k[0, 2, 1] = float("nan")  # an allowed key, inside every window (D = 8 > n_k)
    out = attn(q, k, v, need_weights=True)
    assert torch.isnan(out.context[0]).all()
    assert torch.isnan(out.weights[0]).all()
    # the other batch element is untouched
    torch.testing.assert_close(out.context[1:], clean.context, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.weights[1:], clean.weights, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("score", "align", "dim"),
    [c for c in VALID if c[0] not in QUERYLESS],
    ids=[ids(c) for c in VALID if c[0] not in QUERYLESS],
)
def test_nan_in_a_query_poisons_only_its_row(score, align, dim):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=D, d_k=D).eval()
    q, k, v = _inputs()
    clean = attn(q, k, v, need_weights=True)
    q[0, 1, 3] = float("nan")
    out = attn(q, k, v, need_weights=True)
    poisoned = torch.zeros(B, N_Q, dtype=torch.bool)
    poisoned[0, 1] = True
    assert torch.isnan(out.context[poisoned]).all()
    assert torch.isnan(out.weights[poisoned]).all()
    # float32 rounding only: the batched kernels may sum the clean rows in another order
    torch.testing.assert_close(
        out.context[~poisoned], clean.context[~poisoned], rtol=1e-5, atol=1e-6
    )


def test_nan_in_a_value_poisons_the_features_that_sum_over_it():
    for score in ("scaled-dot", "additive"):
        for path in ("auto", "explicit"):
            attn = Attention(score, d_q=D, d_k=D, path=path)
            q, k, v = _inputs()
            v[0, 3, 2] = float("nan")
            c = attn(q, k, v).context
            assert torch.isnan(c[0, :, 2]).all()
            assert torch.isfinite(c[0, :, [0, 1, 3]]).all()
            assert torch.isfinite(c[1]).all()


def test_nan_in_training_mode_is_not_an_error_for_stochastic_alignments():
    for align in ("hard", "reinforced"):
        attn = Attention("additive", align, d_q=D, d_k=D).train()
        q, k, v = _inputs()
        k[0, 0, 0] = float("nan")
        out = attn(q, k, v, need_weights=True)
        assert torch.isnan(out.context[0]).all()
        assert torch.isfinite(out.context[1]).all()


# -------------------------------------------------------------------------- half precision


HALF_CASES = [
    ("scaled-dot", "soft", "single"),
    ("general", "soft", "single"),
    ("additive", "soft", "single"),
    ("additive", "soft", "multi"),
    ("dot", "local-p", "single"),
    ("cosine", "sparsemax", "single"),
    ("activated-general", "entmax15", "single"),
]


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.bfloat16, 5e-2), (torch.float16, 5e-3)], ids=["bf16", "fp16"]
)
@pytest.mark.parametrize(("score", "align", "dim"), HALF_CASES, ids=[ids(c) for c in HALF_CASES])
def test_half_precision_close_to_float32(score, align, dim, dtype, tol):
    torch.manual_seed(0)
    ref = Attention(score, align, dim, d_q=D, d_k=D).eval()
    half = Attention(score, align, dim, d_q=D, d_k=D).eval()
    half.load_state_dict(ref.state_dict())
    half.to(dtype)
    q, k, v = _inputs()
    mask = _mask("fully-masked-row", score)
    want = ref(q, k, v, mask=mask, need_weights=True)
    qh, kh, vh = (t.to(dtype) for t in (q, k, v))
    got = half(qh, kh, vh, mask=mask, need_weights=True)
    assert got.context.dtype == dtype
    assert got.weights.dtype == dtype
    assert got.path == want.path
    torch.testing.assert_close(got.context.float(), want.context, rtol=tol, atol=tol)
    torch.testing.assert_close(got.weights.float(), want.weights, rtol=tol, atol=tol)
    # finite gradients reach the query, the key, the value and every parameter
    check_gradients(half, Inputs((qh, kh, vh), {"mask": mask}), need_weights=True)


def test_half_inputs_with_a_float32_module_is_a_type_error():
    attn = Attention("additive", d_q=D, d_k=D)
    q, k, v = (t.bfloat16() for t in _inputs())
    with pytest.raises(TypeError, match=r"key has dtype torch.bfloat16.*\.to\(torch.bfloat16\)"):
        attn(q, k, v)


# -------------------------------------------------------------------------------- gradcheck


@pytest.mark.parametrize(
    ("score", "align", "dim", "kw", "path"),
    [
        ("scaled-dot", "soft", "single", {}, "sdpa"),
        ("additive", "soft", "single", {"d_w": 2}, "lean-additive"),
        ("general", "local-p", "single", {"D": 1, "d_p": 2}, "local-window"),
        ("additive", "soft", "multi", {"d_w": 2}, "lean-multi"),
    ],
)
def test_gradcheck_float64(score, align, dim, kw, path):
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=2, d_k=2, **kw).double().eval()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 2, generator=g, dtype=torch.float64, requires_grad=True)
    # key padding, and (except for local-p, whose window centre scales with the number of
    # allowed keys) a query row with no key at all
    mask = masks.from_lengths(torch.tensor([4, 3])).expand(2, 3, 4).clone()
    if align != "local-p":
        mask[1, 1] = False
    assert attn(q, k, v, mask=mask).path == path
    params = list(attn.parameters())

    def f(q, k, v, *ps):
        return attn(q, k, v, mask=mask).context

    assert torch.autograd.gradcheck(f, (q, k, v, *params), atol=1e-6, rtol=1e-4)


def test_a_query_given_to_a_query_less_score_is_deprecated_and_ignored():
    # the query of a query-less score is learned: a query passed in used to be dropped
    # silently (the context is [B, d_v] whatever its shape); now it warns, naming the fix
    torch.manual_seed(0)
    attn = Attention("queryless", d_k=D)
    _, k, v = _inputs()
    want = attn(None, k, v)
    with pytest.warns(DeprecationWarning, match=r"query-less .* call attn\(None, key\)"):
        got = attn(torch.randn(B, N_Q, D), k, v)
    assert torch.equal(got.context, want.context) and got.context.shape == (B, D)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn(None, k, v)  # the documented call does not warn


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"d_q": 4, "d_k": 4, "d_v": 2.5}, "d_v"),
        ({"d_q": 4, "d_k": 4, "d_v": 0}, "d_v"),
        ({"d_q": True, "d_k": 4}, "d_q"),
        ({"d_q": 4, "d_k": "4"}, "d_k"),
        ({"d_q": 4, "d_k": 4, "key_dim": True}, "key_dim"),
        ({"d_q": 4, "d_k": 4, "value_dim": 0}, "value_dim"),
        ({"d_q": 4, "d_k": 4, "value_dim": -1}, "value_dim"),
    ],
)
def test_attention_sizes_are_positive_ints(kwargs: dict, name: str) -> None:
    """``d_v`` was stored unchecked (2.5, "3", 0 accepted), ``value_dim=0`` built an empty
    projection, and bools or text reached ``nn.Linear`` (a deep torch error)."""
    with pytest.raises(ConfigError, match=rf"^Attention: {name} must be a positive int, got"):
        Attention("additive", **kwargs)


def test_attention_plan_checks_its_settings() -> None:
    """``plan(need_weights="no")`` planned a call with weights; ``n_k=2.5`` was taken."""
    attn = Attention("additive", d_q=4, d_k=4)
    with pytest.raises(TypeError, match=r"^need_weights must be a bool, got 'no'$"):
        attn.plan(need_weights="no")
    with pytest.raises(ValueError, match=r"^n_k must be an int >= 0 or None, got 2\.5$"):
        attn.explain(n_k=2.5)


@pytest.mark.parametrize(
    ("score", "align", "dim", "kernel", "formula", "kw"),
    [
        ("additive", "soft", "single", "triton", "explicit", {}),
        ("additive", "soft", "multi", "triton", "explicit", {}),
        ("scaled-dot", "local-m", "single", "local-triton", "local-window", {"D": 1}),
        ("dot", "local-m", "single", "local-flex", "local-window", {"D": 1, "gaussian": False}),
    ],
)
def test_triton_paths_take_the_formula_under_torch_func(
    score, align, dim, kernel, formula, kw, monkeypatch
):
    """The Triton kernels' custom operators have no torch.func rule: where the planner
    picks one (or FlexAttention), a call under vmap takes the formula path it stands for
    (and says so in ``path``), with the same result as that path in eager mode."""
    torch.manual_seed(0)
    attn = Attention(score, align, dim, d_q=4, d_k=4, **kw).eval()
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, :, 3:] = False
    want = Attention(score, align, dim, d_q=4, d_k=4, path="explicit", **kw).eval()
    want.load_state_dict(attn.state_dict())
    expected = want(q, k, mask=mask)
    # the planner's choice on a GPU (before plan_call's torch.func switch)
    for name in ("_plan_single", "_plan_multi", "_plan_local"):
        real = getattr(planner, name)
        monkeypatch.setattr(planner, name, lambda *a, real=real: replace(real(*a), path=kernel))

    def one(qi, ki, mi):
        out = attn(qi[None], ki[None], mask=mi[None])
        assert out.path == formula
        return out.context[0]

    got = torch.func.vmap(one)(q, k, mask)
    torch.testing.assert_close(got, expected.context)
