"""Positional information for self-attention.

Self-attention is permutation-equivariant: without positions, ``softmax(Q K^T / sqrt(d)) V``
cannot tell ``A ... B`` from ``B ... A``. Four ways to give it positions:

| name | where it acts | formula | source |
| --- | --- | --- | --- |
| sinusoidal | added to the input | ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))`` | Vaswani et al. 2017 |
| learned | added to the input | ``x_p + P[p]``, ``P`` a trained ``[max_len, d]`` table | Gehring et al. 2017 |
| relative | inside the attention | ``e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)``, ``z_i = sum_j a_ij (v_j + a^V_ij)``, ``a^K_ij = w^K[clip(j - i, -k, k)]`` | Shaw et al. 2018 |
| rotary | on q and k | rotate each pair ``(x_2i, x_2i+1)`` of ``q_m`` and ``k_m`` by the angle ``m theta_i``, ``theta_i = base^(-2i/d)`` | Su et al. 2021 |

Shapes: the position axis is the second-to-last one (``[B, n, d]`` or ``[B, h, n, d]``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import masks as _masks
from attnlab._checks import (
    ConfigError,
    check_dropout,
    check_flags,
    check_int,
    check_module_dtype,
    check_number,
    check_same,
    check_tensor,
    found_on_host,
)
from attnlab.general.padding import clear_attention_inputs, clear_heads
from attnlab.output import AttentionOutput
from attnlab.query._convention import AttentionCall
from attnlab.query.efficient import reduce_weights
from attnlab.query.multi_head import ProjectedHeadAttention
from attnlab.registry import Configurable, get, register

__all__ = [
    "LearnedPositions",
    "RelativePositionAttention",
    "RotaryPositions",
    "SinusoidalPositions",
    "relative_position_attention",
    "relative_position_index",
    "rotary_embedding",
    "sinusoidal_encoding",
    "sinusoidal_positions",
]


def _check_base(base: float) -> float:
    if isinstance(base, bool) or not isinstance(base, int | float) or not base > 1:
        raise ConfigError(f"base must be a number > 1, got {base!r}")
    return float(base)


def _positions_for(x: Tensor, positions: Tensor | None, offset: int) -> Tensor:
    """The positions of the rows of ``x`` (axis -2): ``offset + arange(n)`` or the given
    tensor (broadcastable to ``x.shape[:-1]``), as float64."""
    n = x.shape[-2]
    if positions is None:
        check_int(offset, "offset", 0, error=ValueError)
        return torch.arange(offset, offset + n, device=x.device, dtype=torch.float64)
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor, got {type(positions).__name__}")
    if positions.dtype == torch.bool:
        raise TypeError("positions has dtype torch.bool, expected an integer or float dtype")
    try:
        ok = torch.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"positions has shape {tuple(positions.shape)}, expected a shape broadcastable to "
            f"the position axes of x {list(x.shape[:-1])} (e.g. [n] = [{n}])"
        )
    return positions.to(device=x.device, dtype=torch.float64)


# ----------------------------------------------------------------------------- sinusoidal


def sinusoidal_encoding(positions: Tensor, d: int, base: float = 10000.0) -> Tensor:
    """Sinusoidal encodings of arbitrary (possibly fractional) ``positions`` ``[...]`` ->
    ``[..., d]`` in float64: column ``c`` with ``i = c // 2`` holds ``sin(p / base^(2i/d))``
    for even ``c`` and ``cos(p / base^(2i/d))`` for odd ``c``. An odd ``d`` ends with a sine
    column whose cosine partner is dropped."""
    check_int(d, "d", error=ValueError)
    base = _check_base(base)
    i = torch.arange(d, device=positions.device) // 2
    inv_freq = torch.pow(torch.tensor(base, dtype=torch.float64), -2.0 * i.double() / d)
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)
    even = torch.arange(d, device=positions.device) % 2 == 0
    return torch.where(even, torch.sin(angles), torch.cos(angles))


def sinusoidal_positions(
    n: int,
    d: int,
    *,
    base: float = 10000.0,
    offset: int = 0,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ``[n, d]`` table ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] =
    cos(p / base^(2i/d))`` for positions ``p = offset, ..., offset + n - 1`` (Vaswani et al.
    2017). Any ``n`` (no maximum length); an odd ``d`` ends with a sine column. Computed in
    float64 and cast to ``dtype`` (default: the default float dtype). Cost O(n d)."""
    check_int(n, "n", 0, error=ValueError)
    check_int(offset, "offset", 0, error=ValueError)
    pos = torch.arange(offset, offset + n, dtype=torch.float64, device=device)
    return sinusoidal_encoding(pos, d, base).to(dtype or torch.get_default_dtype())


@register("query", "sinusoidal-positions", aliases=("sinusoidal", "sinusoid"))
class SinusoidalPositions(Configurable):
    """Adds the fixed sinusoidal encodings of Vaswani et al. (2017) to its input.

    Args:
        d_model: feature size ``d`` (odd sizes allowed: the last column is a sine).
        base: the wavelength base (10000 in the paper).
        scale: the input is multiplied by ``scale`` before the encodings are added (the
            Transformer scales embeddings by ``sqrt(d_model)``; default 1).
        dropout: dropout after the addition (training only).

    ``forward(x, *, offset=0, positions=None)``: ``x`` ``[..., n, d_model]`` ->
    ``scale * x + PE[positions]``; ``positions`` default ``offset + arange(n)`` (any length,
    e.g. for decoding step by step), or a tensor broadcastable to ``x.shape[:-1]``
    (fractional positions allowed). ``encoding(n, offset=0)`` returns the table ``[n, d]``.
    Cost O(n d) per sequence; no parameters.

    :formula: x_p + PE[p], PE[p, 2i] = sin(p / base^(2i/d)), PE[p, 2i+1] = cos(p / base^(2i/d))
    :source: Vaswani et al. 2017, Attention Is All You Need
    :cost: O(B n d), no parameters
    """

    def __init__(
        self, d_model: int, base: float = 10000.0, scale: float = 1.0, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        self.base = _check_base(base)
        self.scale = check_number(scale, "scale")
        self.dropout = check_dropout(dropout)

    def encoding(self, n: int, offset: int = 0, *, dtype=None, device=None) -> Tensor:
        """The table ``PE`` ``[n, d_model]`` for positions ``offset .. offset + n - 1``."""
        return sinusoidal_positions(
            n, self.d_model, base=self.base, offset=offset, dtype=dtype, device=device
        )

    def forward(self, x: Tensor, *, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        check_tensor(x, "x")
        if x.dim() < 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, expected [..., n, d_model] = [..., n, {self.d_model}]"
            )
        pos = _positions_for(x, positions, offset)
        pe = sinusoidal_encoding(pos, self.d_model, self.base).to(x.dtype)
        out = x * self.scale + pe if self.scale != 1.0 else x + pe
        return F.dropout(out, self.dropout, self.training) if self.dropout > 0 else out


# ----------------------------------------------------------------------------- learned


@register("query", "learned-positions", aliases=("learned", "absolute-positions"))
class LearnedPositions(Configurable):
    """Learned absolute position embeddings (Gehring et al. 2017; compared with sinusoids
    by Vaswani et al. 2017): a trained table ``P`` ``[max_len, d_model]`` added to the input.

    Args:
        max_len: number of positions with an embedding; a sequence reaching past it raises
            ``ValueError`` (a learned table cannot extrapolate).
        d_model: feature size.
        init_std: the table is initialised from ``N(0, init_std^2)``.
        dropout: dropout after the addition (training only).

    ``forward(x, *, offset=0, positions=None)``: ``x`` ``[..., n, d_model]`` -> ``x +
    P[positions]``, ``positions`` default ``offset + arange(n)`` or an integer tensor
    broadcastable to ``x.shape[:-1]``. Cost O(n d); ``max_len * d_model`` parameters.

    :formula: x_p + P[p], P a trained [max_len, d] table
    :source: Gehring et al. 2017, Convolutional Sequence to Sequence Learning; Vaswani et al.
        2017, Attention Is All You Need
    :cost: O(B n d) time, max_len d parameters
    """

    def __init__(
        self, max_len: int, d_model: int, init_std: float = 0.02, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.max_len = check_int(max_len, "max_len")
        self.d_model = check_int(d_model, "d_model")
        self.dropout = check_dropout(dropout)
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * init_std)

    def forward(self, x: Tensor, *, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        check_tensor(x, "x")
        if x.dim() < 2 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, expected [..., n, d_model] = [..., n, {self.d_model}]"
            )
        n = x.shape[-2]
        if positions is None:
            check_int(offset, "offset", 0, error=ValueError)
            if offset + n > self.max_len:
                raise ValueError(
                    f"x has {n} positions starting at offset {offset}, but LearnedPositions "
                    f"has embeddings for max_len={self.max_len} positions only (positions "
                    f"0..{self.max_len - 1}); build it with a larger max_len"
                )
            pe = self.weight[offset : offset + n]
        else:
            if not isinstance(positions, Tensor) or positions.dtype.is_floating_point:
                what = positions.dtype if isinstance(positions, Tensor) else type(positions)
                raise TypeError(f"positions is {what}, expected an integer tensor")
            _positions_for(x, positions, 0)  # shape check
            if found_on_host((positions < 0) | (positions >= self.max_len)):  # eager only
                raise ValueError(
                    f"positions hold values in [{int(positions.min())}, {int(positions.max())}], "
                    f"but LearnedPositions has embeddings for positions 0..{self.max_len - 1} "
                    f"(max_len={self.max_len})"
                )
            pe = self.weight[positions.to(self.weight.device).long()]
        check_module_dtype(self, x, "x")
        out = x + pe
        return F.dropout(out, self.dropout, self.training) if self.dropout > 0 else out


# ----------------------------------------------------------------------------- rotary


def rotary_embedding(
    x: Tensor,
    positions: Tensor | None = None,
    *,
    offset: int = 0,
    base: float = 10000.0,
    interleaved: bool = True,
) -> Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of ``x`` ``[..., n, d]`` (``d`` even).

    Feature pair ``i`` of the row at position ``m`` is rotated by the angle ``m theta_i``,
    ``theta_i = base^(-2i/d)``:

        (x'_a, x'_b) = (x_a cos(m theta_i) - x_b sin(m theta_i),
                        x_a sin(m theta_i) + x_b cos(m theta_i))

    with the pair ``(a, b) = (2i, 2i+1)`` (``interleaved=True``, the paper's layout) or
    ``(i, i + d/2)`` (``interleaved=False``, the "rotate-half" layout of GPT-NeoX/LLaMA).
    Applied to queries and keys before a dot product, ``(R_m q)^T (R_n k) = q^T R_{n-m} k``
    depends on the positions only through ``n - m``.

    ``positions``: default ``offset + arange(n)``; or a tensor broadcastable to
    ``x.shape[:-1]`` (e.g. ``[B, 1, n]`` for heads ``[B, h, n, d]``). The angles are
    computed in float64. Cost O(n d); no parameters.
    """
    check_tensor(x, "x")
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(
            f"x has shape {tuple(x.shape)}, expected [..., n, d] with an even d (RoPE rotates "
            "pairs of features)"
        )
    base = _check_base(base)
    d = x.shape[-1]
    pos = _positions_for(x, positions, offset)
    inv_freq = torch.pow(
        torch.tensor(base, dtype=torch.float64, device=x.device),
        -torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d,
    )
    angles = pos[..., None] * inv_freq  # [..., n, d/2]
    cos, sin = torch.cos(angles).to(x.dtype), torch.sin(angles).to(x.dtype)
    if interleaved:
        xa, xb = x[..., 0::2], x[..., 1::2]
    else:
        xa, xb = x[..., : d // 2], x[..., d // 2 :]
    ra = xa * cos - xb * sin
    rb = xa * sin + xb * cos
    if interleaved:
        return torch.stack([ra, rb], -1).flatten(-2)
    return torch.cat([ra, rb], -1)


@register("query", "rotary-positions", aliases=("rotary", "rope"))
class RotaryPositions(Configurable):
    """Rotary position embedding (RoPE, Su et al. 2021) as a module to apply to the queries
    and keys before any dot-product attention.

    Args:
        dim: the feature size it rotates (even; per head for multi-head attention).
        base: the angle base (10000 in the paper).
        interleaved: pairs ``(2i, 2i+1)`` (paper) or ``(i, i + dim/2)`` (rotate-half).

    ``forward(q, k=None, *, positions=None, offset=0, key_positions=None)`` returns the
    rotated ``q`` (and ``k``, as a tuple, when given). ``q`` / ``k``: ``[..., n, dim]``.
    Keys use ``key_positions`` if given, else the same positions as the queries when they
    have as many rows, else ``offset + arange(n_k)`` (keys start at ``offset``).
    See :func:`rotary_embedding`. Cost O(n dim); no parameters.

    :formula: (x_2i, x_2i+1) at position m rotated by m theta_i, theta_i = base^(-2i/d); applied
        to q and k
    :source: Su et al. 2021, RoFormer: Enhanced Transformer with Rotary Position Embedding
    :cost: O(B n d), no parameters
    """

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = True) -> None:
        super().__init__()
        self.dim = check_int(dim, "dim")
        if dim % 2:
            raise ConfigError(f"dim must be even (RoPE rotates pairs of features), got {dim}")
        self.base = _check_base(base)
        check_flags(interleaved=interleaved)
        self.interleaved = interleaved

    def _rotate(self, x: Tensor, name: str, positions: Tensor | None, offset: int) -> Tensor:
        check_tensor(x, name)
        if x.dim() < 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected [..., n, dim] = [..., n, {self.dim}]"
            )
        return rotary_embedding(
            x, positions, offset=offset, base=self.base, interleaved=self.interleaved
        )

    def forward(
        self,
        q: Tensor,
        k: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        offset: int = 0,
        key_positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        q_rot = self._rotate(q, "q", positions, offset)
        if k is None:
            return q_rot
        if key_positions is None and positions is not None and k.shape[-2] == q.shape[-2]:
            key_positions = positions
        return q_rot, self._rotate(k, "k", key_positions, offset)


# ----------------------------------------------------------------------------- relative


def relative_position_index(
    n_q: int, n_k: int, max_distance: int, device: torch.device | str | None = None
) -> Tensor:
    """``[n_q, n_k]`` long: ``clip(j - i', -k, k) + k`` with ``k = max_distance`` and the
    query ``i`` at key position ``i' = i + n_k - n_q`` (the queries are the last ``n_q``
    positions, as in :func:`attnlab.masks.causal`; ``i' = i`` for self-attention). Indexes
    the ``2k + 1`` rows of the relative embedding tables."""
    check_int(n_q, "n_q", 0, error=ValueError)
    check_int(n_k, "n_k", 0, error=ValueError)
    check_int(max_distance, "max_distance", 0, error=ValueError)
    qpos = torch.arange(n_q, device=device) + (n_k - n_q)
    kpos = torch.arange(n_k, device=device)
    rel = (kpos[None, :] - qpos[:, None]).clamp(-max_distance, max_distance)
    return rel + max_distance


def _check_relative_inputs(
    q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None
) -> int | None:
    """Check the inputs of :func:`relative_position_attention`; returns ``K`` (``None``
    without tables)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() < 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [..., n, d]")
    d, n_k = q.shape[-1], k.shape[-2]
    if k.shape[-1] != d:
        raise ValueError(f"k has shape {tuple(k.shape)}, expected [..., n_k, d] with d = {d}")
    if v.shape[-2] != n_k:
        raise ValueError(f"v has shape {tuple(v.shape)}, expected [..., n_k, d_v] with n_k = {n_k}")
    check_same(q, "q", k=k, v=v)
    K = None
    for name, table in (("rel_k", rel_k), ("rel_v", rel_v)):
        if table is not None:
            check_tensor(table, name)
            if table.dim() != 2 or table.shape[0] % 2 == 0:
                raise ValueError(f"{name} has shape {tuple(table.shape)}, expected [2K + 1, d]")
            if K is not None and table.shape[0] != 2 * K + 1:
                raise ValueError("rel_k and rel_v must have the same number of rows 2K + 1")
            K = (table.shape[0] - 1) // 2
    if rel_k is not None and rel_k.shape[1] != d:
        raise ValueError(f"rel_k has shape {tuple(rel_k.shape)}, expected [2K + 1, d] with d = {d}")
    if rel_v is not None and rel_v.shape[1] != v.shape[-1]:
        raise ValueError(
            f"rel_v has shape {tuple(rel_v.shape)}, expected [2K + 1, d_v] with d_v = {v.shape[-1]}"
        )
    return K


def relative_position_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    *,
    mask: Tensor | None = None,
    scale: float | None = None,
    normalize: Any = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Self-attention with relative position representations (Shaw et al. 2018).

        e_ij = q_i (k_j + a^K_ij)^T * scale,    a^K_ij = rel_k[clip(j - i, -K, K) + K]
        a_i  = align(e_i)   (masked softmax by default)
        z_i  = sum_j a_ij (v_j + a^V_ij),       a^V_ij = rel_v[clip(j - i, -K, K) + K]

    Args:
        q: ``[..., n_q, d]``; k: ``[..., n_k, d]``; v: ``[..., n_k, d_v]``.
        rel_k: ``[2K + 1, d]`` or ``None`` (no relative term in the scores).
        rel_v: ``[2K + 1, d_v]`` or ``None`` (no relative term in the values).
        mask: bool broadcastable to ``[..., n_q, n_k]``, True = may attend. Keys and values
            that no query may attend, and query rows that may attend nothing, never
            matter, whatever they hold (they are cleared with ``torch.where``).
        scale: default ``1 / sqrt(d)``.
        normalize: ``f(e, mask, dim) -> weights`` (default the masked softmax); any
            deterministic alignment's ``normalize``.
        dropout_p: dropout on the weights.

    Returns ``(z [..., n_q, d_v], weights [..., n_q, n_k])``.

    Cost: O(n_q n_k (d + d_v)) for the content terms plus O(n_q (2K+1) (d + d_v)) for the
    relative terms: ``q_i . a^K_r`` is computed once per query and distance bucket
    ``[..., n_q, 2K+1]`` and gathered into the ``[n_q, n_k]`` scores; the weights are summed
    per bucket (``scatter_add``) and multiplied with ``rel_v``. No ``[n_q, n_k, d]`` tensor
    is formed (memory O(n_q n_k + n_q (2K+1)) per batch element and head).
    """
    from attnlab.general.alignment import masked_softmax

    K = _check_relative_inputs(q, k, v, rel_k, rel_v)
    d = q.shape[-1]
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    # keys / values no query may attend and rows that attend nothing never matter
    q, k, v = clear_heads(q, k, v, mask)
    e = q @ k.transpose(-1, -2)
    index = None
    if K is not None:
        index = relative_position_index(n_q, n_k, K, device=q.device)
    if rel_k is not None and n_k > 0:
        rel = q @ rel_k.transpose(0, 1)  # [..., n_q, 2K + 1]
        e = e + rel.gather(-1, index.expand(*rel.shape[:-1], n_k))
    e = e * scale
    weights = masked_softmax(e, mask) if normalize is None else normalize(e, mask, -1)
    a = F.dropout(weights, dropout_p, True) if dropout_p > 0 else weights
    z = a @ v
    if rel_v is not None and n_k > 0:
        buckets = a.new_zeros(*a.shape[:-1], rel_v.shape[0])
        buckets = buckets.scatter_add(-1, index.expand_as(a), a)  # [..., n_q, 2K + 1]
        z = z + buckets @ rel_v
    return z, weights


@register("query", "relative-positions", aliases=("relative", "shaw"))
class RelativePositionAttention(ProjectedHeadAttention):
    """Multi-head self-attention with relative position representations (Shaw et al. 2018).

    Per head, with ``q = W_Q x``, ``k = W_K x``, ``v = W_V x`` split into heads of size
    ``d = head_dim``::

        e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)
        a_ij = align(e_i)_j                     (masked softmax by default)
        z_i  = sum_j a_ij (v_j + a^V_ij)

    where ``a^K_ij = w^K[clip(j - i, -k, k)]`` and ``a^V_ij = w^V[clip(j - i, -k, k)]`` are
    learned embeddings of the clipped relative distance (``2k + 1`` of each, shared by all
    heads as in the paper unless ``share_heads=False``). The output is ``W_O concat(z)``.

    Args:
        d_model: input (query) size.
        num_heads: heads ``h``.
        max_distance: the clipping distance ``k`` (the paper's best is 16 for translation;
            relative distances beyond ``k`` share an embedding).
        d_k, d_v: key / value input sizes (default ``d_model``; cross-attention).
        head_dim: per-head size (default ``d_model // num_heads``).
        values: add ``a^V`` to the values (``True``, the paper); ``False`` keeps only the
            score term.
        share_heads: one pair of tables for all heads (paper) or one per head.
        align: a deterministic alignment name applied per row (``soft`` default; also
            ``sparsemax``, ``entmax15``).
        dropout: dropout on the weights (training only). bias: projection biases (Shaw et
            al.'s projections have none: ``bias=False``).
        out_dim: output size (default ``d_model``).

    ``forward(query, key=None, value=None, *, mask=None, causal=False, need_weights=False,
    average_weights=True)`` like :class:`attnlab.query.multi_head.MultiHeadAttention`:
    ``query`` ``[B, n_q, d_model]``, ``key`` ``[B, n_k, d_k]`` (default ``query``),
    ``mask`` bool broadcastable to ``[B, n_q, n_k]`` or ``[B, h, n_q, n_k]`` (True = may
    attend); ``causal=True`` adds the causal mask. With ``n_q != n_k`` the queries are the
    last ``n_q`` key positions (``j - i`` is measured from ``i + n_k - n_q``). Returns an
    :class:`AttentionOutput` (context ``[B, n_q, out_dim]``; weights ``[B, n_q, n_k]``
    averaged over heads, or ``[B, h, n_q, n_k]``).

    Cost: O(B h n_q n_k d) for the content terms and O(B h n_q (2k+1) d) for the relative
    terms; memory O(B h n_q (n_k + 2k + 1)) -- the relative scores are computed per
    (query, distance bucket) and gathered, the relative values are weighted per bucket, so
    no ``[n_q, n_k, d]`` tensor is formed (the paper's efficient form builds one ``[n, n,
    d]`` tensor shared by the batch and heads). There is no fused-kernel path: the value
    term needs the weights.

    :formula: e_ij = q_i (k_j + a^K_ij)^T / sqrt(d); z_i = sum_j a_ij (v_j + a^V_ij); a^{K,V}_ij
        = w^{K,V}[clip(j - i, -k, k)]
    :source: Shaw, Uszkoreit & Vaswani 2018, Self-Attention with Relative Position
        Representations
    :cost: O(B h n_q n_k d_head + B h n_q (2k+1) d_head) time, O(B h n_q (n_k + 2k + 1)) memory
        (no [n_q, n_k, d] tensor)
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 1,
        *,
        max_distance: int = 16,
        d_k: int | None = None,
        d_v: int | None = None,
        head_dim: int | None = None,
        values: bool = True,
        share_heads: bool = True,
        align: str = "soft",
        dropout: float = 0.0,
        bias: bool = True,
        out_dim: int | None = None,
    ) -> None:
        check_int(max_distance, "max_distance", 0)
        super().__init__(
            d_model,
            num_heads,
            head_dim,
            d_k=d_k,
            d_v=d_v,
            out_dim=out_dim,
            dropout=dropout,
            bias=bias,
        )
        head_dim = self.head_dim
        entry = get("align", align)
        if not entry.cls.supports_multi:
            raise ConfigError(
                f"alignment {entry.name!r} has no deterministic per-row form; relative "
                "position attention takes soft, sparsemax or entmax15"
            )
        self.align = entry.cls()
        self.max_distance = max_distance
        check_flags(share_heads=share_heads)
        self.share_heads = share_heads
        tables = 1 if self.share_heads else num_heads
        rows = 2 * max_distance + 1
        std = 1.0 / math.sqrt(head_dim)
        self.rel_k = nn.Parameter(torch.randn(tables, rows, head_dim) * std)
        if values:
            self.rel_v = nn.Parameter(torch.randn(tables, rows, head_dim) * std)
        else:
            self.register_parameter("rel_v", None)

    def _split(self, x: Tensor) -> Tensor:
        B, n, _ = x.shape
        return x.view(B, n, self.num_heads, self.head_dim).transpose(1, 2)

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        query, key, value, mask = call.query, call.key, call.value, call.mask
        B, n_q, _ = query.shape
        n_k = key.shape[1]
        hmask = _masks.normalize_head_mask(
            mask, B, self.num_heads, n_q, n_k, device=query.device, causal=call.causal
        )
        # padding never matters: cleared (where) before the projections
        query, key, value = clear_attention_inputs(
            query, key, value, hmask, self_attention=key is query
        )  # type: ignore[assignment]

        q = self._split(self.q_proj(query))  # [B, h, n_q, d]
        k = self._split(self.k_proj(key))
        v = self._split(self.v_proj(value))
        p = self.dropout if self.training else 0.0
        if self.share_heads:
            z, weights = relative_position_attention(
                q,
                k,
                v,
                self.rel_k[0],
                None if self.rel_v is None else self.rel_v[0],
                mask=hmask,
                normalize=self.align.normalize,
                dropout_p=p,
            )
        else:
            outs = [
                relative_position_attention(
                    q[:, j],
                    k[:, j],
                    v[:, j],
                    self.rel_k[j],
                    None if self.rel_v is None else self.rel_v[j],
                    mask=None if hmask is None else hmask[:, min(j, hmask.shape[1] - 1)],
                    normalize=self.align.normalize,
                    dropout_p=p,
                )
                for j in range(self.num_heads)
            ]
            z = torch.stack([o[0] for o in outs], 1)
            weights = torch.stack([o[1] for o in outs], 1)
        out = self.out_proj(z.transpose(1, 2).reshape(B, n_q, self.num_heads * self.head_dim))
        if not call.need_weights:
            return AttentionOutput(out, None, path="explicit")
        return AttentionOutput(out, reduce_weights(weights, call.average_weights), path="explicit")
