"""The call convention shared by every multi-head-style attention module.

``forward(query [B, n_q, d_model], key=None, value=None, *, mask=None, causal=False,
need_weights=False)``: ``key`` defaults to ``query`` (self-attention) and ``value`` to
``key``. :func:`check_call` validates the three tensors once, with messages that name the
argument, its shape and the expected shape, so each module does not repeat it.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnlab._checks import check_module_dtype, check_same, check_tensor


def check_call(
    query: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    *,
    d_model: int,
    d_k: int,
    d_v: int,
    module: nn.Module | None = None,
) -> tuple[Tensor, Tensor]:
    """Validate ``query``/``key``/``value`` and return ``(key, value)`` with the defaults
    applied. ``query`` is checked against the dtype/device of ``module``'s parameters."""
    check_tensor(query, "query")
    if query.dim() != 3 or query.shape[-1] != d_model:
        raise ValueError(
            f"query has shape {tuple(query.shape)}, expected [B, n_q, d_model] = "
            f"[B, n_q, {d_model}]"
        )
    key = query if key is None else key
    value = key if value is None else value
    B = query.shape[0]
    check_tensor(key, "key")
    check_tensor(value, "value")
    if key.dim() != 3 or key.shape[0] != B or key.shape[-1] != d_k:
        raise ValueError(
            f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k] = [{B}, n_k, {d_k}]"
        )
    n_k = key.shape[1]
    if value.dim() != 3 or value.shape[:2] != (B, n_k) or value.shape[-1] != d_v:
        raise ValueError(
            f"value has shape {tuple(value.shape)}, expected [B, n_k, d_v] = [{B}, {n_k}, {d_v}]"
        )
    check_same(query, "query", key=key, value=value)
    if module is not None:
        check_module_dtype(module, query, "query")
    return key, value
