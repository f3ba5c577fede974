"""Where the runs of an ablation execute: in this process, in local worker processes, or on
a Ray cluster.

An executor takes :class:`RunJob` objects (plain, picklable descriptions of one run) and
calls ``on_done(outcome)`` in the calling process the moment each run finishes, so that the
ablation records it in its results store at once. A run that raises is reported as a
``"failed"`` :class:`RunOutcome` (with the traceback); the other runs go on. The optional
``should_run(job)`` is called in the calling process right before a job is started (the
ablation claims the run there); a job it refuses is skipped.

* :class:`LocalExecutor` -- ``jobs=1``: one run after the other in this process;
  ``jobs>1``: a pool of ``jobs`` spawned processes, each with
  ``torch.set_num_threads(max(1, cpus // jobs))``, fed one job per free worker. A worker
  never outlives the process that started it: on Linux the kernel kills it when that
  process dies (``PR_SET_PDEATHSIG``, checked against a death during the worker's start-up),
  and before it publishes a run directory a worker checks that its parent still lives
  (else it exits without writing).
* :class:`RayExecutor` -- every run is a Ray task (``num_cpus=1``, and ``num_gpus=1`` for a
  ``cuda`` device; ``"auto"`` is resolved by the ablation before the jobs are made, so a
  run that trains on CUDA always asks Ray for its GPU): ``ray.init(address=...)``
  joins an existing cluster, otherwise a local Ray instance with ``jobs`` (default: all)
  CPUs is started (and shut down afterwards). Results are gathered with ``ray.wait`` one at
  a time. Ray is optional: ``pip install 'attnlab[ray]'``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import multiprocessing
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from attnlab._checks import ConfigError, check_int
from attnlab.lab.errors import notes_wanted, show_warnings_as_notes

__all__ = [
    "EXECUTORS",
    "LocalExecutor",
    "RayExecutor",
    "RunJob",
    "RunOutcome",
    "cpu_count",
    "execute_job",
    "import_plugins",
    "make_executor",
    "plugin_module_name",
]

EXECUTORS = ("local", "ray")
RAY_HINT = "pip install 'attnlab[ray]'"


@dataclass(frozen=True)
class RunJob:
    """One run of an ablation: train ``spec`` on ``task`` with ``seed`` into ``run_dir``."""

    run_id: str
    task: str
    spec: dict[str, Any]
    seed: int
    run_dir: str
    options: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    precision: str = "fp32"
    plugins: tuple[str, ...] = ()
    num_threads: int | None = None
    #: import paths the worker needs (the driver's working directory, for plugins)
    sys_path: tuple[str, ...] = ()
    #: show the run's bars (its epochs and batches) on stderr, under the ablation's bar:
    #: only where the run trains in the calling process (the local executor with one job);
    #: worker processes never draw bars
    progress: bool = False
    #: the torch.compile backend of the training steps (None: eager)
    compile: str | None = None


@dataclass
class RunOutcome:
    """What an executor reports for one finished run."""

    run_id: str
    status: str  # "done" | "failed"
    run_dir: str
    metrics: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


def cpu_count() -> int:
    """CPUs this process may use (the affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def import_plugins(modules: Iterable[str], paths: Iterable[str] = ()) -> None:
    """Import plugin modules (that register tasks or mechanisms), after adding ``paths`` to
    ``sys.path`` (only when there is a module to import). ``modules`` may be one name; a
    plugin is a dotted module name or a ``.py`` file (run once per process, as the module
    :func:`plugin_module_name` names). A module or file that cannot be found (or a module
    its import needs) raises :class:`~attnlab._checks.ConfigError` naming the plugin."""
    modules = [modules] if isinstance(modules, str) else list(modules)
    if not modules:
        return
    for path in paths:
        if path not in sys.path:
            sys.path.insert(0, path)
    for module in modules:
        if not isinstance(module, str) or not module.strip():
            raise ConfigError(f"a plugin must be a module name or a .py file, got {module!r}")
        try:
            if module.endswith(".py"):
                _run_plugin_file(module)
            else:
                importlib.import_module(module)
        except ModuleNotFoundError as error:
            raise ConfigError(f"plugin {module!r} cannot be imported: {error}") from None


def plugin_module_name(path: str) -> str:
    """The module name a ``.py`` plugin file runs as: the same for the same file in every
    process (``attnlab_plugin_<stem>_<hash of its absolute path>``)."""
    full = os.path.abspath(path)
    digest = hashlib.sha1(full.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.basename(full)[:-3])
    return f"attnlab_plugin_{stem}_{digest}"


def _run_plugin_file(path: str) -> None:
    """Run the plugin file ``path`` as the module :func:`plugin_module_name` names, unless
    this process already did."""
    name = plugin_module_name(path)
    if name in sys.modules:
        return
    if not os.path.isfile(path):
        raise ConfigError(f"plugin {path!r} cannot be imported: no such file")
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugin {path!r} cannot be imported: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a failed run is not a loaded plugin
        raise


#: The process that started this pool worker (None outside a worker of LocalExecutor).
_PARENT_PID: int | None = None
#: The exit status of a worker whose parent died.
ORPHAN_EXIT = 75


class _OrphanedError(Exception):
    """The ablation process that started this worker is gone."""


def _check_parent() -> None:
    """Raise :class:`_OrphanedError` when this worker's parent is no longer its parent."""
    if _PARENT_PID is not None and os.getppid() != _PARENT_PID:
        raise _OrphanedError(f"the parent process {_PARENT_PID} is gone")


def execute_job(job: RunJob) -> RunOutcome:
    """Run one job with :func:`attnlab.lab.training.train_run` and report its outcome;
    never raises for a failing run (the traceback goes into ``error``). In a pool worker
    whose parent died, the run directory is not written and the worker exits."""
    start = time.perf_counter()
    try:
        _check_parent()
        import_plugins(job.plugins, job.sys_path)
        from attnlab.lab.training import train_run

        result = train_run(
            job.task,
            dict(job.spec),
            seed=job.seed,
            options=dict(job.options),
            device=job.device,
            precision=job.precision,
            out_dir=job.run_dir,
            progress=job.progress,
            num_threads=job.num_threads,
            compile=job.compile,
            before_publish=_check_parent if _PARENT_PID is not None else None,
        )
    except _OrphanedError:  # nobody would record the run: write nothing, go away
        os._exit(ORPHAN_EXIT)
    except Exception as err:  # a failing run must not stop the others
        text = "".join(traceback.format_exception(err)).strip()
        return RunOutcome(
            job.run_id,
            "failed",
            job.run_dir,
            error=text,
            seconds=time.perf_counter() - start,
        )
    return RunOutcome(
        job.run_id,
        "done",
        str(getattr(result, "run_dir", job.run_dir)),
        metrics=dict(getattr(result, "metrics", {}) or {}),
        cost=dict(getattr(result, "cost", {}) or {}),
        seconds=time.perf_counter() - start,
    )


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel end this worker when the ablation process ``parent_pid`` dies
    (Linux), so that no orphaned worker goes on training (and writing) after its parent;
    exit at once when the parent already died while this worker was starting (the kernel
    only signals deaths after the request)."""
    global _PARENT_PID
    _PARENT_PID = parent_pid
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl here
            pass
    if os.getppid() != parent_pid:
        os._exit(ORPHAN_EXIT)


def _init_worker(
    threads: int,
    plugins: tuple[str, ...],
    paths: tuple[str, ...],
    parent_pid: int,
    notes: bool = False,
) -> None:
    _die_with_parent(parent_pid)
    if notes:  # the command shows attnlab's warnings as `note:` lines: so does its worker
        show_warnings_as_notes()
    import torch

    torch.set_num_threads(threads)
    import_plugins(plugins, paths)


#: ``on_done(outcome)``: called in the calling process as each run finishes.
OnDone = Callable[[RunOutcome], None]
#: ``should_run(job)``: called right before a job starts; False skips it.
Allowed = Callable[[RunJob], bool]


class _Executor:
    """What every executor does with a list of jobs: nothing for none; else
    :meth:`_run` with ``should_run`` (every job when None)."""

    def run(
        self, jobs: Sequence[RunJob], on_done: OnDone, should_run: Allowed | None = None
    ) -> None:
        """Run ``jobs``; ``on_done(outcome)`` in this process as each finishes;
        ``should_run(job)`` right before each starts (False: skip it)."""
        if not jobs:
            return
        self._run(jobs, on_done, should_run or (lambda job: True))

    def _run(self, jobs: Sequence[RunJob], on_done: OnDone, allowed: Allowed) -> None:
        raise NotImplementedError


class LocalExecutor(_Executor):
    """Runs jobs in this process (``jobs=1``) or in a pool of ``jobs`` spawned processes."""

    name = "local"

    def __init__(self, jobs: int = 1) -> None:
        self.jobs = check_int(jobs, "jobs")  # "2" or 2.5 is refused, not rounded

    def _run(self, jobs: Sequence[RunJob], on_done: OnDone, allowed: Allowed) -> None:
        if self.jobs == 1:
            for job in jobs:
                if allowed(job):
                    on_done(execute_job(job))
            return
        threads = max(1, cpu_count() // self.jobs)
        plugins = tuple(dict.fromkeys(p for j in jobs for p in j.plugins))
        paths = tuple(dict.fromkeys(p for j in jobs for p in j.sys_path))
        context = multiprocessing.get_context("spawn")
        workers = min(self.jobs, len(jobs))
        pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_init_worker,
            initargs=(threads, plugins, paths, os.getpid(), notes_wanted()),
        )
        queue = iter(jobs)
        try:
            pending: set[Future] = set()
            while True:
                # one job per free worker, started only now (so should_run claims it now)
                while len(pending) < workers:
                    job = next((j for j in queue if allowed(j)), None)
                    if job is None:
                        break
                    pending.add(pool.submit(execute_job, _for_worker(job, threads)))
                if not pending:
                    break
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    on_done(future.result())
        except BaseException:
            # Ctrl-C or a failing callback: drop the queued runs, do not wait for the others
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _for_worker(job: RunJob, threads: int) -> RunJob:
    """``job`` as a worker process runs it: with ``threads`` unless it names its own, and
    without bars (several processes drawing on one terminal would garble it)."""
    threads = threads if job.num_threads is None else job.num_threads
    return RunJob(**{**job.__dict__, "num_threads": threads, "progress": False})


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise ImportError(
            f"the Ray executor needs the optional dependency ray: {RAY_HINT}"
        ) from err
    return ray


class RayExecutor(_Executor):
    """Runs every job as a Ray task with ``num_cpus=1``.

    Args:
        address: an existing cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            None starts a local Ray instance (unless Ray is already initialised).
        jobs: CPUs of the local instance (default: all of this machine's); ignored with an
            address.

    The workers import the plugins of each job themselves, and the driver's working
    directory is put on their ``sys.path`` (a cluster needs attnlab and the plugins
    installed on its nodes, or a ``runtime_env``).
    """

    name = "ray"

    def __init__(self, address: str | None = None, jobs: int | None = None) -> None:
        self.ray = _import_ray()
        self.address = address
        self.jobs = None if jobs is None else check_int(jobs, "jobs")

    def _run(self, jobs: Sequence[RunJob], on_done: OnDone, allowed: Allowed) -> None:
        """Submit every job (``allowed(job)`` first: False skips it); ``on_done`` as each
        finishes."""
        started = self._start()
        pending: dict[Any, RunJob] = {}
        try:
            remote = self.ray.remote(num_cpus=1, max_retries=0)(execute_job)
            for job in jobs:
                if not allowed(job):
                    continue
                # a CUDA run asks Ray for one GPU (Ray sets CUDA_VISIBLE_DEVICES for it)
                gpus = 1 if job.device.startswith("cuda") else 0
                ref = remote.options(num_gpus=gpus).remote(_for_worker(job, 1))
                pending[ref] = job
            self._gather(pending, on_done)
        except BaseException:
            self._cancel(pending)  # Ctrl-C: do not leave the runs queued on a cluster
            raise
        finally:
            if started:
                self.ray.shutdown()

    def _start(self) -> bool:
        """Join the cluster at ``address`` or start a local instance, unless Ray is already
        initialised; whether this call started it (and so shuts it down)."""
        ray = self.ray
        if ray.is_initialized():
            return False
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(
                num_cpus=self.jobs or cpu_count(), include_dashboard=False, log_to_driver=False
            )
        return True

    def _gather(self, pending: dict[Any, RunJob], on_done: OnDone) -> None:
        """``on_done`` for each task of ``pending`` as it finishes (a worker that died: a
        failed outcome); ``pending`` is emptied."""
        ray = self.ray
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as err:  # a worker that died
                    outcome = RunOutcome(
                        job.run_id, "failed", job.run_dir, error=f"ray task failed: {err}"
                    )
                on_done(outcome)

    def _cancel(self, pending: dict[Any, RunJob]) -> None:
        for ref in pending:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # already finished or gone
                pass


def make_executor(kind: str = "local", *, jobs: int = 1, address: str | None = None):
    """The executor named ``kind`` (``"local"`` or ``"ray"``)."""
    if kind == "local":
        if address:
            raise ValueError("--address is for the ray executor; add --executor ray")
        return LocalExecutor(jobs)
    if kind == "ray":
        return RayExecutor(address, jobs if jobs and jobs > 1 else None)
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
