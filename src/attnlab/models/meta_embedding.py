"""A sentence classifier over dynamic meta-embeddings, the meta-embedding attention swappable.

The survey's general task model (TAXONOMY section 0) whose feature model is itself an
attention (multi-representational attention, survey section 3.1.3): each token has ``E``
word vectors from different pretrained tables (GloVe, spaCy, ...), and an attention over
those ``E`` representations decides, token by token, how much each table contributes
(Kiela, Wang & Cho 2018):

    x_ti = W_i E_i[w_t] + b_i                       projection of table i to d'   [B, n, E, d']
    alpha_ti = align_i(score(x_ti))  (DME)  or  align_i(score(BiLSTM_i(x_t1..x_tn)_t))  (CDME)
    x_t = sum_i alpha_ti x_ti                        the meta-embedding             [B, n, d']
    h = BiRNN(x_1..x_n);  a = align(score(h_t));  c = sum_t a_t h_t;  y = W_o c + b_o

The meta-embedding attention is chosen by ``meta=``: ``"dme"`` (default;
:class:`attnlab.feature.meta_embedding.DME`), ``"cdme"``
(:class:`~attnlab.feature.meta_embedding.CDME`), a dict ``{"meta": "dme" | "cdme",
"align": ..., **score options}``, or the baselines ``"mean"`` (the unweighted average of the
projected embeddings available for the token; no attention parameters), ``"uniform"``
(the DME module with its weights replaced by ``1/E_t`` over the ``E_t`` tables available
for the token) and ``"concat"`` (the concatenation of the projections, ``[B, n, E d']``; no
weights). The pooling over the tokens and the output layer are those of
:class:`attnlab.models.sentence.SentenceClassifier` (``pooling=`` takes its attention specs:
``"tanh"`` (default), a dict, ``"mean"``, ``"uniform"``).

Source: Kiela, Wang & Cho 2018, Dynamic Meta-Embeddings for Improved Sentence
Representations (EMNLP).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab._deprecation import deprecated_attribute
from attnlab.feature.meta_embedding import CDME, DME
from attnlab.feature.multilevel import MaskedRNN
from attnlab.models._embedding import as_matrix
from attnlab.models._inputs import (
    check_choice,
    check_dropout,
    check_sizes,
    dict_spec,
    token_mask,
)
from attnlab.models.sentence import SentenceClassifier
from attnlab.output import output_pytree
from attnlab.registry import Configurable, register

__all__ = ["MetaEmbeddingClassifier", "MetaEmbeddingOutput"]

METHODS = ("dme", "cdme")
BASELINES = ("mean", "uniform", "concat")
#: the recurrent cells of the option ``encoder``
ENCODERS = ("lstm", "gru")


@output_pytree()
@dataclass
class MetaEmbeddingOutput:
    """What :class:`MetaEmbeddingClassifier` returns (``E`` tables, ``n`` tokens).

    Attributes:
        logits: ``[B, C]`` class scores.
        weights: the per-token meta-embedding weights ``alpha`` ``[B, n, E]`` (0 for a table
            that lacks the token and on padding; each real token's row sums to 1 over the
            tables that have it, 0 for a token no table has); ``None`` for ``concat``.
        embedded: the meta-embeddings ``x_t`` ``[B, n, d']`` (``[B, n, E d']`` for concat).
        hidden: the encoder states ``[B, n, d_h]`` (0 on padding).
        pooled: the sentence vector ``[B, d_c]``.
        pooling_weights: the pooling attention's weights over the tokens ``[B, n]`` (None
            for mean pooling).
        available: ``[B, n, E]`` bool, which tables have each real token.
    """

    logits: Tensor
    weights: Tensor | None
    embedded: Tensor
    hidden: Tensor
    pooled: Tensor
    pooling_weights: Tensor | None
    available: Tensor


def _table(spec: Any, i: int, freeze: bool, padding_idx: int | None) -> tuple[nn.Embedding, Any]:
    """An ``nn.Embedding`` from one table spec, and the spec's ``found`` mask if it has one."""
    found = getattr(spec, "found", None)
    if isinstance(spec, nn.Embedding):
        return spec, None
    if isinstance(spec, tuple | list) and len(spec) == 2 and all(isinstance(s, int) for s in spec):
        V, d = spec
        if isinstance(V, bool) or isinstance(d, bool) or V < 1 or d < 1:
            raise ConfigError(f"embeddings[{i}] = {spec!r}: vocabulary size and d_i must be >= 1")
        pad = padding_idx if padding_idx is not None and padding_idx < V else None
        return nn.Embedding(V, d, padding_idx=pad), None
    try:
        matrix = as_matrix(spec)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"embeddings[{i}]: {error}; or give a pair (vocab_size, d_i)") from None
    return nn.Embedding.from_pretrained(matrix, freeze=freeze), found


def _availability(founds: Sequence[Any], V: int) -> Tensor:
    """The ``[E, V]`` bool mask of the words each table knows (all of them where its
    ``found`` is None)."""
    avail = torch.ones(len(founds), V, dtype=torch.bool)
    for i, found in enumerate(founds):
        if found is None:
            continue
        f = torch.as_tensor(np.asarray(found), dtype=torch.bool)
        if tuple(f.shape) != (V,):
            raise ConfigError(
                f"available[{i}] has shape {tuple(f.shape)}, expected [vocab_size] = [{V}]"
            )
        avail[i] = f
    return avail


@register("model", "meta-embedding-classifier", aliases=("dme-classifier",))
class MetaEmbeddingClassifier(Configurable):
    """Sentence classifier over dynamic meta-embeddings of several word-vector tables.

    Args:
        embeddings: one table per embedding, all indexed by the same token ids: a
            pretrained ``[V, d_i]`` matrix (tensor, numpy array or
            ``attnlab.data.Embeddings``, whose ``found`` rows mark where the table has the
            word), a pair ``(V, d_i)`` (a trainable table) or an ``nn.Embedding``.
        num_classes: ``C`` (default 2).
        available: per table, a bool ``[V]`` (True = the table has a vector for the id);
            default: the ``found`` of an ``Embeddings``, else every id. A table that lacks a
            token gets weight 0 for it (the others are renormalised).
        names: a name per table (for reports; default ``table0``, ...).
        d_proj: the common size ``d'`` of the projections (default 64).
        meta: the meta-embedding attention: ``"dme"`` (default), ``"cdme"``, a dict
            ``{"meta": ..., "align": ..., "uniform": bool, **options}`` (options go to
            DME/CDME: ``d_w``, ``act``, ``lstm_hidden``), or ``"mean"``, ``"uniform"``,
            ``"concat"``.
        freeze_embeddings: keep the pretrained tables fixed (default True, as Kiela et al.;
            the projections are trained).
        padding_idx: the padding id of trainable tables.
        encoder: ``"lstm"`` (default) or ``"gru"``, bidirectional, ``hidden_size`` per
            direction (``d_h = 2 hidden_size``), reading only the real tokens.
        hidden_size: see ``encoder`` (default 64).
        pooling: the pooling attention over the tokens, any attention spec of
            :class:`~attnlab.models.sentence.SentenceClassifier` (default ``"tanh"``).
        attention_dim: ``d_w`` of the tanh pooling (default ``d_h``).
        dropout: dropout on the meta-embeddings and on the pooled vector (training only).

    Shapes: ``forward(tokens [B, n] long, lengths [B] | None, mask [B, n] bool | None)`` ->
    :class:`MetaEmbeddingOutput` (``logits [B, C]``, ``weights [B, n, E]``). Padding never
    changes the result.

    Cost: the projections O(B n sum_i d_i d'), the DME weights O(B n E d') (CDME adds a
    BiLSTM over each table's sequence, O(B n E d' h_c)), the encoder O(B n 8 h (d' + h))
    sequential in n, the pooling O(B n d_h d_w).

    :formula: x_ti = W_i E_i[w_t] + b_i; alpha_ti = softmax_i(a^T x_ti + b) (DME; CDME scores a
        BiLSTM state); x_t = sum_i alpha_ti x_ti; h = BiRNN(x); c = sum_t softmax_t(w^T tanh(W
        h_t)) h_t; y = W_o c + b_o
    :source: Kiela, Wang & Cho 2018, Dynamic Meta-Embeddings for Improved Sentence
        Representations
    :cost: projections O(B n sum_i d_i d') + meta attention O(B n E d') (CDME + O(B n E d' h_c))
        + encoder O(B n d' h) sequential in n + pooling O(B n d_h d_w)
    """

    def __init__(
        self,
        embeddings: Sequence[Any],
        num_classes: int = 2,
        *,
        available: Sequence[Any] | None = None,
        names: Sequence[str] | None = None,
        d_proj: int = 64,
        meta: str | dict[str, Any] = "dme",
        freeze_embeddings: bool = True,
        padding_idx: int | None = 0,
        encoder: str = "lstm",
        hidden_size: int = 64,
        pooling: str | dict[str, Any] = "tanh",
        attention_dim: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if isinstance(embeddings, Tensor | nn.Module | np.ndarray) or not isinstance(
            embeddings, Sequence
        ):
            raise ConfigError("embeddings must be a list with one table per embedding")
        if not embeddings:
            raise ConfigError("embeddings is empty; a meta-embedding needs at least one table")
        check_sizes(num_classes=num_classes, d_proj=d_proj, hidden_size=hidden_size)
        check_choice(encoder, "encoder", ENCODERS)
        check_dropout(dropout)

        pairs = [
            _table(spec, i, freeze_embeddings, padding_idx) for i, spec in enumerate(embeddings)
        ]
        tables = [table for table, _ in pairs]
        sizes = {t.num_embeddings for t in tables}
        if len(sizes) != 1:
            raise ConfigError(
                "every table must be indexed by the same token ids; their vocabulary sizes "
                f"differ: {[t.num_embeddings for t in tables]}"
            )
        self.vocab_size = sizes.pop()
        E = self.E = len(tables)
        self.names = list(names) if names is not None else [f"table{i}" for i in range(E)]
        if len(self.names) != E:
            raise ConfigError(f"names has {len(self.names)} entries, expected {E}")
        founds = [found for _, found in pairs] if available is None else list(available)
        if len(founds) != E:
            raise ConfigError(f"available has {len(founds)} entries, expected {E}")
        self.register_buffer("available", _availability(founds, self.vocab_size))
        method, spec = self._meta_spec(meta)
        self.method = method
        self.d_proj = d_proj
        # not "meta": a torch.fx.GraphModule (what torch.export's program.module() builds)
        # has a dict attribute of that name, which would hide the submodule
        self.meta_embedding: DME | CDME | None = None
        if method in METHODS:
            cls = DME if method == "dme" else CDME
            self.meta_embedding = cls(tables, d_proj, freeze=freeze_embeddings, **spec)
        else:
            self.tables = nn.ModuleList(tables)
            self.proj = nn.ModuleList(nn.Linear(t.embedding_dim, d_proj) for t in tables)
        d_x = E * d_proj if method == "concat" else d_proj
        self.dropout = nn.Dropout(dropout)
        self.encoder = MaskedRNN(d_x, hidden_size, cell=encoder, bidirectional=True)
        self.d_h = self.encoder.out_dim
        # the pooling attention and the output layer of the sentence classifier (its
        # one-row embedding and unused "average" projection are 1 + 2 d_h parameters)
        self.head = SentenceClassifier(
            1,
            num_classes,
            embed_dim=1,
            padding_idx=None,
            encoder="average",
            hidden_size=self.d_h,
            attention=pooling,
            attention_dim=attention_dim,
            dropout=dropout,
        )

    #: the submodule's name until attnlab 0.2.0 (checkpoints with ``meta.*`` keys load)
    meta = deprecated_attribute("meta", "meta_embedding")

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix + "meta.")]:
            new = prefix + "meta_embedding." + key[len(prefix) + len("meta.") :]
            state_dict[new] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _meta_spec(self, meta: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the meta-embedding method, its options) of a spec; sets ``uniform``."""
        spec, self.uniform = dict_spec({"meta": meta} if isinstance(meta, str) else meta, "meta")
        method = spec.pop("meta", "dme")
        if method == "uniform":
            method, self.uniform = "dme", True
        if method not in (*METHODS, "mean", "concat"):
            raise ConfigError(
                f"meta must be one of 'dme', 'cdme', 'mean', 'uniform', 'concat', got {method!r}"
            )
        if method in ("mean", "concat") and (spec or self.uniform):
            raise ConfigError(f"meta={method!r} takes no options, got {sorted(spec)}")
        return method, spec

    # ------------------------------------------------------------------ parts

    def embed(self, tokens: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
        """Meta-embeddings ``[B, n, d']`` (concat: ``[B, n, E d']``), weights
        ``[B, n, E]`` (None for concat) and availability ``[B, n, E]`` of checked inputs."""
        A = self.available[:, tokens].permute(1, 2, 0) & mask.unsqueeze(-1)  # [B, n, E]
        if self.meta_embedding is not None and not self.uniform:
            out = self.meta_embedding(
                [tokens] * self.E,
                masks=[A[..., i] for i in range(self.E)],
                mask=mask,
                need_weights=True,
            )
            return out.context, out.weights, A
        if self.meta_embedding is not None:
            vectors = [table(tokens) for table in self.meta_embedding.tables]
            xt = self.meta_embedding.project(vectors, A)
        else:
            xt = torch.stack([p(t(tokens)) for p, t in zip(self.proj, self.tables, strict=True)], 2)
            xt = xt * A.unsqueeze(-1).to(xt.dtype)
        if self.method == "concat":
            B, n = tokens.shape
            return xt.reshape(B, n, self.E * self.d_proj), None, A
        w = A.to(xt.dtype)
        w = w / w.sum(-1, keepdim=True).clamp(min=1.0)
        return (w.unsqueeze(-1) * xt).sum(2), w, A

    def forward(
        self, tokens: Tensor, lengths: Tensor | None = None, mask: Tensor | None = None
    ) -> MetaEmbeddingOutput:
        """Classify ``tokens`` ``[B, n]`` (see the class docstring)."""
        m = token_mask(tokens, lengths, mask, vocab_size=self.vocab_size)
        x, weights, A = self.embed(tokens, m)
        x = self.dropout(x) * m.unsqueeze(-1).to(x.dtype)
        hidden = self.encoder(x, m)
        out = self.head.classify(hidden, m)
        return MetaEmbeddingOutput(out.logits, weights, x, hidden, out.pooled, out.weights, A)
