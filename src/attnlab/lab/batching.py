"""The order of a task's mini-batches, shared by the tasks of the lab: shuffled or not, and
with *length bucketing*.

:func:`batch_order` gives the example indices of each batch of one split. Without
bucketing it is the plain order (``shuffle=False``) or one ``torch.randperm`` cut into
consecutive batches (``shuffle=True``), exactly what the tasks did before. With
``bucket=True`` (training only: the evaluation order is kept, so that the first test
examples stay the first) the shuffled order is cut into *pools* of
:data:`BUCKET_POOL` batches, each pool is sorted by length (stably, so ties keep their
random order) and cut into batches, and the batches are shuffled: every batch holds
sequences of similar length, so little of a padded batch is padding (the recurrent
encoders and the attention cost O(padded length)), while which examples meet in a batch
and the order of the batches stay random from epoch to epoch. Jain & Wallace's training
code sorts each epoch by length with a little noise for the same reason.

Cost: ``O(n log n)`` per epoch for the sorts, nothing per example beyond that.

:func:`pad_ids` pads the token ids of a batch into one ``[B, n]`` tensor (with their
lengths), the collation every text task shares; :func:`token_batch` makes the batch of
``tokens``, ``lengths`` and ``index`` of one split's examples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from attnlab._checks import ConfigError

__all__ = [
    "BUCKET_POOL",
    "batch_order",
    "check_bucket",
    "noisy_length_batches",
    "pad_ids",
    "token_batch",
]

#: Batches per pool that length bucketing sorts together: larger pools give tighter
#: lengths per batch, smaller ones more random company.
BUCKET_POOL = 50


def check_bucket(value: object) -> bool:
    """The task option ``bucket`` checked to be ``true`` or ``false`` (ConfigError else)."""
    if not isinstance(value, bool):
        raise ConfigError(f"option bucket must be true or false, got {value!r}")
    return value


def batch_order(
    n: int,
    batch_size: int,
    shuffle: bool,
    generator: torch.Generator | None,
    *,
    lengths: Sequence[int] | None = None,
    bucket: bool = False,
) -> Iterator[list[int]]:
    """The indices of each mini-batch of a split of ``n`` examples.

    Args:
        n: the number of examples.
        batch_size: the examples per batch (the last batch of each pool may hold fewer).
        shuffle: a random order from ``generator`` (training); else ``0..n-1``.
        generator: the torch generator of the shuffling.
        lengths: the length of each example (what padding follows); needed with ``bucket``.
        bucket: sort each pool of :data:`BUCKET_POOL` shuffled batches by length and shuffle
            the batches (only when ``shuffle``; see the module docstring).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = torch.randperm(n, generator=generator).tolist() if shuffle else list(range(n))
    if not (bucket and shuffle):
        for start in range(0, n, batch_size):
            yield order[start : start + batch_size]
        return
    if lengths is None or len(lengths) != n:
        raise ValueError(f"bucket=True needs the {n} lengths of the examples")
    pool = batch_size * BUCKET_POOL
    batches: list[list[int]] = []
    for start in range(0, n, pool):
        chunk = sorted(order[start : start + pool], key=lambda i: lengths[i])
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    for b in torch.randperm(len(batches), generator=generator).tolist():
        yield batches[b]


def noisy_length_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, noise: float = 0.1
) -> list[list[int]]:
    """Jain & Wallace's batches of one training epoch (and Wiegreffe & Pinter's): every
    example sorted by its length plus an integer drawn uniformly from ``[floor(-noise L),
    ceil(noise L))`` (``L`` its length; none where that range is empty), cut into batches
    of ``batch_size`` in that order, the batches in a random order. Called once per epoch
    with one ``generator``, each epoch gets new batches of similar lengths.

    Cost: ``O(n log n)`` for the sort."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= noise < float("inf"):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    n = torch.as_tensor(list(lengths), dtype=torch.float64)
    low, high = torch.floor(-n * noise), torch.ceil(n * noise)
    draw = torch.rand(len(n), generator=generator, dtype=torch.float64)
    shift = torch.where(high > low, low + torch.floor(draw * (high - low)), torch.zeros_like(n))
    order = torch.sort(n + shift, stable=True).indices.tolist()
    batches = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    return [batches[b] for b in torch.randperm(len(batches), generator=generator).tolist()]


def pad_ids(ids: Sequence[Sequence[int]], pad: int = 0) -> tuple[Tensor, Tensor]:
    """The token ids ``ids`` (one sequence per example) as a ``[B, n]`` long tensor padded
    with ``pad`` (``n`` the longest length, at least 1) and their lengths ``[B]``."""
    n = max([1, *(len(x) for x in ids)])
    tokens = torch.full((len(ids), n), pad, dtype=torch.long)
    for i, x in enumerate(ids):
        if x:
            tokens[i, : len(x)] = torch.tensor(x, dtype=torch.long)
    return tokens, torch.tensor([len(x) for x in ids], dtype=torch.long)


def token_batch(ids: Sequence[Sequence[int]], idx: list[int], pad: int = 0) -> dict[str, Tensor]:
    """The batch of the examples ``idx`` of a split whose token ids are ``ids``: ``tokens``
    ``[B, n]`` and ``lengths`` ``[B]`` (:func:`pad_ids`) and ``index`` ``[B]`` (``idx``)."""
    tokens, lengths = pad_ids([ids[i] for i in idx], pad)
    return {"tokens": tokens, "lengths": lengths, "index": torch.tensor(idx, dtype=torch.long)}
