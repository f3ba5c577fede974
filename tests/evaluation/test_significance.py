"""Paired comparisons over seeds against hand-computed t, p and effect sizes."""

from __future__ import annotations

import math

import pytest

from attnlab.evaluation.significance import compare_to_baseline, paired_comparison


def test_paired_t_test_and_effect_size_by_hand() -> None:
    c = paired_comparison([0.8, 0.9, 0.85], [0.7, 0.8, 0.8])
    # d = (0.1, 0.1, 0.05): mean 1/12, sd = sqrt(((1/60)^2 * 2 + (1/30)^2) / 2) = 1/(20 sqrt 3)
    sd = 1 / (20 * math.sqrt(3))
    assert c.diff == pytest.approx(1 / 12)
    assert c.effect_size == pytest.approx((1 / 12) / sd)
    # t = mean / (sd / sqrt 3) = 5 with 2 degrees of freedom; for df = 2 the two-sided p is
    # 1 - t / sqrt(2 + t^2)
    assert c.t_p == pytest.approx(1 - 5 / math.sqrt(27), rel=1e-6)
    # every difference positive: only the all-plus and all-minus flips reach |mean|: 2 / 8
    assert c.perm_p == pytest.approx(0.25)
    assert c.min_perm_p == pytest.approx(0.25)
    assert (c.n, c.mean_a, c.mean_b) == (3, pytest.approx(0.85), pytest.approx(23 / 30))


def test_permutation_p_with_mixed_signs() -> None:
    # d = (1, -1, 2, 2): |mean| = 1; enumerate the 16 flips by hand-countable rule
    d = [1.0, -1.0, 2.0, 2.0]
    import itertools

    count = sum(
        abs(sum(s * x for s, x in zip(signs, d, strict=True)) / 4) >= 1 - 1e-12
        for signs in itertools.product((1, -1), repeat=4)
    )
    c = paired_comparison(d, [0.0] * 4)
    assert c.perm_p == pytest.approx(count / 16)


def test_degenerate_cases() -> None:
    same = paired_comparison([0.5, 0.5], [0.5, 0.5])
    assert math.isnan(same.effect_size) and math.isnan(same.t_p) and same.perm_p == 1.0
    const = paired_comparison([0.6, 0.7], [0.5, 0.6])
    assert const.effect_size == math.inf and const.t_p == 0.0
    one = paired_comparison([0.6], [0.5])
    assert math.isnan(one.effect_size) and one.perm_p == 1.0
    with pytest.raises(ValueError, match="one length"):
        paired_comparison([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="no paired"):
        paired_comparison([], [])


def test_rounding_of_the_scores_is_not_a_difference() -> None:
    """Equal differences that float arithmetic makes unequal (0.3 - 0.2 != 1.2 - 1.1) are
    one constant difference: d_z = inf and t_p = 0, not d_z ~ 1e15 from a rounding-sized
    sd; and the permutation p-value does not depend on the scale of the scores."""
    for a, b in (([0.3, 0.6, 0.9, 1.2], [0.2, 0.5, 0.8, 1.1]),
                 ([0.71, 0.72, 0.73], [0.70, 0.71, 0.72])):  # fmt: skip
        c = paired_comparison(a, b)
        assert c.effect_size == math.inf and c.t_p == 0.0, c
    zero = paired_comparison([0.3, 0.7], [0.1 + 0.2, 0.3 + 0.4])  # 0.30000000000000004
    assert math.isnan(zero.effect_size) and math.isnan(zero.t_p) and zero.perm_p == 1.0
    # differences that cancel up to rounding (0.1 - 0.8 and 0.2 - (0.2 + 0.7)): a tie,
    # mean difference 0 and d_z 0 (not -5.6e-17 and -5.6e-17)
    tie = paired_comparison([0.1, 0.2], [0.8, 0.2 + (0.1 - 0.8)])
    assert tie.diff == 0.0 and tie.effect_size == 0.0, tie
    for scale in (1.0, 1e-12, 1e9):
        c = paired_comparison([scale * v for v in (1.0, 2.0, 3.0)], [0.0] * 3)
        assert c.perm_p == pytest.approx(0.25), scale  # the all-plus and all-minus flips
        c = paired_comparison([scale * v for v in (1.0, -1.0, 2.0, 2.0)], [0.0] * 4)
        assert c.perm_p == pytest.approx(paired_comparison([1.0, -1.0, 2.0, 2.0], [0.0] * 4).perm_p)


def test_compare_to_baseline_pairs_by_seed() -> None:
    scores = {
        "mean": {0: 0.70, 1: 0.72, 2: 0.71},
        "tanh": {0: 0.75, 1: 0.78, 2: 0.74},
        "dot": {1: 0.73, 2: 0.69, 3: 0.9},  # seed 3 has no baseline partner
    }
    out = compare_to_baseline(scores, "mean")
    assert set(out) == {"tanh", "dot"}
    assert out["dot"].n == 2
    assert out["dot"].diff == pytest.approx(((0.73 - 0.72) + (0.69 - 0.71)) / 2)
    assert out["tanh"].diff == pytest.approx((0.05 + 0.06 + 0.03) / 3)
    with pytest.raises(KeyError, match="baseline"):
        compare_to_baseline(scores, "uniform")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_score_that_is_not_finite_is_refused(bad):
    """NaN made every sign flip compare False: perm_p = 0, "significant" out of nothing."""
    with pytest.raises(ValueError, match=r"^a and b must be finite scores"):
        paired_comparison([1.0, bad, 3.0], [2.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"^a and b must be finite scores"):
        paired_comparison([1.0, 2.0], [bad, 1.0])
