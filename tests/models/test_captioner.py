"""Show, Attend and Tell captioner: shapes, every attention kind, baselines, errors."""

from __future__ import annotations

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.models.captioner import ShowAttendTell, grid_cnn


def _model(**kw) -> ShowAttendTell:
    torch.manual_seed(0)
    return ShowAttendTell(9, image_size=16, grid=4, channels=(4,), embed_dim=5, hidden_size=6, **kw)


def _images(B: int = 3) -> torch.Tensor:
    return torch.randint(
        0, 256, (B, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )


@pytest.mark.parametrize(
    "attention",
    [
        None,
        "mean",
        "uniform",
        {"score": "scaled-dot"},
        {"score": "location-aware"},
        {"align": "hard"},
        {"align": "hard", "estimator": "gumbel"},
        {"align": "sparsemax"},
    ],
    ids=str,
)
def test_forward_shapes_and_weights(attention) -> None:
    model = _model(attention=attention).train()
    tokens = torch.tensor([[1, 3, 4, 5], [1, 6, 7, 0], [1, 3, 0, 0]])
    out = model(_images(), tokens)
    assert out.logits.shape == (3, 4, 9) and out.weights.shape == (3, 4, 16)
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 4))
    stochastic = isinstance(attention, dict) and attention.get("align") == "hard"
    assert (out.log_prob is not None) == stochastic
    if stochastic:
        assert out.log_prob.shape == (3, 4)
    if attention in ("mean", "uniform"):
        assert torch.allclose(out.weights, torch.full_like(out.weights, 1 / 16))
    out.logits.sum().backward()
    assert model.output.weight.grad is not None


def test_greedy_matches_teacher_forcing_on_its_own_output() -> None:
    model = _model().eval()
    images = _images()
    dec = model.greedy(images, max_len=5)
    for b, toks in enumerate(dec.tokens):
        assert all(t not in (0, 1) for t in toks)  # never PAD or BOS
        if not toks:
            continue
        out = model(images[b : b + 1], torch.tensor([[1, *toks[:-1]]]))
        assert out.logits[0].argmax(-1).tolist() == toks
        torch.testing.assert_close(out.weights[0], dec.attention[b])


def test_location_aware_feeds_back_the_previous_weights() -> None:
    model = _model(attention={"score": "location-aware"})
    assert model.location
    images, tokens = _images(2), torch.tensor([[1, 3, 4], [1, 5, 6]])
    out = model(images, tokens)
    # the first step sees no previous weights; changing the location filters changes later
    # steps only
    with torch.no_grad():
        model.attention.score.conv.weight.add_(1.0)
    again = model(images, tokens)
    torch.testing.assert_close(again.weights[:, 0], out.weights[:, 0])
    assert not torch.allclose(again.weights[:, 1:], out.weights[:, 1:])


def test_grid_cnn_and_errors() -> None:
    assert grid_cnn(32, 4, (8, 16), 10)(torch.zeros(1, 3, 32, 32)).shape == (1, 10, 4, 4)
    with pytest.raises(ConfigError, match="power of 2"):
        grid_cnn(24, 4, (8,), 10)
    model = _model()
    with pytest.raises(ValueError, match=r"expected \[B, S, S, 3\] = \[B, 16, 16, 3\]"):
        model(torch.zeros(1, 8, 8, 3), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="2 rows but there are 1 images"):
        model(_images(1), torch.tensor([[1], [1]]))
    with pytest.raises(ConfigError, match="name="):
        _model(attention={"name": "soft"})
    with pytest.raises(ConfigError, match="bos_idx"):
        ShowAttendTell(3, bos_idx=5)


def test_expected_mix_replaces_samples_by_the_soft_weights_in_training() -> None:
    tokens = torch.tensor([[1, 3, 4], [1, 5, 6]])
    images = _images(2)
    always = _model(attention={"align": "hard"}, expected_mix=1.0).train()
    out = always(images, tokens)
    assert (out.log_prob == 0).all()  # no sampled step enters REINFORCE
    assert ((out.weights > 0) & (out.weights < 1)).any()  # soft weights, not one-hot
    never = _model(attention={"align": "hard"}, expected_mix=0.0).train()
    out = never(images, tokens)
    assert ((out.weights == 0) | (out.weights == 1)).all() and (out.log_prob < 0).all()
    # evaluation always takes the argmax cell
    ev = always.eval()(images, tokens)
    assert ((ev.weights == 0) | (ev.weights == 1)).all()
    # the straight-through Gumbel estimator has gradients through its sample: no mixing
    gumbel = _model(attention={"align": "hard", "estimator": "gumbel"}, expected_mix=1.0)
    out = gumbel.train()(images, tokens)
    assert ((out.weights == 0) | (out.weights == 1)).all()
    with pytest.raises(ConfigError, match="expected_mix"):
        _model(expected_mix=1.5)


def test_the_expected_context_reads_the_attention_values() -> None:
    """With ``value_dim`` the attention's values are ``W_V a_l``: the expected context of a
    mixed caption is ``sum_l p_l W_V a_l``, the vectors the sampled path reads (it read
    the raw regions, and ``W_V`` got no gradient from those captions)."""
    model = _model(attention={"align": "hard", "value_dim": 6}, expected_mix=1.0).train()
    regions = model.encode(_images(2))
    state = model.init_state(regions)
    context, weights, _ = model.attend(state, regions)
    values = model.attention.value_proj(regions)
    want = (weights[:, :, None] * values).sum(1)
    torch.testing.assert_close(context, want)
    context.sum().backward()
    assert model.attention.value_proj.weight.grad.abs().sum() > 0


def test_expected_mix_draws_one_coin_per_image() -> None:
    """Xu et al. (4.1): "with probability 0.5 for a given image" the sampled location is
    replaced by its expected value, so a caption is soft at every word or sampled at every
    word, never a mix; over many images both kinds occur at about the rate."""
    B, T = 64, 5
    tokens = torch.randint(3, 9, (B, T), generator=torch.Generator().manual_seed(2))
    tokens[:, 0] = 1
    images = torch.randint(
        0, 256, (B, 16, 16, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    model = _model(attention={"align": "hard"}, expected_mix=0.5).train()
    torch.manual_seed(4)
    out = model(images, tokens)
    one_hot = ((out.weights == 0) | (out.weights == 1)).all(-1)  # [B, T]: a sampled step
    sampled = out.log_prob != 0  # a step in the REINFORCE term
    assert torch.equal(one_hot, sampled)
    per_image = one_hot.all(1)
    assert torch.equal(one_hot, per_image[:, None].expand(B, T))  # never mixed in a caption
    # 64 fair coins: both kinds occur, at a rate well inside 4 standard deviations (4 x 4)
    assert 16 <= int(per_image.sum()) <= 48
    # no coin at evaluation: every step takes the argmax cell
    ev = model.eval()(images, tokens)
    assert ((ev.weights == 0) | (ev.weights == 1)).all()


@pytest.mark.parametrize(
    ("attention", "mix", "coin"),
    [
        ({"align": "hard"}, 0.5, True),
        ({"align": "hard"}, 0.0, False),
        ({"align": "hard", "estimator": "gumbel"}, 0.5, False),
        (None, 0.5, False),
        ("uniform", 0.5, False),
    ],
    ids=str,
)
def test_only_reinforce_hard_attention_draws_the_coin(attention, mix, coin) -> None:
    """The coin is drawn only where it is used, so the random stream (dropout, data order)
    of the other attentions is the same as without ``expected_mix``."""
    model = _model(attention=attention, expected_mix=mix).train()
    regions = model.encode(_images(2))
    torch.manual_seed(5)
    state = model.init_state(regions)
    after = torch.rand(1)
    assert ("expected" in state) is coin
    torch.manual_seed(5)
    assert torch.equal(torch.rand(1), after) is not coin  # a drawn coin moves the stream


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"expected_mix": "0.1"}, ConfigError, r"^expected_mix must be a number in \[0, 1\]"),
        ({"expected_mix": True}, ConfigError, r"^expected_mix must be a number in \[0, 1\]"),
        ({"expected_mix": float("nan")}, ConfigError, r"^expected_mix must be a number"),
        ({"region_positions": "no"}, TypeError, r"^region_positions must be a bool"),
        ({"bos_idx": 2.5}, ConfigError, r"^bos_idx must be an int or None, got 2\.5$"),
    ],
)
def test_bad_settings_are_refused_at_construction(kw, error, message) -> None:
    with pytest.raises(error, match=message):
        _model(**kw)


@pytest.mark.parametrize("max_len", [0, -1, 2.5])
def test_greedy_max_len_is_checked(max_len) -> None:
    with pytest.raises(ValueError, match=rf"^max_len must be an int >= 1, got {max_len!r}$"):
        _model().eval().greedy(_images(1), max_len=max_len)
