"""Record the attention weights of every attnlab attention module inside a model.

A model built of attnlab modules (a stack of :class:`~attnlab.query.transformer.
TransformerEncoderLayer`, a classifier that pools with :class:`~attnlab.Attention`, ...)
usually calls them with ``need_weights=False``: the fast paths never build the weights.
:func:`capture_weights` asks every one of them for its weights during a ``with`` block and
keeps what they return, by module name, without touching the model's code::

    with attnlab.capture_weights(model) as weights:
        logits = model(tokens)
    weights["encoder.0.self_attn"][0]  # [B, n_q, n_k] (or the module's own layout)

While the block runs, each attention module is called with ``need_weights=True``, which
may move it from a fused kernel to the explicit formula (the same results up to rounding,
with the memory of the weights). The weights are those the module returns in its output's
``weights`` (see each module's docstring for their layout: heads averaged or not, per
feature for multi-dimensional attention, a dict of the four attentions for rotatory
attention, ...). Attention-over-attention returns its weights under other names (``s``,
``alpha``, ``beta``, always set) and records nothing here.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn
from torch.utils._pytree import tree_map

#: what one call records: the weights tensor, or a dict of them (rotatory attention)
Weights = Tensor | dict[str, Tensor]

__all__ = ["Weights", "capture_weights", "takes_need_weights"]


def takes_need_weights(module: nn.Module) -> bool:
    """Whether ``module`` is an attnlab attention module: one of attnlab's classes whose
    ``forward`` has a ``need_weights`` keyword."""
    cls = type(module)
    if not cls.__module__.startswith("attnlab."):
        return False
    try:
        return "need_weights" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):  # a forward without a signature
        return False


@contextmanager
def capture_weights(model: nn.Module, *, detach: bool = True) -> Iterator[dict[str, list[Weights]]]:
    """Within the block, every attnlab attention module in ``model`` (``model`` itself
    included; found by :func:`takes_need_weights`) runs with ``need_weights=True`` and
    the weights of each call are appended to the dict this yields, under the module's
    name in ``model.named_modules()`` (``""`` for ``model`` itself). A module called
    twice has two entries; one that is not called, none (no key).

    Args:
        model: any ``nn.Module``.
        detach: keep detached copies (default) or the weights in the graph (an attention
            supervision loss can then differentiate through them).

    Yields:
        ``{name: [weights of each call, in order]}``, filled while the block runs and kept
        after it.

    The hooks are removed when the block ends, also by an exception. Not under
    ``torch.compile`` (hooks added to a compiled model make it recompile).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    weights: dict[str, list[Weights]] = {}
    handles = []

    def ask(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args, {**kwargs, "need_weights": True}

    def keep(name: str) -> Any:
        def hook(_module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
            w = getattr(output, "weights", None)
            if isinstance(w, dict) and w and all(isinstance(t, Tensor) for t in w.values()):
                w = dict(w)
            elif not isinstance(w, Tensor):
                return
            weights.setdefault(name, []).append(tree_map(Tensor.detach, w) if detach else w)

        return hook

    try:
        for name, module in model.named_modules():
            if takes_need_weights(module):
                handles.append(module.register_forward_pre_hook(ask, with_kwargs=True))
                handles.append(module.register_forward_hook(keep(name), with_kwargs=True))
        yield weights
    finally:
        for handle in handles:
            handle.remove()
