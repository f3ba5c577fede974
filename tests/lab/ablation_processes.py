"""Helpers of the lab tests that start ``attnlab ablate`` in a subprocess and kill it at a
chosen moment (tests/lab/test_ablation.py, tests/lab/test_faults.py)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["done_runs", "sigkill_when"]


def done_runs(out: Path) -> int:
    """How many runs the results store of the ablation directory ``out`` records as done
    (read-only; 0 while ``results.sqlite`` does not exist or is locked)."""
    db = out / "results.sqlite"
    if not db.is_file():
        return 0
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM runs WHERE status = 'done'").fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def sigkill_when(
    proc: subprocess.Popen,
    ready: Callable[[], bool],
    never: str,
    *,
    timeout_s: float = 120,
    poll_s: float = 0.05,
) -> None:
    """Kill ``proc`` (started with ``stderr=PIPE``) with SIGKILL as soon as ``ready()``
    holds, polling every ``poll_s`` seconds. Fails with the tail of its stderr when it exits
    first, and with the message ``never`` when ``ready()`` does not hold within
    ``timeout_s`` seconds. The process is always reaped and its stderr closed."""
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, never
            time.sleep(poll_s)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        proc.stderr.close()
