"""Which process owns something (a claimed run, a work folder), and whether it still lives.

An :class:`Owner` is a process id with its host name and, on Linux, a start token (the boot
id and the process's start time), so that a process id reused by another process after the
owner died is not mistaken for the owner. Owners on another host cannot be checked from
here: :meth:`Owner.alive` returns ``None`` for them, and callers keep what they own.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

__all__ = ["Owner", "host_tag", "pid_alive"]


def host_tag() -> str:
    """This host's name, restricted to ``[A-Za-z0-9_-]`` (at most 40 characters), for file
    names and records."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time)`` of ``pid`` from Linux's ``/proc`` (None elsewhere or when the
    process does not exist)."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[0], fields[19]


def _start_token(pid: int) -> str:
    stat = _proc_stat(pid)
    return "" if stat is None else f"{_boot_id()}:{stat[1]}"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (a zombie, dead but not yet reaped, does not
    count)."""
    if pid <= 0:
        return False
    stat = _proc_stat(pid)
    if stat is not None:
        return stat[0] not in ("Z", "X", "x")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True)
class Owner:
    """A process: ``pid`` on ``host`` (:func:`host_tag`), ``start`` its start token ("" when
    unknown)."""

    pid: int
    host: str
    start: str = ""

    @classmethod
    def this_process(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, host_tag(), _start_token(pid))

    def alive(self) -> bool | None:
        """True / False for an owner on this host; None (unknown) for one on another."""
        if self.host != host_tag():
            return None
        if not pid_alive(self.pid):
            return False
        if self.start and _proc_stat(self.pid) is not None:
            return _start_token(self.pid) == self.start  # else: the pid was reused
        return True

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"
