"""The results store of an ablation: one SQLite file, one row per run.

Every run is committed the moment it finishes, so an interrupted ablation loses nothing and
resumes where it stopped (:func:`attnlab.lab.ablation.run_ablation` skips the run ids whose
status is ``"done"``). The database is in WAL mode with a busy timeout, so several processes
(local workers, a Ray driver, a report reading while an ablation writes) may open it at once.

Schema (table ``runs``)::

    run_id          TEXT PRIMARY KEY   f"{spec_slug(spec)}--seed{seed}"
    task            TEXT               registered task name
    label           TEXT               spec_label(spec): the mechanism's name in tables
    attention_json  TEXT               the attention spec as JSON
    seed            INTEGER
    status          TEXT               "done" | "failed"
    dev_json        TEXT               {metric: float} on the dev split (best epoch)
    test_json       TEXT               {metric: float} on the test split
    cost_json       TEXT               cost.json of the run (parameters, seconds, ...)
    run_dir         TEXT               the run directory
    finished        TEXT               ISO time the row was written (UTC)
    error           TEXT               the error of a failed run (else NULL)

Recording a run id again replaces its row (a failed run retried and done), so a run id
appears at most once; a ``"failed"`` record never replaces a ``"done"`` row (a done run
stays done).

Claims (table ``claims``) let several ablation processes share one directory without
training a run twice: a process claims a run (:meth:`ResultsStore.claim`, one transaction)
right before it starts it, and recording the run releases the claim. A claim names its
owner (process id, host, process start time); the claim of an owner that died on this host
is stale and taken over, one held on another host is respected. Each claim counts an
``attempt``, so a process that saw a failed run when it started does not retry it again
after another process already did.

A damaged database file or row raises :class:`StoreError` (a
:class:`~attnlab.lab.checkpoint.RunFileError`): one line naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from attnlab._checks import check_path
from attnlab.lab._process import Owner
from attnlab.lab.checkpoint import RunFileError
from attnlab.lab.files import utc_now
from attnlab.lab.seed_stats import mean_std
from attnlab.lab.task import spec_label

__all__ = [
    "JSON_COLUMNS",
    "SCHEMA",
    "Claim",
    "MechanismSummary",
    "ResultsStore",
    "RunRecord",
    "StoreError",
    "json_column",
    "mean_std",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id         TEXT PRIMARY KEY,
    task           TEXT NOT NULL,
    label          TEXT NOT NULL,
    attention_json TEXT NOT NULL,
    seed           INTEGER NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('done', 'failed')),
    dev_json       TEXT,
    test_json      TEXT,
    cost_json      TEXT,
    run_dir        TEXT,
    finished       TEXT NOT NULL,
    error          TEXT
)
"""
CLAIMS_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    run_id   TEXT PRIMARY KEY,
    pid      INTEGER NOT NULL,
    host     TEXT NOT NULL,
    start    TEXT NOT NULL,
    claimed  TEXT NOT NULL,
    active   INTEGER NOT NULL,
    attempt  INTEGER NOT NULL
)
"""
STATUSES = ("done", "failed")
#: How long a writer waits for another one's lock before giving up (milliseconds).
BUSY_TIMEOUT_MS = 60_000


def _retry_while_locked(statement: Callable[[], object]) -> None:
    """Run ``statement`` again while SQLite answers "database is locked", for up to
    :data:`BUSY_TIMEOUT_MS`. Switching to WAL takes an exclusive lock and SQLite answers
    at once, without its busy handler, when another connection holds the file: N
    processes opening a new store together failed so, at once, about one time in ten."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            statement()
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


class StoreError(RunFileError):
    """The results store is not a readable SQLite database of the expected layout, or one
    of its rows is damaged."""


@dataclass(frozen=True)
class Claim:
    """What :meth:`ResultsStore.claim` found.

    ``status``: ``"claimed"`` (the caller owns the run now and should train it),
    ``"done"`` (already done), ``"busy"`` (``owner``, a live process or one on another
    host, trains it) or ``"ran"`` (another process, ``owner``, ran it since the caller's
    ``attempt`` snapshot: its row is failed, or it is being retried).
    """

    status: str
    owner: Owner | None = None


@dataclass
class RunRecord:
    """One row of the store, decoded."""

    run_id: str
    task: str
    label: str
    spec: dict[str, Any]
    seed: int
    status: str
    dev: dict[str, float]
    test: dict[str, float]
    cost: dict[str, Any]
    run_dir: str | None
    finished: str
    error: str | None


@dataclass
class MechanismSummary:
    """Mean and sample standard deviation (ddof=1) of every test metric over the done runs of
    one mechanism (label).

    ``mean[m]`` is ``None`` when no done run has a finite value of ``m``; ``std[m]`` is
    ``None`` with fewer than two such values (a sample standard deviation needs two). A
    value a run could not compute (``None``, NaN) is left out, as in the report
    (:func:`attnlab.lab.seed_stats.mean_std`). ``failed`` counts failed runs, which are
    not part of the statistics.
    """

    label: str
    spec: dict[str, Any]
    n: int
    failed: int = 0
    seeds: list[int] = field(default_factory=list)
    mean: dict[str, float | None] = field(default_factory=dict)
    std: dict[str, float | None] = field(default_factory=dict)
    cost: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Every field, by name (copies of the containers)."""
        return asdict(self)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _metric_values(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """Metrics as floats; a metric the run could not compute (None in metrics.json, e.g.
    METEOR without NLTK, or a NaN written as null) stays None."""
    return {k: None if v is None else float(v) for k, v in metrics.items()}


def _loads(text: str | None, default: Any) -> Any:
    return default if text is None else json.loads(text)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


#: The JSON columns of a row of the ``runs`` table.
JSON_COLUMNS = ("attention_json", "dev_json", "test_json", "cost_json")


def json_column(column: str, text: str | None) -> dict[str, Any]:
    """The object that the JSON column ``column`` of a row holds (``{}`` for NULL); a
    ``ValueError`` naming what is wrong when it is damaged: not JSON, not an object, or (the
    metrics, ``dev_json`` and ``test_json``) a value that is not a number or null. The one
    rule of the store and of every reader of it (``attnlab report``)."""
    try:
        value = _loads(text, {})
    except (TypeError, ValueError) as error:
        raise ValueError(f"invalid JSON in {column} ({' '.join(str(error).split())})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{column} holds {type(value).__name__}, not an object")
    if column in ("dev_json", "test_json") and not all(_is_number(v) for v in value.values()):
        raise ValueError(f"{column} holds a metric that is not a number")
    return value


class ResultsStore:
    """The SQLite results store of one ablation directory (``results.sqlite``).

    Args:
        path: the database file (created with its schema when missing; give it a suffix
            such as ``.sqlite``) or the ablation directory (then ``<dir>/results.sqlite``;
            a path without a suffix that does not exist is taken as a directory).

    One connection is opened per process and thread (lazily), so a store object may be
    shared by threads and survives being pickled into another process.
    """

    FILENAME = "results.sqlite"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        path = check_path(path)
        if path.is_dir() or (not path.exists() and not path.suffix):
            path = path / self.FILENAME  # an ablation directory (made when missing)
        self.path = path
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors():
            conn = self._conn()
            conn.execute(SCHEMA)
            conn.execute(CLAIMS_SCHEMA)
            conn.execute("SELECT run_id, status, test_json FROM runs LIMIT 1").fetchall()

    # ------------------------------------------------------------------ connections

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        # autocommit mode: every statement is its own transaction, committed at once
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            _retry_while_locked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute("PRAGMA synchronous = NORMAL")
        except BaseException:
            conn.close()
            raise
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """SQLite's errors as one-line :class:`StoreError` naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            if isinstance(err, sqlite3.OperationalError) and "locked" in reason:
                raise StoreError(
                    f"{self.path}: {reason} (another process held it for "
                    f"{BUSY_TIMEOUT_MS // 1000} s); try again"
                ) from None
            raise StoreError(
                f"{self.path} is not a readable results store ({reason}); move it away to "
                "start afresh (finished run directories are recorded again) or restore it"
            ) from None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``: taken before reading, so a
        read-then-write is atomic among processes)."""
        with self._errors():
            conn = self._conn()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's write lock while the caller reads and writes files beside it:
        the other processes' writes, and their own ``locked()`` blocks, wait for it (up to
        the busy timeout, then :class:`StoreError`). :func:`attnlab.lab.ablation.run_ablation`
        checks and writes ``ablation.json`` under it, so N ablations started together on one
        directory take their turns instead of overwriting each other's record."""
        with self._transaction():
            yield

    def close(self) -> None:
        """Close this thread's connection (a later call opens a new one)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            conn.close()
        self._local.conn = None

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"ResultsStore({str(self.path)!r})"

    # ------------------------------------------------------------------ writing

    def record(
        self,
        run_id: str,
        task: str,
        spec: Mapping[str, Any],
        seed: int,
        status: str,
        metrics: Mapping[str, Any] | None = None,
        cost: Mapping[str, Any] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        error: str | None = None,
    ) -> None:
        """Insert or replace the row of ``run_id`` and commit it at once; release the
        run's claim in the same transaction.

        ``metrics`` is the run's ``metrics.json`` (``{"dev": {...}, "test": {...}, ...}``);
        a flat ``{metric: value}`` dict is taken as the test metrics. A ``"failed"``
        record leaves a ``"done"`` row as it is.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        metrics = dict(metrics or {})
        if "dev" in metrics or "test" in metrics:
            dev, test = metrics.get("dev") or {}, metrics.get("test") or {}
        else:
            dev, test = {}, metrics
        row = (
            str(run_id),
            str(task),
            spec_label(spec),
            json.dumps(dict(spec), sort_keys=True),
            int(seed),
            status,
            _dumps(_metric_values(dev)),
            _dumps(_metric_values(test)),
            _dumps(dict(cost) if cost is not None else None),
            None if run_dir is None else str(run_dir),
            utc_now(),
            error,
        )
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO runs (run_id, task, label, attention_json, seed, status, "
                "dev_json, test_json, cost_json, run_dir, finished, error) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET task = excluded.task, "
                "label = excluded.label, attention_json = excluded.attention_json, "
                "seed = excluded.seed, status = excluded.status, dev_json = excluded.dev_json, "
                "test_json = excluded.test_json, cost_json = excluded.cost_json, "
                "run_dir = excluded.run_dir, finished = excluded.finished, "
                "error = excluded.error "
                "WHERE runs.status != 'done' OR excluded.status = 'done'",
                row,
            )
            conn.execute("UPDATE claims SET active = 0 WHERE run_id = ?", (str(run_id),))

    # ------------------------------------------------------------------ claims

    def attempts(self) -> dict[str, int]:
        """How many times each run id was claimed so far (a snapshot for :meth:`claim`)."""
        with self._errors():
            rows = self._conn().execute("SELECT run_id, attempt FROM claims").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def claim(self, run_id: str, owner: Owner | None = None, attempt: int | None = None) -> Claim:
        """Claim ``run_id`` for ``owner`` (default: this process), atomically.

        The claim is refused when the run is done, when a live process (or one on another
        host) holds it, or, given ``attempt`` (the run's count in an :meth:`attempts`
        snapshot), when another process claimed it since that snapshot and is finished with
        it. A claim whose owner died on this host is taken over. See :class:`Claim`.
        """
        owner = owner or Owner.this_process()
        with self._transaction() as conn:
            row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None and row[0] == "done":
                return Claim("done")
            held = conn.execute(
                "SELECT pid, host, start, active, attempt FROM claims WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            count = 0
            if held is not None:
                pid, host, start, active, count = held
                holder = Owner(int(pid), str(host), str(start))
                if active and holder == owner:
                    return Claim("claimed", owner)
                stale = bool(active) and holder.alive() is False
                if active and not stale:
                    return Claim("busy", holder)
                if not stale and attempt is not None and int(count) != int(attempt):
                    return Claim("ran", holder)
            conn.execute(
                "INSERT OR REPLACE INTO claims (run_id, pid, host, start, claimed, active, "
                "attempt) VALUES (?, ?, ?, ?, ?, 1, ?)",
                (run_id, owner.pid, owner.host, owner.start, utc_now(), int(count) + 1),
            )
        return Claim("claimed", owner)

    def release(self, run_id: str | None = None, owner: Owner | None = None) -> None:
        """Release the claims of ``owner`` (default: this process): of ``run_id``, or all
        of them when None."""
        owner = owner or Owner.this_process()
        sql = "UPDATE claims SET active = 0 WHERE pid = ? AND host = ? AND start = ?"
        args: tuple = (owner.pid, owner.host, owner.start)
        if run_id is not None:
            sql += " AND run_id = ?"
            args += (run_id,)
        with self._transaction() as conn:
            conn.execute(sql, args)

    def claims(self) -> dict[str, Owner]:
        """The run ids claimed now, with their owners (live or not)."""
        with self._errors():
            rows = (
                self._conn()
                .execute("SELECT run_id, pid, host, start FROM claims WHERE active = 1")
                .fetchall()
            )
        return {r[0]: Owner(int(r[1]), str(r[2]), str(r[3])) for r in rows}

    # ------------------------------------------------------------------ reading

    def _decode(self, row: tuple) -> RunRecord:
        (run_id, task, label, attention, seed, status, dev, test, cost, run_dir, fin, err) = row
        texts = dict(zip(JSON_COLUMNS, (attention, dev, test, cost), strict=True))
        values = {column: self._json_field(run_id, column, text) for column, text in texts.items()}
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise StoreError(
                f"{self.path}: the row of run {run_id!r} is damaged: seed {seed!r} is not an int"
            ) from None
        spec, dev, test, cost = values.values()
        return RunRecord(
            run_id, task, label, spec, seed, status, dev, test, cost, run_dir, fin, err
        )

    def _json_field(self, run_id: str, column: str, text: str | None) -> dict[str, Any]:
        """The object of a JSON column of the row of ``run_id`` (``{}`` for NULL); a damaged
        one raises :class:`StoreError` naming the row and how to drop it."""
        try:
            return json_column(column, text)
        except ValueError as error:
            problem = str(error)
        raise StoreError(
            f"{self.path}: the row of run {run_id!r} is damaged: {problem}; delete it "
            f'to run that run again (sqlite3 {self.path} "DELETE FROM runs WHERE '
            f"run_id = '{run_id}'\")"
        )

    _COLUMNS = (
        "run_id, task, label, attention_json, seed, status, dev_json, test_json, cost_json, "
        "run_dir, finished, error"
    )

    def get(self, run_id: str) -> RunRecord | None:
        """The row of ``run_id`` (None when it was never recorded)."""
        with self._errors():
            row = (
                self._conn()
                .execute(f"SELECT {self._COLUMNS} FROM runs WHERE run_id = ?", (run_id,))
                .fetchone()
            )
        return None if row is None else self._decode(row)

    def runs(self, status: str | None = None) -> list[RunRecord]:
        """All rows (with one ``status``), in the order they were first recorded."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES} or None, got {status!r}")
        sql = f"SELECT {self._COLUMNS} FROM runs"
        args: tuple = ()
        if status is not None:
            sql += " WHERE status = ?"
            args = (status,)
        with self._errors():
            rows = self._conn().execute(sql + " ORDER BY rowid", args).fetchall()
        return [self._decode(r) for r in rows]

    def done_ids(self) -> set[str]:
        """The run ids whose status is ``"done"`` (an ablation skips them when resuming)."""
        with self._errors():
            rows = self._conn().execute("SELECT run_id FROM runs WHERE status = 'done'")
            return {r[0] for r in rows}

    def __len__(self) -> int:
        with self._errors():
            return self._conn().execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    def summary(
        self,
        metric: str | None = None,
        *,
        higher_is_better: bool = True,
        labels: Iterable[str] | None = None,
    ) -> dict[str, MechanismSummary]:
        """Per mechanism (label): the number of done runs and mean +- sample std (ddof=1) of
        every test metric, plus the mean cost (parameters, train_seconds, ...).

        Args:
            metric: sort the mechanisms by this test metric's mean (best first, mechanisms
                without a value last); None keeps the order in which they were recorded.
            higher_is_better: the direction of ``metric``.
            labels: only these mechanisms, in this order (one without runs gets ``n=0``).
        """
        records = self.runs()
        groups: dict[str, list[RunRecord]] = {}
        for rec in records:
            groups.setdefault(rec.label, []).append(rec)
        order = list(labels) if labels is not None else list(groups)
        out: dict[str, MechanismSummary] = {}
        for label in order:
            recs = groups.get(label, [])
            done = [r for r in recs if r.status == "done"]
            names: list[str] = []
            for r in done:
                names += [m for m in r.test if m not in names]
            costs: list[str] = []
            for r in done:
                costs += [
                    k
                    for k, v in r.cost.items()
                    if k not in costs and isinstance(v, (int, float)) and not isinstance(v, bool)
                ]
            summary = MechanismSummary(
                label=label,
                spec=recs[0].spec if recs else {},
                n=len(done),
                failed=sum(r.status == "failed" for r in recs),
                seeds=sorted(r.seed for r in done),
            )
            for m in names:
                stats = mean_std(r.test[m] for r in done if m in r.test)
                summary.mean[m], summary.std[m] = stats.mean, stats.std
            for k in costs:
                values = [r.cost[k] for r in done if isinstance(r.cost.get(k), (int, float))]
                summary.cost[k] = mean_std(values).mean
            out[label] = summary
        if metric is not None:
            sign = -1.0 if higher_is_better else 1.0

            def key(item: tuple[str, MechanismSummary]) -> tuple[int, float]:
                value = item[1].mean.get(metric)
                return (1, 0.0) if value is None else (0, sign * value)

            out = dict(sorted(out.items(), key=key))
        return out
