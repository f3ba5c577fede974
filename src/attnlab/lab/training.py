"""The trainer of the lab: one run = one task x one attention spec x one seed.

:func:`train_run` resolves the task, seeds ``random``, ``numpy`` and ``torch``, loads the
data, builds the task model with the attention, trains it with Adam (weight decay, the
attention's own weight decay, AMSGrad and gradient-norm clipping from the task's options:
:func:`parameter_groups`), evaluates on the dev split after every epoch, keeps the best
epoch by the task's first metric (or ``select_metric``; from the epoch
``select_from_epoch`` on), evaluates that state on the test split, and writes the run
directory::

    <run_dir>/run.json          task, task_options, attention (as given), label, seed,
                                device, device_name (CUDA), precision, status ("done" |
                                "failed"), started, finished, versions, error,
                                checkpoint_sha256 (of model.safetensors), resumed_after
                                (the epochs after which an interrupted run went on),
                                compile (the torch.compile backend, or null)
    <run_dir>/metrics.json      primary, higher_is_better, best_epoch, epochs_trained (fewer
                                than ``epochs`` when ``patience`` stopped early), dev, test
    <run_dir>/history.json      [{epoch, train_loss, dev, seconds, examples_per_second,
                                  data_share}, ...]
    <run_dir>/cost.json         parameters, train_seconds, seconds_per_epoch,
                                eval_ms_per_example, peak_memory_mb,
                                examples_per_second, data_seconds, data_share, prefetch
    <run_dir>/examples.json     attention maps on test examples (AttentionExample.to_json())
    <run_dir>/model.safetensors the best epoch's state dict

``device="auto"`` (the default) trains on CUDA when this machine has it, else on the CPU
(:func:`resolve_device`); ``precision`` is ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``:
the loss, the evaluation and the attention examples run under ``torch.autocast`` with that
dtype (the parameters and the optimizer stay float32), with a gradient scaler for fp16
(:func:`resolve_precision`, :func:`precision_context`). ``compile="inductor"`` (or another
``torch.compile`` backend) compiles the model's forward pass for the training steps (the
backward pass too, through AOTAutograd); the evaluations run the model as it is, since a
task may decode step by step there. Every task model of the lab compiles in one graph
(``tests/lab/test_every_task_compiles.py``); the results equal eager mode's to rounding.
The compilations' time falls in the first epochs; the recurrences, which PyTorch's
decompositions unroll, run the padded length rounded up to a power of two, so they compile
once per power of two, not per length (:func:`attnlab._checks.compiled_steps`): figures
in docs/compile-and-precision.md.

Throughput: the training batches come through :func:`device_batches`, which on CUDA builds
them :data:`CUDA_PREFETCH` ahead on a background thread in pinned memory (copied with
``non_blocking=True``), and the loss is read back once per :data:`CUDA_SYNC_EVERY`
batches; ``examples_per_second`` (training examples per second of the training loops)
and ``data_share`` (the share of that time spent waiting for batches) go into
``cost.json`` and each epoch of ``history.json``. Tasks with sequences of varying length
take the option ``bucket=true`` (length bucketing, :mod:`attnlab.lab.batching`).

The directory is built in a hidden sibling folder and moved into place with ``os.replace``
at the end, so a run killed midway never leaves a directory whose ``run.json`` says
``"done"`` (only the hidden ``.<name>.tmp-<pid>.<host>.*`` work folder, without a
run.json). When training raises, ``run.json`` with ``"status": "failed"`` and the error is
moved into place instead, and the exception propagates. An earlier run (a folder with
``run.json``) or an empty folder at ``run_dir`` is replaced; a folder of other files or a
file there is never deleted: the run refuses to start (:class:`ConfigError`), and a folder
that gains other files while the run trains gets the finished run beside it
(``<run_dir>.run-<time>``, named in the error). The work folder's name holds its owner's process id and host, so
:func:`remove_stale_work_dirs` (called by every run, and by an ablation when it resumes)
removes the folders that a killed process left behind, and never one a live process owns.

After every epoch the whole state of the run goes to ``.<name>.resume.safetensors`` beside
the run directory (:mod:`attnlab.lab.resume`); the same run started again after an
interruption goes on after that epoch and gives what an uninterrupted run gives. The file
is removed once the run is published as done.

:func:`load_run` rebuilds ``(task, data, model)`` from a finished run directory, checking
the checkpoint against the sha256 recorded in ``run.json`` (runs written before the
checksum existed load unchecked). :func:`read_run_file` reads one JSON file of a run
directory and checks its type and fields; a missing, unreadable or malformed file raises
:class:`~attnlab.lab.checkpoint.RunFileError` with one line naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import platform
import queue
import random
import re
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attnlab._atomic import make_temp_folder
from attnlab._checks import (
    ConfigError,
    check_callable,
    check_flags,
    check_int,
    check_path,
    check_seed,
)
from attnlab.lab._process import Owner, host_tag
from attnlab.lab.checkpoint import (
    MissingRunFileError,
    RunFileError,
    check_checkpoint,
    file_sha256,
    load_state,
    save_state,
)
from attnlab.lab.config import check_training_values, parse_attention, resolve_task
from attnlab.lab.errors import error_message
from attnlab.lab.files import jsonable, make_folder, utc_now, write_json
from attnlab.lab.progress import ProgressBar
from attnlab.lab.resume import (
    EpochState,
    ResumeFile,
    capture_rng,
    fingerprint,
    restore_rng,
    resume_path,
)
from attnlab.lab.task import AttentionExample, Task, spec_label, spec_slug

__all__ = [
    "CUDA_PREFETCH",
    "CUDA_SYNC_EVERY",
    "PRECISIONS",
    "RUN_FILES",
    "DataTimer",
    "RunResult",
    "attention_parameters",
    "batch_examples",
    "check_compile_backend",
    "default_run_dir",
    "device_batches",
    "load_run",
    "move_batch",
    "parameter_groups",
    "pin_batch",
    "precision_context",
    "read_metrics",
    "read_run",
    "read_run_file",
    "remove_stale_work_dirs",
    "resolve_device",
    "resolve_precision",
    "resolve_task",
    "seed_everything",
    "train_run",
]

#: The files of a finished run directory.
RUN_FILES = (
    "run.json",
    "metrics.json",
    "history.json",
    "cost.json",
    "examples.json",
    "model.safetensors",
)


#: The numeric precisions of training (``--precision``): float32, or autocast to bfloat16 /
#: float16 (float16 with a gradient scaler).
PRECISIONS = ("fp32", "bf16", "fp16")
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class ModelBuildError(ConfigError):
    """The task model rejects the attention spec or an option (raised by
    :func:`train_run` before anything is written)."""


@dataclass
class RunResult:
    """What :func:`train_run` returns.

    Attributes:
        run_dir: the run directory.
        label: :func:`~attnlab.lab.task.spec_label` of the attention spec as given.
        metrics: the ``metrics.json`` dict (primary metric, best epoch, dev and test).
        history: the ``history.json`` list (one entry per epoch).
        cost: the ``cost.json`` dict.
    """

    run_dir: Path
    label: str
    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def test(self) -> dict[str, Any]:
        return self.metrics["test"]


# ----------------------------------------------------------------------------- helpers


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and CUDA)."""
    # >= 0: Python's random takes -3 as 3, so two seeds would share its stream
    check_seed(seed, minimum=0, error=ConfigError)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 -- seeds code that uses the global generator
    torch.manual_seed(seed)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``device`` as a :class:`torch.device`, checked to be usable here; ``"auto"`` is
    CUDA when ``torch.cuda.is_available()``, else the CPU."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as error:
        # torch's "Expected one of cpu, cuda, ipu, xpu, ..." lists two dozen backends
        detail = "" if str(error).startswith("Expected one of") else f": {error}"
        raise ConfigError(
            f"device {device!r} is not a device name (try 'auto', 'cpu', 'cuda' or "
            f"'cuda:0'){detail}"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {str(device)!r} was asked for but CUDA is not available on this "
                "machine (torch.cuda.is_available() is False); use --device cpu or auto"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {str(device)!r}: this machine has {torch.cuda.device_count()} CUDA "
                "device(s)"
            )
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError(f"device {str(device)!r} was asked for but MPS is not available")
    elif dev.type != "cpu":
        raise ConfigError(f"device {str(device)!r}: use 'auto', 'cpu', 'cuda[:N]' or 'mps'")
    return dev


def resolve_precision(precision: str, device: str | torch.device = "cpu") -> str:
    """``precision`` checked to be one of :data:`PRECISIONS` that ``device`` can train with
    (raises :class:`~attnlab._checks.ConfigError` in one line naming the fix): bf16 needs
    a GPU that supports it (``torch.cuda.is_bf16_supported()``) on CUDA; fp16 and bf16
    need torch's autocast for the device type (CPU and CUDA have it)."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ConfigError(
            f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r} "
            "(e.g. --precision bf16)"
        )
    if precision == "fp32":
        return precision
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    if not torch.amp.is_autocast_available(dev.type):
        raise ConfigError(
            f"precision {precision} needs torch.autocast on {dev.type!r}, which this torch "
            "lacks; use --precision fp32"
        )
    if precision == "bf16" and dev.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision bf16: the GPU {torch.cuda.get_device_name(dev)!r} does not support "
            "bfloat16; use --precision fp16 or fp32"
        )
    return precision


@contextlib.contextmanager
def precision_context(device: torch.device, precision: str) -> Iterator[None]:
    """``torch.autocast`` to ``precision``'s dtype on ``device`` (nothing for fp32). On the
    CPU, oneDNN is switched off inside: its LSTM kernels refuse reduced-precision inputs
    on CPUs without native bfloat16 ("could not create a primitive descriptor")."""
    if precision == "fp32":
        yield
        return
    with contextlib.ExitStack() as stack:
        if device.type == "cpu":
            stack.enter_context(_without_onednn())
        stack.enter_context(torch.autocast(device.type, dtype=_AUTOCAST_DTYPES[precision]))
        yield


@contextlib.contextmanager
def _without_onednn() -> Iterator[None]:
    """``torch.backends.mkldnn.flags(enabled=False)`` without its note on TF32 for Intel
    GPUs (a UserWarning when the flags are set and again when they are restored)."""
    flags = torch.backends.mkldnn.flags(enabled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        flags.__enter__()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            flags.__exit__(None, None, None)


def _device_name(device: torch.device) -> str | None:
    """The GPU's name for a CUDA device (None otherwise)."""
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.get_device_name(device)
    except (RuntimeError, AssertionError):  # pragma: no cover - a driver problem
        return None


def move_batch(batch: Any, device: torch.device | str) -> Any:
    """Every tensor in ``batch`` (a dict, list or tuple, nested) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_batch(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a named tuple
        return type(batch)(*(move_batch(v, device) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move_batch(v, device) for v in batch)
    return batch


def default_run_dir(task: str, attention: Mapping[str, Any], seed: int) -> Path:
    """``runs/<task>/<spec slug>--seed<seed>`` under the current directory."""
    return Path("runs") / task / f"{spec_slug(attention)}--seed{seed}"


def _versions() -> dict[str, str]:
    import attnlab

    return {
        "attnlab": getattr(attnlab, "__version__", "unknown"),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def _rss_mb() -> float | None:
    """The process's current resident set size (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class _PeakRSS:
    """Samples the resident set size every ``interval`` seconds on a daemon thread; ``peak``
    is the largest increase over the value at start. Unlike ``ru_maxrss`` (a high-water mark
    of the whole process), this is the run's own peak when several runs share a process
    (an ablation with ``jobs=1``, the demo); memory that the allocator kept from an earlier
    run and reuses is not counted again."""

    def __init__(self, interval: float = 0.01) -> None:
        import threading

        self.start = _rss_mb()
        self.peak = 0.0
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        if self.start is not None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            now = _rss_mb()
            if now is not None and self.start is not None:
                self.peak = max(self.peak, now - self.start)

    def stop(self) -> float | None:
        if self.start is None:
            return None
        self._stop.set()
        self._thread.join()
        now = _rss_mb()
        if now is not None:
            self.peak = max(self.peak, now - self.start)
        return self.peak


def _n_items(task: Task, data: Any, split: str, batch_size: int) -> int:
    part = data.split(split)
    try:
        return len(part)
    except TypeError:
        n = 0
        for batch in task.batches(data, split, batch_size):
            first = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
            n += int(first.shape[0]) if first is not None and first.dim() else 1
        return n


def _is_better(value: float, best: float | None, higher: bool) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if best is None:
        return True
    return value > best if higher else value < best


def _owned_name(name: str, kind: str) -> str:
    """``.<name>.<kind>-<pid>.<host>.``: the prefix of a hidden folder owned by this process
    (see :func:`remove_stale_work_dirs`)."""
    return f".{name}.{kind}-{os.getpid()}.{host_tag()}."


_OWNED = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d+)\.(?P<host>[A-Za-z0-9_-]+)\.[^.]*$")


def remove_stale_work_dirs(folder: str | Path, name: str | None = None) -> list[Path]:
    """Remove the hidden work folders (``.<run>.tmp-<pid>.<host>.*``) and replaced run
    directories (``.<run>.old-<pid>.<host>.*``) in ``folder`` whose owner process is dead;
    only those of run ``name`` when given. Folders of a live process, of another host or
    without an owner in their name are kept. Returns the removed paths."""
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    here = host_tag()
    for path in entries:
        match = _OWNED.match(path.name)
        if match is None or (name is not None and match["name"] != name):
            continue
        if match["host"] != here or Owner(int(match["pid"]), here).alive() is not False:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def _not_replaceable(path: Path) -> str | None:
    """Why a run may not replace what is at ``path``, or None when it may: nothing there,
    an empty folder or an earlier run (a folder holding ``run.json``). A folder of other
    files or a file is never deleted to make room for a run."""
    if not path.exists():  # a dangling link too: replacing it loses nothing
        return None
    if not path.is_dir():
        return "is a file, not a run directory"
    if (path / "run.json").is_file() or not any(path.iterdir()):
        return None
    return "holds files but no run.json, so it is not a run directory"


def _keep_aside(src: Path, dst: Path) -> Path:
    """Move the finished run ``src`` to a new visible name beside ``dst`` and return it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        kept = dst.with_name(f"{dst.name}.run-{stamp}" + (f"-{n}" if n else ""))
        if not kept.exists() and not kept.is_symlink():
            os.rename(src, kept)
            return kept
    raise OSError(f"cannot find a free name beside {dst} for the finished run {src}")


def _replace_dir(src: Path, dst: Path, *, keep: bool = True) -> None:
    """Move the finished folder ``src`` to ``dst``, replacing what is there when it is an
    earlier run or an empty folder (:func:`_not_replaceable`). Anything else there (files
    the user put in the folder while the run trained) is left alone and
    :class:`ConfigError` says so; the run is moved to ``<dst>.run-<time>`` beside it
    (``keep``) or removed.

    Safe against another process replacing ``dst`` at the same time: a rename onto a
    non-empty directory fails (it never merges), so what is there is moved aside and the
    rename retried."""
    for _ in range(20):
        try:
            os.replace(src, dst)  # atomic; replaces a file, a link or an empty directory
            return
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        why = _not_replaceable(dst)
        if why is not None:
            if not keep:
                shutil.rmtree(src, ignore_errors=True)
                raise ConfigError(f"run directory {dst} {why}; the run is not published")
            kept = _keep_aside(src, dst)
            raise ConfigError(f"run directory {dst} {why}; the run is kept in {kept}")
        trash = dst.with_name(_owned_name(dst.name, "old") + str(time.time_ns()))
        try:
            os.replace(dst, trash)
        except FileNotFoundError:  # another process moved it away first: retry
            continue
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(f"cannot move {src} to {dst}: it is replaced again and again meanwhile")


# ----------------------------------------------------------------------------- data pipeline

#: Batches the background thread builds ahead on CUDA (``prefetch=None``); 0 on the CPU.
CUDA_PREFETCH = 2
#: On CUDA the training loss is read back (a device synchronisation) once per this many
#: batches, not after every batch; the finiteness check still names the first bad batch.
CUDA_SYNC_EVERY = 25


def batch_examples(batch: Any) -> int:
    """The number of examples in a batch: the length of its ``index``, ``labels`` or
    ``targets`` tensor, else of its first tensor's first dimension (0 when it has none)."""
    if isinstance(batch, Mapping):
        for key in ("index", "labels", "targets"):
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return int(value.shape[0])
        values: Any = batch.values()
    elif isinstance(batch, list | tuple):
        values = batch
    else:
        values = [batch]
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0


def pin_batch(batch: Any) -> Any:
    """Every CPU tensor of ``batch`` in page-locked memory (so that copies to the GPU run
    asynchronously with ``non_blocking=True``); needs CUDA."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, Mapping):
        return {k: pin_batch(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pin_batch(v) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(pin_batch(v) for v in batch)
    return batch


@dataclass
class DataTimer:
    """What :func:`device_batches` measured: seconds the consumer waited for batches
    (building them, or waiting for the prefetching thread, plus the copy to the device),
    and how many batches and examples it handed out."""

    seconds: float = 0.0
    batches: int = 0
    examples: int = 0


def device_batches(
    batches: Iterator[Any],
    device: torch.device,
    *,
    prefetch: int = 0,
    pin_memory: bool = False,
    timer: DataTimer | None = None,
) -> Iterator[Any]:
    """The batches of ``batches`` moved to ``device``, timed into ``timer``.

    With ``prefetch > 0`` a background thread iterates ``batches`` (the task's Python code
    that pads and stacks them) up to ``prefetch`` batches ahead of the consumer, pinning
    their memory when ``pin_memory``, so that on a GPU the next batch is ready when a step
    ends. The order is that of ``batches`` (one producer), so a seeded run gives the same
    batches with or without prefetching. An error in the producer is raised here; when the
    consumer stops early the thread ends too.
    """
    timer = timer if timer is not None else DataTimer()
    if prefetch <= 0:
        yield from _timed((pin_batch(b) if pin_memory else b for b in batches), device, timer)
        return
    items = _prefetched(batches, prefetch, pin_memory)
    try:
        yield from _timed(items, device, timer)
    finally:
        items.close()  # the consumer stopped early: the thread ends too


def _timed(source: Iterator[Any], device: torch.device, timer: DataTimer) -> Iterator[Any]:
    """The batches of ``source`` moved to ``device``; the time spent waiting for each (and
    moving it), the batches and their examples are added to ``timer``."""
    source = iter(source)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(source)
        except StopIteration:
            timer.seconds += time.perf_counter() - t0
            return
        batch = move_batch(batch, device)
        timer.seconds += time.perf_counter() - t0
        timer.batches += 1
        timer.examples += batch_examples(batch)
        yield batch


def _prefetched(batches: Iterator[Any], prefetch: int, pin_memory: bool) -> Iterator[Any]:
    """The batches of ``batches``, built up to ``prefetch`` ahead by a background thread (in
    pinned memory when ``pin_memory``); an error of the thread is raised here, and closing
    this generator stops the thread."""
    slots: queue.Queue = queue.Queue(maxsize=prefetch)
    stop = threading.Event()

    def offer(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not offer(("batch", pin_batch(batch) if pin_memory else batch)):
                    return
            offer(("end", None))
        except BaseException as error:  # handed to the consumer, raised there
            offer(("error", error))

    worker = threading.Thread(target=produce, name="attnlab-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            kind, item = slots.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        worker.join(timeout=5.0)


# ----------------------------------------------------------------------------- training


def train_run(
    task: str | Task,
    attention: Mapping[str, Any] | str | None = None,
    *,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    device: str = "auto",
    precision: str = "fp32",
    out_dir: str | Path | None = None,
    progress: bool = True,
    num_threads: int | None = None,
    before_publish: Callable[[], None] | None = None,
    prefetch: int | None = None,
    resume: bool = True,
    compile: str | None = None,
) -> RunResult:
    """Train one run and write its run directory (see the module docstring).

    Args:
        task: a registered task name (``attnlab list --kind task``), a :class:`Task`
            class or instance.
        attention: the attention spec: a dict, spec text (``"score=additive,align=soft"``,
            ``"mean"``, a YAML/TOML/JSON file) or None for the task's default attention.
        seed: seeds ``random``, ``numpy`` and ``torch`` (and the shuffling of batches).
        options: task options (``epochs``, ``batch_size``, ``lr``, ``max_train``, ...)
            over the task's defaults.
        device: ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, ...; every tensor of a batch is moved there.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (autocast; a gradient scaler for
            fp16); recorded in ``run.json``.
        out_dir: the run directory (default ``runs/<task>/<spec slug>--seed<seed>``); an
            earlier run or an empty folder there is replaced, a folder of other files or a
            file raises :class:`~attnlab._checks.ConfigError` (nothing is deleted).
        progress: show tqdm progress bars for epochs and batches on stderr.
        num_threads: ``torch.set_num_threads`` for the run (restored afterwards).
        before_publish: called right before the run directory (done or failed) is moved
            into place; when it raises, the work folder is removed, nothing is published
            and its exception propagates (an ablation worker checks there that its parent
            still lives).
        prefetch: training batches a background thread builds ahead
            (:func:`device_batches`); None: :data:`CUDA_PREFETCH` on CUDA (with pinned
            memory), 0 (none) elsewhere. The batches and the results do not depend on it.
        resume: go on after the last finished epoch of an interrupted run of the same
            settings (its state ``.<run>.resume.safetensors`` beside ``out_dir``:
            :mod:`attnlab.lab.resume`); False starts from epoch 1 whatever was saved. The
            state is saved after every epoch either way and removed once the run is done.
        compile: None (eager), or the ``torch.compile`` backend for the training steps
            (``"inductor"``, ``"aot_eager"``, ...: ``torch._dynamo.list_backends()``);
            recorded in ``run.json``. A run may go on after an interruption with another
            value: the results differ only by rounding.

    Returns:
        :class:`RunResult`. Raises what the task raises (e.g.
        :class:`~attnlab.data.MissingDataError`) after writing ``run.json`` with
        ``"status": "failed"``; a bad task, option, spec or device raises
        :class:`~attnlab._checks.ConfigError` before anything is written.
    """
    # --- everything that can be checked cheaply, before a directory exists
    check_flags(progress=progress, resume=resume)
    if before_publish is not None:
        check_callable(before_publish, "before_publish")
    spec_given = _given_spec(attention)
    the_task = resolve_task(task, options)
    spec = the_task.resolve_attention(spec_given)
    the_task.selection()  # a bad select_metric fails here
    dev = resolve_device(device)
    precision = resolve_precision(precision, dev)
    prefetch = _check_run_args(the_task, seed, num_threads, prefetch, dev)
    check_compile_backend(compile)
    run_dir = (
        check_path(out_dir, "out_dir")
        if out_dir is not None
        else default_run_dir(the_task.name, spec_given, seed)
    ).absolute()
    why = _not_replaceable(run_dir)
    if why is not None:
        raise ConfigError(
            f"run directory {run_dir} {why}; a run replaces only an earlier run: "
            "move it away or write the run elsewhere"
        )
    work = _make_work_dir(run_dir)
    run_info = _run_info(the_task, spec_given, seed, dev, precision, compile)
    saved = ResumeFile(resume_path(run_dir), fingerprint(run_info))
    if not resume:
        saved.remove()
    try:
        with _torch_threads(num_threads):
            metrics, history, cost = _train(
                the_task,
                spec,
                seed,
                dev,
                precision,
                work,
                progress,
                prefetch,
                saved,
                run_info,
                compile,
            )
    except BaseException as error:
        _publish_failed(work, run_dir, run_info, error, before_publish)
        raise
    _publish_done(work, run_dir, run_info, before_publish)
    saved.remove()  # after publishing: a kill in between loses nothing
    return RunResult(run_dir, run_info["label"], metrics, history, cost)


def _given_spec(attention: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """The attention spec as given: a mapping (copied), spec text (or the path of a spec
    file) or None."""
    if isinstance(attention, os.PathLike):
        attention = os.fspath(attention)
    if not (attention is None or isinstance(attention, str | Mapping)):
        raise ConfigError(
            f"attention must be a mapping, spec text or None, got {type(attention).__name__}"
        )
    spec = (
        parse_attention(attention)
        if isinstance(attention, str) or attention is None
        else dict(attention)
    )
    if not isinstance(spec, dict):
        raise ConfigError(f"attention must be a mapping or spec text, got {attention!r}")
    return spec


def _check_run_args(
    task: Task, seed: int, num_threads: int | None, prefetch: int | None, device: torch.device
) -> int:
    """Check the seed, the thread count, the prefetch depth and the task's training options
    (``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``:
    :func:`~attnlab.lab.config.check_training_values`); return the prefetch depth (None:
    :data:`CUDA_PREFETCH` on CUDA, 0 elsewhere)."""
    check_seed(seed, minimum=0, error=ConfigError)
    if num_threads is not None:
        check_int(num_threads, "num_threads")
    if prefetch is None:
        prefetch = CUDA_PREFETCH if device.type == "cuda" else 0
    check_int(prefetch, "prefetch", 0)
    check_training_values(task.options)
    return prefetch


def check_compile_backend(backend: str | None) -> None:
    """Check that ``backend`` is None or a ``torch.compile`` backend of this installation
    (``torch._dynamo.list_backends``, with the debug ones and any registered by the user);
    :class:`ConfigError` otherwise, in one line naming the usual ones."""
    if backend is None:
        return
    import torch._dynamo

    if not isinstance(backend, str) or backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ConfigError(
            "compile must be a torch.compile backend (inductor, cudagraphs, aot_eager, "
            f"eager, ...: torch._dynamo.list_backends()), got {backend!r}"
        )


def _make_work_dir(run_dir: Path) -> Path:
    """A new hidden work folder beside ``run_dir``, owned by this process (the stale ones
    of dead processes are removed first); a file where a folder above ``run_dir`` must be
    raises :class:`ConfigError` naming it."""
    what = f"run directory {run_dir}"
    make_folder(run_dir.parent, what)
    remove_stale_work_dirs(run_dir.parent, run_dir.name)
    try:
        return make_temp_folder(_owned_name(run_dir.name, "tmp"), run_dir.parent)
    except OSError as error:  # e.g. a folder the user may not write in
        raise ConfigError(f"{what}: cannot write in {run_dir.parent} ({error.strerror})") from None


def _run_info(
    task: Task,
    spec: dict[str, Any],
    seed: int,
    device: torch.device,
    precision: str,
    compile: str | None = None,
) -> dict[str, Any]:
    """The ``run.json`` of a run that starts now (status ``"failed"`` until it is done)."""
    return {
        "task": task.name,
        "task_options": dict(task.options),
        "attention": spec,
        "label": spec_label(spec),
        "seed": seed,
        "device": str(device),
        "device_name": _device_name(device),
        "precision": precision,
        "status": "failed",
        "started": utc_now(),
        "finished": None,
        "versions": _versions(),
        "error": None,
        "checkpoint_sha256": None,
        "resumed_after": [],
        "compile": compile,
    }


@contextlib.contextmanager
def _torch_threads(num_threads: int | None) -> Iterator[None]:
    """``torch.set_num_threads(num_threads)`` inside (nothing for None), restored after."""
    if num_threads is None:
        yield
        return
    old_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)


def _publish_failed(
    work: Path,
    run_dir: Path,
    run_info: dict[str, Any],
    error: BaseException,
    before: Callable[[], None] | None,
) -> None:
    """Publish the work folder with a ``run.json`` saying ``"failed"`` and ``error``; an
    error in what the user typed (:class:`ModelBuildError`) publishes nothing."""
    if isinstance(error, ModelBuildError):
        shutil.rmtree(work, ignore_errors=True)
        return
    run_info["finished"] = utc_now()
    text = str(error)  # KeyboardInterrupt has none: "KeyboardInterrupt", not "...: "
    run_info["error"] = f"{type(error).__name__}: {text}" if text else type(error).__name__
    try:
        write_json(work / "run.json", run_info)
        _publish(work, run_dir, before, keep=False)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
    except ConfigError as refused:  # the folder is no run directory now: nothing published
        warnings.warn(str(refused), stacklevel=4)


def _publish_done(
    work: Path, run_dir: Path, run_info: dict[str, Any], before: Callable[[], None] | None
) -> None:
    """Write the ``run.json`` of a finished run (with the checkpoint's sha256) and publish
    the work folder."""
    try:
        run_info["status"] = "done"
        run_info["finished"] = utc_now()
        run_info["checkpoint_sha256"] = file_sha256(work / "model.safetensors")
        write_json(work / "run.json", run_info)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    _publish(work, run_dir, before)


def _publish(
    work: Path, run_dir: Path, before: Callable[[], None] | None, *, keep: bool = True
) -> None:
    """``before()``, then move ``work`` into place (:func:`_replace_dir`, ``keep``); when
    ``before`` raises, ``work`` is removed and nothing is published."""
    if before is not None:
        try:
            before()
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    _replace_dir(work, run_dir, keep=keep)


def build_task_model(
    task: Task, data: Any, spec: dict[str, Any], sampler: _PeakRSS | None
) -> nn.Module:
    """The task's model with the attention ``spec``; a model that rejects the spec or an
    option raises :class:`ModelBuildError` (the memory ``sampler`` is stopped then)."""
    try:
        return task.build_model(data, spec)
    except (ConfigError, ValueError, TypeError, KeyError) as error:
        if sampler is not None:
            sampler.stop()
        raise ModelBuildError(
            f"task {task.name!r} cannot build its model with attention {spec_label(spec)!r} "
            f"and its options: {error_message(error)}"
        ) from error


def _n_batches(data: Any, batch_size: int) -> int | None:
    """The number of training batches (None when the train split has no length)."""
    try:
        return math.ceil(len(data.split("train")) / batch_size)
    except TypeError:
        return None


def attention_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``model``'s attention: ``model.attention_parameters()`` where the
    model defines it, else those with a module named ``attention`` on their path (e.g.
    ``attention.score.W``: Jain & Wallace's convention, ``'attention' in name``)."""
    own = getattr(model, "attention_parameters", None)
    if callable(own):
        return list(own())
    return [p for name, p in model.named_parameters() if "attention" in name.split(".")]


def parameter_groups(
    model: nn.Module, weight_decay: float, attention_weight_decay: float | None
) -> list[dict[str, Any]]:
    """The optimizer's parameter groups of the trainable parameters of ``model``: one group
    with ``weight_decay``, or, when ``attention_weight_decay`` is not None, the attention's
    parameters (:func:`attention_parameters`) in a second group with that weight decay
    (Jain & Wallace: 1e-5 on the encoder and output, 0 on the attention). Empty groups are
    left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    if attention_weight_decay is None:
        return [{"params": params, "weight_decay": weight_decay}] if params else []
    attn = {id(p) for p in attention_parameters(model)}
    groups = [
        {"params": [p for p in params if id(p) not in attn], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in attn], "weight_decay": attention_weight_decay},
    ]
    return [g for g in groups if g["params"]]


@dataclass
class _Best:
    """The best epoch so far by the selection metric (the first eligible epoch until one
    is better); epochs before ``first`` (the option ``select_from_epoch``) are never kept."""

    higher: bool
    value: float | None = None
    epoch: int = 0
    dev: dict[str, float] = field(default_factory=dict)
    state: dict[str, torch.Tensor] | None = None
    first: int = 1

    def offer(self, epoch: int, dev: dict[str, float], value: float, model: nn.Module) -> None:
        """Keep ``epoch`` (its dev metrics and a CPU copy of the model's state) when its
        selection ``value`` is better than the best one, or when it is the first eligible
        one (``epoch >= first``)."""
        if epoch < self.first:
            return
        better = _is_better(value, self.value, self.higher)
        if self.state is not None and not better:
            return
        if better:
            self.value = value
        self.epoch, self.dev = epoch, dev
        self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


class _Trainer:
    """The training loop of one run: Adam (the task's options ``lr``, ``weight_decay``,
    ``attention_weight_decay`` (:func:`parameter_groups`) and ``amsgrad``), gradient-norm
    clipping (``grad_clip`` 0 or none: no clipping), a gradient scaler for fp16, the
    seeded shuffling generator and the throughput measured over the epochs. A non-finite
    loss (:func:`_read_losses`), an Adam step that overflows (``lr`` or a weight decay too
    large) and parameters that are not finite after an epoch raise
    :class:`FloatingPointError` in one line naming the epoch and what to lower."""

    def __init__(
        self,
        task: Task,
        model: nn.Module,
        data: Any,
        device: torch.device,
        precision: str,
        seed: int,
        prefetch: int,
        progress: bool,
        compile: str | None = None,
    ) -> None:
        opts = task.options
        self.task, self.model, self.data = task, model, data
        # what the training steps call: the model itself, or its compiled forward (the
        # same parameters and modules; the evaluations call the model itself)
        self.step_model = model if compile is None else torch.compile(model, backend=compile)
        self.device, self.precision = device, precision
        self.prefetch, self.progress = prefetch, progress
        self.params = [p for p in model.parameters() if p.requires_grad]
        attn_decay = opts.get("attention_weight_decay")
        groups = parameter_groups(
            model,
            float(opts.get("weight_decay") or 0.0),
            None if attn_decay is None else float(attn_decay),
        )
        self.optimizer = torch.optim.Adam(
            groups, lr=float(opts["lr"]), amsgrad=bool(opts.get("amsgrad", False))
        )
        self.clip = opts.get("grad_clip")
        # fp16 gradients underflow without loss scaling; disabled, the scaler is a pass-through
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_size = int(opts["batch_size"])
        self.n_batches = _n_batches(data, self.batch_size)
        self.cuda = device.type == "cuda"
        # a GPU runs ahead of Python: read the loss back only every CUDA_SYNC_EVERY batches
        self.sync_every = CUDA_SYNC_EVERY if self.cuda else 1
        self.loop_seconds = 0.0  # in the training loops (not the dev evaluations)
        self.data_total = DataTimer()
        self.earlier_seconds = 0.0  # of training, by the processes this run resumed from
        self.earlier_peak: float | None = None  # their largest peak memory (MB)
        self.sampler: _PeakRSS | None = None  # the CPU memory sampler of this process

    def amp(self) -> contextlib.AbstractContextManager[None]:
        return precision_context(self.device, self.precision)

    def _stream(self, timer: DataTimer) -> Iterator[Any]:
        batches = self.task.batches(
            self.data, "train", self.batch_size, shuffle=True, generator=self.generator
        )
        return device_batches(
            batches, self.device, prefetch=self.prefetch, pin_memory=self.cuda, timer=timer
        )

    def _step(self, loss: torch.Tensor, epoch: int, batch: int) -> None:
        """Back-propagate ``loss`` (batch ``batch`` of epoch ``epoch``) and take the Adam
        step; a step that overflows the parameters' dtype raises
        :class:`FloatingPointError` naming the option to lower (:meth:`_overflow_cause`)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if self.clip:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
            torch.nn.utils.clip_grad_norm_(self.params, float(self.clip))
        try:
            self.scaler.step(self.optimizer)
        except RuntimeError as error:
            # torch turns lr / (1 - beta1) or the weight decay into a float of the
            # parameters' dtype: "value cannot be converted to type float without overflow"
            if "overflow" not in str(error):
                raise
            raise FloatingPointError(
                f"the Adam step overflows at epoch {epoch}, batch {batch}: "
                f"{self._overflow_cause(error)}"
            ) from error
        self.scaler.update()

    def _overflow_cause(self, error: RuntimeError) -> str:
        """Which option made the Adam step overflow (and what to do), in words: ``lr``
        when its first step, ``lr / (1 - beta1)``, exceeds the largest value of the
        parameters' dtype, else a weight decay beyond it, else torch's message."""
        dtype = self.params[0].dtype if self.params else torch.float32
        limit, kind = torch.finfo(dtype).max, str(dtype).removeprefix("torch.")
        opts = self.task.options
        lr, beta1 = float(opts["lr"]), float(self.optimizer.defaults["betas"][0])
        if lr / (1.0 - beta1) > limit:
            return (
                f"lr={lr:g} is too large (Adam's first step, lr / (1 - beta1) = "
                f"{lr / (1.0 - beta1):.3g}, exceeds {kind}'s largest value {limit:.3g}); "
                "lower lr"
            )
        for name in ("weight_decay", "attention_weight_decay"):
            value = opts.get(name)
            if value is not None and float(value) > limit:
                return (
                    f"{name}={float(value):g} exceeds {kind}'s largest value {limit:.3g}; "
                    f"lower {name}"
                )
        return f"{' '.join(str(error).split())}; lower lr"

    def _check_parameters(self, epoch: int) -> None:
        """Raise :class:`FloatingPointError` naming the first trainable parameter that is
        not finite after epoch ``epoch`` (a step with a finite loss but a NaN or infinite
        gradient or update); one device synchronisation per epoch."""
        if not self.params or bool(
            torch.stack([torch.isfinite(p).all() for p in self.params]).all()
        ):
            return
        name = next(
            (n for n, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())),
            "?",
        )
        raise FloatingPointError(
            f"the parameter {name!r} is not finite after epoch {epoch} (a step with a "
            "non-finite gradient or update); lower lr or check the data"
        )

    def epoch(self, epoch: int) -> tuple[float, DataTimer, float]:
        """Train one epoch; ``(mean training loss, its data timer, seconds of the loop)``."""
        t0 = time.perf_counter()
        self.model.train()
        total, count = 0.0, 0
        pending: list[torch.Tensor] = []  # losses not yet read back
        timer = DataTimer()
        bar = ProgressBar(
            self.progress, total=self.n_batches, desc=f"epoch {epoch}", unit="batch", leave=False
        )
        try:
            for batch in self._stream(timer):
                with self.amp():
                    loss = self.task.loss(self.step_model, batch)
                pending.append(loss.detach())
                count += 1
                if len(pending) >= self.sync_every:
                    # before the step: on the CPU (every batch) a NaN loss never reaches the
                    # weights; on CUDA up to sync_every - 1 steps after it are taken, then the
                    # run fails naming its batch, before that epoch's state is kept
                    total += _read_losses(pending, epoch, count)
                self._step(loss, epoch, count)
                if pending:
                    bar.update(1)
                else:
                    bar.update(1, loss=f"{total / count:.4f}")
            total += _read_losses(pending, epoch, count)
            # the next loss check would see a broken step only in the next epoch, after
            # this epoch's evaluation and its state were kept (or never, after the last)
            self._check_parameters(epoch)
        finally:
            bar.close()
        seconds = time.perf_counter() - t0
        self.loop_seconds += seconds
        self.data_total.seconds += timer.seconds
        self.data_total.batches += timer.batches
        self.data_total.examples += timer.examples
        if count == 0:
            raise ValueError("the train split gave no batches")
        return total / count, timer, seconds


def _fit(
    trainer: _Trainer, seed: int, epochs: int, saved: ResumeFile | None = None
) -> tuple[list[dict[str, Any]], _Best, list[int]]:
    """Train up to ``epochs`` epochs, evaluating on the dev split after each; the history,
    the best epoch by the task's selection metric and the epochs after which the run was
    resumed. With the option ``patience`` (an int ``p``), training stops once ``p`` epochs
    have passed since the best one (counted from the first eligible epoch,
    ``select_from_epoch``), as Lu et al. (2016) train for up to 256 epochs and stop once 5
    have passed without a better validation accuracy. With ``saved``, the run goes on after
    the epoch of a state saved there and saves its own state after every epoch."""
    task = trainer.task
    primary, higher = task.selection()
    history: list[dict[str, Any]] = []
    best = _Best(higher, first=int(task.options.get("select_from_epoch") or 1))
    patience = task.options.get("patience")
    state = saved.load() if saved is not None else None
    resumed_after = _restore(trainer, state, history, best) if state is not None else []
    epoch = state.epoch if state is not None else 0
    if state is not None and trainer.progress:
        print(f"resuming after epoch {epoch} of {epochs} ({_shown(saved.path)})", file=sys.stderr)
    t_start = time.perf_counter()
    # leave=None: the bar stays after `attnlab train`, not under an ablation's own bar
    bar = ProgressBar(
        trainer.progress,
        total=epochs,
        initial=epoch,
        desc=f"{task.name} seed {seed}",
        unit="epoch",
        leave=None,
    )
    try:
        while epoch < epochs and not _patience_over(patience, best, epoch):
            epoch += 1
            value = _epoch_and_dev(trainer, epoch, primary, history)
            best.offer(epoch, history[-1]["dev"], value, trainer.model)
            bar.update(1, **{f"dev_{primary}": f"{value:.4f}", "best": best.epoch})
            if saved is not None:
                seconds = trainer.earlier_seconds + time.perf_counter() - t_start
                saved.save(_capture(trainer, epoch, history, best, seconds, resumed_after))
    finally:
        bar.close()
    return history, best, resumed_after


def _shown(path: Path) -> Path:
    """``path`` relative to the working folder when it lies below it."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _patience_over(patience: Any, best: _Best, epoch: int) -> bool:
    """Whether ``patience`` epochs have passed since the best one after ``epoch``."""
    return bool(patience) and best.state is not None and epoch - best.epoch >= patience


def _epoch_and_dev(
    trainer: _Trainer, epoch: int, primary: str, history: list[dict[str, Any]]
) -> float:
    """Train epoch ``epoch``, evaluate on the dev split, append the epoch to ``history``;
    the value of the selection metric ``primary``."""
    task = trainer.task
    t0 = time.perf_counter()
    loss, timer, loop = trainer.epoch(epoch)
    with trainer.amp():
        dev_metrics = _evaluate(task, trainer.model, trainer.data, "dev")
    history.append(
        {
            "epoch": epoch,
            "train_loss": loss,
            "dev": dev_metrics,
            "seconds": time.perf_counter() - t0,
            "examples_per_second": timer.examples / loop if loop else None,
            "data_share": timer.seconds / loop if loop else None,
        }
    )
    if primary not in dev_metrics:
        raise KeyError(
            f"task {task.name!r}: evaluate() returned {sorted(dev_metrics)}, "
            f"without the selection metric {primary!r}"
        )
    return dev_metrics[primary]


def _capture(
    trainer: _Trainer,
    epoch: int,
    history: list[dict[str, Any]],
    best: _Best,
    seconds: float,
    resumed_after: list[int],
) -> EpochState:
    """The state of the run after ``epoch`` (``seconds`` of training so far)."""
    data = trainer.data_total
    return EpochState(
        epoch=epoch,
        history=history,
        best={"epoch": best.epoch, "value": best.value, "dev": best.dev},
        best_state=best.state,
        model=trainer.model.state_dict(),
        optimizer=trainer.optimizer.state_dict(),
        scaler=trainer.scaler.state_dict(),
        generator=trainer.generator.get_state(),
        rng=capture_rng(trainer.device),
        counters={
            **_peak_counter(trainer),
            "train_seconds": seconds,
            "loop_seconds": trainer.loop_seconds,
            "data_seconds": data.seconds,
            "data_batches": data.batches,
            "data_examples": data.examples,
        },
        resumed_after=resumed_after,
    )


def _peak_so_far(trainer: _Trainer) -> float | None:
    """The run's peak memory (MB) so far in this process: CUDA's allocator peak on CUDA,
    else the resident-set sampler's (None where it cannot measure)."""
    if trainer.cuda:
        return torch.cuda.max_memory_allocated(trainer.device) / 2**20
    sampler = trainer.sampler
    return sampler.peak if sampler is not None and sampler.start is not None else None


def _peak_counter(trainer: _Trainer) -> dict[str, float]:
    """``{"peak_memory_mb": ...}``: the largest peak of this process and of those the run
    resumed from (empty when none was measured)."""
    peaks = [p for p in (_peak_so_far(trainer), trainer.earlier_peak) if p is not None]
    return {"peak_memory_mb": max(peaks)} if peaks else {}


def _restore(
    trainer: _Trainer, state: EpochState, history: list[dict[str, Any]], best: _Best
) -> list[int]:
    """Put the saved ``state`` back into the trainer (model, optimizer, scaler, random
    states, counters), ``history`` and ``best``; the epochs after which the run has now
    been resumed."""
    trainer.model.load_state_dict(state.model)
    trainer.optimizer.load_state_dict(state.optimizer)
    trainer.scaler.load_state_dict(state.scaler)
    trainer.generator.set_state(state.generator)
    restore_rng(state.rng, trainer.device)
    history.extend(state.history)
    best.epoch, best.value, best.dev = state.best["epoch"], state.best["value"], state.best["dev"]
    best.state = state.best_state
    counters = state.counters
    trainer.earlier_seconds = counters["train_seconds"]
    trainer.earlier_peak = counters.get("peak_memory_mb")
    trainer.loop_seconds = counters["loop_seconds"]
    trainer.data_total.seconds = counters["data_seconds"]
    trainer.data_total.batches = int(counters["data_batches"])
    trainer.data_total.examples = int(counters["data_examples"])
    return [*state.resumed_after, state.epoch]


def _test_examples(trainer: _Trainer) -> list[AttentionExample]:
    """The task's attention examples of the model (checked to be
    :class:`~attnlab.lab.task.AttentionExample` objects)."""
    task = trainer.task
    trainer.model.eval()
    with torch.no_grad(), trainer.amp():
        examples = task.attention_examples(trainer.model, trainer.data)
    for ex in examples:
        if not isinstance(ex, AttentionExample):
            raise TypeError(
                f"task {task.name!r}: attention_examples must return AttentionExample "
                f"objects, got {type(ex).__name__}"
            )
    return examples


def _train(
    task: Task,
    spec: dict[str, Any],
    seed: int,
    device: torch.device,
    precision: str,
    work: Path,
    progress: bool,
    prefetch: int = 0,
    saved: ResumeFile | None = None,
    run_info: dict[str, Any] | None = None,
    compile: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Train (going on from the state in ``saved`` when it holds one of this run), select
    the best epoch, test it and write the files of the run into ``work``; ``(metrics,
    history, cost)`` as plain JSON data. The epochs after which the run was resumed go
    into ``run_info["resumed_after"]``."""
    seed_everything(seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    data = task.load_data_showing(progress)  # a bar while slow data is prepared (speech)
    sampler = None if cuda else _PeakRSS()  # model, optimizer state, activations, evaluation
    model = build_task_model(task, data, spec, sampler).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    trainer = _Trainer(task, model, data, device, precision, seed, prefetch, progress, compile)
    trainer.sampler = sampler
    epochs = int(task.options["epochs"])
    train_start = time.perf_counter()
    history, best, resumed_after = _fit(trainer, seed, epochs, saved)
    train_seconds = trainer.earlier_seconds + time.perf_counter() - train_start
    if run_info is not None:
        run_info["resumed_after"] = resumed_after

    assert best.state is not None
    model.load_state_dict(best.state)
    n_test = _n_items(task, data, "test", trainer.batch_size)
    t0 = time.perf_counter()
    with trainer.amp():
        test_metrics = _evaluate(task, model, data, "test")
    eval_seconds = time.perf_counter() - t0
    examples = _test_examples(trainer)

    if sampler is not None:
        sampler.stop()
    peak = _peak_counter(trainer).get("peak_memory_mb")
    primary, higher = task.selection()
    metrics = {
        "primary": primary,
        "higher_is_better": higher,
        "best_epoch": best.epoch,
        "epochs_trained": len(history),
        "dev": best.dev,
        "test": test_metrics,
    }
    loops, data_total = trainer.loop_seconds, trainer.data_total
    cost = {
        "parameters": int(n_params),
        "train_seconds": train_seconds,
        "seconds_per_epoch": train_seconds / max(len(history), 1),
        "eval_ms_per_example": 1000.0 * eval_seconds / max(n_test, 1),
        "peak_memory_mb": peak,
        "examples_per_second": data_total.examples / loops if loops else None,
        "data_seconds": data_total.seconds,
        "data_share": data_total.seconds / loops if loops else None,
        "prefetch": prefetch,
    }
    save_state(model, work / "model.safetensors")
    write_json(work / "metrics.json", metrics)
    write_json(work / "history.json", history)
    write_json(work / "cost.json", cost)
    write_json(work / "examples.json", [ex.to_json() for ex in examples])
    return jsonable(metrics), jsonable(history), jsonable(cost)


def _read_losses(pending: list[torch.Tensor], epoch: int, count: int) -> float:
    """The sum of the training losses ``pending`` (the last of ``count`` batches so far),
    read back from the device at once, and ``pending`` emptied; raises
    :class:`FloatingPointError` naming the first batch whose loss is not finite."""
    if not pending:
        return 0.0
    values = torch.stack(pending).double().cpu()
    bad = (~torch.isfinite(values)).nonzero()
    if len(bad):
        k = int(bad[0])
        raise FloatingPointError(
            f"the training loss is {float(values[k])} at epoch {epoch}, batch "
            f"{count - len(pending) + k + 1}; lower lr or check the data"
        )
    pending.clear()
    return float(values.sum()) if len(values) > 1 else float(values[0])


def _evaluate(task: Task, model: nn.Module, data: Any, split: str) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        out = task.evaluate(model, data, split)
    missing = [m for m in task.metrics if m not in out]
    if missing:
        raise KeyError(f"task {task.name!r}: evaluate() on {split} lacks the metrics {missing}")
    return {str(k): float(v) for k, v in out.items()}


# ----------------------------------------------------------------------------- loading


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _check_run_json(info: dict[str, Any]) -> str | None:
    for key, types in (
        ("task", (str,)),
        ("status", (str,)),
        ("seed", (int,)),
        ("attention", (dict, type(None))),
        ("task_options", (dict, type(None))),
        ("label", (str, type(None))),
        ("error", (str, type(None))),
        ("checkpoint_sha256", (str, type(None))),
        ("device", (str, type(None))),
        ("precision", (str, type(None))),
        ("resumed_after", (list,)),
        ("compile", (str, type(None))),
    ):
        if key in ("task", "status") and key not in info:
            return f"has no {key!r}"
        if key in info and (not isinstance(info[key], types) or isinstance(info[key], bool)):
            return f"{key!r} is {type(info[key]).__name__}, not {types[0].__name__}"
    return None


def _check_metrics_json(metrics: dict[str, Any]) -> str | None:
    for split in ("dev", "test"):
        values = metrics.get(split, {})
        if not isinstance(values, dict):
            return f"{split!r} is {type(values).__name__}, not an object of metric values"
        bad = [k for k, v in values.items() if not _is_number(v)]
        if bad:
            return f"{split} metric {bad[0]!r} is {values[bad[0]]!r}, not a number"
    if "primary" in metrics and not isinstance(metrics["primary"], str):
        return f"'primary' is {type(metrics['primary']).__name__}, not str"
    if "best_epoch" in metrics and not (
        isinstance(metrics["best_epoch"], int) and not isinstance(metrics["best_epoch"], bool)
    ):
        return f"'best_epoch' is {metrics['best_epoch']!r}, not an int"
    return None


#: The JSON files of a run directory: the type of their top-level value and a field check.
_RUN_JSON: dict[str, tuple[type, Callable[[Any], str | None] | None]] = {
    "run.json": (dict, _check_run_json),
    "metrics.json": (dict, _check_metrics_json),
    "cost.json": (dict, None),
    "history.json": (
        list,
        lambda items: next(
            (f"entry {i} is not an object" for i, h in enumerate(items) if not isinstance(h, dict)),
            None,
        ),
    ),
    "examples.json": (list, None),
}


def read_run_file(run_dir: str | Path, name: str) -> Any:
    """One JSON file of a run directory (``run.json``, ``metrics.json``, ``cost.json``,
    ``history.json`` or ``examples.json``), checked: the top-level type (an object, or a
    list for ``history.json`` and ``examples.json``) and, for ``run.json`` and
    ``metrics.json``, the types of the fields the lab reads.

    Raises :class:`~attnlab.lab.checkpoint.MissingRunFileError` when the file is missing
    and :class:`~attnlab.lab.checkpoint.RunFileError` (one line naming the file) when it
    is unreadable, not JSON or malformed.
    """
    if name not in _RUN_JSON:
        raise ValueError(f"name must be one of {', '.join(_RUN_JSON)}, got {name!r}")
    run_dir = check_path(run_dir, "run_dir")
    path = run_dir / name
    if not path.is_file():
        if name == "run.json":
            raise MissingRunFileError(f"{str(run_dir)!r} is not a run directory (no run.json)")
        raise MissingRunFileError(f"{str(path)!r} is missing")
    expected, check = _RUN_JSON[name]
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise RunFileError(f"{str(path)!r} is not readable JSON ({reason})") from None
    if not isinstance(value, expected):
        what = "an object" if expected is dict else "a list"
        raise RunFileError(f"{str(path)!r} holds {type(value).__name__}, not {what}")
    problem = check(value) if check is not None else None
    if problem:
        raise RunFileError(f"{str(path)!r} is malformed: {problem}")
    return value


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """The ``run.json`` of a run directory, checked (:func:`read_run_file`)."""
    return read_run_file(run_dir, "run.json")


def read_metrics(run_dir: str | Path) -> dict[str, Any]:
    """The ``metrics.json`` of a run directory, checked (:func:`read_run_file`)."""
    return read_run_file(run_dir, "metrics.json")


def task_data(task: Task, cache: dict[str, Any] | None = None) -> Any:
    """``task.load_data()``, shared through ``cache`` (when given) between tasks of the
    same name and options: the runs of one ablation read their data once."""
    if cache is None:
        return task.load_data()
    key = json.dumps([task.name, task.options], sort_keys=True, default=str)
    if key not in cache:
        cache[key] = task.load_data()
    return cache[key]


def load_run(
    run_dir: str | Path, *, device: str = "cpu", data_cache: dict[str, Any] | None = None
) -> tuple[Task, Any, nn.Module]:
    """``(task, data, model)`` of a finished run: the task with the run's options, its data
    (loaded again, or shared through ``data_cache`` with the runs of the same task options:
    :func:`task_data`) and the model rebuilt from ``run.json`` with the best epoch's
    weights from ``model.safetensors`` (no pickle is read), in eval mode on ``device``.

    A task registered by a plugin must be imported (registered) before. A missing,
    damaged or changed checkpoint (its sha256 differs from ``run.json``'s
    ``checkpoint_sha256``), or a malformed ``run.json``, raises
    :class:`~attnlab.lab.checkpoint.RunFileError` naming the file.
    """
    run_dir = check_path(run_dir, "run_dir")
    info = read_run(run_dir)
    if info.get("status") != "done":
        raise RunFileError(
            f"run {str(run_dir)!r} has status {info.get('status')!r}, not 'done'"
            + (f" (error: {' '.join(str(info['error']).split())})" if info.get("error") else "")
        )
    # the checkpoint first: a damaged one fails before the (maybe slow) data is loaded
    checkpoint = check_checkpoint(run_dir / "model.safetensors", info.get("checkpoint_sha256"))
    task = resolve_task(info["task"], info.get("task_options") or {})
    dev = resolve_device(device)
    seed_everything(int(info.get("seed", 0)))
    data = task_data(task, data_cache)
    spec = task.resolve_attention(info.get("attention") or {})
    model = task.build_model(data, spec)
    try:
        load_state(model, checkpoint, strict=True, device="cpu")
    except RuntimeError as err:  # another layout than run.json's model
        reason = " ".join(str(err).split())[:300]
        raise RunFileError(
            f"checkpoint {str(checkpoint)!r} does not fit the model that run.json describes "
            f"({reason})"
        ) from None
    model.to(dev).eval()
    return task, data, model


def iter_batches_on(task: Task, data: Any, split: str, batch_size: int, device: Any) -> Iterator:
    """``task.batches(data, split, batch_size)`` with every tensor moved to ``device`` (for
    tasks' ``evaluate``)."""
    for batch in task.batches(data, split, batch_size):
        yield move_batch(batch, device)
