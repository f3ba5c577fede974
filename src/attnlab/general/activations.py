"""Named activation functions shared by the score functions and the fused kernels.

``act`` arguments across attnlab accept either one of the names below or any callable
mapping a tensor to a tensor of the same shape. The names with a closed-form derivative
(``tanh``, ``relu``, ``sigmoid``, ``identity``) let the memory-lean kernels in
:mod:`attnlab.general.fused` compute their backward pass by hand; any other activation
falls back to recomputation with autograd, chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

Activation = Callable[[Tensor], Tensor]

ACTIVATIONS: dict[str, Activation] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "identity": lambda x: x,
    "gelu": F.gelu,
    "elu": F.elu,
    "leaky_relu": F.leaky_relu,
    "softplus": F.softplus,
}


def get_activation(act: str | Activation, name: str = "act") -> Activation:
    """Return the activation called ``act`` (or ``act`` itself when it is callable).

    ``name`` is the argument named in the errors: a ``TypeError`` for something that is
    neither text nor callable, a ``ValueError`` for an unknown name."""
    if callable(act):
        return act
    expected = f"expected a callable or one of {sorted(ACTIVATIONS)}"
    if not isinstance(act, str):
        raise TypeError(f"{name} must be an activation name or a callable, got {act!r}; {expected}")
    if act not in ACTIVATIONS:
        raise ValueError(f"{name}={act!r} is not a known activation; {expected}")
    return ACTIVATIONS[act]


def activation_name(act: str | Activation) -> str | None:
    """The registered name of ``act`` (``None`` for an anonymous callable)."""
    if isinstance(act, str):
        get_activation(act)
        return act
    for name, fn in ACTIVATIONS.items():
        if fn is act:
            return name
    return None
