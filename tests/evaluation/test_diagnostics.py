"""Wiegreffe & Pinter's diagnostics on a generated task with a known important token."""

from __future__ import annotations

import pytest
import torch
from signal_task import SIGNAL, make_signal_data

from attnlab.evaluation.diagnostics import (
    adversarial_model,
    as_batches,
    frozen_weight_diagnostic,
    seed_variance,
    uniform_weights_gap,
)
from attnlab.evaluation.explanation import attention_weights


def test_as_batches_pads_and_measures() -> None:
    ((x, n, y),) = as_batches([[3, 4, 5], [6]], [1, 0], batch_size=4)
    assert x.tolist() == [[3, 4, 5], [6, 0, 0]]
    assert n.tolist() == [3, 1] and y.tolist() == [1, 0]


@pytest.mark.slow
def test_uniform_gap_and_seed_variance(signal_model, signal_test) -> None:
    gap = uniform_weights_gap(signal_model, signal_test)
    assert gap["learned_accuracy"] >= 0.95
    assert 0 <= gap["uniform_accuracy"] <= 1 and 0 <= gap["uniform_f1"] <= 1
    same = seed_variance([signal_model, signal_model], signal_test)
    assert same["mean_jsd"] == pytest.approx(0.0, abs=1e-7)
    assert same["mean_tvd"] == pytest.approx(0.0, abs=1e-7)
    assert len(same["jsd"]) == 128
    with pytest.raises(ValueError, match="two models"):
        seed_variance([signal_model], signal_test)


@pytest.mark.slow
def test_frozen_weights_carry_the_signal(signal_model) -> None:
    """A token-wise MLP pooled with the trained model's attention (which sits on the signal
    token) is near perfect; pooled with weights that avoid the signal token it is at chance."""
    train = as_batches(*make_signal_data(256, seed=11), batch_size=32)
    test = as_batches(*make_signal_data(128, seed=12), batch_size=32)
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))

    def transferred(tokens, lengths):
        return attention_weights(signal_model, tokens, lengths)[0].float()

    def away(tokens, lengths):
        m = (torch.arange(tokens.shape[1])[None] < lengths[:, None]) & (tokens != SIGNAL)
        return m.float() / m.sum(1, keepdim=True).clamp_min(1)

    good = frozen_weight_diagnostic(emb, 2, train, test, transferred, epochs=8, lr=0.01)
    bad = frozen_weight_diagnostic(emb, 2, train, test, away, epochs=8, lr=0.01)
    uniform = frozen_weight_diagnostic(emb, 2, train, test, "uniform", epochs=8, lr=0.01)
    learned = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=8, lr=0.01)
    assert good["accuracy"] >= 0.95, good
    assert bad["accuracy"] <= 0.65, bad
    assert 0 <= uniform["f1"] <= 1 and 0 <= learned["f1"] <= 1
    with pytest.raises(ValueError, match="weights must be"):
        frozen_weight_diagnostic(emb, 2, train[:1], test[:1], "random", epochs=1)


@pytest.mark.slow
def test_adversarial_model_moves_attention_more_with_lambda(signal_model) -> None:
    train = as_batches(*make_signal_data(128, seed=21), batch_size=32)
    test = as_batches(*make_signal_data(64, seed=22), batch_size=32)
    calm = adversarial_model(signal_model, train, test, lam=0.0, epochs=3, lr=0.01)
    wild = adversarial_model(signal_model, train, test, lam=1.0, epochs=3, lr=0.01)
    assert wild.mean_jsd > calm.mean_jsd + 0.05, (calm.mean_jsd, wild.mean_jsd)
    assert 0 <= wild.mean_tvd <= 1 and 0 <= calm.mean_tvd <= 1
    assert calm.mean_tvd < 0.2
