"""A pool worker of the local executor never outlives (or writes after) its parent: it
exits when the parent died during its start-up, and it publishes no run directory once
its parent is gone; should_run skips jobs right before they start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnlab.lab import executors
from attnlab.lab.executors import ORPHAN_EXIT, LocalExecutor, RunJob, execute_job

pytestmark = pytest.mark.usefixtures("toy_task_module")

TINY = {"epochs": 1, "n_train": 64, "n_eval": 32}


def _job(tmp_path, name: str = "tanh") -> RunJob:
    return RunJob(
        run_id=f"{name}--seed0",
        task="toy",
        spec={"name": name},
        seed=0,
        run_dir=str(tmp_path / "runs" / f"{name}--seed0"),
        options=TINY,
        plugins=("tests.lab.toy_task",),
    )


def _init_in_child(parent: str) -> subprocess.CompletedProcess:
    code = (
        "import os; from attnlab.lab.executors import _die_with_parent; "
        f"_die_with_parent({parent}); print('still here')"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_worker_whose_parent_died_while_it_started_exits():
    """The kernel signals only deaths after the request: a worker started by a parent that
    is already gone (here: pid 1 is not its parent) must notice and exit."""
    orphan = _init_in_child("os.getppid() + 1 if os.getppid() != 1 else 2")
    assert orphan.returncode == ORPHAN_EXIT and "still here" not in orphan.stdout
    normal = _init_in_child("os.getppid()")
    assert normal.returncode == 0 and "still here" in normal.stdout


class Exited(BaseException):
    pass


def test_an_orphaned_worker_publishes_nothing(tmp_path, monkeypatch):
    """The parent died while the run trained (and no signal killed the worker, as on a
    platform without PR_SET_PDEATHSIG): the worker exits without writing the run."""
    monkeypatch.setattr(executors, "_PARENT_PID", os.getppid() + 1, raising=False)

    def exit_(code):
        raise Exited(code)

    monkeypatch.setattr(os, "_exit", exit_)
    with pytest.raises(Exited) as info:
        execute_job(_job(tmp_path))
    assert info.value.args == (ORPHAN_EXIT,)
    runs = tmp_path / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []  # no run, no work folder


@pytest.mark.parametrize("jobs", [1, 2])
def test_should_run_skips_jobs_right_before_they_start(tmp_path, jobs):
    asked, done = [], []

    def should_run(job):
        asked.append(job.run_id)
        return job.run_id != "dot--seed0"

    work = [_job(tmp_path, n) for n in ("mean", "dot", "tanh")]
    LocalExecutor(jobs).run(work, done.append, should_run)
    assert sorted(asked) == ["dot--seed0", "mean--seed0", "tanh--seed0"]
    assert sorted(o.run_id for o in done) == ["mean--seed0", "tanh--seed0"]
    assert all(o.status == "done" for o in done)
    assert not (tmp_path / "runs" / "dot--seed0").exists()
