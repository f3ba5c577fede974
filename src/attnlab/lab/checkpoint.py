"""Model checkpoints in the safetensors format, written atomically.

safetensors files hold only tensors (no pickled code), so loading one never runs code from
the file. :func:`save_state` writes ``model.state_dict()`` with
``safetensors.torch.save_model`` (which stores a tensor shared by several names once and
copies non-contiguous ones), first to a temporary file in the same folder, then moves it
into place with ``os.replace``: a crash mid-write never leaves a truncated checkpoint.
:func:`load_state` loads it back into a model of the same layout.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from torch import nn

__all__ = ["load_state", "save_state"]


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
    model: nn.Module, path: str | Path, *, strict: bool = True, device: Any = None
) -> tuple[list[str], list[str]]:
    """Load the safetensors checkpoint ``path`` into ``model`` in place.

    ``strict=True`` raises ``RuntimeError`` naming missing and unexpected keys; with
    ``strict=False`` they are returned as ``(missing, unexpected)``. Tensors are placed on
    ``device`` (default: the device of the model's first parameter or buffer, else CPU).
    """
    from safetensors.torch import load_model

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(file)!r}")
    if device is None:
        first = next(iter(model.parameters()), None)
        if first is None:
            first = next(iter(model.buffers()), None)
        device = first.device if first is not None else "cpu"
    missing, unexpected = load_model(model, str(file), strict=strict, device=str(device))
    return list(missing), list(unexpected)
