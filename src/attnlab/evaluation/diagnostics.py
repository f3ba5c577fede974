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

Each function's defaults are the lab's quick settings; the arguments that follow
Wiegreffe & Pinter's code (github.com/sarahwie/attention) are named in its docstring
(``attnlab explain --protocol paper`` sets them): the frozen-weight MLP with fine-tuned
pretrained embeddings, a tanh projection of 128, one sigmoid output with the class-weighted
loss and the best epoch by dev ROC-AUC; the adversarial model trained from a fresh
initialisation with ``KL(a_adv || a_base)`` and the class-weighted loss, weight decay but on
the attention, up to 80 epochs, stopped after 10 without a lower training loss; both on
training batches drawn anew every epoch (``train`` as a function of the epoch); the seed
variance as per-instance medians over the other seeds.

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

# the unchecked forms: the weights and outputs are the studies' own (divergences.py)
from attnlab.evaluation.divergences import _jsd, _kl, _tvd
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
#: Training batches: a fixed list seen in the same order every epoch, or a function
#: ``epoch -> that epoch's batches`` (epochs count from 1; Wiegreffe & Pinter re-sort the
#: training set by length and reshuffle its batches every epoch).
TrainBatches = Sequence[Batch] | Callable[[int], Iterable[Batch]]


def _with(
    train: TrainBatches, extra: Callable[[Tensor, Tensor], object]
) -> Callable[[int], list[tuple[Batch, object]]]:
    """``epoch -> [(batch, extra(tokens, lengths))]`` over ``train``'s batches of that
    epoch: computed once for a fixed list (seen alike every epoch), afresh every epoch for
    a function."""
    if callable(train):
        return lambda epoch: [(b, extra(b[0], b[1])) for b in train(epoch)]
    fixed = [(b, extra(b[0], b[1])) for b in train]
    return lambda epoch: fixed


def binary_f1(y: np.ndarray, p: np.ndarray) -> float | None:
    """F1 of the positive class (label 1) for two-class labels, else None."""
    if set(np.unique(np.concatenate([y, p]))) - {0, 1}:
        return None
    return float(f1_score(y, p, pos_label=1, zero_division=0))


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
    jsds, tvds, max_w, med_jsd, mean_tvd = [], [], [], [], []
    for tokens, lengths, _labels in batches:
        w0, p0 = attention_weights(models[0], tokens, lengths)
        per_model_j, per_model_t = [], []
        for other in models[1:]:
            w, p = attention_weights(other, tokens, lengths)
            per_model_j.append(_jsd(w, w0))
            per_model_t.append(_tvd(p, p0))
            jsds.append(per_model_j[-1])
            tvds.append(per_model_t[-1])
            max_w.append(w0.max(-1).values)
        # per instance over the other seeds: W&P's seed_graphs (median JSD, mean change)
        # (the median of an even count: the mean of the middle two, as np.median)
        med_jsd.append(torch.quantile(torch.stack(per_model_j), 0.5, dim=0))
        mean_tvd.append(torch.stack(per_model_t).mean(0))
    j, t = torch.cat(jsds), torch.cat(tvds)
    mj, mt = torch.cat(med_jsd), torch.cat(mean_tvd)
    return {
        "jsd": j.tolist(),
        "tvd": t.tolist(),
        "base_max_weight": torch.cat(max_w).tolist(),
        "mean_jsd": float(j.mean()),
        "mean_tvd": float(t.mean()),
        "instance_median_jsd": mj.tolist(),
        "instance_mean_tvd": mt.tolist(),
        "mean_instance_median_jsd": float(mj.mean()),
    }


class FrozenWeightMLP(nn.Module):
    """``y = W_o sum_t a_t f(W_h x_t)``: a token-wise MLP pooled with given weights
    (``weights="learned"`` adds its own additive attention ``a = softmax(v^T tanh(W h_t))``
    with ``attention_dim`` units, default ``hidden``).

    ``activation``: ``f`` = ``"relu"`` or ``"tanh"`` (Wiegreffe & Pinter's ``average``
    encoder); ``freeze_embeddings=False`` fine-tunes the embeddings (as they do);
    ``output``: the output layer ``W_o`` (``hidden`` features in, ``[..., num_classes]``
    logits out; default ``nn.Linear(hidden, num_classes)``), e.g. a one-logit sigmoid
    output as theirs."""

    def __init__(
        self,
        embeddings: Tensor,
        num_classes: int,
        hidden: int = 64,
        *,
        learned: bool = False,
        activation: str = "relu",
        freeze_embeddings: bool = True,
        attention_dim: int | None = None,
        output: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}")
        # a copy: fine-tuning must not write into the caller's tensor (a model's weights)
        table = embeddings.detach().float().clone()
        self.embedding = nn.Embedding.from_pretrained(table, freeze=freeze_embeddings)
        self.hidden = nn.Linear(embeddings.shape[1], hidden)
        self.output = output if output is not None else nn.Linear(hidden, num_classes)
        self.activation = torch.tanh if activation == "tanh" else torch.relu
        self.attn = None
        if learned:
            from attnlab import Attention

            self.attn = Attention("queryless", "soft", d_k=hidden, d_w=attention_dim or hidden)

    def forward(self, tokens: Tensor, lengths: Tensor, weights: Tensor | None) -> Tensor:
        m = _mask(tokens, lengths)
        h = self.activation(self.hidden(self.embedding(tokens))) * m[..., None]
        if self.attn is not None:
            weights = self.attn(None, h, mask=m[:, None, :], need_weights=True).weights
            weights = weights.reshape(h.shape[:2])
        if weights is None:
            raise ValueError("give weights, or build the MLP with learned=True")
        return self.output((weights[..., None] * h).sum(1))

    def attention_parameters(self) -> list[nn.Parameter]:
        """The parameters of its own attention (``learned=True``; else none): those the
        paper's optimiser leaves without weight decay."""
        return [] if self.attn is None else list(self.attn.parameters())


def frozen_weight_diagnostic(
    embeddings: Tensor,
    num_classes: int,
    train: TrainBatches,
    test: Sequence[Batch],
    weights: str | Callable[[Tensor, Tensor], Tensor],
    *,
    epochs: int = 5,
    lr: float = 1e-3,
    hidden: int = 64,
    seed: int = 0,
    dev: Sequence[Batch] | None = None,
    activation: str = "relu",
    freeze_embeddings: bool = True,
    attention_dim: int | None = None,
    amsgrad: bool = False,
    weight_decay: float = 0.0,
    output: Callable[[int], nn.Module] | None = None,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> dict[str, float | None]:
    """Train a :class:`FrozenWeightMLP` with weights from ``weights`` ("uniform",
    "learned", or a function ``(tokens, lengths) -> [B, n]`` such as a trained model's
    attention) and return its test ``accuracy``, macro ``f1``, ``f1_positive`` (the
    positive class's F1 for two classes, else None) and ``epoch`` (the epoch kept).

    ``dev``: keep the epoch with the best dev ROC-AUC (accuracy for more than two classes)
    instead of the last. Wiegreffe & Pinter's settings: ``hidden=128``,
    ``activation="tanh"``, ``freeze_embeddings=False``, ``attention_dim=64``, ``epochs=8``,
    ``lr=1e-3``, ``amsgrad=True``, ``weight_decay=1e-5`` (none on the attention), batches
    of 32 re-sorted by length and reshuffled every epoch (``train`` as a function of the
    epoch), one sigmoid output (``output``) and the class-weighted binary cross-entropy
    summed over a batch (``loss``), and the best epoch by ROC-AUC (they select on the test
    split; give ``dev``).

    ``train``: the training batches (:data:`TrainBatches`); ``output``: ``hidden ->`` the
    MLP's output layer (default a linear layer to ``num_classes`` logits); ``loss``:
    ``(logits [B, C], labels [B]) ->`` the batch's loss (default: the mean cross-entropy).
    The weights of a source are computed afresh for every batch, without gradient.
    """
    torch.manual_seed(seed)
    learned = weights == "learned"
    mlp = FrozenWeightMLP(
        embeddings,
        num_classes,
        hidden,
        learned=learned,
        activation=activation,
        freeze_embeddings=freeze_embeddings,
        attention_dim=attention_dim,
        output=output(hidden) if output is not None else None,
    )
    mlp.to(embeddings.device)

    source = _weight_source(weights)
    batch_loss = loss if loss is not None else nn.functional.cross_entropy
    epoch_batches = _with(train, source)
    opt = _optimizer(mlp, lr, amsgrad, weight_decay)
    best: tuple[float, int, dict[str, Tensor]] | None = None
    for epoch in range(1, epochs + 1):
        for (tokens, lengths, labels), w in epoch_batches(epoch):
            value = batch_loss(mlp(tokens, lengths, w), labels)
            opt.zero_grad()
            value.backward()
            opt.step()
        if dev is not None:
            score = _selection_score(*_predict(mlp, dev, source))
            if best is None or score > best[0]:
                state = {k: v.detach().clone() for k, v in mlp.state_dict().items()}
                best = (score, epoch, state)
    kept = epochs
    if best is not None:
        mlp.load_state_dict(best[2])
        kept = best[1]
    probs, y = _predict(mlp, test, source)
    p = probs.argmax(-1)
    return {
        "accuracy": float((p == y).mean()),
        "f1": float(f1_score(y, p, average="macro")),
        "f1_positive": binary_f1(y, p) if num_classes == 2 else None,
        "epoch": kept,
    }


def _weight_source(
    weights: str | Callable[[Tensor, Tensor], Tensor],
) -> Callable[[Tensor, Tensor], Tensor | None]:
    """``(tokens, lengths) -> [B, n]`` weights for the MLP: ``None`` (learned), uniform
    over the real tokens, or the given function's (no gradient)."""

    def source(tokens: Tensor, lengths: Tensor) -> Tensor | None:
        if weights == "learned":
            return None
        if weights == "uniform":
            return _uniform(lengths, tokens.shape[1])
        if callable(weights):
            with torch.no_grad():
                return weights(tokens, lengths).detach()
        raise ValueError(f"weights must be 'uniform', 'learned' or a function, got {weights!r}")

    return source


def _optimizer(
    module: nn.Module, lr: float, amsgrad: bool, weight_decay: float
) -> torch.optim.Optimizer:
    """Adam with ``weight_decay`` on every trainable parameter but the attention's (the
    module's ``attention_parameters()`` when it has them, else those of a submodule named
    ``attention``: Jain & Wallace's and Wiegreffe & Pinter's optimisers)."""
    own = getattr(module, "attention_parameters", None)
    if callable(own):
        attn = {id(p) for p in own()}
    else:
        attn = {id(p) for n, p in module.named_parameters() if "attention" in n.split(".")}
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if id(p) not in attn], "weight_decay": weight_decay},
        {"params": [p for p in params if id(p) in attn], "weight_decay": 0.0},
    ]
    return torch.optim.Adam([g for g in groups if g["params"]], lr=lr, amsgrad=amsgrad)


def _predict(
    mlp: nn.Module, batches: Sequence[Batch], source: Callable[[Tensor, Tensor], Tensor | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities and gold labels over ``batches`` (eval mode, then back)."""
    mlp.eval()
    probs, gold = [], []
    with torch.no_grad():
        for tokens, lengths, labels in batches:
            probs.append(mlp(tokens, lengths, source(tokens, lengths)).softmax(-1))
            gold.append(labels)
    mlp.train()
    return torch.cat(probs).float().cpu().numpy(), torch.cat(gold).cpu().numpy()


def _selection_score(probs: np.ndarray, y: np.ndarray) -> float:
    """ROC-AUC of the positive class for two classes (accuracy when a split has one class
    or there are more classes): how Wiegreffe & Pinter pick the epoch."""
    if probs.shape[1] == 2 and len(np.unique(y)) == 2:
        from sklearn.metrics import roc_auc_score

        return float(roc_auc_score(y, probs[:, 1]))
    return float((probs.argmax(-1) == y).mean())


@dataclass
class AdversarialModelResult:
    """One point of the adversarial training sweep: mean TVD of outputs and mean JSD of
    attention against the base model on the test batches, and the adversarial model;
    ``epochs_run`` epochs were trained and the state of epoch ``kept_epoch`` is kept."""

    lam: float
    mean_tvd: float
    mean_jsd: float
    accuracy: float
    model: nn.Module
    epochs_run: int = 0
    kept_epoch: int = 0


def adversarial_model(
    base: nn.Module,
    train: TrainBatches,
    test: Sequence[Batch],
    lam: float,
    *,
    epochs: int = 3,
    lr: float = 1e-3,
    seed: int = 0,
    fresh: nn.Module | None = None,
    divergence: str = "jsd",
    patience: int | None = None,
    amsgrad: bool = False,
    weight_decay: float = 0.0,
    instance_weights: Callable[[Tensor], Tensor] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> AdversarialModelResult:
    """Train a model whose attention moves away from ``base``'s while its output stays
    close, with the loss ``TVD(y_adv, y_base) - lam * D(a_adv, a_base)`` per instance, and
    measure how far its attention moved (mean JSD) for how much output change (mean TVD)
    on ``test``.

    Default (the lab's quick version): a copy of ``base`` with its attention re-initialised,
    ``D`` = JSD, the loss averaged over a batch, ``epochs`` epochs, the last one kept.

    Wiegreffe & Pinter's version: ``fresh`` = a newly initialised model of the same
    architecture (they train it from scratch), ``divergence="kl"`` (``KL(a_adv ||
    a_base)``), ``patience=10`` with ``epochs=80`` (stop after 10 epochs without a lower
    training loss; the epoch with the lowest training loss is kept), ``amsgrad=True``,
    ``weight_decay=1e-5`` (none on the attention: the model's ``attention_parameters()``,
    else a submodule named ``attention``), ``instance_weights`` = the class weights of
    their loss (``labels [B] -> [B]``: ``#neg / #pos`` on the positive examples, 1 on the
    others) and ``train`` re-sorted and reshuffled every epoch (a function of the epoch:
    :data:`TrainBatches`); the loss is then summed over a batch, as theirs. (Their TVD is
    taken on the one sigmoid output, half the TVD of the two-class distribution used here:
    a ``lambda`` here is twice theirs, ``lambda = 1`` here is their 0.5.)

    ``on_epoch(epoch, loss)``, when given, is called after every epoch with its summed
    training loss (e.g. to advance a progress bar: up to 80 epochs take minutes).
    """
    if divergence not in ("jsd", "kl"):
        raise ValueError(f"divergence must be 'jsd' or 'kl', got {divergence!r}")
    torch.manual_seed(seed)
    base.eval()
    adv = fresh if fresh is not None else _with_fresh_attention(base)
    adv.train()
    opt = _optimizer(adv, lr, amsgrad, weight_decay)
    epoch_batches = _with(train, lambda tokens, lengths: attention_weights(base, tokens, lengths))
    move = _jsd if divergence == "jsd" else _kl
    reduce = (lambda x: x.sum()) if fresh is not None else (lambda x: x.mean())
    best_loss, best_state, stale, kept, run = float("inf"), None, 0, epochs, 0
    for epoch in range(1, epochs + 1):
        run = epoch
        total = 0.0
        for (tokens, lengths, labels), (w0, p0) in epoch_batches(epoch):
            m = _mask(tokens, lengths)
            out = adv.classify(adv.encode(tokens, m), m)
            per = _tvd(out.logits.softmax(-1), p0) - lam * move(out.weights, w0)
            if instance_weights is not None:
                per = per * instance_weights(labels).to(per)
            loss = reduce(per)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach())
        if on_epoch is not None:
            on_epoch(epoch, total)
        if patience is None:
            continue
        if total < best_loss:
            best_loss, stale, kept = total, 0, epoch
            best_state = {k: v.detach().clone() for k, v in adv.state_dict().items()}
        else:
            stale += 1
            if stale >= patience:
                break
    if best_state is not None:
        adv.load_state_dict(best_state)
    adv.eval()
    mean_tvd, mean_jsd, accuracy = _moved(base, adv, test)
    return AdversarialModelResult(
        lam=lam,
        mean_tvd=mean_tvd,
        mean_jsd=mean_jsd,
        accuracy=accuracy,
        model=adv,
        epochs_run=run,
        kept_epoch=kept,
    )


def _with_fresh_attention(base: nn.Module) -> nn.Module:
    """A copy of ``base`` with its attention's parameters re-initialised (Xavier for
    matrices, N(0, 0.1^2) for vectors)."""
    adv = copy.deepcopy(base)
    if getattr(adv, "attention", None) is not None:
        for p in adv.attention.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            else:
                nn.init.normal_(p, std=0.1)
    return adv


def _moved(base: nn.Module, adv: nn.Module, test: Sequence[Batch]) -> tuple[float, float, float]:
    """Mean TVD of the outputs, mean JSD of the attention (``adv`` against ``base``) and
    ``adv``'s accuracy on ``test``."""
    tv, js, correct, total_n = [], [], 0, 0
    for tokens, lengths, labels in test:
        w0, p0 = attention_weights(base, tokens, lengths)
        w, p = attention_weights(adv, tokens, lengths)
        tv.append(_tvd(p, p0))
        js.append(_jsd(w, w0))
        correct += int((p.argmax(-1) == labels).sum())
        total_n += int(labels.numel())
    return float(torch.cat(tv).mean()), float(torch.cat(js).mean()), correct / max(total_n, 1)


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
