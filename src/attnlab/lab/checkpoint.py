"""Model checkpoints in the safetensors format, written atomically, whatever the layout of
the model's tensors.

safetensors files hold only tensors (no pickled code), so loading one never runs code from
the file. :func:`save_state` writes ``model.state_dict()`` with ``safetensors.torch.save_file``,
first to a temporary file in the same folder, then moves it into place with ``os.replace``:
a crash mid-write never leaves a truncated checkpoint.

The layout of the tensors does not matter (:func:`portable_state`): names that are the
same tensor (tied weights, e.g. an embedding shared with the output layer) are stored
once, and the file's metadata maps each dropped name to the one kept; every other tensor
is stored as its own contiguous CPU copy. That covers what ``safetensors.torch.save_model``
refuses: parameters that are views of one shared buffer without any of them covering it
(cuDNN's ``flatten_parameters`` packs an LSTM's or GRU's weights into one buffer on CUDA,
so every recurrent model trained on a GPU has them), and transposed or offset views.

:func:`load_state` loads a file back into a model of the same layout on any device (its
``device`` argument, like ``torch.load``'s ``map_location``), filling tied names from the
name stored (by the metadata, or because the model ties them). Given the sha256 that
:func:`file_sha256` computed when the run was written (``run.json``'s
``checkpoint_sha256``), it refuses a file whose bytes changed since (a flipped byte in the
tensor data would otherwise load silently). Files written by ``save_model`` (older runs)
load the same way.

A missing, damaged or tampered file of a run raises :class:`RunFileError` (a
:class:`~attnlab._checks.ConfigError`, so the command line prints it as one ``error:``
line): the message names the file and what to do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab._atomic import write_file
from attnlab._checks import ConfigError, check_path

__all__ = [
    "MissingRunFileError",
    "RunFileError",
    "check_checkpoint",
    "file_sha256",
    "load_state",
    "portable_state",
    "save_state",
]


class RunFileError(ConfigError):
    """A file of a run or an ablation (checkpoint, ``run.json``, ``metrics.json``,
    ``results.sqlite``) is missing, damaged or not what it should be. The message is one
    line naming the file."""


class MissingRunFileError(RunFileError, FileNotFoundError):
    """A file of a run is missing (also a :class:`FileNotFoundError`)."""


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of the bytes of ``path`` (text or ``os.PathLike``, ``~`` expanded: an
    int would be read as an open file descriptor)."""
    digest = hashlib.sha256()
    with open(check_path(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_checkpoint(path: str | Path, sha256: str | None = None) -> Path:
    """``path`` as a :class:`~pathlib.Path` after checking that it is a file and, when
    ``sha256`` is given, that its bytes have that checksum. Raises
    :class:`MissingRunFileError` / :class:`RunFileError` naming the file (``path`` that is
    no path: ``TypeError``; ``~`` is expanded)."""
    file = check_path(path)
    if not file.is_file():
        raise MissingRunFileError(f"no checkpoint at {str(file)!r}; train the run again")
    if sha256 is not None:
        actual = file_sha256(file)
        if actual != sha256:
            raise RunFileError(
                f"checkpoint {str(file)!r} is damaged: its sha256 {actual[:12]}... differs "
                f"from the {sha256[:12]}... recorded when it was written; train the run again"
            )
    return file


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are one tensor: the same storage, offset, shape and strides
    (tied weights), as opposed to two views of one buffer (cuDNN's flattened weights)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )


def _alias_groups(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """``{name: kept name}`` for every name of ``state`` that is the same tensor as an
    earlier one (:func:`_same_tensor`); the first name of each group is kept."""
    aliases: dict[str, str] = {}
    kept: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        key = (str(tensor.device), tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))
        for other in kept.get(key, ()):
            if _same_tensor(state[other], tensor):
                aliases[name] = other
                break
        else:
            kept.setdefault(key, []).append(name)
    return aliases


def portable_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, aliases)``: the state dict of ``model`` as safetensors can store it --
    every tensor a contiguous CPU copy that owns its storage, names that are the same
    tensor (tied weights) stored once -- and ``{dropped name: kept name}``."""
    state = model.state_dict()
    aliases = _alias_groups(state)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in aliases:
            continue
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")  # a new storage per tensor (views of one CUDA buffer included)
        else:
            t = t.clone(memory_format=torch.contiguous_format)  # owns its storage
        tensors[name] = t.contiguous()
    return tensors, aliases


def save_state(model: nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None):
    """Write ``model``'s state dict to ``path`` (safetensors), atomically, whatever its
    storage layout (:func:`portable_state`); the metadata holds ``metadata`` and, for each
    tied name stored once, ``{dropped name: kept name}``. Returns the path (``~``
    expanded); a folder at ``path`` is an ``IsADirectoryError`` before anything is
    written."""
    from safetensors.torch import save_file

    target = check_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors, aliases = portable_state(model)
    meta = dict(aliases)
    meta.update(metadata or {})  # the caller's own entries win, as with save_model
    return write_file(target, lambda tmp: save_file(tensors, str(tmp), metadata=meta or None))


def _read_file(file: Path, device: Any) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors of a safetensors file on ``device`` and its metadata."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    with safe_open(str(file), framework="pt", device=str(device)) as f:
        meta = dict(f.metadata() or {})
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    return tensors, meta


def load_state(
    model: nn.Module,
    path: str | Path,
    *,
    strict: bool = True,
    device: Any = None,
    sha256: str | None = None,
) -> tuple[list[str], list[str]]:
    """Load the safetensors checkpoint ``path`` into ``model`` in place.

    ``strict=True`` raises ``RuntimeError`` naming missing and unexpected keys; with
    ``strict=False`` they are returned as ``(missing, unexpected)``. Tensors are read onto
    ``device`` (default: the device of the model's first parameter or buffer, else CPU) and
    copied into the model's own tensors, so the model keeps its device and layout (tied
    weights stay tied, cuDNN's flattened buffer stays one buffer).

    ``sha256``: the checksum recorded when the file was written; a file whose bytes differ
    raises :class:`RunFileError` before anything is loaded (None: not checked). A missing
    file raises :class:`MissingRunFileError`; a file that is not a safetensors checkpoint
    (truncated, empty, random bytes) raises :class:`RunFileError`.
    """
    file = check_checkpoint(path, sha256)
    if device is None:
        device = _model_device(model)
    try:
        tensors, meta = _read_file(file, device)
    except Exception as err:  # safetensors' own error: not a (complete) safetensors file
        reason = " ".join(str(err).split()) or type(err).__name__
        raise RunFileError(
            f"checkpoint {str(file)!r} is damaged or not a safetensors file ({reason}); "
            "train the run again"
        ) from None
    _fill_tied(tensors, meta, model.state_dict())
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing, unexpected = list(missing), list(unexpected)
    if strict and (missing or unexpected):
        raise RuntimeError(_mismatch(model, missing, unexpected))
    return missing, unexpected


def _model_device(model: nn.Module) -> torch.device | str:
    """The device of the model's first parameter or buffer (the CPU without any)."""
    first = next(iter(model.parameters()), None)
    if first is None:
        first = next(iter(model.buffers()), None)
    return first.device if first is not None else "cpu"


def _fill_tied(
    tensors: dict[str, torch.Tensor], meta: dict[str, str], own: dict[str, torch.Tensor]
) -> None:
    """Add to ``tensors`` (read from a file) every tied name of the model's state ``own``
    that the file stored once under another name."""
    model_aliases = _alias_groups(own)
    for name in own:
        if name in tensors:
            continue
        # a tied name stored once: the file's metadata (save_model and save_state write
        # {dropped: kept}) or the model's own tying says which stored name holds it
        for source in (meta.get(name), model_aliases.get(name)):
            if isinstance(source, str) and source in tensors:
                tensors[name] = tensors[source]
                break
        else:  # the model ties name to later names: one of them may be the stored one
            for other, kept in model_aliases.items():
                if kept == name and other in tensors:
                    tensors[name] = tensors[other]
                    break


def _mismatch(model: nn.Module, missing: list[str], unexpected: list[str]) -> str:
    """The message of ``load_state_dict(strict=True)`` for these missing and unexpected keys."""
    error = f"Error(s) in loading state_dict for {type(model).__name__}:"
    if missing:
        error += "\n    Missing key(s) in state_dict: " + ", ".join(
            f'"{k}"' for k in sorted(missing)
        )
    if unexpected:
        error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
            f'"{k}"' for k in sorted(unexpected)
        )
    return error
