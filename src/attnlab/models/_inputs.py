"""Input and constructor checks shared by the task models.

Every task model reads token ids with either their lengths (real tokens first) or a bool
mask (True = real token), and every constructor checks the same handful of sizes. The
checks live here once, so that each model calls one function and every message has the
same form: the argument's name, its shape or value, and what was expected.

* :func:`token_mask` -- ``tokens [B, n]`` plus ``lengths [B]`` or ``mask [B, n]`` -> the
  ``[B, n]`` bool mask of the real tokens;
* :func:`check_ids`, :func:`check_lengths`, :func:`check_mask` -- its parts, for inputs
  of other ranks (documents ``[B, S, W]``);
* :func:`check_sizes`, :func:`check_choice`, :func:`check_dropout`, :func:`check_index`
  -- the constructor checks (each a :class:`~attnlab._checks.ConfigError`);
* :func:`dict_spec` -- the options and the ``uniform`` flag of an attention dict spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from attnlab._checks import ConfigError, check_choice, check_dropout, check_int, found_on_host

__all__ = [
    "check_choice",
    "check_dropout",
    "check_ids",
    "check_index",
    "check_lengths",
    "check_mask",
    "check_sizes",
    "dict_spec",
    "token_mask",
]


def _is_integer(t: Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool)


def check_ids(
    tokens: Any,
    vocab_size: int,
    *,
    name: str = "tokens",
    layout: str = "[B, n]",
    batch: int | None = None,
    batch_of: str | None = None,
) -> Tensor:
    """``tokens``: an integer tensor of ``len(layout)`` dimensions holding ids in
    ``[0, vocab_size)``; with ``batch``, its first size must be ``batch`` (``batch_of`` says
    where that number comes from, for the message). Returns ``tokens``."""
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(tokens).__name__}")
    if not _is_integer(tokens):
        raise TypeError(
            f"{name} has dtype {tokens.dtype} and shape {tuple(tokens.shape)}, expected an "
            f"integer (torch.long) tensor {layout} of token ids"
        )
    rank = layout.count(",") + 1
    if tokens.dim() != rank or (batch is not None and tokens.shape[0] != batch):
        want = layout
        if batch is not None:
            want = (
                f"{layout} with B = {batch} ({batch_of})" if batch_of else f"[B, n] = [{batch}, n]"
            )
        raise ValueError(f"{name} has shape {tuple(tokens.shape)}, expected {want}")
    if found_on_host((tokens < 0) | (tokens >= vocab_size)):  # not read when traced
        raise ValueError(
            f"{name} (shape {tuple(tokens.shape)}) holds ids in [{int(tokens.min())}, "
            f"{int(tokens.max())}], outside [0, vocab_size) = [0, {vocab_size})"
        )
    return tokens


def check_lengths(
    lengths: Any,
    shape: tuple[int, ...],
    bound: tuple[str, int],
    *,
    name: str = "lengths",
    tokens: Tensor,
    tokens_name: str = "tokens",
) -> Tensor:
    """``lengths``: an integer tensor (or a list) of ``shape`` whose values lie in
    ``[0, bound]`` (``bound`` = (its letter, its value), e.g. ``("n", 7)``); returned as a
    long tensor on the device of ``tokens``."""
    t = lengths if isinstance(lengths, Tensor) else torch.as_tensor(lengths)
    letters = {1: "[B]", 2: "[B, S]"}.get(len(shape), "[" + ", ".join("?" * len(shape)) + "]")
    layout = f"{letters} = {list(shape)}"
    if not _is_integer(t):
        raise TypeError(
            f"{name} has dtype {t.dtype} and shape {tuple(t.shape)}, expected an integer "
            f"tensor {layout}"
        )
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {layout}")
    letter, top = bound
    if found_on_host((t < 0) | (t > top)):
        raise ValueError(
            f"{name} (shape {tuple(t.shape)}) holds values in [{int(t.min())}, "
            f"{int(t.max())}], outside [0, {letter}] = [0, {top}] for {tokens_name} of shape "
            f"{tuple(tokens.shape)}: {name} must lie in [0, {letter}]"
        )
    return t.to(device=tokens.device, dtype=torch.long)


def _layout(shape: Sequence[int]) -> str:
    letters = ("B", "n") if len(shape) == 2 else ("B", "S", "W")[: len(shape)]
    return f"[{', '.join(letters)}] = {list(shape)}"


def check_mask(
    mask: Any,
    shape: tuple[int, ...],
    *,
    name: str = "mask",
    device: torch.device | None = None,
    prefix: str | None = None,
) -> Tensor:
    """``mask``: a bool tensor of ``shape`` (True = real token), moved to ``device``. With
    ``prefix`` (what needs it, e.g. ``"the BiLSTM encoder"``), the real tokens must come
    first in each row: pass the lengths instead otherwise."""
    layout = _layout(shape)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = (
            f"has dtype {mask.dtype} and shape {tuple(mask.shape)}"
            if isinstance(mask, Tensor)
            else f"is a {type(mask).__name__}"
        )
        raise TypeError(
            f"{name} {got}: {name} must be a torch.bool tensor {layout} (True = real token)"
        )
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {layout}")
    if prefix is not None:
        real_first = torch.arange(shape[-1], device=mask.device) < mask.sum(-1, keepdim=True)
        if not torch.equal(real_first, mask):
            raise ValueError(
                f"{name} (shape {tuple(mask.shape)}) is not a prefix mask (real tokens first); "
                f"{prefix} needs one: pass lengths instead"
            )
    return mask if device is None else mask.to(device)


def token_mask(
    tokens: Any,
    lengths: Any = None,
    mask: Any = None,
    *,
    vocab_size: int,
    part: str | None = None,
    batch: int | None = None,
    batch_of: str | None = None,
    prefix: str | None = None,
) -> Tensor:
    """Check ``tokens`` ``[B, n]`` (ids in ``[0, vocab_size)``) with ``lengths`` ``[B]``
    or ``mask`` ``[B, n]`` bool (at most one; with neither every position is real) and
    return the ``[B, n]`` bool mask of the real tokens on the device of ``tokens``.

    ``part`` names a model's input other than ``tokens`` (``"left"`` checks ``left``,
    ``left_lengths`` and ``left_mask``); ``batch`` / ``batch_of`` fix ``B`` (see
    :func:`check_ids`); ``prefix`` (what needs it) demands a prefix mask.
    """
    name = part or "tokens"
    lengths_name, mask_name = (f"{part}_lengths", f"{part}_mask") if part else ("lengths", "mask")
    check_ids(tokens, vocab_size, name=name, batch=batch, batch_of=batch_of)
    B, n = tokens.shape
    if lengths is not None and mask is not None:
        raise ValueError(f"give {lengths_name} or {mask_name}, not both")
    if lengths is not None:
        t = check_lengths(
            lengths, (B,), ("n", n), name=lengths_name, tokens=tokens, tokens_name=name
        )
        return torch.arange(n, device=tokens.device)[None, :] < t[:, None]
    if mask is not None:
        return check_mask(mask, (B, n), name=mask_name, device=tokens.device, prefix=prefix)
    return torch.ones(B, n, dtype=torch.bool, device=tokens.device)


# ----------------------------------------------------------------------------- constructors


def check_sizes(**sizes: Any) -> None:
    """Each keyword an int ``>= 1`` (``ConfigError`` "NAME must be an int >= 1, got V")."""
    for name, value in sizes.items():
        check_int(value, name)


def check_index(vocab_size: int, vocab_name: str = "vocab_size", **indices: int | None) -> None:
    """Each keyword a token id (``padding_idx``, ``bos_idx``, ...): an int (not a bool, not
    a float) in ``[0, vocab_size)``, or None (``ConfigError`` "bos_idx must be an int or
    None, got 2.5", "bos_idx=9 is outside [0, vocab_size) = [0, 8)")."""
    for name, index in indices.items():
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
            raise ConfigError(f"{name} must be an int or None, got {index!r}")
        if index is not None and not 0 <= index < vocab_size:
            raise ConfigError(f"{name}={index} is outside [0, {vocab_name}) = [0, {vocab_size})")


def dict_spec(spec: Any, name: str = "attention") -> tuple[dict[str, Any], bool]:
    """(a copy of the dict ``spec`` without its key ``uniform``; that key's value as a
    bool, False if absent): the dict form of a model's attention argument, whose
    ``"uniform": True`` asks for the uniform baseline of that attention. Anything but a
    dict: ``ConfigError`` "NAME must be a name or a dict spec, got TYPE"."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{name} must be a name or a dict spec, got {type(spec).__name__}")
    options = dict(spec)
    return options, bool(options.pop("uniform", False))
