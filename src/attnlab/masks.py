"""One mask convention for the whole library, and converters into it.

**The convention.** A mask is a ``torch.bool`` tensor broadcastable to the score shape
``[B, n_q, n_k]`` in which ``True`` means *this query may attend to this key* (the
convention of :func:`torch.nn.functional.scaled_dot_product_attention`). Broadcasting
follows PyTorch's rules, so a 2-D mask is ``[n_q, n_k]`` (e.g. a causal mask) and a key
padding mask must be given as ``[B, 1, n_k]``; :func:`from_lengths` and
:func:`from_key_padding_mask` produce that shape. (When the query is a single vector
``[B, d_q]`` the attention functions also accept a ``[B, n_k]`` key mask.)

A 2-D mask ``[n, n_k]`` with ``n == B == n_q > 1`` whose rows differ could be a key
padding mask ``[B, n_k]`` that was meant per example; it is read as ``[n_q, n_k]`` and
:class:`AmbiguousMaskWarning` is emitted. Write ``mask[None]`` (``[1, n_q, n_k]``) for a
mask shared by the batch, ``mask[:, None, :]`` for a key mask, and the warning goes away.

A query row in which no key is allowed gets all-zero weights and a zero context, never
NaN, in the forward and in the backward pass.

Converters:

* :func:`from_lengths` -- sequence lengths ``[B]`` -> ``[B, 1, n_k]``;
* :func:`from_key_padding_mask` -- PyTorch's ``key_padding_mask`` (``True`` = ignore,
  ``[B, n_k]``) -> ``[B, 1, n_k]``;
* :func:`from_additive` -- additive float masks (``0`` = keep, ``-inf`` or a large
  negative number = drop) -> bool;
* :func:`causal` -- the lower-triangular mask of autoregressive attention.
"""

from __future__ import annotations

import numbers
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor

from attnlab._checks import broadcasts_to, broadcasts_together, found_on_host, is_traced

__all__ = [
    "AmbiguousMaskWarning",
    "causal",
    "combine",
    "fill_value",
    "from_additive",
    "from_key_padding_mask",
    "from_lengths",
    "index_mask",
    "normalize_head_mask",
    "normalize_mask",
]


class AmbiguousMaskWarning(UserWarning):
    """A 2-D mask ``[n, n_k]`` given where ``n`` is both the batch size and the number of
    queries, so it could be a per-query mask ``[n_q, n_k]`` (how it is read, by PyTorch's
    broadcasting) or a key padding mask ``[B, n_k]``. Silence it by passing a 3-D mask:
    ``mask[None]`` for ``[n_q, n_k]``, ``mask[:, None, :]`` for ``[B, n_k]``."""


# warnings point at the first frame outside attnlab and torch (the user's call)
_INTERNAL_DIRS = (str(Path(__file__).resolve().parent), str(Path(torch.__file__).resolve().parent))


def _caller_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` in the caller of this function that points
    at the first frame outside attnlab and torch."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame = frame.f_back
        level += 1
    return level


def from_lengths(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Key mask ``[B, 1, n_k]`` from sequence lengths ``[B]``: key ``l`` is allowed iff
    ``l < lengths[b]``. ``max_len`` defaults to ``lengths.max()`` (a value read on the
    host: in a traced call, ``torch.compile`` or ``torch.export``, pass ``max_len``, e.g.
    the padded length ``tokens.shape[1]``; the value checks are then skipped there, as
    :func:`attnlab._checks.found_on_host` says)."""
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths has shape {tuple(lengths.shape)}, expected [B]")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths has dtype {lengths.dtype}, expected an integer dtype")
    if found_on_host(lengths < 0):
        raise ValueError("lengths must be non-negative")
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    elif (
        isinstance(max_len, bool)
        or not isinstance(max_len, (numbers.Integral, torch.SymInt))
        or (not isinstance(max_len, torch.SymInt) and max_len < 0)  # a size is never < 0
    ):
        raise ValueError(f"max_len must be a non-negative int, got {max_len!r}")
    elif found_on_host(lengths > max_len):
        raise ValueError(
            f"max_len={max_len} is smaller than the longest length {int(lengths.max())}"
        )
    positions = torch.arange(max_len, device=lengths.device)
    return (positions[None, :] < lengths[:, None])[:, None, :]


def from_key_padding_mask(key_padding_mask: Tensor) -> Tensor:
    """Convert PyTorch's ``key_padding_mask`` ``[B, n_k]`` (``True`` = *ignore* this key,
    or an additive float mask) into attnlab's ``[B, 1, n_k]`` (``True`` = may attend)."""
    if not isinstance(key_padding_mask, Tensor):
        raise TypeError(
            f"key_padding_mask must be a torch.Tensor, got {type(key_padding_mask).__name__}"
        )
    if key_padding_mask.dim() != 2:
        raise ValueError(
            f"key_padding_mask has shape {tuple(key_padding_mask.shape)}, expected [B, n_k]"
        )
    if key_padding_mask.dtype == torch.bool:
        return (~key_padding_mask)[:, None, :]
    if key_padding_mask.dtype.is_floating_point:
        return from_additive(key_padding_mask)[:, None, :]
    raise TypeError(
        f"key_padding_mask has dtype {key_padding_mask.dtype}, expected torch.bool or a float dtype"
    )


def from_additive(mask: Tensor, threshold: float = -1e4, strict: bool = True) -> Tensor:
    """Convert an additive float mask (added to the scores before the softmax) to bool.

    Entries ``<= threshold`` (including ``-inf``) become ``False`` (drop), the others
    ``True``. An additive mask may also carry finite biases (e.g. ALiBi); a bool mask
    cannot express them, so with ``strict=True`` any entry that is neither ``0`` nor
    ``<= threshold`` raises ``ValueError``.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if not mask.dtype.is_floating_point:
        raise TypeError(f"mask has dtype {mask.dtype}, expected a float (additive) mask")
    if torch.isnan(mask).any():
        raise ValueError("the additive mask contains NaN")
    keep = mask > threshold
    if strict and (mask[keep] != 0).any():
        raise ValueError(
            "the additive mask holds finite non-zero biases, which a bool mask cannot "
            "represent; add them to the scores yourself or pass strict=False to keep "
            "only the drop pattern"
        )
    return keep


def causal(n_q: int, n_k: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """Causal mask ``[n_q, n_k]``: query ``i`` may attend to keys ``l <= i + (n_k - n_q)``
    (the queries are the last ``n_q`` positions of the key sequence, as in
    :func:`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``
    when ``n_q == n_k``)."""
    n_k = n_q if n_k is None else n_k
    sizes = []
    for name, n in (("n_q", n_q), ("n_k", n_k)):  # a NumPy int (a length from an array) too
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ValueError(f"{name} must be a non-negative int, got {n!r}")
        sizes.append(int(n))
    q, k = sizes
    return torch.ones(q, k, dtype=torch.bool, device=device).tril(diagonal=k - q)


# the name `causal` is also a keyword argument of normalize_head_mask
_causal_mask = causal


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of several masks (``None`` entries are skipped), broadcast together
    (masks whose shapes do not broadcast: a ``ValueError`` naming them)."""
    out: Tensor | None = None
    for i, m in enumerate(masks):
        if m is None:
            continue
        if not isinstance(m, Tensor) or m.dtype != torch.bool:
            what = m.dtype if isinstance(m, Tensor) else type(m).__name__
            raise TypeError(f"masks[{i}] is {what}, expected a torch.bool tensor")
        if out is not None and not broadcasts_together(m.shape, out.shape):
            raise ValueError(
                f"masks[{i}] of shape {tuple(m.shape)} does not broadcast with the masks "
                f"before it (combined shape {tuple(out.shape)})"
            )
        out = m if out is None else out & m
    return out


def fill_value(dtype: torch.dtype) -> float:
    """The finite number used in place of ``-inf`` for masked scores: ``finfo.min``.
    A finite fill keeps fully masked rows free of NaN; those rows are zeroed afterwards."""
    return torch.finfo(dtype).min


def index_mask(index: Tensor, n: int) -> Tensor:
    """The bool mask ``[..., n]`` that is True at position ``index[...]`` of each row (all
    False where the index lies outside ``[0, n)``): ``F.one_hot(index, n).bool()`` without
    its check of the indices' range, a host read that ``torch.func.vmap`` cannot make.
    ``index``: integer ``[...]``. Cost: ``O(numel(index) n)``."""
    return index.unsqueeze(-1) == torch.arange(n, device=index.device)


def check_bool_mask(mask: object, name: str = "mask", note: str = "") -> Tensor:
    """``mask`` if it is a bool tensor, else ``TypeError`` naming ``name`` (``note`` ends
    the dtype message, e.g. ``" (True = allowed)"``)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} has dtype {mask.dtype}, expected torch.bool{note}")
    return mask


def check_score_mask(mask: object, e: Tensor, name: str = "mask") -> None:
    """Check a bool ``mask`` (``True`` = allowed) for the scores ``e``: a tensor on the
    device of ``e`` whose shape broadcasts to the shape of ``e`` without enlarging it;
    ``None`` passes. ``TypeError`` for a non-tensor or non-bool mask, ``ValueError`` for
    another device or shape."""
    if mask is None:
        return
    mask = check_bool_mask(mask, name, " (True = allowed)")
    if mask.device != e.device:
        raise ValueError(f"{name} is on {mask.device} but e is on {e.device}")
    if not broadcasts_to(mask.shape, e.shape):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}, expected a shape broadcastable to "
            f"e {tuple(e.shape)}"
        )


def normalize_mask(
    mask: Tensor | None,
    batch: int,
    n_q: int,
    n_k: int,
    *,
    device: torch.device | None = None,
    name: str = "mask",
    single_query: bool = False,
) -> Tensor | None:
    """Validate ``mask`` against the score shape ``[batch, n_q, n_k]`` and return it as a
    3-D bool tensor that broadcasts to that shape (no copy where possible).

    Raises ``TypeError`` for a non-bool mask and ``ValueError`` for a shape that does not
    broadcast or a mask on another device; the messages name the argument and both shapes.
    With ``single_query=True`` (the query was given as ``[B, d_q]``) a ``[B, n_k]`` mask is
    read as a key mask ``[B, 1, n_k]``. Otherwise a 2-D mask is ``[n_q, n_k]``; when
    ``batch == n_q > 1`` and its rows differ it could also be a key mask ``[B, n_k]``, and
    :class:`AmbiguousMaskWarning` says how to write either one unambiguously.
    """
    if mask is None:
        return None
    floating = isinstance(mask, Tensor) and mask.dtype.is_floating_point
    mask = check_bool_mask(mask, name, _FLOAT_MASK_HINT if floating else "")
    if device is not None and mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but the inputs are on {device}")
    expected = (batch, n_q, n_k)
    given = tuple(mask.shape)
    if single_query and mask.dim() == 2 and mask.shape[0] in (1, batch):
        mask = mask[:, None, :]
    elif (
        mask.dim() == 2 and batch == n_q > 1 and mask.shape[0] == n_q and mask.shape[1] in (1, n_k)
    ):
        _warn_if_ambiguous(mask, name)
    if mask.dim() > 3:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}, expected a shape broadcastable to "
            f"[B, n_q, n_k] = {list(expected)}"
        )
    while mask.dim() < 3:
        mask = mask.unsqueeze(0)
    for got, want in zip(mask.shape, expected, strict=True):
        if got not in (1, want):
            raise ValueError(
                f"{name} has shape {given}, expected a shape broadcastable to "
                f"[B, n_q, n_k] = {list(expected)} (a key padding mask is [B, 1, n_k]; see "
                "attnlab.masks.from_lengths)"
            )
    return mask


#: what the error for a float mask adds
_FLOAT_MASK_HINT = (
    " (for an additive float mask use attnlab.masks.from_additive; for PyTorch's "
    "key_padding_mask use attnlab.masks.from_key_padding_mask)"
)


def _warn_if_ambiguous(mask: Tensor, name: str) -> None:
    """Warn about a 2-D mask ``[n, n_k]`` with ``n == B == n_q``, unless its rows are all
    equal (then both readings give the same mask)."""
    if is_traced() or bool((mask == mask[:1]).all()):
        return  # (a host read: no warning under torch.compile or torch.func)
    warnings.warn(
        f"{name} of shape {tuple(mask.shape)} is 2-D and the batch size equals the number "
        f"of queries ({mask.shape[0]}), so it is read as [n_q, n_k] (shared by the batch), not as a key "
        f"padding mask [B, n_k]; pass {name}[None] ([1, n_q, n_k]) for the first, "
        f"{name}[:, None, :] ([B, 1, n_k], or attnlab.masks.from_lengths / "
        "from_key_padding_mask) for the second",
        AmbiguousMaskWarning,
        stacklevel=_caller_stacklevel(),
    )


def normalize_head_mask(
    mask: Tensor | None,
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    *,
    device: torch.device | None = None,
    causal: bool = False,
    name: str = "mask",
) -> Tensor | None:
    """A mask for multi-head attention, as a 4-D bool tensor broadcastable to
    ``[batch, heads, n_q, n_k]``.

    ``mask`` is either a per-head mask ``[B, h, n_q, n_k]`` (any axis may be 1) or anything
    :func:`normalize_mask` accepts (shared by all heads). ``causal=True`` adds
    :func:`causal`. Errors name the argument, its shape and the expected shape.
    """
    out: Tensor | None = None
    if mask is not None:
        if isinstance(mask, Tensor) and mask.dim() == 4:
            if mask.dtype != torch.bool:
                raise TypeError(f"{name} has dtype {mask.dtype}, expected torch.bool")
            if device is not None and mask.device != device:
                raise ValueError(f"{name} is on {mask.device} but the inputs are on {device}")
            want = (batch, heads, n_q, n_k)
            if any(s not in (1, w) for s, w in zip(mask.shape, want, strict=True)):
                raise ValueError(
                    f"{name} has shape {tuple(mask.shape)}, expected a shape broadcastable to "
                    f"[B, h, n_q, n_k] = {list(want)}"
                )
            out = mask
        else:
            m3 = normalize_mask(mask, batch, n_q, n_k, device=device, name=name)
            out = m3.unsqueeze(1)  # type: ignore[union-attr]
    if causal:
        c = _causal_mask(n_q, n_k, device=device)[None, None]
        out = c if out is None else out & c
    return out
