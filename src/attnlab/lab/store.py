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
appears at most once.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attnlab.lab.task import spec_label

__all__ = ["SCHEMA", "MechanismSummary", "ResultsStore", "RunRecord", "mean_std"]

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
STATUSES = ("done", "failed")
#: How long a writer waits for another one's lock before giving up (milliseconds).
BUSY_TIMEOUT_MS = 60_000


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

    ``mean[m]`` is ``None`` when no run is done; ``std[m]`` is ``None`` with fewer than two
    runs (a sample standard deviation needs two). ``failed`` counts failed runs, which are
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
        return {
            "label": self.label,
            "spec": self.spec,
            "n": self.n,
            "failed": self.failed,
            "seeds": self.seeds,
            "mean": self.mean,
            "std": self.std,
            "cost": self.cost,
        }


def mean_std(values: Iterable[float]) -> tuple[float | None, float | None]:
    """``(mean, sample std with ddof=1)``; ``(None, None)`` for no value, ``(x, None)`` for
    one value."""
    xs = [float(v) for v in values]
    if not xs:
        return None, None
    mean = math.fsum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return mean, math.sqrt(var)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _loads(text: str | None, default: Any) -> Any:
    return default if text is None else json.loads(text)


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
        path = Path(path)
        if path.is_dir() or (not path.exists() and not path.suffix):
            path = path / self.FILENAME  # an ablation directory (made when missing)
        self.path = path
        self._local = threading.local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = self._conn()
        conn.execute(SCHEMA)

    # ------------------------------------------------------------------ connections

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        # autocommit mode: every statement is its own transaction, committed at once
        conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        self._local.conn = conn
        self._local.pid = os.getpid()
        return conn

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
        """Insert or replace the row of ``run_id`` and commit it at once.

        ``metrics`` is the run's ``metrics.json`` (``{"dev": {...}, "test": {...}, ...}``);
        a flat ``{metric: value}`` dict is taken as the test metrics.
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
            _dumps({k: float(v) for k, v in dev.items()}),
            _dumps({k: float(v) for k, v in test.items()}),
            _dumps(dict(cost) if cost is not None else None),
            None if run_dir is None else str(run_dir),
            _now(),
            error,
        )
        self._conn().execute(
            "INSERT OR REPLACE INTO runs (run_id, task, label, attention_json, seed, status, "
            "dev_json, test_json, cost_json, run_dir, finished, error) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            row,
        )

    # ------------------------------------------------------------------ reading

    @staticmethod
    def _decode(row: tuple) -> RunRecord:
        (run_id, task, label, attention, seed, status, dev, test, cost, run_dir, fin, err) = row
        return RunRecord(
            run_id=run_id,
            task=task,
            label=label,
            spec=json.loads(attention),
            seed=int(seed),
            status=status,
            dev=_loads(dev, {}),
            test=_loads(test, {}),
            cost=_loads(cost, {}),
            run_dir=run_dir,
            finished=fin,
            error=err,
        )

    _COLUMNS = (
        "run_id, task, label, attention_json, seed, status, dev_json, test_json, cost_json, "
        "run_dir, finished, error"
    )

    def get(self, run_id: str) -> RunRecord | None:
        """The row of ``run_id`` (None when it was never recorded)."""
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
        return [self._decode(r) for r in self._conn().execute(sql + " ORDER BY rowid", args)]

    def done_ids(self) -> set[str]:
        """The run ids whose status is ``"done"`` (an ablation skips them when resuming)."""
        rows = self._conn().execute("SELECT run_id FROM runs WHERE status = 'done'")
        return {r[0] for r in rows}

    def __len__(self) -> int:
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
                summary.mean[m], summary.std[m] = mean_std(r.test[m] for r in done if m in r.test)
            for k in costs:
                values = [r.cost[k] for r in done if isinstance(r.cost.get(k), (int, float))]
                summary.cost[k] = mean_std(values)[0]
            out[label] = summary
        if metric is not None:
            sign = -1.0 if higher_is_better else 1.0

            def key(item: tuple[str, MechanismSummary]) -> tuple[int, float]:
                value = item[1].mean.get(metric)
                return (1, 0.0) if value is None else (0, sign * value)

            out = dict(sorted(out.items(), key=key))
        return out
