"""Capsule-based attention (Wang et al. 2018, RNN-Capsule; survey section 3.3.2, TAXONOMY
section 3.2) and a dynamic-routing variant (Sabour et al. 2017).

**Capsule attention.** One capsule per class ``c``, each with its own learned query
``q_c`` (and, optionally, its own key / value projections ``W_K^(c)``, ``W_V^(c)``):

    e_cl = score(q_c, k_l)               (q_c^T k_l by default)
    a_c  = align(e_c)                    (softmax over the positions)
    c_c  = sum_l a_cl v_l                (representation module)
    p_c  = sigmoid(w_c^T c_c + b_c)      (probability module)
    r_c  = p_c c_c                       (reconstruction module)

The probabilities are independent sigmoids, so the same module serves single-label
classification (the *active* capsule is the one with the largest ``p_c``) and multi-label
classification (every ``p_c > 0.5``). :func:`capsule_loss` is the joint objective
``L = L_cls + lambda L_rec`` with the reconstruction measured against the mean feature
vector ``f_bar`` (the masked mean of the values).

**Dynamic routing** (:class:`CapsuleRouting`): the input positions are primary capsules
``u_i``; each class capsule ``j`` receives the prediction ``u_(j|i) = W_j u_i``; the
coupling coefficients ``c_ij = softmax_j(b_ij)`` are refined by agreement for ``T``
iterations (``s_j = sum_i c_ij u_(j|i)``, ``v_j = squash(s_j)``, ``b_ij += u_(j|i) . v_j``);
the length ``|v_j|`` is the class probability, trained with :func:`margin_loss`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_int, check_tensor, found_on_host
from attnlab._deprecation import renamed_init_arguments
from attnlab.general.alignment import masked_softmax
from attnlab.general.padding import masked_mean, zero_rows
from attnlab.general.scoring import Score
from attnlab.masks import index_mask
from attnlab.output import output_pytree
from attnlab.query._convention import AttentionCall, SequenceAttention, query_scored_attention
from attnlab.query.self_attention import check_position_mask
from attnlab.registry import register

__all__ = [
    "CapsuleAttention",
    "CapsuleOutput",
    "CapsuleRouting",
    "RoutingOutput",
    "capsule_loss",
    "margin_loss",
    "squash",
]

SQUASH_EPS = 1e-12


# ----------------------------------------------------------------------------- helpers


def _position_mask(mask: Tensor | None, B: int, n: int, device: torch.device) -> Tensor | None:
    """``[B, n]`` (or ``[B, 1, n]``) bool, True = real position -> ``[B, n]``."""
    if mask is None:
        return None
    check_position_mask(mask)
    if mask.dim() == 3 and mask.shape[1] == 1:
        mask = mask[:, 0]
    if mask.dim() != 2 or mask.shape[1] != n or mask.shape[0] not in (1, B):
        raise ValueError(
            f"mask has shape {tuple(mask.shape)}, expected [B, n] = [{B}, {n}] (or [B, 1, n]), "
            "True = real position"
        )
    if mask.device != device:
        raise ValueError(f"mask is on {mask.device} but query is on {device}")
    return mask.expand(B, n)


def _targets(targets: Tensor, B: int, C: int, dtype: torch.dtype) -> Tensor:
    """Class indices ``[B]`` or multi-hot ``[B, C]`` -> float ``[B, C]``."""
    if not isinstance(targets, Tensor):
        raise TypeError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.dim() == 1:
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise TypeError(
                f"targets has shape {tuple(targets.shape)} and dtype {targets.dtype}: class "
                "indices [B] must be integers (multi-label targets are [B, C])"
            )
        if targets.shape[0] != B:
            raise ValueError(f"targets has shape {tuple(targets.shape)}, expected [B] = [{B}]")
        if found_on_host((targets < 0) | (targets >= C)):
            raise ValueError(f"targets holds class indices outside [0, {C})")
        return index_mask(targets, C).to(dtype)
    if targets.dim() == 2:
        if tuple(targets.shape) != (B, C):
            raise ValueError(
                f"targets has shape {tuple(targets.shape)}, expected multi-hot [B, C] = [{B}, {C}]"
            )
        y = targets.to(dtype)
        if ((y != 0) & (y != 1)).any():
            raise ValueError("multi-hot targets [B, C] must hold only 0 and 1")
        return y
    raise ValueError(
        f"targets has shape {tuple(targets.shape)}, expected class indices [B] or multi-hot [B, C]"
    )


def _reduce(per_example: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return per_example
    if reduction == "sum" or per_example.numel() == 0:
        return per_example.sum()
    return per_example.mean()


def _pairwise_hinge(scores: Tensor, y: Tensor, margin: float) -> Tensor:
    """``sum_{i: y_i = 1} sum_{j: y_j = 0} max(0, margin - s_i + s_j)`` per example."""
    diff = margin - scores.unsqueeze(2) + scores.unsqueeze(1)  # [B, i, j]
    pairs = y.unsqueeze(2) * (1 - y).unsqueeze(1)
    return (diff.clamp(min=0) * pairs).sum((1, 2))


# ----------------------------------------------------------------------------- capsule attention


class _ClassProbabilities:
    """``predict`` for an output with the per-class probabilities ``probs`` ``[B, C]``
    (the capsule probabilities ``p_c``, the capsule lengths ``|v_j|``)."""

    probs: Tensor

    def predict(self, multi_label: bool = False, threshold: float = 0.5) -> Tensor:
        """The active class ``argmax_c probs_c`` ``[B]``; with ``multi_label=True`` the
        bool ``[B, C]`` of ``probs_c > threshold``."""
        if multi_label:
            return self.probs > threshold
        return self.probs.argmax(-1)


@output_pytree()
@dataclass
class CapsuleOutput(_ClassProbabilities):
    """Result of :class:`CapsuleAttention` (``C`` classes).

    Attributes:
        probs: ``p_c = sigmoid(w_c^T c_c + b_c)`` ``[B, C]``.
        logits: ``w_c^T c_c + b_c`` ``[B, C]`` (for a numerically stable BCE).
        contexts: the capsule representations ``c_c`` ``[B, C, d_v]``.
        reconstructions: ``r_c = p_c c_c`` ``[B, C, d_v]``.
        mean_features: ``f_bar``, the masked mean of each capsule's values ``[B, C, d_v]``
            (the same row for every capsule unless the capsules project their values).
        weights: ``a_cl`` ``[B, C, n]`` when asked for, else ``None``.
        log_prob: with a stochastic alignment (``hard``, ``reinforced``) the
            log-probability of each capsule's draw ``[B, C]`` (``[B]`` where the capsules
            share one ``reinforced`` selection of positions), for
            :func:`~attnlab.general.alignment.reinforce_loss`: the only signal that trains
            the capsule queries and scores then; else ``None``.
    """

    probs: Tensor
    logits: Tensor
    contexts: Tensor
    reconstructions: Tensor
    mean_features: Tensor
    weights: Tensor | None = None
    log_prob: Tensor | None = None


@register("query", "capsule", aliases=("capsule-attention", "rnn-capsule"))
@renamed_init_arguments({"d_k": "d_features"}, attributes=True)
class CapsuleAttention(SequenceAttention):
    """Capsule-based attention: one capsule (query, attention, probability) per class.

    Args:
        d_features: feature size (formerly ``d_k``, a deprecated keyword for one release).
        num_classes: ``C``, the number of capsules.
        d_q: size of each capsule query (default: the key size).
        score: any score taking a query (default ``dot``, ``e_cl = q_c^T k_l``); each
            capsule owns its score parameters. align: any alignment (default ``soft``) but
            ``local-m``, which needs queries that are positions (``ConfigError``).
        key_dim, value_dim: if given, capsule ``c`` projects its own keys ``W_K^(c) F`` /
            values ``W_V^(c) F`` (default: keys = values = the features, as in the paper).
        dropout: dropout on the weights (training only).
        **options: passed to the score / alignment (``d_w``, ...).

    Call: ``forward(query, key=None, value=None, *, mask=None, need_weights=True)``: the
    features ``F`` ``[B, n, d_features]`` are ``query`` (the capsule queries are
    parameters; ``key`` / ``value`` must be ``None`` or ``F``); ``mask`` bool ``[B, n]``
    (True = real position). ``need_weights`` defaults to ``True`` here (the weights are part
    of the capsule output). Returns :class:`CapsuleOutput` (``probs`` ``[B, C]``, ``contexts`` and
    ``reconstructions`` ``[B, C, d_v]``, ``weights`` ``[B, C, n]``). A sequence with no real
    position has zero contexts, so ``p_c = sigmoid(b_c)``.

    Cost: O(B C n d) for the dot score; when the capsules have no projections and the score
    no parameters, all ``C`` queries run in one batched attention call (fused SDPA for
    dot-product scores), else one call per capsule.

    :formula: e_cl = q_c^T k_l; c_c = sum_l softmax_l(e_c)_l v_l; p_c = sigmoid(w_c^T c_c +
        b_c); r_c = p_c c_c; L = L_cls + lambda L_rec(r, mean f)
    :source: Wang et al. 2018, Sentiment Analysis by Capsules (RNN-Capsule)
    :cost: C attentions: O(B C n d) for dot scores (+ O(B C n d_features d) for per-capsule
        projections)
    """

    self_only = True
    need_weights_default = True

    def __init__(
        self,
        d_features: int,
        num_classes: int,
        *,
        d_q: int | None = None,
        score: str | Score = "dot",
        align: str = "soft",
        key_dim: int | None = None,
        value_dim: int | None = None,
        dropout: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(num_classes, "num_classes")
        if isinstance(score, Score) and num_classes > 1:
            raise ConfigError(
                "score must be a name: every capsule builds its own score module (a Score "
                "instance would be shared by all capsules)"
            )
        key_size = key_dim if key_dim is not None else d_features
        d_q = key_size if d_q is None else d_q
        self.d_features, self.d_q, self.num_classes = d_features, d_q, num_classes
        self.d_v = value_dim if value_dim is not None else d_features
        self.capsules = nn.ModuleList(
            [
                query_scored_attention(
                    "capsule attention",
                    score,
                    align,
                    query_name="the capsule query",
                    d_q=d_q,
                    d_k=d_features,
                    key_dim=key_dim,
                    value_dim=value_dim,
                    dropout=dropout,
                    **options,
                )
                for _ in range(num_classes)
            ]
        )
        bound_q = 1.0 / math.sqrt(d_q)
        self.queries = nn.Parameter(torch.empty(num_classes, d_q).uniform_(-bound_q, bound_q))
        bound = 1.0 / math.sqrt(self.d_v)
        self.prob_weight = nn.Parameter(torch.empty(num_classes, self.d_v).uniform_(-bound, bound))
        self.prob_bias = nn.Parameter(torch.zeros(num_classes))
        self._batched = (
            key_dim is None
            and value_dim is None
            and not any(p.numel() for p in self.capsules.parameters())
        )

    def _attend(self, call: AttentionCall) -> CapsuleOutput:
        features, mask, need_weights = call.query, call.mask, call.need_weights
        B, n = features.shape[:2]
        C = self.num_classes
        pm = _position_mask(mask, B, n, features.device)
        m = pm[:, None, :] if pm is not None else None
        # padding never matters: cleared (where) before the projections and the means
        features = zero_rows(features, pm)
        if self._batched:
            q = self.queries.unsqueeze(0).expand(B, C, self.d_q)
            out = self.capsules[0](q, features, mask=m, need_weights=need_weights)
            contexts, weights, log_prob = out.context, out.weights, out.log_prob
            mean = masked_mean(features, pm).unsqueeze(1).expand(B, C, self.d_v)
        else:
            ctx, wts, means, outs = [], [], [], []
            for c, capsule in enumerate(self.capsules):
                q = self.queries[c].expand(B, self.d_q)
                out = capsule(q, features, mask=m, need_weights=need_weights)
                outs.append(out)
                ctx.append(out.context)
                wts.append(out.weights)
                values = (
                    capsule.value_proj(features) if capsule.value_proj is not None else features
                )
                means.append(masked_mean(values, pm))
            contexts = torch.stack(ctx, 1)
            weights = torch.stack(wts, 1) if need_weights else None  # type: ignore[arg-type]
            mean = torch.stack(means, 1)
            sampled = [o.log_prob for o in outs if o.log_prob is not None]
            log_prob = torch.stack(sampled, 1) if sampled else None  # [B, C]
        logits = (contexts * self.prob_weight).sum(-1) + self.prob_bias
        probs = torch.sigmoid(logits)
        recon = probs.unsqueeze(-1) * contexts
        return CapsuleOutput(probs, logits, contexts, recon, mean, weights, log_prob)


def capsule_loss(
    output: CapsuleOutput,
    targets: Tensor,
    *,
    lam: float = 0.1,
    classification: str = "bce",
    reconstruction: str = "squared",
    over: str = "targets",
    margin: float = 1.0,
    reduction: str = "mean",
    return_parts: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """The joint capsule objective ``L = L_cls + lam * L_rec`` (Wang et al. 2018).

    Args:
        output: a :class:`CapsuleOutput`.
        targets: class indices ``[B]`` (single-label) or multi-hot ``[B, C]`` (multi-label;
            0/1, float or bool). ``y_c`` below is the one-hot / multi-hot target.
        lam: ``lambda``, the weight of the reconstruction term (default 0.1).
        classification:
            ``"bce"`` (default): ``-sum_c [y_c log p_c + (1 - y_c) log(1 - p_c)]``, the
            independent-sigmoid (multi-label) cross entropy, computed from the logits (the
            survey's summary writes ``-sum_c y_c log p_c``, which never looks at the wrong
            capsules; the ``(1 - y_c)`` terms push them down);
            ``"hinge"``: ``sum_{i: y_i=1} sum_{j: y_j=0} max(0, margin - p_i + p_j)``, a
            margin form in the spirit of the paper's hinge objective (every gold capsule
            above every other by ``margin``).
        reconstruction:
            ``"squared"`` (default): ``sum_c w_c |r_c - f_bar_c|^2`` (the squared error of
            the survey's summary) with ``w_c = y_c`` (``over="targets"``: only the gold,
            active capsules must reconstruct the instance) or ``w_c = 1`` (``over="all"``:
            the literal sum over all capsules);
            ``"hinge"``: ``sum_{i: y_i=1} sum_{j: y_j=0} max(0, margin - r_i.f_bar_i +
            r_j.f_bar_j)``, the gold reconstructions more similar (inner product) to the
            instance than the others.
        over: ``"targets"`` or ``"all"`` (squared reconstruction only).
        margin: the margin of the hinge forms.
        reduction: ``"mean"`` (over the batch), ``"sum"`` or ``"none"`` (``[B]``).
        return_parts: also return ``L_cls`` and ``L_rec`` (reduced the same way).

    ``f_bar_c`` is ``output.mean_features`` (the masked mean of the values). Cost O(B C d_v)
    (O(B C^2) for the hinge pairs).
    """
    if not isinstance(output, CapsuleOutput):
        raise TypeError(f"output must be a CapsuleOutput, got {type(output).__name__}")
    if classification not in ("bce", "hinge"):
        raise ValueError(f"classification must be 'bce' or 'hinge', got {classification!r}")
    if reconstruction not in ("squared", "hinge"):
        raise ValueError(f"reconstruction must be 'squared' or 'hinge', got {reconstruction!r}")
    if over not in ("targets", "all"):
        raise ValueError(f"over must be 'targets' or 'all', got {over!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    B, C = output.probs.shape
    y = _targets(targets, B, C, output.probs.dtype)
    if classification == "bce":
        l_cls = F.binary_cross_entropy_with_logits(output.logits, y, reduction="none").sum(-1)
    else:
        l_cls = _pairwise_hinge(output.probs, y, margin)
    r, f_bar = output.reconstructions, output.mean_features
    if reconstruction == "squared":
        w = y if over == "targets" else torch.ones_like(y)
        l_rec = ((r - f_bar).pow(2).sum(-1) * w).sum(-1)
    else:
        l_rec = _pairwise_hinge((r * f_bar).sum(-1), y, margin)
    total = _reduce(l_cls + lam * l_rec, reduction)
    if return_parts:
        return total, _reduce(l_cls, reduction), _reduce(l_rec, reduction)
    return total


# ----------------------------------------------------------------------------- dynamic routing


def squash(s: Tensor, dim: int = -1) -> Tensor:
    """``squash(s) = |s|^2 / (1 + |s|^2) * s / |s|`` (Sabour et al. 2017): keeps the
    direction, maps the length into ``[0, 1)``; ``squash(0) = 0`` with a zero (finite)
    gradient."""
    sq = (s * s).sum(dim, keepdim=True)
    return s * (sq / (1 + sq)) / torch.sqrt(sq + SQUASH_EPS)


@output_pytree()
@dataclass
class RoutingOutput(_ClassProbabilities):
    """Result of :class:`CapsuleRouting`.

    Attributes:
        probs: the capsule lengths ``|v_j| = |s_j|^2 / (1 + |s_j|^2)`` ``[B, C]``.
        capsules: the class capsules ``v_j = squash(s_j)`` ``[B, C, d_caps]``.
        weights: the final coupling coefficients ``c_ij`` as ``[B, C, n]`` (for each input
            position ``i`` a distribution over the classes ``j``; 0 at masked positions).
        logits: the final routing logits ``b_ij`` ``[B, C, n]``.
    """

    probs: Tensor
    capsules: Tensor
    weights: Tensor
    logits: Tensor


@register("query", "capsule-routing", aliases=("dynamic-routing", "routing-by-agreement"))
@renamed_init_arguments({"d_k": "d_features"}, attributes=True)
class CapsuleRouting(SequenceAttention):
    """Dynamic routing between the input positions (primary capsules) and one capsule per
    class (Sabour et al. 2017), the routing variant of capsule-based attention.

    Each position ``i`` predicts every class capsule, ``u_(j|i) = W_j u_i`` (``W_j``
    ``[d_caps, d_features]`` shared over positions, so any length works); the routing logits start
    at ``b_ij = 0`` and for ``T`` iterations:

        c_ij = softmax_j(b_ij)              (coupling: position i spreads over classes)
        s_j  = sum_i c_ij u_(j|i)
        v_j  = squash(s_j)
        b_ij = b_ij + u_(j|i) . v_j         (agreement; skipped after the last iteration)

    ``|v_j|`` is the probability of class ``j`` (train with :func:`margin_loss`). Where the
    capsule attention normalises each class's weights over the positions, routing
    normalises each position's weights over the classes: positions are *routed* to the
    classes they agree with. Gradients flow through every iteration.

    Args:
        d_features: feature size (formerly ``d_k``, a deprecated keyword for one release).
        num_classes: ``C``. d_caps: size of the class capsules (16).
        iterations: ``T`` (default 3, as in the paper; 1 = uniform coupling).
        bias: a bias per class capsule in the predictions (``W_j u_i + beta_j``).

    Call: ``forward(query, key=None, value=None, *, mask=None)``: the features ``F`` ``[B,
    n, d_features]`` (the primary capsules) are ``query`` (``key`` / ``value`` must be
    ``None`` or ``F``); ``mask`` bool ``[B, n]`` (True = real position);
    masked positions have ``c_ij = 0`` (they route nothing). Returns
    :class:`RoutingOutput`; a sequence with no real position gives ``v_j = 0``.

    Cost: O(B n C d_features d_caps) time and O(B n C d_caps) memory for the predictions, plus
    O(T B n C d_caps) for the routing iterations.

    :formula: u_(j|i) = W_j u_i; b_ij = 0; T times: c_ij = softmax_j(b_ij), s_j = sum_i c_ij
        u_(j|i), v_j = squash(s_j), b_ij += u_(j|i) . v_j; p_j = |v_j|
    :source: Sabour et al. 2017, Dynamic Routing Between Capsules
    :cost: O(B n C d_features d_caps) for the predictions + O(T B n C d_caps) for the routing
    """

    self_only = True

    def __init__(
        self,
        d_features: int,
        num_classes: int,
        d_caps: int = 16,
        iterations: int = 3,
        *,
        bias: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_classes", num_classes),
            ("d_caps", d_caps),
            ("d_features", d_features),
            ("iterations", iterations),
        ):
            check_int(value, name)
        self.d_features, self.num_classes = d_features, num_classes
        self.d_caps, self.iterations = d_caps, iterations
        bound = 1.0 / math.sqrt(d_features)
        self.W = nn.Parameter(torch.empty(num_classes, d_caps, d_features).uniform_(-bound, bound))
        self.beta = nn.Parameter(torch.zeros(num_classes, d_caps)) if bias else None

    def predictions(self, features: Tensor) -> Tensor:
        """``u_(j|i) = W_j u_i (+ beta_j)``: ``[B, n, C, d_caps]``."""
        u = torch.einsum("bnk,cdk->bncd", features, self.W)
        return u + self.beta if self.beta is not None else u

    def _attend(self, call: AttentionCall) -> RoutingOutput:
        features, mask = call.query, call.mask
        B, n = features.shape[:2]
        pm = _position_mask(mask, B, n, features.device)
        # padding never matters: cleared (where) before the predictions u = W f
        features = zero_rows(features, pm)
        u = self.predictions(features)  # [B, n, C, d]
        keep = pm.unsqueeze(-1) if pm is not None else None
        b = u.new_zeros(B, n, self.num_classes)
        for t in range(self.iterations):
            c = masked_softmax(b, None, dim=-1)
            if keep is not None:
                c = torch.where(keep, c, c.new_zeros(()))
            s = (c.unsqueeze(-1) * u).sum(1)  # [B, C, d]
            v = squash(s)
            if t < self.iterations - 1:
                b = b + (u * v.unsqueeze(1)).sum(-1)
        sq = (s * s).sum(-1)
        probs = sq / (1 + sq)
        return RoutingOutput(probs, v, c.transpose(1, 2), b.transpose(1, 2))


def margin_loss(
    probs: Tensor,
    targets: Tensor,
    *,
    m_plus: float = 0.9,
    m_minus: float = 0.1,
    down_weight: float = 0.5,
    reduction: str = "mean",
) -> Tensor:
    """The margin loss of Sabour et al. 2017 for capsule lengths ``probs`` ``[B, C]``:

        L = sum_j [ T_j max(0, m_plus - |v_j|)^2 + down_weight (1 - T_j) max(0, |v_j| - m_minus)^2 ]

    ``targets``: class indices ``[B]`` or multi-hot ``[B, C]`` (``T_j``). Works for several
    present classes at once (multi-label). ``reduction``: ``"mean"`` over the batch,
    ``"sum"`` or ``"none"`` (``[B]``).
    """
    check_tensor(probs, "probs")
    if probs.dim() != 2:
        raise ValueError(f"probs has shape {tuple(probs.shape)}, expected [B, C]")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    B, C = probs.shape
    y = _targets(targets, B, C, probs.dtype)
    present = y * (m_plus - probs).clamp(min=0).pow(2)
    absent = down_weight * (1 - y) * (probs - m_minus).clamp(min=0).pow(2)
    return _reduce((present + absent).sum(-1), reduction)
