"""Alignment functions: ``a = align(e)`` (survey section 3.2.2).

An alignment turns the scores ``e`` ``[B, n_q, n_k]`` into weights of the same shape.
Every alignment honours the library's mask convention (bool, True = may attend,
broadcastable to ``[B, n_q, n_k]``): masked keys get weight 0, and a query with no
allowed key gets all-zero weights -- never NaN, in the forward or the backward pass.

| name | definition | source |
| --- | --- | --- |
| soft | ``a_l = exp(e_l) / sum_j exp(e_j)`` | Bahdanau et al. 2015 |
| hard | ``m ~ Multinomial(softmax(e))``, ``a = onehot(m)``; REINFORCE or straight-through Gumbel-softmax | Xu et al. 2015 |
| local-m | softmax inside ``[p - D, p + D]``, ``p`` = the output position | Luong et al. 2015 |
| local-p | ``p = S sigmoid(w_p^T tanh(W_p q))``; softmax in the window times ``exp(-(l-p)^2 / (2 sigma^2))``, ``sigma = D/2`` | Luong et al. 2015 |
| reinforced | a policy selects a subset of keys (Bernoulli, REINFORCE); soft attention over it | Shen et al. 2018 (ReSAN) |
| sparsemax | Euclidean projection onto the simplex | Martins & Astudillo 2016 |
| entmax15 | 1.5-entmax | Peters et al. 2019 |
| structured | marginals ``p(z_l = 1)`` of a linear-chain CRF over the keys (in :mod:`attnlab.general.structured`) | Kim et al. 2017 |

Modules return an :class:`Aligned` (weights, plus ``log_prob`` for stochastic alignments
and mechanism-specific ``extras``); the functions return the weights tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    broadcasts_to,
    check_choice,
    check_flags,
    check_int,
    check_number,
    check_optional_int,
    check_positive,
    check_tensor,
    found_on_host,
    softmax_dtype,
)
from attnlab.general.padding import clear_nonfinite_rows, masked_mean
from attnlab.general.scoring import apply_layer
from attnlab.general.sparse import entmax15, sparsemax
from attnlab.masks import check_score_mask, fill_value, index_mask
from attnlab.registry import Configurable, register

__all__ = [
    "Aligned",
    "Alignment",
    "Entmax15Align",
    "HardAlign",
    "LocalMAlign",
    "LocalPAlign",
    "ReinforcedAlign",
    "SoftAlign",
    "SparsemaxAlign",
    "gumbel_softmax_align",
    "hard_align",
    "local_align",
    "local_window",
    "masked_softmax",
    "reinforce_loss",
    "soft_align",
]


# ----------------------------------------------------------------------------- functional


def masked_softmax(e: Tensor, mask: Tensor | None = None, dim: int = -1) -> Tensor:
    """Softmax of ``e`` over ``dim`` restricted to the positions where ``mask`` is True.

    Masked positions get exactly 0; a slice with no allowed position gets all zeros
    (forward) and zero gradients (backward). ``mask`` must broadcast to ``e``.
    Half-precision inputs are normalised in float32 and cast back. Shapes: ``e`` any shape
    (``[B, n_q, n_k]`` in attention) -> weights of the same shape. Cost: O(numel(e)).
    """
    x = e.to(softmax_dtype(e.dtype))
    if mask is None:
        return torch.softmax(x, dim).to(e.dtype)
    x = x.masked_fill(~mask, fill_value(x.dtype))
    return (torch.softmax(x, dim) * mask).to(e.dtype)


def _check_scores(e: Tensor, mask: Tensor | None) -> None:
    check_tensor(e, "e")
    if e.dim() < 1:
        raise ValueError(f"e has shape {tuple(e.shape)}, expected [B, n_q, n_k] or [B, n_k]")
    check_score_mask(mask, e)


def soft_align(e: Tensor, mask: Tensor | None = None) -> Tensor:
    """Soft (global) alignment ``a_l = exp(e_l) / sum_{j allowed} exp(e_j)`` over the last
    axis (Bahdanau et al. 2015). Shapes: ``e`` ``[B, n_q, n_k]`` (any ``[..., n_k]``),
    ``mask`` bool broadcastable to it -> weights of the shape of ``e``. Cost O(B n_q n_k)."""
    _check_scores(e, mask)
    return masked_softmax(e, mask)


def local_window(center: Tensor, D: int, n_k: int) -> tuple[Tensor, Tensor]:
    """Distances ``l - p`` ``[..., n_k]`` and the window ``|l - p| <= D`` for window centres
    ``center`` ``[...]``. ``D`` must be an int >= 1 and ``n_k`` an int >= 0, else
    ``ValueError``."""
    _check_window(D)
    check_int(n_k, "n_k", minimum=0, error=ValueError)
    positions = torch.arange(n_k, device=center.device, dtype=center.dtype)
    dist = positions - center.unsqueeze(-1)
    return dist, dist.abs() <= D


def _check_window(D: int) -> None:
    if isinstance(D, bool) or not isinstance(D, int) or D < 1:
        raise ValueError(f"D (the half window width) must be an int >= 1, got {D!r}")


def local_align(
    e: Tensor,
    center: Tensor,
    D: int,
    mask: Tensor | None = None,
    gaussian: bool = True,
) -> Tensor:
    """Local alignment (Luong et al. 2015) over the full score matrix.

    The window of query ``i`` is the key positions ``l`` with ``|l - p_i| <= D`` that exist
    and are allowed by ``mask``; the softmax runs over the window only, and with
    ``gaussian=True`` each weight is then multiplied by ``exp(-(l - p_i)^2 / (2 sigma^2))``,
    ``sigma = D / 2``, without renormalising.

    Args:
        e: scores ``[B, n_q, n_k]`` (or ``[B, n_k]`` for a single query).
        center: window centres ``p`` ``[B, n_q]`` (``[B]`` for a single query), float.
            local-m passes the output positions, local-p the predicted ones.
        D: half window width (int >= 1).
        mask: bool, broadcastable to ``e``.

    Cost O(B n_q n_k) here; :class:`attnlab.Attention` computes only the window,
    O(B n_q D). Gradients reach ``center`` through the Gaussian factor. Half-precision
    scores: the window, the softmax and the Gaussian are computed in float32 (the centre is
    never rounded to the half type) and the weights are cast back.
    """
    _check_scores(e, mask)
    _check_window(D)
    check_flags(gaussian=gaussian)
    check_tensor(center, "center")
    if center.shape != e.shape[:-1]:
        raise ValueError(
            f"center has shape {tuple(center.shape)}, expected the scores' leading shape "
            f"{tuple(e.shape[:-1])} ([B, n_q])"
        )
    # half-precision scores: the positions, the softmax and the Gaussian run in float32
    # (a bf16 centre would be rounded to a multiple of 0.5 beyond position 128)
    work = softmax_dtype(e.dtype)
    dist, window = local_window(center.to(work), D, e.shape[-1])
    allowed = window if mask is None else window & mask
    a = masked_softmax(e.to(work), allowed)
    if gaussian:
        sigma = D / 2
        a = a * torch.exp(-(dist**2) / (2 * sigma**2))
    return a.to(e.dtype)


def _row_has_keys(probs: Tensor) -> Tensor:
    return probs.sum(-1) > 0


def hard_align(
    e: Tensor,
    mask: Tensor | None = None,
    *,
    sample: bool = True,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Hard alignment (Xu et al. 2015): ``m ~ Multinomial(softmax(e))`` (or ``argmax`` with
    ``sample=False``); the weights are ``onehot(m)`` so the context is ``v_m``.

    Returns ``(weights, log_prob, probs)``: the one-hot weights (shape of ``e``), the
    log-probability of the choice ``[...]`` (``e.shape[:-1]``) for a REINFORCE loss, and
    the soft probabilities. A row with no allowed key gets zero weights and log_prob 0.
    The weights carry no gradient; train the scores with :func:`reinforce_loss` or use
    :func:`gumbel_softmax_align`. Cost O(B n_q n_k).
    """
    _check_scores(e, mask)
    check_flags(sample=sample)
    probs = masked_softmax(e, mask)
    n_k = e.shape[-1]
    if n_k == 0:
        z = e.new_zeros(e.shape[:-1])
        return e.new_zeros(e.shape), z, probs
    flat = probs.detach().reshape(-1, n_k).float()
    has = _row_has_keys(flat)
    if sample:
        safe = torch.where(has[:, None], flat, torch.ones_like(flat))
        idx = torch.multinomial(safe, 1, generator=generator)
    else:
        # the argmax of the (masked) scores themselves: the float32 probabilities could
        # tie two float64 scores that differ in their last digits
        x = e.detach()
        if mask is not None:
            x = x.masked_fill(~mask, -math.inf)
        idx = x.reshape(-1, n_k).argmax(-1, keepdim=True)
    weights = (index_mask(idx.squeeze(-1), n_k) & has[:, None]).to(e.dtype)
    logp_all = _masked_log_softmax(e, mask).reshape(-1, n_k)
    log_prob = torch.where(
        has, logp_all.gather(-1, idx).squeeze(-1), torch.zeros_like(has, dtype=logp_all.dtype)
    )
    return weights.reshape(e.shape), log_prob.reshape(e.shape[:-1]).to(e.dtype), probs


def _masked_log_softmax(e: Tensor, mask: Tensor | None) -> Tensor:
    """``log_softmax`` over the allowed keys (in float32 for half inputs); the masked
    entries hold finite junk that callers must not use."""
    x = e.to(softmax_dtype(e.dtype))
    if mask is not None:
        x = x.masked_fill(~mask, fill_value(x.dtype))
    return torch.log_softmax(x, -1)


def gumbel_softmax_align(
    e: Tensor,
    mask: Tensor | None = None,
    tau: float = 1.0,
    hard: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Gumbel-softmax relaxation of hard attention (Jang et al. 2017; Maddison et al. 2017).

    ``y = softmax((e + g) / tau)`` with Gumbel noise ``g``; with ``hard=True`` the forward
    value is ``onehot(argmax y)`` and the gradient is that of ``y`` (straight-through).
    Shapes: ``e`` ``[B, n_q, n_k]`` (any ``[..., n_k]``), ``mask`` bool broadcastable to
    it -> weights of the shape of ``e``. Cost O(B n_q n_k).
    """
    _check_scores(e, mask)
    check_positive(tau, "tau", error=ValueError)
    check_flags(hard=hard)
    u = torch.rand(e.shape, generator=generator, device=e.device, dtype=softmax_dtype(e.dtype))
    g = -torch.log(-torch.log(u.clamp(1e-10, 1 - 1e-7)))
    y = masked_softmax((e.to(g.dtype) + g) / tau, mask)
    if not hard:
        return y.to(e.dtype)
    if e.shape[-1] == 0:
        return y.to(e.dtype)
    has = _row_has_keys(y.detach())
    y_hard = (index_mask(y.detach().argmax(-1), e.shape[-1]) & has[..., None]).to(y.dtype)
    # straight-through: the forward value is exactly y_hard ((y - y.detach()) is exactly 0),
    # the gradient is that of y
    return (y_hard + (y - y.detach())).to(e.dtype)


def reinforce_loss(
    log_prob: Tensor, reward: Tensor, baseline: Tensor | float | None = None
) -> Tensor:
    """Score-function (REINFORCE) surrogate loss ``-mean((reward - baseline) * log_prob)``.

    ``reward`` and ``baseline`` are detached; the baseline (e.g. a running mean of the
    reward) reduces the variance. ``reward`` (and a tensor ``baseline``) must broadcast to
    ``log_prob`` without enlarging it; a per-example ``[B]`` tensor is lined up with
    ``log_prob`` ``[B, n_q]`` along the batch axis (as ``[B, 1]``), never along the queries
    (a tensor of lower rank than ``log_prob`` goes along its leading axes, each size 1 or
    that axis's: a ``[n_q]`` reward against ``[B, n_q]`` is refused, whatever ``B``).
    Anything else raises ``ValueError``, naming both shapes. Minimising the loss raises the
    probability of choices with above-baseline reward (Williams 1992). A number
    ``baseline`` must be a finite real number (``TypeError`` / ``ValueError`` otherwise: a
    NaN would make the loss NaN). Cost O(numel(log_prob)).
    """
    if not isinstance(log_prob, Tensor):
        raise TypeError(
            f"log_prob must be a torch.Tensor, got {type(log_prob).__name__} (a deterministic "
            "alignment has no log_prob)"
        )
    advantage = _per_choice(reward, log_prob, "reward").detach()
    if baseline is not None:
        if isinstance(baseline, Tensor):
            advantage = advantage - _per_choice(baseline, log_prob, "baseline").detach()
        else:
            advantage = advantage - check_number(baseline, "baseline", error=ValueError)
    return -(advantage * log_prob).mean()


def _per_choice(x: Tensor, log_prob: Tensor, name: str) -> Tensor:
    """``x`` lined up with ``log_prob``: a tensor of lower rank (a per-example ``[B]``
    against ``log_prob`` ``[B, n_q]``) is lined up with the leading (batch) axes and gets
    trailing axes (``[B, 1]``) instead of PyTorch's right-aligned broadcasting, which would
    silently pair examples with queries (``[n_q]`` against ``[B, n_q]``). Each of its sizes
    must then be 1 or that of ``log_prob``'s axis; a tensor of ``log_prob``'s rank must
    broadcast to it. Pure Python on the shapes: no host synchronisation."""
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x, dtype=log_prob.dtype, device=log_prob.device)
    shape, target = tuple(x.shape), tuple(log_prob.shape)
    if 0 < len(shape) < len(target):
        if not broadcasts_to(shape, target[: len(shape)]):
            raise ValueError(
                f"{name} has shape {shape}, which does not line up with the leading (batch) "
                f"axes of log_prob {target}: a {name} of lower rank goes along the examples, "
                f"never the queries (use [B] = [{target[0]}] for a per-example {name}, or "
                f"the shape of log_prob)"
            )
        return x.reshape(*shape, *([1] * (len(target) - len(shape))))
    if not broadcasts_to(shape, target):
        raise ValueError(
            f"{name} has shape {shape}, which does not broadcast to log_prob "
            f"{target} (use [B] or [B, 1] for a per-example {name})"
        )
    return x


# ----------------------------------------------------------------------------- modules


@dataclass
class Aligned:
    """What an alignment module returns: the weights (shape of the scores), the
    log-probability of a stochastic choice (or ``None``) and extras."""

    weights: Tensor
    log_prob: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class Alignment(Configurable):
    """Base class of alignment modules.

    ``forward(e, mask=None, *, query=None, keys=None, positions=None) -> Aligned``.
    ``query`` (``[B, n_q, d_q]``) is used by local-p, ``keys`` by reinforced attention,
    ``positions`` by local-m (``reads_positions``: :class:`attnlab.Attention` refuses
    ``positions`` for an alignment that would ignore them); the others ignore them.
    ``stochastic`` alignments expose a
    ``log_prob``, and ``needs_reinforce`` says whether their scores learn only through a
    REINFORCE term on it (hard attention with ``estimator="reinforce"``, reinforced
    selection) rather than through the sample itself (the straight-through Gumbel-softmax);
    ``local`` ones expose ``centers()`` and ``D`` so the general module can
    compute only the window. ``function`` is the functional twin (exported as
    ``attnlab.functional.<its __name__>``), or ``None`` for an alignment without one.
    """

    stochastic: bool = False
    needs_reinforce: bool = False
    local: bool = False
    reads_positions: bool = False
    supports_multi: bool = False
    function: ClassVar[Callable[..., Any] | None] = None

    def normalize(self, e: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
        """Deterministic normalisation along ``dim`` (used per feature by
        multi-dimensional attention). Only defined where ``supports_multi``."""
        raise NotImplementedError(f"{type(self).__name__} has no per-feature form")


class _Normalizing(Alignment):
    """A deterministic alignment that normalises the scores over the keys with
    ``_normalize(e, mask, dim)``; it also applies per feature (multi-dimensional
    attention)."""

    supports_multi = True
    _normalize: ClassVar[Callable[[Tensor, Tensor | None, int], Tensor]]

    def __init__(self) -> None:
        super().__init__()

    def normalize(self, e: Tensor, mask: Tensor | None, dim: int = -1) -> Tensor:
        return self._normalize(e, mask, dim)

    def forward(self, e: Tensor, mask: Tensor | None = None, **context: Any) -> Aligned:
        _check_scores(e, mask)
        return Aligned(self._normalize(e, mask, -1))


@register("align", "soft", aliases=("global", "softmax"))
class SoftAlign(_Normalizing):
    """Soft / global alignment: the masked softmax over the keys (Bahdanau et al. 2015).
    Shapes: ``e`` ``[B, n_q, n_k]`` -> weights ``[B, n_q, n_k]``. Cost O(B n_q n_k).

    :formula: a_l = exp(e_l) / sum_j exp(e_j)
    :source: Bahdanau et al. 2015, Neural Machine Translation by Jointly Learning to Align and
        Translate
    :cost: O(B n_q n_k)
    """

    function = staticmethod(soft_align)
    _normalize = staticmethod(masked_softmax)


@register("align", "sparsemax")
class SparsemaxAlign(_Normalizing):
    """Sparsemax alignment: weights with exact zeros (Martins & Astudillo 2016).
    Shapes as soft alignment. Cost O(B n_q n_k log n_k) (a sort per row).

    :formula: a = argmin_{p in simplex} |p - e|^2 = max(e - tau, 0)
    :source: Martins & Astudillo 2016, From Softmax to Sparsemax
    :cost: O(B n_q n_k log n_k)
    """

    function = staticmethod(sparsemax)
    _normalize = staticmethod(sparsemax)


@register("align", "entmax15", aliases=("entmax-1.5", "entmax"))
class Entmax15Align(_Normalizing):
    """1.5-entmax alignment (Peters et al. 2019): sparse, smoother than sparsemax.
    Shapes as soft alignment. Cost O(B n_q n_k log n_k).

    :formula: a_l = max(e_l / 2 - tau, 0)^2, sum_l a_l = 1
    :source: Peters, Niculae & Martins 2019, Sparse Sequence-to-Sequence Models
    :cost: O(B n_q n_k log n_k)
    """

    function = staticmethod(entmax15)
    _normalize = staticmethod(entmax15)


@register("align", "hard", aliases=("stochastic",))
class HardAlign(Alignment):
    """Hard (stochastic) alignment (Xu et al. 2015).

    Training: samples ``m ~ Multinomial(softmax(e))`` and returns one-hot weights. With
    ``estimator="reinforce"`` the weights carry no gradient and ``Aligned.log_prob``
    (``[B, n_q]``) feeds :func:`reinforce_loss`; with ``estimator="gumbel"`` the weights are
    a straight-through Gumbel-softmax sample (temperature ``tau``) and gradients flow into
    the scores directly (``log_prob`` is still given).
    Evaluation: ``eval_mode="argmax"`` (deterministic) or ``"sample"``.
    ``extras["probs"]`` holds the soft probabilities.

    :formula: m ~ Multinomial(softmax(e)); a = onehot(m); c = v_m
    :source: Xu et al. 2015, Show, Attend and Tell
    :cost: O(B n_q n_k)
    """

    stochastic = True
    function = staticmethod(hard_align)

    def __init__(
        self, estimator: str = "reinforce", eval_mode: str = "argmax", tau: float = 1.0
    ) -> None:
        super().__init__()
        self.estimator = check_choice(estimator, "estimator", ("reinforce", "gumbel"))
        self.eval_mode = check_choice(eval_mode, "eval_mode", ("argmax", "sample"))
        self.tau = check_positive(tau, "tau")

    @property
    def needs_reinforce(self) -> bool:  # type: ignore[override]
        """REINFORCE trains the scores, unless the Gumbel sample carries their gradient."""
        return self.estimator == "reinforce"

    def forward(self, e: Tensor, mask: Tensor | None = None, **context: Any) -> Aligned:
        sample = self.training or self.eval_mode == "sample"
        if self.training and self.estimator == "gumbel":
            weights = gumbel_softmax_align(e, mask, self.tau, hard=True)
            probs = masked_softmax(e, mask)
            if e.shape[-1] == 0:
                log_prob = e.new_zeros(e.shape[:-1])
            else:
                idx = weights.detach().argmax(-1, keepdim=True)
                chosen = _masked_log_softmax(e, mask).gather(-1, idx).squeeze(-1)
                has = weights.detach().sum(-1) > 0
                log_prob = torch.where(has, chosen, torch.zeros_like(chosen)).to(e.dtype)
            return Aligned(weights, log_prob, {"probs": probs})
        weights, log_prob, probs = hard_align(e, mask, sample=sample)
        return Aligned(weights, log_prob, {"probs": probs})


def _positions_for(positions: Tensor | None, batch: int, n_q: int, like: Tensor) -> Tensor:
    # float32 for half inputs: bf16 holds the integers exactly only up to 256
    work = softmax_dtype(like.dtype)
    if positions is None:
        return torch.arange(n_q, device=like.device, dtype=work).expand(batch, n_q)
    positions = positions.to(device=like.device, dtype=work)
    if positions.dim() == 1:
        positions = positions.expand(batch, -1)
    if positions.shape != (batch, n_q) and positions.shape != (1, n_q):
        raise ValueError(
            f"positions has shape {tuple(positions.shape)}, expected [B, n_q] = [{batch}, {n_q}]"
            " or [n_q]"
        )
    if found_on_host(~torch.isfinite(positions)):  # a window centred on NaN is no window
        raise ValueError("positions holds NaN or inf: the window centres must be finite")
    return positions.expand(batch, n_q)


class _LocalAlign(Alignment):
    local = True
    function = staticmethod(local_align)

    def __init__(self, D: int, gaussian: bool) -> None:
        super().__init__()
        try:
            _check_window(D)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        check_flags(gaussian=gaussian)
        self.D = D
        self.gaussian = gaussian

    def centers(self, **inputs: Any) -> Tensor:
        """The window centres ``p`` ``[B, n_q]`` (float32 for half-precision keys).

        Called with the keywords ``query`` (``[B, n_q, d_q]`` or ``None``), ``batch``,
        ``n_q``, ``n_k``, ``mask`` (``[B or 1, n_q or 1, n_k]`` or ``None``), ``positions``
        (``positions`` of ``forward``) and ``like`` (the keys); a subclass names those it
        reads and takes the others as ``**_``."""
        raise NotImplementedError

    def forward(
        self,
        e: Tensor,
        mask: Tensor | None = None,
        *,
        query: Tensor | None = None,
        positions: Tensor | None = None,
        **context: Any,
    ) -> Aligned:
        e3 = e if e.dim() == 3 else e.unsqueeze(1)
        if query is not None and query.dim() == 2:
            query = query.unsqueeze(1)
        m3 = mask if (mask is None or e.dim() == 3) else mask.unsqueeze(-2)
        p = self.centers(
            query=query,
            batch=e3.shape[0],
            n_q=e3.shape[1],
            n_k=e3.shape[2],
            mask=m3,
            positions=positions,
            like=e3,
        )
        a = local_align(e3, p, self.D, m3, self.gaussian)
        if e.dim() == 2:
            a, p = a.squeeze(1), p.squeeze(1)
        return Aligned(a, None, {"centers": p})


@register("align", "local-m", aliases=("local-monotonic",))
class LocalMAlign(_LocalAlign):
    """Local-m (monotonic) alignment (Luong et al. 2015): the window of output ``i`` is
    centred on ``p_i = i`` (or on ``positions`` passed to ``forward``), ``[p - D, p + D]``;
    the softmax runs inside the window. ``gaussian=False`` by default (Luong's local-m);
    ``gaussian=True`` adds the local-p Gaussian factor. The default ``D = 8`` is
    attnlab's; Luong et al. use ``D = 10`` in their experiments (pass ``D=10`` for theirs).
    Shapes: ``e`` ``[B, n_q, n_k]`` -> ``[B, n_q, n_k]``. Cost O(B n_q D) inside
    :class:`attnlab.Attention` (only the window is scored).

    :formula: p = output position; a = softmax over l in [p-D, p+D]
    :source: Luong et al. 2015, Effective Approaches to Attention-based NMT
    :cost: O(B n_q D) in Attention (window only)
    """

    reads_positions = True

    def __init__(self, D: int = 8, gaussian: bool = False) -> None:
        super().__init__(D, gaussian)

    def centers(
        self, *, batch: int, n_q: int, positions: Tensor | None, like: Tensor, **_: Any
    ) -> Tensor:
        return _positions_for(positions, batch, n_q, like)


def refuse_local_m(align: Alignment, why: str, centre_from: str, *, who: str = "") -> None:
    """Raise a one-line :class:`ConfigError` when ``align`` is local-m in a module whose
    queries are no positions of the key sequence (a decoder that passes no step, a learned
    query, a state): local-m centres query ``i``'s window on key ``i``, which there sits on
    the first keys whatever the query. ``why`` completes "but ..." (the reason), and
    ``centre_from`` names what local-p, the suggested alternative, predicts the centre
    from; ``who`` prefixes the message (``"capsule attention: "``)."""
    if isinstance(align, LocalMAlign):
        raise ConfigError(
            f"{who}align='local-m' centres query i's window on key i (p_i = i), but {why}; "
            f"use align='local-p', which predicts the centre from {centre_from}"
        )


@register("align", "local-p", aliases=("local-predictive",))
class LocalPAlign(_LocalAlign):
    """Local-p (predictive) alignment (Luong et al. 2015).

    The centre is predicted from the query: ``p = s0 + S * sigmoid(w_p^T tanh(W_p q))``
    with ``W_p`` ``[d_p, d_q]``, ``w_p`` ``[d_p]``, and ``[s0, s0 + S]`` the span from the
    first to the last allowed key position of the query's row of the mask (``s0 = 0``,
    ``S = n_k - 1`` without a mask; ``s0 = 0``, ``S = length - 1`` with trailing padding;
    with left padding the span starts at the first real key). Luong et al. write ``S`` for
    the source length, so that ``p`` lies in ``[0, S]``; with attnlab's 0-based positions
    the last key is ``n - 1``, and ``S = n - 1`` keeps the centre on the existing positions
    ``[0, n - 1]`` (a deliberate, documented change).
    The softmax runs over the window ``|l - p| <= D`` and each weight is multiplied by
    ``exp(-(l - p)^2 / (2 sigma^2))``, ``sigma = D / 2``, so gradients reach ``W_p, w_p``.
    Shapes: ``e`` ``[B, n_q, n_k]``, query ``[B, n_q, d_q]``. Cost O(B n_q (d_q d_p + D))
    inside :class:`attnlab.Attention`.

    :formula: p = s0 + S sigmoid(w_p^T tanh(W_p q)); a = softmax_window(e) * exp(-(l-p)^2 /
        (2 sigma^2)), sigma = D/2
    :source: Luong et al. 2015, Effective Approaches to Attention-based NMT
    :cost: O(B n_q (d_q d_p + D))
    """

    def __init__(
        self, d_q: int | None = None, D: int = 8, d_p: int | None = None, gaussian: bool = True
    ) -> None:
        super().__init__(D, gaussian)
        if d_q is None:
            raise ConfigError("LocalPAlign needs d_q (the query size) to predict window positions")
        check_int(d_q, "d_q", owner="LocalPAlign", wording="a positive int")
        d_p = check_optional_int(d_p, "d_p", owner="LocalPAlign", wording="a positive int") or d_q
        self.W_p = nn.Linear(d_q, d_p, bias=False)
        self.w_p = nn.Parameter(torch.empty(d_p).uniform_(-1 / math.sqrt(d_p), 1 / math.sqrt(d_p)))

    def centers(
        self,
        *,
        query: Tensor | None,
        batch: int,
        n_q: int,
        n_k: int,
        mask: Tensor | None,
        like: Tensor,
        **_: Any,
    ) -> Tensor:
        if query is None:
            raise ValueError("local-p alignment needs the query to predict its window centre")
        if query.shape[:2] != (batch, n_q):
            raise ValueError(
                f"query has shape {tuple(query.shape)}, expected [B, n_q, d_q] = [{batch}, {n_q}, d_q]"
            )
        # the centre in float32 for half inputs (issue 12: in bf16, S = 299 rounds to 300
        # and S * sigmoid(...) to a multiple of 2, moving the window and the Gaussian)
        work = softmax_dtype(like.dtype)
        proj = torch.tanh(apply_layer(self.W_p, query).to(work))
        p = torch.sigmoid(proj @ self.w_p.to(work))
        if mask is None:  # one S for every row: a number, not a [B, n_q] tensor
            return p * float(max(n_k - 1, 0))
        first, last = _allowed_span(torch.broadcast_to(mask, (batch, n_q, n_k)))
        return first.to(work) + (last - first).to(work) * p


def _allowed_span(mask: Tensor) -> tuple[Tensor, Tensor]:
    """The first and the last allowed key position of each row of ``mask`` ``[..., n_k]``
    (both 0 for a row that allows nothing, or when ``n_k == 0``), without a host
    synchronisation."""
    n_k = mask.shape[-1]
    if n_k == 0:
        zero = mask.new_zeros(mask.shape[:-1], dtype=torch.long)
        return zero, zero
    pos = torch.arange(n_k, device=mask.device)
    last = torch.where(mask, pos, -1).amax(-1).clamp(min=0)
    first = torch.minimum(torch.where(mask, pos, n_k).amin(-1), last)
    return first, last


@register("align", "reinforced", aliases=("resan", "reinforced-selection"))
class ReinforcedAlign(Alignment):
    """Reinforced alignment, ReSAN-style (Shen et al. 2018, reinforced sequence sampling).

    A policy network gives each key a keep probability
    ``pi_l = sigmoid(w^T tanh(W [k_l; kbar; k_l * kbar] + b) + b0)`` (``kbar`` the mean
    allowed key); training samples ``z_l ~ Bernoulli(pi_l)``, evaluation keeps
    ``pi_l > 0.5`` (``eval_mode="threshold"``) or samples (``"sample"``). Soft attention
    then runs over the selected keys only. ``Aligned.log_prob`` (``[B]``) is
    ``sum_l log P(z_l)`` over the allowed keys, for :func:`reinforce_loss`;
    ``extras["selection"]`` (``[B, n_k]`` bool), ``extras["keep_prob"]`` and
    ``extras["selection_ratio"]`` (for a sparsity penalty) are exposed. A query whose
    selected set is empty gets zero weights. A padded key (no query may attend it) is
    never selected and left out of ``kbar`` and ``log_prob``; NaN or inf there is ignored.
    Half-precision keys: the policy and the softmax run in float32 (``keep_prob`` and
    ``log_prob`` are float32).
    Parameters: ``W`` ``[d_h, 3 d_k]``, ``w`` ``[d_h]``. Cost O(B n_k d_k d_h + B n_q n_k).

    :formula: z_l ~ Bernoulli(pi_l), pi_l = sigmoid(policy(k_l, mean k)); a = softmax over {l:
        z_l = 1}
    :source: Shen et al. 2018, Reinforced Self-Attention Network (ReSAN)
    :cost: O(B n_k d_k d_h + B n_q n_k)
    """

    stochastic = True
    needs_reinforce = True

    def __init__(
        self,
        d_k: int | None = None,
        d_h: int | None = None,
        eval_mode: str = "threshold",
        init_keep: float = 0.9,
    ) -> None:
        super().__init__()
        if d_k is None:
            raise ConfigError("ReinforcedAlign needs d_k (the key size) for its policy network")
        owner = "ReinforcedAlign"
        check_int(d_k, "d_k", owner=owner, wording="a positive int")
        d_h = check_optional_int(d_h, "d_h", owner=owner, wording="a positive int") or d_k
        check_choice(eval_mode, "eval_mode", ("threshold", "sample"))
        init_keep = check_number(
            init_keep, "init_keep", low=0, high=1, open_low=True, open_high=True
        )
        self.eval_mode = eval_mode
        self.policy = nn.Sequential(nn.Linear(3 * d_k, d_h), nn.Tanh(), nn.Linear(d_h, 1))
        nn.init.constant_(self.policy[2].bias, math.log(init_keep / (1 - init_keep)))

    def forward(
        self, e: Tensor, mask: Tensor | None = None, *, keys: Tensor | None = None, **context: Any
    ) -> Aligned:
        if keys is None:
            raise ValueError("reinforced alignment needs the keys for its selection policy")
        _check_scores(e, mask)
        e3 = e if e.dim() == 3 else e.unsqueeze(1)
        m3 = mask if (mask is None or e.dim() == 3) else mask.unsqueeze(-2)
        batch, n_q, n_k = e3.shape
        if keys.shape[:2] != (batch, n_k):
            raise ValueError(
                f"keys has shape {tuple(keys.shape)}, expected [B, n_k, d_k] = [{batch}, {n_k}, d_k]"
            )
        key_ok = (
            torch.ones(batch, n_k, dtype=torch.bool, device=e.device)
            if m3 is None
            else torch.broadcast_to(m3, (batch, n_q, n_k)).any(1)
        )
        # a padded key may hold anything: its NaN / inf entries are cleared (where, not a
        # product: 0 * NaN = NaN) before the policy sees it, and it is left out of the mean
        # the policy runs in float32 for half-precision keys (k_l * kbar of large keys
        # overflows float16), with its parameters cast, so that gradients still reach them
        work = softmax_dtype(keys.dtype)
        keys_w = clear_nonfinite_rows(keys, key_ok).to(work)
        kbar = masked_mean(keys_w, key_ok, keepdim=True)
        feats = torch.cat([keys_w, kbar.expand_as(keys_w), keys_w * kbar], -1)
        if work == keys.dtype:
            logits = self.policy(feats).squeeze(-1)
        else:
            params = {n: p.to(work) for n, p in self.policy.named_parameters()}
            logits = torch.func.functional_call(self.policy, params, (feats,)).squeeze(-1)
        keep_prob = torch.sigmoid(logits)
        if self.training or self.eval_mode == "sample":
            selection = torch.bernoulli(keep_prob.detach()).bool()
        else:
            selection = keep_prob.detach() > 0.5
        selection = selection & key_ok
        logp = torch.where(selection, F.logsigmoid(logits), F.logsigmoid(-logits))
        log_prob = torch.where(key_ok, logp, logp.new_zeros(())).sum(-1)
        allowed = selection[:, None, :] if m3 is None else m3 & selection[:, None, :]
        a = masked_softmax(e3, allowed)
        if e.dim() == 2:
            a = a.squeeze(1)
        ratio = selection.sum(-1).to(keys.dtype) / key_ok.sum(-1).clamp(min=1).to(keys.dtype)
        return Aligned(
            a,
            log_prob,
            {"selection": selection, "keep_prob": keep_prob, "selection_ratio": ratio},
        )
