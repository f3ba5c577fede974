"""The measures of the paper protocol of the explanation tests (``explain_run(protocol=
"paper")``, end to end in tests/lab/studies/test_explain_run_protocol.py): Jain &
Wallace's gradient over every output and their multi-adversary search, Wiegreffe &
Pinter's frozen-weight MLP (tanh, fine-tuned embeddings, best dev epoch), adversarial
model from scratch with KL and early stopping, and per-instance seed medians."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from signal_task import make_signal_data

from attnlab.evaluation.diagnostics import (
    FrozenWeightMLP,
    _optimizer,
    adversarial_model,
    as_batches,
    frozen_weight_diagnostic,
    seed_variance,
)
from attnlab.evaluation.divergences import JSD_MAX, jsd
from attnlab.evaluation.explanation import (
    adversarial_attention_multi,
    attention_weights,
    gradient_importance,
)
from attnlab.models.sentence import SentenceClassifier


def _model(classes: int, seed: int = 0) -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(12, classes, embed_dim=5, encoder="bilstm", hidden_size=4).eval()


TOKENS = torch.tensor([[3, 5, 7, 2, 8], [4, 9, 6, 0, 0]])
LENGTHS = torch.tensor([5, 3])
MASK = torch.arange(5)[None] < LENGTHS[:, None]


# ----------------------------------------------------------------------------- gradient


def _per_class(model, k: int) -> torch.Tensor:
    """|grad_x p_k . x| per token by hand: the attention detached, one class."""
    m = torch.arange(5)[None] < LENGTHS[:, None]
    weights, _ = attention_weights(model, TOKENS, LENGTHS)
    x = model.embedding(TOKENS).detach().requires_grad_(True)
    handle = model.embedding.register_forward_hook(lambda *_: x)
    try:
        probs = model.classify_with_weights(model.encode(TOKENS, m), weights).softmax(-1)
        (grad,) = torch.autograd.grad(probs[:, k].sum(), x)
    finally:
        handle.remove()
    return (grad * x).sum(-1).abs() * m


def test_gradient_over_every_class_is_the_sum_over_classes():
    model = _model(3)
    expected = sum(_per_class(model, k) for k in range(3))
    got = gradient_importance(model, TOKENS, LENGTHS, classes="all")
    assert torch.allclose(got, expected, atol=1e-6)
    assert (got[1, 3:] == 0).all()


def test_for_two_classes_every_class_ranks_as_the_predicted_one():
    model = _model(2)
    every = gradient_importance(model, TOKENS, LENGTHS, classes="all")
    predicted = gradient_importance(model, TOKENS, LENGTHS, classes="predicted")
    assert torch.allclose(every, 2 * predicted, atol=1e-6)  # |d p_0| = |d p_1|
    with pytest.raises(ValueError, match="classes must be 'predicted' or 'all'"):
        gradient_importance(model, TOKENS, LENGTHS, classes="true")


# ----------------------------------------------------------------------------- adversary


def test_multi_adversary_respects_the_selection_and_the_support():
    model = _model(2)
    gen = torch.Generator().manual_seed(0)
    r = adversarial_attention_multi(model, TOKENS, LENGTHS, steps=30, generator=gen)
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    assert ((r.max_jsd >= 0) & (r.max_jsd <= JSD_MAX + 1e-6)).all()
    assert (r.tvd <= 0.05 + 1e-6).all()
    assert torch.allclose(r.weights.sum(-1), torch.ones(2), atol=1e-5)
    assert (r.weights[1, 3:] == 0).all()
    assert torch.allclose(jsd(r.weights, w), r.max_jsd, atol=1e-5)
    assert torch.allclose(r.tvd, _output_change(model, r.weights), atol=1e-6)
    # measured 0.37 / 0.31 here, >= 0.30 for the models of seeds 0-3 x generator seeds 0-3;
    # the model's own weights (always a candidate) are at 0
    assert (r.max_jsd > 0.2).all(), r.max_jsd


def _output_change(model, weights: torch.Tensor) -> torch.Tensor:
    """TVD between the model's output with ``weights`` and with its own weights."""
    _, probs = attention_weights(model, TOKENS, LENGTHS)
    with torch.no_grad():
        p = model.classify_with_weights(model.encode(TOKENS, MASK), weights).softmax(-1)
    return 0.5 * (p - probs).abs().sum(-1)


def _screened_start(model, noise: float, seed: int, select_epsilon: float = 0.05, k: int = 5):
    """The search after 0 steps, by hand: ``k`` candidates softmax(log(1/L) + noise * N(0,
    1)) over the real tokens (the noise drawn as [B, k, n] from a generator seeded
    ``seed``) and the model's own weights; per instance the largest JSD among those whose
    output moves by at most ``select_epsilon``. Returns that JSD [B], its weights [B, n]
    and the number of candidates farther than it that the output change ruled out."""
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    draw = torch.randn((2, k, 5), generator=torch.Generator().manual_seed(seed))
    logits = (1.0 / LENGTHS.float()).log()[:, None, None] + noise * draw
    cand = logits.masked_fill(~MASK[:, None], float("-inf")).softmax(-1)
    cand = cand.masked_fill(~MASK[:, None], 0.0)
    best_jsd, best_w, ruled_out = [0.0, 0.0], [w[0], w[1]], []
    for j in range(k):
        change = _output_change(model, cand[:, j])
        for b in range(2):
            d = float(jsd(cand[b, j], w[b]))
            if float(change[b]) > select_epsilon:
                ruled_out.append((b, d))
            elif d > best_jsd[b]:
                best_jsd[b], best_w[b] = d, cand[b, j]
    farther = sum(d > best_jsd[b] for b, d in ruled_out)
    return torch.tensor(best_jsd), torch.stack(best_w), farther


def test_the_model_weights_win_when_no_candidate_keeps_the_output():
    model = _model(2)
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    r = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=2, select_epsilon=1e-12, generator=torch.Generator()
    )
    assert (r.max_jsd == 0).all() and torch.equal(r.weights, w)


def test_more_search_finds_farther_weights_on_average():
    """J&W's search is an optimisation: 60 steps find weights at least as far as 0; 0 steps
    screen the noisy start; from a start near uniform the steps are what move the weights."""
    model = _model(2)
    far = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=60, generator=torch.Generator().manual_seed(1)
    )
    none = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=0, generator=torch.Generator().manual_seed(1)
    )
    assert far.max_jsd.mean() >= none.max_jsd.mean() - 1e-6
    expected, weights, _ = _screened_start(model, noise=3.0, seed=1)
    assert torch.allclose(none.max_jsd, expected, atol=1e-6)
    assert torch.allclose(none.weights, weights, atol=1e-6)
    # a tight screen rules out the farthest candidates (so the screen is tested too)
    strict = adversarial_attention_multi(
        model,
        TOKENS,
        LENGTHS,
        steps=0,
        select_epsilon=0.01,
        generator=torch.Generator().manual_seed(1),
    )
    expected, weights, farther = _screened_start(model, noise=3.0, seed=1, select_epsilon=0.01)
    assert farther > 0
    assert torch.allclose(strict.max_jsd, expected, atol=1e-6)
    assert torch.allclose(strict.weights, weights, atol=1e-6)
    # noise 0.5: the start is at JSD 0.02-0.06, 0.026 / 0.039 here; 200 steps reach 0.36 /
    # 0.26 here. Over 16 (model seed, generator seed) pairs the gain was >= 0.033 per
    # instance and >= 0.11 on the mean (0.29 here)
    start = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=0, noise=0.5, generator=torch.Generator().manual_seed(1)
    )
    moved = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=200, noise=0.5, generator=torch.Generator().manual_seed(1)
    )
    assert (moved.max_jsd > start.max_jsd + 0.02).all(), (start.max_jsd, moved.max_jsd)
    assert moved.max_jsd.mean() > start.max_jsd.mean() + 0.1, (start.max_jsd, moved.max_jsd)
    assert (moved.tvd <= 0.05 + 1e-6).all()


# ----------------------------------------------------------------------------- W&P


@pytest.fixture(scope="module")
def splits():
    train = as_batches(*make_signal_data(96, seed=31), batch_size=32)
    dev = as_batches(*make_signal_data(64, seed=32), batch_size=32)
    test = as_batches(*make_signal_data(64, seed=33), batch_size=32)
    return train, dev, test


WP = dict(hidden=16, activation="tanh", freeze_embeddings=False, attention_dim=8, amsgrad=True)


def test_wp_mlp_is_tanh_with_fine_tuned_embeddings():
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    mlp = FrozenWeightMLP(emb, 2, 16, learned=True, activation="tanh", freeze_embeddings=False)
    assert mlp.embedding.weight.requires_grad and mlp.activation is torch.tanh
    assert not FrozenWeightMLP(emb, 2).embedding.weight.requires_grad
    with pytest.raises(ValueError, match="activation must be 'relu' or 'tanh'"):
        FrozenWeightMLP(emb, 2, activation="gelu")


def test_fine_tuning_leaves_the_callers_embeddings_alone(splits):
    """The MLP fine-tunes a copy: the tensor it was given (in explain_run, the trained
    model's own embedding weights) is unchanged, so a second diagnostic starts alike."""
    train, _, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    before = emb.clone()
    first = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=2, lr=0.01, **WP)
    assert torch.equal(emb, before)
    second = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=2, lr=0.01, **WP)
    assert first == second


def test_the_kept_epoch_is_the_best_dev_epoch(splits):
    """With ``dev`` the epoch with the best dev ROC-AUC is kept: training that many epochs
    without ``dev`` gives the same test result (training is seeded)."""
    train, dev, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    picked = frozen_weight_diagnostic(
        emb, 2, train, test, "learned", epochs=4, lr=0.01, dev=dev, **WP
    )
    assert 1 <= picked["epoch"] <= 4
    again = frozen_weight_diagnostic(
        emb, 2, train, test, "learned", epochs=picked["epoch"], lr=0.01, **WP
    )
    assert again["epoch"] == picked["epoch"]
    assert again["accuracy"] == picked["accuracy"] and again["f1"] == picked["f1"]
    assert 0 <= picked["f1_positive"] <= 1


def test_adversarial_model_from_scratch_with_kl_and_patience(signal_model, splits):
    train, _, test = splits
    torch.manual_seed(5)
    fresh = SentenceClassifier(30, 2, embed_dim=16, encoder="bilstm", hidden_size=16)
    seen: list[tuple[int, float]] = []
    r = adversarial_model(
        signal_model,
        train,
        test,
        lam=1.0,
        epochs=30,
        lr=0.01,
        fresh=fresh,
        divergence="kl",
        patience=2,
        amsgrad=True,
        on_epoch=lambda epoch, loss: seen.append((epoch, loss)),
    )
    assert r.model is fresh
    # on_epoch saw every epoch run, with the summed training loss the best epoch is kept by
    assert [e for e, _ in seen] == list(range(1, r.epochs_run + 1))
    assert min(seen, key=lambda x: x[1])[0] == r.kept_epoch
    assert 1 <= r.kept_epoch <= r.epochs_run <= 30
    if r.epochs_run < 30:  # stopped early: 2 epochs without a lower loss after the best
        assert r.epochs_run == r.kept_epoch + 2
    assert 0 <= r.mean_jsd <= JSD_MAX and 0 <= r.mean_tvd <= 1
    js, tv, correct = _moved_by_hand(signal_model, r.model, test)
    assert r.mean_jsd == pytest.approx(js, abs=1e-6)
    assert r.mean_tvd == pytest.approx(tv, abs=1e-6)
    assert r.accuracy == pytest.approx(correct)
    with pytest.raises(ValueError, match="divergence must be 'jsd' or 'kl'"):
        adversarial_model(signal_model, train[:1], test[:1], 1.0, divergence="js")


def _moved_by_hand(base, adv, batches) -> tuple[float, float, float]:
    """Mean JSD of the attention and mean TVD of the outputs of ``adv`` against ``base``
    over the instances of ``batches``, written out, and ``adv``'s accuracy."""

    def kl(p, q):  # sum p log(p / q), 0 log 0 = 0
        return torch.where(p > 0, p * (p / q).log(), torch.zeros_like(p)).sum(-1)

    js, tv, hits = [], [], []
    with torch.no_grad():
        for tokens, lengths, labels in batches:
            out0, out = base(tokens, lengths=lengths), adv(tokens, lengths=lengths)
            w0, w = out0.weights, out.weights
            p0, p = out0.logits.softmax(-1), out.logits.softmax(-1)
            mid = (w + w0) / 2
            js += (kl(w, mid) / 2 + kl(w0, mid) / 2).tolist()
            tv += ((p - p0).abs().sum(-1) / 2).tolist()
            hits += (p.argmax(-1) == labels).tolist()
    return sum(js) / len(js), sum(tv) / len(tv), sum(hits) / len(hits)


@pytest.mark.parametrize("seeds", [(1, 2, 3), (1, 2)])
def test_seed_variance_per_instance_median(signal_model, splits, seeds):
    """Per instance, the median JSD over the other seeds (of two: their mean, as
    np.median)."""
    _, _, test = splits
    others = [_signal_like(s) for s in seeds]
    sv = seed_variance([signal_model, *others], test)
    per_model = []
    for other in others:
        values = []
        for tokens, lengths, _ in test:
            w0, _ = attention_weights(signal_model, tokens, lengths)
            w, _ = attention_weights(other, tokens, lengths)
            values += jsd(w, w0).tolist()
        per_model.append(values)
    expected = torch.tensor(np.median(np.asarray(per_model), axis=0), dtype=torch.float32)
    assert torch.allclose(torch.tensor(sv["instance_median_jsd"]), expected)
    assert sv["mean_instance_median_jsd"] == pytest.approx(float(expected.mean()))


def _signal_like(seed: int) -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(30, 2, embed_dim=16, encoder="bilstm", hidden_size=16).eval()


# ----------------------------------------------------------------------------- W&P's training


def test_training_batches_may_be_drawn_every_epoch(signal_model, splits):
    """``train`` as a function of the epoch is called for epochs 1, 2, ...; giving the same
    batches every epoch trains exactly as the list (the weights are recomputed alike)."""
    train, _, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    asked: list[int] = []

    def every_epoch(epoch: int):
        asked.append(epoch)
        return train

    fixed = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=3, lr=0.01, **WP)
    drawn = frozen_weight_diagnostic(emb, 2, every_epoch, test, "learned", epochs=3, lr=0.01, **WP)
    assert drawn == fixed and asked == [1, 2, 3]
    asked.clear()
    a = adversarial_model(signal_model, train, test, 1.0, epochs=2, lr=0.01)
    b = adversarial_model(signal_model, every_epoch, test, 1.0, epochs=2, lr=0.01)
    assert asked == [1, 2]
    assert (a.mean_jsd, a.mean_tvd) == (b.mean_jsd, b.mean_tvd)
    # other batches every epoch (each epoch one half of the data): another training
    halves = adversarial_model(
        signal_model, lambda e: train[e % 2 :: 2], test, 1.0, epochs=2, lr=0.01
    )
    assert (halves.mean_jsd, halves.mean_tvd) != (a.mean_jsd, a.mean_tvd)


class _OneLogit(torch.nn.Module):
    """``[0, z]``: one logit given as two (as the sentiment task's sigmoid output)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.linear(x)
        return torch.cat([torch.zeros_like(z), z], -1)


def test_the_mlp_takes_the_given_output_layer_and_loss(splits):
    """The output layer is built by ``output(hidden)``, the loss is the one given: the
    logits it sees are ``[0, z]``; with the cross-entropy negated the MLP learns nothing
    of use (with the default it learns)."""
    train, _, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    built: list[int] = []
    seen: list[torch.Tensor] = []

    def output(features: int) -> torch.nn.Module:
        built.append(features)
        return _OneLogit(features)

    def wrong(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seen.append(logits.detach())
        return -torch.nn.functional.cross_entropy(logits, labels, reduction="sum")

    kw = dict(epochs=8, lr=0.01, **WP)
    right = frozen_weight_diagnostic(emb, 2, train, test, "learned", output=output, **kw)
    assert built == [16] and not seen
    bad = frozen_weight_diagnostic(emb, 2, train, test, "learned", output=output, loss=wrong, **kw)
    # measured over embedding seeds 0-2 x training seeds 0-1: right 0.64-0.94 (0.78 here),
    # wrong 0.48-0.50 (one class for every sentence)
    assert bad["accuracy"] <= 0.55 and right["accuracy"] >= bad["accuracy"] + 0.1, (right, bad)
    assert len(seen) == 8 * len(train)
    assert all(s.shape[1] == 2 and not s[:, 0].any() for s in seen)


def test_the_attention_has_no_weight_decay():
    """Wiegreffe & Pinter's optimisers: weight decay on every parameter but the
    attention's, for the MLP (its own attention) and for a model (its ``attention``)."""
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    for module, attention in (
        (mlp := FrozenWeightMLP(emb, 2, 16, learned=True), mlp.attn),
        (model := _model(2), model.attention),
    ):
        opt = _optimizer(module, 1e-3, True, 1e-5)
        decay = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
        assert decay[0.0] == {id(p) for p in attention.parameters()} and decay[0.0]
        trainable = {id(p) for p in module.parameters() if p.requires_grad}
        assert decay[1e-5] == trainable - decay[0.0]
        assert opt.defaults["amsgrad"] is True
    plain = _optimizer(FrozenWeightMLP(emb, 2), 1e-3, False, 0.0)  # no attention: one group
    assert [g["weight_decay"] for g in plain.param_groups] == [0.0]


def test_the_adversarys_loss_is_weighted_per_instance(signal_model, splits):
    """``instance_weights(labels)`` multiplies each instance's loss: all zero, the fresh
    model does not move (Adam without a gradient); all one, it does."""
    train, _, test = splits
    labels_seen: list[torch.Tensor] = []

    def zero(labels: torch.Tensor) -> torch.Tensor:
        labels_seen.append(labels)
        return torch.zeros(labels.shape)

    for weights, moves in ((zero, False), (lambda y: torch.ones(y.shape), True)):
        torch.manual_seed(5)
        fresh = SentenceClassifier(30, 2, embed_dim=16, encoder="bilstm", hidden_size=16)
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        losses: list[float] = []
        adversarial_model(
            signal_model,
            train,
            test,
            lam=1.0,
            epochs=2,
            lr=0.01,
            fresh=fresh,
            divergence="kl",
            instance_weights=weights,
            on_epoch=lambda _epoch, loss, losses=losses: losses.append(loss),
        )
        after = fresh.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before) is moves
        assert (losses == [0.0, 0.0]) is not moves
    assert [y.tolist() for y in labels_seen] == [b[2].tolist() for b in train] * 2
