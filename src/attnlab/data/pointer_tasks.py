"""Generated pointer-network tasks (Vinyals, Fortunato & Jaitly 2015): sorting and planar
convex hulls, with their exact targets and their metrics.

* :func:`make_sort`: ``n`` numbers uniform in [0, 1); the target is the sequence of their
  indices in ascending order of value (a permutation, no end pointer).
* :func:`make_hull`: ``m`` points uniform in the unit square, ``m`` uniform in
  ``[min_points, n]``, padded to ``n`` points (the padding is marked by ``lengths``). The
  target is the vertices of the convex hull (strict vertices: points inside an edge are
  not vertices) in counter-clockwise order, starting with the vertex of lowest index, then
  the end pointer, whose index is ``n`` (the padded input width), then ``-1`` padding.
  The hull is computed exactly by :func:`convex_hull` (Andrew's monotone chain).

Each generator takes a ``numpy.random.Generator`` or an int seed and returns a dict of
tensors: ``x`` ``[count, n, d]`` float32 (``d = 1`` for sorting, 2 for hulls), ``targets``
``[count, T]`` long (``-1`` after the end) and ``lengths`` ``[count]`` long.

Metrics: :func:`sequence_metrics` (``position_accuracy``, the fraction of target steps
decoded right -- a decoded sequence shorter than the target is wrong at the missing
steps -- and ``sequence_accuracy``, the fraction of instances decoded exactly) and, for
hulls, :func:`hull_metrics` (``area_coverage``: the mean of area(decoded polygon) /
area(true hull), 0 when the decoded points are not a simple polygon with at least 3
vertices; ``invalid_rate``: the fraction of such failures).

Nothing is downloaded: the data are generated (a few seconds for 10^5 hulls of 20 points).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "IGNORE_INDEX",
    "convex_hull",
    "hull_metrics",
    "is_simple_polygon",
    "make_hull",
    "make_pointer_data",
    "make_sort",
    "polygon_area",
    "sequence_metrics",
]

#: Padding value of target index sequences (the same as attnlab.query.pointer.IGNORE_INDEX).
IGNORE_INDEX = -1


def _rng(rng: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, bool) or not isinstance(rng, (int, np.integer)):
        raise TypeError(f"rng must be a numpy Generator or an int seed, got {type(rng).__name__}")
    if rng < 0:
        raise ValueError(f"rng must be a numpy Generator or an int seed >= 0, got {rng!r}")
    return np.random.default_rng(int(rng))


# ----------------------------------------------------------------------------- geometry


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_hull(points: np.ndarray) -> list[int]:
    """Indices of the strict vertices of the convex hull of ``points`` ``[m, 2]``, counter-
    clockwise, starting with the vertex of lowest index (Andrew's monotone chain,
    O(m log m)). Points on an edge are not vertices. Fewer than 3 distinct non-collinear
    points give the extreme points only (1 or 2)."""
    pts = [(float(p[0]), float(p[1])) for p in points]
    order = sorted(range(len(pts)), key=lambda i: pts[i])
    if len(order) <= 1:
        return order
    lower: list[int] = []
    for i in order:
        while len(lower) >= 2 and _cross(pts[lower[-2]], pts[lower[-1]], pts[i]) <= 0:
            lower.pop()
        lower.append(i)
    upper: list[int] = []
    for i in reversed(order):
        while len(upper) >= 2 and _cross(pts[upper[-2]], pts[upper[-1]], pts[i]) <= 0:
            upper.pop()
        upper.append(i)
    hull = lower[:-1] + upper[:-1]
    if len(hull) == 2 and pts[hull[0]] == pts[hull[1]]:
        hull = hull[:1]
    start = hull.index(min(hull))
    return hull[start:] + hull[:start]


def polygon_area(points: np.ndarray) -> float:
    """Absolute area of the polygon with vertices ``points`` ``[m, 2]`` in order (shoelace)."""
    if len(points) < 3:
        return 0.0
    x, y = points[:, 0], points[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _segments_cross(p1, p2, p3, p4) -> bool:
    d1, d2 = _cross(p3, p4, p1), _cross(p3, p4, p2)
    d3, d4 = _cross(p1, p2, p3), _cross(p1, p2, p4)
    return ((d1 > 0) != (d2 > 0)) and ((d3 > 0) != (d4 > 0)) and 0 not in (d1, d2, d3, d4)


def is_simple_polygon(points: np.ndarray) -> bool:
    """Whether the closed polygon through ``points`` ``[m, 2]`` (m >= 3) has no two
    non-adjacent edges that cross."""
    m = len(points)
    if m < 3:
        return False
    pts = [(float(p[0]), float(p[1])) for p in points]
    for i in range(m):
        a, b = pts[i], pts[(i + 1) % m]
        for j in range(i + 1, m):
            if j == i or (j + 1) % m == i or j == (i + 1) % m:
                continue  # adjacent edges share a vertex
            if _segments_cross(a, b, pts[j], pts[(j + 1) % m]):
                return False
    return True


# ----------------------------------------------------------------------------- data


def make_sort(count: int, n: int, rng: np.random.Generator | int) -> dict[str, torch.Tensor]:
    """``count`` sorting instances of ``n`` numbers uniform in [0, 1) (see the module
    docstring): ``x`` ``[count, n, 1]``, ``targets`` ``[count, n]`` (argsort, ascending),
    ``lengths`` ``[count]`` (all ``n``)."""
    _check_sizes(count=count, n=n)
    rng = _rng(rng)
    x = rng.random((count, n, 1), dtype=np.float32)
    targets = np.argsort(x[..., 0], axis=1, kind="stable")
    return {
        "x": torch.from_numpy(x),
        "targets": torch.from_numpy(targets).long(),
        "lengths": torch.full((count,), n, dtype=torch.long),
    }


def make_hull(
    count: int, n: int, min_points: int, rng: np.random.Generator | int
) -> dict[str, torch.Tensor]:
    """``count`` convex-hull instances of ``min_points..n`` points in the unit square,
    padded to ``n`` (see the module docstring): ``x`` ``[count, n, 2]`` (zeros at padding),
    ``targets`` ``[count, n + 1]`` (hull vertices, the end pointer ``n``, then ``-1``),
    ``lengths`` ``[count]``."""
    _check_sizes(count=count, n=n)
    if isinstance(min_points, bool) or not isinstance(min_points, int) or not 3 <= min_points <= n:
        raise ValueError(f"min_points must be an int in [3, n] = [3, {n}], got {min_points!r}")
    rng = _rng(rng)
    x = np.zeros((count, n, 2), dtype=np.float32)
    lengths = rng.integers(min_points, n + 1, size=count)
    targets = np.full((count, n + 1), IGNORE_INDEX, dtype=np.int64)
    for b in range(count):
        m = int(lengths[b])
        x[b, :m] = rng.random((m, 2), dtype=np.float32)
        hull = convex_hull(x[b, :m])
        targets[b, : len(hull)] = hull
        targets[b, len(hull)] = n  # the end pointer
    return {
        "x": torch.from_numpy(x),
        "targets": torch.from_numpy(targets),
        "lengths": torch.from_numpy(lengths).long(),
    }


def make_pointer_data(
    problem: str, count: int, n: int, seed: int, *, min_points: int = 5
) -> dict[str, torch.Tensor]:
    """``make_sort(count, n, seed)`` for ``problem="sort"``, ``make_hull(count, n,
    min_points, seed)`` for ``problem="hull"``."""
    if problem == "sort":
        return make_sort(count, n, seed)
    if problem == "hull":
        return make_hull(count, n, min_points, seed)
    raise ValueError(f"problem must be 'sort' or 'hull', got {problem!r}")


def _check_sizes(**sizes: object) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


# ----------------------------------------------------------------------------- metrics


def sequence_metrics(pred: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Per-position and whole-sequence accuracy of ``pred`` ``[B, T']`` against
    ``targets`` ``[B, T]`` (both padded with -1)."""
    B, T = targets.shape
    width = max(T, pred.shape[1])
    p = torch.full((B, width), IGNORE_INDEX, dtype=torch.long)
    t = torch.full((B, width), IGNORE_INDEX, dtype=torch.long)
    p[:, : pred.shape[1]] = pred
    t[:, :T] = targets
    counted = t != IGNORE_INDEX
    correct = (p == t) & counted
    return {
        "position_accuracy": float(correct.sum()) / max(int(counted.sum()), 1),
        "sequence_accuracy": float((p == t).all(1).float().mean()) if B else 0.0,
    }


def _decoded_polygon(row: torch.Tensor, m: int, n: int) -> list[int] | None:
    """The point indices of one decoded hull, read up to the end pointer ``n`` (or the
    ``-1`` padding); None when it points at a padding slot (an index in ``[m, n)``) or
    visits a point twice (a hull traced twice is no simple polygon, and scored 2.0)."""
    seq: list[int] = []
    for i in (int(v) for v in row):
        if i in (n, IGNORE_INDEX):
            break
        if not 0 <= i < m or i in seq:
            return None
        seq.append(i)
    return seq


def hull_metrics(pred: torch.Tensor, data: dict[str, torch.Tensor], n: int) -> dict[str, float]:
    """Area coverage and invalid rate of decoded hulls (see the module docstring). A
    decoded sequence is read up to its end pointer; one that points at a padding slot or
    repeats a point is invalid, like one that is not a simple polygon."""
    ratios, invalid = [], 0
    for b in range(pred.shape[0]):
        m = int(data["lengths"][b])
        pts = data["x"][b, :m].numpy().astype(np.float64)
        seq = _decoded_polygon(pred[b], m, n) or []
        true_area = polygon_area(pts[convex_hull(pts)])
        poly = pts[seq] if seq else np.zeros((0, 2))
        if len(seq) < 3 or not is_simple_polygon(poly) or true_area == 0:
            invalid += 1
            ratios.append(0.0)
        else:
            ratios.append(polygon_area(poly) / true_area)
    count = max(len(ratios), 1)
    return {"area_coverage": sum(ratios) / count, "invalid_rate": invalid / count}
