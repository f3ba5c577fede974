"""The hierarchical attention network (HAN) of Yang et al. (2016) for document
classification, with the attention swappable at both levels.

A document is ``S`` sentences of at most ``W`` words (``tokens`` ``[B, S, W]``). The model
is the survey's general task model (TAXONOMY section 0) applied twice, words -> sentence
vectors -> document vector:

    x_it = E[w_it]                                          embeddings (GloVe or learned)
    h_it = BiGRU_w(x_i1..x_iW)_t                            word encoder (per sentence)
    a_it = align(score(u_w, h_it)) over the real words      word attention
    s_i  = sum_t a_it h_it                                  sentence vector
    g_i  = BiGRU_s(s_1..s_S)_i                              sentence encoder
    b_i  = align(score(u_s, g_i)) over the real sentences   sentence attention
    v    = sum_i b_i g_i                                    document vector
    y    = W_o v + b_o                                      logits over the classes

HAN's score is ``e = u^T tanh(W h + b)`` with a learned context vector ``u`` per level
(the ``queryless`` score) and softmax alignment. Each level is a one-level
:class:`~attnlab.feature.multilevel.HierarchicalAttention` (its :class:`attnlab.Attention`
and learned query) after a :class:`~attnlab.feature.multilevel.MaskedRNN` encoder; the two
levels together are exactly ``HierarchicalAttention(d_e, levels=2, encoder=[word_encoder,
sentence_encoder])``.

Source: Yang, Yang, Dyer, He, Smola & Hovy 2016, "Hierarchical Attention Networks for
Document Classification", NAACL-HLT.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Unpack

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.feature.multilevel import HierarchicalAttention, MaskedRNN, hierarchy_mask
from attnlab.models._inputs import check_choice, check_ids, check_lengths, check_mask
from attnlab.models._pooling import uniform_context, uniform_weights
from attnlab.models._rnn import masked_rnn
from attnlab.models._text import TextClassifier, TextOptions
from attnlab.output import output_pytree
from attnlab.registry import get, register

__all__ = ["DocumentClassifier", "DocumentOutput", "level_attention_spec"]

ENCODERS = ("bigru", "bilstm", "gru", "lstm", "identity")
BASELINES = ("mean", "uniform")
_HAN_NAMES = ("han", "tanh", "queryless", "query-less")


@output_pytree()
@dataclass
class DocumentOutput:
    """What :class:`DocumentClassifier` returns.

    Attributes:
        logits: ``[B, C]`` class scores (before softmax).
        word_weights: the word attention weights ``[B, S, W]`` (zero on padding words and on
            empty or padding sentences; summing to 1 over the real words of a real
            sentence); ``[B, S, W, d]`` for multi-dimensional attention; ``None`` when the
            word level is mean pooling.
        sentence_weights: the sentence attention weights ``[B, S]`` (zero on empty and
            padding sentences, summing to 1 over the real sentences of a non-empty
            document); ``[B, S, d]`` for multi-dimensional attention; ``None`` for mean
            pooling.
        document: the document vector ``v`` ``[B, d_c]`` fed to the output layer (zero for
            an empty document).
        sentences: the sentence vectors ``s`` ``[B, S, d_s]`` (zero for empty sentences).
        sentence_mask: ``[B, S]`` bool, True for the sentences holding at least one real
            word.
        log_prob: for stochastic alignments (hard, reinforced) the log-probability of all
            sampled choices of a document ``[B]`` (its words' and sentences'), for a
            REINFORCE loss; else ``None``.
    """

    logits: Tensor
    word_weights: Tensor | None
    sentence_weights: Tensor | None
    document: Tensor
    sentences: Tensor
    sentence_mask: Tensor
    log_prob: Tensor | None = None


def level_attention_spec(spec: Any, d: int, attention_dim: int | None) -> dict[str, Any] | None:
    """One level's attention spec as ``HierarchicalAttention`` arguments plus ``uniform``
    (``None`` for mean pooling). See :class:`DocumentClassifier` for the accepted specs."""
    if isinstance(spec, str):
        if spec == "mean":
            return None
        if spec in (*_HAN_NAMES, "uniform"):
            return {
                "score": "queryless",
                "align": "soft",
                "options": {"d_w": attention_dim or d},
                "uniform": spec == "uniform",
            }
        raise ConfigError(
            f"attention must be 'han', 'mean', 'uniform' or a dict spec, got {spec!r}"
        )
    if isinstance(spec, dict):
        options = dict(spec)
        uniform = bool(options.pop("uniform", False))
        score = options.pop("score", "queryless")
        align = options.pop("align", "soft")
        if not isinstance(score, str) or not isinstance(align, str):
            raise ConfigError(
                f"score and align must be registered names, got score={score!r}, align={align!r}"
            )
        if score in _HAN_NAMES:
            score = "queryless"
        takes = inspect.signature(get("score", score).cls).parameters
        if "d_w" in takes and "d_w" not in options:
            options["d_w"] = attention_dim or d
        return {"score": score, "align": align, "options": options, "uniform": uniform}
    raise ConfigError(
        f"attention must be a name or a dict spec, got {type(spec).__name__} ({spec!r})"
    )


@register("model", "document-classifier", aliases=("document", "han-classifier"))
class DocumentClassifier(TextClassifier, default_embed_dim=200, encoder_names=ENCODERS):
    """Hierarchical attention network: words -> sentence vectors -> document vector -> linear.

    Args:
        vocab_size: number of token ids (default: the rows of ``embeddings``).
        num_classes: ``C``, the number of logits (default 2).
        embed_dim: embedding size ``d_e`` (default: the columns of ``embeddings``, else 200
            as in HAN).
        embeddings: pretrained matrix ``[vocab_size, d_e]`` (tensor, numpy array or
            ``attnlab.data.Embeddings``); copied.
        freeze_embeddings: keep the embedding matrix fixed during training.
        padding_idx: the padding id (its row gets no gradient), or None.
        encoder: the encoder of both levels: ``"bigru"`` (HAN, default), ``"bilstm"``,
            ``"gru"``, ``"lstm"`` (``hidden_size`` units per direction) or ``"identity"``
            (no encoder: the word level pools the embeddings, the sentence level the
            sentence vectors).
        sentence_encoder: the sentence-level encoder if different (default ``encoder``).
        hidden_size: units per direction of the recurrent encoders (default 50, as in HAN).
        attention: the attention of both levels: ``"han"`` (default: ``u^T tanh(W h + b)``
            with a learned context vector ``u``, softmax), a dict ``{"score": ...,
            "align": ..., "dim": ..., **options}`` (any registered score and alignment; a
            score that takes a query gets a learned query vector per level;
            ``"uniform": True`` gives that attention's uniform baseline; ``query_dim`` sets
            the learned query's size), or the baselines ``"mean"`` and ``"uniform"``.
        sentence_attention: the sentence level's attention if different (default
            ``attention``).
        attention_dim: ``d_w`` of the scores that take one (default: the level's feature
            size ``d_h``, 100 with the default BiGRU as in HAN).
        dropout: dropout on the embeddings and on the document vector (training only).

    Shapes: ``forward(tokens [B, S, W] long, mask [B, S, W] bool | None, *, word_lengths
    [B, S] | None, sentence_lengths [B] | None)`` -> :class:`DocumentOutput` (``logits``
    ``[B, C]``, ``word_weights`` ``[B, S, W]``, ``sentence_weights`` ``[B, S]``). Give
    ``mask`` (True = real word; any pattern) or ``word_lengths`` (real words first) with
    optionally ``sentence_lengths`` (real sentences first); with neither every position
    is a real word. A sentence with no real word is empty: it gets a zero vector and zero
    weight and the sentence encoder skips it; a document with no real word gets a zero
    document vector (its logits are the output bias). Padding never changes the result.

    Baselines: ``"mean"`` averages the encoder states (no attention parameters at that
    level). ``"uniform"`` keeps the attention module (same parameters and checkpoint
    layout) and replaces its weights by ``1/n`` over the real items, pooling the
    attention's values (the states themselves with the default attention, so it equals
    mean pooling). ``model.uniform = (True, True)`` on a trained model gives the uniform
    test at (word, sentence) level.

    Cost: per batch, BiGRU word encoder O(B S W 6 h (d_e + h)) (sequential in W), word
    attention O(B S W d_h d_w), sentence encoder O(B S 6 h (d_h + h)) (sequential in S),
    sentence attention O(B S d_h d_w), output O(B d_c C). Memory O(B S W d_h).

    Source: Yang, Yang, Dyer, He, Smola & Hovy 2016, "Hierarchical Attention Networks for
    Document Classification", NAACL-HLT.

    :formula: h_it = Enc_w(E[w_i])_t; a_it = align(score(u_w, h_it)); s_i = sum_t a_it h_it; g_i
        = Enc_s(s)_i; b_i = align(score(u_s, g_i)); v = sum_i b_i g_i; y = W_o v + b_o
    :source: Yang, Yang, Dyer, He, Smola & Hovy 2016, Hierarchical Attention Networks for
        Document Classification, NAACL-HLT
    :cost: word level O(B S W (6 h (d_e + h) + d_h d_w)) + sentence level O(B S (6 h (d_h + h) +
        d_h d_w)) for BiGRUs of h units per direction; recurrences sequential in W and S
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_classes: int = 2,
        *,
        encoder: str = "bigru",
        sentence_encoder: str | None = None,
        hidden_size: int = 50,
        attention: str | dict[str, Any] = "han",
        sentence_attention: str | dict[str, Any] | None = None,
        attention_dim: int | None = None,
        **text: Unpack[TextOptions],
    ) -> None:
        super().__init__(
            vocab_size, encoder, text, num_classes=num_classes, hidden_size=hidden_size
        )
        sentence_encoder = encoder if sentence_encoder is None else sentence_encoder
        check_choice(sentence_encoder, "sentence_encoder", ENCODERS)
        self.num_classes = int(num_classes)

        self.word_encoder = self._make_encoder(encoder, self.embed_dim, hidden_size)
        d_word = int(getattr(self.word_encoder, "out_dim", self.embed_dim))
        self.word_attention = self._make_attention(attention, d_word, attention_dim)
        self.d_s = self._pooled_size(self.word_attention, d_word)
        self.sentence_encoder = self._make_encoder(sentence_encoder, self.d_s, hidden_size)
        d_sent = int(getattr(self.sentence_encoder, "out_dim", self.d_s))
        sent_spec = attention if sentence_attention is None else sentence_attention
        self.sentence_attention = self._make_attention(sent_spec, d_sent, attention_dim)
        self.d_c = self._pooled_size(self.sentence_attention, d_sent)
        self.output = nn.Linear(self.d_c, num_classes)
        self.d_word, self.d_sent = d_word, d_sent

    # ------------------------------------------------------------------ parts

    @staticmethod
    def _make_encoder(name: str, d_in: int, hidden: int) -> nn.Module:
        if name == "identity":
            return nn.Identity()
        return masked_rnn(name, d_in, hidden)

    def _make_attention(
        self, spec: Any, d: int, attention_dim: int | None
    ) -> HierarchicalAttention | None:
        parsed = level_attention_spec(spec, d, attention_dim)
        self._uniform = (*getattr(self, "_uniform", ()), bool(parsed and parsed["uniform"]))
        if parsed is None:
            return None
        return HierarchicalAttention(
            d, 1, parsed["score"], parsed["align"], encoder=None, **parsed["options"]
        )

    @property
    def uniform(self) -> tuple[bool, bool]:
        """Whether the (word, sentence) attention is replaced by uniform weights."""
        return self._uniform  # type: ignore[return-value]

    @uniform.setter
    def uniform(self, value: bool | tuple[bool, bool]) -> None:
        if isinstance(value, bool):
            value = (value, value)
        self._uniform = (bool(value[0]), bool(value[1]))

    def _pooled_size(self, han: HierarchicalAttention | None, d: int) -> int:
        if han is None:
            return d
        with torch.no_grad():
            was = han.training
            han.eval()
            param = next(han.parameters(), None)
            dtype = param.dtype if param is not None else torch.float32
            out = self._attend(
                han, torch.zeros(1, 1, d, dtype=dtype), torch.ones(1, 1, dtype=torch.bool)
            )
            han.train(was)
        return int(out.context.shape[-1])

    @staticmethod
    def _attend(han: HierarchicalAttention, h: Tensor, mask: Tensor):
        """The one level of ``han`` on ``h`` ``[N, n, d]`` (its Attention with its learned
        query, if any), keeping the weights and the log-probability."""
        q = han.queries[0].to(h.dtype).expand(h.shape[0], -1) if han.needs_query else None
        return han.attn[0](q, h, mask=mask, need_weights=True)

    def _pool(
        self, level: int, h: Tensor, mask: Tensor
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Pool ``h`` ``[N, n, d]`` over its real items (``mask`` ``[N, n]``) at ``level``
        (0 = words, 1 = sentences): (context ``[N, d_c]``, weights, log_prob)."""
        han = self.word_attention if level == 0 else self.sentence_attention
        if han is None or self._uniform[level]:
            w = uniform_weights(mask, h.dtype)
            pooled = uniform_context(None if han is None else han.attn[0], w, h)
            return pooled, (None if han is None else w), None
        out = self._attend(han, h, mask)
        return out.context, out.weights, out.log_prob

    @staticmethod
    def _encode(encoder: nn.Module, x: Tensor, mask: Tensor) -> Tensor:
        if isinstance(encoder, MaskedRNN):
            return encoder(x, mask)
        return encoder(x) * mask[..., None].to(x.dtype)

    # ------------------------------------------------------------------ checks

    def _check_inputs(
        self,
        tokens: Tensor,
        mask: Tensor | None,
        word_lengths: Tensor | None,
        sentence_lengths: Tensor | None,
    ) -> Tensor:
        check_ids(tokens, self.vocab_size, layout="[B, S, W]")
        B, S, W = tokens.shape
        if mask is not None and (word_lengths is not None or sentence_lengths is not None):
            raise ValueError("give mask or word_lengths/sentence_lengths, not both")
        if mask is not None:
            return check_mask(mask, (B, S, W), device=tokens.device)
        if word_lengths is None and sentence_lengths is None:
            return torch.ones(B, S, W, dtype=torch.bool, device=tokens.device)
        if word_lengths is None:
            raise ValueError("sentence_lengths needs word_lengths [B, S] too")
        wl = check_lengths(word_lengths, (B, S), ("W", W), name="word_lengths", tokens=tokens)
        sl = torch.full((B,), S, dtype=torch.long)
        if sentence_lengths is not None:
            sl = check_lengths(
                sentence_lengths, (B,), ("S", S), name="sentence_lengths", tokens=tokens
            )
        return hierarchy_mask([sl.cpu(), wl.cpu()], sizes=[S, W]).to(tokens.device)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        tokens: Tensor,
        mask: Tensor | None = None,
        *,
        word_lengths: Tensor | None = None,
        sentence_lengths: Tensor | None = None,
    ) -> DocumentOutput:
        """Classify documents ``tokens`` ``[B, S, W]`` (see the class docstring)."""
        m = self._check_inputs(tokens, mask, word_lengths, sentence_lengths)
        x = self.dropout(self.embedding(tokens))
        x = x * m[..., None].to(x.dtype)  # padding holds zeros whatever its ids
        return self.classify(x, m)

    def classify(self, x: Tensor, mask: Tensor) -> DocumentOutput:
        """The model after the embeddings: ``x`` ``[B, S, W, d_e]`` word vectors with the
        word mask ``[B, S, W]`` (any float dtype the module holds; used by gradcheck)."""
        B, S, W, d = x.shape
        N = B * S
        mf = mask.reshape(N, W)
        h = self._encode(self.word_encoder, x.reshape(N, W, d), mf)
        s, a_w, lp_w = self._pool(0, h, mf)
        s_mask = mask.any(-1)
        sent = s.reshape(B, S, s.shape[-1]) * s_mask[..., None].to(s.dtype)
        g = self._encode(self.sentence_encoder, sent, s_mask)
        doc, a_s, lp_s = self._pool(1, g, s_mask)
        logits = self.output(self.dropout(doc))
        word_weights = None if a_w is None else a_w.reshape(B, S, *a_w.shape[1:])
        log_prob = None
        if lp_w is not None:
            log_prob = (lp_w.reshape(B, S) * s_mask.to(lp_w.dtype)).sum(1)
        if lp_s is not None:
            log_prob = lp_s if log_prob is None else log_prob + lp_s
        return DocumentOutput(logits, word_weights, a_s, doc, sent, s_mask, log_prob)
