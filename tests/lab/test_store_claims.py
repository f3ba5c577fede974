"""Claims in the results store (several ablation processes on one directory) and the
store's one-line errors on damaged files and rows."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from attnlab.lab._process import Owner, host_tag
from attnlab.lab.checkpoint import RunFileError
from attnlab.lab.store import ResultsStore, StoreError

METRICS = {"dev": {"accuracy": 0.5}, "test": {"accuracy": 0.75}}


@pytest.fixture
def other():
    """A live process on this host (another ablation, as far as the store knows)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield Owner(proc.pid, host_tag())
    proc.kill()
    proc.wait()


def _dead() -> Owner:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return Owner(proc.pid, host_tag())


def test_a_claim_is_exclusive_while_its_owner_lives(tmp_path, other):
    store = ResultsStore(tmp_path)
    assert store.claim("a--seed0", other).status == "claimed"
    mine = store.claim("a--seed0")
    assert mine.status == "busy" and mine.owner == other
    assert store.claims() == {"a--seed0": other}
    assert store.claim("a--seed0", other).status == "claimed"  # its owner may claim again


def test_the_claim_of_a_dead_owner_is_taken_over(tmp_path):
    store = ResultsStore(tmp_path)
    dead = _dead()
    assert store.claim("a--seed0", dead).status == "claimed"
    assert store.claim("a--seed0").status == "claimed"
    assert store.claims() == {"a--seed0": Owner.this_process()}


def test_a_claim_on_another_host_is_respected(tmp_path):
    store = ResultsStore(tmp_path)
    remote = Owner(1, host_tag() + "-other", "x")
    store.claim("a--seed0", remote)
    assert store.claim("a--seed0").status == "busy"


def test_recording_releases_the_claim_and_done_runs_are_not_claimed(tmp_path):
    store = ResultsStore(tmp_path)
    assert store.claim("a--seed0").status == "claimed"
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "done", METRICS)
    assert store.claims() == {}
    assert store.claim("a--seed0").status == "done"


def test_release_hands_back_every_claim_of_an_owner(tmp_path, other):
    store = ResultsStore(tmp_path)
    store.claim("a--seed0")
    store.claim("b--seed0")
    store.claim("c--seed0", other)
    store.release()
    assert store.claims() == {"c--seed0": other}


def test_a_run_another_process_ran_since_the_snapshot_is_not_run_again(tmp_path, other):
    """A failed run is retried once per invocation, not once per concurrent process."""
    store = ResultsStore(tmp_path)
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "failed", error="boom")
    snapshot = store.attempts()
    store.claim("a--seed0", other, snapshot.get("a--seed0", 0))  # the other process retries
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "failed", error="boom again")
    seen = store.claim("a--seed0", attempt=snapshot.get("a--seed0", 0))
    assert seen.status == "ran" and seen.owner == other
    fresh = store.attempts()  # a later invocation retries it
    assert store.claim("a--seed0", attempt=fresh["a--seed0"]).status == "claimed"


def test_a_failed_record_never_replaces_a_done_row(tmp_path):
    store = ResultsStore(tmp_path)
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "done", METRICS)
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "failed", error="late loser")
    row = store.get("a--seed0")
    assert row.status == "done" and row.error is None and row.test == METRICS["test"]


def test_a_file_that_is_not_a_database_is_one_line_naming_it(tmp_path):
    path = tmp_path / "results.sqlite"
    path.write_bytes(b"\x00not a database\xff" * 300)
    with pytest.raises(StoreError) as info:
        ResultsStore(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and "move it away" in message
    assert isinstance(info.value, RunFileError)


@pytest.mark.parametrize(
    ("column", "text", "problem"),
    [
        ("test_json", '{"accuracy": 0.', "invalid JSON in test_json"),
        ("attention_json", "[1, 2]", "attention_json holds list"),
        ("dev_json", '{"accuracy": "high"}', "not a number"),
    ],
)
def test_a_damaged_row_is_one_line_naming_the_file_and_the_run(tmp_path, column, text, problem):
    store = ResultsStore(tmp_path)
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "done", METRICS)
    con = sqlite3.connect(store.path)
    con.execute(f"UPDATE runs SET {column} = ? WHERE run_id = 'a--seed0'", (text,))
    con.commit()
    con.close()
    for read in (store.runs, store.summary, lambda: store.get("a--seed0")):
        with pytest.raises(StoreError, match=problem) as info:
            read()
        assert str(store.path) in str(info.value) and "'a--seed0'" in str(info.value)
        assert "\n" not in str(info.value)
