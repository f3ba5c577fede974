"""examples/pointer_tasks.py: the convex-hull geometry and an end-to-end run with a tiny
budget."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "pointer_tasks.py"


@pytest.fixture(scope="module")
def tasks():
    spec = importlib.util.spec_from_file_location("pointer_tasks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- geometry


def brute_force_hull(points: np.ndarray) -> list[int]:
    """Hull vertices by definition: i -> j is a counter-clockwise hull edge iff every other
    point lies strictly to its left. Follow the edges from the lowest vertex index."""
    m = len(points)
    nxt = {}
    for i, j in itertools.permutations(range(m), 2):
        a, b = points[i], points[j]
        if all(
            (b[0] - a[0]) * (points[k][1] - a[1]) - (b[1] - a[1]) * (points[k][0] - a[0]) > 0
            for k in range(m)
            if k not in (i, j)
        ):
            nxt[i] = j
    start = min(nxt)
    hull = [start]
    while nxt[hull[-1]] != start:
        hull.append(nxt[hull[-1]])
    return hull


def test_convex_hull_by_hand(tasks) -> None:
    square = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [0.5, 0], [0.5, 0.5]], dtype=float)
    assert tasks.convex_hull(square) == [0, 1, 2, 3]  # the edge midpoint 4 is no vertex
    # starts at the lowest index, counter-clockwise
    quad = np.array([[0.2, 0.1], [1, 1], [0, 1], [0.4, 0.9], [1, 0]], dtype=float)
    assert tasks.convex_hull(quad) == [0, 4, 1, 2]
    # (0.5, 0.5) lies on the edge (0, 1)-(1, 0): not a vertex; start at vertex 1
    tri = np.array([[0.5, 0.5], [1, 1], [0, 1], [0.4, 0.9], [1, 0]], dtype=float)
    assert tasks.convex_hull(tri) == [1, 2, 4]
    assert tasks.convex_hull(np.array([[0.3, 0.3]])) == [0]
    assert tasks.convex_hull(np.array([[0, 0], [1, 1], [2, 2]], dtype=float)) == [0, 2]
    assert tasks.polygon_area(square[[0, 1, 2, 3]]) == pytest.approx(1.0)
    assert tasks.is_simple_polygon(square[[0, 1, 2, 3]])
    assert not tasks.is_simple_polygon(square[[0, 2, 1, 3]])  # a bow tie


def test_convex_hull_against_a_reference(tasks) -> None:
    rng = np.random.default_rng(0)
    try:
        from scipy.spatial import ConvexHull
    except ImportError:
        ConvexHull = None
    for _ in range(200):
        m = int(rng.integers(3, 21))
        pts = rng.random((m, 2))
        got = tasks.convex_hull(pts)
        assert got == brute_force_hull(pts)
        if ConvexHull is not None:  # scipy's 2-D vertices are counter-clockwise
            ref = [int(i) for i in ConvexHull(pts).vertices]
            s = ref.index(min(ref))
            assert got == ref[s:] + ref[:s]


def test_hull_targets(tasks) -> None:
    data = tasks.make_hull(50, 20, 5, np.random.default_rng(1))
    assert data["x"].shape == (50, 20, 2) and data["targets"].shape == (50, 21)
    for b in range(50):
        m = int(data["lengths"][b])
        assert 5 <= m <= 20
        assert (data["x"][b, m:] == 0).all()
        seq = [int(i) for i in data["targets"][b] if i != -1]
        assert seq[-1] == 20 and seq[:-1] == tasks.convex_hull(data["x"][b, :m].numpy())
        assert seq[0] == min(seq[:-1])


def test_metrics_by_hand(tasks) -> None:
    targets = torch.tensor([[0, 1, 2, -1], [2, 0, 1, 3]])
    pred = torch.tensor([[0, 1, 2, -1], [2, 1, 0, 3]])
    m = tasks.sequence_metrics(pred, targets)
    assert m["position_accuracy"] == pytest.approx(5 / 7)
    assert m["sequence_accuracy"] == pytest.approx(0.5)
    # a prediction that stops early is wrong at the missing steps
    m = tasks.sequence_metrics(torch.tensor([[0, 1]]), torch.tensor([[0, 1, 2]]))
    assert m["position_accuracy"] == pytest.approx(2 / 3) and m["sequence_accuracy"] == 0


# ----------------------------------------------------------------------------- end to end


def _check_results(results: dict, task: str) -> None:
    assert results["task"] == task
    assert results["train"]["steps"] >= 1
    for decoder in ("greedy", "beam2"):
        metrics = results["eval"][decoder]
        assert 0.0 <= metrics["position_accuracy"] <= 1.0
        assert 0.0 <= metrics["sequence_accuracy"] <= 1.0
        if task == "hull":
            assert 0.0 <= metrics["area_coverage"] <= 1.0
            assert 0.0 <= metrics["invalid_rate"] <= 1.0
    assert set(results["wall_seconds"]) == {"data", "train", "eval", "total"}
    assert "sequence_accuracy" in results["baseline"]


def test_script_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "sort.json"
    args = (
        "--task sort --steps 3 --train-size 64 --batch-size 16 --eval-size 16 --hidden 8 "
        "--beam-width 2 --time-limit 5 --seed 3"
    ).split()
    cmd = [sys.executable, str(SCRIPT), *args, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    _check_results(results, "sort")
    assert results["train"]["steps"] == 3
    assert results["config"]["seed"] == 3


def test_hull_task_in_process(tasks, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        args = (
            "--task hull --epochs 0.5 --train-size 32 --batch-size 8 --eval-size 8 "
            "--hidden 8 --beam-width 2 --time-limit 5 --log-every 0"
        ).split()
        results = tasks.main([*args, "--out", str(tmp_path / "hull.json")])
    finally:
        torch.set_num_threads(threads)
    _check_results(results, "hull")
    assert results["train"]["steps"] == 2  # half an epoch of 32 in batches of 8
    assert json.loads((tmp_path / "hull.json").read_text())["eval"] == results["eval"]
