"""Structured attention: the weights are the marginals of a linear-chain conditional random
field over the keys (Kim, Denton, Hoang & Rush 2017, *Structured Attention Networks*; the
"segmentation attention" of their section 3.1).

The textbook's structured attention (seed 002, section 2.2.4; TAXONOMY section 4) treats
the attention as a context-dependent binary distribution built with a graphical model. Here
each allowed key ``l`` of a query row gets a latent selection ``z_l in {0, 1}``; the allowed
keys ``l_1 < l_2 < ... < l_m`` of the row form a chain:

    p(z | e) = exp( sum_t z_t e_{l_t} + sum_{t>1} theta[z_{t-1}, z_t] ) / Z(e)
    a_l      = p(z_l = 1 | e)        (the marginal of key l; 0 for a masked key)

``e`` are the scores (the unary potentials of ``z = 1``; ``z = 0`` has potential 0) and
``theta`` ``[2, 2]`` the pairwise potentials of consecutive allowed keys. The marginals come
from the forward-backward recursions in log space, each message shifted to log-sum 0 (so
scores in the thousands lose no precision); autograd differentiates through them.
Masked keys are left out of the chain (the link joins the allowed keys on either side), so
padding never matters. With ``theta = 0`` the selections are independent and
``a_l = sigmoid(e_l)``, the paper's "sigmoid attention" baseline.

The marginals need not sum to 1 (the context ``c = sum_l a_l v_l`` grows with the expected
number of selected keys, as in the paper); ``sum_to_one=True`` divides them by their sum.

Cost: O(B n_q n_k) time and memory, in ``n_k`` sequential steps (each over all ``B n_q``
rows at once).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_tensor, softmax_dtype
from attnlab.general.alignment import Aligned, Alignment
from attnlab.masks import check_score_mask
from attnlab.registry import register

__all__ = ["StructuredAlign", "crf_marginals"]


def _check(e: Tensor, mask: Tensor | None, transitions: Tensor | None) -> None:
    check_tensor(e, "e")
    if e.dim() < 1:
        raise ValueError(f"e has shape {tuple(e.shape)}, expected [B, n_q, n_k] or [B, n_k]")
    check_score_mask(mask, e)
    if transitions is not None:
        check_tensor(transitions, "transitions")
        if tuple(transitions.shape) != (2, 2):
            raise ValueError(
                f"transitions has shape {tuple(transitions.shape)}, expected [2, 2] "
                "(theta[z_prev, z_next])"
            )


def _unary(u1: Tensor) -> Tensor:
    """``[..., 2]``: the potentials of ``z = 0`` (0) and ``z = 1`` (the score)."""
    return torch.stack((torch.zeros_like(u1), u1), -1)


def _normalized(log_potentials: Tensor) -> Tensor:
    """A message over the two states shifted to log-sum 0 (the shift cancels in every
    marginal; it keeps the messages near 0, so huge scores lose no precision)."""
    return log_potentials - torch.logsumexp(log_potentials, -1, keepdim=True)


def _forward_messages(u1: Tensor, allowed: Tensor, theta: Tensor) -> list[Tensor]:
    """``alpha_t[..., z]``: up to a constant, the log-sum over the allowed keys up to ``t``
    (``t`` included when it is allowed) with the last of them in state ``z``."""
    lead = u1.shape[:-1]
    alpha = u1.new_zeros(*lead, 2)
    started = torch.zeros(lead, dtype=torch.bool, device=u1.device)
    out = []
    for t in range(u1.shape[-1]):
        through = torch.logsumexp(alpha.unsqueeze(-1) + theta, dim=-2)  # over z_prev
        new = torch.where(started.unsqueeze(-1), through, 0.0) + _unary(u1[..., t])
        ok = allowed[..., t]
        alpha = torch.where(ok.unsqueeze(-1), _normalized(new), alpha)
        started = started | ok
        out.append(alpha)
    return out


def _backward_messages(u1: Tensor, allowed: Tensor, theta: Tensor) -> list[Tensor]:
    """``beta_t[..., z]``: up to a constant, the log-sum over the allowed keys after ``t``
    given ``z_t = z`` (0 where no allowed key follows)."""
    lead = u1.shape[:-1]
    ahead = u1.new_zeros(*lead, 2)  # unary + beta of the next allowed key
    has_next = torch.zeros(lead, dtype=torch.bool, device=u1.device)
    out: list[Tensor] = [ahead] * u1.shape[-1]
    for t in reversed(range(u1.shape[-1])):
        through = _normalized(torch.logsumexp(theta + ahead.unsqueeze(-2), dim=-1))
        beta = torch.where(has_next.unsqueeze(-1), through, 0.0)  # over z_next
        out[t] = beta
        ok = allowed[..., t]
        ahead = torch.where(ok.unsqueeze(-1), _normalized(_unary(u1[..., t]) + beta), ahead)
        has_next = has_next | ok
    return out


def crf_marginals(
    e: Tensor,
    mask: Tensor | None = None,
    transitions: Tensor | None = None,
    sum_to_one: bool = False,
) -> Tensor:
    """Structured (segmentation) attention: ``a_l = p(z_l = 1 | e)`` under the linear-chain
    CRF ``p(z | e) ~ exp(sum_t z_t e_t + sum_t theta[z_{t-1}, z_t])`` over the allowed keys
    of each row of the last axis (Kim et al. 2017).

    Args:
        e: the scores, any shape ``[..., n_k]`` (``[B, n_q, n_k]`` in attention).
        mask: bool, broadcastable to ``e``, True = the key may be attended. Masked keys get
            weight 0 and are left out of the chain; a row with no allowed key gets zeros.
        transitions: ``theta`` ``[2, 2]`` (``theta[z_prev, z_next]``), or ``None`` for zero
            pairwise potentials (independent keys: ``a = sigmoid(e)``).
        sum_to_one: divide the marginals by their sum over the row.

    Returns the weights, shape of ``e``. Half precision is computed in float32 and cast
    back. Cost O(numel(e)) time and memory, in ``n_k`` sequential steps.
    """
    marginals = _marginals(e, mask, transitions)
    return (_rescaled(marginals) if sum_to_one else marginals).to(e.dtype)


def _marginals(e: Tensor, mask: Tensor | None, transitions: Tensor | None) -> Tensor:
    """The checked :func:`crf_marginals` (without ``sum_to_one``) in the work dtype:
    float32 for half-precision scores."""
    _check(e, mask, transitions)
    work = softmax_dtype(e.dtype)
    x = e.to(work)
    allowed = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.expand(x.shape)
    theta = x.new_zeros(2, 2) if transitions is None else transitions.to(work)
    u1 = torch.where(allowed, x, 0.0)  # a masked key's score never enters a message
    alphas = _forward_messages(u1, allowed, theta)
    betas = _backward_messages(u1, allowed, theta)
    if not alphas:
        return x.new_zeros(x.shape)
    # p(z_t = 1) = sigmoid(log-odds of the two states at t): exact, and saturated to a
    # zero gradient where the scores are huge
    odds = [
        a[..., 1] + b[..., 1] - a[..., 0] - b[..., 0] for a, b in zip(alphas, betas, strict=True)
    ]
    return torch.where(allowed, torch.sigmoid(torch.stack(odds, -1)), 0.0)


def _rescaled(weights: Tensor) -> Tensor:
    """``weights`` divided by their sum over the last axis (a row of zeros stays zero)."""
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total > 0, total, torch.ones_like(total))


@register("align", "structured", aliases=("crf", "segmentation", "structured-attention"))
class StructuredAlign(Alignment):
    """Structured attention (segmentation attention, Kim et al. 2017): the weights are the
    marginals ``p(z_l = 1 | e)`` of a linear-chain CRF whose unary potentials are the
    scores and whose pairwise potentials ``theta`` ``[2, 2]`` (``self.transitions``) are
    learned, initialised at 0 (independent keys, ``a = sigmoid(e)``).

    Args:
        pairwise: learn ``theta`` (default); ``False`` keeps it at 0: the paper's sigmoid
            attention baseline, with no parameter.
        sum_to_one: divide the marginals by their sum (the paper's form does not: the
            context grows with the expected number of selected keys). The raw marginals
            are then ``Aligned.extras["marginals"]``.

    Shapes: ``e`` ``[B, n_q, n_k]`` (any ``[..., n_k]``) -> weights of the same shape.
    Masked keys leave the chain (padding never matters); a query row with no allowed key
    gets zero weights. Cost O(B n_q n_k) time and memory, in ``n_k`` sequential steps.

    :formula: p(z|e) ~ exp(sum_l z_l e_l + sum_l theta[z_{l-1}, z_l]), z_l in {0, 1}; a_l =
        p(z_l = 1 | e) by forward-backward
    :source: Kim, Denton, Hoang & Rush 2017, Structured Attention Networks
    :cost: O(B n_q n_k) time and memory, n_k sequential steps
    """

    function = staticmethod(crf_marginals)

    def __init__(self, pairwise: bool = True, sum_to_one: bool = False) -> None:
        super().__init__()
        for name, value in (("pairwise", pairwise), ("sum_to_one", sum_to_one)):
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be a bool, got {value!r}")
        self.sum_to_one = sum_to_one
        self.transitions = nn.Parameter(torch.zeros(2, 2)) if pairwise else None

    def forward(self, e: Tensor, mask: Tensor | None = None, **context: Any) -> Aligned:
        marginals = _marginals(e, mask, self.transitions)
        if not self.sum_to_one:
            return Aligned(marginals.to(e.dtype))
        # rescaled in the work dtype, as crf_marginals(..., sum_to_one=True) does
        weights = _rescaled(marginals).to(e.dtype)
        return Aligned(weights, extras={"marginals": marginals.to(e.dtype)})
