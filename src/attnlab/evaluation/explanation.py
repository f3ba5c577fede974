"""Is attention explanation? The tests of Jain & Wallace (2019).

For a classifier that pools encoder states ``h_t`` with attention weights ``a_t`` (the
:class:`~attnlab.models.SentenceClassifier` protocol: ``encode(tokens, mask)``,
``classify(hidden, mask)`` and ``classify_with_weights(hidden, weights)``, an ``embedding``
layer), on one instance with ``L`` real tokens and output distribution ``y``:

* gradient importance ``g_t = |d y_c / d onehot(w_t)| = |grad_{x_t} y_c . x_t|`` with ``c``
  the predicted class and the attention weights held constant (the graph is cut at the
  attention, as in the paper); ``classes="all"`` sums ``|grad_{x_t} y_k . x_t|`` over every
  class ``k``, as Jain & Wallace's code does over its outputs (for two classes both give
  the same ranking: ``y_0 = 1 - y_1``);
* leave-one-out importance ``l_t = TVD(y, y_{-t})`` where ``y_{-t}`` is the output with
  token ``t`` removed;
* Kendall's tau between the attention ``a``, ``g`` and ``l`` per instance (mean, std and the
  fraction with p <= 0.05 over a data set);
* the permutation test: the median ``TVD(y, y(a_pi))`` over ``K`` random permutations ``pi``
  of the weights over the real tokens (encoder states fixed);
* adversarial attention: weights ``a'`` maximising ``JSD(a, a')`` subject to
  ``TVD(y, y(a')) <= epsilon``, found by gradient ascent on the logits of ``a'`` with a
  penalty on the constraint; reported is the largest JSD among the iterates that satisfy the
  constraint (0 if none does). :func:`adversarial_attention_multi` is Jain & Wallace's own
  search: ``K`` adversaries per instance optimised jointly from noisy uniform logits (with
  a term that keeps them apart), the last iterate of each, then the largest JSD among
  those (and the original weights) whose output moves by at most ``select_epsilon``.

Cost per instance: gradient O(one forward + backward); leave-one-out O(L) forwards of length
L - 1; permutation O(K) output layers; adversarial O(steps) output layers (the encoder
runs once).

Source: S. Jain and B. C. Wallace, "Attention is not Explanation", NAACL-HLT 2019.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy import stats
from torch import Tensor, nn

from attnlab._checks import check_positive
from attnlab.evaluation._measures import as_array

# the unchecked forms: the weights and outputs are the studies' own (divergences.py)
from attnlab.evaluation.divergences import _jsd, _tvd

__all__ = [
    "AdversarialResult",
    "CorrelationSummary",
    "adversarial_attention",
    "adversarial_attention_multi",
    "attention_weights",
    "gradient_importance",
    "importance_correlations",
    "kendall_per_instance",
    "leave_one_out_importance",
    "permutation_test",
]


def _mask(tokens: Tensor, lengths: Tensor) -> Tensor:
    return torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]


def _check_model(model: nn.Module) -> None:
    for name in ("encode", "classify", "classify_with_weights"):
        if not hasattr(model, name):
            raise TypeError(
                f"{type(model).__name__} has no {name}(); the explanation tests need a pooling "
                "classifier with encode / classify / classify_with_weights (SentenceClassifier)"
            )


@torch.no_grad()
def attention_weights(model: nn.Module, tokens: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The model's attention weights ``[B, n]`` and output distribution ``[B, C]``."""
    _check_model(model)
    m = _mask(tokens, lengths)
    out = model.classify(model.encode(tokens, m), m)
    if out.weights is None or out.weights.dim() != 2:
        raise ValueError("the model has no single-dimensional attention weights [B, n]")
    return out.weights, out.logits.softmax(-1)


def _encoded(
    model: nn.Module, tokens: Tensor, lengths: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The model's weights ``[B, n]`` and output distribution ``[B, C]``, the token mask
    ``[B, n]`` and the encoder states, without gradients: what the searches over weights hold
    fixed."""
    w, probs = attention_weights(model, tokens, lengths)
    m = _mask(tokens, lengths)
    with torch.no_grad():
        hidden = model.encode(tokens, m)
    return w, probs, m, hidden


def gradient_importance(
    model: nn.Module, tokens: Tensor, lengths: Tensor, *, classes: str = "predicted"
) -> Tensor:
    """``|grad_{x_t} y_c . x_t|`` per token ``[B, n]`` (zero on padding), attention held
    constant; ``c`` is the predicted class (``classes="predicted"``), or the sum over every
    class ``k`` of ``|grad_{x_t} y_k . x_t|`` (``classes="all"``, Jain & Wallace's code)."""
    if classes not in ("predicted", "all"):
        raise ValueError(f"classes must be 'predicted' or 'all', got {classes!r}")
    _check_model(model)
    embedding = getattr(model, "embedding", None)
    if not isinstance(embedding, nn.Module):
        raise TypeError(f"{type(model).__name__} has no embedding layer")
    weights, _ = attention_weights(model, tokens, lengths)
    captured: dict[str, Tensor] = {}

    def hook(_module: nn.Module, _inputs: tuple, output: Tensor) -> Tensor:
        x = output.detach().requires_grad_(True)
        captured["x"] = x
        return x

    handle = embedding.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            m = _mask(tokens, lengths)
            logits = model.classify_with_weights(model.encode(tokens, m), weights.detach())
            probs = logits.softmax(-1)
            if classes == "predicted":
                chosen = probs.gather(1, probs.argmax(-1, keepdim=True)).sum()
                (grad,) = torch.autograd.grad(chosen, captured["x"])
                return ((grad * captured["x"]).sum(-1).abs() * m).detach()
            total = torch.zeros(m.shape, device=m.device)
            for k in range(probs.shape[-1]):
                (grad,) = torch.autograd.grad(
                    probs[:, k].sum(), captured["x"], retain_graph=k < probs.shape[-1] - 1
                )
                total = total + (grad * captured["x"]).sum(-1).abs()
    finally:
        handle.remove()
    return (total * m).detach()


@torch.no_grad()
def leave_one_out_importance(model: nn.Module, tokens: Tensor, lengths: Tensor) -> Tensor:
    """``TVD(y, y_{-t})`` per token ``[B, n]`` (zero on padding)."""
    _, probs = attention_weights(model, tokens, lengths)
    B, n = tokens.shape
    device = tokens.device
    out = torch.zeros(B, n, device=device)
    for b in range(B):
        L = int(lengths[b])
        if L == 0:
            continue
        real = tokens[b, :L]
        keep = ~torch.eye(L, dtype=torch.bool, device=device)
        variants = real.expand(L, L)[keep].view(L, L - 1) if L > 1 else real.new_zeros(1, 0)
        var_len = torch.full((L,), L - 1, dtype=torch.long, device=device)
        if L - 1 == 0:
            variants = real.new_zeros(L, 1)  # one padding slot; length 0 -> empty input
        m = _mask(variants, var_len)
        p = model.classify(model.encode(variants, m), m).logits.softmax(-1)
        out[b, :L] = _tvd(p, probs[b : b + 1].expand_as(p))
    return out


def kendall_per_instance(a: Tensor, b: Tensor, lengths: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Kendall's tau and its p-value per instance over the real tokens (NaN for fewer than
    two tokens or a constant ranking)."""
    taus, ps = [], []
    for i in range(a.shape[0]):
        L = int(lengths[i])
        x, y = as_array(a[i, :L]), as_array(b[i, :L])
        if L < 2 or np.all(x == x[0]) or np.all(y == y[0]):
            taus.append(math.nan)
            ps.append(math.nan)
            continue
        r = stats.kendalltau(x, y)
        taus.append(float(r.statistic))
        ps.append(float(r.pvalue))
    return np.asarray(taus), np.asarray(ps)


@dataclass
class CorrelationSummary:
    """Kendall's tau of one pair of importance measures over a data set."""

    pair: str
    mean: float
    std: float
    significant: float  # the fraction of instances with p <= 0.05
    n: int
    taus: list[float] = field(default_factory=list, repr=False)
    lengths: list[int] = field(default_factory=list, repr=False)


def _summary(pair: str, taus: np.ndarray, ps: np.ndarray, lengths: list[int]) -> CorrelationSummary:
    ok = ~np.isnan(taus)
    t = taus[ok]
    return CorrelationSummary(
        pair=pair,
        mean=float(t.mean()) if t.size else math.nan,
        std=float(t.std()) if t.size else math.nan,
        significant=float((ps[ok] <= 0.05).mean()) if t.size else math.nan,
        n=int(t.size),
        taus=[float(v) for v in t],
        lengths=[lengths[i] for i in np.flatnonzero(ok)],
    )


def importance_correlations(
    model: nn.Module, batches: Iterable[Sequence[Tensor]], *, gradient_classes: str = "predicted"
) -> dict[str, CorrelationSummary]:
    """Kendall's tau between attention, gradient and leave-one-out importance over
    ``batches`` of ``(tokens [B, n], lengths [B], ...)`` (further items, e.g. labels, are
    ignored): keys ``"attention-gradient"``, ``"attention-loo"``, ``"gradient-loo"``.
    ``gradient_classes``: :func:`gradient_importance`'s ``classes``."""
    was = model.training
    model.eval()
    acc: dict[str, tuple[list, list]] = {
        k: ([], []) for k in ("attention-gradient", "attention-loo", "gradient-loo")
    }
    all_lengths: list[int] = []
    try:
        for batch in batches:
            tokens, lengths = batch[0], batch[1]
            w, _ = attention_weights(model, tokens, lengths)
            g = gradient_importance(model, tokens, lengths, classes=gradient_classes)
            loo = leave_one_out_importance(model, tokens, lengths)
            all_lengths += [int(v) for v in lengths]
            for key, (x, y) in {
                "attention-gradient": (w, g),
                "attention-loo": (w, loo),
                "gradient-loo": (g, loo),
            }.items():
                t, p = kendall_per_instance(x, y, lengths)
                acc[key][0].extend(t)
                acc[key][1].extend(p)
    finally:
        model.train(was)
    return {k: _summary(k, np.asarray(t), np.asarray(p), all_lengths) for k, (t, p) in acc.items()}


@torch.no_grad()
def permutation_test(
    model: nn.Module,
    tokens: Tensor,
    lengths: Tensor,
    *,
    permutations: int = 100,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """The median output change ``TVD(y, y(a_pi))`` over random permutations of the weights
    over the real tokens, and the largest attention weight, per instance (``[B]``, ``[B]``).
    With an even number of permutations the median is the mean of the middle two."""
    w, probs, _, hidden = _encoded(model, tokens, lengths)
    B = tokens.shape[0]
    medians = torch.zeros(B, device=w.device)
    for b in range(B):
        L = int(lengths[b])
        if L < 2:
            continue
        perms = torch.stack([torch.randperm(L, generator=generator) for _ in range(permutations)])
        perms = perms.to(w.device)
        wp = torch.zeros(permutations, tokens.shape[1], dtype=w.dtype, device=w.device)
        wp[:, :L] = w[b, :L][perms]
        p = model.classify_with_weights(hidden[b : b + 1].expand(permutations, -1, -1), wp)
        # the median of an even count is the mean of the middle two (np.median, as the
        # paper's code), not torch.median's lower one
        medians[b] = torch.quantile(_tvd(p.softmax(-1), probs[b : b + 1]), 0.5)
    return medians, w.max(-1).values


@dataclass
class AdversarialResult:
    """Adversarial attention per instance: the largest JSD from the original weights found
    within the output constraint, the TVD of the output there, and the weights."""

    max_jsd: Tensor  # [B]
    tvd: Tensor  # [B]
    weights: Tensor  # [B, n]


def adversarial_attention(
    model: nn.Module,
    tokens: Tensor,
    lengths: Tensor,
    *,
    epsilon: float = 0.01,
    steps: int = 200,
    lr: float = 0.1,
    penalty: float = 100.0,
) -> AdversarialResult:
    """Weights as far (JSD) from the model's as possible while the output moves by at most
    ``epsilon`` (TVD); see the module docstring."""
    check_positive(epsilon, "epsilon", error=ValueError)  # NaN and inf: no bound at all
    w, probs, m, hidden = _encoded(model, tokens, lengths)
    gen = torch.Generator().manual_seed(0)
    init = w.clamp_min(1e-8).log() + 0.5 * torch.randn(w.shape, generator=gen).to(w.device)
    z = init.masked_fill(~m, -1e4).requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    best = torch.zeros(w.shape[0], device=w.device)
    best_tvd = torch.zeros(w.shape[0], device=w.device)
    best_w = w.clone()
    for _ in range(steps):
        a = z.masked_fill(~m, -1e4).softmax(-1) * m
        with torch.enable_grad():
            p = model.classify_with_weights(hidden, a).softmax(-1)
            d_out = _tvd(p, probs)
            d_att = _jsd(a, w)
            loss = -(d_att - penalty * torch.relu(d_out - epsilon)).sum()
        with torch.no_grad():
            ok = (d_out <= epsilon) & (d_att > best)
            best = torch.where(ok, d_att, best)
            best_tvd = torch.where(ok, d_out, best_tvd)
            best_w[ok] = a[ok]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return AdversarialResult(best.detach(), best_tvd.detach(), best_w.detach())


def adversarial_attention_multi(
    model: nn.Module,
    tokens: Tensor,
    lengths: Tensor,
    *,
    k: int = 5,
    steps: int = 500,
    lr: float = 0.01,
    penalty: float = 500.0,
    epsilon: float = 0.01,
    select_epsilon: float = 0.05,
    noise: float = 3.0,
    generator: torch.Generator | None = None,
) -> AdversarialResult:
    """Jain & Wallace's adversarial search (their code's settings are the defaults).

    Per instance, ``k`` candidate weight vectors ``a'_j = softmax(z_j)`` over the real
    tokens start from uniform logits plus ``noise`` times standard normal noise and are
    optimised together with Adam (AMSGrad, learning rate ``lr``, ``steps`` steps) to
    minimise ``sum_j [-JSD(a, a'_j) + penalty * relu(TVD(y, y(a'_j)) - epsilon)]`` minus
    the mean JSD between pairs of candidates (which keeps them apart), summed over the
    instances, the encoder states fixed. The final candidates and the model's own weights (JSD 0) are then screened:
    among those whose output moves by at most ``select_epsilon`` (TVD) the largest JSD from
    the model's weights is reported, with its TVD and weights.
    """
    if k < 1 or steps < 0:
        raise ValueError(f"k must be >= 1 and steps >= 0, got k={k}, steps={steps}")
    check_positive(epsilon, "epsilon", error=ValueError)
    check_positive(select_epsilon, "select_epsilon", error=ValueError)
    w, probs, m, hidden = _encoded(model, tokens, lengths)
    B, n = w.shape
    mk = m[:, None, :].expand(B, k, n)
    uniform = m.float() / lengths.clamp_min(1)[:, None].float()
    start = uniform.clamp_min(1e-30).log()[:, None, :].expand(B, k, n)
    start = start + noise * torch.randn((B, k, n), generator=generator).to(w.device)
    z = start.clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr, amsgrad=True)
    hidden_k = hidden[:, None].expand(B, k, *hidden.shape[1:]).reshape(B * k, *hidden.shape[1:])

    def candidates() -> Tensor:
        return z.masked_fill(~mk, float("-inf")).softmax(-1).masked_fill(~mk, 0.0)

    def outputs(a: Tensor) -> Tensor:
        logits = model.classify_with_weights(hidden_k, a.reshape(B * k, n))
        return logits.softmax(-1).reshape(B, k, -1)

    with torch.enable_grad():
        for _ in range(steps):
            a = candidates()
            d_out = _tvd(outputs(a), probs[:, None])
            d_att = _jsd(a, w[:, None])
            apart = _jsd(a[:, :, None], a[:, None, :]).mean((1, 2))  # [B]: k x k pairs
            loss = (-d_att + penalty * torch.relu(d_out - epsilon)).sum() - apart.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        a = candidates()
        d_out = _tvd(outputs(a), probs[:, None])
        d_att = _jsd(a, w[:, None])
        # the model's own weights are a candidate too: JSD 0, output unchanged
        d_att = torch.cat([d_att, torch.zeros(B, 1, device=w.device)], 1)
        d_out = torch.cat([d_out, torch.zeros(B, 1, device=w.device)], 1)
        a = torch.cat([a, w[:, None]], 1)
        d_att = d_att.masked_fill(d_out > select_epsilon, -1.0)
        best = d_att.argmax(1)
        rows = torch.arange(B, device=w.device)
        return AdversarialResult(d_att[rows, best].clamp_min(0.0), d_out[rows, best], a[rows, best])
