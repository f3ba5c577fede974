"""The uniform baseline of the task models' attention: every real item weighs ``1/n``.

Jain & Wallace's "replace the weights by uniform ones" test keeps the attention module
(its parameters and checkpoint layout) and pools its values with ``a_t = 1/n`` over the
``n`` real items: ``c = sum_t a_t W_v h_t`` (``W_v`` the attention's value projection, if
any). Cost: O(B n d).
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab.general.dimensionality import combine_single

__all__ = ["uniform_context", "uniform_weights"]


def uniform_weights(mask: Tensor, dtype) -> Tensor:
    """``1/n`` on the ``n`` real items of each row of ``mask`` ``[B, n]`` (0 on padding and
    on a row with no real item), as ``dtype``."""
    w = mask.to(dtype)
    return w / w.sum(1, keepdim=True).clamp(min=1.0)


def uniform_context(attention: nn.Module | None, weights: Tensor, values: Tensor) -> Tensor:
    """``sum_t weights_t V_t`` ``[B, d_v]`` for ``weights`` ``[B, n]`` and ``values``
    ``[B, n, d]``, through the value projection of ``attention`` (an
    :class:`attnlab.Attention` or None) when it has one."""
    proj = getattr(attention, "value_proj", None)
    if proj is not None:
        values = proj(values)
    return combine_single(weights[:, None, :].to(values.dtype), values).squeeze(1)
