import math

import pytest
import torch
from attention_harness import check_rebuild_same_output
from torch import nn

import attnlab
from attnlab.query.capsule import (
    CapsuleAttention,
    CapsuleOutput,
    CapsuleRouting,
    capsule_loss,
    margin_loss,
    squash,
)


def _mv(W, x, b=None):
    return [
        (float(b[o]) if b is not None else 0.0)
        + sum(float(W[o, i]) * x[i] for i in range(W.shape[1]))
        for o in range(W.shape[0])
    ]


def _inputs(B=3, n=4, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    F = torch.randn(B, n, d, generator=g, dtype=torch.float64)
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2] = False
    return F, mask


def _randomize(m, std=0.6):
    torch.manual_seed(5)
    for p in m.parameters():
        nn.init.normal_(p, std=std)
    return m.double()


def _naive_capsules(m, F, mask):
    """Per capsule c: keys W_K^(c) f + b (or f), values likewise, e = q_c . k (dot), softmax
    over real positions, c_c, p_c = sigmoid(w_c . c_c + b_c), r_c = p_c c_c, f_bar_c."""
    B, n, _ = F.shape
    C = m.num_classes
    res = {}
    for b in range(B):
        real = [l for l in range(n) if mask is None or mask[b, l]]
        for c in range(C):
            att = m.capsules[c]

            def proj(layer, x):
                v = [float(t) for t in x]
                return v if layer is None else _mv(layer.weight.detach(), v, layer.bias.detach())

            keys = {l: proj(att.key_proj, F[b, l]) for l in real}
            vals = {l: proj(att.value_proj, F[b, l]) for l in range(n)}
            q = [float(t) for t in m.queries.detach()[c]]
            scores = {l: sum(x * y for x, y in zip(q, keys[l], strict=True)) for l in real}
            w = [0.0] * n
            if scores:
                mx = max(scores.values())
                z = sum(math.exp(s - mx) for s in scores.values())
                for l, s in scores.items():
                    w[l] = math.exp(s - mx) / z
            d_v = len(vals[0])
            ctx = [sum(w[l] * vals[l][t] for l in range(n)) for t in range(d_v)]
            logit = sum(m.prob_weight[c, t].item() * ctx[t] for t in range(d_v))
            logit += m.prob_bias[c].item()
            p = 1 / (1 + math.exp(-logit))
            mean = [sum(vals[l][t] for l in real) / len(real) if real else 0.0 for t in range(d_v)]
            res[b, c] = (w, ctx, p, [p * x for x in ctx], mean)
    return res


@pytest.mark.parametrize("proj", [False, True])
def test_capsule_attention_matches_naive_loop(proj):
    kw = {"key_dim": 2, "value_dim": 5} if proj else {}
    m = _randomize(CapsuleAttention(3, 4, **kw))
    assert m._batched is not proj  # both implementations are checked
    F, mask = _inputs()
    out = m(F, mask=mask)
    ref = _naive_capsules(m, F, mask)
    for (b, c), (w, ctx, p, r, mean) in ref.items():
        t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
        torch.testing.assert_close(out.weights[b, c], t(w))
        torch.testing.assert_close(out.contexts[b, c], t(ctx))
        torch.testing.assert_close(out.probs[b, c], t(p))
        torch.testing.assert_close(out.reconstructions[b, c], t(r))
        torch.testing.assert_close(out.mean_features[b, c], t(mean))
    # the sequence with no real position: zero contexts, p_c = sigmoid(b_c)
    assert torch.equal(out.contexts[2], torch.zeros_like(out.contexts[2]))
    torch.testing.assert_close(out.probs[2], torch.sigmoid(m.prob_bias.detach()))


def test_capsule_pluggable_score_owns_parameters():
    m = CapsuleAttention(3, 2, score="additive", d_w=4)
    assert not m._batched
    W = [cap.score.W2.weight for cap in m.capsules]
    assert W[0] is not W[1] and W[0].shape == (4, 3)
    out = m(torch.randn(2, 5, 3), mask=torch.ones(2, 5, dtype=torch.bool))
    assert out.probs.shape == (2, 2) and out.weights.shape == (2, 2, 5)


def _output(probs, contexts, mean):
    probs = torch.tensor(probs, dtype=torch.float64)
    contexts = torch.tensor(contexts, dtype=torch.float64)
    logits = torch.log(probs / (1 - probs))
    recon = probs[..., None] * contexts
    return CapsuleOutput(probs, logits, contexts, recon, torch.tensor(mean, dtype=torch.float64))


def test_capsule_loss_by_hand():
    # one example, two capsules, 1-d vectors
    out = _output([[0.8, 0.4]], [[[1.0], [2.0]]], [[[1.0], [1.0]]])
    y = torch.tensor([0])
    # bce: -log 0.8 - log(1 - 0.4)
    bce = -math.log(0.8) - math.log(0.6)
    # squared over the gold capsule: (0.8 * 1 - 1)^2 = 0.04; over all: + (0.4 * 2 - 1)^2 = 0.04
    total, cls, rec = capsule_loss(out, y, lam=0.5, return_parts=True)
    assert cls.item() == pytest.approx(bce)
    assert rec.item() == pytest.approx(0.04)
    assert total.item() == pytest.approx(bce + 0.5 * 0.04)
    _, _, rec_all = capsule_loss(out, y, over="all", return_parts=True)
    assert rec_all.item() == pytest.approx(0.08)
    # hinge: max(0, 1 - 0.8 + 0.4) = 0.6; reconstruction hinge on r.f_bar: 0.8 vs 0.8 -> 1.0
    _, cls_h, rec_h = capsule_loss(
        out, y, classification="hinge", reconstruction="hinge", return_parts=True
    )
    assert cls_h.item() == pytest.approx(0.6)
    assert rec_h.item() == pytest.approx(1.0)
    # multi-label targets [B, C] (both gold): bce -log .8 - log .4; no hinge pairs
    both = torch.tensor([[1, 1]])
    _, cls2, rec2 = capsule_loss(out, both, return_parts=True)
    assert cls2.item() == pytest.approx(-math.log(0.8) - math.log(0.4))
    assert rec2.item() == pytest.approx(0.08)
    assert capsule_loss(out, both, classification="hinge", lam=0.0).item() == 0.0
    # reductions
    two = _output([[0.8, 0.4], [0.5, 0.5]], [[[1.0], [2.0]], [[0.0], [0.0]]], [[[1.0], [1.0]]] * 2)
    per = capsule_loss(two, torch.tensor([0, 1]), lam=0.0, reduction="none")
    torch.testing.assert_close(per, torch.tensor([bce, 2 * math.log(2)], dtype=torch.float64))
    assert capsule_loss(
        two, torch.tensor([0, 1]), lam=0.0, reduction="sum"
    ).item() == pytest.approx(float(per.sum()))


def test_capsule_loss_bad_input():
    out = _output([[0.8, 0.4]], [[[1.0], [2.0]]], [[[1.0], [1.0]]])
    with pytest.raises(
        ValueError, match=r"targets has shape \(1, 3\), expected multi-hot \[B, C\] = \[1, 2\]"
    ):
        capsule_loss(out, torch.ones(1, 3))
    with pytest.raises(ValueError, match="outside"):
        capsule_loss(out, torch.tensor([2]))
    with pytest.raises(TypeError, match="integers"):
        capsule_loss(out, torch.tensor([0.0]))
    with pytest.raises(ValueError, match="only 0 and 1"):
        capsule_loss(out, torch.tensor([[0.5, 1.0]]))
    with pytest.raises(ValueError, match="classification"):
        capsule_loss(out, torch.tensor([0]), classification="ce")
    with pytest.raises(TypeError, match="CapsuleOutput"):
        capsule_loss(out.probs, torch.tensor([0]))


# ----------------------------------------------------------------------------- routing


def test_squash_by_hand_and_at_zero():
    s = torch.tensor([[3.0, 4.0]], dtype=torch.float64)  # |s| = 5: 25/26 * s/5
    torch.testing.assert_close(squash(s), s * (25 / 26) / 5)
    z = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    v = squash(z)
    assert torch.equal(v, torch.zeros_like(v))
    v.sum().backward()
    assert torch.isfinite(z.grad).all()


def _naive_routing(m, F, mask, iterations):
    B, n, _ = F.shape
    C, d = m.num_classes, m.d_caps
    res = {}
    for b in range(B):
        real = [i for i in range(n) if mask is None or mask[b, i]]
        u = {
            (i, j): _mv(
                m.W[j].detach(),
                [float(x) for x in F[b, i]],
                m.beta[j].detach() if m.beta is not None else None,
            )
            for i in range(n)
            for j in range(C)
        }
        logits = {(i, j): 0.0 for i in range(n) for j in range(C)}
        for t in range(iterations):
            coup = {}
            for i in range(n):
                z = sum(math.exp(logits[i, j]) for j in range(C))
                for j in range(C):
                    coup[i, j] = math.exp(logits[i, j]) / z if i in real else 0.0
            s = [
                [sum(coup[i, j] * u[i, j][k] for i in range(n)) for k in range(d)] for j in range(C)
            ]
            v = []
            for j in range(C):
                sq = sum(x * x for x in s[j])
                norm = math.sqrt(sq)
                v.append([x * sq / (1 + sq) / norm if norm else 0.0 for x in s[j]])
            if t < iterations - 1:
                for i in range(n):
                    for j in range(C):
                        logits[i, j] += sum(u[i, j][k] * v[j][k] for k in range(d))
        probs = [sum(x * x for x in s[j]) / (1 + sum(x * x for x in s[j])) for j in range(C)]
        res[b] = (probs, v, coup)
    return res


@pytest.mark.parametrize("iterations", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
def test_routing_matches_naive_loop(iterations, bias):
    m = _randomize(CapsuleRouting(3, 2, d_caps=4, iterations=iterations, bias=bias), std=0.5)
    F, mask = _inputs()
    out = m(F, mask=mask)
    ref = _naive_routing(m, F, mask, iterations)
    for b, (probs, v, coup) in ref.items():
        torch.testing.assert_close(out.probs[b], torch.tensor(probs, dtype=torch.float64))
        torch.testing.assert_close(out.capsules[b], torch.tensor(v, dtype=torch.float64))
        for i in range(4):
            for j in range(2):
                assert out.weights[b, j, i].item() == pytest.approx(coup[i, j])
    # norms of the capsules are the probabilities
    torch.testing.assert_close(out.capsules.norm(dim=-1), out.probs)
    assert torch.equal(out.probs[2], torch.zeros(2, dtype=torch.float64))


def test_margin_loss_by_hand():
    probs = torch.tensor([[0.95, 0.3, 0.05], [0.5, 0.5, 0.5]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    # example 1: present 0.95 >= 0.9 -> 0; absent 0.3 -> 0.5 * 0.2^2 = 0.02; 0.05 -> 0
    # example 2: present 0.5 -> 0.4^2 = 0.16; absent 0.5, 0.5 -> 2 * 0.5 * 0.16 = 0.16
    per = margin_loss(probs, y, reduction="none")
    torch.testing.assert_close(per, torch.tensor([0.02, 0.32], dtype=torch.float64))
    assert margin_loss(probs, y).item() == pytest.approx(0.17)
    multi = margin_loss(probs, torch.tensor([[1, 1, 0], [0, 0, 0]]), reduction="sum")
    # ex 1: 0 + 0.6^2 + 0 = 0.36; ex 2: 3 * 0.5 * 0.16 = 0.24
    assert multi.item() == pytest.approx(0.60)
    with pytest.raises(ValueError, match=r"probs has shape \(3,\), expected \[B, C\]"):
        margin_loss(probs[0], y)


# ----------------------------------------------------------------------------- shared behaviour


def test_gradcheck():
    F, mask = _inputs()
    mask = mask.clone()
    mask[2, 0] = True
    for m in (
        _randomize(CapsuleAttention(3, 2)),
        _randomize(CapsuleAttention(3, 2, key_dim=2, value_dim=2)),
    ):
        x = F.clone().requires_grad_()
        assert torch.autograd.gradcheck(
            lambda f, m=m: capsule_loss(m(f, mask=mask), torch.tensor([0, 1, 1]), lam=0.5), [x]
        )
        assert torch.autograd.gradcheck(lambda f, m=m: m(f, mask=mask).reconstructions, [x])
    r = _randomize(CapsuleRouting(3, 2, d_caps=3), std=0.5)
    x = F.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda f: r(f, mask=mask).capsules, [x])
    assert torch.autograd.gradcheck(
        lambda f: margin_loss(r(f, mask=mask).probs, torch.tensor([0, 1, 0])), [x]
    )


def test_masked_and_empty_inputs_are_finite():
    F, _ = _inputs()
    none = torch.zeros(3, 4, dtype=torch.bool)
    for m in (CapsuleAttention(3, 2).double(), CapsuleAttention(3, 2, value_dim=2).double()):
        x = F.clone().requires_grad_()
        out = m(x, mask=none)
        assert torch.equal(out.contexts, torch.zeros_like(out.contexts))
        assert torch.equal(out.weights, torch.zeros_like(out.weights))
        assert torch.equal(out.mean_features, torch.zeros_like(out.mean_features))
        capsule_loss(out, torch.tensor([0, 1, 0])).backward()
        assert torch.equal(x.grad, torch.zeros_like(x))
        out = m(torch.zeros(3, 0, 3, dtype=torch.float64, requires_grad=True))
        assert out.weights.shape == (3, 2, 0) and torch.isfinite(out.probs).all()
        capsule_loss(out, torch.tensor([[1, 0], [0, 0], [1, 1]])).backward()
    r = CapsuleRouting(3, 2).double()
    x = F.clone().requires_grad_()
    out = r(x, mask=none)
    assert torch.equal(out.capsules, torch.zeros_like(out.capsules))
    margin_loss(out.probs, torch.tensor([0, 1, 0])).backward()
    assert torch.isfinite(x.grad).all()
    out = r(torch.zeros(3, 0, 3, dtype=torch.float64))
    assert out.weights.shape == (3, 2, 0) and torch.equal(
        out.probs, torch.zeros(3, 2, dtype=torch.float64)
    )


def test_predict():
    out = _output([[0.8, 0.4], [0.3, 0.6]], [[[1.0], [2.0]]] * 2, [[[1.0], [1.0]]] * 2)
    assert out.predict().tolist() == [0, 1]
    assert out.predict(multi_label=True).tolist() == [[True, False], [False, True]]


def test_bad_input_names_argument_and_shape():
    F = torch.randn(2, 4, 3)
    for m in (CapsuleAttention(3, 2), CapsuleRouting(3, 2)):
        with pytest.raises(
            ValueError,
            match=r"query has shape \(2, 4, 5\), expected \[B, n, d_f\] = \[B, n, 3\]",
        ):
            m(torch.randn(2, 4, 5))
        with pytest.raises(
            ValueError, match=r"mask has shape \(2, 5\), expected \[B, n\] = \[2, 4\]"
        ):
            m(F, mask=torch.ones(2, 5, dtype=torch.bool))
        with pytest.raises(TypeError, match=r"mask has dtype torch\.int64"):
            m(F, mask=torch.ones(2, 4, dtype=torch.long))
        with pytest.raises(TypeError, match=r"query has dtype torch\.float64"):
            m(F.double())
    with pytest.raises(attnlab.ConfigError, match="num_classes"):
        CapsuleAttention(3, 0)
    with pytest.raises(attnlab.ConfigError, match="iterations"):
        CapsuleRouting(3, 2, iterations=0)
    with pytest.raises(attnlab.ConfigError, match="takes the capsule query"):
        CapsuleAttention(3, 2, score="queryless")


def test_registry_roundtrip():
    m = CapsuleAttention(3, 2, key_dim=4, score="general")
    cfg = m.get_config()
    assert cfg["name"] == "capsule" and cfg["kind"] == "query"
    F = torch.randn(2, 5, 3)
    check_rebuild_same_output(m, [F], output="probs")
    r = CapsuleRouting(3, 2, d_caps=4, iterations=2)
    check_rebuild_same_output(r, [F], output="probs", d_caps=4, iterations=2)
    assert isinstance(
        attnlab.build({"name": "dynamic-routing", "d_features": 3, "num_classes": 2}),
        CapsuleRouting,
    )


# ----------------------------------------------------------------------------- learning

C, FILL, N, D = 4, 12, 8, 16
V = C + FILL  # tokens 0..C-1 are the triggers, one per label


def _multi_label(n, gen):
    """Every sequence holds the C trigger tokens once, among fillers; every position has a
    random polarity. Label c = the polarity at trigger c's position (each label depends on
    a different token; any subset of labels can be on)."""
    tok = torch.randint(C, V, (n, N), generator=gen)
    pos = torch.stack([torch.randperm(N, generator=gen)[:C] for _ in range(n)])
    tok.scatter_(1, pos, torch.arange(C).expand(n, C))
    pol = torch.randint(0, 2, (n, N), generator=gen)
    return tok, pol, pol.gather(1, pos)


class _Classifier(nn.Module):
    def __init__(self, kind, iterations=3):
        super().__init__()
        self.tok, self.pol = nn.Embedding(V, D), nn.Embedding(2, D)
        self.kind = kind
        if kind == "capsule":
            self.head = CapsuleAttention(D, C)
        elif kind == "routing":
            self.head = CapsuleRouting(D, C, iterations=iterations)
        else:
            self.head = nn.Sequential(nn.Linear(D, 32), nn.Tanh(), nn.Linear(32, C))

    def forward(self, tok, pol):
        f = self.tok(tok) + self.pol(pol)
        return self.head(f.mean(1)) if self.kind == "mean" else self.head(f)


def _train_multi_label(model, steps=300):
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        tok, pol, y = _multi_label(64, gen)
        out = model(tok, pol)
        if model.kind == "capsule":
            loss = capsule_loss(out, y, lam=0.1)  # multi-hot targets: independent sigmoids
        elif model.kind == "routing":
            loss = margin_loss(out.probs, y)
        else:
            loss = nn.functional.binary_cross_entropy_with_logits(out, y.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
    tok, pol, y = _multi_label(2000, torch.Generator().manual_seed(99))
    with torch.no_grad():
        out = model(tok, pol)
    pred = out > 0 if model.kind == "mean" else out.predict(multi_label=True)
    return (pred == y.bool()).float().mean().item()


@pytest.mark.slow
def test_capsules_learn_a_multi_label_task_mean_pooling_cannot():
    torch.manual_seed(0)
    caps = _train_multi_label(_Classifier("capsule"))
    torch.manual_seed(0)
    mean = _train_multi_label(_Classifier("mean"))
    # measured with these seeds (per-label accuracy): capsule attention 1.00 (joint loss,
    # lambda 0.1), mean pooling 0.64
    assert caps > 0.95, caps
    assert mean < 0.7, mean


@pytest.mark.slow
def test_dynamic_routing_beats_uniform_coupling_and_mean_pooling():
    torch.manual_seed(0)
    routed = _train_multi_label(_Classifier("routing", iterations=3))
    torch.manual_seed(0)
    uniform = _train_multi_label(_Classifier("routing", iterations=1))
    # measured with these seeds: 3 routing iterations 0.78, 1 iteration (uniform coupling,
    # a sum over positions) 0.59; mean pooling (above) 0.64. Routing normalises over the
    # classes, not the positions, so it cannot single out one token as sharply as capsule
    # attention.
    assert routed > 0.72, routed
    assert uniform < 0.68, uniform


def test_stochastic_capsules_return_each_capsules_log_prob():
    """With ``align="hard"`` each capsule draws a position: ``log_prob`` ``[B, C]`` holds
    each capsule's log-probability (each capsule run again on its query under the same RNG
    state gives the same draw), and a REINFORCE loss on it trains the capsule queries
    and their scores, which the drawn one-hot weights cannot."""
    from attnlab.functional import reinforce_loss

    torch.manual_seed(0)
    m = CapsuleAttention(4, 3, score="general", align="hard").double().train()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    torch.manual_seed(1)
    out = m(x, mask=mask)
    assert out.log_prob is not None and out.log_prob.shape == (2, 3)
    torch.manual_seed(1)
    want = torch.stack(
        [
            cap(m.queries[c].expand(2, 4), x, mask=mask[:, None, :]).log_prob
            for c, cap in enumerate(m.capsules)
        ],
        1,
    )
    torch.testing.assert_close(out.log_prob, want)
    reinforce_loss(out.log_prob, torch.tensor([1.0, -1.0])).backward()
    assert m.queries.grad is not None and bool(m.queries.grad.abs().sum() > 0)
    assert CapsuleAttention(4, 3)(x.float()).log_prob is None
