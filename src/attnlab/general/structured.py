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
rows at once; under ``torch.compile``, ``n_k`` rounded up to a power of two, so that one
graph serves a range of lengths: :func:`attnlab._checks.compiled_steps`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_flags,
    check_tensor,
    pad_to_compiled_steps,
    softmax_dtype,
)
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


def _lse2(x: Tensor, dim: int) -> Tensor:
    """``logsumexp`` over the two entries of axis ``dim`` as one ``logaddexp``: the same
    value up to rounding, in one kernel."""
    a, b = x.unbind(dim)
    return torch.logaddexp(a, b)


def _normalized(log_potentials: Tensor) -> Tensor:
    """A message over the two states shifted to log-sum 0 (the shift cancels in every
    marginal; it keeps the messages near 0, so huge scores lose no precision)."""
    return log_potentials - _lse2(log_potentials, -1).unsqueeze(-1)


def _log_odds(u1: Tensor, allowed: Tensor, theta: Tensor) -> Tensor:
    """``log p(z_t = 1) - log p(z_t = 0)`` ``[..., n]`` by forward-backward.

    The two recursions have the same form, so they run as one loop over a stacked pair of
    chains: chain 0 visits the keys in order with ``theta``, chain 1 in reverse order with
    ``theta^T``. At step ``s`` a chain's message ``m`` ``[..., 2]`` (up to a constant, the
    log-sum over the allowed keys visited so far with the last of them in state ``z``)
    passes through the pairwise potentials (``through[z] = log sum_z' exp(m[z'] +
    theta[z', z])``, 0 before the first allowed key) and, at an allowed key, takes its
    unary potentials and is shifted to log-sum 0. Chain 0's messages are ``alpha_t``;
    chain 1's ``through`` at key ``t`` is ``beta_t`` (the keys after ``t``) up to a
    constant, which cancels in the log-odds ``alpha_t[1] - alpha_t[0] + beta_t[1] -
    beta_t[0]``.

    Under ``torch.compile`` the loop runs :func:`attnlab._checks.compiled_steps` ``(n)``
    steps, over keys appended masked (left out of the chain: the marginals of the others
    are unchanged), so a graph serves every ``n`` up to the next power of two."""
    n = u1.shape[-1]
    u1, allowed = pad_to_compiled_steps(u1, -1), pad_to_compiled_steps(allowed, -1, False)
    unary = _unary(u1)  # [..., n, 2]
    # everything that does not depend on the messages is computed once, out of the loop;
    # index 0 of every stacked tensor is the forward chain, 1 the backward one
    units = torch.stack((unary, unary.flip(-2))).unbind(-2)  # n x [2, ..., 2]
    ok = torch.stack((allowed, allowed.flip(-1)))  # [2, ..., n]
    # an allowed key was visited before this one (the chain has started)
    started = (ok.cumsum(-1) > ok.to(torch.long)).unsqueeze(-1).unbind(-2)
    oks = ok.unsqueeze(-1).unbind(-2)
    pair = torch.stack((theta, theta.T)).view(2, *[1] * (u1.dim() - 1), 2, 2)
    message = u1.new_zeros(2, *u1.shape[:-1], 2)
    messages, throughs = [], []
    for s in range(u1.shape[-1]):
        through = _lse2(message.unsqueeze(-1) + pair, -2)  # over the previous state
        through = torch.where(started[s], through, 0.0)
        message = torch.where(oks[s], _normalized(through + units[s]), message)
        messages.append(message[0])
        throughs.append(through[1])
    alpha = torch.stack(messages, -2)  # [..., n, 2]
    beta = torch.stack(throughs[::-1], -2)
    return (alpha[..., 1] - alpha[..., 0] + beta[..., 1] - beta[..., 0])[..., :n]


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
    check_flags(sum_to_one=sum_to_one)
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
    if x.shape[-1] == 0:
        return x.new_zeros(x.shape)
    # p(z_t = 1) = sigmoid(log-odds of the two states at t): exact, and saturated to a
    # zero gradient where the scores are huge
    return torch.where(allowed, torch.sigmoid(_log_odds(u1, allowed, theta)), 0.0)


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
