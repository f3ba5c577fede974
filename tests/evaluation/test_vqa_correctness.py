"""Attention correctness of VQA region weights (attnlab.evaluation.vqa_correctness): the
gold regions and the per-question scores on hand-made images (vqa_hand_data.py), masses
and Spearman's rho computed by hand / naive loops. The study on a run is tested in
tests/lab/studies/test_vqa_correctness_run.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from vqa_hand_data import FRAC_A, FRAC_B, W1, W2, R, image_a, image_b, naive_spearman

import attnlab.evaluation.vqa_correctness as vc


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):  # tests/conftest.py's fixture, for every test here
    yield


def test_region_fractions_hand_images() -> None:
    got = vc.region_fractions(np.stack([image_a(), image_b()]), (8, 8))
    assert got.shape == (2, R)
    np.testing.assert_allclose(got[0], FRAC_A)
    np.testing.assert_allclose(got[1], FRAC_B)
    with pytest.raises(ValueError, match="expected"):
        vc.region_fractions(np.zeros((2, 64, 64)), (8, 8))


def test_question_scores_by_hand() -> None:
    s = vc.question_scores(W1, FRAC_A)
    assert s["mass"] == pytest.approx(0.5 * 1 + 0.25 * 0.5)  # cell 0 is outside
    assert s["mass_touch"] == pytest.approx(0.75)
    assert s["pointing"] == 1.0  # the top cell (9) touches the shape
    assert s["spearman"] == pytest.approx(naive_spearman(W1, FRAC_A))
    s2 = vc.question_scores(W2, FRAC_B)
    assert (s2["mass"], s2["mass_touch"], s2["pointing"]) == (0.0, 0.0, 0.0)
    assert s2["spearman"] == pytest.approx(naive_spearman(W2, FRAC_B))
    assert s2["spearman"] < 0  # the one weighted cell is outside the shape


def test_question_scores_uniform_is_area_and_ties_share_pointing() -> None:
    u = np.full(R, 1 / R)
    s = vc.question_scores(u, FRAC_A)
    assert s["mass"] == pytest.approx(2.5 / 64)  # the area fraction of the region
    assert s["mass_touch"] == pytest.approx(3 / 64)
    assert s["pointing"] == pytest.approx(3 / 64)  # every cell ties: the touching share
    assert math.isnan(s["spearman"])  # a constant map has no ranking
    with pytest.raises(ValueError, match="equal 1-d maps"):
        vc.question_scores(u[:10], FRAC_A)
