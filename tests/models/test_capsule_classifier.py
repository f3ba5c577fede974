"""Tests of attnlab.models.multilabel: the capsule multi-label classifier."""

from __future__ import annotations

import math

import pytest
import torch
from attention_harness import check_rebuild_same_output
from sklearn.metrics import f1_score
from token_input_checks import check_token_inputs_rejected

from attnlab._checks import ConfigError
from attnlab.models.multilabel import CapsuleClassifier, MultiLabelOutput
from attnlab.registry import get

V, L = 20, 3
HEADS = {
    "routing": "routing",
    "orphan": {"routing": True, "orphan": True, "iterations": 2},
    "primary": {"primary_dim": 5},
    "capsule-attention": "capsule-attention",
    "additive": {"score": "additive", "align": "soft"},
    "sparsemax": {"score": "dot", "align": "sparsemax"},
    "mean": "mean",
    "uniform": "uniform",
    "uniform-attention": {"score": "dot", "uniform": True},
}


def tiny(attention="routing", dtype=torch.float32, **kw):
    torch.manual_seed(0)
    kw = {"embed_dim": 6, "hidden_size": 4, "d_caps": 3, **kw}
    return CapsuleClassifier(V, L, attention=attention, **kw).to(dtype).eval()


def batch(B=3, n=6, lengths=(6, 3, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, V, (B, n), generator=g)
    lengths = torch.tensor(lengths)
    tokens[torch.arange(n)[None] >= lengths[:, None]] = 0
    return tokens, lengths


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def naive_routing(h, W, iterations, n_labels):
    """Dynamic routing for one example: h [n, d_k] (real positions only), W [C, d_caps, d_k];
    returns (lengths [n_labels], couplings [n_labels][n]) from plain Python loops."""
    n, C = h.shape[0], W.shape[0]
    u = [[[float(sum(W[j, a, k] * h[i, k] for k in range(h.shape[1]))) for a in range(W.shape[1])]
          for j in range(C)] for i in range(n)]  # fmt: skip
    b = [[0.0] * C for _ in range(n)]
    for t in range(iterations):
        c = [_softmax(b[i]) for i in range(n)]
        s = [
            [sum(c[i][j] * u[i][j][a] for i in range(n)) for a in range(W.shape[1])]
            for j in range(C)
        ]
        sq = [sum(x * x for x in s[j]) for j in range(C)]
        v = [[x * sq[j] / (1 + sq[j]) / math.sqrt(sq[j] + 1e-12) for x in s[j]] for j in range(C)]
        if t < iterations - 1:
            for i in range(n):
                for j in range(C):
                    b[i][j] += sum(u[i][j][a] * v[j][a] for a in range(W.shape[1]))
    lengths = [sq[j] / (1 + sq[j]) for j in range(n_labels)]
    return lengths, [[c[i][j] for i in range(n)] for j in range(n_labels)]


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("head", list(HEADS))
def test_shapes_and_weights(head):
    model = tiny(HEADS[head])
    tokens, lengths = batch()
    out = model(tokens, lengths)
    assert isinstance(out, MultiLabelOutput)
    assert out.probs.shape == out.logits.shape == (3, L)
    assert ((out.probs >= 0) & (out.probs <= 1)).all()
    assert out.hidden.shape == (3, 6, 8)
    assert out.predict().dtype == torch.bool
    if head == "mean":
        assert out.weights is None
        return
    assert out.weights.shape == (3, L, 6)
    real = torch.arange(6)[None] < lengths[:, None]
    assert (out.weights[~real[:, None, :].expand(-1, L, -1)] == 0).all()
    assert (out.weights >= 0).all()
    if model.head == "attention" or model.uniform:  # each label: a distribution over tokens
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, L))
    else:  # routing: each real token's couplings sum to 1 over the labels (and orphan)
        sums = out.weights.sum(1)[real]
        if model.orphan:
            assert (sums < 1).all()
        else:
            torch.testing.assert_close(sums, torch.ones_like(sums))


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("orphan", [False, True])
def test_routing_matches_naive_loop(orphan):
    model = tiny({"orphan": orphan, "iterations": 3}, dtype=torch.float64)
    tokens, lengths = batch()
    out = model(tokens, lengths)
    W = model.routing.W.detach()
    for b in range(3):
        k = int(lengths[b])
        probs, coupling = naive_routing(out.hidden[b, :k].detach(), W, 3, L)
        torch.testing.assert_close(out.probs[b], torch.tensor(probs, dtype=torch.float64))
        torch.testing.assert_close(
            out.weights[b, :, :k], torch.tensor(coupling, dtype=torch.float64)
        )
        p = torch.tensor(probs, dtype=torch.float64)
        torch.testing.assert_close(out.logits[b], torch.log(p / (1 - p)))


def test_uniform_routing_is_squashed_mean_prediction():
    model = tiny("uniform", dtype=torch.float64)
    tokens, lengths = batch()
    out = model(tokens, lengths)
    W = model.routing.W.detach()
    for b in range(3):
        k = int(lengths[b])
        h = out.hidden[b, :k].detach()
        for j in range(L):
            s = [sum(float(W[j, a] @ h[i]) for i in range(k)) / k for a in range(W.shape[1])]
            sq = sum(x * x for x in s)
            assert out.probs[b, j].item() == pytest.approx(sq / (1 + sq), rel=1e-9)
            assert out.weights[b, j, :k].tolist() == pytest.approx([1 / k] * k)


def test_capsule_attention_matches_naive_loop():
    model = tiny("capsule-attention", dtype=torch.float64)
    tokens, lengths = batch()
    out = model(tokens, lengths)
    caps = model.capsule_attention
    Q, Wp, bp = caps.queries.detach(), caps.prob_weight.detach(), caps.prob_bias.detach()
    for b in range(3):
        k = int(lengths[b])
        h = out.hidden[b, :k].detach()
        for j in range(L):
            a = _softmax([float(Q[j] @ h[i]) for i in range(k)])
            c = [sum(a[i] * float(h[i, d]) for i in range(k)) for d in range(h.shape[1])]
            logit = sum(c[d] * float(Wp[j, d]) for d in range(len(c))) + float(bp[j])
            assert out.weights[b, j, :k].tolist() == pytest.approx(a, rel=1e-9)
            assert out.logits[b, j].item() == pytest.approx(logit, rel=1e-9, abs=1e-12)
            assert out.probs[b, j].item() == pytest.approx(1 / (1 + math.exp(-logit)), rel=1e-9)


def test_mean_head_matches_naive():
    model = tiny("mean", dtype=torch.float64)
    tokens, lengths = batch()
    out = model(tokens, lengths)
    Wl, bl = model.linear.weight.detach(), model.linear.bias.detach()
    for b in range(3):
        k = int(lengths[b])
        mean = [sum(float(out.hidden.detach()[b, i, d]) for i in range(k)) / k for d in range(8)]
        for j in range(L):
            logit = sum(mean[d] * float(Wl[j, d]) for d in range(8)) + float(bl[j])
            assert out.logits[b, j].item() == pytest.approx(logit, rel=1e-9, abs=1e-12)


def test_losses_match_formulas():
    y = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    tokens, lengths = batch()
    model = tiny("routing", dtype=torch.float64)
    out = model(tokens, lengths)
    p = out.probs.detach().tolist()
    want = 0.0
    for b in range(3):
        for j in range(L):
            if y[b, j]:
                want += max(0.0, 0.9 - p[b][j]) ** 2
            else:
                want += 0.5 * max(0.0, p[b][j] - 0.1) ** 2
    assert model.loss(out, y).item() == pytest.approx(want / 3, rel=1e-9)
    bce = tiny("routing", dtype=torch.float64, loss="bce")
    out = bce(tokens, lengths)
    p = out.probs.detach().tolist()
    want = -sum(
        math.log(p[b][j]) if y[b, j] else math.log(1 - p[b][j]) for b in range(3) for j in range(L)
    )
    assert bce.loss(out, y).item() == pytest.approx(want / 3, rel=1e-6)
    att = tiny("capsule-attention", dtype=torch.float64)
    out = att(tokens, lengths)
    p = out.probs.detach().tolist()
    want = -sum(
        math.log(p[b][j]) if y[b, j] else math.log(1 - p[b][j]) for b in range(3) for j in range(L)
    )
    assert att.loss(out, y).item() == pytest.approx(want / 3, rel=1e-9)
    assert att.loss(out, y.bool()).item() == pytest.approx(want / 3, rel=1e-9)


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("head", list(HEADS))
def test_padding_does_not_change_outputs(head):
    model = tiny(HEADS[head])
    tokens, lengths = batch()
    a = model(tokens, lengths)
    padded = torch.cat([tokens, torch.randint(1, V, (3, 4))], 1)  # garbage in the padding
    b = model(padded, lengths)
    torch.testing.assert_close(b.probs, a.probs)
    if a.weights is not None:
        torch.testing.assert_close(b.weights[..., :6], a.weights)
        assert (b.weights[..., 6:] == 0).all()
    # a mask (not a prefix) gives the same as moving the real tokens
    mask = torch.zeros(3, 10, dtype=torch.bool)
    mask[0, :6] = True
    mask[1, 4:7] = True
    mask[2, 9] = True
    scattered = torch.zeros(3, 10, dtype=torch.long)
    scattered[0, :6] = tokens[0]
    scattered[1, 4:7] = tokens[1, :3]
    scattered[2, 9] = tokens[2, 0]
    c = model(scattered, mask=mask)
    torch.testing.assert_close(c.probs, a.probs)


@pytest.mark.parametrize("head", ["routing", "capsule-attention", "uniform", "mean"])
def test_empty_text_is_finite(head):
    model = tiny(HEADS[head])
    model.train()
    tokens, _ = batch()
    out = model(tokens, torch.tensor([0, 2, 0]))
    assert torch.isfinite(out.probs).all() and torch.isfinite(out.logits).all()
    if out.weights is not None:
        assert (out.weights[0] == 0).all()
    if head in ("routing", "uniform"):
        assert (out.probs[0] == 0).all()
    model.loss(out, torch.ones(3, L)).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("head", ["routing", "orphan", "capsule-attention", "uniform", "mean"])
def test_gradcheck(head):
    model = tiny(HEADS[head], dtype=torch.float64, hidden_size=2, d_caps=2)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    h = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)

    def f(x):
        out = model.classify(x * mask[..., None], mask)
        return out.probs

    assert torch.autograd.gradcheck(f, (h,))


# ----------------------------------------------------------------------------- errors


def test_bad_inputs():
    model = tiny()
    tokens, lengths = batch()
    check_token_inputs_rejected(model, tokens, lengths, V)
    with pytest.raises(ValueError, match="not both"):
        model(tokens, lengths, mask=torch.ones(3, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="tokens"):
        model(tokens[0], None)
    out = model(tokens, lengths)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        model.loss(out, torch.ones(3, L + 1))
    with pytest.raises(ValueError, match="0 and 1"):
        model.loss(out, torch.full((3, L), 0.5))


@pytest.mark.parametrize(
    "kw",
    [
        {"encoder": "cnn"},
        {"attention": "mean", "loss": "margin"},
        {"attention": {"iterations": 2, "score": "dot"}},
        {"attention": "bogus"},
        {"attention": 5},
        {"iterations": 0},
        {"loss": "hinge"},
        {"hidden_size": 0},
    ],
)
def test_bad_config(kw):
    with pytest.raises(ConfigError):
        CapsuleClassifier(V, L, **kw)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("head", ["routing", "orphan", "capsule-attention", "mean"])
def test_get_config_round_trip(head):
    model = tiny(HEADS[head])
    config = model.get_config()
    assert config["name"] == "capsule-classifier" and config["kind"] == "model"
    check_rebuild_same_output(model, batch(), output="probs")
    assert get("model", "capsule-classifier").cls is CapsuleClassifier


def test_pretrained_embeddings_are_copied():
    matrix = torch.randn(V, 5)
    model = CapsuleClassifier(num_labels=L, embeddings=matrix, freeze_embeddings=True)
    assert torch.equal(model.embedding.weight, matrix)
    assert not model.embedding.weight.requires_grad
    with pytest.raises(ConfigError, match="vocab_size"):
        CapsuleClassifier(V + 1, L, embeddings=matrix)


# ----------------------------------------------------------------------------- learning


def token_labels(N, seed, n=12, n_labels=5, vocab=40):
    """Label l is present iff token 2 + l occurs in the text."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2 + n_labels, vocab, (N, n), generator=g)
    lengths = torch.randint(5, n + 1, (N,), generator=g)
    for i in range(N):
        for lab in range(n_labels):
            if torch.rand(1, generator=g) < 0.3:
                tokens[i, torch.randint(0, int(lengths[i]), (1,), generator=g)] = 2 + lab
    tokens[torch.arange(n)[None] >= lengths[:, None]] = 0
    y = torch.stack([(tokens == 2 + lab).any(1) for lab in range(n_labels)], 1).float()
    return tokens, lengths, y


def train_micro_f1(attention, steps=150):
    torch.manual_seed(0)
    train, test = token_labels(600, 1), token_labels(300, 2)
    model = CapsuleClassifier(40, 5, embed_dim=16, hidden_size=16, attention=attention)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, 600, (32,), generator=g)
        loss = model.loss(model(train[0][idx], train[1][idx]), train[2][idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        pred = model(test[0], test[1]).predict()
    return f1_score(test[2].numpy(), pred.numpy(), average="micro")


@pytest.mark.slow
def test_learns_token_determined_labels():
    # measured: routing 1.00, mean-pooling baseline 0.98 micro-F1 (chance-level
    # all-positive prediction scores about 0.45)
    routing = train_micro_f1("routing")
    mean = train_micro_f1("mean")
    assert routing >= 0.95, routing
    assert mean >= 0.9, mean


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"reconstruction": float("nan")}, ConfigError, r"^reconstruction must be a number >= 0"),
        ({"reconstruction": "0.1"}, ConfigError, r"^reconstruction must be a number >= 0"),
        ({"reconstruction": -1}, ConfigError, r"^reconstruction must be a number >= 0, got -1$"),
        ({"orphan": "no"}, TypeError, r"^orphan must be a bool, got 'no'$"),
    ],
)
def test_bad_settings_are_refused_at_construction(kw, error, message) -> None:
    with pytest.raises(error, match=message):
        tiny(**kw)
