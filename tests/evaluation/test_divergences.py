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
