"""attnlab.lab.seed_stats: the one mean and sample standard deviation over seeds."""

from __future__ import annotations

import math

import pytest

from attnlab.lab.seed_stats import MeanStd, finite, fmt_mean_std, fmt_num, mean_std


def test_mean_std_by_hand():
    assert mean_std([]) == MeanStd(None, None, 0)
    assert mean_std([0.5]) == (0.5, None, 1)
    # 1, 2, 4: mean 7/3; squared deviations 16/9, 1/9, 25/9 -> sum 42/9, / (3 - 1) = 7/3
    mean, std, n = mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx((7 / 3) ** 0.5)
    assert n == 3
    assert mean_std([2, 2]) == (2.0, 0.0, 2)  # ints count; equal values: zero spread


def test_only_finite_numbers_count():
    values = [None, 2.0, math.nan, True, "3.0", math.inf, -math.inf, 4, None]
    assert finite(values) == [2.0, 4.0]
    mean, std, n = mean_std(values)
    assert (mean, n) == (3.0, 2)
    assert std == pytest.approx(2**0.5)  # (1 + 1) / (2 - 1)
    assert mean_std([None, math.nan]) == (None, None, 0)
    assert mean_std(iter([1.0, None, 3.0])).mean == 2.0  # any iterable, read once


def test_numpy_numbers_count_and_numpy_bools_do_not():
    """NumPy scalars are numbers (they were left out, so n counted one seed of three)."""
    import numpy as np

    values = [np.float32(0.5), np.float64(1.5), np.int64(4), np.bool_(True), np.float64("nan")]
    assert finite(values) == [0.5, 1.5, 4.0]
    assert mean_std(values).n == 3 and mean_std(values).mean == pytest.approx(2.0)


def test_values_near_the_largest_float():
    """Sums beyond the floats (an OverflowError before): the mean is computed on a scaled
    copy; an int too large for a float is no finite number."""
    big = 1.7e308
    assert mean_std([big, big]) == (big, 0.0, 2)
    mean, std, n = mean_std([big, big / 2, 0.0])
    assert (mean, n) == (pytest.approx(big / 2), 3) and std == pytest.approx(big / 2)
    assert mean_std([big, -big]) == (0.0, math.inf, 2)  # the spread itself is beyond
    assert finite([10**400, 1]) == [1.0] and mean_std([10**400, 1]) == (1.0, None, 1)


def test_the_ablation_the_report_and_the_studies_share_it():
    from attnlab.lab import report, store
    from attnlab.lab.report import statistics
    from attnlab.lab.studies import alignment

    for module in (store, report, statistics, alignment):
        assert module.mean_std is mean_std, module.__name__
    assert statistics.finite is finite


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "–"),
        (0, "0.0000"),
        (-0.0, "0.0000"),
        (0.25, "0.2500"),
        (-3.14159, "-3.1416"),
        (99.99994, "99.9999"),
        (100, "100.00"),
        (-12345.678, "-12345.68"),
        (123456, "1.235e+05"),
        (0.001, "0.0010"),
        (0.00012345, "0.0001234"),  # a small MSE keeps its digits
        (-3e-6, "-3e-06"),
        (math.nan, "nan"),
        (math.inf, "inf"),
    ],
)
def test_fmt_num(value, text):
    assert fmt_num(value) == text


def test_fmt_num_reads_the_same_mean_the_same_way():
    """Means of equal values summed in another order differ in the last bit; the table
    showed 0.8063 beside 0.8062 for what were ties."""
    import math

    tie = 0.80625
    below, above = math.nextafter(tie, 0), math.nextafter(tie, 1)
    assert f"{below:.4f}" != f"{tie:.4f}"  # what formatting alone did
    assert fmt_num(below) == fmt_num(tie) == fmt_num(above)
    assert fmt_num(0.80624) == "0.8062" and fmt_num(0.80626) == "0.8063"  # real differences


def test_fmt_num_missing_marker():
    assert fmt_num(None, "n/a") == "n/a"


def test_fmt_mean_std():
    assert fmt_mean_std(None, 0.1) == "–"
    assert fmt_mean_std(None, None, "n/a") == "n/a"  # the terminal's tables
    assert fmt_mean_std(0.5, None) == "0.5000"
    assert fmt_mean_std(0.5, 0.01) == "0.5000 ± 0.0100"
    assert fmt_mean_std(1e-4, 2e-5) == "0.0001 ± 2e-05"
