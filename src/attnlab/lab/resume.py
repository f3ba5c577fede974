"""Resuming an interrupted training run after its last finished epoch.

After every epoch, :func:`attnlab.lab.training.train_run` writes the whole state of the run
to ``.<run>.resume.safetensors`` beside the run directory: the model, the optimizer (Adam's
moments and steps), the gradient scaler, the shuffling generator and the random states of
``torch`` (and CUDA), ``numpy`` and ``random``, the history, the best epoch so far (its dev
metrics and weights) and the time spent. The file is written to a temporary name and moved
into place, so a run killed while writing it keeps the state of the epoch before.

When the same run is started again -- the same task, task options, attention spec, seed,
device, precision and attnlab version (:func:`fingerprint`) -- it goes on after that epoch
instead of from epoch 1 and ends with what a run that was never stopped would have given:
on the CPU the same weights, history and metrics, bit for bit (on CUDA as close as two
uninterrupted runs are). ``run.json`` lists the epochs after which the run was resumed
(``resumed_after``); ``cost.json`` sums the training time of every part and keeps the
largest peak memory.

The file is removed once the run directory is published as done. A failed run keeps it, so
that a run stopped by an error that does not come again (out of memory, a full disk) goes
on where it stopped; a run that fails the same way fails again at the same epoch.

The file holds only tensors, with the rest as JSON in the safetensors header: reading it
never runs code from it. A state left by a run of other settings is not used (a warning
says which settings differ), nor is one that cannot be read (a warning names the file);
the run then starts from epoch 1 and replaces it after its first epoch.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from attnlab._atomic import temp_files, write_file

__all__ = [
    "RESUME_SUFFIX",
    "EpochState",
    "ResumeFile",
    "capture_rng",
    "fingerprint",
    "restore_rng",
    "resume_path",
]

#: The ending of the name of a run's resume state: ``.<run>.resume.safetensors``.
RESUME_SUFFIX = ".resume.safetensors"
_FORMAT = 1
_META_KEY = "attnlab_resume"


def resume_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where the resume state of the run directory ``run_dir`` lives: the hidden file
    ``.<name>.resume.safetensors`` beside it."""
    run_dir = Path(run_dir)
    return run_dir.with_name(f".{run_dir.name}{RESUME_SUFFIX}")


def fingerprint(run_info: dict[str, Any]) -> dict[str, Any]:
    """What must be the same for a run to go on from a saved state: the task, its options,
    the attention spec, the seed, the device, the precision and attnlab's version (from the
    run's ``run.json`` fields), as plain JSON data."""
    keys = ("task", "task_options", "attention", "seed", "device", "precision")
    found = {key: run_info.get(key) for key in keys}
    found["attnlab"] = run_info.get("versions", {}).get("attnlab")
    return json.loads(json.dumps(found, sort_keys=True, default=str))


@dataclass
class EpochState:
    """The state of a run after ``epoch`` finished epochs (see the module docstring).

    ``best`` holds ``epoch``, ``value`` and ``dev`` of the best epoch so far and
    ``best_state`` its weights (None before the first eligible epoch); ``counters`` the
    seconds and counts that ``cost.json`` sums; ``resumed_after`` the epochs after which
    the run was resumed before."""

    epoch: int
    history: list[dict[str, Any]]
    best: dict[str, Any]
    best_state: dict[str, Tensor] | None
    model: dict[str, Tensor]
    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    generator: Tensor
    rng: dict[str, Any]
    counters: dict[str, float] = field(default_factory=dict)
    resumed_after: list[int] = field(default_factory=list)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """The global random states: ``torch`` (and CUDA's on a CUDA ``device``), ``numpy``
    and ``random``."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "numpy": np.random.get_state(),  # noqa: NPY002 (the state seed_everything seeds)
        "python": random.getstate(),
    }


def restore_rng(rng: dict[str, Any], device: torch.device) -> None:
    """Set the global random states that :func:`capture_rng` returned."""
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state(rng["cuda"], device)
    np.random.set_state(rng["numpy"])  # noqa: NPY002
    random.setstate(rng["python"])


def _cpu(value: Tensor) -> Tensor:
    return value.detach().to("cpu", copy=True).contiguous()


def _optimizer_parts(optimizer: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """The tensors of an optimizer's ``state_dict`` (``optimizer/<param>/<name>``) and the
    rest as JSON data."""
    tensors: dict[str, Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for index, entry in optimizer["state"].items():
        plain[str(index)] = {}
        for name, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer/{index}/{name}"] = _cpu(value)
            else:
                plain[str(index)][name] = value
    return tensors, {"param_groups": optimizer["param_groups"], "state": plain}


def _to_file(state: EpochState, prints: dict[str, Any]) -> tuple[dict[str, Tensor], str]:
    """The tensors and the JSON header of ``state``."""
    tensors = {f"model/{k}": _cpu(v) for k, v in state.model.items()}
    tensors.update({f"best/{k}": _cpu(v) for k, v in (state.best_state or {}).items()})
    optimizer_tensors, optimizer = _optimizer_parts(state.optimizer)
    tensors.update(optimizer_tensors)
    tensors["rng/torch"] = _cpu(state.rng["torch"])
    tensors["rng/generator"] = _cpu(state.generator)
    if state.rng.get("cuda") is not None:
        tensors["rng/cuda"] = _cpu(state.rng["cuda"])
    name, keys, pos, has_gauss, cached = state.rng["numpy"]
    tensors["rng/numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    version, internal, gauss_next = state.rng["python"]
    meta = {
        "format": _FORMAT,
        "fingerprint": prints,
        "epoch": state.epoch,
        "history": state.history,
        "best": state.best,
        "has_best_state": state.best_state is not None,
        "optimizer": optimizer,
        "scaler": state.scaler,
        "numpy": [name, int(pos), int(has_gauss), float(cached)],
        "python": [version, list(internal), gauss_next],
        "counters": state.counters,
        "resumed_after": state.resumed_after,
    }
    return tensors, json.dumps(meta)


def _section(tensors: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


def _optimizer_from(meta: dict[str, Any], tensors: dict[str, Tensor]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for index, plain in meta["state"].items():
        state[int(index)] = dict(plain)
    for key, value in _section(tensors, "optimizer/").items():
        index, name = key.split("/", 1)
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def _from_file(tensors: dict[str, Tensor], meta: dict[str, Any]) -> EpochState:
    """The :class:`EpochState` that :func:`_to_file` wrote."""
    name, pos, has_gauss, cached = meta["numpy"]
    keys = tensors["rng/numpy"].numpy().astype(np.uint32)
    version, internal, gauss_next = meta["python"]
    rng = {
        "torch": tensors["rng/torch"],
        "cuda": tensors.get("rng/cuda"),
        "numpy": (name, keys, int(pos), int(has_gauss), float(cached)),
        "python": (int(version), tuple(int(x) for x in internal), gauss_next),
    }
    return EpochState(
        epoch=int(meta["epoch"]),
        history=list(meta["history"]),
        best=dict(meta["best"]),
        best_state=_section(tensors, "best/") if meta["has_best_state"] else None,
        model=_section(tensors, "model/"),
        optimizer=_optimizer_from(meta["optimizer"], tensors),
        scaler=dict(meta["scaler"]),
        generator=tensors["rng/generator"],
        rng=rng,
        counters={k: float(v) for k, v in meta["counters"].items()},
        resumed_after=[int(e) for e in meta["resumed_after"]],
    )


class ResumeFile:
    """The resume state of one run: :meth:`load` it when the run starts, :meth:`save` it
    after every epoch, :meth:`remove` it once the run is done.

    ``path``: the file (:func:`resume_path` of the run directory); ``prints``: the run's
    :func:`fingerprint`, which a saved state must match to be used."""

    def __init__(self, path: str | os.PathLike[str], prints: dict[str, Any]) -> None:
        self.path = Path(path)
        self.prints = prints
        self._save_failed = False

    def load(self) -> EpochState | None:
        """The saved state of this run, or None: no file, a file of other settings (a
        warning names the settings that differ) or one that cannot be read (a warning
        names the file and the reason). Temporary files that a process killed while
        writing the state left beside it are removed."""
        for leftover in temp_files(self.path):
            leftover.unlink(missing_ok=True)
        if not self.path.is_file():
            return None
        try:
            with safe_open(str(self.path), framework="pt", device="cpu") as handle:
                header = (handle.metadata() or {}).get(_META_KEY)
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}
            meta = json.loads(header) if header is not None else None
            if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
                raise ValueError("not a resume state of this attnlab version")
            if meta["fingerprint"] != self.prints:
                self._warn_other_settings(meta["fingerprint"])
                return None
            return _from_file(tensors, meta)
        except Exception as error:  # a damaged state must never stop the run
            warnings.warn(
                f"cannot resume from {self.path} ({type(error).__name__}: {error}); "
                "training from epoch 1",
                stacklevel=3,
            )
            return None

    def _warn_other_settings(self, saved: Any) -> None:
        saved = saved if isinstance(saved, dict) else {}
        differ = sorted(
            k for k in set(saved) | set(self.prints) if saved.get(k) != self.prints.get(k)
        )
        warnings.warn(
            f"{self.path} holds the state of a run with other settings "
            f"({', '.join(differ)} differ); training from epoch 1",
            stacklevel=4,
        )

    def save(self, state: EpochState) -> None:
        """Write ``state`` (to a temporary file, then moved into place). A file that cannot
        be written (a full disk) does not stop the run: a warning says so, once."""
        try:
            tensors, header = _to_file(state, self.prints)
            write_file(
                self.path, lambda tmp: save_file(tensors, str(tmp), metadata={_META_KEY: header})
            )
        except (OSError, TypeError, ValueError) as error:  # TypeError: not JSON data
            if not self._save_failed:
                self._save_failed = True
                warnings.warn(
                    f"cannot write the resume state {self.path} ({error}); an interrupted "
                    "run will start again from epoch 1",
                    stacklevel=3,
                )

    def remove(self) -> None:
        """Remove the file (nothing when there is none)."""
        self.path.unlink(missing_ok=True)
