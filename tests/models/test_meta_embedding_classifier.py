"""Tests of attnlab.models.meta_embedding: the dynamic meta-embedding sentence classifier."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_harness import check_rebuild_same_output
from token_input_checks import check_token_inputs_rejected

from attnlab._checks import ConfigError
from attnlab.data.glove import Embeddings
from attnlab.data.vocab import Vocab
from attnlab.models.meta_embedding import MetaEmbeddingClassifier, MetaEmbeddingOutput
from attnlab.registry import get

V = 12
METAS = {
    "dme": "dme",
    "cdme": "cdme",
    "sparsemax": {"meta": "dme", "align": "sparsemax"},
    "tanh-gate": {"meta": "dme", "act": "tanh", "d_w": 3},
    "mean": "mean",
    "uniform": "uniform",
    "cdme-uniform": {"meta": "cdme", "uniform": True},
    "concat": "concat",
}


def tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(V, 3, generator=g), torch.randn(V, 5, generator=g)]


def available():
    a = torch.ones(V, dtype=torch.bool)
    a[[4, 5]] = False  # table 0 lacks ids 4 and 5
    b = torch.ones(V, dtype=torch.bool)
    b[[5, 6]] = False  # table 1 lacks ids 5 and 6 (id 5: no table)
    return [a, b]


def tiny(meta="dme", dtype=torch.float64, **kw):
    torch.manual_seed(0)
    kw = {"d_proj": 4, "hidden_size": 3, "available": available(), **kw}
    return MetaEmbeddingClassifier(tables(), 2, meta=meta, **kw).to(dtype).eval()


def batch():
    tokens = torch.tensor([[1, 4, 6, 2, 5], [3, 7, 0, 0, 0], [8, 0, 0, 0, 0]])
    return tokens, torch.tensor([5, 2, 1])


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("meta", list(METAS))
def test_shapes_and_weights(meta):
    model = tiny(METAS[meta])
    tokens, lengths = batch()
    out = model(tokens, lengths)
    assert isinstance(out, MetaEmbeddingOutput)
    assert out.logits.shape == (3, 2)
    d_x = 8 if meta == "concat" else 4
    assert out.embedded.shape == (3, 5, d_x)
    assert out.hidden.shape == (3, 5, 6)
    assert out.pooling_weights.shape == (3, 5)
    real = torch.arange(5)[None] < lengths[:, None]
    want_avail = torch.stack([a[tokens] for a in available()], -1) & real[..., None]
    assert torch.equal(out.available, want_avail)
    if meta == "concat":
        assert out.weights is None
        return
    w = out.weights
    assert w.shape == (3, 5, 2)
    assert (w[~want_avail] == 0).all()  # a table that lacks the token, and padding
    sums = w.sum(-1)
    some = want_avail.any(-1)
    torch.testing.assert_close(sums[some], torch.ones_like(sums[some]))
    assert (sums[~some] == 0).all()
    assert (out.embedded[0, 4] == 0).all()  # id 5: no table has it -> zero vector
    if meta in ("mean", "uniform", "cdme-uniform"):
        torch.testing.assert_close(w[0, 0], torch.tensor([0.5, 0.5], dtype=w.dtype))
        torch.testing.assert_close(w[0, 1], torch.tensor([0.0, 1.0], dtype=w.dtype))


# ----------------------------------------------------------------------------- formulas


def test_dme_and_pooling_match_naive_loops():
    model = tiny("dme")
    tokens, lengths = batch()
    out = model(tokens, lengths)
    tabs, avail = tables(), available()
    P = [(p.weight.detach(), p.bias.detach()) for p in model.meta_embedding.proj]
    gate = model.meta_embedding.gate.score
    Wg, bg, wg = gate.W.weight.detach(), gate.W.bias.detach(), gate.w.detach()
    for b in range(3):
        for t in range(int(lengths[b])):
            tok = int(tokens[b, t])
            xs, scores, have = [], [], []
            for i in range(2):
                x = [
                    sum(
                        float(P[i][0][r, c]) * float(tabs[i][tok, c])
                        for c in range(tabs[i].shape[1])
                    )
                    + float(P[i][1][r])
                    for r in range(4)
                ]
                xs.append(x)
                # DME's linear score w^T (W x + b) (act = identity)
                z = [sum(float(Wg[r, c]) * x[c] for c in range(4)) + float(bg[r]) for r in range(4)]
                scores.append(sum(float(wg[r]) * z[r] for r in range(4)))
                have.append(bool(avail[i][tok]))
            if not any(have):
                assert out.weights[b, t].tolist() == [0.0, 0.0]
                continue
            kept = [s for s, h in zip(scores, have, strict=True) if h]
            alpha = iter(_softmax(kept))
            a = [next(alpha) if h else 0.0 for h in have]
            assert out.weights[b, t].tolist() == pytest.approx(a, rel=1e-9)
            want = [a[0] * xs[0][r] + a[1] * xs[1][r] for r in range(4)]
            assert out.embedded[b, t].tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)
    # the pooling: e_t = w^T tanh(W h_t + b), softmax over the real tokens, y = W_o c + b_o
    att = model.head.attention.score
    W, bW, w = att.W.weight.detach(), att.W.bias.detach(), att.w.detach()
    Wo, bo = model.head.output.weight.detach(), model.head.output.bias.detach()
    h = out.hidden.detach()
    for b in range(3):
        k = int(lengths[b])
        e = []
        for t in range(k):
            z = [math.tanh(float(W[r] @ h[b, t]) + float(bW[r])) for r in range(W.shape[0])]
            e.append(sum(float(w[r]) * z[r] for r in range(len(z))))
        a = _softmax(e)
        assert out.pooling_weights[b, :k].tolist() == pytest.approx(a, rel=1e-9)
        c = [sum(a[t] * float(h[b, t, d]) for t in range(k)) for d in range(6)]
        logits = [sum(float(Wo[j, d]) * c[d] for d in range(6)) + float(bo[j]) for j in range(2)]
        assert out.logits[b].tolist() == pytest.approx(logits, rel=1e-9)


def test_mean_and_concat_match_naive():
    tokens, lengths = batch()
    tabs, avail = tables(), available()
    for meta in ("mean", "concat"):
        model = tiny(meta)
        out = model(tokens, lengths)
        P = [(p.weight.detach(), p.bias.detach()) for p in model.proj]
        for b in range(3):
            for t in range(int(lengths[b])):
                tok = int(tokens[b, t])
                xs = [
                    [
                        float(P[i][0][r] @ tabs[i][tok].double()) + float(P[i][1][r])
                        for r in range(4)
                    ]
                    if avail[i][tok]
                    else [0.0] * 4
                    for i in range(2)
                ]
                n_have = sum(bool(avail[i][tok]) for i in range(2))
                if meta == "concat":
                    want = xs[0] + xs[1]
                else:
                    want = [(xs[0][r] + xs[1][r]) / max(n_have, 1) for r in range(4)]
                assert out.embedded[b, t].tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


# ----------------------------------------------------------------------------- masks


@pytest.mark.parametrize("meta", list(METAS))
def test_padding_does_not_change_outputs(meta):
    model = tiny(METAS[meta])
    tokens, lengths = batch()
    a = model(tokens, lengths)
    padded = torch.cat([tokens, torch.randint(1, V, (3, 3))], 1)
    padded[1, 2:5] = torch.tensor([9, 10, 11])  # garbage where the padding was
    b = model(padded, lengths)
    torch.testing.assert_close(b.logits, a.logits)
    if a.weights is not None:
        torch.testing.assert_close(b.weights[:, :5], a.weights)
        assert (b.weights[:, 5:] == 0).all()


def test_empty_sentence_is_finite():
    model = tiny("cdme")
    model.train()
    tokens, _ = batch()
    out = model(tokens, torch.tensor([0, 2, 1]))
    assert torch.isfinite(out.logits).all()
    assert (out.weights[0] == 0).all()
    F.cross_entropy(out.logits, torch.tensor([0, 1, 1])).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("meta", ["dme", "cdme", "uniform", "concat"])
def test_gradcheck(meta):
    model = tiny(meta, hidden_size=2)
    tokens, lengths = batch()
    name = "meta_embedding.proj.0.weight" if model.meta_embedding is not None else "proj.0.weight"
    weight = dict(model.named_parameters())[name].detach().clone().requires_grad_(True)

    def f(wt):
        return torch.func.functional_call(model, {name: wt}, (tokens, lengths)).logits

    assert torch.autograd.gradcheck(f, (weight,))


# ----------------------------------------------------------------------------- errors


def test_bad_inputs():
    model = tiny()
    tokens, lengths = batch()
    check_token_inputs_rejected(model, tokens, lengths, V)


@pytest.mark.parametrize(
    "args, kw",
    [
        ([], {}),
        ([torch.randn(V, 3), torch.randn(V + 1, 2)], {}),
        (None, {"meta": "bogus"}),
        (None, {"meta": {"meta": "mean", "align": "soft"}}),
        (None, {"available": [torch.ones(V + 1, dtype=torch.bool)] * 2}),
        (None, {"available": [torch.ones(V, dtype=torch.bool)]}),
        (None, {"names": ["a"]}),
        (None, {"encoder": "cnn"}),
        (None, {"d_proj": 0}),
        ("matrix", {}),
    ],
)
def test_bad_config(args, kw):
    if args is None:
        args = tables()
    elif args == "matrix":
        args = torch.randn(V, 3)
    with pytest.raises(ConfigError):
        MetaEmbeddingClassifier(args, 2, **kw)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("meta", ["dme", "cdme", "mean", "concat"])
def test_get_config_round_trip(meta):
    model = tiny(meta, dtype=torch.float32)
    config = model.get_config()
    assert config["name"] == "meta-embedding-classifier"
    check_rebuild_same_output(model, batch(), output="logits")
    assert get("model", "meta-embedding-classifier").cls is MetaEmbeddingClassifier


def test_embeddings_objects_give_availability():
    vocab = Vocab(["good", "bad", "film"])
    m = np.random.default_rng(0).normal(size=(len(vocab), 3)).astype(np.float32)
    found = np.array([False, False, True, False, True])
    emb = Embeddings(vocab=vocab, matrix=m, found=found)
    model = MetaEmbeddingClassifier([emb, (len(vocab), 2)], 2, d_proj=2, hidden_size=2)
    assert model.available[0].tolist() == found.tolist()
    assert model.available[1].all()
    assert model.meta_embedding.tables[0].weight.requires_grad is False
    assert model.meta_embedding.tables[1].weight.requires_grad is True


# ----------------------------------------------------------------------------- learning


def mixed_task(seed=0, V=60, d=8):
    """Each word has a polarity; table A carries it for the even ids, table B for the odd
    ids; the other table holds a random (misleading) polarity there. Coordinate 1 of each
    table says whether it is the informative one. The label is the majority polarity."""
    g = torch.Generator().manual_seed(seed)
    pol = (torch.randint(0, 2, (V,), generator=g) * 2 - 1).float()
    group = torch.arange(V) % 2

    def table(informative):
        t = torch.randn(V, d, generator=g) * 0.1
        fake = (torch.randint(0, 2, (V,), generator=g) * 2 - 1).float()
        t[:, 0] = torch.where(informative, pol, fake)
        t[:, 1] = torch.where(informative, 1.0, -1.0)
        return t

    return pol, group, [table(group == 0), table(group == 1)]


def train_mixed(meta, steps=120):
    pol, group, tabs = mixed_task()

    def data(N, seed):
        g = torch.Generator().manual_seed(seed)
        tok = torch.randint(1, 60, (N, 9), generator=g)
        return tok, (pol[tok].sum(1) > 0).long()

    torch.manual_seed(0)
    (xtr, ytr), (xte, yte) = data(800, 1), data(400, 2)
    model = MetaEmbeddingClassifier(tabs, 2, d_proj=8, hidden_size=8, meta=meta, pooling="mean")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randint(0, 800, (32,), generator=g)
        loss = F.cross_entropy(model(xtr[idx]).logits, ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        out = model(xte)
    accuracy = (out.logits.argmax(-1) == yte).float().mean().item()
    informative = torch.where(group[xte] == 0, out.weights[..., 0], out.weights[..., 1])
    return accuracy, informative.mean().item()


@pytest.mark.slow
def test_dme_weights_the_informative_table_and_beats_uniform():
    # measured: DME accuracy 1.00 with 0.999 of the weight on the informative table;
    # uniform-weights baseline accuracy 0.89 (weights 0.5 by construction)
    dme_acc, dme_weight = train_mixed("dme")
    uniform_acc, uniform_weight = train_mixed("uniform")
    assert dme_weight > 0.9, dme_weight
    assert uniform_weight == pytest.approx(0.5)
    assert dme_acc >= 0.97, dme_acc
    assert uniform_acc <= 0.93, uniform_acc
    assert dme_acc >= uniform_acc + 0.05


@pytest.mark.parametrize("meta", ["dme", "cdme"])
def test_checkpoints_with_the_old_submodule_name_load(meta):
    """The meta-embedding submodule was ``meta`` until it hid behind torch.fx's
    ``GraphModule.meta`` (the exported program's module): a state dict with the old
    ``meta.*`` keys loads strictly into the renamed ``meta_embedding``, nested in another
    module too, and ``model.meta`` still answers, with a DeprecationWarning."""
    model, fresh = tiny(meta, hidden_size=2), tiny(meta, hidden_size=2)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    old = {k.replace("meta_embedding.", "meta.", 1): v for k, v in model.state_dict().items()}
    assert any(k.startswith("meta.") for k in old)
    fresh.load_state_dict(old)  # strict
    for k, v in model.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, atol=0, rtol=0)
    outer_fresh = torch.nn.Sequential(tiny(meta, hidden_size=2))
    outer_fresh.load_state_dict({"0." + k: v for k, v in old.items()})
    torch.testing.assert_close(outer_fresh[0].state_dict(), model.state_dict())
    with pytest.warns(DeprecationWarning, match=r"\.meta is deprecated; use \.meta_embedding"):
        assert model.meta is model.meta_embedding
