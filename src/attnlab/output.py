"""The value every attention module returns."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor


@dataclass
class AttentionOutput:
    """Result of an attention call.

    Attributes:
        context: the context vectors ``c`` -- ``[B, n_q, d_v]``, or ``[B, d_v]`` when the
            query was a single vector ``[B, d_q]`` (or the score is query-less).
        weights: the attention weights ``a`` when ``need_weights=True`` (else ``None``):
            ``[B, n_q, n_k]`` for single-dimensional attention, ``[B, n_q, n_k, d_v]`` for
            multi-dimensional attention (the query axis is dropped for a single query).
            They are the weights *before* dropout.
        log_prob: for stochastic alignments (hard, reinforced) the log-probability of the
            sampled choice, ``[B, n_q]`` (``[B]`` for a single query), for a REINFORCE loss.
        path: which implementation ran (``"sdpa"``, ``"lean-additive"``, ``"lean-multi"``,
            ``"triton"``, ``"local-flex"``, ``"local-triton"``, ``"local-window"`` or
            ``"explicit"``).
        extras: anything else a mechanism exposes (e.g. ``"probs"`` for hard attention,
            ``"centers"`` for local-p, ``"selection"`` for reinforced attention).

    Iterating yields ``(context, weights)`` so ``c, a = attn(q, k, v, need_weights=True)``
    works, and indexing reads that pair as :class:`torch.nn.MultiheadAttention`'s tuple is
    read: ``attn(q, k, v)[0]`` is the context, ``[1]`` the weights.
    """

    context: Tensor
    weights: Tensor | None = None
    log_prob: Tensor | None = None
    path: str = "explicit"
    extras: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Tensor | None]:
        yield self.context
        yield self.weights

    def __getitem__(self, index: int) -> Tensor | None:
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(
                f"an AttentionOutput is indexed as (context, weights) by 0 or 1, got {index!r}"
            )
        return (self.context, self.weights)[index]
