"""Tests of attnlab.models.vqa: the co-attention VQA model (Lu et al. 2016)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from attention_harness import check_rebuild_same_output
from token_input_checks import check_token_inputs_rejected

from attnlab._checks import ConfigError
from attnlab.models.vqa import VQAModel, VQAOutput
from attnlab.registry import get

V = 12
ATTENTIONS = {
    "parallel": "parallel",
    "alternating": "alternating",
    "interactive": "interactive",
    "mean": "mean",
    "uniform": "uniform",
    "sparsemax-alternating": {"score": "dot", "align": "sparsemax"},
    "parallel-max": {"co_attention": "parallel", "scores": "max"},
}


def tiny(attention="parallel", **kw):
    torch.manual_seed(0)
    kw = {"embed_dim": 6, "hidden_size": 4, "image_size": 16, "grid": 4, "channels": (5,), **kw}
    return VQAModel(V, 5, attention=attention, **kw).eval()


def inputs(B=3, n=5, lengths=(5, 2, 0), seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (B, 16, 16, 3), generator=g, dtype=torch.uint8)
    tokens = torch.randint(1, V, (B, n), generator=g)
    lengths = torch.tensor(lengths)
    tokens[torch.arange(n)[None] >= lengths[:, None]] = 0
    return images, tokens, lengths


# ----------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_shapes_and_masks(attention):
    model = tiny(ATTENTIONS[attention])
    images, tokens, lengths = inputs()
    out = model(images, tokens, lengths)
    assert isinstance(out, VQAOutput)
    assert out.logits.shape == (3, 5)
    assert out.region_weights.shape == (3, 16) and out.word_weights.shape == (3, 5)
    assert out.regions.shape == (3, 16, 8) and out.words.shape == (3, 5, 8)
    assert torch.isfinite(out.logits).all()
    # padding words get zero weight; an empty question has all-zero word weights
    assert (out.word_weights[1, 2:] == 0).all()
    assert (out.word_weights[2] == 0).all()
    assert out.word_weights[0].sum().item() == pytest.approx(1.0, abs=1e-5)
    assert out.word_weights[1].sum().item() == pytest.approx(1.0, abs=1e-5)
    assert (out.region_weights >= 0).all()
    sums = out.region_weights.sum(1)
    torch.testing.assert_close(sums[:2], torch.ones(2))
    # an empty question: max-pooled affinity scores are undefined -> zero region weights
    assert sums[2].item() == pytest.approx(0.0 if attention == "parallel-max" else 1.0, abs=1e-5)
    # padded words are zero features
    assert (out.words[1, 2:] == 0).all()


@pytest.mark.parametrize("attention", ["parallel", "alternating", "mean"])
def test_extra_padding_changes_nothing(attention):
    model = tiny(attention)
    images, tokens, lengths = inputs()
    out = model(images, tokens, lengths)
    longer = torch.cat([tokens, torch.zeros(3, 4, dtype=torch.long)], 1)
    out2 = model(images, longer, lengths)
    torch.testing.assert_close(out.logits, out2.logits)
    torch.testing.assert_close(out.word_weights, out2.word_weights[:, :5])
    torch.testing.assert_close(out.region_weights, out2.region_weights)


def test_baselines_are_uniform_weights():
    for attention in ("mean", "uniform"):
        out = tiny(attention)(*inputs())
        torch.testing.assert_close(out.region_weights, torch.full((3, 16), 1 / 16))
        torch.testing.assert_close(out.word_weights[0], torch.full((5,), 0.2))
        torch.testing.assert_close(out.word_weights[1], torch.tensor([0.5, 0.5, 0, 0, 0]))


def test_mean_baseline_by_hand():
    """logits = W_o tanh(W_h [c_q; c_v] + b_h) + b_o with c_q the mean of the real words
    and c_v the mean of the regions."""
    model = tiny("mean")
    images, tokens, lengths = inputs()
    with torch.no_grad():
        out = model(images, tokens, lengths)
    Q, R = out.words, out.regions
    for b in range(3):
        L = int(lengths[b])
        q = [sum(float(Q[b, t, k]) for t in range(L)) / L if L else 0.0 for k in range(8)]
        v = [sum(float(R[b, r, k]) for r in range(16)) / 16 for k in range(8)]
        pooled = q + v
        W_h, b_h = model.hidden.weight.detach(), model.hidden.bias.detach()
        h = [
            math.tanh(sum(float(W_h[i, j]) * pooled[j] for j in range(16)) + float(b_h[i]))
            for i in range(8)
        ]
        W_o, b_o = model.output.weight.detach(), model.output.bias.detach()
        for c in range(5):
            want = sum(float(W_o[c, i]) * h[i] for i in range(8)) + float(b_o[c])
            assert float(out.logits[b, c]) == pytest.approx(want, abs=1e-5)


def test_parallel_weights_by_hand():
    """Lu et al.'s parallel co-attention from its formula, word by word and region by
    region: A_ij = tanh(q_i^T W_A v_j), e_q_i = w1 . tanh(W1 q_i + sum_j A_ij W2 v_j),
    e_v_j = w2 . tanh(W2 v_j + sum_i A_ij W1 q_i) over the real words only."""
    model = tiny("parallel").double()
    images, tokens, lengths = inputs()
    torch.set_grad_enabled(False)
    try:
        check_parallel(model, model(images, tokens, lengths), lengths)
    finally:
        torch.set_grad_enabled(True)


def check_parallel(model, out, lengths):
    co = model.co_attention
    W_A, W1, W2 = co.affinity.W_A, co.W1.weight, co.W2.weight
    w1, w2 = co.w1, co.w2
    for b in (0, 1):
        L = int(lengths[b])
        Q, R = out.words[b, :L], out.regions[b]
        A = [[math.tanh(float(Q[i] @ W_A @ R[j])) for j in range(16)] for i in range(L)]
        p1 = [W1 @ Q[i] for i in range(L)]
        p2 = [W2 @ R[j] for j in range(16)]
        e_q = [float(w1 @ torch.tanh(p1[i] + sum(A[i][j] * p2[j] for j in range(16)))) for i in range(L)]  # fmt: skip
        e_v = [float(w2 @ torch.tanh(p2[j] + sum(A[i][j] * p1[i] for i in range(L)))) for j in range(16)]  # fmt: skip
        zq = sum(math.exp(e) for e in e_q)
        zv = sum(math.exp(e) for e in e_v)
        for i in range(L):
            assert float(out.word_weights[b, i]) == pytest.approx(math.exp(e_q[i]) / zq, abs=1e-9)
        for j in range(16):
            assert float(out.region_weights[b, j]) == pytest.approx(math.exp(e_v[j]) / zv, abs=1e-9)


def test_regions_are_row_major_cells():
    """Region r*g + c sees the image cell (r, c): a bright patch in one cell changes the
    features of that region most."""
    model = tiny("mean", region_positions=False)
    images = torch.zeros(1, 16, 16, 3, dtype=torch.uint8)
    base = model(images, torch.ones(1, 2, dtype=torch.long)).regions
    images[0, 8:12, 4:8] = 255  # cell (row 2, col 1) of the 4 x 4 grid
    changed = model(images, torch.ones(1, 2, dtype=torch.long)).regions
    diff = (changed - base).abs().sum(-1)[0]
    assert int(diff.argmax()) == 2 * 4 + 1


def test_image_index_and_uint8():
    model = tiny("parallel")
    images, tokens, lengths = inputs()
    index = torch.tensor([1, 1, 0])
    a = model(images[:2], tokens, lengths, image_index=index)
    b = model(images[index], tokens, lengths)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(a.region_weights, b.region_weights)
    c = model(images[index].float() / 255.0, tokens, lengths)
    torch.testing.assert_close(b.logits, c.logits)
    mask = torch.arange(5)[None] < lengths[:, None]
    torch.testing.assert_close(
        model(images, tokens, mask=mask).logits, model(images, tokens, lengths).logits
    )


def test_gradcheck_float64():
    torch.manual_seed(0)
    model = VQAModel(
        5, 3, embed_dim=3, hidden_size=2, image_size=4, grid=2, channels=(2,), attention="parallel"
    ).double()
    tokens = torch.tensor([[1, 2, 3], [4, 1, 0]])
    lengths = torch.tensor([3, 2])
    images = torch.rand(2, 4, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: model(x, tokens, lengths).logits, (images,))


def test_empty_question_gradients_are_finite():
    model = tiny("parallel").train()
    images, tokens, lengths = inputs()
    out = model(images, tokens, lengths)
    out.logits.sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


# ----------------------------------------------------------------------------- errors


def test_bad_inputs():
    model = tiny()
    images, tokens, lengths = inputs()
    with pytest.raises(ValueError, match=r"images has shape \(3, 8, 8, 3\)"):
        model(images[:, :8, :8], tokens, lengths)
    with pytest.raises(TypeError, match="tokens has dtype"):
        model(images, tokens.float(), lengths)
    with pytest.raises(ValueError, match="lengths must lie"):
        model(images, tokens, torch.tensor([6, 1, 1]))
    with pytest.raises(ValueError, match="prefix"):
        model(images, tokens, mask=torch.tensor([[True, False, True, False, False]] * 3))
    with pytest.raises(ValueError, match="image_index"):
        model(images, tokens, lengths, image_index=torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match=r"expected \[B, n\] with B = 2"):
        model(images[:2], tokens, lengths)
    with pytest.raises(TypeError, match="images has dtype"):
        model(images.long(), tokens, lengths)
    # the checks every token classifier makes of tokens / lengths / mask (float and double
    # tokens, a token id outside the vocabulary, a too long length, a float or long mask);
    # the more specific messages of the first two are asserted above
    check_token_inputs_rejected(
        lambda t, ln=None, **kw: model(images, t, ln, **kw), tokens, lengths, V
    )


def test_bad_config():
    with pytest.raises(ConfigError, match="attention must be one of"):
        tiny("bogus")
    with pytest.raises(ConfigError, match="co_attention must be one of"):
        tiny({"co_attention": "bogus"})
    with pytest.raises(ConfigError, match="power of 2"):
        tiny(grid=3)
    with pytest.raises(ConfigError, match="encoder"):
        tiny(encoder="transformer")
    with pytest.raises(TypeError, match="unknown options"):
        tiny({"co_attention": "alternating", "bogus": 1})


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("attention", ["parallel", "mean", {"score": "dot", "align": "sparsemax"}])
def test_config_round_trip(attention):
    model = tiny(attention, encoder="bigru")
    cfg = model.get_config()
    assert cfg["name"] == "vqa" and cfg["kind"] == "model"
    check_rebuild_same_output(model, inputs(), output="logits")
    assert get("model", "vqa").cls is VQAModel


# ----------------------------------------------------------------------------- learning

COLORS = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])


def cell_color_task(n, seed):
    """16 x 16 images of 4 x 4 cells, each one of 4 colours; the question names a cell
    ("what color cell c<k>"), the answer is that cell's colour: it depends on one region."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.randint(0, 4, (n, 4, 4), generator=g)
    images = COLORS[cells].repeat_interleave(4, 1).repeat_interleave(4, 2)
    k = torch.randint(0, 16, (n,), generator=g)
    tokens = torch.stack([torch.full((n,), 1), torch.full((n,), 2), 3 + k], 1)
    return images, tokens, cells.reshape(n, 16)[torch.arange(n), k]


def train_cell_task(attention, epochs=6):
    torch.manual_seed(0)
    model = VQAModel(
        19,
        4,
        embed_dim=16,
        hidden_size=16,
        image_size=16,
        grid=4,
        channels=(8,),
        attention=attention,
    )
    X, T, Y = cell_color_task(2000, 0)
    Xt, Tt, Yt = cell_color_task(500, 1)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(epochs):
        perm = torch.randperm(2000)
        for i in range(0, 2000, 50):
            idx = perm[i : i + 50]
            loss = F.cross_entropy(model(X[idx], T[idx]).logits, Y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        out = model(Xt, Tt)
    return (out.logits.argmax(-1) == Yt).float().mean().item(), out, Tt


@pytest.mark.slow
def test_learning_parallel_co_attention_finds_the_region(one_thread):
    # measured: parallel co-attention 0.98, mean pooling 0.34 (chance 0.25)
    acc, out, tokens = train_cell_task("parallel")
    assert acc > 0.9
    # the region the question names gets the largest weight most of the time
    named = tokens[:, 2] - 3
    hit = (out.region_weights.argmax(-1) == named).float().mean().item()
    assert hit > 0.8


@pytest.mark.slow
def test_learning_mean_baseline_cannot(one_thread):
    acc, _, _ = train_cell_task("mean")
    assert acc < 0.5


def test_bad_flags_and_indices_are_refused_at_construction() -> None:
    with pytest.raises(TypeError, match=r"^region_positions must be a bool, got 'no'$"):
        tiny(region_positions="no")
    with pytest.raises(ConfigError, match=r"^padding_idx must be an int or None, got True$"):
        tiny(padding_idx=True)
