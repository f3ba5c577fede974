"""Tests of attnlab.models.target: LCR-Rot / LCR-Rot-hop target sentiment classifier."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_harness import Inputs, check_rebuild_same_output

from attnlab._checks import ConfigError
from attnlab.models.target import TargetOutput, TargetSentimentClassifier
from attnlab.registry import get

V = 30
ATTENTIONS = {
    "lcr-rot-hop": "lcr-rot-hop",
    "lcr-rot": "lcr-rot",
    "additive-sparsemax": {"score": "additive", "align": "sparsemax", "hops": 2},
    "mean": "mean",
    "uniform": "uniform",
}


def tiny(attention="lcr-rot-hop", **kw):
    torch.manual_seed(0)
    kw = {"embed_dim": 5, "hidden_size": 3, **kw}
    return TargetSentimentClassifier(V, 3, attention=attention, **kw).eval()


def batch(seed=0):
    """Three examples: no left context, a two-word target, no right context."""
    g = torch.Generator().manual_seed(seed)
    lengths = {
        "left": torch.tensor([0, 3, 2]),
        "target": torch.tensor([1, 2, 1]),
        "right": torch.tensor([4, 0, 2]),
    }
    parts = {}
    for p, n in (("left", 3), ("target", 2), ("right", 4)):
        t = torch.randint(1, V, (3, n), generator=g)
        t[torch.arange(n)[None] >= lengths[p][:, None]] = 0
        parts[p] = t
    return parts, lengths


def run(model, parts, lengths, **kw):
    return model(
        parts["left"],
        parts["target"],
        parts["right"],
        left_lengths=lengths["left"],
        target_lengths=lengths["target"],
        right_lengths=lengths["right"],
        **kw,
    )


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_shapes_and_weights(attention):
    model = tiny(ATTENTIONS[attention])
    parts, lengths = batch()
    out = run(model, parts, lengths)
    assert isinstance(out, TargetOutput)
    assert out.logits.shape == (3, 3) and out.representation.shape == (3, 24)
    assert {p: h.shape for p, h in out.hidden.items()} == {
        "left": (3, 3, 6),
        "target": (3, 2, 6),
        "right": (3, 4, 6),
    }
    hops = {"lcr-rot-hop": 3, "lcr-rot": 1, "additive-sparsemax": 2, "mean": 0, "uniform": 3}
    assert len(out.hops) == hops[attention]
    if attention == "mean":
        assert out.weights is None
        return
    for hop in out.hops:
        assert set(hop) == {"left", "right", "target_left", "target_right"}
        for key, w in hop.items():
            p = "target" if key.startswith("target") else key
            real = torch.arange(w.shape[1])[None] < lengths[p][:, None]
            assert (w[~real] == 0).all()
            sums = w.sum(-1)
            nonempty = lengths[p] > 0
            torch.testing.assert_close(sums[nonempty], torch.ones(int(nonempty.sum())))
            assert (sums[~nonempty] == 0).all()


# ----------------------------------------------------------------------------- formula


def _naive_bilstm(rnn: torch.nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    """Bidirectional LSTM states of one unpadded sequence ``x`` ``[n, d]``, step by step
    (Hochreiter & Schmidhuber 1997, gates i, f, g, o as in PyTorch's layout)."""
    H = rnn.hidden_size

    def go(suffix, seq):
        w_ih, w_hh = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
        b = getattr(rnn, f"bias_ih_l0{suffix}") + getattr(rnn, f"bias_hh_l0{suffix}")
        h = torch.zeros(H, dtype=x.dtype)
        c = torch.zeros(H, dtype=x.dtype)
        out = []
        for xt in seq:
            z = w_ih @ xt + w_hh @ h + b
            i, f = torch.sigmoid(z[:H]), torch.sigmoid(z[H : 2 * H])
            g, o = torch.tanh(z[2 * H : 3 * H]), torch.sigmoid(z[3 * H :])
            c = f * c + i * g
            h = o * torch.tanh(c)
            out.append(h)
        return out

    rows = list(x)
    if not rows:
        return x.new_zeros(0, 2 * H)
    fwd, bwd = go("", rows), go("_reverse", rows[::-1])[::-1]
    return torch.stack([torch.cat([a, b]) for a, b in zip(fwd, bwd, strict=True)])


def _naive_attend(attn, H: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Activated general attention by hand: e_j = tanh(h_j^T W q + b), softmax, sum."""
    if H.shape[0] == 0:
        return torch.zeros(H.shape[1], dtype=H.dtype), []
    W, b = attn.score.W.weight, attn.score.b
    e = [math.tanh(float((h @ (W @ q) + b).detach())) for h in H]
    top = max(e)
    z = [math.exp(v - top) for v in e]
    a = [v / sum(z) for v in z]
    return sum(ai * h for ai, h in zip(a, H, strict=True)), a


@pytest.mark.parametrize("share_weights", [True, False])
def test_lcr_rot_hop_equals_a_naive_loop(share_weights):
    model = tiny("lcr-rot-hop", share_weights=share_weights).double()
    parts, lengths = batch()
    out = run(model, parts, lengths)
    E = model.embedding.weight
    for b in range(3):
        H = {
            p: _naive_bilstm(model.encoders[p].rnn, E[parts[p][b, : int(lengths[p][b])]])
            for p in parts
        }
        r_t = H["target"].mean(0)
        r_tl = r_tr = r_t
        for s in range(3):
            rot = model.rotatory.rotations[s if not share_weights else 0]
            r_l, a_l = _naive_attend(rot.left, H["left"], r_tl)
            r_r, a_r = _naive_attend(rot.right, H["right"], r_tr)
            r_tl, a_tl = _naive_attend(rot.target_left, H["target"], r_l)
            r_tr, a_tr = _naive_attend(rot.target_right, H["target"], r_r)
            hop = out.hops[s]
            for key, a in (
                ("left", a_l),
                ("right", a_r),
                ("target_left", a_tl),
                ("target_right", a_tr),
            ):
                got = hop[key][b, : len(a)]
                torch.testing.assert_close(got, torch.tensor(a, dtype=torch.float64))
        rep = torch.cat([r_l, r_r, r_tl, r_tr])
        torch.testing.assert_close(out.representation[b], rep)
        torch.testing.assert_close(out.logits[b], model.output.weight @ rep + model.output.bias)


@pytest.mark.parametrize("attention", ["mean", "uniform"])
def test_baselines_are_means_of_each_part(attention):
    model = tiny(attention)
    parts, lengths = batch()
    out = run(model, parts, lengths)
    for b in range(3):
        means = {}
        for p in parts:
            n = int(lengths[p][b])
            h = out.hidden[p][b, :n]
            means[p] = h.mean(0) if n else torch.zeros(6)
        rep = torch.cat([means["left"], means["right"], means["target"], means["target"]])
        torch.testing.assert_close(out.representation[b], rep)
    if attention == "uniform":
        assert out.hops[0]["left"][1].tolist() == pytest.approx([1 / 3] * 3)
        assert out.hops[0]["target_left"][1].tolist() == [0.5, 0.5]


def test_uniform_flag_on_a_trained_model_equals_mean_pooling():
    model = tiny("lcr-rot-hop")
    parts, lengths = batch()
    model.uniform = True
    out = run(model, parts, lengths)
    mean = tiny("mean")
    mean.load_state_dict(model.state_dict(), strict=False)
    torch.testing.assert_close(out.logits, run(mean, parts, lengths).logits)
    assert len(out.hops) == 3


# ----------------------------------------------------------------------------- padding, empty


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_padding_does_not_change_the_result(attention):
    model = tiny(ATTENTIONS[attention])
    parts, lengths = batch()
    a = run(model, parts, lengths)
    padded = {p: torch.cat([t, torch.randint(1, V, (3, 3))], 1) for p, t in parts.items()}
    b = run(model, padded, lengths)
    torch.testing.assert_close(b.logits, a.logits)
    masks = {p: torch.arange(padded[p].shape[1])[None] < lengths[p][:, None] for p in parts}
    c = model(
        padded["left"],
        padded["target"],
        padded["right"],
        left_mask=masks["left"],
        target_mask=masks["target"],
        right_mask=masks["right"],
    )
    torch.testing.assert_close(c.logits, a.logits)
    if a.hops:
        assert (b.hops[-1]["left"][:, 3:] == 0).all()


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_empty_parts_and_finite_grads(attention):
    model = tiny(ATTENTIONS[attention]).train()
    parts, lengths = batch()
    empty = torch.zeros(3, 0, dtype=torch.long)
    out = model(empty, parts["target"], empty, target_lengths=lengths["target"])
    assert torch.isfinite(out.logits).all()
    assert (out.representation[:, :12] == 0).all()  # r_l and r_r are zero
    out.logits.sum().backward()
    for p in model.parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all()
    # an empty target too: everything zero, the logits are the output bias
    model.eval()
    out = model(empty, empty, empty)
    torch.testing.assert_close(out.logits, model.output.bias.expand(3, 3))
    assert model(empty[:0], empty[:0], empty[:0]).logits.shape == (0, 3)


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("attention", ["lcr-rot-hop", {"score": "additive"}, "uniform"])
def test_gradcheck(attention):
    model = tiny(attention, embed_dim=2, hidden_size=2, hops=2).double()
    _, lengths = batch()
    masks = {
        p: torch.arange(n)[None] < lengths[p][:, None]
        for p, n in (("left", 3), ("target", 2), ("right", 4))
    }
    xs = tuple(
        torch.randn(3, masks[p].shape[1], 2, dtype=torch.float64, requires_grad=True)
        for p in ("left", "target", "right")
    )

    def f(left, target, right):
        x = {"left": left, "target": target, "right": right}
        return model.classify(x, masks).logits

    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-5, fast_mode=True)


# ----------------------------------------------------------------------------- errors


def test_bad_inputs():
    model = tiny()
    parts, lengths = batch()
    L, T, R = parts["left"], parts["target"], parts["right"]
    with pytest.raises(TypeError, match=r"left has dtype torch.float32 and shape \(3, 3\)"):
        model(L.float(), T, R)
    with pytest.raises(ValueError, match=r"right has shape \(2, 4\), expected \[B, n\] = \[3, n\]"):
        model(L, T, R[:2])
    with pytest.raises(ValueError, match=r"target has shape \(3, 2, 1\), expected \[B, n\]"):
        model(L, T[..., None], R)
    with pytest.raises(ValueError, match=r"outside \[0, vocab_size\)"):
        model(L, T + V, R)
    with pytest.raises(ValueError, match=r"left_lengths has shape \(2,\), expected \[B\] = \[3\]"):
        model(L, T, R, left_lengths=lengths["left"][:2])
    with pytest.raises(ValueError, match=r"outside \[0, n\] = \[0, 3\]"):
        model(L, T, R, left_lengths=lengths["left"] + 5)
    with pytest.raises(TypeError, match=r"right_mask must be a torch.bool tensor"):
        model(L, T, R, right_mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match=r"right_mask has shape \(3, 2\)"):
        model(L, T, R, right_mask=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="not both"):
        model(L, T, R, left_lengths=lengths["left"], left_mask=torch.ones(3, 3, dtype=torch.bool))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"attention": "nope"}, "attention must be"),
        ({"attention": 3}, "attention must be a name or a dict"),
        ({"encoder": "cnn"}, "encoder must be one of"),
        ({"hops": 0}, "hops must be an int >= 1"),
        ({"hidden_size": 0}, "hidden_size must be an int >= 1"),
        ({"dropout": -0.1}, "dropout must be in"),
    ],
)
def test_bad_config(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TargetSentimentClassifier(V, 3, **{"embed_dim": 4, "hidden_size": 2, **kwargs})


# ----------------------------------------------------------------------------- embeddings, config


def test_pretrained_embeddings():
    matrix = np.random.default_rng(0).normal(size=(V, 4)).astype(np.float32)
    model = TargetSentimentClassifier(embeddings=matrix, freeze_embeddings=True, hidden_size=2)
    assert model.vocab_size == V and model.embedding.embedding_dim == 4
    assert not model.embedding.weight.requires_grad
    with pytest.raises(ConfigError, match="embed_dim=5 but embeddings"):
        TargetSentimentClassifier(embeddings=matrix, embed_dim=5)


def test_registry_and_config_round_trip():
    entry = get("model", "target-sentiment")
    assert entry.cls is TargetSentimentClassifier and "Wallaart" in entry.source
    model = tiny({"score": "additive", "align": "sparsemax", "hops": 2}, share_weights=False)
    cfg = model.get_config()
    assert cfg["name"] == "target-sentiment" and cfg["kind"] == "model"
    parts, lengths = batch()
    inputs = Inputs(
        (parts["left"], parts["target"], parts["right"]),
        {f"{p}_lengths": lengths[p] for p in ("left", "target", "right")},
    )
    check_rebuild_same_output(model, inputs, output="logits")


def test_uniform_keeps_the_checkpoint_layout():
    assert tiny().state_dict().keys() == tiny("uniform").state_dict().keys()
    assert not any(k.startswith("rotatory") for k in tiny("mean").state_dict())


# ----------------------------------------------------------------------------- learning


def _typed_targets(n: int, seed: int):
    """The left context holds one X-polarity word (2 good / 3 bad) and one Y-polarity
    word (4 good / 5 bad) among noise words (8..29); the target is 6 or 7. Towards target
    6 the sentiment is the X word's, towards 7 the Y word's. The right context is noise.
    Averaging each part cannot let the target choose the word (the left states never see
    the target and the output layer is linear): when X and Y disagree, one of the four
    (polarities, target) cases is always wrong, so mean pooling tops out at 87.5%."""
    g = torch.Generator().manual_seed(seed)
    left = torch.randint(8, V, (n, 5), generator=g)
    right = torch.randint(8, V, (n, 3), generator=g)
    x_pol = torch.randint(0, 2, (n,), generator=g)
    y_pol = torch.randint(0, 2, (n,), generator=g)
    which = torch.randint(0, 2, (n,), generator=g)
    for i in range(n):
        slots = torch.randperm(5, generator=g)
        left[i, slots[0]] = 2 + x_pol[i]
        left[i, slots[1]] = 4 + y_pol[i]
    target = (6 + which)[:, None]
    labels = 1 - torch.where(which == 0, x_pol, y_pol)
    return left, target, right, labels


def _train_target(attention, steps=60, seed=0):
    torch.manual_seed(seed)
    model = TargetSentimentClassifier(V, 2, embed_dim=8, hidden_size=8, attention=attention, hops=1)
    left, target, right, labels = _typed_targets(1024, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(labels), (64,), generator=g)
        loss = F.cross_entropy(model(left[idx], target[idx], right[idx]).logits, labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    left, target, right, labels = _typed_targets(512, seed=2)
    model.eval()
    with torch.no_grad():
        logits = model(left, target, right).logits
    return float((logits.argmax(-1) == labels).float().mean())


@pytest.mark.slow
def test_rotatory_attention_picks_the_target_dependent_word():
    """In 60 steps LCR-Rot (one hop) reaches 0.998 test accuracy, mean pooling of each
    part 0.78 (its ceiling is 0.875, see _typed_targets)."""
    acc = _train_target("lcr-rot")
    assert acc >= 0.97, acc
    mean_acc = _train_target("mean")
    assert mean_acc <= 0.85, mean_acc


def test_share_weights_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"^share_weights must be a bool, got 1$"):
        tiny(share_weights=1)
