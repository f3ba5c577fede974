"""Ablation studies: one task, a grid of attention specs x seeds, every run recorded in a
results store the moment it finishes, resumable, on local processes or a Ray cluster.

``attnlab ablate sentiment --grid "score=additive,scaled-dot;align=soft,sparsemax"`` trains
the four combinations (plus the ``mean`` and ``uniform`` baselines) with seeds 0, 1, 2 and
prints mean +- sample std of the test metrics per mechanism.

The ablation directory (default ``ablations/<task>``) holds::

    ablation.json    {"task", "task_options", "grid": [specs], "seeds", "executor", "created"}
    results.sqlite   one row per run (see attnlab.lab.store)
    runs/<run_id>/   the run directories (attnlab.lab.training.train_run)

Running the same command again resumes: the run ids already ``"done"`` in the store are
skipped; failed and missing runs are run. A grid or seed list that is a superset of the
recorded one extends the study; anything else (another task, other options, a grid that
drops specs) is refused with what differs. Resuming also removes the work folders of runs
that a killed process left behind (:func:`attnlab.lab.training.remove_stale_work_dirs`).

Several processes may run the same ablation on one directory at once (say, on several
machines' worth of terminals): each run is claimed in the store right before it starts
(:meth:`attnlab.lab.store.ResultsStore.claim`), so every run is trained once; a process
skips the runs another live process holds, and takes over those whose process died.
``ablation.json`` is checked and written under the store's lock
(:meth:`~attnlab.lab.store.ResultsStore.locked`), so processes started together take
their turns: the later one sees the record the earlier one wrote and extends it, or is
refused when its study differs, as if it had been started afterwards.
"""

from __future__ import annotations

import itertools
import json
import numbers
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import torch

from attnlab._checks import ConfigError, check_flags, check_int, check_path, check_seed
from attnlab.lab._process import Owner
from attnlab.lab.ablation_record import AblationRecordError, read_ablation_record
from attnlab.lab.commands import (
    PRECISION_HELP,
    NonEmpty,
    TaskHelpCommand,
    compile_option,
    describe_task_of,
    device_option,
    import_plugins_or_fail,
    plugin_option,
    precision_option,
)
from attnlab.lab.config import (
    check_attention,
    check_option_values,
    check_training_values,
    coerce_value,
    parse_attention,
    parse_options,
    read_structured_file,
    resolve_task,
)
from attnlab.lab.errors import failing_on
from attnlab.lab.executors import (
    EXECUTORS,
    RunJob,
    RunOutcome,
    import_plugins,
    make_executor,
)
from attnlab.lab.files import (
    check_folder,
    check_run_home,
    jsonable,
    make_folder,
    utc_now,
    write_json,
)
from attnlab.lab.progress import ProgressBar
from attnlab.lab.seed_stats import fmt_mean_std
from attnlab.lab.store import MechanismSummary, ResultsStore
from attnlab.lab.task import Task, spec_label, spec_slug
from attnlab.lab.training import (
    build_task_model,
    check_compile_backend,
    remove_stale_work_dirs,
    resolve_device,
    resolve_precision,
)

__all__ = [
    "BASELINES",
    "AblationMismatchError",
    "AblationResult",
    "ablate_command",
    "expand_grid",
    "format_table",
    "parse_options",
    "parse_seeds",
    "parse_spec",
    "run_ablation",
    "run_id",
]

BASELINES: tuple[dict[str, Any], ...] = ({"name": "mean"}, {"name": "uniform"})
_GRID_FILE_SUFFIXES = (".yaml", ".yml", ".toml", ".json")


class AblationMismatchError(ConfigError):
    """An ablation directory holds another study (task, options, grid or seeds)."""


# ----------------------------------------------------------------------------- specs


def parse_spec(text: str | Mapping[str, Any]) -> dict[str, Any]:
    """One attention spec: a dict (copied) or what ``--attention`` takes
    (:func:`attnlab.lab.config.parse_attention`: ``"score=additive,align=soft"``, a preset
    or baseline name, ``"tanh,d_w=32"``, or a YAML/TOML/JSON file holding one spec)."""
    if isinstance(text, Mapping):
        return dict(text)
    spec = parse_attention(str(text))
    if not spec:
        raise ConfigError(f"empty attention spec {text!r}")
    return spec


def parse_seeds(seeds: str | int | Iterable[int] | None = None, num_seeds: int | None = None):
    """Seeds from ``"0,1,2"``, a list, or ``num_seeds`` (``0..n-1``); default ``[0, 1, 2]``."""
    if seeds is not None and num_seeds is not None:
        raise ConfigError("give either seeds or num_seeds, not both")
    if num_seeds is not None:
        return list(range(check_int(num_seeds, "num_seeds")))
    if seeds is None:
        return [0, 1, 2]
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    if isinstance(seeds, str):
        values = _seeds_text(seeds)
    else:
        try:
            values = list(seeds)
        except TypeError:
            raise ConfigError(f"seeds must be integers, got {seeds!r}") from None
        for seed in values:  # 1.5 or True would otherwise become seed 1
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ConfigError(f"seeds must be integers, got {seed!r}")
        values = [int(s) for s in values]
    if not values:
        raise ConfigError("no seeds given")
    for seed in values:  # Python's random takes -1 as 1: two seeds would share its stream
        check_seed(seed, "seeds", minimum=0, error=ConfigError)
    return list(dict.fromkeys(values))


def _seeds_text(text: str) -> list[int]:
    """The seeds of ``"0,1,2"`` (spaces around the commas allowed: ``"0, 1"``); a space
    inside an item (``"0 1"``) is refused, not read as ``01`` or as the last seed."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if len(item.split()) > 1:
            raise ConfigError(
                f"seeds {text!r}: separate the seeds with commas (e.g. "
                f"{','.join(item.split())!r}), not spaces"
            )
        try:
            values.append(int(item))
        except ValueError:
            raise ConfigError(f"seeds must be integers separated by ',', got {text!r}") from None
    return values


def _is_file(text: str) -> bool:
    return text.lower().endswith(_GRID_FILE_SUFFIXES) or (
        "=" not in text and ";" not in text and "," not in text and Path(text).is_file()
    )


def _load_file(path: Path) -> Any:
    return read_structured_file(path, kind="grid/spec file", require_suffix=False)


def _grid_text(text: str) -> list[dict[str, Any]]:
    """``"score=additive,dot;align=soft,sparsemax"`` -> the cartesian product of the axes."""
    axes: dict[str, list[Any]] = {}
    for axis in text.split(";"):
        axis = axis.strip()
        if not axis:
            continue
        key, sep, values = axis.partition("=")
        if not sep:  # "tanh,mean": an axis of preset names
            key, values = "name", axis
        key = key.strip()
        items = [v.strip() for v in values.split(",") if v.strip()]
        bad = [v for v in items if "=" in v]
        if bad or not key:
            raise ConfigError(
                f"grid {text!r}: axis {axis!r} is not key=value1,value2 -- separate the axes "
                "with ';' (e.g. \"score=additive,dot;align=soft,sparsemax\"); give single "
                "specs with --attention"
            )
        if not items:
            raise ConfigError(f"grid {text!r}: axis {key!r} has no values")
        if key in axes:
            raise ConfigError(f"grid {text!r}: axis {key!r} given twice")
        axes[key] = [coerce_value(v) for v in items]
    return _product(axes)


def _product(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    if not axes:
        return []
    keys = list(axes)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in axes.values()]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def _from_loaded(loaded: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(loaded, Mapping):
        for key in ("grid", "attention", "specs"):
            if key in loaded:
                return expand_grid(loaded[key])
        if "axes" in loaded:
            return _product(loaded["axes"])
        if loaded and all(isinstance(v, (list, tuple)) for v in loaded.values()):
            return _product(loaded)
        return [dict(loaded)]
    if isinstance(loaded, (list, tuple)):
        return expand_grid(list(loaded))
    raise ConfigError(f"{where}: expected a list of attention specs, got {type(loaded).__name__}")


def expand_grid(
    grid: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Any] | None,
    *,
    baselines: bool = False,
) -> list[dict[str, Any]]:
    """The list of attention specs of a grid, without duplicates (by :func:`spec_label`),
    in order.

    ``grid`` may be:

    * a grid text ``"score=additive,dot;align=soft,sparsemax"``: ``;`` separates axes,
      ``,`` the values of an axis; the grid is the cartesian product of the axes (an axis
      without ``key=`` is a list of preset names: ``"tanh,mean"``);
    * a YAML/TOML/JSON file: a list of specs (TOML: ``[[grid]]`` tables), or a mapping
      with ``grid``/``attention``/``specs`` (a list) or ``axes`` (a mapping of lists);
    * a mapping of axes ``{"score": ["additive", "dot"], "align": ["soft"]}``;
    * a list whose items are spec dicts, spec texts (``"score=additive,align=soft"``, see
      :func:`parse_spec`) or nested lists / grids.

    With ``baselines=True`` the baselines ``{"name": "mean"}`` and ``{"name": "uniform"}``
    come first (unless already there).

    >>> [spec_label(s) for s in expand_grid("score=additive,dot;align=soft")]
    ['align=soft,score=additive', 'align=soft,score=dot']
    """
    specs = [dict(b) for b in BASELINES] if baselines else []
    specs += _grid_specs(grid)
    unique: dict[str, dict[str, Any]] = {}
    for spec in specs:
        unique.setdefault(spec_label(spec), spec)
    return list(unique.values())


def _grid_specs(grid: Any) -> list[dict[str, Any]]:
    """The specs of a grid in any form :func:`expand_grid` takes (duplicates kept)."""
    if grid is None:
        return []
    if isinstance(grid, os.PathLike):
        return _from_loaded(_load_file(Path(grid)), str(grid))
    if isinstance(grid, str):
        if _is_file(grid.strip()):
            return _from_loaded(_load_file(Path(grid.strip())), grid)
        return _grid_text(grid)
    if isinstance(grid, Mapping):
        if grid and all(isinstance(v, (list, tuple)) for v in grid.values()):
            return _product(grid)
        return _from_loaded(grid, "grid")
    if isinstance(grid, Sequence):
        return [spec for item in grid for spec in _item_specs(item)]
    raise ConfigError(f"grid must be text, a file, a mapping or a list, got {grid!r}")


def _item_specs(item: Any) -> list[dict[str, Any]]:
    """The specs of one item of a grid list: a spec dict, spec text or a nested grid."""
    if isinstance(item, Mapping):
        return [dict(item)]
    if isinstance(item, str):
        return [parse_spec(item)]
    if isinstance(item, (list, tuple)):
        return expand_grid(item)
    raise ConfigError(f"grid item {item!r} is not a spec (dict or text)")


def run_id(spec: Mapping[str, Any], seed: int) -> str:
    """The run id of ``spec`` with ``seed``: ``f"{spec_slug(spec)}--seed{seed}"``."""
    return f"{spec_slug(spec)}--seed{int(seed)}"


# ----------------------------------------------------------------------------- results


@dataclass
class AblationResult:
    """What :func:`run_ablation` returns.

    Attributes:
        out_dir: the ablation directory.
        task: the task name; ``options`` its options (all, after defaults).
        metrics: the task's metric names (``metrics[0]`` is the primary one).
        higher_is_better: the direction of the primary metric.
        summary: per mechanism label, in grid order: n, mean and sample std of every test
            metric (:class:`~attnlab.lab.store.MechanismSummary`).
        ran: run ids trained by this call; ``skipped``: run ids already done;
        recovered: run ids whose finished run directory was found but not in the store;
        failed: run id -> error (first line) of the runs that failed in this call;
        others: run id -> what another process does with it (a run that process trains
            now, or ran and failed, during this call; the store has its result).
    """

    out_dir: Path
    task: str
    options: dict[str, Any]
    grid: list[dict[str, Any]]
    seeds: list[int]
    metrics: tuple[str, ...]
    higher_is_better: bool
    summary: dict[str, MechanismSummary]
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    others: dict[str, str] = field(default_factory=dict)

    @property
    def primary(self) -> str:
        return self.metrics[0]

    @property
    def best(self) -> list[str]:
        """The label(s) with the best mean of the primary metric."""
        return _best(self.summary, self.primary, self.higher_is_better)

    def table(self) -> str:
        return format_table(self.summary, self.metrics, higher_is_better=self.higher_is_better)

    def to_json(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "task": self.task,
            "options": self.options,
            "grid": self.grid,
            "seeds": self.seeds,
            "metrics": list(self.metrics),
            "higher_is_better": self.higher_is_better,
            "summary": {k: v.to_json() for k, v in self.summary.items()},
            "ran": self.ran,
            "skipped": self.skipped,
            "recovered": self.recovered,
            "failed": self.failed,
            "others": self.others,
        }


def _best(summary: Mapping[str, MechanismSummary], metric: str, higher: bool) -> list[str]:
    values = {k: s.mean.get(metric) for k, s in summary.items()}
    values = {k: v for k, v in values.items() if v is not None}
    if not values:
        return []
    target = max(values.values()) if higher else min(values.values())
    return [k for k, v in values.items() if v == target]


def format_table(
    summary: Mapping[str, MechanismSummary],
    metrics: Sequence[str],
    *,
    higher_is_better: bool = True,
) -> str:
    """A plain-text table: mechanism, runs, mean ± sample std of every test metric, the
    parameter count and training seconds; ``*`` marks the best mean of ``metrics[0]``."""
    best = set(_best(summary, metrics[0], higher_is_better)) if metrics else set()
    header = ["mechanism", "n", *[f"test {m}" for m in metrics], "params", "train s"]
    rows = []
    for label, s in summary.items():
        n = str(s.n) + (f" ({s.failed} failed)" if s.failed else "")
        cells = [("* " if label in best else "  ") + label, n]
        cells += [fmt_mean_std(s.mean.get(m), s.std.get(m), "n/a") for m in metrics]
        params = s.cost.get("parameters")
        cells.append("-" if params is None else f"{params:,.0f}")
        secs = s.cost.get("train_seconds")
        cells.append("-" if secs is None else f"{secs:.1f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    numeric = set(range(1, len(header)))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
    if best:
        direction = "highest" if higher_is_better else "lowest"
        out.append(f"* best ({direction} mean test {metrics[0]}); ± is the sample std over seeds")
    return "\n".join(out)


# ----------------------------------------------------------------------------- running


def _record(value: Any) -> Any:
    """``value`` as ``ablation.json`` records it: plain JSON data
    (:func:`attnlab.lab.files.jsonable`) with the keys of every mapping sorted."""
    return json.loads(json.dumps(jsonable(value), sort_keys=True))


def _check_existing(
    path: Path,
    task: str,
    options: dict,
    grid: list[dict],
    seeds: list[int],
    defaults: Mapping[str, Any] | None = None,
    precision: str = "fp32",
) -> tuple[list[dict], list[int], dict]:
    """Compare a recorded ablation.json with this invocation; return the merged grid and
    seeds (the recorded ones first) and the recorded payload. Raises
    :class:`AblationMismatchError` naming what differs. An option the record lacks (the
    task gained it after the ablation was recorded) counts as its default ``defaults``; a
    record without a precision (written before it was recorded) is fp32, the default. The
    device and the compile backend may change between sessions (the results differ only by
    rounding, as for a resumed run); the precision may not."""
    try:
        old = read_ablation_record(path.parent)
    except AblationRecordError as err:
        raise AblationMismatchError(f"{err}; restore it or choose another --out") from None
    where = path.parent
    problems = []
    if old.get("task") != task:
        problems.append(f"task: recorded {old.get('task')!r}, now {task!r}")
    if old.get("precision", "fp32") != precision:
        problems.append(f"precision: recorded {old.get('precision', 'fp32')}, now {precision}")
    old_options = old.get("task_options", {})
    added = {k: v for k, v in (defaults or {}).items() if k in options and k not in old_options}
    old_options = {**added, **old_options}
    if old_options != options:
        keys = sorted(set(old_options) | set(options))
        diffs = [
            f"{k}={old_options.get(k, '<unset>')!r} -> {options.get(k, '<unset>')!r}"
            for k in keys
            if old_options.get(k, "<unset>") != options.get(k, "<unset>")
        ]
        problems.append("task options differ: " + ", ".join(diffs))
    old_grid = old.get("grid", [])
    new_labels = {spec_label(s) for s in grid}
    dropped = [spec_label(s) for s in old_grid if spec_label(s) not in new_labels]
    if dropped:
        problems.append(
            "the grid lacks recorded mechanism(s) " + ", ".join(dropped) + " (a resumed grid "
            "must contain the recorded one; add them, e.g. keep --baselines)"
        )
    dropped_seeds = [s for s in old.get("seeds", []) if s not in seeds]
    if dropped_seeds:
        problems.append(f"the seeds lack recorded seed(s) {dropped_seeds}")
    if problems:
        raise AblationMismatchError(
            f"{where} holds another ablation; refusing to resume into it:\n  - "
            + "\n  - ".join(problems)
            + f"\nRerun with the recorded settings (see {path}) or choose another --out."
        )
    old_labels = {spec_label(s) for s in old_grid}
    merged_grid = list(old_grid) + [s for s in grid if spec_label(s) not in old_labels]
    old_seeds = list(old.get("seeds", []))
    merged_seeds = old_seeds + [s for s in seeds if s not in old_seeds]
    return merged_grid, merged_seeds, old


def _finished_dir(run_dir: Path, study: _Study, spec: Mapping, seed: int) -> dict | None:
    """The run.json/metrics.json/cost.json of a run directory that finished (status done)
    but may not have reached the store (the process died in between): one of this study's
    task, spec, seed and task options (a run left by another study whose ``ablation.json``
    and ``results.sqlite`` were deleted is trained again, not adopted)."""
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        if info.get("status") != "done":
            return None
        if info.get("task") != study.task.name or int(info.get("seed", -1)) != int(seed):
            return None
        if spec_label(info.get("attention") or {}) != spec_label(spec):
            return None
        defaults = study.defaults
        if {**defaults, **_record(info.get("task_options") or {})} != {**defaults, **study.options}:
            return None
        metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        cost_path = run_dir / "cost.json"
        cost = json.loads(cost_path.read_text(encoding="utf-8")) if cost_path.is_file() else {}
    except (OSError, ValueError, TypeError):
        return None
    return {"metrics": metrics, "cost": cost}


def _first_line(error: str | None) -> str:
    lines = [x for x in (error or "").strip().splitlines() if x.strip()]
    return lines[-1] if lines else "unknown error"


def run_ablation(
    task: str | Task,
    grid: Any,
    seeds: Iterable[int] | str | None = (0, 1, 2),
    *,
    out_dir: str | os.PathLike[str] | None = None,
    options: Mapping[str, Any] | None = None,
    executor: str = "local",
    jobs: int = 1,
    address: str | None = None,
    progress: bool = True,
    device: str = "auto",
    precision: str = "fp32",
    plugins: Sequence[str] = (),
    compile: str | None = None,
) -> AblationResult:
    """Train every spec of ``grid`` with every seed on ``task``, record each run in
    ``<out_dir>/results.sqlite`` the moment it finishes, and summarise.

    Args:
        task: a registered task name (or a :class:`Task` instance, whose options are used).
        grid: the attention specs: anything :func:`expand_grid` takes (baselines are not
            added here; ``expand_grid(..., baselines=True)`` adds them).
        seeds: the seeds (``"0,1,2"`` or ints).
        out_dir: the ablation directory (default ``ablations/<task>``).
        options: task options (``{"epochs": 3}``), validated by the task.
        executor: ``"local"`` (``jobs`` processes; 1 = in this process) or ``"ray"``.
        jobs: parallel runs (local processes, or the CPUs of a local Ray instance).
        address: a Ray cluster's address (``--executor ray`` only).
        progress: show a progress bar over the runs and print the table.
        device: the torch device of every run (``"auto"``: CUDA when this machine has it,
            else the CPU; resolved here, so the Ray executor asks for a GPU per CUDA run).
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast) for every run.
        plugins: modules to import first (here and in the workers) that register tasks.
        compile: None (eager), or the ``torch.compile`` backend of every run's training
            steps (:func:`attnlab.lab.training.train_run`; in each ``run.json``).

    Before the ablation directory is made, the executor is made (Ray imported), every
    spec and the training options' ranges are checked against the task, a file in the way
    of ``out_dir`` raises :class:`ConfigError`, and the task's data is loaded once (not
    with a Ray ``address``: the cluster's nodes hold the data), so missing data raises its
    :class:`~attnlab.data.MissingDataError` at once instead of failing every run (and the
    data's on-disk caches are filled before the workers start); with the data, every
    spec's model is built once, so a spec the model refuses (``d_w=-1``) raises
    :class:`~attnlab.lab.training.ModelBuildError` before anything runs.

    Resuming: run ids already ``"done"`` in the store are skipped; a finished run directory
    the store missed (the process died right after the run) is recorded without training;
    failed runs are run again. A recorded ``ablation.json`` with another task or options, or
    a grid/seeds that are not a superset of the recorded ones, raises
    :class:`AblationMismatchError`. Failed runs are counted (``result.failed``), not
    raised.
    """
    check_flags(progress=progress)
    if out_dir is not None:
        out_dir = check_path(out_dir, "out_dir")
    if executor not in EXECUTORS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    check_compile_backend(compile)
    runner = make_executor(executor, jobs=jobs, address=address)  # Ray missing: fails now
    study = _open_study(
        task, grid, seeds, out_dir, options, device, precision, plugins, address is None, progress
    )
    study.compile = compile
    out = study.out
    store = ResultsStore(out / ResultsStore.FILENAME)
    try:  # one process at a time checks and merges the record (N started together)
        with store.locked():
            _write_record(study, executor)
    except BaseException:
        store.close()
        raise
    remove_stale_work_dirs(out / "runs")  # what killed runs left behind
    result = AblationResult(
        out_dir=out,
        task=study.task.name,
        options=study.options,
        grid=study.specs,
        seeds=study.seeds,
        metrics=tuple(study.task.metrics),
        higher_is_better=bool(study.task.higher_is_better),
        summary={},
    )
    recorder = _Recorder(study, store, result)
    todo = recorder.plan()
    recorder.bar = _progress_bar(progress, result, len(todo))
    try:
        runner.run(todo, recorder.on_done, recorder.should_run)
        result.summary = store.summary(
            labels=[spec_label(s) for s in study.specs], higher_is_better=result.higher_is_better
        )
    finally:
        store.release(owner=recorder.owner)  # Ctrl-C or an error: hand the runs still held back
        store.close()  # also then: the last connection to close removes the -wal/-shm files
        recorder.bar.close()
    if progress:
        print_result(result)
    return result


@dataclass
class _Study:
    """An ablation as :func:`run_ablation` resolved it before anything runs: the task, the
    directory, the recorded options, specs and seeds, and how every run is started."""

    task: Task
    out: Path
    options: dict[str, Any]
    specs: list[dict[str, Any]]
    seeds: list[int]
    device: str
    precision: str
    plugins: tuple[str, ...]
    paths: tuple[str, ...]
    progress: bool = False  # the runs' own bars, where they train in this process
    compile: str | None = None  # the torch.compile backend of the training steps

    @property
    def defaults(self) -> dict[str, Any]:
        """The task's option defaults as recorded (an option a record lacks had this
        value: it was added to the task after the record was written)."""
        return _record({**Task._TRAINING_DEFAULTS, **type(self.task).defaults})

    def job(self, rid: str, spec: dict[str, Any], seed: int, run_dir: Path) -> RunJob:
        """The job that trains ``spec`` with ``seed`` into ``run_dir``."""
        return RunJob(
            run_id=rid,
            task=self.task.name,
            spec=spec,
            seed=seed,
            run_dir=str(run_dir.resolve()),
            options=self.options,
            device=self.device,
            precision=self.precision,
            plugins=self.plugins,
            sys_path=self.paths,
            progress=self.progress,
            compile=self.compile,
        )


def _open_study(
    task: str | Task,
    grid: Any,
    seeds: Iterable[int] | str | None,
    out_dir: str | os.PathLike[str] | None,
    options: Mapping[str, Any] | None,
    device: str,
    precision: str,
    plugins: Sequence[str],
    check_data: bool = True,
    progress: bool = False,
) -> _Study:
    """Resolve the device, the precision, the plugins, the task, the grid (every spec
    checked against the task) and the seeds, check the ablation directory's path and
    (``check_data``) load the task's data once (with ``progress``, the task may show a bar
    while it prepares slow data), then make the directory."""
    resolved_device = resolve_device(device)
    precision = resolve_precision(precision, resolved_device)
    paths = (os.getcwd(),)
    import_plugins(plugins, paths)
    task_obj = resolve_task(task, options)
    check_training_values(task_obj.options)  # lr > 0, ...: or every run would fail
    specs = expand_grid(grid)
    if not specs:
        raise ConfigError("the grid is empty: give --attention SPEC, --grid or --baselines")
    for spec in specs:  # fail fast on an unknown preset, before anything runs
        task_obj.resolve_attention(spec)
    seed_list = parse_seeds(seeds)
    out = Path(out_dir) if out_dir is not None else Path("ablations") / task_obj.name
    check_folder(out, f"ablation directory {out}")
    check_run_home(out, f"ablation directory {out}", kind="ablation")
    if check_data:  # missing data stops the ablation here, not every run one by one
        _check_models(task_obj, task_obj.load_data_showing(progress), specs)
    make_folder(out, f"ablation directory {out}")
    return _Study(
        task=task_obj,
        out=out,
        options=_record(task_obj.options),
        specs=[_record(s) for s in specs],
        seeds=seed_list,
        device=str(resolved_device),
        precision=precision,
        plugins=tuple(os.path.abspath(p) if p.endswith(".py") else p for p in plugins),
        paths=paths,
        progress=progress,
    )


def _check_models(task: Task, data: Any, specs: Sequence[Mapping[str, Any]]) -> None:
    """Build the model of every spec once (then drop it): a spec the model refuses
    (``d_w=-1``) raises :class:`~attnlab.lab.training.ModelBuildError` here, before the
    directory is made, instead of failing each of its runs."""
    for spec in specs:
        with torch.no_grad():
            build_task_model(task, data, task.resolve_attention(spec), None)


def _write_record(study: _Study, executor: str) -> None:
    """Write ``ablation.json``; a recorded one is checked first and its grid and seeds
    merged into ``study`` (:func:`_check_existing`)."""
    path = study.out / "ablation.json"
    created = utc_now()
    if path.is_file():
        study.specs, study.seeds, old = _check_existing(
            path,
            study.task.name,
            study.options,
            study.specs,
            study.seeds,
            study.defaults,
            study.precision,
        )
        created = old.get("created", created)
    record = {
        "task": study.task.name,
        "task_options": study.options,
        "precision": study.precision,
        "grid": study.specs,
        "seeds": study.seeds,
        "executor": executor,
        "created": created,
        "updated": utc_now(),
    }
    write_json(path, record)


class _Recorder:
    """The runs of one :func:`run_ablation` call: which to train, each claimed in the store
    right before it starts, and each outcome recorded in the store and the result."""

    def __init__(self, study: _Study, store: ResultsStore, result: AblationResult) -> None:
        self.study, self.store, self.result = study, store, result
        self.owner = Owner.this_process()
        self.attempts = store.attempts()  # before done_ids: a run claimed after it is seen as such
        self.specs_by_id: dict[str, tuple[dict[str, Any], int]] = {}
        self.bar = ProgressBar(False)

    def plan(self) -> list[RunJob]:
        """The jobs of the runs not done yet (a finished run directory the store missed is
        recorded, not trained)."""
        done = self.store.done_ids()
        todo: list[RunJob] = []
        for spec in self.study.specs:
            for seed in self.study.seeds:
                rid = run_id(spec, seed)
                self.specs_by_id[rid] = (spec, seed)
                run_dir = self.study.out / "runs" / rid
                if rid in done:
                    self.result.skipped.append(rid)
                elif not self._recover(rid, run_dir):
                    todo.append(self.study.job(rid, spec, seed, run_dir))
        return todo

    def _recover(self, rid: str, run_dir: str | Path) -> bool:
        """Record the run ``rid`` when ``run_dir`` holds it finished (a process died before
        recording it); whether it did."""
        spec, seed = self.specs_by_id[rid]
        name = self.study.task.name
        found = _finished_dir(Path(run_dir), self.study, spec, seed)
        if found is None:
            return False
        self.store.record(rid, name, spec, seed, "done", found["metrics"], found["cost"], run_dir)
        self.result.recovered.append(rid)
        return True

    def should_run(self, job: RunJob) -> bool:
        """Claim the run right before it starts; skip it when another process has it."""
        claim = self.store.claim(job.run_id, self.owner, self.attempts.get(job.run_id, 0))
        if claim.status == "done":
            self.result.skipped.append(job.run_id)
        elif claim.status == "busy":
            self.result.others[job.run_id] = f"trained by {claim.owner}"
        elif claim.status == "ran":
            self.result.others[job.run_id] = f"ran by {claim.owner} meanwhile (not done)"
        elif not self._recover(job.run_id, job.run_dir):
            return True
        self.bar.update(1)
        return False

    def on_done(self, outcome: RunOutcome) -> None:
        """Record a finished run (done or failed) at once."""
        spec, seed = self.specs_by_id[outcome.run_id]
        self.store.record(
            outcome.run_id,
            self.study.task.name,
            spec,
            seed,
            outcome.status,
            outcome.metrics,
            outcome.cost,
            outcome.run_dir,
            outcome.error,
        )
        self.result.ran.append(outcome.run_id)
        failed = self.result.failed
        if outcome.status != "done":
            failed[outcome.run_id] = _first_line(outcome.error)
        if outcome.status != "done":
            self.bar.write(f"run {outcome.run_id} failed: {_first_line(outcome.error)}")
        self.bar.note(f"failed={len(failed)}" if failed else "")
        self.bar.update(1)


def _progress_bar(progress: bool, result: AblationResult, todo: int) -> ProgressBar:
    """The bar over the runs of the ablation (a no-op without ``progress``), saying so when
    it resumes."""
    total = len(result.grid) * len(result.seeds)
    bar = ProgressBar(
        progress, total=total, initial=total - todo, desc=f"ablate {result.task}", unit="run"
    )
    line = _resume_line(result, todo)
    if line is not None:
        bar.write(line)
    return bar


def _resume_line(result: AblationResult, todo: int) -> str | None:
    """``resuming DIR: k of n runs already done, m to run``, or None when nothing was."""
    done = len(result.skipped) + len(result.recovered)
    if not done:
        return None
    total = len(result.grid) * len(result.seeds)
    return f"resuming {result.out_dir}: {done} of {total} runs already done, {todo} to run"


def print_result(result: AblationResult) -> None:
    """The table of an ablation, the runs that failed and those of other processes."""
    out = result.out_dir
    click.echo(f"\n{result.task}: test metrics over seeds {result.seeds} ({out})")
    click.echo(result.table())
    if result.failed:
        click.echo(
            f"\n{len(result.failed)} run(s) failed (they are retried on the next "
            f"invocation; errors in {out / 'results.sqlite'}):"
        )
        for rid, err in result.failed.items():
            click.echo(f"  {rid}: {err}")
    if result.others:
        click.echo(
            f"\n{len(result.others)} run(s) belong to other processes working on {out} "
            "(rerun when they are finished for the full table):"
        )
        for rid, what in result.others.items():
            click.echo(f"  {rid}: {what}")


# ----------------------------------------------------------------------------- command


def _collect_specs(
    attention: Sequence[str], grid: str | None, baselines: bool
) -> list[dict[str, Any]]:
    specs: list[Any] = []
    for item in attention:
        text = item.strip()
        if _is_file(text):
            specs += _from_loaded(_load_file(Path(text)), text)
        else:
            specs.append(parse_spec(text))
    if grid:
        specs += expand_grid(grid)
    return expand_grid(specs, baselines=baselines)


def _given_once(values: Sequence[str], option: str, hint: str) -> str | None:
    """The value of an option that may be given once (None when not given); a repeat is
    a :class:`ConfigError` naming ``option`` (click would keep only the last value)."""
    if len(values) > 1:
        given = " ".join(f"{option.split('/')[-1]} {v!r}" for v in values)
        raise ConfigError(f"{option} given {len(values)} times ({given}); {hint}")
    return values[0] if values else None


def write_report_for(out_dir: Path) -> Path | None:
    """Write the HTML report of an ablation directory with attnlab.lab.report (None when
    that module is not available)."""
    try:
        from attnlab.lab.report import write_report
    except ImportError as err:
        click.echo(f"(no report: attnlab.lab.report is not available: {err})", err=True)
        return None
    return Path(write_report(out_dir))


def _command_options(items: Sequence[str], **shortcuts: Any) -> dict[str, Any]:
    """The task options of ``-o`` items, with the ``--epochs`` / ``--batch-size`` /
    ``--lr`` shortcuts (those given) over them."""
    options = parse_options(items)
    options.update({k: v for k, v in shortcuts.items() if v is not None})
    return options


#: How ``-a``, ``-g`` and ``-o`` are typed (the end of ``attnlab ablate --help``).
ABLATE_SYNTAX = (
    (
        "-a tanh -a score=dot,align=soft",
        "one spec per -a (its key=value pairs joined by ','); repeat -a for several",
    ),
    (
        '-g "score=additive,dot;align=soft,sparsemax"',
        "a grid: ';' separates the axes, ',' the values of an axis (here 2 x 2 = 4 specs)",
    ),
    ('-g "tanh,dot,multi"', "an axis without key= lists preset names"),
    ("-o epochs=3 -o encoder=cnn", "one task option per -o; repeat -o for several"),
)


@click.command("ablate", cls=TaskHelpCommand, syntax=ABLATE_SYNTAX)
@click.argument("task")
@click.option(
    "--attention",
    "-a",
    "attention",
    multiple=True,
    metavar="SPEC",
    help="An attention spec (score=additive,align=soft or a preset name or a "
    "YAML/TOML/JSON file); repeat for several.",
)
@click.option(
    "--grid",
    "-g",
    multiple=True,  # to refuse a second -g (click would keep only the last)
    metavar="TEXT|FILE",
    help='The cartesian product of axes: "score=additive,dot;align=soft,sparsemax" '
    "(';' separates axes, ',' values), or a YAML/TOML/JSON file with a list of specs.",
)
@click.option(
    "--seeds",
    multiple=True,  # to refuse a second --seeds (click would keep only the last)
    metavar="0,1,2",
    help="Seeds, comma-separated (give --seeds once) [default: 0,1,2].",
)
@click.option("--num-seeds", type=click.IntRange(min=1), help="Seeds 0..N-1.")
@click.option(
    "-o",
    "--option",
    "option",
    multiple=True,
    metavar="KEY=VALUE",
    help="A task option (e.g. -o epochs=3 -o max_train=2000); repeat for several "
    "(the options: --list-options).",
)
@click.option("--epochs", type=click.IntRange(min=1), help="Training epochs (over -o epochs=).")
@click.option("--batch-size", type=click.IntRange(min=1), help="Mini-batch size (over -o).")
@click.option("--lr", type=float, help="Learning rate, Adam (over -o lr=).")
@click.option(
    "--out",
    type=NonEmpty(click.Path(file_okay=False)),
    help="The ablation directory [default: ablations/TASK].",
)
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Parallel runs (local processes; the CPUs of a local Ray instance).",
)
@click.option("--address", help="Address of an existing Ray cluster (with --executor ray).")
@device_option(
    "Torch device of every run: auto (CUDA when available, else cpu), cpu, cuda, cuda:1."
)
@precision_option(PRECISION_HELP + ".")
@compile_option()
@plugin_option()
@click.option(
    "--baselines/--no-baselines",
    default=True,
    show_default=True,
    help="Add the mean-pooling and uniform-weights baselines to the grid.",
)
@click.option(
    "--report/--no-report",
    default=True,
    show_default=True,
    help="Write the HTML report of the ablation afterwards.",
)
@click.option(
    "--no-progress",
    is_flag=True,
    help="No progress bars (the table of results is printed all the same).",
)
@click.option(
    "--list-options",
    is_flag=True,
    help="Print TASK's options with their defaults, its presets and metrics, and exit.",
)
def ablate_command(
    task: str,
    attention: tuple[str, ...],
    grid: tuple[str, ...],
    seeds: tuple[str, ...],
    num_seeds: int | None,
    option: tuple[str, ...],
    epochs: int | None,
    batch_size: int | None,
    lr: float | None,
    out: str | None,
    executor: str,
    jobs: int,
    address: str | None,
    device: str,
    precision: str,
    compile: str | None,
    plugins: tuple[str, ...],
    baselines: bool,
    report: bool,
    no_progress: bool,
    list_options: bool,
) -> None:
    """Run an ablation: every attention spec x every seed on TASK.

    Each finished run is recorded at once in OUT/results.sqlite; running the same command
    again resumes (runs already done are skipped, failed ones retried). Prints mean ± sample
    std of the test metrics per mechanism. Every spec and option is checked before the
    first run starts.
    """
    import_plugins_or_fail(plugins)
    # also a damaged results store or run file; missing data (exit 1) is checked once,
    # before the ablation directory is made
    with failing_on(ConfigError, ImportError):
        grid_text = _given_once(grid, "-g/--grid", "put the specs in one grid, or use -a")
        seeds_text = _given_once(seeds, "--seeds", "list the seeds in one: --seeds 0,1,2")
        if list_options:
            click.echo(describe_task_of(task))
            return
        specs = _collect_specs(attention, grid_text, baselines)
        if seeds_text is not None and num_seeds is not None:
            raise ConfigError("give either --seeds or --num-seeds, not both")
        seed_list = parse_seeds(seeds_text, num_seeds)
        if address and executor != "ray":
            raise ConfigError("--address needs --executor ray")
        options = _command_options(option, epochs=epochs, batch_size=batch_size, lr=lr)
        task_obj = resolve_task(task, options)
        check_option_values(task_obj, options)
        for spec in specs:  # before the first run: a typo in the last spec fails now
            check_attention(task_obj, spec)
        resolve_precision(precision, resolve_device(device))
        result = run_ablation(
            task,
            specs,
            seed_list,
            out_dir=out,
            options=options,
            executor=executor,
            jobs=jobs,
            address=address,
            progress=not no_progress,
            device=device,
            precision=precision,
            plugins=plugins,
            compile=compile,
        )
    if no_progress:  # what the bar would have said, then the table
        done = len(result.skipped) + len(result.recovered)
        line = _resume_line(result, len(result.grid) * len(result.seeds) - done)
        if line is not None:
            click.echo(line)
        print_result(result)
    if report:
        path = write_report_for(result.out_dir)
        if path is not None:
            click.echo(f"report: {path}")
    if result.failed:
        sys.exit(1)
