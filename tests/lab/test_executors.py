"""The executors: one job in this process, a failing job reported (not raised), the local
process pool and a local 2-CPU Ray instance giving the same results store as running in
this process (the toy runs are deterministic), the error when Ray is missing, and the
workers' warnings shown as the command shows its own."""

from __future__ import annotations

import multiprocessing
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor

import pytest

import attnlab.lab.executors as executors
import attnlab.lab.training as training
from attnlab.lab.ablation import run_ablation
from attnlab.lab.errors import warnings_as_notes
from attnlab.lab.executors import (
    LocalExecutor,
    RayExecutor,
    RunJob,
    cpu_count,
    execute_job,
    make_executor,
)
from attnlab.lab.store import ResultsStore

# the task "toy" (tests/lab/toy_task.py) is registered by a fixture, not at collection
pytestmark = pytest.mark.usefixtures("toy_task_module")

TINY = {"epochs": 2, "n_train": 64, "n_eval": 32}
GRID = [{"name": "mean"}, {"name": "tanh"}, {"name": "dot"}]


def _job(tmp_path, **options):
    return RunJob(
        run_id="tanh--seed0",
        task="toy",
        spec={"name": "tanh"},
        seed=0,
        run_dir=str(tmp_path / "run"),
        options={**TINY, **options},
        plugins=("tests.lab.toy_task",),
    )


def test_execute_job_done(tmp_path):
    outcome = execute_job(_job(tmp_path))
    assert outcome.status == "done" and outcome.error is None
    assert outcome.run_id == "tanh--seed0"
    assert outcome.run_dir == str(tmp_path / "run")
    assert set(outcome.metrics["test"]) == {"accuracy", "f1"}
    assert 0.0 <= outcome.metrics["test"]["accuracy"] <= 1.0
    assert outcome.cost["parameters"] > 0
    assert (tmp_path / "run" / "run.json").is_file()


def test_execute_job_failure_is_reported_not_raised(tmp_path):
    outcome = execute_job(_job(tmp_path, fail_after_steps=1))
    assert outcome.status == "failed"
    assert "RuntimeError: toy task: failing on purpose" in outcome.error
    assert outcome.metrics == {}


def test_sequential_local_executor_calls_back_in_order(tmp_path):
    jobs = [
        RunJob(f"{n}--seed0", "toy", {"name": n}, 0, str(tmp_path / n), dict(TINY))
        for n in ("mean", "tanh")
    ]
    seen = []
    LocalExecutor(1).run(jobs, seen.append)
    assert [o.run_id for o in seen] == ["mean--seed0", "tanh--seed0"]
    assert all(o.status == "done" for o in seen)
    LocalExecutor(1).run([], seen.append)  # nothing to do
    assert len(seen) == 2


def test_a_run_draws_its_bars_only_in_the_calling_process(tmp_path, capsys):
    LocalExecutor(1).run([_job(tmp_path, epochs=1)], lambda outcome: None)
    assert capsys.readouterr().err == ""  # RunJob's default: no bars
    shown = RunJob(**{**_job(tmp_path).__dict__, "run_dir": str(tmp_path / "b")})
    shown = RunJob(**{**shown.__dict__, "progress": True, "options": {**TINY, "epochs": 1}})
    LocalExecutor(1).run([shown], lambda outcome: None)
    assert "toy seed 0" in capsys.readouterr().err  # the run's epoch bar, in this process
    # a worker process (pool, Ray) gets the job without bars, and its threads
    worker = executors._for_worker(shown, 3)
    assert worker.progress is False and worker.num_threads == 3
    assert executors._for_worker(RunJob(**{**shown.__dict__, "num_threads": 1}), 3).num_threads == 1


def test_make_executor_checks_its_arguments():
    assert isinstance(make_executor("local", jobs=2), LocalExecutor)
    with pytest.raises(ValueError, match="jobs must be an int >= 1, got 0"):
        LocalExecutor(0)
    for bad in ("2", 2.5, True):  # not rounded or read as text
        with pytest.raises(ValueError, match="jobs must be an int >= 1"):
            LocalExecutor(bad)
    with pytest.raises(ValueError, match="--executor ray"):
        make_executor("local", address="localhost:6379")
    with pytest.raises(ValueError, match="executor must be one of"):
        make_executor("slurm")
    assert cpu_count() >= 1


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[ray\]'"):
        RayExecutor()


def _rows(path):
    return {
        r.run_id: (r.label, r.seed, r.status, r.test, r.dev, r.cost["parameters"])
        for r in ResultsStore(path).runs()
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory, toy_task_module):
    """The toy grid run in this process, one run after the other."""
    out = tmp_path_factory.mktemp("sequential")
    run_ablation("toy", GRID, [0, 1], out_dir=out, options=TINY, progress=False)
    rows = _rows(out)
    assert len(rows) == 6 and all(v[2] == "done" for v in rows.values())
    return rows


def _ablate_on_two_workers(out, **kw):
    """The ablation of ``reference`` (GRID, seeds 0 and 1) into ``out`` on two workers,
    each loading the toy task by its plugin; ``kw``: more run_ablation arguments (the
    executor)."""
    return run_ablation(
        "toy",
        GRID,
        [0, 1],
        out_dir=out,
        options=TINY,
        jobs=2,
        progress=False,
        plugins=["tests.lab.toy_task"],
        **kw,
    )


@pytest.mark.slow
def test_process_pool_gives_the_same_store(tmp_path, reference):
    out = tmp_path / "pool"
    result = _ablate_on_two_workers(out)
    assert not result.failed and len(result.ran) == 6
    assert _rows(out) == reference


@pytest.mark.slow
def test_ray_local_instance_gives_the_same_store(tmp_path, reference, monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    out = tmp_path / "ray"
    result = _ablate_on_two_workers(out, executor="ray")  # ray.init(num_cpus=2)
    assert not ray.is_initialized()  # it started Ray, so it shut it down
    assert not result.failed, result.failed
    assert sorted(result.ran) == sorted(reference)
    assert _rows(out) == reference  # same run ids, same metrics for the same seeds
    assert '"executor": "ray"' in (out / "ablation.json").read_text()


def _warnings_of_a_worker(notes: bool) -> None:
    """Start a worker process as the local executor starts them and have it raise one
    warning from an attnlab file (it writes to this process's stderr)."""
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=1,
        mp_context=context,
        initializer=executors._init_worker,
        initargs=(1, (), (), os.getpid(), notes),
    )
    with pool:
        pool.submit(
            warnings.warn_explicit, "a worker's notice", RuntimeWarning, training.__file__, 1
        ).result()


def test_workers_of_a_command_show_warnings_as_notes(capfd):
    """`attnlab ablate --jobs N` shows its workers' warnings as its own: one `note:` line
    (the CLI runs inside warnings_as_notes, which the executor passes on to its workers);
    a program calling the Python API gets Python's warnings from them."""
    with warnings_as_notes():
        assert executors.notes_wanted()
        _warnings_of_a_worker(executors.notes_wanted())
    err = capfd.readouterr().err
    assert "note: a worker's notice" in err and "RuntimeWarning" not in err
    assert not executors.notes_wanted()
    _warnings_of_a_worker(executors.notes_wanted())
    err = capfd.readouterr().err
    assert "RuntimeWarning: a worker's notice" in err and "note:" not in err
