"""A small helper process that starts the fresh processes of the memory measurements.

Why: on Linux a process's peak RSS (``ru_maxrss``) is inherited. ``fork`` copies the
parent's high-water mark into the child, and ``exec`` keeps it, so a child started by a
benchmark process that has already held gigabytes reports that peak as its own
``ru_maxrss``. Children started by this launcher -- itself started before the benchmark
imports torch or allocates anything -- inherit only the launcher's few MiB.

Standard library only: importing this module must not grow the process.
"""

from __future__ import annotations

import atexit
import json
import subprocess
import sys
from dataclasses import dataclass

_SERVER = r"""
import json, subprocess, sys
for line in sys.stdin:
    req = json.loads(line)
    try:
        p = subprocess.run(req["argv"], capture_output=True, text=True, timeout=req["timeout"])
        res = {"returncode": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    except subprocess.TimeoutExpired as err:
        res = {"returncode": -9, "stdout": "", "stderr": f"timed out after {err.timeout} s"}
    sys.stdout.write(json.dumps(res) + "\n")
    sys.stdout.flush()
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class Launcher:
    """Runs commands in processes forked from a small, long-lived helper process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, argv: list[str], timeout: float = 600) -> Result:
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the launcher process is not running")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"argv": argv, "timeout": timeout}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the launcher process exited")
        return Result(**json.loads(line))

    def close(self) -> None:
        """End the helper process (its loop ends with its input) and close its pipes."""
        if self._proc is not None:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.close()
            self._proc.wait(timeout=30)
            self._proc.stdout.close()
            self._proc = None


_default: Launcher | None = None


def default() -> Launcher:
    """The process-wide launcher, started on first use (call it early)."""
    global _default
    if _default is None:
        _default = Launcher()
        atexit.register(_default.close)  # else it outlives the interpreter's shutdown
    return _default
