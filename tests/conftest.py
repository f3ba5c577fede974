"""Shared test configuration.

The tests run tiny tensors, for which PyTorch's intra-op thread pool costs more than it
saves (on a shared 2-core machine a tiny op took 10-30 ms with two threads and 0.1 ms with
one), so the whole suite runs single-threaded. Tests assert correctness, never timings.
"""

from __future__ import annotations

from pathlib import Path

import torch

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def pytest_configure(config) -> None:
    torch.set_num_threads(1)
