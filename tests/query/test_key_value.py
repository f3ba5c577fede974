import math

import pytest
import torch
from attention_harness import check_rebuild_same_output, naive_softmax
from torch import nn

import attnlab
from attnlab.query.key_value import (
    ConcatenatedKeyValueAttention,
    KeyValueAttention,
    concatenated_key_value_attention,
    key_value_attention,
)


def _naive_kv(q, K, V, allowed, score):
    """att((K, V), q) with Python loops; ``score(q_row, k_row) -> float``; ``allowed[b][l]``
    (or None). q ``[B, d_q]``. Returns (context [B, d_v], weights [B, n_k])."""
    B, n_k, d_v = V.shape
    ctx = torch.zeros(B, d_v, dtype=torch.float64)
    W = torch.zeros(B, n_k, dtype=torch.float64)
    for b in range(B):
        scores = {l: score(q[b], K[b, l]) for l in range(n_k) if allowed is None or allowed[b][l]}
        for l, a in naive_softmax(scores).items():
            W[b, l] = a
            for i in range(d_v):
                ctx[b, i] += a * float(V[b, l, i])
    return ctx, W


def _dot(q, k):
    return sum(float(q[i]) * float(k[i]) for i in range(q.shape[0]))


def _inputs(B=3, n_k=4, d=3, d_v=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, d, generator=g, dtype=torch.float64)
    K = torch.randn(B, n_k, d, generator=g, dtype=torch.float64)
    V = torch.randn(B, n_k, d_v, generator=g, dtype=torch.float64)
    mask = torch.ones(B, n_k, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2] = False  # a fully masked query
    return q, K, V, mask


def test_key_value_function_matches_naive_loop():
    q, K, V, mask = _inputs()
    out = key_value_attention(q, K, V, mask=mask, need_weights=True)
    ref_c, ref_w = _naive_kv(q, K, V, mask.tolist(), _dot)
    torch.testing.assert_close(out.context, ref_c)
    torch.testing.assert_close(out.weights, ref_w)
    assert torch.equal(out.context[2], torch.zeros(2, dtype=torch.float64))
    # without a mask every key counts
    out = key_value_attention(q, K, V, need_weights=True)
    ref_c, ref_w = _naive_kv(q, K, V, None, _dot)
    torch.testing.assert_close(out.context, ref_c)
    torch.testing.assert_close(out.weights, ref_w)


def test_key_value_function_with_a_weighted_score():
    q, K, V, mask = _inputs()
    W = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def general(qr, kr):  # k^T W q
        return sum(float(kr[i]) * float(W[i, j]) * float(qr[j]) for i in range(3) for j in range(3))

    out = key_value_attention(q, K, V, "general", mask=mask, need_weights=True, W=W)
    ref_c, ref_w = _naive_kv(q, K, V, mask.tolist(), general)
    torch.testing.assert_close(out.context, ref_c)
    torch.testing.assert_close(out.weights, ref_w)


@pytest.mark.parametrize("score", ["dot", "general", "additive"])
def test_key_value_module_matches_naive_loop(score):
    torch.manual_seed(0)
    q, K, V, mask = _inputs()
    m = KeyValueAttention(3, 3, 2, score=score, d_w=4) if score == "additive" else None
    if m is None:
        m = KeyValueAttention(3, 3, 2, score=score)
    m = m.double()
    s = m.attention.score
    if score == "dot":
        fn = _dot
    elif score == "general":
        Wg = s.W.weight.detach()

        def fn(qr, kr):
            return sum(
                float(kr[i]) * float(Wg[i, j]) * float(qr[j]) for i in range(3) for j in range(3)
            )
    else:
        W1, W2, w, b = (s.W1.weight.detach(), s.W2.weight.detach(), s.w.detach(), s.b.detach())

        def fn(qr, kr):
            total = 0.0
            for h in range(4):
                x = float(b[h])
                x += sum(float(W1[h, j]) * float(qr[j]) for j in range(3))
                x += sum(float(W2[h, i]) * float(kr[i]) for i in range(3))
                total += float(w[h]) * math.tanh(x)
            return total

    out = m(q, K, V, mask=mask, need_weights=True)
    ref_c, ref_w = _naive_kv(q, K, V, mask.tolist(), fn)
    torch.testing.assert_close(out.context, ref_c)
    torch.testing.assert_close(out.weights, ref_w)


def _naive_multi(Q, K, V, allowed):
    M = Q.shape[1]
    parts, weights = [], []
    for m in range(M):
        c, w = _naive_kv(Q[:, m], K, V, allowed, _dot)
        parts.append(c)
        weights.append(w)
    return torch.cat(parts, -1), torch.stack(weights, 1)


def test_multi_query_matches_naive_concat():
    _, K, V, mask = _inputs()
    Q = torch.randn(3, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = concatenated_key_value_attention(Q, K, V, mask=mask[:, None, :], need_weights=True)
    ref_c, ref_w = _naive_multi(Q, K, V, mask.tolist())
    assert out.context.shape == (3, 4 * 2)
    torch.testing.assert_close(out.context, ref_c)  # answer of q_1 first, then q_2, ...
    torch.testing.assert_close(out.weights, ref_w)
    apart = concatenated_key_value_attention(Q, K, V, mask=mask[:, None, :], concat=False)
    assert apart.context.shape == (3, 4, 2)
    torch.testing.assert_close(apart.context.reshape(3, 8), ref_c)

    module = ConcatenatedKeyValueAttention(num_queries=4).double()
    out = module(Q, K, V, mask=mask[:, None, :], need_weights=True)
    torch.testing.assert_close(out.context, ref_c)
    torch.testing.assert_close(out.weights, ref_w)


def test_gradcheck():
    q, K, V, mask = _inputs()
    mask = mask.clone()
    mask[2, 0] = True
    args = [t.clone().requires_grad_() for t in (q, K, V)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: key_value_attention(a, b, c, mask=mask).context, args
    )
    Q = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, b, c: concatenated_key_value_attention(a, b, c, mask=mask[:, None]).context,
        [Q, args[1], args[2]],
    )
    torch.manual_seed(0)
    m = KeyValueAttention(3, 3, 2, score="additive", d_w=4).double()
    assert torch.autograd.gradcheck(lambda a, b, c: m(a, b, c, mask=mask).context, args)


def test_fully_masked_and_empty_give_zeros_and_finite_grads():
    q, K, V, _ = _inputs()
    q, K, V = (t.clone().requires_grad_() for t in (q, K, V))
    none = torch.zeros(3, 4, dtype=torch.bool)
    out = key_value_attention(q, K, V, mask=none, need_weights=True)
    assert torch.equal(out.context, torch.zeros(3, 2, dtype=torch.float64))
    assert torch.equal(out.weights, torch.zeros(3, 4, dtype=torch.float64))
    out.context.sum().backward()
    for t in (q, K, V):
        assert torch.equal(t.grad, torch.zeros_like(t))

    K0, V0 = K[:, :0].detach().requires_grad_(), V[:, :0].detach().requires_grad_()
    for fn in (key_value_attention, KeyValueAttention(3, 3, 2).double()):
        out = fn(q, K0, V0, need_weights=True)
        assert out.context.shape == (3, 2) and out.weights.shape == (3, 0)
        assert torch.equal(out.context, torch.zeros(3, 2, dtype=torch.float64))
        out.context.sum().backward()
    out = concatenated_key_value_attention(q[:, None], K0, V0)
    assert torch.equal(out.context, torch.zeros(3, 2, dtype=torch.float64))


def test_bad_input_names_argument_and_shape():
    q, K, V, mask = _inputs()
    with pytest.raises(ValueError, match=r"key has shape \(3, 3\), expected \[B, n_k, d_k\]"):
        key_value_attention(q, K[:, 0], V)
    with pytest.raises(
        ValueError, match=r"value has shape \(3, 5, 2\), expected \[B, n_k, d_v\] = \[3, 4, d_v\]"
    ):
        key_value_attention(q, K, torch.zeros(3, 5, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"query has shape \(2, 3\)"):
        key_value_attention(q[:2], K, V)
    with pytest.raises(ValueError, match=r"query has shape \(3, 3\), expected \[3, n_q, d_q\]"):
        concatenated_key_value_attention(q, K, V)
    with pytest.raises(TypeError, match=r"mask has dtype torch\.float32"):
        key_value_attention(q, K, V, mask=mask.float())
    with pytest.raises(TypeError, match="dtype"):
        key_value_attention(q.float(), K, V)
    with pytest.raises(TypeError, match=r"key must be a torch\.Tensor"):
        key_value_attention(q, [1, 2], V)
    m = KeyValueAttention(3, 3, 2).double()
    with pytest.raises(
        ValueError, match=r"key has shape \(3, 4, 5\), expected \[B, n_k, d_k\] = \[B, n_k, 3\]"
    ):
        m(q, torch.zeros(3, 4, 5, dtype=torch.float64), V)
    with pytest.raises(ValueError, match=r"value has shape \(3, 4, 3\), expected .* = \[3, 4, 2\]"):
        m(q, K, torch.zeros(3, 4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"query has shape \(3, 2\), expected \[3, 3\]"):
        m(q[:, :2], K, V)
    mq = ConcatenatedKeyValueAttention(num_queries=2)
    with pytest.raises(ValueError, match=r"query has shape \(3, 4, 3\).*num_queries = 2"):
        mq(torch.zeros(3, 4, 3), K.float(), V.float())
    with pytest.raises(attnlab.ConfigError, match="num_queries"):
        ConcatenatedKeyValueAttention(num_queries=0)
    with pytest.raises(attnlab.ConfigError, match="d_q == d_k"):
        KeyValueAttention(3, 4, score="dot")


def test_registry_roundtrip():
    torch.manual_seed(0)
    m = KeyValueAttention(3, 5, 2, score="general")
    cfg = m.get_config()
    assert cfg["name"] == "key-value" and cfg["kind"] == "query"
    check_rebuild_same_output(m, [torch.randn(2, 3), torch.randn(2, 4, 5), torch.randn(2, 4, 2)])
    mq = attnlab.build({"name": "multi-query", "num_queries": 2, "concat": False})
    assert isinstance(mq, ConcatenatedKeyValueAttention)
    out = mq(torch.randn(2, 2, 5), torch.randn(2, 4, 5), torch.randn(2, 4, 2))
    assert out.context.shape == (2, 2, 2)
    assert isinstance(attnlab.build({"name": "kv"}), KeyValueAttention)


# ----------------------------------------------------------------------------- learning

N_KEYS, N_VALS, SLOTS, D = 16, 10, 6, 16


def _memory(n, gen):
    """A key-value memory of SLOTS (distinct key, random value) pairs and two queried keys."""
    keys = torch.stack([torch.randperm(N_KEYS, generator=gen)[:SLOTS] for _ in range(n)])
    vals = torch.randint(0, N_VALS, (n, SLOTS), generator=gen)
    pick = torch.stack([torch.randperm(SLOTS, generator=gen)[:2] for _ in range(n)])
    return keys, vals, keys.gather(1, pick), vals.gather(1, pick)


class _Reader(nn.Module):
    """Embeds the memory; answers the queried keys' values with (multi-query) key-value
    attention, or from the mean of the values (``attend=False``, the baseline)."""

    def __init__(self, queries, attend=True):
        super().__init__()
        self.ek, self.ev = nn.Embedding(N_KEYS, D), nn.Embedding(N_VALS, D)
        self.queries, self.attend = queries, attend
        self.mq = ConcatenatedKeyValueAttention(D, D, D, num_queries=queries)
        self.out = nn.Linear(D, N_VALS)

    def forward(self, keys, vals, asked):
        K, V = self.ek(keys), self.ev(vals)
        q = self.ek(asked[:, : self.queries])
        if self.attend:
            c = self.mq(q, K, V).context  # [B, queries * D]
        else:
            c = V.mean(1).repeat(1, self.queries)
        return self.out(c.view(-1, self.queries, D))  # [B, queries, N_VALS]


def _train_eval(model, queries, seed=0, steps=250):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        keys, vals, asked, answer = _memory(64, gen)
        logits = model(keys, vals, asked)
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, N_VALS), answer[:, :queries].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    keys, vals, asked, answer = _memory(2000, torch.Generator().manual_seed(seed + 7))
    with torch.no_grad():
        pred = model(keys, vals, asked).argmax(-1)
    return (pred == answer[:, :queries]).float().mean().item()


@pytest.mark.slow
@pytest.mark.parametrize("queries", [1, 2])
def test_key_value_lookup_beats_mean_of_values(queries):
    """One query (key-value attention) or two (multi-query, answers concatenated) read the
    values of the asked keys; the mean of the values cannot."""
    torch.manual_seed(0)
    acc = _train_eval(_Reader(queries), queries)
    torch.manual_seed(0)
    base = _train_eval(_Reader(queries, attend=False), queries)
    # measured with these seeds: attention 1.00 (1 and 2 queries); mean of values 0.33 / 0.34
    # (it only knows which values are present)
    assert acc > 0.95, acc
    assert base < 0.45, base


@pytest.mark.parametrize(
    "fn, q_shape",
    [
        (key_value_attention, (2, 4)),  # one query per example
        (key_value_attention, (2, 3, 4)),
        (concatenated_key_value_attention, (2, 3, 4)),
    ],
)
def test_functional_forms_take_the_old_keywords_with_a_warning(fn, q_shape) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(*q_shape, generator=g)
    k, v = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 6, generator=g)
    new = fn(q, k, v)
    with pytest.warns(DeprecationWarning) as record:
        old = fn(query=q, keys=k, values=v)
    assert sorted(str(w.message).split(";")[0] for w in record) == [
        f"{fn.__name__}: the argument '{name}' is deprecated" for name in ("keys", "values")
    ]
    torch.testing.assert_close(old.context, new.context)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        fn(q, k, v, bogus=1)  # not an old name: a keyword of the score, which has none
    with pytest.raises(TypeError, match="'keys' and its new name 'key'"):
        fn(q, k, keys=k)
