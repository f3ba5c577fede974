"""TVD, KL and JSD against hand values, and their bounds."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.evaluation.divergences import JSD_MAX, jsd, kl, tvd


def test_by_hand() -> None:
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert tvd(p, q).item() == pytest.approx(0.5)
    assert kl(p, q).item() == pytest.approx(math.log(2))  # 2 * 0.5 log(0.5 / 0.25)
    # m = (0.375, 0.375, 0.25)
    expected = 0.5 * (2 * 0.5 * math.log(0.5 / 0.375)) + 0.5 * (
        2 * 0.25 * math.log(0.25 / 0.375) + 0.5 * math.log(0.5 / 0.25)
    )
    assert jsd(p, q).item() == pytest.approx(expected)


def test_extremes() -> None:
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert tvd(a, b).item() == pytest.approx(1.0)
    assert jsd(a, b).item() == pytest.approx(JSD_MAX)
    assert jsd(a, a).item() == pytest.approx(0.0, abs=1e-7)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=6), st.integers(0, 1000))
def test_bounds_and_symmetry(values: list[float], seed: int) -> None:
    p = torch.tensor(values, dtype=torch.float64)
    p = p / p.sum()
    q = torch.softmax(
        torch.randn(
            len(values), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        ),
        0,
    )
    assert 0.0 <= tvd(p, q).item() <= 1.0 + 1e-12
    assert 0.0 <= jsd(p, q).item() <= JSD_MAX + 1e-12
    assert jsd(p, q).item() == pytest.approx(jsd(q, p).item())
    assert kl(p, q).item() >= -1e-12


def test_arrays_lists_and_ints_are_distributions_too_and_the_rest_broadcasts() -> None:
    assert jsd([1, 0], [0, 1]).item() == pytest.approx(JSD_MAX)  # ints, lists
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    assert tvd(p.numpy(), [0.0, 1.0]).tolist() == pytest.approx([0.5, 1.0])
    pairwise = jsd(p[:, None, :], p[None, :, :])  # [2, 2]: every pair, as the studies do
    assert pairwise.shape == (2, 2) and pairwise[0, 0].item() == pytest.approx(0.0, abs=1e-7)
    assert kl(torch.tensor([0.5, 0.5], dtype=torch.float64), [0.5, 0.5]).dtype == torch.float64


@pytest.mark.parametrize("measure", [jsd, kl, tvd])
def test_what_is_no_distribution_is_refused_in_one_line(measure) -> None:
    """A negative weight gave a JSD (0.025 for [1.5, -0.5] against [1, 0]), NaN a NaN,
    mismatched supports a RuntimeError from the arithmetic and a list a TypeError from
    Python's list product."""
    q = torch.tensor([1.0, 0.0])
    for bad in ([1.5, -0.5], [math.nan, 1.0], [math.inf, 0.0]):
        with pytest.raises(ValueError, match=r"^p must be finite and non-negative"):
            measure(torch.tensor(bad), q)
        with pytest.raises(ValueError, match=r"^q must be finite and non-negative"):
            measure(q, torch.tensor(bad))
    with pytest.raises(ValueError, match=r"^p of shape \(2, 3\) and q of shape \(2,\) are not"):
        measure(torch.ones(2, 3) / 3, q)
    with pytest.raises(ValueError, match="same last dimension"):
        measure(torch.ones(3, 2) / 2, torch.ones(2, 2) / 2)
    for bad in (torch.tensor([True, False]), torch.tensor(1.0), "ab", None):
        with pytest.raises(TypeError, match=r"^p must "):
            measure(bad, q)
