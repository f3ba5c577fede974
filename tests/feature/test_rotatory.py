import math

import pytest
import torch
from attention_harness import Inputs, check_rebuild_same_output
from torch import nn

import attnlab
from attnlab.feature.rotatory import LCRRotHop, RotatoryAttention, masked_mean


def _naive_attend(att, q, F, mask):
    """Activated-general soft attention written out with Python loops."""
    W = att.score.W.weight.detach().tolist()  # [d_k, d_q]
    b = float(att.score.b.detach())
    B, n, d_k = F.shape
    out = []
    weights = []
    for bi in range(B):
        scores = []
        for l in range(n):
            if mask is not None and not mask[bi, l]:
                scores.append(None)
                continue
            s = 0.0
            for i in range(d_k):
                for j in range(q.shape[1]):
                    s += float(F[bi, l, i]) * W[i][j] * float(q[bi, j])
            scores.append(math.tanh(s + b))
        allowed = [s for s in scores if s is not None]
        z = sum(math.exp(s) for s in allowed)
        a = [0.0 if s is None else math.exp(s) / z for s in scores]
        c = [sum(a[l] * float(F[bi, l, i]) for l in range(n)) for i in range(d_k)]
        out.append(c)
        weights.append(a)
    return torch.tensor(out, dtype=torch.float64).reshape(B, d_k), torch.tensor(
        weights, dtype=torch.float64
    ).reshape(B, n)


def _naive_mean(F, mask):
    rows = []
    for bi in range(F.shape[0]):
        idx = [l for l in range(F.shape[1]) if mask is None or mask[bi, l]]
        if not idx:
            rows.append([0.0] * F.shape[2])
        else:
            rows.append(
                [sum(float(F[bi, l, i]) for l in idx) / len(idx) for i in range(F.shape[2])]
            )
    return torch.tensor(rows, dtype=torch.float64)


def _inputs(B=2, n_l=3, n_t=2, n_r=4, d_c=3, d_t=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    left = torch.randn(B, n_l, d_c, generator=g, dtype=torch.float64)
    target = torch.randn(B, n_t, d_t, generator=g, dtype=torch.float64)
    right = torch.randn(B, n_r, d_c, generator=g, dtype=torch.float64)
    lm = torch.ones(B, n_l, dtype=torch.bool)
    lm[1, 2:] = False
    tm = torch.ones(B, n_t, dtype=torch.bool)
    tm[0, 1] = False
    rm = torch.ones(B, n_r, dtype=torch.bool)
    rm[0, 3] = False
    return left, target, right, lm, tm, rm


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("share", [True, False])
def test_matches_naive_rotation(hops, share):
    torch.manual_seed(1)
    model = LCRRotHop(3, 2, hops=hops, share_weights=share).double()
    for p in model.parameters():
        nn.init.normal_(p, std=0.7)
    left, target, right, lm, tm, rm = _inputs()
    out = model(left, target, right, left_mask=lm, target_mask=tm, right_mask=rm)
    r_tl = r_tr = _naive_mean(target, tm)
    for s in range(hops):
        rot = model.rotations[s % len(model.rotations)]
        r_l, a_l = _naive_attend(rot.left, r_tl, left, lm)
        r_r, a_r = _naive_attend(rot.right, r_tr, right, rm)
        r_tl, a_tl = _naive_attend(rot.target_left, r_l, target, tm)
        r_tr, a_tr = _naive_attend(rot.target_right, r_r, target, tm)
        torch.testing.assert_close(out.hops[s]["left"], a_l)
        torch.testing.assert_close(out.hops[s]["right"], a_r)
        torch.testing.assert_close(out.hops[s]["target_left"], a_tl)
        torch.testing.assert_close(out.hops[s]["target_right"], a_tr)
    torch.testing.assert_close(out.output, torch.cat([r_l, r_r, r_tl, r_tr], -1))
    assert out.output.shape == (2, model.out_dim)
    assert len(out.hops) == hops


def test_rotatory_is_one_hop_and_param_counts():
    rot = RotatoryAttention(4, 3)
    assert rot.hops == 1
    shared = LCRRotHop(4, 3, hops=3, share_weights=True)
    separate = LCRRotHop(4, 3, hops=3, share_weights=False)
    n_shared = sum(p.numel() for p in shared.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    assert n_separate == 3 * n_shared == 3 * sum(p.numel() for p in rot.parameters())


def test_masked_mean():
    x = torch.arange(12.0).reshape(2, 3, 2)
    m = torch.tensor([[True, False, True], [False, False, False]])
    torch.testing.assert_close(masked_mean(x, m), torch.tensor([[2.0, 3.0], [0.0, 0.0]]))
    assert masked_mean(torch.zeros(2, 0, 3), None).shape == (2, 3)


def test_empty_parts_give_zero_context_and_finite_grads():
    torch.manual_seed(0)
    model = LCRRotHop(3, 2, hops=2)
    B = 2
    # target at the start of the sentence: no left context at all (n_l = 0)
    left = torch.zeros(B, 0, 3, requires_grad=True)
    target = torch.randn(B, 1, 2, requires_grad=True)
    right = torch.randn(B, 4, 3, requires_grad=True)
    rm = torch.tensor([[True] * 4, [False] * 4])  # example 1: no right context either
    out = model(left, target, right, right_mask=rm)
    assert torch.equal(out.left, torch.zeros(B, 3))
    assert torch.equal(out.right[1], torch.zeros(3))
    assert out.hops[0]["left"].shape == (B, 0)
    assert torch.equal(out.hops[0]["right"][1], torch.zeros(4))
    out.output.sum().backward()
    for t in (target, right):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(right.grad[1], torch.zeros(4, 3))


def test_empty_target():
    model = RotatoryAttention(3, 2)
    left, target, right, lm, tm, rm = _inputs()
    tm = torch.zeros_like(tm)
    out = model(
        left.float(), target.float(), right.float(), left_mask=lm, target_mask=tm, right_mask=rm
    )
    assert torch.isfinite(out.output).all()
    assert torch.equal(out.target_left, torch.zeros(2, 2))


def test_gradcheck():
    torch.manual_seed(0)
    model = LCRRotHop(3, 2, hops=2).double()
    left, target, right, lm, tm, rm = _inputs()
    args = [t.clone().requires_grad_() for t in (left, target, right)]
    assert torch.autograd.gradcheck(
        lambda a, b, c: model(a, b, c, left_mask=lm, target_mask=tm, right_mask=rm).output,
        args,
        eps=1e-6,
        atol=1e-5,
    )


def test_pluggable_score_and_registry_roundtrip():
    model = LCRRotHop(4, hops=2, score="additive", align="sparsemax", d_w=5)
    assert model.rotations[0].left.score.W1.weight.shape == (5, 4)
    cfg = model.get_config()
    assert cfg["name"] == "lcr-rot-hop" and cfg["kind"] == "feature"
    left, target, right, lm, tm, rm = _inputs(d_c=4, d_t=4)
    inputs = Inputs(
        (left.float(), target.float(), right.float()),
        {"left_mask": lm, "target_mask": tm, "right_mask": rm},
    )
    # same class, config and parameter shapes; the same output with the same parameters
    check_rebuild_same_output(model, inputs, output="output")
    assert isinstance(attnlab.build({"name": "rotatory", "d_c": 4}), RotatoryAttention)


def test_bad_input():
    model = RotatoryAttention(3, 2)
    left, target, right, lm, tm, _ = _inputs()
    left, target, right = left.float(), target.float(), right.float()
    with pytest.raises(
        ValueError, match=r"left has shape \(1, 3, 3\), expected \[B, n, d\] = \[2, n, 3\]"
    ):
        model(left[:1], target, right)
    with pytest.raises(ValueError, match=r"right has shape \(2, 4, 2\)"):
        model(left, target, right[..., :2])
    with pytest.raises(ValueError, match="target_mask has shape"):
        model(left, target, right, target_mask=tm[:, :1])
    with pytest.raises(TypeError, match="left_mask"):
        model(left, target, right, left_mask=lm.float())
    with pytest.raises(TypeError, match="dtype"):
        model(left.double(), target, right)
    with pytest.raises(attnlab.ConfigError, match="hops"):
        LCRRotHop(3, hops=0)


# ----------------------------------------------------------------------------- learning

N_TOK, POS, NEG = 30, (20, 21, 22), (23, 24, 25)
TARGETS = (26, 27, 28, 29)
LENGTH = 12


def _sentiment_data(n, gen):
    """Two targets of opposite sentiment in one sentence; the sentiment word of each target
    stands right next to it. The label is the sentiment of the first target, whose left
    context / target / right context split is returned."""
    tokens = torch.randint(0, 20, (n, LENGTH), generator=gen)
    labels = torch.randint(0, 2, (n,), generator=gen)
    split = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        while True:
            a, b = torch.randint(1, LENGTH - 1, (2,), generator=gen).tolist()
            if abs(a - b) >= 4:
                break
        side_a = -1 if torch.rand(1, generator=gen) < 0.5 else 1
        side_b = -1 if torch.rand(1, generator=gen) < 0.5 else 1
        sent_a = POS if labels[i] == 1 else NEG
        sent_b = NEG if labels[i] == 1 else POS
        tokens[i, a] = TARGETS[int(torch.randint(0, 4, (1,), generator=gen))]
        tokens[i, b] = TARGETS[int(torch.randint(0, 4, (1,), generator=gen))]
        tokens[i, a + side_a] = sent_a[int(torch.randint(0, 3, (1,), generator=gen))]
        tokens[i, b + side_b] = sent_b[int(torch.randint(0, 3, (1,), generator=gen))]
        split[i] = a
    return tokens, split, labels


class _Features(nn.Module):
    """Token embedding + embedding of the distance to the target (the feature model)."""

    def __init__(self, d):
        super().__init__()
        self.tok = nn.Embedding(N_TOK, d)
        self.dist = nn.Embedding(LENGTH + 1, d)

    def forward(self, tokens, split):
        n = tokens.shape[1]
        pos = torch.arange(n)
        dist = (pos[None, :] - split[:, None]).abs()
        feats = self.tok(tokens) + self.dist(dist)
        left_mask = pos[None, :] < split[:, None]
        right_mask = pos[None, :] > split[:, None]
        target = feats.gather(1, split[:, None, None].expand(-1, 1, feats.shape[-1]))
        return feats, target, left_mask, right_mask


class _RotModel(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.features = _Features(d)
        self.rot = LCRRotHop(d, hops=2)
        self.out = nn.Linear(self.rot.out_dim, 2)

    def forward(self, tokens, split):
        feats, target, lm, rm = self.features(tokens, split)
        # the left and right contexts are the sentence with the other side masked out
        return self.out(self.rot(feats, target, feats, left_mask=lm, right_mask=rm).output)


class _MeanModel(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.features = _Features(d)
        self.out = nn.Sequential(nn.Linear(2 * d, 32), nn.Tanh(), nn.Linear(32, 2))

    def forward(self, tokens, split):
        feats, target, _, _ = self.features(tokens, split)
        return self.out(torch.cat([feats.mean(1), target[:, 0]], -1))


def _train_eval(model, seed):
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(250):
        tokens, split, labels = _sentiment_data(64, gen)
        loss = nn.functional.cross_entropy(model(tokens, split), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens, split, labels = _sentiment_data(1000, torch.Generator().manual_seed(seed + 99))
    with torch.no_grad():
        return (model(tokens, split).argmax(-1) == labels).float().mean().item()


@pytest.mark.slow
def test_learns_target_dependent_sentiment_where_mean_pooling_cannot():
    torch.manual_seed(0)
    rot_acc = _train_eval(_RotModel(), seed=0)
    torch.manual_seed(0)
    mean_acc = _train_eval(_MeanModel(), seed=0)
    # measured with these seeds: rotatory ~0.99, mean pooling ~0.5 (chance)
    assert rot_acc > 0.9, rot_acc
    assert mean_acc < 0.7, mean_acc


def test_value_dim_is_refused_with_a_reason():
    from attnlab._checks import ConfigError
    from attnlab.feature.rotatory import LCRRotHop

    with pytest.raises(ConfigError, match="keeps the feature size"):
        LCRRotHop(6, 6, value_dim=4)


def test_stochastic_alignment_log_prob_is_carried():
    from attnlab.feature.rotatory import LCRRotHop

    torch.manual_seed(0)
    parts = torch.randn(2, 3, 6), torch.randn(2, 2, 6), torch.randn(2, 4, 6)
    hard = LCRRotHop(6, hops=2, align="hard").train()
    out = hard(*parts)
    assert out.log_prob is not None and out.log_prob.shape == (2,)
    # 4 attentions x 2 hops, each a log-probability of one key: finite and <= 0
    assert torch.all(torch.isfinite(out.log_prob)) and torch.all(out.log_prob <= 0)
    out.log_prob.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in hard.parameters())
    assert LCRRotHop(6)(*parts).log_prob is None


@pytest.mark.parametrize("share_weights", ["no", 1, None])
def test_lcr_rot_hop_share_weights_must_be_a_bool(share_weights: object) -> None:
    """``share_weights="no"`` shared the weights (a truthy string)."""
    with pytest.raises(TypeError, match=r"^share_weights must be a bool, got"):
        LCRRotHop(4, hops=2, share_weights=share_weights)


@pytest.mark.parametrize(("name", "value"), [("d_c", 2.5), ("d_c", True), ("d_t", 0), ("d_t", "4")])
def test_lcr_rot_hop_sizes_are_positive_ints(name: str, value: object) -> None:
    """With a size-free score (``dot``) ``d_c=2.5`` was accepted (``out_dim`` 2 d_c + 2 d_t
    a float); with the default score the error named the score's ``d_q``."""
    with pytest.raises(
        attnlab.ConfigError, match=rf"^{name} must be an int >= 1(?: or None)?, got"
    ):
        LCRRotHop(**{"d_c": 4, name: value}, score="dot")
