"""The ``multilabel`` task: Debian package descriptions labelled with their debtags, by the
capsule multi-label classifier (:class:`attnlab.models.multilabel.CapsuleClassifier`).

Data: :func:`attnlab.data.debtags.load_debtags` (the descriptions of the Debian packages
that carry debtags of the facets ``use``, ``works-with``, ``field``, ``interface`` and
``implemented-in``; the tags carried by at least ``min_count`` packages are the labels;
split by source package). Tokens: :func:`attnlab.data.simple_tokenize`, lower-cased, the
first ``max_len``; the vocabulary is the training tokens seen ``min_freq`` times; the
embeddings are GloVe 6B 50-d (``glove=True``) or learned.

Attention specs (``--attention``): ``name=routing`` (default: dynamic routing, one capsule
per label, Zhao et al. 2019), ``name=routing-orphan`` (with an orphan capsule),
``name=capsule-attention`` (per-label attention pooling, Wang et al. 2018), or any
``score=...,align=...`` (per-label attention with that score and alignment); routing keys
``iterations=``, ``d_caps=``, ``orphan=``; the baselines ``mean`` (mean pooling + linear
multi-label head) and ``uniform`` (routing with every label's weights ``1/n``).

Metrics (threshold ``p_l > 0.5``): micro-F1 (the selection metric), macro-F1 (over every
label, a label never predicted nor present counting 0), subset accuracy (the exact label
set) and the Hamming loss (the share of wrong label decisions; lower is better), all from
scikit-learn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data._common import simple_tokenize
from attnlab.data.vocab import Vocab
from attnlab.lab.batching import pad_ids, token_batch
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.lab.tasks._shared import (
    SequenceTask,
    check_size_limits,
    evaluating,
    named_attention,
)
from attnlab.models.multilabel import LOSSES, CapsuleClassifier

__all__ = [
    "EncodedSplit",
    "MultiLabelTask",
    "first_texts",
    "subsample",
    "subsampled_parts",
    "text_outputs",
]


@dataclasses.dataclass(frozen=True)
class EncodedSplit:
    """One split as the models read it.

    Attributes:
        tokens: per text, its tokens (lower-cased, at most ``max_len``).
        ids: per text, the token ids in the task vocabulary.
        labels: per text, the sorted label indices (multi-label) or one class index.
        names: per text, the source's id (a package name).
    """

    tokens: tuple[tuple[str, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    labels: tuple[Any, ...]
    names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def encode(
        cls,
        tokens: Sequence[tuple[str, ...]],
        vocab: Vocab,
        labels: Iterable[Any],
        names: Iterable[str],
    ) -> EncodedSplit:
        """The split of the texts ``tokens``, their ids in ``vocab`` beside them."""
        ids = tuple(tuple(vocab.encode(t)) for t in tokens)
        return cls(tuple(tokens), ids, tuple(labels), tuple(names))


def subsample(n: int, limit: int | None, seed: int) -> list[int]:
    """``limit`` of the indices ``0..n-1`` chosen with ``seed``, in increasing order (all of
    them when ``limit`` is None or at least ``n``)."""
    if limit is None or limit >= n:
        return list(range(n))
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"size limits must be ints >= 1 or None, got {limit!r}")
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(n, size=limit, replace=False).tolist())


def tokenize(text: str, max_len: int | None) -> tuple[str, ...]:
    """The lower-cased tokens of ``text``, the first ``max_len`` (all when None)."""
    return tuple(simple_tokenize(text, lower=True)[:max_len])


def subsampled_parts(dataset: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The ``train``, ``dev`` and ``test`` parts of ``dataset`` (``dataset.split(name)``,
    cut with ``part.subset(indices)``) within the options ``max_train`` (train) and
    ``max_eval`` (dev, test), subsampled with ``data_seed`` (:func:`subsample`)."""
    parts = {}
    for name in ("train", "dev", "test"):
        part = dataset.split(name)
        limit = options["max_train"] if name == "train" else options["max_eval"]
        parts[name] = part.subset(subsample(len(part), limit, options["data_seed"]))
    return parts


def text_outputs(
    task: Task, model: nn.Module, data: TaskData, split: str
) -> Iterator[tuple[dict[str, Any], Any]]:
    """``(batch, model(tokens, lengths))`` for each batch of ``split`` (``batch_size`` of
    the task's options), the model in eval mode under no_grad (:func:`evaluating`)."""
    device = next(model.parameters()).device
    with evaluating(model):
        for batch in task.batches(data, split, int(task.options["batch_size"])):
            yield batch, model(batch["tokens"].to(device), batch["lengths"].to(device))


def first_texts(model: nn.Module, part: EncodedSplit, n: int) -> tuple[list[int], Any]:
    """The indices of the first ``n`` non-empty texts of ``part`` and the model's output on
    them (one padded batch, eval mode, no_grad); ``([], None)`` when there is none."""
    chosen = [i for i in range(len(part)) if part.ids[i]][:n]
    if not chosen:
        return [], None
    device = next(model.parameters()).device
    tokens, lengths = pad_ids([part.ids[i] for i in chosen])
    with evaluating(model):
        return chosen, model(tokens.to(device), lengths.to(device))


_CACHE: dict[tuple, TaskData] = {}


@register_task("multilabel", aliases=("debtags",))
class MultiLabelTask(SequenceTask):
    """Multi-label classification of Debian package descriptions (debtags) with capsules.

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: the capsule
    sizes of Zhao et al. (2019, ACL) -- 16-d capsules, 3 routing iterations -- over
    untruncated descriptions and every training package. Not reproduced (as their
    released code, NLP-Capsule, trains; the paper's set-up section was not available to
    check): their n-gram convolutional capsule layers (a BiLSTM here), their routing by
    adaptive kernel density estimation (iterated until it converges; dynamic routing by
    agreement here), the compression of the capsules, the binary cross-entropy loss (the
    margin loss here), 300-d embeddings (GloVe 50-d), texts cut at 500 words, batches of
    256 and Adam 1e-3 with decay over 30 epochs (the task's defaults here), and their data
    (EUR-Lex / RCV1).

    :formula: h = BiLSTM(GloVe(w_1..w_n)); u_(l|i) = W_l h_i; T times: c_li = softmax_l(b_li),
        v_l = squash(sum_i c_li u_(l|i)), b_li += u_(l|i) . v_l; predict label l iff |v_l| > 0.5
    :source: Zhao et al. 2019, Towards Scalable and Reliable Capsule Networks for Challenging
        NLP Applications; Sabour et al. 2017, Dynamic Routing Between Capsules
    :cost: encoder O(B n d_e h) + routing O(B n L d_h d_caps) per batch, L = number of labels
    """

    metrics = ("micro_f1", "macro_f1", "subset_accuracy", "hamming_loss")
    higher_is_better = True
    data_source = "Debian package descriptions with debtags (apt lists; attnlab.data.debtags)"
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "d_caps": 16,
            "iterations": 3,
            "max_len": None,
            "max_train": None,
            "bucket": True,
        },
    }
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 8,
        "batch_size": 64,
        "lr": 2e-3,
        "max_train": None,
        "max_eval": None,
        "max_len": 48,
        "min_count": 50,
        "max_labels": None,
        "min_freq": 2,
        "glove": True,
        "embed_dim": 50,
        "freeze_embeddings": False,
        "encoder": "lstm",
        "hidden_size": 64,
        "d_caps": 16,
        "iterations": 3,
        "loss": None,
        "dropout": 0.2,
        "threshold": 0.5,
        "data_seed": 0,
        "bucket": False,
    }
    default_attention: ClassVar[dict[str, Any]] = {"routing": True}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "routing": {"routing": True},
        "routing-orphan": {"routing": True, "orphan": True},
        "routing-1": {"routing": True, "iterations": 1},
        "capsule-attention": {"score": "dot", "align": "soft"},
        "additive": {"score": "additive", "align": "soft"},
        "sparsemax": {"score": "dot", "align": "sparsemax"},
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # before any data is read (None: no limit, the paper's); max_labels=0 failed late,
        # reported as a min_count problem
        check_size_limits(self, "max_len", "max_labels")
        self.check_int_options("min_count", "min_freq", "embed_dim")
        # the model options, before any data is read (they failed when the model was built)
        self.check_option_choice("encoder", CapsuleClassifier.encoder_names)
        self.check_int_options("d_caps", "iterations")
        self.check_option_choice("loss", LOSSES)
        # a probability threshold: -1 or 1.5 gave every label or none, and metrics of nothing
        self.check_number_options("threshold", low=0.0, high=1.0, open_low=True, open_high=True)

    # ------------------------------------------------------------------ data

    def load_data(self) -> TaskData:
        from attnlab.data.debtags import load_debtags

        o = self.options
        names = ("max_train", "max_eval", "max_len", "min_count", "max_labels", "min_freq")
        key = tuple(o[k] for k in (*names, "glove", "embed_dim", "data_seed"))
        if key in _CACHE:
            return _CACHE[key]
        try:
            ds = load_debtags(min_count=o["min_count"], max_labels=o["max_labels"], seed=0)
        except ValueError as error:  # no tag reaches min_count: a bad option, one line
            raise ConfigError(f"option min_count: {error}") from None
        splits = {
            name: (part.texts, part.label_sets, part.ids)
            for name, part in subsampled_parts(ds, o).items()
        }
        data = self.prepare(splits, ds.label_names, source=ds.name)
        _CACHE[key] = data
        return data

    def prepare(
        self,
        splits: Mapping[str, tuple[Sequence[str], Sequence[Sequence[int]], Sequence[str]]],
        label_names: Sequence[str],
        *,
        source: str = "",
        vectors: Any = "default",
    ) -> TaskData:
        """A :class:`TaskData` from raw ``splits`` (``name -> (texts, label_sets, ids)``,
        for ``train``, ``dev`` and ``test``): tokenise, build the vocabulary on the train
        texts, encode, and look up the GloVe rows (``glove=True``; ``vectors`` may give other
        :class:`~attnlab.data.WordVectors`, or None for learned embeddings)."""
        o = self.options
        tokens = {k: [tokenize(t, o["max_len"]) for t in v[0]] for k, v in splits.items()}
        vocab = Vocab.from_corpus(tokens["train"], min_freq=o["min_freq"])
        matrix = None
        if vectors == "default":
            vectors = None
            if o["glove"]:
                from attnlab.data.glove import load_glove

                vectors = load_glove()
        if vectors is not None:
            matrix = vectors.restrict_to(vocab, seed=o["data_seed"]).matrix
        encoded = {}
        L = len(label_names)
        for name in ("train", "dev", "test"):
            _, label_sets, ids = splits[name]
            for labels in label_sets:
                if any(not 0 <= lab < L for lab in labels):
                    raise ValueError(f"{name}: label set {labels!r} outside [0, {L})")
            label_ids = (tuple(sorted(s)) for s in label_sets)
            encoded[name] = EncodedSplit.encode(tokens[name], vocab, label_ids, ids)
        info = {
            "vocab": vocab,
            "embeddings": matrix,
            "label_names": tuple(label_names),
            "num_labels": L,
            "source": source,
        }
        return TaskData(encoded["train"], encoded["dev"], encoded["test"], info)

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        att = named_attention(self, attention)
        matrix = data.info.get("embeddings")
        vocab = data.info["vocab"]
        return CapsuleClassifier(
            len(vocab),
            data.info["num_labels"],
            embed_dim=None if matrix is not None else o["embed_dim"],
            embeddings=matrix,
            freeze_embeddings=o["freeze_embeddings"],
            padding_idx=vocab.pad_index,
            encoder=o["encoder"],
            hidden_size=o["hidden_size"],
            attention=att,
            d_caps=o["d_caps"],
            iterations=o["iterations"],
            loss=o["loss"],
            dropout=o["dropout"],
        )

    # ------------------------------------------------------------------ batches

    def make_batch(self, data: TaskData, part: EncodedSplit, idx: list[int]) -> dict[str, Any]:
        targets = torch.zeros(len(idx), data.info["num_labels"])
        for row, i in enumerate(idx):
            targets[row, list(part.labels[i])] = 1.0
        return {**token_batch(part.ids, idx), "targets": targets}

    def loss(self, model: nn.Module, batch: Mapping[str, Any]) -> Tensor:
        out = model(batch["tokens"], batch["lengths"])
        return model.loss(out, batch["targets"])

    def predict(self, model: nn.Module, data: TaskData, split: str) -> tuple[np.ndarray, ...]:
        """``(probabilities [N, L], gold [N, L])`` of a split."""
        probs, gold = [], []
        for batch, out in text_outputs(self, model, data, split):
            probs.append(out.probs.float().cpu().numpy())
            gold.append(batch["targets"].numpy())
        L = data.info["num_labels"]
        if not probs:
            return np.zeros((0, L), np.float32), np.zeros((0, L), np.float32)
        return np.concatenate(probs), np.concatenate(gold)

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        from sklearn.metrics import accuracy_score, f1_score, hamming_loss

        probs, gold = self.predict(model, data, split)
        pred = (probs > float(self.options["threshold"])).astype(np.int64)
        y = gold.astype(np.int64)
        if len(y) == 0:
            return {m: float("nan") for m in self.metrics}
        return {
            "micro_f1": float(f1_score(y, pred, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(y, pred, average="macro", zero_division=0)),
            "subset_accuracy": float(accuracy_score(y, pred)),
            "hamming_loss": float(hamming_loss(y, pred)),
        }

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        part: EncodedSplit = data.test
        names = data.info["label_names"]
        chosen, out = first_texts(model, part, n)
        threshold = float(self.options["threshold"])
        examples = []
        for row, i in enumerate(chosen):
            k = len(part.ids[i])
            p = out.probs[row].float().cpu()
            order = torch.argsort(p, descending=True).tolist()
            shown = [c for c in order if p[c] > threshold][:4] or order[:1]
            if out.weights is not None:
                w = out.weights[row][:, :k].float().cpu()
                weights = [[float(x) for x in w[c]] for c in shown]
            else:
                weights = [[1.0 / k] * k for _ in shown]
            predicted = [names[c] for c in order if p[c] > threshold]
            examples.append(
                AttentionExample(
                    title=f"test #{i}: {part.names[i]}",
                    rows=[f"{names[c]} ({float(p[c]):.2f})" for c in shown],
                    cols=list(part.tokens[i]),
                    weights=weights,
                    label=", ".join(names[c] for c in part.labels[i]),
                    prediction=", ".join(predicted) or "(none)",
                    kind="matrix",
                    extra={
                        "probabilities": {names[c]: round(float(p[c]), 4) for c in order[:8]},
                        "weights": "routing couplings c_li (per token over the labels)"
                        if getattr(model, "head", None) == "routing" and not model.uniform
                        else "per-label weights over the tokens",
                    },
                )
            )
        return examples
