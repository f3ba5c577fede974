"""Hand-made easy-VQA data for the attention-correctness tests (tests/evaluation/
test_vqa_correctness.py, tests/lab/studies/test_vqa_correctness_run.py): two 64x64 images
whose shapes cover known cells of the 8x8 grid, their cell fractions, two region-weight
maps, and Spearman's rho by a naive loop. A module with a unique name so the tests import
it safely (``conftest`` names clash across test folders)."""

from __future__ import annotations

import math

import numpy as np

R = 64


def image_a() -> np.ndarray:
    """White, with a red shape covering cells (1,1) and (1,2) fully and half of (2,1)."""
    img = np.full((64, 64, 3), 255, dtype=np.uint8)
    img[8:16, 8:24] = (200, 0, 0)
    img[16:20, 8:16] = (200, 0, 0)
    return img


def image_b() -> np.ndarray:
    """Light grey, with a blue square covering cells (4,4), (4,5), (5,4), (5,5)."""
    img = np.full((64, 64, 3), 240, dtype=np.uint8)
    img[32:48, 32:48] = (0, 0, 180)
    return img


#: the hand-computed cell fractions of image_a and image_b (row-major cells 8 * row + col)
FRAC_A = np.zeros(R)
FRAC_A[9] = FRAC_A[10] = 1.0
FRAC_A[17] = 0.5
FRAC_B = np.zeros(R)
FRAC_B[[36, 37, 44, 45]] = 1.0

#: the stub model's region weights for question 1 (about image a) and 2 (about image b)
W1 = np.zeros(R)
W1[9], W1[17], W1[0] = 0.5, 0.25, 0.25
W2 = np.zeros(R)
W2[63] = 1.0


def naive_ranks(x: list[float]) -> list[float]:
    """1-based ranks, ties given the mean of the ranks they span."""
    ranks = [0.0] * len(x)
    for i, xi in enumerate(x):
        below = sum(1 for xj in x if xj < xi)
        equal = sum(1 for xj in x if xj == xi)
        ranks[i] = below + (equal + 1) / 2
    return ranks


def naive_spearman(a, b) -> float:
    ra, rb = naive_ranks(list(a)), naive_ranks(list(b))
    n = len(ra)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((ra[i] - ma) * (rb[i] - mb) for i in range(n))
    va = sum((ra[i] - ma) ** 2 for i in range(n))
    vb = sum((rb[i] - mb) ** 2 for i in range(n))
    return cov / math.sqrt(va * vb)
