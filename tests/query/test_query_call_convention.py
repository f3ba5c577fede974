"""The one call convention of the query modules (``docs/call-convention.md``): the shared
attention harness run on every query attention module, the documented table, and the
deprecated forms (old names and positions, one release, ``DeprecationWarning``)."""

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
from attention_harness import (
    Inputs,
    check_fully_masked_row,
    check_gradients,
    check_masked_keys_zero,
    check_need_weights_keeps_context,
    check_output,
    check_rebuild,
    check_wrong_dtype,
    run_attention_test,
)

import attnlab
from attnlab import masks, registry
from attnlab.query import (
    AttentionOverAttention,
    CapsuleAttention,
    CapsuleOutput,
    CapsuleRouting,
    ConcatenatedKeyValueAttention,
    ConstantQuerySelfAttention,
    GraphAttention,
    KeyValueAttention,
    LearnedQuerySelfAttention,
    LinformerAttention,
    LSHAttention,
    MultiHeadAttention,
    MultiHopAttention,
    RelationalSelfAttention,
    RelativePositionAttention,
    RoutingOutput,
    SynthesizerAttention,
    TransformerXLAttention,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"
B, N, D = 2, 5, 8
LENGTHS = torch.tensor([N, 3])
KEY_MASK = masks.from_lengths(LENGTHS)  # [B, 1, N]
REAL = KEY_MASK[:, 0]  # [B, N]


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*(shape or (B, N, D)), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- multi-head style

#: modules with ``forward(query, key=None, value=None, *, mask, causal, need_weights,
#: average_weights)``: (builder, self-attention only)
HEADS = {
    "multi-head": (lambda: MultiHeadAttention(D, 2), False),
    "multi-head-additive": (lambda: MultiHeadAttention(D, 2, score="additive"), False),
    "relative-positions": (lambda: RelativePositionAttention(D, 2, max_distance=2), False),
    "linformer": (lambda: LinformerAttention(D, 2, max_len=N, proj_len=3), False),
    "synthesizer": (lambda: SynthesizerAttention(D, 2, max_len=N), False),
    "reformer": (lambda: LSHAttention(D, 2, bucket_size=2, n_hashes=2, seed=0), True),
    "transformer-xl": (lambda: TransformerXLAttention(D, 2), True),
    "graph-attention": (lambda: GraphAttention(D, 2, self_loops=False), True),
    "graph-attention-v2": (lambda: GraphAttention(D, 2, version="v2", self_loops=False), True),
}


@pytest.mark.parametrize("case", sorted(HEADS))
def test_head_modules_on_the_harness(case):
    torch.manual_seed(0)
    build, self_only = HEADS[case]
    module = build()
    x = _x(1)
    run_attention_test(
        module,
        Inputs((x,), {"mask": KEY_MASK}),
        context_shape=(B, N, D),
        weights_shape=(B, N, N) if case != "linformer" else (B, N, 3),
        mask=KEY_MASK if case != "linformer" else None,
        # Linformer's weights are over the projected positions (no key axis to mask)
    )
    if not self_only:
        kv = _x(2, B, 4, D)
        check_output(module, Inputs((x, kv)), context_shape=(B, N, D))
        check_gradients(module, Inputs((x, kv)))


@pytest.mark.parametrize("case", ["multi-head", "relative-positions", "synthesizer"])
def test_head_modules_fully_masked_row_gives_the_output_bias(case):
    torch.manual_seed(0)
    module = HEADS[case][0]()
    full = torch.ones(B, N, N, dtype=torch.bool)
    full[0, 1] = False  # query 1 of example 0 may attend nothing
    x = _x(1).requires_grad_()
    check_fully_masked_row(
        module, Inputs((x,), {"mask": full}), (0, 1), expected_context=module.out_proj.bias
    )


@pytest.mark.parametrize("case", sorted(HEADS))
def test_head_modules_share_one_forward(case):
    module = HEADS[case][0]()
    params = list(inspect.signature(module.forward).parameters.values())
    assert [p.name for p in params[:3]] == ["query", "key", "value"]
    keyword_only = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert {"mask", "causal", "need_weights", "average_weights"} <= keyword_only


@pytest.mark.parametrize("case", sorted(HEADS))
def test_head_modules_refuse_an_unknown_keyword_by_the_module_name(case):
    module = HEADS[case][0]()
    name = type(module).__name__
    x = _x(1)
    with pytest.raises(
        TypeError, match=rf"^{name}\.forward\(\) got an unexpected keyword argument 'kees'$"
    ):
        module(x, kees=x)
    with pytest.raises(TypeError, match=rf"^{name}\.forward\(\) takes from 1 to 4 positional"):
        module(x, None, None, x)
    # the mechanism's own keywords still arrive
    if case == "transformer-xl":
        memory = _x(2, B, 3, D)
        assert module(x, memory=memory).context.shape == (B, N, D)


@pytest.mark.parametrize("case", ["reformer", "transformer-xl", "graph-attention"])
def test_self_only_modules_refuse_another_key(case):
    module = HEADS[case][0]()
    with pytest.raises(ValueError, match="is self-attention only: key must be None"):
        module(_x(1), _x(2))


# ----------------------------------------------------------------------------- key-value family


def test_key_value_modules_on_the_harness():
    torch.manual_seed(0)
    q, k, v = _x(1, B, 3, D), _x(2), _x(3, B, N, 4)
    kv = KeyValueAttention(D, D, 4, score="general")
    inputs = Inputs((q, k, v), {"mask": KEY_MASK})
    run_attention_test(kv, inputs, context_shape=(B, 3, 4), weights_shape=(B, 3, N), mask=REAL)
    single = check_output(kv, Inputs((q[:, 0], k, v), {"mask": REAL}), context_shape=(B, 4))
    assert single.weights.shape == (B, N)
    cat = ConcatenatedKeyValueAttention(D, D, 4, num_queries=3, score="general")
    run_attention_test(cat, inputs, context_shape=(B, 12), weights_shape=(B, 3, N), mask=REAL)
    hop = MultiHopAttention(D, D, 4, hops=2)
    out = check_output(hop, inputs, context_shape=(B, 3, 4), weights_shape=(B, 2, 3, N))
    check_masked_keys_zero(hop, inputs, REAL[:, None, None, :])
    check_need_weights_keeps_context(hop, inputs)
    check_gradients(hop, inputs)
    check_wrong_dtype(hop, inputs, "key", match="key has dtype torch.float64")
    check_rebuild(hop, hops=2)
    assert out.extras["contexts"][0].shape == (B, 3, 4)


def test_key_value_self_attention_default():
    """``key`` defaults to ``query`` and ``value`` to ``key``."""
    torch.manual_seed(0)
    x = _x(1)
    for module in (KeyValueAttention(), ConcatenatedKeyValueAttention(concat=False)):
        torch.testing.assert_close(module(x).context, module(x, x, x).context)


def test_fully_masked_query_gives_zeros():
    q, k = _x(1, B, 3, D), _x(2)
    none = torch.zeros(B, 3, N, dtype=torch.bool)
    none[1] = True
    for module in (KeyValueAttention(), MultiHopAttention(D, D, hops=2)):
        check_fully_masked_row(
            module,
            Inputs((q, k), {"mask": none}),
            (0,),
            expected_context=torch.zeros(3, D),
            weights_of=(lambda o: o.weights)
            if module.__class__ is KeyValueAttention
            else (lambda o: o.weights[:, -1]),
        )


# ----------------------------------------------------------------------------- learned queries


LEARNED = {
    "constant-query": (lambda: ConstantQuerySelfAttention(D), (B, D), (B, N)),
    "constant-query-multi": (
        lambda: ConstantQuerySelfAttention(D, dim="multi", value_dim=4),
        (B, 4),
        (B, N, 4),
    ),
    "learned-query": (lambda: LearnedQuerySelfAttention(D, 3, key_dim=5), (B, 3, D), (B, 3, N)),
    "learned-query-single": (lambda: LearnedQuerySelfAttention(D), (B, D), (B, N)),
    "relational": (lambda: RelationalSelfAttention(D), (B, N, D), (B, N, N)),
}


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_learned_query_modules_on_the_harness(case):
    torch.manual_seed(0)
    build, context_shape, weights_shape = LEARNED[case]
    module = build()
    mask = REAL if case != "relational" else KEY_MASK
    run_attention_test(
        module,
        Inputs((_x(1),), {"mask": mask}),
        context_shape=context_shape,
        weights_shape=weights_shape,
        mask=REAL,
        atol=1e-5,
    )


@pytest.mark.parametrize("case", ["constant-query", "learned-query", "learned-query-single"])
def test_learned_query_fully_masked_sequence_gives_zeros(case):
    torch.manual_seed(0)
    module = LEARNED[case][0]()
    none = REAL.clone()
    none[1] = False
    x = _x(1).requires_grad_()
    out = check_fully_masked_row(module, Inputs((x,), {"mask": none}), (1,))
    assert torch.equal(out.context[1], torch.zeros_like(out.context[1]))


@pytest.mark.parametrize("case", ["constant-query", "learned-query"])
def test_learned_query_separate_key_and_value(case):
    """An explicit ``value`` separates what is scored from what is averaged: the weights
    depend on ``key`` only."""
    torch.manual_seed(0)
    module = LEARNED[case][0]().eval()
    x, v = _x(1), _x(2, B, N, D)
    same = module(x, need_weights=True)
    other = module(x, x, v, need_weights=True)
    torch.testing.assert_close(other.weights, same.weights)
    assert not torch.allclose(other.context, same.context)
    # the features given as query are not read when key and value are given
    check_gradients(module, Inputs((x, x, v)), skip_inputs=("query",))


def test_capsule_modules_on_the_harness():
    torch.manual_seed(0)
    x = _x(1)
    caps = CapsuleAttention(D, 3)
    inputs = Inputs((x,), {"mask": REAL})
    out = check_output(
        caps,
        inputs,
        context_shape=(B, 3),
        weights_shape=(B, 3, N),
        output_type=CapsuleOutput,
        context_of=lambda o: o.probs,
    )
    assert out.contexts.shape == (B, 3, D)
    check_masked_keys_zero(caps, inputs, REAL[:, None, :])
    check_gradients(caps, inputs, output_of=lambda o: o.reconstructions)
    check_wrong_dtype(caps, inputs, "query")
    check_rebuild(caps, num_classes=3)
    routing = CapsuleRouting(D, 3, d_caps=4)
    out = routing(x, mask=REAL)
    assert isinstance(out, RoutingOutput) and out.weights.shape == (B, 3, N)
    assert torch.equal(out.weights[1, :, 3:], torch.zeros(3, 2))
    check_gradients(routing, inputs, output_of=lambda o: o.capsules)
    check_wrong_dtype(routing, inputs, "query")
    check_rebuild(routing, d_caps=4)
    for module in (caps, routing, RelationalSelfAttention(D)):
        with pytest.raises(ValueError, match="is self-attention only: key must be None"):
            module(x, _x(2))


# ----------------------------------------------------------------------------- the table


def _table_rows() -> dict[str, str]:
    text = (DOCS / "call-convention.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def test_the_table_names_every_attention_module():
    text = (DOCS / "call-convention.md").read_text(encoding="utf-8")
    rows = _table_rows()
    for kind in ("attention", "query", "feature"):
        for entry in registry.entries(kind):
            assert f"`{entry.cls.__name__}" in text, f"{entry.cls.__name__} not in the table"
    for cls in (MultiHeadAttention, KeyValueAttention, ConstantQuerySelfAttention):
        assert cls.__name__ in rows


@pytest.mark.parametrize(
    "entry",
    [
        e
        for e in registry.entries("query")
        if "(query" in _table_rows().get(e.cls.__name__, "")
        or _table_rows().get(e.cls.__name__, "").startswith("as ")
    ],
    ids=lambda e: e.name,
)
def test_the_table_matches_the_signatures(entry):
    """Every keyword the table documents for a query module is a parameter of its forward."""
    row = _table_rows()[entry.cls.__name__]
    params = dict(inspect.signature(entry.cls.forward).parameters)
    assert list(params)[1] == "query"
    attend = getattr(entry.cls, "_attend", None)  # the extras of a shared forward
    if attend is not None:
        params.update(inspect.signature(attend).parameters)
    for name in re.findall(r"(\w+)=", row):
        assert name in params, f"{entry.cls.__name__}.forward has no {name!r}"


# ----------------------------------------------------------------------------- deprecated forms


def _warns(fn, match):
    with pytest.warns(DeprecationWarning, match=match):
        return fn()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # several per call
def test_old_keyword_names_warn_and_give_the_same_result():
    torch.manual_seed(0)
    q, k, v = _x(1, B, 3, D), _x(2), _x(3)
    kv = KeyValueAttention()
    new = kv(q, k, v).context
    old = _warns(lambda: kv(q, keys=k, values=v).context, "'keys' is deprecated; use 'key'")
    torch.testing.assert_close(old, new)
    cat = ConcatenatedKeyValueAttention()
    torch.testing.assert_close(
        _warns(lambda: cat(queries=q, keys=k, values=v).context, "'queries' is deprecated"),
        cat(q, k, v).context,
    )
    hop = MultiHopAttention(D, D)
    torch.testing.assert_close(
        _warns(lambda: hop(q, keys=k).context, "'keys' is deprecated"), hop(q, k).context
    )
    f = attnlab.key_value_attention
    torch.testing.assert_close(
        _warns(lambda: f(q, keys=k, values=v).context, "'values' is deprecated"),
        f(q, k, v).context,
    )
    with pytest.raises(TypeError, match="got both 'keys' and its new name 'key'"):
        kv(q, k, keys=k)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kees'"):
        kv(q, kees=k)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ConstantQuerySelfAttention(D),
        lambda: LearnedQuerySelfAttention(D, 2),
        lambda: RelationalSelfAttention(D),
        lambda: CapsuleAttention(D, 3),
        lambda: CapsuleRouting(D, 3),
    ],
)
def test_positional_mask_and_features_keyword_warn(build):
    torch.manual_seed(0)
    module = build().eval()
    x = _x(1)
    mask = REAL if not isinstance(module, RelationalSelfAttention) else KEY_MASK
    new = module(x, mask=mask)
    old = _warns(lambda: module(x, mask), "mask as the second positional argument")
    named = _warns(lambda: module(features=x, mask=mask), "'features' is deprecated")
    for out in (old, named):
        for a, b in zip(vars(out).values(), vars(new).values(), strict=True):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "cls", [ConstantQuerySelfAttention, LearnedQuerySelfAttention, CapsuleAttention, CapsuleRouting]
)
def test_d_k_is_renamed_d_features(cls):
    args = (3,) if cls in (CapsuleAttention, CapsuleRouting) else ()
    old = _warns(lambda: cls(*args, d_k=D) if not args else cls(d_k=D, num_classes=3), "'d_k'")
    assert old.d_features == D
    assert old.get_config()["d_features"] == D and "d_k" not in old.get_config()
    assert _warns(lambda: old.d_k, r"\.d_k is deprecated") == D
    rebuilt = _warns(
        lambda: attnlab.build({**old.get_config(), "d_features": None, "d_k": D}), "'d_k'"
    )
    assert type(rebuilt) is cls and rebuilt.d_features == D
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert attnlab.build(old.get_config()).d_features == D


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # several per call
def test_aoa_positional_masks_and_old_keywords_warn():
    torch.manual_seed(0)
    m = AttentionOverAttention()
    d, q = _x(1), _x(2, B, 3, D)
    dm, qm = REAL, torch.tensor([[True] * 3, [True, True, False]])
    new = m(d, q, mask1=dm, mask2=qm).s
    torch.testing.assert_close(_warns(lambda: m(d, q, dm, qm).s, "positionally"), new)
    torch.testing.assert_close(
        _warns(lambda: m(document=d, key=q, document_mask=dm, query_mask=qm).s, "'document'"),
        new,
    )
    with pytest.raises(TypeError, match="got both 'document' and its new name 'query'"):
        m(d, document=d)


# ----------------------------------------------------------------------------- query-scored attention


@pytest.mark.parametrize(
    "build,message",
    [
        (
            lambda: CapsuleAttention(3, 2, score="queryless"),
            "capsule attention needs a score that takes the capsule query",
        ),
        (
            lambda: MultiHopAttention(4, 4, score="queryless"),
            "multi-hop attention needs a score that takes the query",
        ),
        (
            lambda: LearnedQuerySelfAttention(4, score="queryless"),
            "learned-query self-attention needs a score that takes the query; for a "
            "query-less score use ConstantQuerySelfAttention",
        ),
        (
            lambda: RelationalSelfAttention(4, score="queryless"),
            "relational self-attention needs a score that takes the query (Q = W_Q F); for a "
            "query-less score use ConstantQuerySelfAttention",
        ),
    ],
    ids=["capsule", "multi-hop", "learned-query", "relational"],
)
def test_a_query_scored_mechanism_refuses_a_queryless_score_in_one_line(build, message):
    with pytest.raises(attnlab.ConfigError) as caught:
        build()
    assert str(caught.value) == message


def test_query_scored_attention_builds_the_general_model():
    from attnlab.query._convention import query_scored_attention

    torch.manual_seed(0)
    built = query_scored_attention("toy", "additive", d_q=3, d_k=D, d_v=D)
    torch.manual_seed(0)
    plain = attnlab.Attention("additive", d_q=3, d_k=D, d_v=D)
    assert isinstance(built, attnlab.Attention)
    q, k = _x(1, B, 1, 3), _x(2)
    torch.testing.assert_close(built(q, k).context, plain(q, k).context, rtol=0, atol=0)
    with pytest.raises(attnlab.ConfigError, match=r"^toy needs a score that takes it!$"):
        query_scored_attention("toy", "queryless", d_k=D, query_name="it", hint="!")
