"""Jain & Wallace's tests: each importance measure against an independent computation, and
on a trained model of a task whose important token is known."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from signal_task import SIGNAL, VOCAB

from attnlab.evaluation.divergences import JSD_MAX, jsd, tvd
from attnlab.evaluation.explanation import (
    adversarial_attention,
    attention_weights,
    gradient_importance,
    importance_correlations,
    kendall_per_instance,
    leave_one_out_importance,
    permutation_test,
)
from attnlab.models.sentence import SentenceClassifier


@pytest.fixture
def tiny() -> tuple[SentenceClassifier, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = SentenceClassifier(12, 3, embed_dim=5, encoder="bilstm", hidden_size=4).double()
    tokens = torch.tensor([[3, 5, 7, 2], [4, 9, 0, 0]])
    return model.eval(), tokens, torch.tensor([4, 2])


def _probs(model: SentenceClassifier, seq: list[int]) -> torch.Tensor:
    x = torch.tensor([seq]) if seq else torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        return model(x, lengths=torch.tensor([len(seq)])).logits.softmax(-1)[0]


def test_leave_one_out_against_rerunning_without_each_token(tiny) -> None:
    model, tokens, lengths = tiny
    loo = leave_one_out_importance(model, tokens, lengths)
    for b in range(2):
        seq = tokens[b, : int(lengths[b])].tolist()
        full = _probs(model, seq)
        for t in range(len(seq)):
            without = _probs(model, seq[:t] + seq[t + 1 :])
            assert loo[b, t].item() == pytest.approx(0.5 * (full - without).abs().sum().item())
    assert torch.all(loo[1, 2:] == 0)


def test_gradient_importance_against_finite_differences(tiny) -> None:
    """g_t = |d y_c / d s| at s = 1 where x_t is scaled by s (attention held fixed)."""
    model, tokens, lengths = tiny
    g = gradient_importance(model, tokens, lengths)
    weights, probs = attention_weights(model, tokens, lengths)
    for b in range(2):
        c = int(probs[b].argmax())
        for t in range(int(lengths[b])):

            def y(scale: float, b: int = b, t: int = t, c: int = c) -> float:
                def hook(_m, _i, out):
                    out = out.clone()
                    out[b, t] = out[b, t] * scale
                    return out

                h = model.embedding.register_forward_hook(hook)
                try:
                    m = torch.arange(4)[None, :] < lengths[:, None]
                    with torch.no_grad():
                        logits = model.classify_with_weights(model.encode(tokens, m), weights)
                finally:
                    h.remove()
                return float(logits.softmax(-1)[b, c])

            eps = 1e-6
            fd = (y(1 + eps) - y(1 - eps)) / (2 * eps)
            assert g[b, t].item() == pytest.approx(abs(fd), rel=1e-4, abs=1e-9)
    assert torch.all(g[1, 2:] == 0)


def test_kendall_by_hand() -> None:
    # x = (1, 2, 3), y = (1, 3, 2): 2 concordant, 1 discordant pair -> tau = 1/3
    taus, ps = kendall_per_instance(
        torch.tensor([[1.0, 2.0, 3.0, 9.0]]),
        torch.tensor([[1.0, 3.0, 2.0, 0.0]]),
        torch.tensor([3]),
    )
    assert taus[0] == pytest.approx(1 / 3)
    assert 0 < ps[0] <= 1
    taus, _ = kendall_per_instance(torch.ones(1, 3), torch.arange(3.0)[None], torch.tensor([3]))
    assert math.isnan(taus[0])


@pytest.mark.parametrize("permutations", [7, 8])
def test_permutation_test_against_a_naive_loop(tiny, permutations) -> None:
    """Against a loop; the median of an even count is the mean of the middle two."""
    model, tokens, lengths = tiny
    gen = torch.Generator().manual_seed(3)
    medians, max_w = permutation_test(
        model, tokens, lengths, permutations=permutations, generator=gen
    )
    weights, probs = attention_weights(model, tokens, lengths)
    gen = torch.Generator().manual_seed(3)
    m = torch.arange(4)[None, :] < lengths[:, None]
    hidden = model.encode(tokens, m)
    for b in range(2):
        L = int(lengths[b])
        changes = []
        for _ in range(permutations):
            perm = torch.randperm(L, generator=gen)
            w = torch.zeros(1, 4, dtype=weights.dtype)
            w[0, :L] = weights[b, :L][perm]
            with torch.no_grad():
                p = model.classify_with_weights(hidden[b : b + 1], w).softmax(-1)[0]
            changes.append(0.5 * (p - probs[b]).abs().sum().item())
        assert medians[b].item() == pytest.approx(statistics.median(changes))
        assert max_w[b].item() == pytest.approx(weights[b].max().item())


def test_adversarial_attention_respects_the_constraint(tiny) -> None:
    model, tokens, lengths = tiny
    res = adversarial_attention(model, tokens, lengths, epsilon=0.02, steps=60)
    weights, probs = attention_weights(model, tokens, lengths)
    m = torch.arange(4)[None, :] < lengths[:, None]
    with torch.no_grad():
        p = model.classify_with_weights(model.encode(tokens, m), res.weights).softmax(-1)
    assert torch.all(tvd(p, probs) <= 0.02 + 1e-9)
    assert torch.allclose(res.tvd, tvd(p, probs), atol=1e-9)
    assert torch.allclose(jsd(res.weights, weights), res.max_jsd, atol=1e-9)
    assert torch.all(res.max_jsd <= JSD_MAX)
    # the JSD from ``weights`` is convex, so over the real tokens it peaks at a one-hot
    one_hot = torch.eye(4, dtype=weights.dtype)[None] * m[:, None, :]
    peak = jsd(one_hot, weights[:, None]).masked_fill(~m, 0).max(-1).values
    assert torch.all(res.max_jsd <= peak + 1e-9)
    # it finds something: the start alone (1 step) is at JSD <= 0.046 on this model; 60
    # steps reach 0.98 / 0.99 of the peak here and >= 0.56 of it (>= 0.18) for the 10 seeds
    # 0-9 of the fixture's model (a search that returns the model's weights finds 0)
    start = adversarial_attention(model, tokens, lengths, epsilon=0.02, steps=1)
    assert torch.all(res.max_jsd >= 0.5 * peak), (res.max_jsd, peak)
    assert torch.all(res.max_jsd > start.max_jsd + 0.1), (res.max_jsd, start.max_jsd)
    assert torch.all(res.weights[1, 2:] == 0)
    assert torch.allclose(res.weights.sum(-1), torch.ones(2, dtype=res.weights.dtype))
    with pytest.raises(ValueError, match="epsilon"):
        adversarial_attention(model, tokens, lengths, epsilon=0.0)


def test_model_without_the_protocol_is_rejected() -> None:
    with pytest.raises(TypeError, match="classify_with_weights"):
        attention_weights(
            torch.nn.Linear(2, 2), torch.zeros(1, 2, dtype=torch.long), torch.tensor([2])
        )


@pytest.mark.slow
def test_measures_find_the_signal_token(signal_model, signal_test) -> None:
    """On the generated task (label 1 iff token 1 occurs) the attention, the gradient and the
    leave-one-out importance all rank the signal token first in positive sentences; a random
    ranking would pick it about 1/7 of the time."""
    hits = {"attention": [], "gradient": [], "loo": []}
    for tokens, lengths, labels in signal_test:
        w, _ = attention_weights(signal_model, tokens, lengths)
        measures = {
            "attention": w,
            "gradient": gradient_importance(signal_model, tokens, lengths),
            "loo": leave_one_out_importance(signal_model, tokens, lengths),
        }
        pos = labels == 1
        for name, v in measures.items():
            top = tokens.gather(1, v.argmax(-1, keepdim=True)).squeeze(1)
            hits[name] += (top[pos] == SIGNAL).tolist()
    rates = {k: sum(v) / len(v) for k, v in hits.items()}
    assert all(r >= 0.9 for r in rates.values()), rates
    gen = torch.Generator().manual_seed(0)
    tokens, lengths, labels = signal_test[0]
    rand = torch.rand(tokens.shape, generator=gen) * (
        torch.arange(tokens.shape[1]) < lengths[:, None]
    )
    top = tokens.gather(1, rand.argmax(-1, keepdim=True)).squeeze(1)
    assert float((top[labels == 1] == SIGNAL).float().mean()) < 0.5
    assert VOCAB > 2


@pytest.mark.slow
def test_correlation_summary_and_permutation_on_the_trained_model(signal_model, signal_test):
    summary = importance_correlations(signal_model, signal_test[:2])
    assert set(summary) == {"attention-gradient", "attention-loo", "gradient-loo"}
    for s in summary.values():
        assert s.n == 64 and -1 <= s.mean <= 1 and 0 <= s.significant <= 1
    tokens, lengths, labels = signal_test[0]
    medians, _ = permutation_test(
        signal_model, tokens, lengths, permutations=30, generator=torch.Generator().manual_seed(0)
    )
    # positive sentences hinge on the signal token: permuting its weight away changes the
    # output a lot; negative sentences have none, so permutations barely matter
    assert float(medians[labels == 1].mean()) > 0.2
    assert float(medians[labels == 0].mean()) < 0.05
