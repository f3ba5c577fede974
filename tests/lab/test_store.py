"""The SQLite results store: schema, record/get/runs/done_ids, summary statistics (checked
against hand-computed means and sample standard deviations), replacement of a retried run,
and concurrent writers in several processes."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3

import pytest

from attnlab.lab.store import ResultsStore, StoreError, mean_std

METRICS = {"primary": "accuracy", "dev": {"accuracy": 0.5}, "test": {"accuracy": 0.25, "f1": 1}}


def test_schema_and_wal(tmp_path):
    store = ResultsStore(tmp_path / "results.sqlite")
    con = sqlite3.connect(tmp_path / "results.sqlite")
    columns = [row[1] for row in con.execute("PRAGMA table_info(runs)")]
    assert columns == [
        "run_id",
        "task",
        "label",
        "attention_json",
        "seed",
        "status",
        "dev_json",
        "test_json",
        "cost_json",
        "run_dir",
        "finished",
        "error",
    ]
    pk = [row[1] for row in con.execute("PRAGMA table_info(runs)") if row[5]]
    assert pk == ["run_id"]
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    store.close()


def test_directory_path_means_results_sqlite(tmp_path):
    ResultsStore(tmp_path).record("a--seed0", "toy", {"name": "mean"}, 0, "done", METRICS)
    assert (tmp_path / "results.sqlite").is_file()
    ResultsStore(tmp_path / "new" / "abl")  # a missing path without suffix: a directory
    assert (tmp_path / "new" / "abl" / "results.sqlite").is_file()
    ResultsStore(tmp_path / "other.db")
    assert (tmp_path / "other.db").is_file()


def test_record_is_committed_at_once_and_read_back(tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    spec = {"score": "additive", "align": "soft"}
    store.record(
        "x--seed3", "toy", spec, 3, "done", METRICS, {"parameters": 7}, tmp_path / "run", None
    )
    # another connection sees the row without any explicit commit or close
    con = sqlite3.connect(tmp_path / "r.sqlite")
    row = con.execute("SELECT label, attention_json, seed, test_json FROM runs").fetchone()
    con.close()
    assert row[0] == "align=soft,score=additive"
    assert json.loads(row[1]) == spec
    assert row[2] == 3
    assert json.loads(row[3]) == {"accuracy": 0.25, "f1": 1.0}
    rec = store.get("x--seed3")
    assert rec.status == "done" and rec.seed == 3 and rec.spec == spec
    assert rec.dev == {"accuracy": 0.5}
    assert rec.cost == {"parameters": 7}
    assert rec.run_dir == str(tmp_path / "run")
    assert rec.error is None and rec.finished
    assert store.get("missing") is None


def test_flat_metrics_are_test_metrics(tmp_path):
    store = ResultsStore(tmp_path)
    store.record("a", "toy", {"name": "mean"}, 0, "done", {"accuracy": 0.75})
    assert store.get("a").test == {"accuracy": 0.75}
    assert store.get("a").dev == {}


def test_a_metric_that_could_not_be_computed_is_kept_as_none(tmp_path):
    # metrics.json writes a metric the run could not compute (METEOR without NLTK: NaN)
    # as null; recording it used to fail with float(None) and stop the ablation
    store = ResultsStore(tmp_path)
    metrics = {"dev": {"bleu": 4.5, "meteor": None}, "test": {"bleu": 4.0, "meteor": None}}
    store.record("a", "translation", {"name": "mean"}, 0, "done", metrics)
    assert store.get("a").test == {"bleu": 4.0, "meteor": None}
    assert store.get("a").dev == {"bleu": 4.5, "meteor": None}
    assert mean_std([None, 2.0, None, 4.0]) == (3.0, pytest.approx(2**0.5), 2)
    assert mean_std([None]) == (None, None, 0)


def test_bad_status_is_refused(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(ValueError, match="status"):
        store.record("a", "toy", {}, 0, "running")
    with pytest.raises(ValueError, match="status"):
        store.runs("maybe")


def test_retry_replaces_the_row(tmp_path):
    store = ResultsStore(tmp_path)
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "failed", error="boom")
    store.record("b--seed0", "toy", {"name": "tanh"}, 0, "done", METRICS)
    assert store.done_ids() == {"b--seed0"}
    assert [r.run_id for r in store.runs("failed")] == ["a--seed0"]
    assert store.get("a--seed0").error == "boom"
    store.record("a--seed0", "toy", {"name": "mean"}, 0, "done", METRICS)
    assert len(store) == 2
    assert store.done_ids() == {"a--seed0", "b--seed0"}
    assert store.runs("failed") == []
    assert store.get("a--seed0").error is None


def test_summary_per_label(tmp_path):
    store = ResultsStore(tmp_path)
    tanh = {"name": "tanh"}
    for seed, acc in enumerate([0.6, 0.8]):
        store.record(
            f"tanh--seed{seed}",
            "toy",
            tanh,
            seed,
            "done",
            {"test": {"accuracy": acc, "loss": 1.0}},
            {"parameters": 10, "train_seconds": 2.0 + seed},
        )
    store.record("mean--seed0", "toy", {"name": "mean"}, 0, "done", {"test": {"accuracy": 0.9}})
    store.record("mean--seed1", "toy", {"name": "mean"}, 1, "failed", error="x")
    store.record("hard--seed0", "toy", {"name": "hard"}, 0, "failed", error="y")
    summary = store.summary()
    assert list(summary) == ["tanh", "mean", "hard"]
    s = summary["tanh"]
    assert (s.n, s.failed, s.seeds) == (2, 0, [0, 1])
    assert s.mean["accuracy"] == pytest.approx(0.7)
    # sample std of 0.6, 0.8: sqrt((0.01 + 0.01) / 1)
    assert s.std["accuracy"] == pytest.approx(0.02**0.5)
    assert s.mean["loss"] == 1.0 and s.std["loss"] == 0.0
    assert s.cost == {"parameters": 10, "train_seconds": 2.5}
    one = summary["mean"]  # one done run: a mean, no sample std; the failed one not counted
    assert (one.n, one.failed, one.mean, one.std) == (1, 1, {"accuracy": 0.9}, {"accuracy": None})
    none = summary["hard"]  # no done run
    assert (none.n, none.failed, none.mean, none.std) == (0, 1, {}, {})

    ranked = store.summary("accuracy")
    assert list(ranked) == ["mean", "tanh", "hard"]  # best first, no value last
    assert list(store.summary("accuracy", higher_is_better=False)) == ["tanh", "mean", "hard"]
    only = store.summary(labels=["mean", "dot"])
    assert list(only) == ["mean", "dot"] and only["dot"].n == 0
    assert only["mean"].to_json()["mean"] == {"accuracy": 0.9}


def test_pickled_store_opens_its_own_connection(tmp_path):
    import pickle

    store = ResultsStore(tmp_path)
    store.record("a", "toy", {"name": "mean"}, 0, "done", METRICS)
    clone = pickle.loads(pickle.dumps(store))
    assert clone.done_ids() == {"a"}


def _writer(path: str, worker: int, n: int) -> None:
    store = ResultsStore(path)
    for i in range(n):
        store.record(
            f"w{worker}--seed{i}", "toy", {"name": f"w{worker}"}, i, "done", {"accuracy": i}
        )
    store.close()


def test_concurrent_writers(tmp_path):
    path = str(tmp_path / "results.sqlite")
    ResultsStore(path).close()
    # spawn, not fork: a child forked from this process (which has run torch.compile and
    # other threaded code by now) may inherit a lock held by another thread and hang; it
    # did once in CI (two writers still running after 60 s). Each child opens its own
    # connection.
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    for p in procs:
        if p.is_alive():  # never leave a writer behind, whatever the assertion says
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    store = ResultsStore(path)
    assert store.done_ids() == {f"w{w}--seed{i}" for w in range(3) for i in range(25)}
    summary = store.summary()
    assert {k: v.n for k, v in summary.items()} == {"w0": 25, "w1": 25, "w2": 25}


def test_summary_leaves_out_values_a_run_could_not_compute(tmp_path):
    store = ResultsStore(tmp_path)
    for seed, meteor in enumerate([0.3, None, float("nan"), 0.5]):
        metrics = {"test": {"bleu": 10.0 + seed, "meteor": meteor}}
        store.record(f"a--seed{seed}", "translation", {"name": "a"}, seed, "done", metrics)
    s = store.summary()["a"]
    assert s.n == 4 and s.mean["bleu"] == 11.5
    assert s.mean["meteor"] == pytest.approx(0.4)  # the two computed values, not NaN
    assert s.std["meteor"] == pytest.approx(0.02**0.5)


def test_the_store_path_expands_home_and_refuses_what_is_no_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ResultsStore("~/abl").path == tmp_path / "abl" / ResultsStore.FILENAME
    assert (tmp_path / "abl" / ResultsStore.FILENAME).is_file()
    with pytest.raises(TypeError, match="path must be a path"):
        ResultsStore(3)


def test_a_new_store_waits_for_another_connection_that_holds_the_file(tmp_path):
    """Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once (no busy handler) while another connection holds the file's write lock
    (it is making the file): N ablations started together on a new directory failed so,
    about one time in ten. The store now waits for the lock like any other write."""
    import threading

    path = tmp_path / "results.sqlite"
    other = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE made_first (x)")  # a file not in WAL mode yet ...
    other.execute("BEGIN IMMEDIATE")  # ... whose write lock another process holds
    threading.Timer(0.3, lambda: other.execute("COMMIT")).start()
    store = ResultsStore(path)  # waits about 0.3 s instead of failing
    store.record("a--seed0", "toy", {"name": "a"}, 0, "done", {"accuracy": 1.0})
    assert store.done_ids() == {"a--seed0"}
    store.close()
    other.close()


def test_stores_opened_together_on_a_new_file_all_open(tmp_path):
    """Four threads open one new store at once, fifty times over (each its own
    connection, as processes would): every one opens."""
    import threading

    errors: list[str] = []

    def open_store(path):
        try:
            ResultsStore(path).close()
        except StoreError as error:
            errors.append(str(error))

    for trial in range(50):
        path = tmp_path / f"r{trial}.sqlite"
        threads = [threading.Thread(target=open_store, args=(path,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert errors == []


def test_locked_holds_the_other_writers_back(tmp_path):
    """While one connection is inside ``locked()``, another store's write waits for it."""
    import threading
    import time

    store = ResultsStore(tmp_path)
    order: list[str] = []

    def write():
        other = ResultsStore(tmp_path)
        other.record("b--seed0", "toy", {"name": "b"}, 0, "done", {"accuracy": 0.5})
        order.append("written")
        other.close()

    with store.locked():
        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(0.3)
        order.append("released")
    writer.join(60)
    assert order == ["released", "written"]
    assert store.done_ids() == {"b--seed0"}
