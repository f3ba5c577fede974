"""Monotonicity and diagonality of alignments, by hand, against the uniform baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.evaluation.monotonicity import (
    alignment_shape,
    centroid_correlation,
    diagonal_mass,
    forward_fraction,
)


def test_diagonal_alignment_scores_one_and_uniform_the_floor() -> None:
    eye = np.eye(5)
    assert forward_fraction(eye) == 1.0
    assert diagonal_mass(eye, band=0.0) == 1.0
    assert centroid_correlation(torch.eye(5)) == pytest.approx(1.0)
    uniform = np.full((4, 11), 1 / 11)
    assert forward_fraction(uniform) == 0.0
    assert centroid_correlation(uniform) == 0.0
    # inputs at s' = 0, 0.1, ..., 1, rows at t' = 0, 1/3, 2/3, 1: within 0.1 of each row
    # lie 2 inputs ({0, 0.1}, {0.3, 0.4}, {0.6, 0.7}, {0.9, 1}), each of weight 1/11
    assert diagonal_mass(uniform, band=0.1) == pytest.approx(2 / 11)


def test_by_hand_on_a_small_alignment() -> None:
    # 3 steps over 3 inputs; centroids (in [0, 1]): 0.25, 0.25, 1.0
    a = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    assert forward_fraction(a) == pytest.approx(0.5)  # the 2nd step stays, the 3rd moves
    # diagonal at t' = 0, 0.5, 1 with band 0: masses 0.5, 0.5 (input 1 at 0.5), 1.0
    assert diagonal_mass(a, band=0.0) == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    expected = np.corrcoef([0, 1, 2], [0.25, 0.25, 1.0])[0, 1]
    assert centroid_correlation(a) == pytest.approx(expected)
    backwards = a[::-1]
    assert forward_fraction(backwards) == 0.0 and centroid_correlation(backwards) < 0


def test_average_over_matrices_of_different_sizes() -> None:
    out = alignment_shape([np.eye(3), np.full((2, 4), 0.25), np.ones((1, 4)) / 4])
    assert out["forward_fraction"] == pytest.approx(0.5)  # 1, 0 (the 1-step one is NaN)
    assert out["centroid_correlation"] == pytest.approx(0.5)
    assert math.isnan(forward_fraction(np.ones((1, 3)) / 3))


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"\[T, S\]"):
        diagonal_mass(np.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        forward_fraction(-np.eye(2))
    with pytest.raises(ValueError, match="band"):
        diagonal_mass(np.eye(2), band=2)
    with pytest.raises(ValueError, match="no attention"):
        alignment_shape([])
