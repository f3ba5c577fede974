"""Fixtures of the lab tests.

The repository root is put on ``sys.path`` so that ``import tests.lab.toy_task`` (the
generated task registered as ``"toy"``) works however pytest was started. The toy task is
imported inside fixtures, never at collection time, so the registry that tests/test_docs.py
parametrizes over holds only attnlab's own tasks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def toy_task_module():
    """The module tests.lab.toy_task (imported, so the task "toy" is registered)."""
    import tests.lab.toy_task as module

    return module


@pytest.fixture(scope="session")
def toy_run_dir(tmp_path_factory, toy_task_module):
    """A finished run directory of the toy task (default attention, seed 0, 3 epochs)."""
    from attnlab.lab.training import train_run

    out = tmp_path_factory.mktemp("toy-run") / "default--seed0"
    train_run("toy", None, seed=0, options={"epochs": 3}, out_dir=out, progress=False)
    return out
