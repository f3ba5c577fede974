"""Reading a run or an ablation directory into the report's data (:class:`ReportData`).

The report reads the documented layouts (``docs/lab/report.md``) and nothing else: a *run
directory* (``run.json``, ``metrics.json``, ``history.json``, ``cost.json``,
``examples.json``), an *ablation directory* (``ablation.json``, ``results.sqlite``,
``runs/<run_id>/``) or a *folder of run directories* (``attnlab train``'s
``runs/<task>/``). The store is read with the standard library's :mod:`sqlite3`, not
through :mod:`attnlab.lab.store`, so a report can be written for results produced by
another version of the library.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab._checks import check_path
from attnlab.lab.ablation_record import RECORD_NAME, AblationRecordError, read_ablation_record
from attnlab.lab.store import JSON_COLUMNS, json_column
from attnlab.lab.task import lower_is_better, spec_label

__all__ = [
    "ReportData",
    "ReportError",
    "RunRecord",
    "load_report_data",
    "read_json",
    "spec_text",
    "unique",
]


class ReportError(ValueError):
    """The directory is not a run or an ablation directory (or its files are unreadable)."""


def unique(values: Iterable[Any]) -> list[Any]:
    """``values`` without repeats, in order of first appearance."""
    return list(dict.fromkeys(values))


def _first_text(values: Iterable[Any]) -> str | None:
    """The first true value as text (None when there is none)."""
    return next((str(v) for v in values if v), None)


def spec_text(spec: Any) -> str:
    """The label of an attention spec (:func:`attnlab.lab.task.spec_label`); anything that
    is not a mapping as its text."""
    return spec_label(spec) if isinstance(spec, Mapping) else str(spec)


@dataclass
class RunRecord:
    """One run as read from its directory (and the results store, when there is one)."""

    run_id: str
    label: str
    seed: int | None
    status: str  # "done", "failed", or whatever the store says (e.g. "running")
    run_dir: Path | None = None
    run: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"


@dataclass
class ReportData:
    """Everything the sections draw from: the runs and the ablation's description."""

    root: Path
    kind: str  # "run", "ablation" or "run folder" (a folder of run directories)
    ablation: dict[str, Any]
    runs: list[RunRecord]
    #: run directories that could not be read: (run id, why), one line each
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def done(self) -> list[RunRecord]:
        return [r for r in self.runs if r.done]

    @property
    def not_done(self) -> list[RunRecord]:
        return [r for r in self.runs if not r.done]

    @property
    def task(self) -> str | None:
        """The ablation's task, else the first run's that names one."""
        return _first_text([self.ablation.get("task"), *(r.run.get("task") for r in self.runs)])

    @property
    def labels(self) -> list[str]:
        """Mechanism labels: the grid's order first, then any others in order of appearance."""
        present = {r.label for r in self.runs}
        grid = [spec_text(spec) for spec in self.ablation.get("grid") or []]
        return unique([x for x in grid if x in present] + [r.label for r in self.runs])

    def runs_of(self, label: str, *, done_only: bool = True) -> list[RunRecord]:
        runs = [r for r in self.runs if r.label == label and (r.done or not done_only)]
        return sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.run_id))

    @property
    def primary(self) -> str | None:
        """The primary metric of the first finished run that names one."""
        return _first_text(r.metrics.get("primary") for r in self.done)

    @property
    def test_metrics(self) -> list[str]:
        """Test metric names: the primary first, then in the order the runs list them."""
        names = unique(name for r in self.done for name in (r.metrics.get("test") or {}).keys())
        primary = self.primary
        if primary in names:
            names.remove(primary)
            names.insert(0, primary)
        return names

    def higher_is_better(self, metric: str) -> bool:
        """Direction of a metric: ``metrics.json``'s ``higher_is_better`` (a bool for the
        primary metric, or a ``{metric: bool}`` dict); for other metrics read from the name
        (:func:`attnlab.lab.task.lower_is_better`: loss, error, perplexity, AER, WER, PER,
        MSE, ... are lower-is-better)."""
        for r in self.done:
            hib = r.metrics.get("higher_is_better")
            if isinstance(hib, Mapping) and metric in hib:
                return bool(hib[metric])
            if isinstance(hib, bool) and metric == r.metrics.get("primary"):
                return hib
        return not lower_is_better(metric)


# ----------------------------------------------------------------------------- files


def read_json(path: Path, default: Any) -> Any:
    """The JSON value of ``path`` (``default`` when there is no such file);
    :class:`ReportError` naming the file when it cannot be read."""
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ReportError(f"cannot read {path}: {err}") from err


def _read_typed(path: Path, default: Any, kind: type) -> Any:
    """:func:`read_json` of a file that must hold a JSON object (``kind=dict``) or array
    (``kind=list``); anything else raises :class:`ReportError` naming the file."""
    value = read_json(path, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "an array"
        raise ReportError(
            f"{path} holds a JSON {type(value).__name__}, not {expected} (a damaged file?)"
        )
    return value


def _read_run_dir(run_dir: Path, run_id: str | None = None) -> RunRecord:
    """One run directory; :class:`ReportError` (one line, naming the file) when one of its
    JSON files is unreadable or of the wrong type."""
    run = _read_typed(run_dir / "run.json", {}, dict)
    label = run.get("label")
    if label is None:
        label = spec_text(run.get("attention") or {})
    metrics = _read_typed(run_dir / "metrics.json", {}, dict)
    status = str(run.get("status") or ("done" if metrics else "unknown"))
    error = run.get("error")
    if status == "done" and not (metrics.get("test") or metrics.get("dev")):
        status, error = "failed", error or "metrics.json is missing or empty"
    examples = _read_typed(run_dir / "examples.json", [], list)
    history = _read_typed(run_dir / "history.json", [], list)
    return RunRecord(
        run_id=run_id or run_dir.name,
        label=str(label),
        seed=run.get("seed"),
        status=status,
        run_dir=run_dir,
        run=run,
        metrics=metrics,
        history=[h for h in history if isinstance(h, dict)],
        cost=_read_typed(run_dir / "cost.json", {}, dict),
        examples=[e for e in examples if isinstance(e, dict)],
        error=None if error is None else str(error),
    )


def _one_line(error: BaseException) -> str:
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    return lines[0] if lines else type(error).__name__


def _run_of_single_dir(root: Path) -> ReportData:
    """A run directory as a one-run report (its ``run.json`` stands in for the ablation's
    description)."""
    record = _read_run_dir(root)
    ablation = {
        "task": record.run.get("task"),
        "task_options": record.run.get("task_options", {}),
        "grid": [record.run.get("attention", {})],
        "seeds": [record.seed],
        "created": record.run.get("started"),
    }
    return ReportData(root=root, kind="run", ablation=ablation, runs=[record])


# ----------------------------------------------------------------------------- the store


def _loads(text: Any) -> Any:
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


def _row_problem(row: Mapping[str, Any]) -> str | None:
    """What is damaged in a row of ``results.sqlite`` (the store's own rule,
    :func:`attnlab.lab.store.json_column`), None when it reads."""
    for column in JSON_COLUMNS:
        text = row.get(column)
        try:
            json_column(column, None if text == "" else text)
        except ValueError as error:
            return str(error)
    return None


def _store_metrics(row: Mapping[str, Any]) -> dict[str, Any]:
    """The dev and test metrics of a finished run's row in ``results.sqlite``."""
    return {"dev": _loads(row.get("dev_json")) or {}, "test": _loads(row.get("test_json")) or {}}


def _store_record(run_id: str, row: Mapping[str, Any]) -> RunRecord:
    """A run known only from its row in ``results.sqlite``."""
    status = str(row.get("status") or "unknown")
    cost = _loads(row.get("cost_json"))
    return RunRecord(
        run_id=run_id,
        label=str(row.get("label") or spec_text(_loads(row.get("attention_json")))),
        seed=row.get("seed"),
        status=status,
        metrics=_store_metrics(row) if status == "done" else {},
        cost=cost if isinstance(cost, dict) else {},
        error=None if row.get("error") is None else str(row["error"]),
    )


def _read_store(path: Path) -> dict[str, dict[str, Any]]:
    """The ``runs`` table of ``results.sqlite`` as {run_id: row}, read with the stdlib.

    Only read, but opened read-write where the file and its folder allow it: a read-only
    connection to a WAL database leaves its ``-wal`` and ``-shm`` files behind, which the
    last read-write connection to close removes."""
    if not path.is_file():
        return {}
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)
    try:
        con = sqlite3.connect(
            f"file:{path}?mode={'rw' if writable else 'ro'}", uri=True, timeout=10.0
        )
    except sqlite3.Error as err:
        raise ReportError(f"cannot open {path}: {err}") from err
    try:
        con.row_factory = sqlite3.Row
        rows = con.execute("SELECT * FROM runs").fetchall()
    except sqlite3.Error as err:
        raise ReportError(f"cannot read the runs table of {path}: {err}") from err
    finally:
        con.close()
    return {str(row["run_id"]): dict(row) for row in rows}


def _merge_store_row(record: RunRecord, row: Mapping[str, Any] | None, has_store: bool) -> None:
    """Let the store's row of a run directory decide its status (and fill in what the
    directory lacks); without a row in an existing store a finished run is unrecorded."""
    if row is None:
        if has_store and record.status == "done":  # the store knows every finished run
            record.status = "unrecorded"
        return
    record.status = str(row.get("status") or record.status)
    if record.status == "done" and not record.metrics:
        record.metrics = _store_metrics(row)
        record.cost = record.cost or _loads(row.get("cost_json")) or {}
    if record.status != "done":
        record.error = record.error or (row.get("error") and str(row["error"]))
    if not record.run and row.get("label"):
        record.label = str(row["label"])
        record.seed = row.get("seed")


# ----------------------------------------------------------------------------- ablations


def _run_dirs(runs_dir: Path) -> list[Path]:
    """The run directories of ``runs/``, sorted; hidden folders are the trainer's
    unfinished work."""
    if not runs_dir.is_dir():
        return []
    return sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _read_runs(
    run_dirs: Iterable[Path],
    store: Mapping[str, Mapping[str, Any]],
    on_warning: Callable[[str], None] | None,
) -> tuple[list[RunRecord], list[tuple[str, str]]]:
    """The runs of ``run_dirs`` (those with a ``run.json`` or a row in ``store``) and the
    (run id, why) of those whose files cannot be read; then the runs ``store`` lists
    without a directory. A damaged row of ``store`` (:func:`_row_problem`) is no record: a
    run directory speaks alone, a run known only from its row is unreadable."""

    def warn(message: str) -> None:
        if on_warning is not None:
            on_warning(message)

    damaged = {run_id: p for run_id, row in store.items() if (p := _row_problem(row)) is not None}
    for run_id, problem in damaged.items():
        warn(f"the row of run {run_id!r} in results.sqlite is damaged: {problem}")
    records: list[RunRecord] = []
    unreadable: list[tuple[str, str]] = []
    for run_dir in run_dirs:
        if not (run_dir / "run.json").is_file() and run_dir.name not in store:
            continue
        row = None if run_dir.name in damaged else store.get(run_dir.name)
        try:
            record = _read_run_dir(run_dir)
        except (ValueError, OSError) as err:  # ReportError, JSON, encoding, a trainer's own
            why = _one_line(err)
            unreadable.append((run_dir.name, why))
            use = "its row in results.sqlite is used" if row else "it is left out"
            warn(f"cannot read the run directory {run_dir}: {why}; {use}")
            continue  # a store row is read below like any run without a directory
        _merge_store_row(record, row, bool(store))
        records.append(record)
    read = {r.run_id for r in records}
    listed = read | {run_id for run_id, _ in unreadable}
    for run_id, row in store.items():
        if run_id not in damaged and run_id not in read:
            records.append(_store_record(run_id, row))
        elif run_id in damaged and run_id not in listed:  # was a finished seed, no metrics
            unreadable.append((run_id, f"its row in results.sqlite is damaged: {damaged[run_id]}"))
    return records, unreadable


def _read_ablation(root: Path, on_warning: Callable[[str], None] | None) -> ReportData:
    try:
        ablation = read_ablation_record(root) if (root / RECORD_NAME).is_file() else {}
    except AblationRecordError as err:
        raise ReportError(str(err)) from None
    store = _read_store(root / "results.sqlite")
    records, unreadable = _read_runs(_run_dirs(root / "runs"), store, on_warning)
    return ReportData(
        root=root,
        kind="ablation",
        ablation=ablation,
        runs=records,
        unreadable=unreadable,
    )


def _shared_setting(records: Sequence[RunRecord], root: Path) -> tuple[Any, dict[str, Any]]:
    """The task and the task options that every run of a folder of run directories shares;
    :class:`ReportError` when they differ (their metrics would be pooled as one setting)."""
    todo = "report one run directory at a time, or compare settings with `attnlab ablate`"
    tasks = unique(r.run.get("task") for r in records)
    if len(tasks) > 1:
        named = ", ".join(str(t) for t in tasks)
        raise ReportError(f"the runs in {root} are of different tasks ({named}): {todo}")
    options = [r.run.get("task_options") or {} for r in records]
    differ = sorted(
        str(key)
        for key in {k for o in options for k in o}
        if len(unique(json.dumps(o.get(key), sort_keys=True, default=str) for o in options)) > 1
    )
    if differ:
        raise ReportError(
            f"the runs in {root} differ in the task option(s) {', '.join(differ)}: {todo}"
        )
    return (tasks[0] if tasks else None), (options[0] if options else {})


def _read_run_folder(root: Path, on_warning: Callable[[str], None] | None) -> ReportData:
    """A folder of run directories (what ``attnlab train TASK --out DIR`` fills, by default
    ``runs/<task>``: one ``<attention>--seed<N>`` per run) read as an ablation without a
    store: one row per attention, mean ± std over its seeds. Its runs must share the task
    and the task options."""
    records, unreadable = _read_runs(_run_dirs(root), {}, on_warning)
    task, options = _shared_setting(records, root)
    specs = {spec_text(r.run.get("attention") or {}): r.run.get("attention") for r in records}
    ablation = {
        "task": task,
        "task_options": options,
        "grid": [spec or {} for spec in specs.values()],
        "seeds": sorted({r.seed for r in records if isinstance(r.seed, int)}),
    }
    return ReportData(
        root=root, kind="run folder", ablation=ablation, runs=records, unreadable=unreadable
    )


def _holds_run_dirs(root: Path) -> bool:
    """Whether ``root`` holds a run directory (a folder with a ``run.json``)."""
    return any((p / "run.json").is_file() for p in _run_dirs(root))


def load_report_data(
    path: str | Path, *, on_warning: Callable[[str], None] | None = None
) -> ReportData:
    """Read a run directory (has ``run.json``), an ablation directory (has
    ``ablation.json`` and/or ``runs/``) or a folder of run directories (what ``attnlab
    train`` fills: read like an ablation without a store, when its runs share the task and
    the task options).

    In an ablation directory the status of every run comes from ``results.sqlite`` when the
    file is there (a run the store lists without a directory is shown as failed or
    unfinished); without the store, every ``runs/*/run.json`` counts with its own status.
    A run directory of an ablation whose files cannot be read (invalid JSON, a
    ``metrics.json`` that is not an object, ...) is skipped: its row in the store is used
    when there is one, it is listed with the failed runs, and ``on_warning`` gets one line
    saying so. An unreadable file of a single run directory raises :class:`ReportError`.
    """
    root = check_path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such directory: {root}")
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory (expected a run or an ablation directory)")
    if (root / "run.json").is_file():
        return _run_of_single_dir(root)
    if (root / "ablation.json").is_file() or (root / "runs").is_dir():
        return _read_ablation(root, on_warning)
    if _holds_run_dirs(root):
        return _read_run_folder(root, on_warning)
    raise ReportError(
        f"{root} is neither a run directory (no run.json) nor an ablation directory "
        "(no ablation.json and no runs/ folder) nor a folder of run directories"
    )
