"""Helpers of the data-layer tests (markers and paths); the fixtures are in conftest.py.

A plain module with a unique name, so that tests import it unambiguously (two conftest.py
files would both be called ``conftest``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def needs_package(module: str, install: str):
    """Skip unless the data package ``module`` is installed (found without importing it);
    ``install`` is the command that installs it."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"the data package {module} is not installed ({install})",
    )


needs_shared = pytest.mark.skipif(
    not SHARED_DATASETS.is_dir(),
    reason="reference data for maintainers is absent",
)
