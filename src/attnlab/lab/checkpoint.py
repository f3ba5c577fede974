"""Model checkpoints in the safetensors format, written atomically.

safetensors files hold only tensors (no pickled code), so loading one never runs code from
the file. :func:`save_state` writes ``model.state_dict()`` with
``safetensors.torch.save_model`` (which stores a tensor shared by several names once and
copies non-contiguous ones), first to a temporary file in the same folder, then moves it
into place with ``os.replace``: a crash mid-write never leaves a truncated checkpoint.
:func:`load_state` loads it back into a model of the same layout; given the sha256 that
:func:`file_sha256` computed when the run was written (``run.json``'s
``checkpoint_sha256``), it refuses a file whose bytes changed since (a flipped byte in the
tensor data would otherwise load silently).

A missing, damaged or tampered file of a run raises :class:`RunFileError` (a
:class:`~attnlab._checks.ConfigError`, so the command line prints it as one ``error:``
line): the message names the file and what to do.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

from attnlab._checks import ConfigError

__all__ = [
    "MissingRunFileError",
    "RunFileError",
    "check_checkpoint",
    "file_sha256",
    "load_state",
    "save_state",
]


class RunFileError(ConfigError):
    """A file of a run or an ablation (checkpoint, ``run.json``, ``metrics.json``,
    ``results.sqlite``) is missing, damaged or not what it should be. The message is one
    line naming the file."""


class MissingRunFileError(RunFileError, FileNotFoundError):
    """A file of a run is missing (also a :class:`FileNotFoundError`)."""


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of the bytes of ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_checkpoint(path: str | Path, sha256: str | None = None) -> Path:
    """``path`` as a :class:`~pathlib.Path` after checking that it is a file and, when
    ``sha256`` is given, that its bytes have that checksum. Raises
    :class:`MissingRunFileError` / :class:`RunFileError` naming the file."""
    file = Path(path)
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


def save_state(model: nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None):
    """Write ``model``'s state dict to ``path`` (safetensors), atomically. Returns the path."""
    from safetensors.torch import save_model

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        save_model(model, tmp, metadata=metadata)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


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
    ``strict=False`` they are returned as ``(missing, unexpected)``. Tensors are placed on
    ``device`` (default: the device of the model's first parameter or buffer, else CPU).

    ``sha256``: the checksum recorded when the file was written; a file whose bytes differ
    raises :class:`RunFileError` before anything is loaded (None: not checked). A missing
    file raises :class:`MissingRunFileError`; a file that is not a safetensors checkpoint
    (truncated, empty, random bytes) raises :class:`RunFileError`.
    """
    from safetensors.torch import load_model

    file = check_checkpoint(path, sha256)
    if device is None:
        first = next(iter(model.parameters()), None)
        if first is None:
            first = next(iter(model.buffers()), None)
        device = first.device if first is not None else "cpu"
    try:
        missing, unexpected = load_model(model, str(file), strict=strict, device=str(device))
    except RuntimeError:  # a checkpoint of another layout (strict key check): as documented
        raise
    except Exception as err:  # safetensors' own error: not a (complete) safetensors file
        reason = " ".join(str(err).split()) or type(err).__name__
        raise RunFileError(
            f"checkpoint {str(file)!r} is damaged or not a safetensors file ({reason}); "
            "train the run again"
        ) from None
    return list(missing), list(unexpected)
