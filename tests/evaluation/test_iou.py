"""IoU between a thresholded attention map and an object mask, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnlab.evaluation.iou import attention_iou, attention_region


def _mask() -> np.ndarray:
    m = np.zeros((4, 4), dtype=bool)
    m[:2, :2] = True  # exactly the top-left cell of a 2x2 grid
    return m


def test_relative_threshold_by_hand() -> None:
    m = _mask()
    assert attention_iou([0.7, 0.1, 0.1, 0.1], m, (2, 2)) == 1.0
    # two cells kept (0.4, 0.4 >= 0.5 * 0.4): 4 pixels of overlap, 8 in the union
    assert attention_iou(torch.tensor([0.4, 0.4, 0.1, 0.1]), m, (2, 2)) == 0.5
    # uniform attention keeps every cell: the IoU is the object's area fraction
    assert attention_iou([0.25] * 4, m, (2, 2)) == 0.25
    assert attention_iou([0.0, 1.0, 0.0, 0.0], m, (2, 2)) == 0.0


def test_mass_threshold_by_hand() -> None:
    w = np.array([0.3, 0.25, 0.25, 0.2])
    assert attention_region(w, (2, 2), "mass", 0.5).ravel().tolist() == [1, 1, 0, 0]
    assert attention_region(w, (2, 2), "mass", 0.3).ravel().tolist() == [1, 0, 0, 0]
    assert attention_region(w, (2, 2), "relative", 0.8).ravel().tolist() == [1, 1, 1, 0]
    assert attention_iou(w, _mask(), (2, 2), "mass", 0.3) == 1.0


def test_grid_cells_cover_pixel_blocks() -> None:
    # a 2x4 grid over a 4x8 mask: each cell is 2x2 pixels
    m = np.zeros((4, 8), dtype=bool)
    m[0:2, 2:4] = True
    w = np.zeros((2, 4))
    w[0, 1] = 1.0
    assert attention_iou(w, m, (2, 4)) == 1.0
    assert attention_iou(w.ravel(), m, (2, 4)) == 1.0


def test_empty_cases_and_errors() -> None:
    empty = np.zeros((4, 4), dtype=bool)
    assert math.isnan(attention_iou([0.0] * 4, empty, (2, 2)))
    assert attention_iou([1.0, 0, 0, 0], empty, (2, 2)) == 0.0
    with pytest.raises(ValueError, match="equal cells"):
        attention_iou([0.25] * 9, empty, (3, 3))
    with pytest.raises(ValueError, match="cells"):
        attention_iou([0.5, 0.5], empty, (2, 2))
    with pytest.raises(TypeError, match="bool"):
        attention_iou([0.25] * 4, empty.astype(int), (2, 2))
    with pytest.raises(ValueError, match="threshold"):
        attention_iou([0.25] * 4, empty, (2, 2), threshold="top")
    with pytest.raises(ValueError, match="non-negative"):
        attention_iou([-0.25, 0.5, 0.5, 0.25], empty, (2, 2))
