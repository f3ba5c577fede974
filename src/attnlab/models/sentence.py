"""The sentence classifier of Jain & Wallace (2019), with the attention swappable.

The model is the survey's general task model (TAXONOMY section 0):

    x_t = E[w_t]                                   feature model: embeddings (GloVe or learned)
    h_1..h_n = Enc(x_1..x_n)                       encoder: BiLSTM, CNN or projected embeddings
    a = align(score(q, h_t)),  c = sum_t a_t h_t    attention model (any pooling attention)
    y = W_o c + b_o                                 output model: logits over the classes

The attention is chosen by a spec:

* ``"tanh"`` (default): Jain & Wallace's additive query-less attention
  ``e_t = w^T tanh(W h_t + b)`` -- ``attnlab.Attention(score="queryless", ...)``;
* a dict such as ``{"score": "scaled-dot", "align": "sparsemax"}``: any registered score
  and alignment. A query-less score (``queryless``) is used directly; a score that takes a
  query gets one trainable query vector
  (:class:`~attnlab.query.self_attention.LearnedQuerySelfAttention`). Other keys are
  passed on (``d_w``, ``act``, ``value_dim``, ``tau``, ...). ``"uniform": True`` in the
  dict gives the uniform baseline of that attention;
* a built module: an :class:`attnlab.Attention` with a query-less score, or any module
  called as ``module(features [B, n, d], mask [B, n], need_weights=True)`` that returns an
  :class:`~attnlab.output.AttentionOutput` with ``context [B, d_c]`` (e.g.
  ``ConstantQuerySelfAttention``, ``LearnedQuerySelfAttention``);
* the baselines ``"mean"`` (mean pooling over the real tokens; no attention parameters),
  ``"max"`` (no attention at all: max-pooling over time of the real tokens' states) and
  ``"uniform"`` (the default attention with its weights replaced by ``1/length``).

Two options follow Jain & Wallace's code: ``output="sigmoid"`` (one logit ``z``, given as
the two-class logits ``[0, z]``, so that ``softmax([0, z]) = [1 - sigmoid(z), sigmoid(z)]``
and every consumer of the logits is unchanged; :class:`SigmoidOutput`) and
``sentence_markers=True`` (learned start / end vectors around every sentence that the
encoder reads and the attention never sees).

Source: Jain & Wallace 2019, "Attention is not Explanation", NAACL-HLT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab._recurrent import bound_rnn_weights
from attnlab.general.attention import Attention
from attnlab.general.dimensionality import combine_single
from attnlab.models._inputs import token_mask
from attnlab.models._pooling import uniform_weights
from attnlab.models._rnn import run_packed
from attnlab.models._text import TextClassifier, TextOptions
from attnlab.output import AttentionOutput, output_pytree
from attnlab.query.self_attention import LearnedQuerySelfAttention
from attnlab.registry import get, register

__all__ = ["SentenceClassifier", "SentenceOutput", "SigmoidOutput"]

ENCODERS = ("bilstm", "cnn", "average")
BASELINES = ("mean", "uniform", "max")
#: the query-less score's names that ``attention`` takes
QUERYLESS = ("queryless", "query-less", "self-attentive", "constant-query")
#: every name ``attention`` takes as a string (pooling baselines and the additive attention)
POOLING_NAMES = ("mean", "max", "tanh", "additive", "uniform", *QUERYLESS)
OUTPUTS = ("softmax", "sigmoid")


class SigmoidOutput(nn.Module):
    """A one-logit binary output layer ``z = w^T c + b`` that returns the two-class logits
    ``[0, z]`` ``[B, 2]``: their softmax is ``[1 - sigmoid(z), sigmoid(z)]``, so the
    probability of class 1 is ``sigmoid(z)`` (Jain & Wallace's decoder) while every reader
    of two-class logits (arg-max, softmax, TVD of the distribution) works unchanged.

    Shapes: ``[..., in_features]`` -> ``[..., 2]``. Cost: O(in_features) per row.
    """

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), 2
        self.linear = nn.Linear(in_features, 1)

    def forward(self, x: Tensor) -> Tensor:
        z = self.linear(x)
        return torch.cat([torch.zeros_like(z), z], -1)


@output_pytree()
@dataclass
class SentenceOutput:
    """What :class:`SentenceClassifier` returns.

    Attributes:
        logits: ``[B, C]`` class scores (before softmax).
        weights: the attention weights ``[B, n]`` (zero on padding, summing to 1 over the
            real tokens of a non-empty sentence); ``None`` for mean pooling.
            Multi-dimensional attention gives ``[B, n, d_c]``.
        pooled: the sentence vector ``c`` ``[B, d_c]`` fed to the output layer.
        hidden: the encoder states ``h`` ``[B, n, d_h]`` (zero on padding).
        log_prob: for stochastic alignments (hard, reinforced) the log-probability of the
            sampled choice ``[B]``, for a REINFORCE loss; else ``None``.
    """

    logits: Tensor
    weights: Tensor | None
    pooled: Tensor
    hidden: Tensor
    log_prob: Tensor | None = None


@register("model", "sentence-classifier", aliases=("sentence", "jain-wallace"))
class SentenceClassifier(TextClassifier, default_embed_dim=300, encoder_names=ENCODERS):
    """Sentence classifier: embeddings -> encoder -> pooling attention -> linear.

    Args:
        vocab_size: number of token ids (default: the rows of ``embeddings``).
        num_classes: ``C``, the number of logits (default 2).
        embed_dim: embedding size ``d_e`` (default: the columns of ``embeddings``, else 300).
        embeddings: pretrained matrix ``[vocab_size, d_e]`` (tensor, numpy array or
            ``attnlab.data.Embeddings`` whose ``.matrix`` is used); copied.
        freeze_embeddings: keep the embedding matrix fixed during training.
        padding_idx: the padding id (its row gets no gradient; it starts at zero unless a
            pretrained matrix is given), or None.
        encoder: ``"bilstm"`` (``hidden_size`` per direction, ``d_h = 2 hidden_size``),
            ``"cnn"`` (``hidden_size`` ReLU filters for each width in ``kernel_sizes``,
            same padding so every token keeps a feature, ``d_h = hidden_size *
            len(kernel_sizes)``) or ``"average"`` (``h_t = ReLU(W x_t + b)``, no context,
            ``d_h = hidden_size``: the averaged-embedding encoder).
        hidden_size: see ``encoder`` (default 128, as in Jain & Wallace).
        kernel_sizes: the CNN widths (default ``(1, 3, 5, 7)``).
        attention: the pooling (see the module docstring): ``"tanh"`` (default), a dict
            spec, a built module, ``"mean"`` or ``"uniform"``.
        attention_dim: ``d_w`` of the default tanh attention (default ``hidden_size``).
        dropout: dropout on the embeddings and on the pooled vector (training only).
        output: ``"softmax"`` (default: ``C`` logits of a linear layer) or ``"sigmoid"``
            (``C = 2`` only: one logit ``z`` returned as ``[0, z]``, :class:`SigmoidOutput`;
            Jain & Wallace's one sigmoid output).
        sentence_markers: add a learned start vector before and an end vector after every
            sentence (``markers`` ``[2, d_e]``, drawn from ``N(0, s^2)`` with ``s`` the
            standard deviation of the embedding matrix, frozen with it): the encoder reads
            ``<SOS> w_1..w_L <EOS>``, the attention pools only the states of ``w_1..w_L``
            (Jain & Wallace's ``<SOS>`` / ``<EOS>`` tokens, masked in their attention).
            The inputs, the weights, ``hidden`` and every explanation measure stay those
            of the real tokens; the markers are not embedding rows, so a gradient taken at
            the embedding layer's output covers exactly the real tokens.

    Shapes: ``forward(tokens [B, n] long, lengths [B] | None, mask [B, n] bool | None)`` ->
    :class:`SentenceOutput` (``logits [B, C]``, ``weights [B, n]``, ``pooled [B, d_c]``).
    Give either ``lengths`` (real tokens first) or ``mask`` (True = real token; for the
    BiLSTM it must be a prefix mask); with neither, every position is a real token. An
    empty sentence (length 0) pools to a zero vector (its logits are the output bias).

    Baselines: ``"mean"`` averages the encoder states of the real tokens and has no
    attention parameters. ``"uniform"`` keeps the attention module (same parameters and
    checkpoint layout as the attention model) but replaces its weights by ``1/length``
    over the real tokens, pooling the attention's values; with the default attention the
    values are the states themselves, so the pooled vector equals mean pooling, while the
    (unused) attention parameters remain. Setting ``model.uniform = True`` on a trained
    attention model gives Jain & Wallace's "replace the weights by uniform ones" test.

    Cost: the encoder (BiLSTM O(B n 8 h (d_e + h)), sequential in n; CNN O(B n d_e h
    sum(k)); average O(B n d_e h)) dominates; the tanh attention adds O(B n d_h d_w), mean
    pooling O(B n d_h), the output layer O(B d_c C).

    Source: Jain & Wallace 2019, "Attention is not Explanation", NAACL-HLT.

    :formula: h = Enc(E[w_1..w_n]); a = align(score(q, h_t)); c = sum_t a_t h_t; y = W_o c + b_o
    :source: Jain & Wallace 2019, Attention is not Explanation, NAACL-HLT
    :cost: encoder O(B n d_e h) (BiLSTM O(B n 8 h (d_e + h)) sequentially over n) + attention
        O(B n d_h d_w) + output O(B d_c C)
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_classes: int = 2,
        *,
        encoder: str = "bilstm",
        hidden_size: int = 128,
        kernel_sizes: Sequence[int] = (1, 3, 5, 7),
        attention: str | dict[str, Any] | nn.Module = "tanh",
        attention_dim: int | None = None,
        output: str = "softmax",
        sentence_markers: bool = False,
        **text: Unpack[TextOptions],
    ) -> None:
        super().__init__(
            vocab_size, encoder, text, num_classes=num_classes, hidden_size=hidden_size
        )
        if output not in OUTPUTS:
            raise ConfigError(f"output must be 'softmax' or 'sigmoid', got {output!r}")
        if output == "sigmoid" and num_classes != 2:
            raise ConfigError(f"output='sigmoid' needs num_classes=2, got {num_classes}")
        if not isinstance(sentence_markers, bool):
            raise ConfigError(f"sentence_markers must be true or false, got {sentence_markers!r}")
        self.num_classes, self.encoder_name = int(num_classes), encoder
        self.output_kind, self.sentence_markers = output, sentence_markers
        self.markers: nn.Parameter | None = None
        if sentence_markers:
            table = self.embedding.weight.detach()
            scale = float(table.std()) if table.numel() > 1 else 1.0
            self.markers = nn.Parameter(
                torch.randn(2, self.embed_dim, dtype=table.dtype) * scale,
                requires_grad=self.embedding.weight.requires_grad,
            )
        self.d_h = self._make_encoder(encoder, self.embed_dim, hidden_size, kernel_sizes)
        self.attention: nn.Module | None = self._make_attention(
            attention, attention_dim or hidden_size
        )
        self.d_c = self._pooled_size()
        self.output = (
            SigmoidOutput(self.d_c) if output == "sigmoid" else nn.Linear(self.d_c, num_classes)
        )

    def attention_parameters(self) -> list[nn.Parameter]:
        """The parameters of the pooling attention (none for the mean and max baselines):
        those an optimizer may treat apart, e.g. without weight decay as Jain & Wallace
        do (:func:`attnlab.lab.training.parameter_groups`)."""
        return [] if self.attention is None else list(self.attention.parameters())

    # ------------------------------------------------------------------ parts

    def _make_encoder(
        self, encoder: str, embed_dim: int, hidden_size: int, kernel_sizes: Sequence[int]
    ) -> int:
        """Build the encoder; return its state size ``d_h``."""
        if encoder == "bilstm":
            self.lstm = nn.LSTM(embed_dim, hidden_size, batch_first=True, bidirectional=True)
            self._lstm_weights = bound_rnn_weights(self, "lstm")
            d_h = 2 * hidden_size
        elif encoder == "cnn":
            widths = tuple(kernel_sizes)
            if not widths or any(
                isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in widths
            ):
                raise ConfigError(f"kernel_sizes must be ints >= 1, got {kernel_sizes!r}")
            self.convs = nn.ModuleList(
                nn.Conv1d(embed_dim, hidden_size, k, padding="same") for k in widths
            )
            d_h = hidden_size * len(widths)
        else:
            self.projection = nn.Linear(embed_dim, hidden_size)
            d_h = hidden_size
        return d_h

    def _make_attention(self, attention: Any, d_w: int) -> nn.Module | None:
        """The pooling attention of a spec (None for the mean and max baselines); sets
        ``uniform`` and ``pooling``."""
        self.uniform = False
        self.pooling = "attention"  # or "mean" / "max" for the baselines without attention
        if isinstance(attention, nn.Module):
            if isinstance(attention, Attention) and attention.score.needs_query:
                raise ConfigError(
                    "an Attention with a score that takes a query cannot pool a sentence on "
                    "its own; pass a dict spec (a trainable query is added) or wrap it in "
                    "attnlab.query.self_attention.LearnedQuerySelfAttention"
                )
            return attention
        if isinstance(attention, str):
            if attention in ("mean", "max"):
                self.pooling = attention
                return None
            if attention in ("tanh", "additive", "uniform", *QUERYLESS):
                self.uniform = attention == "uniform"
                return Attention("queryless", d_k=self.d_h, d_w=d_w)
            raise ConfigError(
                f"attention must be 'tanh', 'mean', 'uniform', a dict spec or a module, "
                f"got {attention!r}"
            )
        if not isinstance(attention, dict):
            raise ConfigError(
                f"attention must be a name, a dict spec or a module, got {type(attention).__name__}"
            )
        spec = dict(attention)
        self.uniform = bool(spec.pop("uniform", False))
        score = spec.pop("score", "queryless")
        align = spec.pop("align", "soft")
        if isinstance(score, str) and score in QUERYLESS:
            spec.setdefault("d_w", d_w)
            return Attention("queryless", align, d_k=self.d_h, **spec)
        if isinstance(score, str) and not get("score", score).cls.needs_query:
            return Attention(score, align, d_k=self.d_h, **spec)
        return LearnedQuerySelfAttention(self.d_h, score=score, align=align, **spec)

    def _pooled_size(self) -> int:
        if self.attention is None:
            return self.d_h
        with torch.no_grad():
            was = self.attention.training
            self.attention.eval()
            param = next(self.attention.parameters(), None)
            dtype = param.dtype if param is not None else torch.float32
            out = self._attend(
                torch.zeros(1, 1, self.d_h, dtype=dtype), torch.ones(1, 1, dtype=torch.bool)
            )
            self.attention.train(was)
        return int(out.context.shape[-1])

    def _attend(self, hidden: Tensor, mask: Tensor) -> AttentionOutput:
        assert self.attention is not None
        if isinstance(self.attention, Attention):
            return self.attention(None, hidden, mask=mask[:, None, :], need_weights=True)
        return self.attention(hidden, mask=mask, need_weights=True)

    def _values(self, hidden: Tensor) -> Tensor:
        """The vectors the attention sums (its value projection of the states, if any)."""
        attn = self.attention
        inner = attn if isinstance(attn, Attention) else getattr(attn, "attention", None)
        proj = getattr(inner, "value_proj", None)
        return proj(hidden) if proj is not None else hidden

    def _check_inputs(self, tokens: Tensor, lengths: Tensor | None, mask: Tensor | None) -> Tensor:
        prefix = None
        if self.encoder_name == "bilstm":
            prefix = "the BiLSTM encoder"
        elif self.sentence_markers:
            prefix = "the sentence markers"
        return token_mask(tokens, lengths, mask, vocab_size=self.vocab_size, prefix=prefix)

    def _add_markers(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """``x`` ``[B, n, d_e]`` with the start vector before and the end vector after the
        real tokens (``[B, n + 2, d_e]``, real tokens at positions ``1..L``), and its mask."""
        assert self.markers is not None
        B, n, d = x.shape
        start, end = self.markers.to(x.dtype)
        lengths = mask.sum(1)
        ext = torch.cat([start.expand(B, 1, d), x * mask.unsqueeze(-1).to(x.dtype)], 1)
        ext = torch.cat([ext, x.new_zeros(B, 1, d)], 1)
        pos = torch.arange(n + 2, device=x.device)[None, :]
        ext = torch.where((pos == lengths[:, None] + 1).unsqueeze(-1), end, ext)
        return ext, pos < lengths[:, None] + 2

    def encode(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Encoder states ``h`` ``[B, n, d_h]`` (zero on padding) of checked inputs (with
        ``sentence_markers``: the states of the real tokens in the encoding of the sentence
        with its markers)."""
        x = self.embedding(tokens)
        real = mask
        if self.sentence_markers:
            x, mask = self._add_markers(x, mask)
        x = self.dropout(x)
        keep = mask.unsqueeze(-1).to(x.dtype)
        x = x * keep  # padding positions hold zeros, so extra padding changes nothing
        B, n = x.shape[:2]
        if self.encoder_name == "bilstm":
            if n == 0 or B == 0:
                return x.new_zeros(B, real.shape[1], self.d_h)
            h = run_packed(self._lstm_weights, x, mask.sum(1), training=self.training)
        elif self.encoder_name == "cnn":
            if n == 0:
                return x.new_zeros(B, n, self.d_h)
            xt = x.transpose(1, 2)
            h = torch.cat([torch.relu(conv(xt)) for conv in self.convs], dim=1).transpose(1, 2)
        else:
            h = torch.relu(self.projection(x))
        h = h * keep
        if self.sentence_markers:  # the real tokens' states; the end marker's is dropped too
            h = h[:, 1:-1] * real.unsqueeze(-1).to(h.dtype)
        return h

    def classify(self, hidden: Tensor, mask: Tensor) -> SentenceOutput:
        """Pool encoder states ``hidden`` ``[B, n, d_h]`` (``mask`` ``[B, n]`` bool, True =
        real token) and apply the output layer: the attention + output path."""
        log_prob = None
        if self.attention is None and self.pooling == "max":
            # no attention: the feature-wise maximum over the real tokens (0 if none)
            filled = hidden.masked_fill(~mask[..., None], float("-inf"))
            pooled = (
                filled.amax(1)
                if hidden.shape[1]
                else hidden.new_zeros(hidden.shape[0], hidden.shape[2])
            )
            pooled = torch.where(mask.any(1, keepdim=True), pooled, torch.zeros_like(pooled))
            logits = self.output(self.dropout(pooled))
            return SentenceOutput(logits, None, pooled, hidden, None)
        if self.attention is None or self.uniform:
            w = uniform_weights(mask, hidden.dtype)
            values = hidden if self.attention is None else self._values(hidden)
            pooled = combine_single(w[:, None, :], values).squeeze(1)
            weights = None if self.attention is None else w
        else:
            out = self._attend(hidden, mask)
            pooled, weights, log_prob = out.context, out.weights, out.log_prob
        logits = self.output(self.dropout(pooled))
        return SentenceOutput(logits, weights, pooled, hidden, log_prob)

    def classify_with_weights(self, hidden: Tensor, weights: Tensor) -> Tensor:
        """Logits ``[B, C]`` when the attention weights are replaced by ``weights`` ``[B, n]``
        (the states ``hidden`` ``[B, n, d_h]`` pooled with them through the attention's value
        projection, if any): the hook of the attention-as-explanation tests (permuted,
        adversarial, transferred or uniform weights; Jain & Wallace 2019)."""
        if weights.dim() != 2 or weights.shape != hidden.shape[:2]:
            raise ValueError(
                f"weights has shape {tuple(weights.shape)}, expected [B, n] = "
                f"{list(hidden.shape[:2])}"
            )
        values = hidden if self.attention is None else self._values(hidden)
        pooled = combine_single(weights[:, None, :].to(values.dtype), values).squeeze(1)
        return self.output(self.dropout(pooled))

    def forward(
        self, tokens: Tensor, lengths: Tensor | None = None, mask: Tensor | None = None
    ) -> SentenceOutput:
        """Classify ``tokens`` ``[B, n]`` (see the class docstring)."""
        m = self._check_inputs(tokens, lengths, mask)
        return self.classify(self.encode(tokens, m), m)
