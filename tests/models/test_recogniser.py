"""Listen, Attend and Spell recogniser: shapes, every attention kind, baselines, padding
frames that do not matter, gradients into the listener, one-line errors."""

from __future__ import annotations

import pytest
import torch

from attnlab import registry
from attnlab._checks import ConfigError
from attnlab.models.recogniser import ListenAttendSpell

ATTENTIONS = [
    None,
    "mean",
    "uniform",
    {"score": "scaled-dot"},
    {"score": "location-aware"},
    {"align": "hard"},
    {"align": "sparsemax"},
]


def _model(**kw) -> ListenAttendSpell:
    torch.manual_seed(0)
    kw = {"n_mels": 5, "listener_size": 4, "pyramid": 2, "embed_dim": 3, "hidden_size": 6, **kw}
    return ListenAttendSpell(9, **kw)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    features = torch.randn(3, 13, 5, generator=g)
    lengths = torch.tensor([13, 6, 1])
    tokens = torch.tensor([[1, 3, 4, 5], [1, 6, 7, 0], [1, 3, 0, 0]])
    return features, lengths, tokens


@pytest.mark.parametrize("attention", ATTENTIONS, ids=str)
def test_forward_shapes_masks_and_weights(attention) -> None:
    model = _model(attention=attention).train()
    features, lengths, tokens = _inputs()
    out = model(features, lengths, tokens)
    # S = ceil(T / 4) = 4 annotation vectors; real ones ceil(lengths / 4)
    assert out.logits.shape == (3, 4, 9) and out.weights.shape == (3, 4, 4)
    assert out.mask.sum(1).tolist() == [4, 2, 1]
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(3, 4))
    assert (out.weights[~out.mask[:, None, :].expand_as(out.weights)] == 0).all()
    stochastic = isinstance(attention, dict) and attention.get("align") == "hard"
    assert (out.log_prob is not None) == stochastic
    if attention in ("mean", "uniform"):
        expected = out.mask.float() / out.mask.sum(1, keepdim=True)
        torch.testing.assert_close(out.weights, expected[:, None, :].expand_as(out.weights))


@pytest.mark.parametrize("attention", [None, {"score": "location-aware"}, "mean"], ids=str)
def test_padding_frames_do_not_matter(attention) -> None:
    model = _model(attention=attention, stack=2).eval()
    features, lengths, tokens = _inputs()
    noisy = features.clone()
    for b, n in enumerate(lengths.tolist()):
        noisy[b, n:] = 1e3 * torch.randn(13 - n, 5)
    a, b = model(features, lengths, tokens), model(noisy, lengths, tokens)
    torch.testing.assert_close(a.logits, b.logits)
    # and alone, without the batch's padding, the short utterance reads the same
    alone = model(features[1:2, :6], lengths[1:2], tokens[1:2])
    torch.testing.assert_close(alone.logits, a.logits[1:2], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", [None, {"score": "location-aware"}, "mean"], ids=str)
def test_gradient_reaches_the_listener(attention) -> None:
    model = _model(attention=attention)
    out = model(*_inputs())
    out.logits.sum().backward()
    for layer in (model.listener.bottom, *model.listener.pyramid):
        assert layer.weight_ih_l0.grad is not None and layer.weight_ih_l0.grad.abs().sum() > 0


def test_location_aware_attention_gets_the_previous_weights() -> None:
    model = _model(attention={"score": "location-aware"}).eval()
    assert model.location
    seen = []
    original = model.attention.forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("prev_weights"))
        return original(*args, **kwargs)

    model.attention.forward = spy
    out = model(*_inputs())
    assert seen[0].abs().sum() == 0  # zeros before the first step
    torch.testing.assert_close(seen[1], out.weights[:, 0])
    torch.testing.assert_close(seen[3], out.weights[:, 2])


def test_greedy_transcripts_and_their_attention() -> None:
    model = _model().eval()
    features, lengths, _ = _inputs()
    dec = model.greedy(features, lengths, max_len=5)
    real = [4, 2, 1]
    for b, toks in enumerate(dec.tokens):
        assert len(toks) <= 5 and all(t not in (0, 1, 2) for t in toks)  # no PAD, BOS, EOS
        assert dec.attention[b].shape == (len(toks), real[b])
        if toks:
            # greedy is teacher forcing on its own output
            tf = model(features[b : b + 1], lengths[b : b + 1], torch.tensor([[1, *toks]]))
            assert tf.logits[0, : len(toks)].argmax(-1).tolist() == toks
            if len(toks) < 5:
                assert int(tf.logits[0, -1].argmax()) == 2  # it stopped at EOS


def test_registered_and_configurable() -> None:
    assert registry.get("model", "las").cls is ListenAttendSpell
    model = _model(stack=3, pyramid=0)
    assert model(*_inputs()).weights.shape == (3, 4, 5)


def test_one_line_errors() -> None:
    model = _model()
    features, lengths, tokens = _inputs()
    with pytest.raises(
        ValueError, match=r"features has shape \(3, 13\), expected \[B, T, n_mels\]"
    ):
        model(features[..., 0], lengths, tokens)
    with pytest.raises(ValueError, match=r"\[B, T >= 1, 5\]"):
        model(features[..., :4], lengths, tokens)
    with pytest.raises(TypeError, match=r"features must be a float torch\.Tensor"):
        model(features.long(), lengths, tokens)
    with pytest.raises(ValueError, match=r"outside \[1, T\] = \[1, 13\]"):
        model(features, torch.tensor([14, 2, 1]), tokens)
    with pytest.raises(ValueError, match=r"outside \[1, T\]"):
        model(features, torch.tensor([3, 0, 1]), tokens)
    with pytest.raises(ValueError, match=r"lengths must be an integer tensor \[B\] = \[3\]"):
        model(features, torch.tensor([3.0, 2.0, 1.0]), tokens)
    with pytest.raises(ValueError, match=r"tokens_in has shape \(2, 4\)"):
        model(features, lengths, tokens[:2])
    with pytest.raises(ValueError, match=r"outside \[0, vocab_size\) = \[0, 9\)"):
        model(features, lengths, tokens + 8)
    with pytest.raises(ValueError, match="max_len must be an int >= 1"):
        model.greedy(features, lengths, max_len=0)
    for bad, match in [
        ({"pyramid": -1}, "pyramid must be an int >= 0"),
        ({"stack": 0}, "stack must be an int >= 1"),
        ({"hidden_size": 0}, "hidden_size must be an int >= 1"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"eos_idx": 9}, r"eos_idx=9 is outside"),
    ]:
        with pytest.raises(ConfigError, match=match):
            _model(**bad)
