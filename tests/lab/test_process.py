"""Tests of attnlab.lab._process: owners of claims and work folders, and their liveness."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnlab.lab._process import Owner, host_tag, pid_alive


def test_this_process_is_alive_and_named_by_pid_and_host():
    me = Owner.this_process()
    assert me.alive() is True and pid_alive(me.pid)
    assert str(me) == f"pid {me.pid} on {host_tag()}"


def test_a_dead_process_is_dead_and_another_host_is_unknown():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)
    assert Owner(child.pid, host_tag()).alive() is False
    assert Owner(child.pid, host_tag() + "-elsewhere").alive() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_a_zombie_and_a_reused_pid_do_not_count_as_the_owner():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        import time

        deadline = time.monotonic() + 30
        while pid_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.02)  # exited but not reaped: a zombie
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    me = Owner.this_process()
    assert me.start  # boot id and start time
    assert Owner(me.pid, me.host, me.start + "0").alive() is False  # the pid, reused


def test_host_tag_is_safe_for_file_names():
    tag = host_tag()
    assert tag and all(c.isalnum() or c in "_-" for c in tag)
