"""Multi-level attention (survey section 3.1.2): attention-via-attention and hierarchical
attention.

| name | definition | source |
| --- | --- | --- |
| attention-via-attention | word attention with the character query ``q_c`` gives ``c_w``; character attention with the query ``[q_c; c_w]`` gives ``c_c``; output ``[c_w; c_c]`` | Zhao & Zhang 2018 |
| hierarchical attention | attention over the tokens of every unit (word -> sentence), then over the unit vectors (sentence -> document), for any number of levels | Yang et al. 2016 (HAN) |

Both are compositions of the general parts: every attention step is an
:class:`attnlab.Attention` (any registered score and alignment); the character step of
attention-via-attention re-uses that module's score and normalises it within each word.

Helpers for ragged hierarchies: :func:`pad_hierarchy` (nested Python lists of tensors ->
padded tensor + mask), :func:`hierarchy_mask` (lengths per level -> mask), and
:class:`MaskedRNN` (a (Bi)GRU / (Bi)LSTM that reads only the real positions of each
sequence, the per-level encoder of HAN).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnlab._checks import (
    ConfigError,
    check_choice,
    check_flags,
    check_int,
    check_module_dtype,
    check_optional_int,
    check_same,
    check_tensor,
    found_on_host,
    is_traced,
)
from attnlab._recurrent import bound_rnn_weights, padded_rnn
from attnlab.general._convention import AttentionCall, ConventionAttention, reject
from attnlab.general.attention import Attention
from attnlab.general.dimensionality import combine_single
from attnlab.general.padding import zero_rows
from attnlab.masks import check_bool_mask
from attnlab.output import AttentionOutput
from attnlab.registry import get, register

__all__ = [
    "AttentionViaAttention",
    "HierarchicalAttention",
    "MaskedRNN",
    "char_word_map",
    "hierarchy_mask",
    "pad_hierarchy",
]


# ----------------------------------------------------------------------------- helpers


def _bool_mask(mask: object, name: str, shape: tuple[int, ...], layout: str) -> Tensor:
    mask = check_bool_mask(mask, name)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {layout} = {list(shape)}")
    return mask


def pad_hierarchy(
    batch: Sequence[Any],
    *,
    levels: int | None = None,
    d: int | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Pad a ragged hierarchy given as nested Python lists into ``(x, mask)``.

    ``batch`` is a list of documents; a document is a list of units of the next level
    down, and so on; the leaves are tensors ``[n_tokens, d]`` (the tokens of one lowest
    unit, e.g. the word vectors of one sentence). Empty units are allowed at every level:
    an empty list, or a leaf with zero rows (an empty list where a leaf is expected is read
    as an empty leaf). With ``L`` list levels (the batch list included; ``levels`` if given,
    else read from the depth of the leaves) the result is

    * ``x`` ``[B, n_1, ..., n_L, d]`` -- the tokens, zero at padded positions;
    * ``mask`` ``[B, n_1, ..., n_L]`` bool -- True at real tokens;

    where ``n_j`` is the largest size at level ``j``. ``levels`` and ``d`` are needed only
    when the batch holds no leaf to read them from (every document is empty). Gradients flow back into the leaves.

    Example: ``pad_hierarchy([[s1, s2], [s3]])`` with sentences ``s_i`` ``[n_i, d]`` gives
    ``x`` ``[2, 2, max n_i, d]`` (two documents of at most two sentences).
    """
    if not isinstance(batch, list | tuple):
        raise TypeError(f"batch must be a list of documents, got {type(batch).__name__}")
    leaves, sizes, list_paths = _collect_leaves(batch)
    depth = _leaf_depth(leaves, list_paths, levels)
    if not leaves:
        if d is None:
            raise ValueError("batch holds no token tensor, so d is unknown; pass d=")
        dtype = torch.get_default_dtype() if dtype is None else dtype
    else:
        ref = leaves[0][1]
        d = ref.shape[1] if d is None else d
        dtype = ref.dtype if dtype is None else dtype
        device = ref.device if device is None else device
    for path, t in leaves:
        if t.shape[1] != d:
            raise ValueError(f"{_where(path)} has shape {tuple(t.shape)}, expected [n_tokens, {d}]")
    lead = [sizes.get(j, 0) for j in range(depth)]
    return _scatter_leaves(leaves, lead, d, dtype, device)


_Leaves = list[tuple[tuple[int, ...], Tensor]]


def _where(path: tuple[int, ...]) -> str:
    return "batch" + "".join(f"[{i}]" for i in path)


def _collect_leaves(batch: Sequence[Any]) -> tuple[_Leaves, dict[int, int], list[tuple[int, ...]]]:
    """Walk the nested lists: the leaves ``(path, tensor)``, the largest list size per
    depth, and the paths of the empty lists."""
    leaves: _Leaves = []
    sizes: dict[int, int] = {}
    list_paths: list[tuple[int, ...]] = []

    def walk(node: Any, path: tuple[int, ...]) -> None:
        if isinstance(node, Tensor):
            check_tensor(node, _where(path))
            if node.dim() != 2:
                raise ValueError(
                    f"{_where(path)} has shape {tuple(node.shape)}, expected [n_tokens, d]"
                )
            leaves.append((path, node))
            return
        if not isinstance(node, list | tuple):
            raise TypeError(f"{_where(path)} must be a list or a tensor, got {type(node).__name__}")
        sizes[len(path)] = max(sizes.get(len(path), 0), len(node))
        if len(node) == 0:
            list_paths.append(path)
        for i, child in enumerate(node):
            walk(child, (*path, i))

    walk(list(batch), ())
    return leaves, sizes, list_paths


def _leaf_depth(leaves: _Leaves, list_paths: list[tuple[int, ...]], levels: int | None) -> int:
    """The number of list levels above the leaves (batch included), the same for every
    leaf (and equal to ``levels`` when given)."""
    depths = {len(p) for p, _ in leaves}
    if levels is not None:
        depths.add(check_int(levels, "levels", error=ValueError))
    if len(depths) > 1:
        raise ValueError(
            f"the leaves (token tensors) of batch sit at depths {sorted(depths)}"
            + (f" but levels={levels}" if levels is not None else "")
            + "; every leaf must be a [n_tokens, d] tensor at the same nesting depth"
        )
    if not depths:
        raise ValueError(
            "batch holds no token tensor, so its depth is unknown; pass levels= and d= "
            "(or give at least one leaf tensor, possibly of shape [0, d])"
        )
    depth = depths.pop()
    # an empty list where a leaf is expected is an empty leaf
    for p in list_paths:
        if len(p) > depth:
            raise ValueError(f"{_where(p)} is nested deeper than the leaves (depth {depth})")
    return depth


def _scatter_leaves(
    leaves: _Leaves,
    lead: list[int],
    d: int,
    dtype: torch.dtype,
    device: torch.device | str | None,
) -> tuple[Tensor, Tensor]:
    """The padded ``(x [*lead, n_tok, d], mask [*lead, n_tok])`` from the leaves (one
    ``index_put``, so gradients flow back into them)."""
    n_tok = max((t.shape[0] for _, t in leaves), default=0)
    strides = [math.prod(lead[j + 1 :]) for j in range(len(lead))]
    units = math.prod(lead)
    x = torch.zeros(units, n_tok, d, dtype=dtype, device=device)
    mask = torch.zeros(units, n_tok, dtype=torch.bool, device=device)
    unit_ids, positions, parts = [], [], []
    for path, t in leaves:
        if t.shape[0] == 0:
            continue
        flat = sum(i * s for i, s in zip(path, strides, strict=True))
        unit_ids.append(torch.full((t.shape[0],), flat, dtype=torch.long))
        positions.append(torch.arange(t.shape[0]))
        parts.append(t.to(dtype=dtype, device=device))
    if parts:
        u = torch.cat(unit_ids).to(device)
        p = torch.cat(positions).to(device)
        x = x.index_put((u, p), torch.cat(parts))
        mask[u, p] = True
    return x.reshape(*lead, n_tok, d), mask.reshape(*lead, n_tok)


def hierarchy_mask(
    lengths: Sequence[Tensor | Sequence[Any]], sizes: Sequence[int] | None = None
) -> Tensor:
    """Token mask ``[B, n_1, ..., n_L]`` of a padded hierarchy from its lengths per level.

    ``lengths[j]`` (``j = 0 .. L-1``) has shape ``[B, n_1, ..., n_j]`` and holds how many
    real items the unit has along axis ``j + 1``: ``lengths[0]`` ``[B]`` is the number of
    sentences of each document, ``lengths[1]`` ``[B, n_1]`` the number of words of each
    sentence, and so on. Entries at padded positions are ignored (they must still be
    >= 0). ``sizes`` (``[n_1, ..., n_L]``) defaults to the largest real lengths. Position ``(b, i_1, ..., i_L)`` is real iff
    ``i_{j+1} < lengths[j][b, i_1, ..., i_j]`` for every ``j``. ``sizes`` holds ints
    ``>= 0`` (``ValueError`` otherwise: ``2.5`` is not silently cut to 2).
    """
    if len(lengths) == 0:
        raise ValueError("lengths is empty; expected one lengths tensor per level")
    ls = [torch.as_tensor(t) for t in lengths]
    for j, t in enumerate(ls):
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"lengths[{j}] has dtype {t.dtype}, expected an integer dtype")
        if found_on_host(t < 0):
            raise ValueError(f"lengths[{j}] holds negative lengths")
    L = len(ls)
    if sizes is not None and len(sizes) != L:
        raise ValueError(f"sizes has {len(sizes)} entries, expected one per level ({L})")
    if ls[0].dim() != 1:
        raise ValueError(f"lengths[0] has shape {tuple(ls[0].shape)}, expected [B]")
    B = ls[0].shape[0]
    dims: list[int] = []
    mask = torch.ones((B,), dtype=torch.bool, device=ls[0].device)
    for j, t in enumerate(ls):
        want = (B, *dims)
        if tuple(t.shape) != want:
            layout = "[B" + "".join(f", n_{i + 1}" for i in range(j)) + "]"
            raise ValueError(
                f"lengths[{j}] has shape {tuple(t.shape)}, expected {layout} = {list(want)}"
            )
        # lengths at padded positions are ignored
        real = torch.where(mask, t, torch.zeros_like(t)) if j else t
        if sizes is not None:  # no size read from the data: traceable (torch.export)
            check_int(sizes[j], f"sizes[{j}]", minimum=0, error=ValueError)
            if found_on_host(real > sizes[j]):
                raise ValueError(
                    f"sizes[{j}]={sizes[j]} is smaller than the largest lengths[{j}] "
                    f"{int(real.max())}"
                )
            n = int(sizes[j])
        else:
            n = int(real.max()) if real.numel() else 0
        pos = torch.arange(n, device=t.device)
        mask = mask[..., None] & (pos < t[..., None])
        dims.append(n)
    return mask


class MaskedRNN(nn.Module):
    """A GRU or LSTM (optionally bidirectional) that reads only the real positions of
    each sequence: ``forward(x [N, n, d_in], mask [N, n]) -> [N, n, out_dim]``.

    The real positions of each row are moved to the front (in order), the rows are run as
    a packed batch (empty rows are skipped) and the outputs are put back in place; padded
    positions get zeros. So a row's output never depends on its padding, whatever the
    mask pattern. ``out_dim = hidden * (2 if bidirectional else 1)``. The HAN encoder of
    Yang et al. 2016 is ``MaskedRNN(d_in, hidden, cell="gru", bidirectional=True)``.
    Under ``torch.compile`` the same weights run on the padded rows instead
    (:func:`attnlab._recurrent.padded_rnn`: same outputs, no host synchronisation, one graph).
    Cost: that of the recurrent cell, O(N n d_in hidden).
    """

    def __init__(
        self, d_in: int, hidden: int, cell: str = "gru", bidirectional: bool = True
    ) -> None:
        super().__init__()
        cells = {"gru": nn.GRU, "lstm": nn.LSTM}
        if cell not in cells:
            raise ConfigError(f"cell must be 'gru' or 'lstm', got {cell!r}")
        check_int(d_in, "d_in", owner="MaskedRNN")
        check_int(hidden, "hidden", owner="MaskedRNN")
        check_flags(bidirectional=bidirectional)
        self.rnn = cells[cell](d_in, hidden, batch_first=True, bidirectional=bidirectional)
        self._weights = bound_rnn_weights(self, "rnn")
        self.d_in = d_in
        self.out_dim = hidden * (2 if bidirectional else 1)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        check_tensor(x, "x")
        if x.dim() != 3 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, expected [N, n, d_in] = [N, n, {self.d_in}]"
            )
        N, n, _ = x.shape
        if mask is None:
            mask = torch.ones(N, n, dtype=torch.bool, device=x.device)
        _bool_mask(mask, "mask", (N, n), "[N, n]")
        out = x.new_zeros(N, n, self.out_dim)
        if N == 0 or n == 0:
            return out
        lengths = mask.sum(1)
        # the real positions first, each group in its order: distinct keys, so any sort
        # gives this order (a stable sort has no ONNX translation)
        order = torch.argsort((~mask).long() * n + torch.arange(n, device=x.device), dim=1)
        packed_x = x.gather(1, order[..., None].expand(-1, -1, x.shape[-1]))
        if is_traced():  # dynamo traces neither nn.GRU/LSTM nor packing; vmap no packing
            o = padded_rnn(self._weights, packed_x, lengths, training=self.training)
            return self._put_back(o.to(out.dtype), order, mask)
        rows = (lengths > 0).nonzero().squeeze(1)
        if rows.numel():
            packed = pack_padded_sequence(
                packed_x[rows], lengths[rows].cpu(), batch_first=True, enforce_sorted=False
            )
            o, _ = self.rnn(packed)
            o, _ = pad_packed_sequence(o, batch_first=True, total_length=n)
            out = out.index_copy(0, rows, o.to(out.dtype))
        return self._put_back(out, order, mask)

    @staticmethod
    def _put_back(out: Tensor, order: Tensor, mask: Tensor) -> Tensor:
        """The outputs of the real positions moved to the front (``order``) put back in
        place, zeros at the padding."""
        back = torch.zeros_like(out).scatter(1, order[..., None].expand_as(out), out)
        return torch.where(mask[..., None], back, back.new_zeros(()))


def _takes_mask(module: nn.Module) -> bool:
    try:
        return "mask" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- hierarchical

_RNN_ENCODERS = {
    "gru": ("gru", False),
    "bigru": ("gru", True),
    "lstm": ("lstm", False),
    "bilstm": ("lstm", True),
}

EncoderSpec = str | Callable[[int, int], nn.Module] | nn.Module | None


@register("feature", "hierarchical-attention", aliases=("han", "hierarchical"))
class HierarchicalAttention(ConventionAttention):
    """Hierarchical attention (Yang et al. 2016, HAN) of any depth, for ragged input.

    The input is a padded hierarchy ``x`` ``[B, n_1, ..., n_L, d_in]`` with a token mask
    ``[B, n_1, ..., n_L]`` (e.g. ``L = 2``: documents of ``n_1`` sentences of ``n_2``
    words; ``L = 3`` adds paragraphs). Level ``l = 1`` attends over the tokens of every
    lowest unit, level 2 over the unit vectors of every unit one level up, ..., level
    ``L`` over the ``n_1`` top units of each document::

        h = enc_l(x_unit)                                  (identity, a BiGRU, any module)
        e_i = score(u_l, h_i)   (HAN: u_i = tanh(W_l h_i + b_l), e_i = u_i^T u_l)
        a = align(e) over the real items of the unit       (HAN: softmax)
        c_unit = sum_i a_i h_i                             -> the items of level l + 1

    The default score is ``queryless`` (``w^T act(W h + b)``: HAN's context vector ``u_w``
    is the learned ``w``); a score that needs a query (``dot``, ``additive``, ...) gets a
    learned query vector per level. Each level is one :class:`attnlab.Attention` call on
    the flattened ``[N_l, n_l, d_l]`` units -- there is no Python loop over the batch or
    over units, only over the ``L`` levels. A unit with no real item (an empty sentence, a
    document without sentences) gets a zero vector and is masked out at the next level: a
    unit is real iff it holds at least one real token.

    Args:
        d_in: token feature size ``d_in``.
        levels: ``L``, the number of attention levels (``x`` has ``L + 2`` axes).
        score, align: names of a registered score / alignment (HAN: ``queryless`` /
            ``soft``), used at every level.
        encoder: per-level encoder before the attention: ``None`` / ``"identity"``,
            ``"bigru"`` (HAN), ``"gru"``, ``"bilstm"``, ``"lstm"`` (a :class:`MaskedRNN`
            with ``encoder_hidden`` units per direction), a factory
            ``f(level, d_in) -> nn.Module`` (``level`` counts from 1 at the tokens), or a
            list with one of these per level. A module is called ``enc(x, mask=mask)`` if
            its ``forward`` takes ``mask``, else ``enc(x)``, on ``[N, n, d]``; its output
            size is its ``out_dim`` attribute (default: unchanged).
        encoder_hidden: hidden units per direction of the RNN encoders (default ``d_in``
            of the level).
        query_dim: size of the learned query of a query-taking score (default: ``d_l``).
        **options: passed to every level's :class:`attnlab.Attention` (``d_w``, ``act``,
            ``bias``, ``dropout``, ...).

    Shapes: ``forward(x [B, n_1..n_L, d_in], *, mask=[B, n_1..n_L] or None)`` (``x`` is the
    convention's ``query``) returns
    :class:`~attnlab.output.AttentionOutput` with ``context`` ``[B, d_out]`` and, with
    ``need_weights=True``, ``weights`` -- a list of ``L`` tensors, level 1 ``[B, n_1, ...,
    n_L]``, level 2 ``[B, n_1, ..., n_{L-1}]``, ..., level ``L`` ``[B, n_1]`` (zeros at
    padded and empty items). ``extras["masks"]`` holds the item mask of every level (same
    shapes) and ``extras["units"]`` the unit vectors entering each level above the first.

    Cost: time O(sum_l N_l n_l d_l d_w) for the scores plus the encoders, memory that of
    the padded input. Source: Yang, Yang, Dyer, He, Smola & Hovy 2016, "Hierarchical
    Attention Networks for Document Classification", NAACL.

    :formula: per level l = 1..L (tokens -> units -> ... -> document): h = enc_l(x); u_i =
        act(W_l h_i + b_l); a_i = softmax_i(u_i^T u_l) over the real items of a unit; c = sum_i
        a_i h_i; a unit with no real item gets c = 0 and is masked at level l+1
    :source: Yang, Yang, Dyer, He, Smola & Hovy 2016, Hierarchical Attention Networks for
        Document Classification (NAACL)
    :cost: O(sum_l N_l n_l d_l d_w) time, N_l = number of units at level l; memory O(B n_1...n_L
        d)
    """

    positional_masks = (("mask",), 2)

    def __init__(
        self,
        d_in: int,
        levels: int = 2,
        score: str = "queryless",
        align: str = "soft",
        *,
        encoder: EncoderSpec | Sequence[EncoderSpec] = None,
        encoder_hidden: int | None = None,
        query_dim: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(levels, "levels")
        check_int(d_in, "d_in")
        check_optional_int(encoder_hidden, "encoder_hidden")
        check_optional_int(query_dim, "query_dim")
        if not isinstance(score, str) or not isinstance(align, str):
            raise ConfigError(
                "score and align must be registered names (one module per level is built)"
            )
        needs_query = get("score", score).cls.needs_query
        if isinstance(encoder, list | tuple):
            if len(encoder) != levels:
                raise ConfigError(
                    f"encoder has {len(encoder)} entries, expected one per level ({levels})"
                )
            specs = list(encoder)
        else:
            specs = [encoder] * levels
        if isinstance(encoder, nn.Module) and levels > 1:
            raise ConfigError(
                "one encoder module cannot serve several levels; pass a factory or a list"
            )
        self.levels = levels
        self.d_in = d_in
        self.needs_query = needs_query
        self.encoders = nn.ModuleList()
        self.attn = nn.ModuleList()
        self.queries = nn.ParameterList()
        self._enc_mask: list[bool] = []
        self.dims: list[int] = []
        d = d_in
        for level, spec in enumerate(specs, start=1):
            enc = self._make_encoder(spec, level, d, encoder_hidden)
            self.encoders.append(enc)
            self._enc_mask.append(_takes_mask(enc))
            d = int(getattr(enc, "out_dim", d))
            self.dims.append(d)
            dq = (query_dim or d) if needs_query else None
            self.attn.append(Attention(score=score, align=align, d_q=dq, d_k=d, **options))
            if needs_query:
                self.queries.append(nn.Parameter(torch.randn(dq) / math.sqrt(dq)))
        self.out_dim = d

    @staticmethod
    def _make_encoder(spec: EncoderSpec, level: int, d: int, hidden: int | None) -> nn.Module:
        if spec is None or spec == "identity":
            return nn.Identity()
        if isinstance(spec, str):
            if spec not in _RNN_ENCODERS:
                raise ConfigError(
                    f"encoder {spec!r} is unknown; expected None, 'identity', "
                    f"{', '.join(repr(k) for k in _RNN_ENCODERS)}, a module or a factory"
                )
            cell, bi = _RNN_ENCODERS[spec]
            return MaskedRNN(d, hidden or d, cell=cell, bidirectional=bi)
        if isinstance(spec, nn.Module):
            return spec
        if callable(spec):
            module = spec(level, d)
            if not isinstance(module, nn.Module):
                raise ConfigError(
                    f"the encoder factory returned {type(module).__name__} for level {level}, "
                    "expected an nn.Module"
                )
            return module
        raise ConfigError(
            f"encoder must be a name, a module or a factory, got {type(spec).__name__}"
        )

    def _check(self, x: Tensor, mask: Tensor | None) -> Tensor:
        check_tensor(x, "x")
        L = self.levels
        layout = "[B" + "".join(f", n_{i + 1}" for i in range(L)) + ", d_in]"
        if x.dim() != L + 2 or x.shape[-1] != self.d_in:
            raise ValueError(
                f"x has shape {tuple(x.shape)}, expected {layout} with d_in = {self.d_in} "
                f"({L} levels)"
            )
        check_module_dtype(self, x, "x")
        if mask is None:
            return torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
        m_layout = "[B" + "".join(f", n_{i + 1}" for i in range(L)) + "]"
        _bool_mask(mask, "mask", tuple(x.shape[:-1]), m_layout)
        if mask.device != x.device:
            raise ValueError(f"mask is on {mask.device} but x is on {x.device}")
        return mask

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        """The call ``module(x, *, mask=None, need_weights=False)``: ``query`` = ``x``
        ``[B, n_1, ..., n_L, d_in]`` (named ``x`` in messages) with its token ``mask``
        ``[B, n_1, ..., n_L]``. The hierarchy is its own keys and values (each level's
        query is learned), so ``key`` and ``value`` are not taken (a bool tensor in the
        ``key`` slot is read as the mask given positionally, the deprecated form).

        Deprecated for one release (``DeprecationWarning``): ``x=`` and the mask given
        positionally, ``module(x, mask)``."""
        owner = type(self).__name__
        call = self._renamed(call, extras, {"x": "query"})
        reject(owner, "key", call.key, "the hierarchy is its own keys (give it as query)")
        reject(owner, "value", call.value, "the hierarchy is its own values (give it as query)")
        if call.query is None:
            raise TypeError(f"{owner}.forward() missing the hierarchy: query [B, n_1..n_L, d_in]")
        return call

    def _attend(self, call: AttentionCall) -> AttentionOutput:
        return self._attend_up(call.query, call.mask, call.need_weights)

    def _attend_up(self, x: Tensor, mask: Tensor | None, need_weights: bool) -> AttentionOutput:
        m = self._check(x, mask)
        # padding never matters: padded tokens are zeroed (where, not a product) before any
        # encoder sees them
        h = x if mask is None else torch.where(m[..., None], x, x.new_zeros(()))
        weights: list[Tensor] = []
        masks: list[Tensor] = []
        units: list[Tensor] = []
        log_prob: Tensor | None = None
        for level in range(self.levels):
            lead = tuple(h.shape[:-2])
            out = self._level(level, h, m, need_weights)
            masks.append(m)
            if need_weights:
                # [N, n] for single-dimensional attention, [N, n, d_v] for multi-dimensional
                weights.append(out.weights.reshape(*lead, *out.weights.shape[1:]))
            if out.log_prob is not None:  # stochastic alignments: one log-prob per batch row
                lp = out.log_prob.reshape(x.shape[0], -1).sum(-1)
                log_prob = lp if log_prob is None else log_prob + lp
            h = out.context.reshape(*lead, out.context.shape[-1])
            m = m.any(-1)
            if level + 1 < self.levels:
                units.append(h)
        return AttentionOutput(
            h,
            weights if need_weights else None,
            log_prob=log_prob,
            extras={"masks": masks, "units": units},
        )

    def _level(self, level: int, h: Tensor, m: Tensor, need_weights: bool) -> AttentionOutput:
        """Encode and attend over the items of every unit at ``level`` (0-based): ``h``
        ``[*lead, n, d]``, ``m`` ``[*lead, n]``; the output is on ``[N, n, d]`` rows,
        ``N = prod(lead)``."""
        lead = tuple(h.shape[:-2])
        n, d = h.shape[-2], h.shape[-1]
        N = math.prod(lead)
        hf = h.reshape(N, n, d)
        mf = m.reshape(N, n)
        enc = self.encoders[level]
        hf = enc(hf, mask=mf) if self._enc_mask[level] else enc(hf)
        if hf.dim() != 3 or hf.shape[:2] != (N, n) or hf.shape[2] != self.dims[level]:
            raise ValueError(
                f"the level-{level + 1} encoder returned shape {tuple(hf.shape)}, expected "
                f"[N, n, out_dim] = [{N}, {n}, {self.dims[level]}]"
            )
        q = None
        if self.needs_query:
            q = self.queries[level].to(hf.dtype).expand(N, -1)
        return self.attn[level](q, hf, mask=mf, need_weights=need_weights)


# ----------------------------------------------------------------------------- via attention


def char_word_map(
    *,
    n_chars: int,
    word_offsets: Tensor | None = None,
    char_to_word: Tensor | None = None,
    word_mask: Tensor | None = None,
    char_mask: Tensor | None = None,
    batch: int | None = None,
    n_words: int | None = None,
) -> Tensor:
    """The character -> word mapping as a bool tensor ``M`` ``[B, n_w, n_c]`` (True where
    character ``l`` belongs to word ``j``), from either form:

    * ``word_offsets`` ``[B, n_w]`` (integer): the start of every word in the character
      sequence. Word ``j`` covers ``[offset_j, next_j)``, where ``next_j`` is the offset
      of the next real word (``word_mask``) or, for the last real word, one past the last
      real character (``char_mask``; ``n_c`` without it). Offsets of real words must lie
      in ``[0, n_c]`` and must not decrease.
    * ``char_to_word`` ``[B, n_w, n_c]`` bool, given directly.

    Padded words (``word_mask`` False) and padded characters (``char_mask`` False) are
    dropped from the mapping. Every character belongs to at most one word; characters of
    no word (spaces, padding) are allowed. ``n_chars`` (and ``batch`` / ``n_words``, the
    expected sizes, when given) must be ints ``>= 0``, else ``ValueError``.
    Cost O(B n_w n_c) (bool).
    """
    check_int(n_chars, "n_chars", minimum=0, error=ValueError)
    check_optional_int(batch, "batch", minimum=0, error=ValueError)
    check_optional_int(n_words, "n_words", minimum=0, error=ValueError)
    if (word_offsets is None) == (char_to_word is None):
        raise ValueError(
            "give the character -> word mapping as exactly one of word_offsets or char_to_word"
        )
    if char_to_word is not None:
        M = _checked_char_to_word(char_to_word, n_chars, batch, n_words)
    else:
        assert word_offsets is not None
        _check_word_offsets(word_offsets, batch, n_words)
        M = _map_from_offsets(word_offsets, n_chars, word_mask, char_mask)
    if word_mask is not None:
        M = M & word_mask[:, :, None]
    if char_mask is not None:
        M = M & char_mask[:, None, :]
    # a data-dependent check: skipped under torch.compile (it would break the graph)
    if M.numel() and found_on_host(M.sum(1) > 1):
        raise ValueError(
            "char_to_word maps a character to more than one word; every character belongs to at most one word"
        )
    return M


def _checked_char_to_word(
    char_to_word: object, n_chars: int, batch: int | None, n_words: int | None
) -> Tensor:
    if (
        not isinstance(char_to_word, Tensor)
        or char_to_word.dtype != torch.bool
        or char_to_word.dim() != 3
    ):
        shape = (
            tuple(char_to_word.shape)
            if isinstance(char_to_word, Tensor)
            else type(char_to_word).__name__
        )
        raise ValueError(
            f"char_to_word has shape/type {shape}, expected a bool tensor [B, n_w, n_c]"
        )
    B, n_w, n_c = char_to_word.shape
    if (
        (batch is not None and B != batch)
        or n_c != n_chars
        or (n_words is not None and n_w != n_words)
    ):
        want = [
            batch if batch is not None else "B",
            n_words if n_words is not None else "n_w",
            n_chars,
        ]
        raise ValueError(
            f"char_to_word has shape {tuple(char_to_word.shape)}, expected [B, n_w, n_c] = {want}"
        )
    return char_to_word


def _check_word_offsets(word_offsets: object, batch: int | None, n_words: int | None) -> None:
    if not isinstance(word_offsets, Tensor):
        raise TypeError(f"word_offsets must be a torch.Tensor, got {type(word_offsets).__name__}")
    if word_offsets.dtype.is_floating_point or word_offsets.dtype == torch.bool:
        raise TypeError(f"word_offsets has dtype {word_offsets.dtype}, expected an integer dtype")
    if (
        word_offsets.dim() != 2
        or (batch is not None and word_offsets.shape[0] != batch)
        or (n_words is not None and word_offsets.shape[1] != n_words)
    ):
        want = [batch if batch is not None else "B", n_words if n_words is not None else "n_w"]
        raise ValueError(
            f"word_offsets has shape {tuple(word_offsets.shape)}, expected [B, n_w] = {want}"
        )


def _map_from_offsets(
    word_offsets: Tensor, n_c: int, word_mask: Tensor | None, char_mask: Tensor | None
) -> Tensor:
    """``M`` ``[B, n_w, n_c]`` from the word starts: word ``j`` covers ``[offset_j,
    next_j)`` (see :func:`char_word_map`)."""
    B, n_w = word_offsets.shape
    dev = word_offsets.device
    real_w = (
        word_mask if word_mask is not None else torch.ones(B, n_w, dtype=torch.bool, device=dev)
    )
    off = word_offsets.long()
    if found_on_host(((off < 0) | (off > n_c)) & real_w):
        raise ValueError(f"word_offsets holds offsets outside [0, n_c] = [0, {n_c}] for real words")
    pos = torch.arange(n_c, device=dev)
    if char_mask is not None:
        end = (
            torch.where(char_mask, pos + 1, torch.zeros_like(pos)).amax(-1)
            if n_c
            else torch.zeros(B, dtype=torch.long, device=dev)
        )
    else:
        end = torch.full((B,), n_c, dtype=torch.long, device=dev)
    # the starts of the real words in order (slot r: the r-th real word), then "none"
    # (n_c + 1); a padded word writes "none" to the spare slot n_w
    big = torch.full_like(off, n_c + 1)
    seen = real_w.long().cumsum(1)  # [B, n_w]: real words up to and including j
    rank = torch.where(real_w, seen - 1, torch.full_like(seen, n_w))
    starts = torch.cat([big, big[:, :1]], 1).scatter(1, rank, torch.where(real_w, off, big))
    # next_j: the next real word's start, or the end of the text (cumsum and gather, no
    # scan: ONNX has no cummin); it is the minimum of the later starts, as the starts
    # never decrease along the real words (checked here)
    nxt = torch.minimum(starts.gather(1, seen), end[:, None])
    before = starts.gather(1, (seen - 2).clamp(min=0))  # the previous real word's start
    if found_on_host(real_w & (seen >= 2) & (off < before)):
        raise ValueError("word_offsets must not decrease along the real words of a row")
    return (
        real_w[:, :, None]
        & (pos[None, None, :] >= off[:, :, None])
        & (pos[None, None, :] < nxt[:, :, None])
    )


_VIA = ("mixture", "query")


@register("feature", "attention-via-attention", aliases=("ava", "attention-via-attention-nmt"))
class AttentionViaAttention(ConventionAttention):
    """Attention-via-attention (Zhao & Zhang 2018): word-level attention guides
    character-level attention.

    With the character-level query ``q_c`` (e.g. the state of a character decoder),
    character features ``k^c_l`` (``l = 1..n_c``) and word features ``k^w_j``
    (``j = 1..n_w``)::

        a^w = align(score_w(q_c, k^w))           word weights,  c_w = sum_j a^w_j k^w_j
        e_l = score_c([q_c; c_w], k^c_l)         character scores, query = [q_c; c_w]
        via="mixture" (default):  a^c_l = a^w_{w(l)} * softmax_{l' in word w(l)}(e)_l
        via="query":              a^c = align_c(e) over all real characters
        c_c = sum_l a^c_l k^c_l;  output [c_w; c_c]

    **How the character -> word mapping is used.** The paper's idea (and the survey's
    description) is to find the important words first and then attend to *their*
    characters. With ``via="mixture"`` the character distribution is the word
    distribution spread over each word's characters: ``P(l) = P(word w(l)) P(l | w(l))``,
    where the within-word distribution is the character alignment (softmax by default)
    restricted to the characters of that word. So a character of a word with weight 0
    gets weight 0, the weights of a word's characters sum to the word's weight, and
    characters of no word (spaces, padding) get 0. Word attention then runs over the
    words that are real *and* own at least one real character, so the character weights
    sum to 1; a row without such a word (``n_w = 0``, every word padded or empty) gets
    zero word and character weights and a zero context. ``via="query"`` is the bare
    formula: the word context enters only through the query (``c_w = 0`` for a row
    without words) and the mapping is used only to build word features. When ``words``
    is not given, a word's feature is the mean of its characters' features
    (``d_word = d_char``).

    The mapping is given as ``word_offsets`` ``[B, n_w]`` (start of each word; ragged
    rows via ``word_mask``) or ``char_to_word`` ``[B, n_w, n_c]`` bool; see
    :func:`char_word_map`.

    Args:
        d_q: size of ``q_c``. d_char: character feature size. d_word: word feature size
            (default ``d_char``).
        score, align: word-level score / alignment names (default ``additive`` / ``soft``).
        char_score, char_align: character-level ones (default: the same names). With
            ``via="mixture"`` the character alignment must be one that normalises along an
            axis (``soft``, ``sparsemax``, ``entmax15``); ``soft`` runs as a segment
            softmax in O(n_c), the others on a ``[B, n_q, n_w, n_c]`` tensor.
        via: ``"mixture"`` or ``"query"`` (see above).
        **options: passed to both :class:`attnlab.Attention` modules (``d_w``, ``act``,
            ``key_dim``, ``value_dim``, ...).

    Shapes (called ``forward(q, chars, words=None, *, mask=char_mask, word_mask=None,
    word_offsets=None, char_to_word=None, need_weights=False)``, the convention's
    ``query``, ``key``, ``value`` and ``mask``; the keywords are listed in ``keywords``):
    ``q`` ``[B, d_q]`` or ``[B, n_q, d_q]``; ``chars`` ``[B, n_c, d_char]``; ``words``
    ``[B, n_w, d_word]`` (optional); ``char_mask`` ``[B, n_c]``, ``word_mask`` ``[B, n_w]``
    bool. Returns :class:`~attnlab.output.AttentionOutput` with ``context``
    ``[B, (n_q,) d_vw + d_vc]`` = ``[c_w; c_c]``; with ``need_weights=True`` ``weights`` is
    the character weights ``[B, (n_q,) n_c]``. ``extras``: ``word_context``,
    ``char_context``, and with ``need_weights`` ``word_weights`` ``[B, (n_q,) n_w]`` and
    ``char_weights``.

    Cost: O(B n_q (n_w + n_c) d_w) time for additive scores; the mapping O(B n_w n_c)
    bool. Source: Zhao & Zhang 2018, "Attention-via-Attention Neural Machine
    Translation", AAAI.

    :formula: c_w = sum_j a_j v^w_j, a = align(score(q_c, k^w_j)); e_l = score([q_c; c_w],
        k^c_l); mixture: a^c_l = a_{w(l)} softmax_{l' in w(l)}(e)_l; c_c = sum_l a^c_l v^c_l;
        output [c_w; c_c]
    :source: Zhao & Zhang 2018, Attention-via-Attention Neural Machine Translation (AAAI)
    :cost: O(B n_q (n_w + n_c) d_w) time; memory O(B n_q (n_w + n_c)) with soft alignment
    """

    keywords = ("word_mask", "word_offsets", "char_to_word")

    def __init__(
        self,
        d_q: int,
        d_char: int,
        d_word: int | None = None,
        *,
        score: str = "additive",
        align: str = "soft",
        char_score: str | None = None,
        char_align: str | None = None,
        via: str = "mixture",
        **options: Any,
    ) -> None:
        super().__init__()
        self.via = check_choice(via, "via", _VIA)
        check_int(d_q, "d_q", owner="AttentionViaAttention")
        check_int(d_char, "d_char", owner="AttentionViaAttention")
        check_optional_int(d_word, "d_word", owner="AttentionViaAttention")
        self.d_q, self.d_char = d_q, d_char
        self.d_word = d_char if d_word is None else d_word
        self.word_attn = Attention(score=score, align=align, d_q=d_q, d_k=self.d_word, **options)
        vw = options.get("value_dim") or self.d_word
        self.d_vw = vw
        self.char_attn = Attention(
            score=char_score or score,
            align=char_align or align,
            d_q=d_q + vw,
            d_k=d_char,
            **options,
        )
        self.d_vc = options.get("value_dim") or d_char
        self.out_dim = self.d_vw + self.d_vc
        calign = self.char_attn.align
        if via == "mixture" and not calign.supports_multi:
            raise ConfigError(
                f"via='mixture' normalises the character scores within each word, which "
                f"alignment {self.char_attn._align_name!r} cannot do (use soft, sparsemax or "
                "entmax15, or via='query')"
            )
        self._segment = via == "mixture" and self.char_attn._align_name == "soft"

    def _check(
        self,
        q: Tensor,
        chars: Tensor,
        words: Tensor | None,
        char_mask: Tensor | None,
        word_mask: Tensor | None,
    ) -> tuple[int, int, int | None]:
        check_tensor(chars, "chars")
        if chars.dim() != 3 or chars.shape[-1] != self.d_char:
            raise ValueError(
                f"chars has shape {tuple(chars.shape)}, expected [B, n_c, d_char] = [B, n_c, {self.d_char}]"
            )
        B, n_c, _ = chars.shape
        check_tensor(q, "q")
        if q.dim() not in (2, 3) or q.shape[0] != B or q.shape[-1] != self.d_q:
            raise ValueError(
                f"q has shape {tuple(q.shape)}, expected [B, d_q] = [{B}, {self.d_q}] or "
                f"[B, n_q, d_q] = [{B}, n_q, {self.d_q}]"
            )
        n_w = None
        if words is not None:
            check_tensor(words, "words")
            if words.dim() != 3 or words.shape[0] != B or words.shape[-1] != self.d_word:
                raise ValueError(
                    f"words has shape {tuple(words.shape)}, expected [B, n_w, d_word] = [{B}, n_w, {self.d_word}]"
                )
            n_w = words.shape[1]
        if char_mask is not None:
            _bool_mask(char_mask, "char_mask", (B, n_c), "[B, n_c]")
        if word_mask is not None:
            if n_w is None:
                if not isinstance(word_mask, Tensor) or word_mask.dim() != 2:
                    raise ValueError(
                        f"word_mask has shape {getattr(word_mask, 'shape', None)}, expected [B, n_w]"
                    )
                n_w = word_mask.shape[1]
            _bool_mask(word_mask, "word_mask", (B, n_w), "[B, n_w]")
        check_same(q, "q", chars=chars, words=words)
        check_module_dtype(self, q, "q")
        return B, n_c, n_w

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        """The inputs map onto the convention as ``query`` = the character-level query
        ``q_c`` ``[B, d_q]`` or ``[B, n_q, d_q]`` (named ``q`` in messages), ``key`` = the
        character features ``[B, n_c, d_char]`` (``chars``), ``value`` = the word features
        ``[B, n_w, d_word]`` (``words``, optional: the mean of each word's characters
        without it), ``mask`` = the character mask ``[B, n_c]`` (``char_mask``).

        Deprecated for one release (``DeprecationWarning``): ``q=``, ``chars=``,
        ``words=`` and ``char_mask=``."""
        renames = {"q": "query", "chars": "key", "words": "value", "char_mask": "mask"}
        call = self._renamed(call, extras, renames)
        if call.query is None or call.key is None:
            raise TypeError(
                f"{type(self).__name__}.forward() needs query (q_c) and key (the characters)"
            )
        return call

    def _attend(self, call: AttentionCall, **extras: Tensor | None) -> AttentionOutput:
        """Word attention, then character attention via it. ``extras`` (``keywords``):
        ``word_mask`` ``[B, n_w]`` and the mapping, ``word_offsets`` or ``char_to_word``.
        See the class docstring for the output."""
        word_mask, word_offsets, char_to_word = (extras.get(name) for name in self.keywords)
        q, chars, words, char_mask = call.query, call.key, call.value, call.mask
        need_weights = call.need_weights
        B, n_c, n_w = self._check(q, chars, words, char_mask, word_mask)
        # padding never matters: padded characters / words are zeroed (where, not a
        # product) before the projections, the word means and the weighted sums
        chars = zero_rows(chars, char_mask)
        if words is not None:
            words = zero_rows(words, word_mask)
        M = self._mapping(B, n_c, n_w, words, word_offsets, char_to_word, word_mask, char_mask)
        n_w = M.shape[1] if M is not None else n_w
        assert n_w is not None
        if words is None:
            assert M is not None
            Mf = M.to(chars.dtype)
            words = (Mf @ chars) / Mf.sum(-1, keepdim=True).clamp_min(1.0)
        wmask = _ones_if_none(word_mask, B, n_w, chars.device)
        if self.via == "mixture":
            assert M is not None
            wmask = wmask & M.any(-1)
        single = q.dim() == 2
        q3 = q[:, None, :] if single else q
        wout = self.word_attn(q3, words, mask=wmask[:, None, :], need_weights=True)
        c_w, a_w = wout.context, wout.weights  # [B, n_q, d_vw], [B, n_q, n_w]
        q_cat = torch.cat([q3, c_w.to(q3.dtype)], dim=-1)
        cmask = _ones_if_none(char_mask, B, n_c, chars.device)
        c_c, a_c = self._char_step(q_cat, chars, cmask, M, a_w)
        context = torch.cat([c_w, c_c], dim=-1)
        extras: dict[str, Any] = {"word_context": c_w, "char_context": c_c}
        if wout.log_prob is not None:
            extras["word_log_prob"] = wout.log_prob.squeeze(1) if single else wout.log_prob
        if single:
            context, a_w, a_c = context.squeeze(1), a_w.squeeze(1), a_c.squeeze(1)
            extras = {k: (v.squeeze(1) if k.endswith("context") else v) for k, v in extras.items()}
        if need_weights:
            extras["word_weights"] = a_w
            extras["char_weights"] = a_c
        return AttentionOutput(context, a_c if need_weights else None, extras=extras)

    def _mapping(
        self,
        B: int,
        n_c: int,
        n_w: int | None,
        words: Tensor | None,
        word_offsets: Tensor | None,
        char_to_word: Tensor | None,
        word_mask: Tensor | None,
        char_mask: Tensor | None,
    ) -> Tensor | None:
        """The character -> word map ``M`` ``[B, n_w, n_c]`` (``None`` when not given and
        not needed: ``via="query"`` with word features)."""
        if word_offsets is not None or char_to_word is not None:
            return char_word_map(
                n_chars=n_c,
                word_offsets=word_offsets,
                char_to_word=char_to_word,
                word_mask=word_mask,
                char_mask=char_mask,
                batch=B,
                n_words=n_w,
            )
        if self.via == "mixture" or words is None:
            raise ValueError(
                "the character -> word mapping is missing: give word_offsets [B, n_w] or "
                "char_to_word [B, n_w, n_c]"
                + (
                    " (via='mixture' needs it)"
                    if words is not None
                    else " (words is None, so word features are built from it)"
                )
            )
        return None

    def _char_step(
        self, q_cat: Tensor, chars: Tensor, cmask: Tensor, M: Tensor | None, a_w: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The character context ``[B, n_q, d_vc]`` and weights ``[B, n_q, n_c]`` with the
        query ``[q_c; c_w]``: plain attention (``via="query"``) or the word weights spread
        over each word's characters (``via="mixture"``)."""
        if self.via == "query":
            cout = self.char_attn(q_cat, chars, mask=cmask[:, None, :], need_weights=True)
            return cout.context, cout.weights
        assert M is not None
        B, n_c = cmask.shape
        n_q, n_w = a_w.shape[1], M.shape[1]
        ca = self.char_attn
        keys = ca.key_proj(chars) if ca.key_proj is not None else chars
        values = ca.value_proj(chars) if ca.value_proj is not None else chars
        e = ca.score(q_cat, keys)
        e = e.expand(B, n_q, n_c) if e.shape[1] != n_q else e
        if self._segment:
            a_c = _segment_mixture(e, M, a_w)
        else:
            within = ca.align.normalize(
                e[:, :, None, :].expand(B, n_q, n_w, n_c), M[:, None, :, :], dim=-1
            )
            a_c = (within * a_w[..., None]).sum(2)
        a_c = a_c.to(values.dtype)  # float32 scores for half inputs: the values' dtype
        p = ca.dropout if ca.training else 0.0
        return combine_single(F.dropout(a_c, p, True) if p > 0 else a_c, values), a_c


def _ones_if_none(mask: Tensor | None, B: int, n: int, device: torch.device) -> Tensor:
    return mask if mask is not None else torch.ones(B, n, dtype=torch.bool, device=device)


def _segment_mixture(e: Tensor, M: Tensor, a_w: Tensor) -> Tensor:
    """``a_l = a_w[w(l)] exp(e_l) / sum_{l' in w(l)} exp(e_l')`` for the characters ``l``
    of some word, 0 for the others, in O(B n_q (n_w + n_c)) (segment softmax).

    ``e`` ``[B, n_q, n_c]``, ``M`` ``[B, n_w, n_c]`` (each character in at most one word),
    ``a_w`` ``[B, n_q, n_w]``. No words (``n_w = 0``) gives zero weights."""
    B, n_q, n_c = e.shape
    n_w = M.shape[1]
    owned = M.any(1)  # [B, n_c]
    # the word of each character, n_w (a slot of weight 0) for a character of no word:
    # the argmax over M with that slot appended, which is never empty (n_w = 0 allowed)
    idx = torch.cat([M, ~owned[:, None, :]], dim=1).to(torch.uint8).argmax(1)
    idx3 = idx[:, None, :].expand(B, n_q, n_c)
    allowed = owned[:, None, :].expand(B, n_q, n_c)
    low = torch.finfo(e.dtype).min
    ed = e.detach().masked_fill(~allowed, low)
    mx = torch.full((B, n_q, n_w + 1), low, dtype=e.dtype, device=e.device)
    mx = mx.scatter_reduce(2, idx3, ed, reduce="amax", include_self=True)
    shifted = torch.where(allowed, e - mx.gather(2, idx3), torch.zeros_like(e))
    z = torch.where(allowed, shifted.exp(), torch.zeros_like(e))
    Z = torch.zeros(B, n_q, n_w + 1, dtype=e.dtype, device=e.device).scatter_add(2, idx3, z)
    denom = Z.gather(2, idx3)
    within = z / torch.where(allowed, denom, torch.ones_like(denom))
    a_ext = torch.cat([a_w.to(e.dtype), a_w.new_zeros(B, n_q, 1).to(e.dtype)], dim=2)
    return within * a_ext.gather(2, idx3)
