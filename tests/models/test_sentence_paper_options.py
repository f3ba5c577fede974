"""The two options of :class:`~attnlab.models.sentence.SentenceClassifier` that follow
Jain & Wallace's code: ``output="sigmoid"`` (one logit ``z`` returned as ``[0, z]``) and
``sentence_markers=True`` (start / end vectors the encoder reads and the attention never
sees), each against a computation by hand, and the explanation measures of such a model
(they must cover exactly the real tokens)."""

from __future__ import annotations

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.evaluation.divergences import tvd
from attnlab.evaluation.explanation import (
    adversarial_attention_multi,
    attention_weights,
    gradient_importance,
    leave_one_out_importance,
    permutation_test,
)
from attnlab.models.sentence import SentenceClassifier, SigmoidOutput

TOKENS = torch.tensor([[3, 5, 7, 2, 8], [4, 9, 6, 0, 0], [11, 0, 0, 0, 0]])
LENGTHS = torch.tensor([5, 3, 1])
MASK = torch.arange(5)[None] < LENGTHS[:, None]


def _model(seed: int = 0, **kw) -> SentenceClassifier:
    torch.manual_seed(seed)
    kw = {"embed_dim": 5, "encoder": "bilstm", "hidden_size": 4, **kw}
    return SentenceClassifier(12, 2, **kw).eval()


# ----------------------------------------------------------------------------- sigmoid


@pytest.mark.parametrize("encoder", ["bilstm", "cnn", "average"])
def test_sigmoid_output_is_one_logit_as_two_class_logits(encoder):
    model = _model(encoder=encoder, output="sigmoid")
    assert isinstance(model.output, SigmoidOutput) and model.output.out_features == 2
    assert model.output.linear.weight.shape == (1, model.d_c)  # one output
    out = model(TOKENS, LENGTHS)
    w, b = model.output.linear.weight[0], model.output.linear.bias[0]
    z = out.pooled @ w + b  # by hand
    torch.testing.assert_close(out.logits[:, 0], torch.zeros(3))
    torch.testing.assert_close(out.logits[:, 1], z)
    # softmax([0, z]) = [1 - sigmoid(z), sigmoid(z)]
    probs = out.logits.softmax(-1)
    torch.testing.assert_close(probs[:, 1], torch.sigmoid(z))
    torch.testing.assert_close(probs[:, 0], 1 - torch.sigmoid(z))


def test_tvd_of_the_two_class_distribution_is_the_change_of_the_one_probability():
    z1, z2 = torch.tensor([-1.3, 0.2, 2.5]), torch.tensor([0.4, 0.1, -3.0])
    two = lambda z: torch.stack([torch.zeros_like(z), z], -1).softmax(-1)  # noqa: E731
    expected = (torch.sigmoid(z1) - torch.sigmoid(z2)).abs()
    torch.testing.assert_close(tvd(two(z1), two(z2)), expected)


def test_sigmoid_output_options_are_checked():
    with pytest.raises(ConfigError, match="output='sigmoid' needs num_classes=2, got 3"):
        SentenceClassifier(12, 3, embed_dim=5, hidden_size=4, output="sigmoid")
    with pytest.raises(ConfigError, match="output must be 'softmax' or 'sigmoid', got 'tanh'"):
        SentenceClassifier(12, 2, embed_dim=5, hidden_size=4, output="tanh")
    with pytest.raises(ConfigError, match="sentence_markers must be true or false"):
        SentenceClassifier(12, 2, embed_dim=5, hidden_size=4, sentence_markers="yes")


def test_the_options_are_in_the_config():
    model = _model(output="sigmoid", sentence_markers=True)
    cfg = model.get_config()
    assert cfg["output"] == "sigmoid" and cfg["sentence_markers"] is True


# ----------------------------------------------------------------------------- markers


def _states_by_hand(model: SentenceClassifier, row: int) -> torch.Tensor:
    """The BiLSTM states of the real tokens of one sentence, run alone (no padding) on
    ``[start, E[w_1..w_L], end]``."""
    L = int(LENGTHS[row])
    x = model.embedding(TOKENS[row, :L])
    ext = torch.cat([model.markers[0:1], x, model.markers[1:2]])[None]
    h, _ = model.lstm(ext)
    return h[0, 1 : L + 1]


def test_markers_are_read_by_the_encoder_around_the_real_tokens():
    model = _model(sentence_markers=True)
    assert model.markers.shape == (2, 5) and model.markers.requires_grad
    with torch.no_grad():
        h = model.encode(TOKENS, MASK)
        assert h.shape == (3, 5, model.d_h)  # one state per input position
        for row in range(3):
            L = int(LENGTHS[row])
            torch.testing.assert_close(h[row, :L], _states_by_hand(model, row))
            assert (h[row, L:] == 0).all()
        # the markers matter: other markers, other states
        model.markers.add_(1.0)
        assert not torch.allclose(model.encode(TOKENS, MASK)[:, :1], h[:, :1])


def test_the_attention_pools_only_the_real_tokens():
    model = _model(sentence_markers=True)
    with torch.no_grad():
        out = model(TOKENS, LENGTHS)
        assert out.weights.shape == (3, 5)  # the real tokens' positions, no marker slot
        assert (out.weights[~MASK] == 0).all()
        torch.testing.assert_close(out.weights.sum(-1), torch.ones(3))
        for row in range(3):
            L = int(LENGTHS[row])
            h = _states_by_hand(model, row)
            pooled = (out.weights[row, :L, None] * h).sum(0)
            torch.testing.assert_close(out.pooled[row], pooled)
            # the weights are the attention's on the real states alone
            alone = model.attention(None, h[None], need_weights=True).weights.reshape(-1)
            torch.testing.assert_close(out.weights[row, :L], alone)


def test_markers_leave_a_context_free_encoder_unchanged():
    """The averaged-embedding encoder has no context: the markers cannot change the
    states of the real tokens (same parameters with and without them)."""
    plain = _model(encoder="average")
    marked = _model(encoder="average", sentence_markers=True)
    marked.load_state_dict({**plain.state_dict(), "markers": marked.markers.detach()})
    with torch.no_grad():
        torch.testing.assert_close(marked(TOKENS, LENGTHS).logits, plain(TOKENS, LENGTHS).logits)


def test_markers_are_fixed_with_frozen_embeddings_and_need_a_prefix_mask():
    frozen = _model(sentence_markers=True, freeze_embeddings=True)
    assert not frozen.markers.requires_grad
    cnn = _model(encoder="cnn", sentence_markers=True)
    holes = torch.tensor([[True, False, True, False, False]] * 3)
    with pytest.raises(ValueError, match="sentence markers"):
        cnn(TOKENS, mask=holes)


# ----------------------------------------------------------------------------- explanations


def test_explanation_measures_cover_exactly_the_real_tokens():
    model = _model(sentence_markers=True, output="sigmoid")
    w, probs = attention_weights(model, TOKENS, LENGTHS)
    g = gradient_importance(model, TOKENS, LENGTHS, classes="all")
    loo = leave_one_out_importance(model, TOKENS, LENGTHS)
    for measure in (w, g, loo):
        assert measure.shape == (3, 5)
        assert (measure[~MASK] == 0).all()
    assert (g[MASK] > 0).all() and (loo[MASK] > 0).all()
    # leave-one-out by hand: the sentence without token t, markers around it
    row, t = 0, 2
    kept = torch.cat([TOKENS[row, :t], TOKENS[row, t + 1 : 5]])[None]
    with torch.no_grad():
        p = model(kept, torch.tensor([4])).logits.softmax(-1)
    expected = (p[0, 1] - probs[row, 1]).abs()  # = TVD for one sigmoid output
    torch.testing.assert_close(loo[row, t], expected)
    medians, _ = permutation_test(model, TOKENS, LENGTHS, permutations=7)
    assert medians.shape == (3,) and medians[2] == 0  # one token: nothing to permute
    gen = torch.Generator().manual_seed(0)
    adv = adversarial_attention_multi(model, TOKENS, LENGTHS, steps=5, generator=gen)
    assert (adv.weights[~MASK] == 0).all()
    torch.testing.assert_close(adv.weights.sum(-1), torch.ones(3))


def test_gradient_importance_by_hand_with_markers():
    """|d p_1 / d x_t . x_t| with the attention held fixed, computed through an explicit
    run of the BiLSTM on ``[start, x, end]``: the marker positions are not tokens."""
    model = _model(sentence_markers=True, output="sigmoid")
    got = gradient_importance(model, TOKENS, LENGTHS, classes="predicted")
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    for row in range(2):
        L = int(LENGTHS[row])
        x = model.embedding(TOKENS[row, :L]).detach().requires_grad_(True)
        ext = torch.cat([model.markers[0:1], x, model.markers[1:2]])[None]
        h, _ = model.lstm(ext)
        pooled = (w[row, :L, None] * h[0, 1 : L + 1]).sum(0)
        p = torch.sigmoid(model.output.linear(pooled))[0]
        p = p if p >= 0.5 else 1 - p  # the predicted class's probability
        (grad,) = torch.autograd.grad(p, x)
        torch.testing.assert_close(got[row, :L], (grad * x).sum(-1).abs(), atol=1e-6, rtol=1e-4)
