"""Shared test configuration.

The tests run tiny tensors, for which PyTorch's intra-op thread pool costs more than it
saves (on a shared 2-core machine a tiny op took 10-30 ms with two threads and 0.1 ms with
one), so the whole suite runs single-threaded. Tests assert correctness, never timings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

SHARED_DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def pytest_configure(config) -> None:
    torch.set_num_threads(1)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Run a test with one intra-op thread and restore the setting afterwards (a learning
    test that a caller runs outside this suite's single-threaded configuration)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
