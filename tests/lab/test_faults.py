"""Fault injection on `attnlab ablate` with the generated toy tasks (real subprocesses):

* SIGKILL of an ablation with ``-j 2`` at several moments (workers starting, a run
  training, between runs): no worker outlives it, and nothing is written after its death;
* two and three processes on one ablation directory train every run exactly once;
* the work folders of killed runs are removed when the ablation resumes;
* a damaged ``results.sqlite`` or ``ablation.json`` gives one ``error:`` line, exit 2.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from ablation_processes import done_runs, sigkill_when
from click.testing import CliRunner

from attnlab.lab.ablation import ablate_command
from attnlab.lab.store import ResultsStore

pytestmark = pytest.mark.usefixtures("toy_task_module")  # registers "toy" here

ROOT = Path(__file__).resolve().parents[2]
TAG = "ATTNLAB_FAULT_TEST_TAG"
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds processes through /proc"
)


def _ablate(out: Path, *args: str, task: str = "toy", plugin: str = "tests.lab.toy_task"):
    cmd = [sys.executable, "-m", "attnlab", "ablate", task, "--plugin", plugin]
    return [*cmd, "--out", str(out), "--no-report", *args]


def _env(tag: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "src")])  # this checkout's attnlab
    return {**os.environ, "PYTHONPATH": path, TAG: tag}


def _tagged(tag: str) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the live processes whose environment holds ``TAG=tag``
    (the ablation and everything it started)."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def _run_dirs(out: Path) -> dict[str, float]:
    """The published run directories (not the hidden work folders) and their mtimes."""
    runs = out / "runs"
    if not runs.is_dir():
        return {}
    return {p.name: p.stat().st_mtime for p in runs.iterdir() if not p.name.startswith(".")}


def _worker_started(tag: str, parent: int) -> Callable[[Path], bool]:
    """Workers are starting: a spawned child of the ablation exists (its interpreter is
    still booting, long before it could ask the kernel to die with its parent)."""
    return lambda out: any(
        pid != parent and "spawn_main" in cmd and "resource_tracker" not in cmd
        for pid, cmd in _tagged(tag)
    )


def _training(out: Path) -> bool:
    """A run is training: a worker's hidden work folder exists."""
    runs = out / "runs"
    return runs.is_dir() and any(".tmp-" in p.name for p in runs.iterdir())


MOMENTS = {
    "workers-starting": None,  # _worker_started, which needs the tag and the parent pid
    "run-training": _training,
    "between-runs": lambda out: done_runs(out) >= 1,
}


# ----------------------------------------------------------------------------- orphans


@linux_only
@pytest.mark.slow
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_sigkill_leaves_no_worker_and_writes_nothing_afterwards(tmp_path, moment):
    """`attnlab ablate -j 2` killed with SIGKILL: every worker is gone within seconds and
    no run directory appears (or changes) after the death."""
    out, tag = tmp_path / "abl", uuid.uuid4().hex
    args = ["-a", "tanh", "-a", "dot", "--seeds", "0,1", "--no-baselines", "-j", "2"]
    args += ["-o", "epochs=3", "-o", "n_train=64", "-o", "n_eval=32", "-o", "step_sleep=0.3"]
    proc = subprocess.Popen(
        _ablate(out, *args),
        cwd=ROOT,
        env=_env(tag),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ready = MOMENTS[moment] or _worker_started(tag, proc.pid)
    sigkill_when(proc, lambda: ready(out), f"never reached the moment {moment!r}", poll_s=0.01)
    at_death = _run_dirs(out)
    # a worker still booting (importing torch) when its parent died runs on until it
    # reaches its initializer, which exits: give a slow, loaded machine time for that
    deadline = time.monotonic() + 60
    while (alive := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, _ in alive:  # do not leave them running after the test
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes outlived the killed ablation: {alive}"
    time.sleep(1.0)  # what a surviving worker would have been writing lands by now
    assert _run_dirs(out) == at_death, "a run directory was written after the ablation died"


# ----------------------------------------------------------------------------- sharing


@pytest.mark.slow
@pytest.mark.parametrize("processes", [2, 3])
def test_concurrent_ablations_train_each_run_once(tmp_path, processes):
    """N processes started together on one directory share the grid: each run is trained
    exactly once, every process exits 0 and the store ends with every run done."""
    from tests.lab.counting_task import read_counts

    out, counts = tmp_path / "abl", tmp_path / "trainings.txt"
    args = ["-a", "tanh", "-a", "dot", "--seeds", "0,1"]
    args += ["-o", "epochs=2", "-o", "n_train=64", "-o", "n_eval=32", "-o", "step_sleep=0.1"]
    args += ["-o", f"count_file={counts}"]
    cmd = _ablate(out, *args, task="toy-counted", plugin="tests.lab.counting_task")
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(uuid.uuid4().hex),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_stdout, stderr) in zip(procs, results, strict=True):
        assert p.returncode == 0, stderr[-3000:]
    total = 4 * 2  # mean, uniform, tanh, dot x seeds 0, 1
    trained = read_counts(counts)
    assert len(trained) == total and set(trained.values()) == {1}, trained
    store = ResultsStore(out)
    rows = store.runs()
    assert len(rows) == total and all(r.status == "done" for r in rows)
    assert store.claims() == {}  # every claim was released
    assert len(_run_dirs(out)) == total


# ----------------------------------------------------------------------------- leftovers


@pytest.mark.slow
def test_resume_removes_the_work_folders_of_killed_runs(tmp_path):
    """SIGKILL while runs train leaves hidden work folders; the resumed ablation removes
    them (their owner is dead) and finishes every run."""
    out = tmp_path / "abl"
    args = ["-a", "tanh", "--seeds", "0,1", "--no-baselines", "-j", "2"]
    args += ["-o", "epochs=2", "-o", "n_train=64", "-o", "n_eval=32", "-o", "step_sleep=0.3"]
    cmd = _ablate(out, *args)
    env = _env(uuid.uuid4().hex)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not _training(out):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        proc.kill()
        proc.wait(30)
    time.sleep(0.5)  # the workers die with their parent
    left = [p.name for p in (out / "runs").iterdir() if p.name.startswith(".")]
    assert left, "the kill left no work folder to test with"
    rerun = subprocess.run(
        [c for c in cmd if c not in ("-j", "2")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    names = sorted(p.name for p in (out / "runs").iterdir())
    assert names == ["tanh--seed0", "tanh--seed1"]


# ----------------------------------------------------------------------------- damage


def _invoke(out: Path, *extra: str):
    args = ["toy", "--plugin", "tests.lab.toy_task", "-a", "mean", "--seeds", "0"]
    args += ["--no-baselines", "--no-report", "-o", "epochs=1", "-o", "n_train=32"]
    return CliRunner().invoke(ablate_command, [*args, "--out", str(out), *extra])


@pytest.mark.parametrize(
    "damage",
    ["random-bytes", "truncated", "invalid-json-row", "list-in-json-row", "wrong-table"],
)
def test_resuming_onto_a_damaged_store_is_one_error_line(tmp_path, monkeypatch, damage):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "abl"
    first = _invoke(out)
    assert first.exit_code == 0, first.output
    db = out / "results.sqlite"
    ResultsStore(db).close()
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    if damage == "invalid-json-row":
        con.execute("UPDATE runs SET test_json = '{\"accuracy\": 0.' WHERE run_id = 'mean--seed0'")
    elif damage == "list-in-json-row":
        con.execute("UPDATE runs SET dev_json = '[1, 2]' WHERE run_id = 'mean--seed0'")
    elif damage == "wrong-table":
        con.execute("ALTER TABLE runs RENAME COLUMN test_json TO other")
    con.commit()
    con.close()
    for extra in ("results.sqlite-wal", "results.sqlite-shm"):
        (out / extra).unlink(missing_ok=True)
    if damage == "random-bytes":
        db.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        db.write_bytes(db.read_bytes()[:1500])
    res = _invoke(out)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and str(db) in lines[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '{"task": "toy", "grid": 3}'])
def test_a_damaged_ablation_json_is_one_error_line(tmp_path, monkeypatch, text):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "abl"
    out.mkdir()
    (out / "ablation.json").write_text(text)
    res = _invoke(out)
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: ") and str(out / "ablation.json") in res.output
    assert len(res.output.strip().splitlines()) == 1
