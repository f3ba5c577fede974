"""Attention correctness: mass in a region, Spearman rank correlation, region pooling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.evaluation.correctness import attention_mass, rank_correlation, region_to_grid


def test_attention_mass_by_hand() -> None:
    w = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0]])
    region = torch.tensor([False, True, True])
    assert attention_mass(w, region).tolist() == pytest.approx([0.9, 0.5])
    frac = torch.tensor([0.0, 0.5, 1.0])
    assert attention_mass(w, frac).tolist() == pytest.approx([0.8, 0.25])
    with pytest.raises(ValueError, match="fractions"):
        attention_mass(w, torch.tensor([0.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="broadcast"):
        attention_mass(w, torch.tensor([True, False]))
    # weights that are no attention (a negative weight, NaN, inf) measure nothing: refused
    # as by the other measures (the mass of [1.5, -0.5] on the first cell was 1.5)
    for bad in ([[1.5, -0.5, 0.0]], [[math.nan, 0.5, 0.5]], [[math.inf, 0.0, 0.0]]):
        with pytest.raises(ValueError, match=r"^weights must be finite and non-negative$"):
            attention_mass(torch.tensor(bad), region)
    assert attention_mass(torch.zeros(0, 3), region).shape == (0,)


def test_rank_correlation_by_hand() -> None:
    # one swapped pair among 4: rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert rank_correlation([0.1, 0.2, 0.3, 0.4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert rank_correlation(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), [4, 3, 2, 1]) == (
        pytest.approx(-1.0)
    )
    # ties take the mean rank: a ranks (1.5, 1.5, 3), b ranks (1, 2, 3)
    a_r, b_r = np.array([1.5, 1.5, 3.0]), np.array([1.0, 2.0, 3.0])
    expected = np.corrcoef(a_r, b_r)[0, 1]
    assert rank_correlation([0.2, 0.2, 0.6], [1, 2, 3]) == pytest.approx(expected)
    assert math.isnan(rank_correlation([0.5, 0.5], [1, 2]))
    with pytest.raises(ValueError, match="must match"):
        rank_correlation([1, 2, 3], [1, 2])


def test_region_to_grid_by_hand() -> None:
    mask = np.zeros((4, 4), dtype=bool)
    mask[0, 0] = mask[0, 1] = mask[1, 1] = True  # 3 of the 4 pixels of the top-left cell
    mask[3, 3] = True  # 1 of 4 of the bottom-right cell
    assert region_to_grid(mask, (2, 2)).tolist() == [[0.75, 0.0], [0.0, 0.25]]
    with pytest.raises(ValueError, match="evenly"):
        region_to_grid(mask, (3, 3))
