"""Generated pointer tasks (attnlab.data.pointer_tasks): sorting and convex hulls, checked
against independent definitions; metrics by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.data.pointer_tasks import (
    IGNORE_INDEX,
    convex_hull,
    hull_metrics,
    make_hull,
    make_pointer_data,
    make_sort,
    polygon_area,
    sequence_metrics,
)


def cross(o, a, b) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def test_sort_targets_sort_the_numbers():
    data = make_sort(50, 7, 3)
    assert data["x"].shape == (50, 7, 1) and data["x"].dtype == torch.float32
    assert data["targets"].shape == (50, 7) and data["targets"].dtype == torch.long
    assert (data["lengths"] == 7).all()
    for b in range(50):
        values = [float(v) for v in data["x"][b, :, 0]]
        order = [int(i) for i in data["targets"][b]]
        assert sorted(order) == list(range(7))  # a permutation
        picked = [values[i] for i in order]
        assert all(picked[i] <= picked[i + 1] for i in range(6))
        assert all(0.0 <= v < 1.0 for v in values)


def test_generators_are_seeded():
    a, b = make_sort(5, 4, 11), make_sort(5, 4, np.random.default_rng(11))
    assert torch.equal(a["x"], b["x"]) and torch.equal(a["targets"], b["targets"])
    assert not torch.equal(a["x"], make_sort(5, 4, 12)["x"])
    h1, h2 = make_hull(6, 9, 4, 5), make_pointer_data("hull", 6, 9, 5, min_points=4)
    assert torch.equal(h1["x"], h2["x"]) and torch.equal(h1["targets"], h2["targets"])


def test_hull_targets_form_the_hull():
    n = 12
    data = make_hull(60, n, 4, 0)
    assert data["x"].shape == (60, n, 2) and data["targets"].shape == (60, n + 1)
    for b in range(60):
        m = int(data["lengths"][b])
        assert 4 <= m <= n
        assert (data["x"][b, m:] == 0).all()  # padding
        pts = data["x"][b, :m].double().numpy()
        seq = [int(i) for i in data["targets"][b]]
        end = seq.index(n)
        hull = seq[:end]
        assert all(i == IGNORE_INDEX for i in seq[end + 1 :])
        assert len(hull) >= 3 and len(set(hull)) == len(hull)
        assert all(0 <= i < m for i in hull)
        assert hull[0] == min(hull)  # starts at the lowest index
        k = len(hull)
        # counter-clockwise and strictly convex: every turn is a left turn
        for t in range(k):
            assert cross(pts[hull[t]], pts[hull[(t + 1) % k]], pts[hull[(t + 2) % k]]) > 0
        # every other point lies inside the polygon or on its boundary
        for j in set(range(m)) - set(hull):
            for t in range(k):
                assert cross(pts[hull[t]], pts[hull[(t + 1) % k]], pts[j]) >= 0


def test_hull_drops_points_on_an_edge():
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0], [0.5, 0.5]], dtype=float)
    assert convex_hull(square) == [0, 1, 2, 3]
    assert polygon_area(square[[0, 1, 2, 3]]) == pytest.approx(1.0)


def test_sequence_metrics_by_hand():
    targets = torch.tensor([[0, 1, 2, -1], [2, 0, 1, 3]])
    pred = torch.tensor([[0, 1, 2, -1], [2, 1, 0, 3]])
    m = sequence_metrics(pred, targets)
    assert m["position_accuracy"] == pytest.approx(5 / 7)
    assert m["sequence_accuracy"] == pytest.approx(0.5)
    m = sequence_metrics(torch.tensor([[0, 1]]), torch.tensor([[0, 1, 2]]))
    assert m["position_accuracy"] == pytest.approx(2 / 3) and m["sequence_accuracy"] == 0


def test_hull_metrics_by_hand():
    # a unit square with an inner point, padded to n = 6
    x = torch.zeros(3, 6, 2)
    pts = torch.tensor([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]], dtype=torch.float32)
    x[:, :5] = pts
    data = {"x": x, "lengths": torch.tensor([5, 5, 5])}
    pred = torch.tensor(
        [
            [0, 1, 2, 3, 6, -1],  # the hull: coverage 1
            [0, 1, 2, 6, -1, -1],  # a triangle: half the area
            [0, 2, 1, 3, 6, -1],  # a bow tie: not simple -> 0, invalid
        ]
    )
    m = hull_metrics(pred, data, 6)
    assert m["area_coverage"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert m["invalid_rate"] == pytest.approx(1 / 3)


def test_hull_metrics_reads_up_to_the_end_pointer_and_refuses_padding_and_repeats():
    """A pointer to a padding slot crashed (IndexError); a hull traced twice scored 2.0;
    what follows the end pointer is not read."""
    x = torch.zeros(4, 6, 2)
    x[:, :5] = torch.tensor([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0.5]])
    data = {"x": x, "lengths": torch.tensor([5, 5, 5, 5])}
    pred = torch.tensor(
        [
            [0, 1, 5, 3, 6, -1, -1, -1, -1],  # slot 5 is padding (m = 5): invalid, no IndexError
            [0, 1, 2, 3, 0, 1, 2, 3, 6],  # the hull twice: invalid, not coverage 2
            [0, 1, 2, 3, 6, 4, 4, 4, 4],  # after the end pointer: not read, coverage 1
            [0, 1, 2, 2, 3, 6, -1, -1, -1],  # a repeated point: invalid
        ]
    )
    m = hull_metrics(pred, data, 6)
    assert m["area_coverage"] == pytest.approx(1.0 / 4)
    assert m["invalid_rate"] == pytest.approx(3 / 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="count"):
        make_sort(0, 3, 0)
    with pytest.raises(ValueError, match="min_points"):
        make_hull(2, 5, 6, 0)
    with pytest.raises(ValueError, match="problem"):
        make_pointer_data("tsp", 2, 5, 0)
    with pytest.raises(TypeError, match="seed"):
        make_sort(2, 3, "0")


def test_negative_seed_is_one_clear_error():
    """A negative seed failed inside numpy ("expected non-negative integer")."""
    with pytest.raises(ValueError, match=r"^rng must be a numpy Generator or an int seed >= 0"):
        make_pointer_data("sort", 2, 3, -1)
