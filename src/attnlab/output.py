"""The value every attention module returns."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

T = TypeVar("T")


def output_pytree(*static: str) -> Callable[[type[T]], type[T]]:
    """Register an output dataclass as a pytree node (a class decorator), as
    :func:`torch.export.export` needs for a module that returns it and
    ``torch.utils._pytree.tree_map`` uses: every field is a child (tensors, ``None``, dicts
    of them) except those named in ``static`` (strings, numbers: the node's context). A
    subclass with fields of its own is registered again (pytree nodes are exact types)."""

    def register(cls: type[T]) -> type[T]:
        names = [f.name for f in dataclasses.fields(cls) if f.name not in static]  # type: ignore[arg-type]

        def flatten(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
            return [getattr(obj, n) for n in names], tuple(getattr(obj, s) for s in static)

        def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
            children, context = flatten(obj)
            return [
                (pytree.GetAttrKey(n), c) for n, c in zip(names, children, strict=True)
            ], context

        def unflatten(children: Any, context: Any) -> T:
            return cls(
                **dict(zip(names, children, strict=True)), **dict(zip(static, context, strict=True))
            )

        pytree.register_pytree_node(
            cls,
            flatten,
            unflatten,
            serialized_type_name=f"{cls.__module__}.{cls.__qualname__}",
            flatten_with_keys_fn=flatten_with_keys,
        )
        return cls

    return register


@output_pytree("path")
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
    read: ``attn(q, k, v)[0]`` is the context, ``[1]`` the weights. It is a pytree node
    (:func:`output_pytree`): a module that returns it can be exported with
    :func:`torch.export.export`.
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


def joint_log_prob(outputs: Iterable[AttentionOutput], dim: int = 1) -> Tensor | None:
    """The log-probability of the choices of several stochastic attentions taken together
    (heads, hops, capsules: independent draws, so their log-probabilities add), for one
    REINFORCE loss that trains every one of them: the ``log_prob`` of each output
    (``[B, n_q]`` or ``[B]``) stacked along ``dim`` and summed there; ``None`` when none of
    them sampled (deterministic alignments). Cost O(outputs x B x n_q)."""
    sampled = [out.log_prob for out in outputs if out.log_prob is not None]
    return torch.stack(sampled, dim).sum(dim) if sampled else None
