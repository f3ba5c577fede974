"""Attention is not not explanation: the diagnostics of Wiegreffe & Pinter (2019).

For pooling classifiers with the :class:`~attnlab.models.SentenceClassifier` protocol
(``encode``, ``classify``, ``classify_with_weights``) and batches of
``(tokens [B, n], lengths [B], labels [B])``:

* :func:`uniform_weights_gap`: the model's score with its learned weights vs with uniform
  weights ``1/L`` over the real tokens at test time (the paper's uniform baseline trains a
  model with frozen uniform weights; the lab's ``uniform`` baseline does that);
* :func:`seed_variance`: for models trained with different seeds, per instance the JSD
  between their attention weights and the TVD between their outputs (both against the
  first model): attention that varies across seeds as much as an adversary's does is a
  weak explanation;
* :func:`frozen_weight_diagnostic`: an MLP that sees each token alone,
  ``y = W_o sum_t a_t ReLU(W_h x_t)``, trained with the weights ``a`` frozen from a source
  -- ``"uniform"``, ``"learned"`` (its own trainable additive attention), a trained model
  (``transferred``) or an adversarial model -- and scored on the test set: weights that
  carry useful token importance help this non-contextual model;
* :func:`adversarial_model`: train a model whose attention diverges from a base model's
  while its output stays close, minimising ``TVD(y_adv, y_base) - lambda JSD(a_adv,
  a_base)`` per instance; sweeping ``lambda`` traces how much the attention can move for
  how much output change.

Cost: one pass over the data per score; training costs as for the task model.

Source: S. Wiegreffe and Y. Pinter, "Attention is not not Explanation", EMNLP-IJCNLP 2019.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.metrics import f1_score
from torch import Tensor, nn

from attnlab.evaluation.divergences import jsd, tvd
from attnlab.evaluation.explanation import _mask, attention_weights

__all__ = [
    "AdversarialModelResult",
    "FrozenWeightMLP",
    "adversarial_model",
    "frozen_weight_diagnostic",
    "seed_variance",
    "uniform_weights_gap",
]

Batch = tuple[Tensor, Tensor, Tensor]


def _uniform(lengths: Tensor, n: int) -> Tensor:
    m = torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]
    return m.float() / lengths.clamp_min(1)[:, None].float()


@torch.no_grad()
def uniform_weights_gap(model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
    """Accuracy and macro F1 with the model's weights and with uniform weights."""
    was = model.training
    model.eval()
    gold, learned, uniform = [], [], []
    for tokens, lengths, labels in batches:
        m = _mask(tokens, lengths)
        hidden = model.encode(tokens, m)
        learned.append(model.classify(hidden, m).logits.argmax(-1))
        uniform.append(
            model.classify_with_weights(hidden, _uniform(lengths, tokens.shape[1])).argmax(-1)
        )
        gold.append(labels)
    model.train(was)
    y = torch.cat(gold).cpu().numpy()
    out = {}
    for name, pred in (("learned", learned), ("uniform", uniform)):
        p = torch.cat(pred).cpu().numpy()
        out[f"{name}_accuracy"] = float((p == y).mean())
        out[f"{name}_f1"] = float(f1_score(y, p, average="macro"))
    return out


@torch.no_grad()
def seed_variance(models: Sequence[nn.Module], batches: Iterable[Batch]) -> dict[str, object]:
    """Per instance, the JSD of attention and TVD of outputs of ``models[1:]`` against
    ``models[0]`` (same architecture, different seeds); returns the per-instance values
    and their means."""
    if len(models) < 2:
        raise ValueError("seed_variance needs at least two models")
    for model in models:
        model.eval()
    jsds, tvds, max_w = [], [], []
    for tokens, lengths, _labels in batches:
        w0, p0 = attention_weights(models[0], tokens, lengths)
        for other in models[1:]:
            w, p = attention_weights(other, tokens, lengths)
            jsds.append(jsd(w, w0))
            tvds.append(tvd(p, p0))
            max_w.append(w0.max(-1).values)
    j, t = torch.cat(jsds), torch.cat(tvds)
    return {
        "jsd": j.tolist(),
        "tvd": t.tolist(),
        "base_max_weight": torch.cat(max_w).tolist(),
        "mean_jsd": float(j.mean()),
        "mean_tvd": float(t.mean()),
    }


class FrozenWeightMLP(nn.Module):
    """``y = W_o sum_t a_t ReLU(W_h x_t)``: a token-wise MLP pooled with given weights
    (``weights="learned"`` adds its own additive attention ``a = softmax(v^T tanh(W h_t))``)."""

    def __init__(
        self,
        embeddings: Tensor,
        num_classes: int,
        hidden: int = 64,
        *,
        learned: bool = False,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(embeddings.float(), freeze=True)
        self.hidden = nn.Linear(embeddings.shape[1], hidden)
        self.output = nn.Linear(hidden, num_classes)
        self.attn = None
        if learned:
            from attnlab import Attention

            self.attn = Attention("queryless", "soft", d_k=hidden, d_w=hidden)

    def forward(self, tokens: Tensor, lengths: Tensor, weights: Tensor | None) -> Tensor:
        m = _mask(tokens, lengths)
        h = torch.relu(self.hidden(self.embedding(tokens))) * m[..., None]
        if self.attn is not None:
            weights = self.attn(None, h, mask=m[:, None, :], need_weights=True).weights
            weights = weights.reshape(h.shape[:2])
        if weights is None:
            raise ValueError("give weights, or build the MLP with learned=True")
        return self.output((weights[..., None] * h).sum(1))


def frozen_weight_diagnostic(
    embeddings: Tensor,
    num_classes: int,
    train: Sequence[Batch],
    test: Sequence[Batch],
    weights: str | Callable[[Tensor, Tensor], Tensor],
    *,
    epochs: int = 5,
    lr: float = 1e-3,
    hidden: int = 64,
    seed: int = 0,
) -> dict[str, float]:
    """Train a :class:`FrozenWeightMLP` with weights from ``weights`` ("uniform",
    "learned", or a function ``(tokens, lengths) -> [B, n]`` such as a trained model's
    attention) and return its test accuracy and macro F1."""
    torch.manual_seed(seed)
    learned = weights == "learned"
    mlp = FrozenWeightMLP(embeddings, num_classes, hidden, learned=learned)
    mlp.to(embeddings.device)

    def source(tokens: Tensor, lengths: Tensor) -> Tensor | None:
        if learned:
            return None
        if weights == "uniform":
            return _uniform(lengths, tokens.shape[1])
        if callable(weights):
            with torch.no_grad():
                return weights(tokens, lengths).detach()
        raise ValueError(f"weights must be 'uniform', 'learned' or a function, got {weights!r}")

    cache = [source(t, n) for t, n, _ in train]
    opt = torch.optim.Adam([p for p in mlp.parameters() if p.requires_grad], lr=lr)
    for _ in range(epochs):
        for (tokens, lengths, labels), w in zip(train, cache, strict=True):
            loss = nn.functional.cross_entropy(mlp(tokens, lengths, w), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
    mlp.eval()
    preds, gold = [], []
    with torch.no_grad():
        for tokens, lengths, labels in test:
            preds.append(mlp(tokens, lengths, source(tokens, lengths)).argmax(-1))
            gold.append(labels)
    p, y = torch.cat(preds).cpu().numpy(), torch.cat(gold).cpu().numpy()
    return {"accuracy": float((p == y).mean()), "f1": float(f1_score(y, p, average="macro"))}


@dataclass
class AdversarialModelResult:
    """One point of the adversarial training sweep: mean TVD of outputs and mean JSD of
    attention against the base model on the test batches, and the adversarial model."""

    lam: float
    mean_tvd: float
    mean_jsd: float
    accuracy: float
    model: nn.Module


def adversarial_model(
    base: nn.Module,
    train: Sequence[Batch],
    test: Sequence[Batch],
    lam: float,
    *,
    epochs: int = 3,
    lr: float = 1e-3,
    seed: int = 0,
) -> AdversarialModelResult:
    """Train a copy of ``base`` (re-initialised attention, same encoder start) with the
    loss ``mean(TVD(y_adv, y_base) - lam * JSD(a_adv, a_base))`` (Wiegreffe & Pinter's
    adversarial setup) and measure how far its attention moved for how much output change."""
    torch.manual_seed(seed)
    base.eval()
    adv = copy.deepcopy(base)
    if getattr(adv, "attention", None) is not None:
        for p in adv.attention.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            else:
                nn.init.normal_(p, std=0.1)
    adv.train()
    opt = torch.optim.Adam(adv.parameters(), lr=lr)
    targets = [attention_weights(base, t, n) for t, n, _ in train]
    for _ in range(epochs):
        for (tokens, lengths, _labels), (w0, p0) in zip(train, targets, strict=True):
            m = _mask(tokens, lengths)
            out = adv.classify(adv.encode(tokens, m), m)
            loss = (tvd(out.logits.softmax(-1), p0) - lam * jsd(out.weights, w0)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    adv.eval()
    tv, js, correct, total = [], [], 0, 0
    for tokens, lengths, labels in test:
        w0, p0 = attention_weights(base, tokens, lengths)
        w, p = attention_weights(adv, tokens, lengths)
        tv.append(tvd(p, p0))
        js.append(jsd(w, w0))
        correct += int((p.argmax(-1) == labels).sum())
        total += int(labels.numel())
    return AdversarialModelResult(
        lam=lam,
        mean_tvd=float(torch.cat(tv).mean()),
        mean_jsd=float(torch.cat(js).mean()),
        accuracy=correct / max(total, 1),
        model=adv,
    )


def as_batches(
    tokens: Sequence[Sequence[int]], labels: Sequence[int], batch_size: int = 32
) -> list[Batch]:
    """``(tokens, lengths, labels)`` batches from token-id lists (padding id 0)."""
    out = []
    for start in range(0, len(tokens), batch_size):
        chunk = tokens[start : start + batch_size]
        n = max(max((len(t) for t in chunk), default=1), 1)
        x = torch.zeros(len(chunk), n, dtype=torch.long)
        for i, t in enumerate(chunk):
            x[i, : len(t)] = torch.as_tensor(list(t), dtype=torch.long)
        lengths = torch.tensor([len(t) for t in chunk])
        y = torch.as_tensor(np.asarray(labels[start : start + batch_size]), dtype=torch.long)
        out.append((x, lengths, y))
    return out
