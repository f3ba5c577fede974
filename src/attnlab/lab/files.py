"""The lab's files: plain JSON values, UTC timestamps and atomic writes, in one place.

Every file the lab writes (``run.json``, ``metrics.json``, ``ablation.json``, the report's
data) goes through :func:`write_json`: the text is written to a hidden temporary file
beside the target and moved over it with :func:`os.replace`, so a reader never sees a
half-written file and an interrupted write leaves the old one. Timestamps are UTC
(ISO 8601 with ``+00:00``) everywhere. :func:`check_folder` checks, before anything is
written, that an output folder can be made where the user asked for it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab._atomic import write_text as atomic_write_text
from attnlab._checks import ConfigError

__all__ = [
    "check_folder",
    "check_run_home",
    "jsonable",
    "make_folder",
    "utc_now",
    "write_json",
    "write_text",
]


def utc_now() -> str:
    """The current time in UTC, ISO 8601 to the second (``2026-11-25T14:44:59+00:00``)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def jsonable(value: Any) -> Any:
    """Plain JSON data: mappings -> dicts with text keys, tuples -> lists, sets -> sorted
    lists, non-finite floats -> ``None``, numpy / torch scalars -> Python numbers, numpy
    arrays and tensors -> (nested) lists, paths and any other object -> their text."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, np.generic | torch.Tensor) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, torch.Tensor):  # a per-class metric: numbers, not "tensor([...])"
        return jsonable(value.detach().cpu().tolist())
    if isinstance(value, set | frozenset):
        items = [jsonable(v) for v in value]
        try:
            return sorted(items)
        except TypeError:  # items of several types: their text decides the order
            return sorted(items, key=str)
    return str(value)


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file beside it, then rename), with
    the mode of the file it replaces or of a new file (:mod:`attnlab._atomic`)."""
    path = Path(path)
    try:
        atomic_write_text(path, text)
    except OSError as error:  # name the file asked for, not the temporary one
        if error.errno is None:
            raise
        raise OSError(error.errno, error.strerror, str(path)) from error


def write_json(path: str | os.PathLike[str], payload: Any, *, sort_keys: bool = False) -> None:
    """Write ``payload`` (made :func:`jsonable`) as indented JSON, atomically."""
    text = json.dumps(jsonable(payload), indent=2, sort_keys=sort_keys, allow_nan=False)
    write_text(path, text + "\n")


def check_folder(folder: str | os.PathLike[str], what: str) -> None:
    """Check that ``folder`` is, or can be made, a folder: raise
    :class:`~attnlab._checks.ConfigError` with one line starting with ``what`` (e.g.
    ``"--out runs/x"``) when it, or a folder above it, exists and is not a folder
    (``"--out a/x: a is a file, not a folder"``). Nothing is created.

    Each path is looked at once (one ``stat``), so a folder that another process makes
    while this one looks (N ablations started together on one directory) is either not
    there yet or a folder, never "not a folder"."""
    folder = Path(folder)
    for path in (folder, *folder.parents):
        try:
            mode = os.stat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(path):  # a link to nothing
                raise ConfigError(f"{what}: {path} is a link to nothing, not a folder") from None
            continue
        except OSError:  # e.g. no permission to look: mkdir says why it cannot make it
            continue
        if stat.S_ISDIR(mode):
            return
        kind = "a file, not a folder" if stat.S_ISREG(mode) else "not a folder"
        raise ConfigError(f"{what}: {path} is {kind}")


def check_run_home(folder: str | os.PathLike[str], what: str, *, kind: str) -> None:
    """Check that ``folder`` may hold what ``kind`` writes: ``"runs"`` (``attnlab train``'s
    run directories) or ``"ablation"`` (``ablation.json``, ``results.sqlite``, ``runs/``).
    Raise :class:`~attnlab._checks.ConfigError` with one line starting with ``what`` (e.g.
    ``"--out runs/x"``) when ``folder`` is, or lies inside, a run directory (one holding
    ``run.json``) or lies inside an ablation directory (one holding ``ablation.json``);
    for runs, when it is an ablation directory; for an ablation, when it holds run
    directories but no ``ablation.json`` (``attnlab train``'s). Nothing is created."""
    folder = Path(folder)
    full = folder.resolve()
    for path in (full, *full.parents):
        if (path / "run.json").is_file():
            where = "a run directory" if path == full else f"inside the run directory {path}"
            raise ConfigError(f"{what}: {where}; give a folder of its own")
        if path != full and (path / "ablation.json").is_file():
            raise ConfigError(
                f"{what}: inside the ablation directory {path}; give a folder of its own"
            )
    if not folder.is_dir():
        return
    if kind == "runs" and (folder / "ablation.json").is_file():
        raise ConfigError(
            f"{what}: an ablation directory (attnlab ablate's); give a folder of its own"
        )
    if kind == "ablation" and not (folder / "ablation.json").exists():
        try:
            runs = sorted(c.name for c in folder.iterdir() if (c / "run.json").is_file())
        except OSError:  # no permission to look: making the ablation's files says why
            runs = []
        if runs:
            raise ConfigError(
                f"{what}: it holds run directories of attnlab train ({runs[0]}, ...), not an "
                "ablation; give a folder of its own"
            )


def make_folder(folder: str | os.PathLike[str], what: str) -> Path:
    """Create ``folder`` and the folders above it (nothing when it exists) and return it; a
    file in the way (:func:`check_folder`) or a folder that cannot be made (no permission,
    a read-only disk) raises :class:`~attnlab._checks.ConfigError` with one line starting
    with ``what``: ``"--out /usr/x: cannot create /usr/x (Permission denied)"``."""
    folder = Path(folder)
    check_folder(folder, what)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(f"{what}: cannot create {folder} ({error.strerror or error})") from None
    return folder
