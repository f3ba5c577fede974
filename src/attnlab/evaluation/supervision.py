"""Supervised attention: a joint loss that pulls a model's attention towards gold attention.

    L = L_task + lambda * D(gold || attention)

averaged over the supervised rows (queries) of the batch. The gold attention may come as

* **weights**: a target distribution per query row ``[B, n_q, n_k]`` (rows summing to 1;
  an all-zero row is unsupervised);
* **links**: word-alignment links (Liu et al. 2016; Mi et al. 2016): row ``j`` gets the
  uniform distribution over the source words linked to target word ``j`` (see
  :func:`links_to_weights`); unlinked rows are unsupervised;
* **region**: a bool mask ``[B, n_q, n_k]`` (or ``[B, n_k]``) of the keys inside a gold region
  (e.g. the image cells of the object a question asks about).

Divergences ``D`` (all computed in float32 or wider, with a clamp on log(0)):

* ``"ce"``: cross-entropy ``-sum_k g_k log a_k`` (Liu et al. 2016's alignment loss);
* ``"kl"``: ``sum_k g_k (log g_k - log a_k)`` (zero when the attention equals the gold);
* ``"mse"``: ``sum_k (a_k - g_k)^2`` (Mi et al. 2016's Euclidean distance);
* ``"mass"``: ``-log sum_{k in gold} a_k``, the attention mass outside the region as a log
  loss -- natural for regions and links (it does not ask *how* the mass is spread inside).

Cost: O(B n_q n_k). Sources: L. Liu, M. Utiyama, A. Finch and E. Sumita, "Neural Machine
Translation with Supervised Attention", COLING 2016; H. Mi, Z. Wang and A. Ittycheriah,
"Supervised Attentions for Neural Machine Translation", EMNLP 2016.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from attnlab._checks import check_int
from attnlab.data.pharaoh import as_links

__all__ = [
    "DIVERGENCES",
    "SupervisedAttentionLoss",
    "attention_supervision_loss",
    "links_to_weights",
]

DIVERGENCES = ("ce", "kl", "mse", "mass")
_EPS = 1e-12


def links_to_weights(
    links: Sequence[Iterable[tuple[int, int]]], n_target: int, n_source: int
) -> Tensor:
    """Gold attention ``[B, n_target, n_source]`` from ``(source, target)`` links per pair:
    row ``j`` is uniform over the source words linked to target word ``j`` (zero if none).
    Links outside the sizes raise ``ValueError``."""
    check_int(n_target, "n_target", error=ValueError)
    check_int(n_source, "n_source", error=ValueError)
    out = torch.zeros(len(links), n_target, n_source)
    for b, pair in enumerate(links):
        for i, j in sorted(as_links(pair, f"links[{b}]")):
            if not (0 <= i < n_source and 0 <= j < n_target):
                raise ValueError(
                    f"link {(i, j)} of pair {b} is outside [0, {n_source}) x [0, {n_target})"
                )
            out[b, j, i] = 1.0
    total = out.sum(-1, keepdim=True)
    return torch.where(total > 0, out / total.clamp_min(1.0), out)


def attention_supervision_loss(
    attention: Tensor,
    gold: Tensor,
    *,
    kind: str = "weights",
    divergence: str = "ce",
    mask: Tensor | None = None,
) -> Tensor:
    """The mean divergence between gold and predicted attention over supervised rows.

    Args:
        attention: predicted weights ``[B, n_k]`` or ``[B, n_q, n_k]`` (rows sum to 1 over
            the allowed keys).
        gold: ``kind="weights"`` or ``"links"``: gold weights of the same shape (use
            :func:`links_to_weights` for links); ``kind="region"``: a bool mask of the same
            shape or ``[B, n_k]`` (broadcast over the queries).
        divergence: one of ``"ce"``, ``"kl"``, ``"mse"``, ``"mass"``.
        mask: optional bool ``[B, n_q]`` (or ``[B]`` for 2-D attention) of the rows to
            supervise (e.g. real target words); rows whose gold is empty are skipped anyway.

    Returns a scalar (zero, with a gradient path, when no row is supervised).
    """
    if kind not in ("weights", "links", "region"):
        raise ValueError(f"kind must be 'weights', 'links' or 'region', got {kind!r}")
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {', '.join(DIVERGENCES)}, got {divergence!r}")
    if not isinstance(attention, Tensor):
        raise TypeError(f"attention must be a torch.Tensor, got {type(attention).__name__}")
    if attention.dim() not in (2, 3):
        shape = tuple(attention.shape)
        raise ValueError(f"attention has shape {shape}, expected [B, n_k] or [B, n_q, n_k]")
    a = attention.float() if attention.dtype in (torch.float16, torch.bfloat16) else attention
    squeeze = a.dim() == 2
    if squeeze:
        a = a.unsqueeze(1)
    g, region = _gold(gold, kind, a, attention)
    rows = region.any(-1)  # [B, n_q]
    if mask is not None:
        m = torch.as_tensor(mask, device=a.device).bool()
        if m.dim() == 1:
            m = m.unsqueeze(1)
        if m.shape != rows.shape:
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(rows.shape)}")
        rows = rows & m
    per_row = _divergence(divergence, a, g, region)
    per_row = torch.where(rows, per_row, torch.zeros_like(per_row))
    count = rows.sum()
    return per_row.sum() / count.clamp_min(1).to(per_row.dtype)


def _gold(gold: Tensor, kind: str, a: Tensor, attention: Tensor) -> tuple[Tensor, Tensor]:
    """The gold distribution ``[B, n_q, n_k]`` (a region: uniform over it) in ``a``'s
    dtype, and the bool region it covers."""
    g = torch.as_tensor(gold, device=a.device)
    if kind == "region":
        g = g.bool()
        if g.dim() == 2:
            g = g.unsqueeze(1)
        region = g.expand_as(a)
        g = region.to(a.dtype)
        return g / g.sum(-1, keepdim=True).clamp_min(1.0), region
    if g.dim() == 2:
        g = g.unsqueeze(1)
    if g.shape != a.shape:
        raise ValueError(
            f"gold has shape {tuple(gold.shape)}, expected the attention's shape "
            f"{tuple(attention.shape)}"
        )
    g = g.to(a.dtype)
    if not bool(torch.isfinite(g).all()) or bool((g < 0).any()):  # -w would give a zero loss
        raise ValueError("gold must be finite and non-negative")
    return g, g > 0


def _divergence(divergence: str, a: Tensor, g: Tensor, region: Tensor) -> Tensor:
    """``D(gold || attention)`` per row ``[B, n_q]``."""
    log_a = a.clamp_min(_EPS).log()
    if divergence == "ce":
        return -(g * log_a).sum(-1)
    if divergence == "kl":
        return (g * (g.clamp_min(_EPS).log() - log_a)).sum(-1)
    if divergence == "mse":
        return ((a - g) ** 2).sum(-1)
    return -(a * region.to(a.dtype)).sum(-1).clamp_min(_EPS).log()


class SupervisedAttentionLoss(nn.Module):
    """``L_task + lambda * D(gold || attention)`` (see the module docstring).

    Example::

        joint = SupervisedAttentionLoss(weight=0.5, kind="links", divergence="ce")
        loss = joint(task_loss, out.weights, links_to_weights(links, T, S), mask=tgt_mask)
    """

    def __init__(self, weight: float = 1.0, *, kind: str = "weights", divergence: str = "ce"):
        super().__init__()
        if weight < 0:
            raise ValueError(f"weight (lambda) must be >= 0, got {weight}")
        if kind not in ("weights", "links", "region"):
            raise ValueError(f"kind must be 'weights', 'links' or 'region', got {kind!r}")
        if divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {', '.join(DIVERGENCES)}")
        self.weight = float(weight)
        self.kind = kind
        self.divergence = divergence

    def forward(
        self, task_loss: Tensor, attention: Tensor, gold: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        if self.weight == 0.0:
            return task_loss
        div = attention_supervision_loss(
            attention, gold, kind=self.kind, divergence=self.divergence, mask=mask
        )
        return task_loss + self.weight * div
