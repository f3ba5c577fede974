"""Supervised attention: divergences against hand values, links -> weights, masks, gradients,
and that supervision moves a real attention module onto the gold keys."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import Attention
from attnlab.evaluation.supervision import (
    SupervisedAttentionLoss,
    attention_supervision_loss,
    links_to_weights,
)

A = torch.tensor([[0.5, 0.25, 0.25]])
G = torch.tensor([[1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("divergence", "expected"),
    [
        ("ce", -math.log(0.5)),
        ("kl", -math.log(0.5)),  # g log g = 0 for a one-hot gold
        ("mse", 0.25 + 0.0625 + 0.0625),
        ("mass", -math.log(0.5)),
    ],
)
def test_divergences_by_hand(divergence: str, expected: float) -> None:
    loss = attention_supervision_loss(A, G, divergence=divergence)
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_kl_is_zero_at_the_gold_and_ce_is_its_entropy() -> None:
    g = torch.tensor([[0.5, 0.5, 0.0]])
    assert attention_supervision_loss(g, g, divergence="kl").item() == pytest.approx(0.0, abs=1e-6)
    assert attention_supervision_loss(g, g, divergence="ce").item() == pytest.approx(math.log(2))


def test_links_to_weights_by_hand() -> None:
    w = links_to_weights([{(0, 0), (2, 0), (1, 1)}, set()], n_target=2, n_source=3)
    assert w.tolist() == [[[0.5, 0.0, 0.5], [0.0, 1.0, 0.0]], [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]]
    with pytest.raises(ValueError, match="outside"):
        links_to_weights([{(3, 0)}], n_target=2, n_source=3)


def test_unsupervised_and_masked_rows_are_skipped() -> None:
    att = torch.tensor([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]])
    gold = torch.tensor([[[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]]])
    # rows 0 and 2 are supervised: (-log .5 - log .8) / 2
    expected = (-math.log(0.5) - math.log(0.8)) / 2
    assert attention_supervision_loss(att, gold).item() == pytest.approx(expected, rel=1e-6)
    mask = torch.tensor([[True, True, False]])
    assert attention_supervision_loss(att, gold, mask=mask).item() == pytest.approx(-math.log(0.5))
    # nothing supervised -> 0 with a gradient path
    att.requires_grad_(True)
    zero = attention_supervision_loss(att, torch.zeros_like(gold))
    zero.backward()
    assert zero.item() == 0.0 and torch.all(att.grad == 0)


def test_region_kind() -> None:
    att = torch.tensor([[0.2, 0.3, 0.5]])
    region = torch.tensor([[False, True, True]])
    mass = attention_supervision_loss(att, region, kind="region", divergence="mass")
    assert mass.item() == pytest.approx(-math.log(0.8))
    ce = attention_supervision_loss(att, region, kind="region", divergence="ce")
    assert ce.item() == pytest.approx(-(0.5 * math.log(0.3) + 0.5 * math.log(0.5)))
    # a [B, n_k] region broadcasts over the queries of 3-D attention
    att3 = att[:, None, :].expand(1, 2, 3)
    assert attention_supervision_loss(att3, region, kind="region", divergence="mass").item() == (
        pytest.approx(-math.log(0.8))
    )


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="divergence"):
        attention_supervision_loss(A, G, divergence="js")
    with pytest.raises(ValueError, match="kind"):
        attention_supervision_loss(A, G, kind="boxes")
    with pytest.raises(ValueError, match="expected the attention's shape"):
        attention_supervision_loss(A, torch.ones(1, 4))
    with pytest.raises(ValueError, match="weight"):
        SupervisedAttentionLoss(-1.0)


@pytest.mark.parametrize("divergence", ["ce", "kl", "mse", "mass"])
def test_gradcheck(divergence: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    gold = torch.softmax(torch.randn(2, 3, 4, dtype=torch.float64), -1)
    gold[0, 1] = 0.0  # an unsupervised row

    def f(x: torch.Tensor) -> torch.Tensor:
        return attention_supervision_loss(torch.softmax(x, -1), gold, divergence=divergence)

    assert torch.autograd.gradcheck(f, (logits,))


def test_joint_loss_adds_lambda_times_divergence() -> None:
    task = torch.tensor(2.0)
    joint = SupervisedAttentionLoss(0.5, divergence="ce")
    assert joint(task, A, G).item() == pytest.approx(2.0 + 0.5 * -math.log(0.5))
    assert SupervisedAttentionLoss(0.0)(task, A, G) is task


def test_supervision_moves_attention_onto_gold_keys() -> None:
    """An additive attention trained only by the supervision loss puts its mass on the gold
    key (1 of 8); the untrained module's mass there is about 1/8."""
    torch.manual_seed(0)
    att = Attention("additive", "soft", d_q=6, d_k=6, d_w=8)
    q, k = torch.randn(64, 1, 6), torch.randn(64, 8, 6)
    target = k[:, :, 0].argmax(-1)  # the key with the largest first feature
    gold = torch.nn.functional.one_hot(target, 8).float()[:, None, :]

    def mass() -> float:
        with torch.no_grad():
            w = att(q, k, need_weights=True).weights
        return float((w * gold).sum(-1).mean())

    before = mass()
    opt = torch.optim.Adam(att.parameters(), lr=0.03)
    loss_fn = SupervisedAttentionLoss(1.0, kind="weights", divergence="ce")
    for _ in range(150):
        w = att(q, k, need_weights=True).weights
        loss = loss_fn(torch.zeros(()), w, gold)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = mass()
    assert before < 0.3, before
    assert after > 0.8, after


def test_links_to_weights_checks_its_sizes_and_links():
    for n in ("2", 0, 2.0, True):
        with pytest.raises(ValueError, match=r"^n_target must be an int >= 1"):
            links_to_weights([[(0, 0)]], n, 2)
    with pytest.raises(TypeError, match=r"^links\[1\] must be \(source, target\) links"):
        links_to_weights([[(0, 0)], "0-0"], 2, 2)


def test_negative_or_nan_gold_weights_are_refused():
    """A negated gold gave a zero loss (every gold cell <= 0 counted as outside the row)."""
    attention = torch.softmax(torch.randn(2, 3), -1)
    for gold in (-attention, torch.full((2, 3), math.nan)):
        with pytest.raises(ValueError, match=r"^gold must be finite and non-negative$"):
            attention_supervision_loss(attention, gold)


def test_an_attention_that_is_not_a_tensor_is_a_type_error():
    with pytest.raises(TypeError, match=r"^attention must be a torch\.Tensor, got list$"):
        attention_supervision_loss([[0.5, 0.5]], torch.tensor([[1.0, 0.0]]))
