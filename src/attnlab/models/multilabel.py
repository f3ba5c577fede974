"""A multi-label text classifier with capsule-based attention, the attention swappable.

The survey's general task model (TAXONOMY section 0) with one capsule per label:

    x_t = E[w_t]                                   feature model: embeddings (GloVe or learned)
    h_1..h_n = BiRNN(x_1..x_n)                     encoder: bidirectional LSTM or GRU
    capsule attention over h, one capsule per label l      attention model
    p_l in [0, 1], one independent probability per label    output model

The attention is chosen by a spec (``attention=``):

* ``"routing"`` (default; alias ``"capsule"``): dynamic routing by agreement (Sabour et al.
  2017) from the encoder states (the primary capsules, as in Gong et al. 2018) to one class
  capsule per label, the label's probability being the capsule's length -- the capsule
  network for multi-label text classification of Zhao et al. 2019, composed from
  :class:`attnlab.query.capsule.CapsuleRouting`::

      u_(l|i) = W_l h_i;   b_li = 0;   T times: c_li = softmax_l(b_li),
      s_l = sum_i c_li u_(l|i),   v_l = squash(s_l),   b_li += u_(l|i) . v_l
      p_l = |v_l|

  trained with the margin loss (``loss="margin"``, default) or a binary cross entropy on
  the lengths (``loss="bce"``). ``orphan=True`` adds one extra capsule that is never
  a label (Zhao et al.'s "orphan" category): positions that agree with no label can route
  there instead of into a label. The per-label weights are the final couplings ``c_li``.
* ``"capsule-attention"``, or a dict ``{"score": ..., "align": ..., **options}``: per-label
  attention pooling (the capsule attention of Wang et al. 2018,
  :class:`attnlab.query.capsule.CapsuleAttention`): label ``l`` has its own query ``q_l``,
  ``a_l = align(score(q_l, h))``, ``c_l = sum_i a_li h_i``, ``p_l = sigmoid(w_l^T c_l +
  b_l)``, trained with BCE (``loss="bce"``). Any score that takes a query and any
  alignment. A dict with ``"routing": True`` (or routing keys ``iterations``, ``d_caps``,
  ``orphan``, ``primary_dim``) configures the routing instead. ``"uniform": True`` in a
  dict gives the uniform baseline of that attention.
* the baselines ``"mean"`` (mean pooling of the states into a linear multi-label head,
  ``p = sigmoid(W mean_i h_i + b)``; no attention) and ``"uniform"`` (the default
  attention -- routing -- with every label's weights replaced by ``1/n`` over the real
  tokens: ``v_l = squash(mean_i u_(l|i))``).

Sources: Zhao et al. 2019, Towards Scalable and Reliable Capsule Networks for Challenging NLP
Applications (ACL); Gong et al. 2018, Information Aggregation via Dynamic Routing for
Sequence Encoding (COLING); Sabour et al. 2017, Dynamic Routing Between Capsules (NeurIPS);
Wang et al. 2018, Sentiment Analysis by Capsules (WWW).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags, check_int, check_number
from attnlab.feature.multilevel import MaskedRNN
from attnlab.general.padding import masked_mean
from attnlab.models._inputs import check_choice, dict_spec, token_mask
from attnlab.models._pooling import uniform_weights
from attnlab.models._text import TextClassifier, TextOptions
from attnlab.output import output_pytree
from attnlab.query.capsule import (
    CapsuleAttention,
    CapsuleRouting,
    capsule_loss,
    margin_loss,
    squash,
)
from attnlab.registry import register

__all__ = ["CapsuleClassifier", "MultiLabelOutput"]

BASELINES = ("mean", "uniform")
#: the values of ``loss`` (None: the head's own loss)
LOSSES = (None, "margin", "bce")
_ROUTING_NAMES = ("routing", "capsule", "capsule-routing", "dynamic-routing")
_ROUTING_KEYS = ("iterations", "d_caps", "orphan", "primary_dim", "bias")
PROB_EPS = 1e-6


@output_pytree()
@dataclass
class MultiLabelOutput:
    """What :class:`CapsuleClassifier` returns (``L`` labels, ``n`` tokens).

    Attributes:
        probs: ``p_l`` ``[B, L]``, independent label probabilities (the capsule lengths for
            routing, sigmoids otherwise); predict label ``l`` when ``p_l > 0.5``.
        logits: ``log(p / (1 - p))`` ``[B, L]`` (the pre-sigmoid scores for the attention
            and mean heads; the logit of the clamped length for routing).
        weights: per-label weights over the tokens ``[B, L, n]`` (0 on padding): the routing
            couplings ``c_li`` (each real token's couplings sum to 1 over the labels -- and
            the orphan capsule, which is left out), or each label's attention distribution
            (summing to 1 over the real tokens); ``None`` for mean pooling.
        hidden: the encoder states ``[B, n, d_h]`` (0 on padding).
        capsules: the label capsules ``v_l`` ``[B, L, d_caps]`` (routing) or the per-label
            contexts ``c_l`` ``[B, L, d_h]`` (attention); ``None`` for mean pooling.
        extra: what the loss needs besides (the capsule attention's output for its
            reconstruction term).
    """

    probs: Tensor
    logits: Tensor
    weights: Tensor | None
    hidden: Tensor
    capsules: Tensor | None = None
    extra: Any = None

    def predict(self, threshold: float = 0.5) -> Tensor:
        """The bool ``[B, L]`` of ``p_l > threshold``."""
        return self.probs > threshold


@register("model", "capsule-classifier", aliases=("capsule-multilabel",))
class CapsuleClassifier(TextClassifier, default_embed_dim=100, encoder_names=("lstm", "gru")):
    """Multi-label text classifier: embeddings -> BiLSTM/BiGRU -> one capsule per label.

    Args:
        vocab_size: number of token ids (default: the rows of ``embeddings``).
        num_labels: ``L``, the number of labels (capsules).
        embed_dim: embedding size ``d_e`` (default: the columns of ``embeddings``, else 100).
        embeddings: pretrained matrix ``[vocab_size, d_e]`` (tensor, numpy array or
            ``attnlab.data.Embeddings``); copied. ``freeze_embeddings`` keeps it fixed.
        padding_idx: the padding id (no gradient; zero unless pretrained), or None.
        encoder: ``"lstm"`` (default) or ``"gru"``, bidirectional, ``hidden_size`` per
            direction (``d_h = 2 hidden_size``); it reads only the real tokens.
        hidden_size: see ``encoder`` (default 64).
        attention: ``"routing"`` (default), ``"capsule-attention"``, a dict spec, ``"mean"``
            or ``"uniform"`` (see the module docstring).
        d_caps: size of the label capsules for routing (default 16).
        iterations: routing iterations ``T`` (default 3).
        orphan: add an orphan capsule to the routing (default False).
        primary_dim: if given, the primary capsules are ``squash(W_p h_i + b_p)`` of this
            size instead of the states ``h_i`` themselves.
        loss: ``"margin"`` (routing's default: the capsule margin loss with ``m+ = 0.9``,
            ``m- = 0.1``, ``down_weight = 0.5``) or ``"bce"`` (the default of the other
            heads); ``None`` picks the head's default.
        reconstruction: ``lambda`` of the capsule attention's reconstruction term (default
            0: plain BCE).
        dropout: dropout on the embeddings and on the encoder states (training only).

    Shapes: ``forward(tokens [B, n] long, lengths [B] | None, mask [B, n] bool | None)`` ->
    :class:`MultiLabelOutput` (``probs`` and ``logits`` ``[B, L]``, ``weights``
    ``[B, L, n]``). ``loss(output, targets [B, L] multi-hot)`` -> scalar. Padding never
    changes the result; an empty text gives zero capsules (``p_l = 0`` for routing).

    Cost: the encoder O(B n 8 h (d_e + h)) (sequential in n); routing O(B n L d_h d_caps)
    for the predictions plus O(T B n L d_caps) for the iterations, O(B n L d_caps) memory;
    capsule attention O(B L n d_h); mean pooling O(B n d_h + B d_h L).

    :formula: h = BiRNN(E[w_1..w_n]); u_(l|i) = W_l h_i; T times: c_li = softmax_l(b_li), s_l =
        sum_i c_li u_(l|i), v_l = squash(s_l), b_li += u_(l|i) . v_l; p_l = |v_l|; predict l iff
        p_l > 0.5
    :source: Zhao et al. 2019, Towards Scalable and Reliable Capsule Networks for Challenging
        NLP Applications; Gong et al. 2018, Information Aggregation via Dynamic Routing for
        Sequence Encoding
    :cost: encoder O(B n d_e h) sequential in n + routing O(B n L d_h d_caps + T B n L d_caps)
        (capsule attention O(B L n d_h))
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_labels: int = 2,
        *,
        encoder: str = "lstm",
        hidden_size: int = 64,
        attention: str | dict[str, Any] = "routing",
        d_caps: int = 16,
        iterations: int = 3,
        orphan: bool = False,
        primary_dim: int | None = None,
        loss: str | None = None,
        reconstruction: float = 0.0,
        **text: Unpack[TextOptions],
    ) -> None:
        super().__init__(vocab_size, encoder, text, num_labels=num_labels, hidden_size=hidden_size)
        check_choice(loss, "loss", LOSSES)
        check_number(reconstruction, "reconstruction", low=0)  # NaN or inf: a NaN loss
        check_flags(orphan=orphan)
        self.num_labels = int(num_labels)
        self.encoder = MaskedRNN(self.embed_dim, hidden_size, cell=encoder, bidirectional=True)
        self.d_h = self.encoder.out_dim

        self.routing: CapsuleRouting | None = None
        self.capsule_attention: CapsuleAttention | None = None
        self.primary: nn.Linear | None = None
        self.linear: nn.Linear | None = None
        self.orphan = False
        self.head, options = self._head_spec(attention)
        if self.head == "routing":
            routing = {"d_caps": d_caps, "iterations": iterations, "orphan": orphan}
            self._build_routing({"primary_dim": primary_dim, **routing, **options})
            self.loss_name = loss or "margin"
        elif self.head == "attention":
            self.capsule_attention = CapsuleAttention(self.d_h, self.num_labels, **options)
            self.loss_name = loss or "bce"
        else:
            self.linear = nn.Linear(self.d_h, self.num_labels)
            self.loss_name = loss or "bce"
        if self.loss_name == "margin" and self.head != "routing":
            raise ConfigError("loss='margin' needs the routing head (capsule lengths)")
        self.reconstruction = float(reconstruction)

    def _build_routing(self, opts: dict[str, Any]) -> None:
        """The routing head: the optional primary-capsule layer and the routing itself."""
        d_in = self.d_h
        if opts["primary_dim"] is not None:
            d_in = check_int(opts["primary_dim"], "primary_dim")
            self.primary = nn.Linear(self.d_h, d_in)
        self.orphan = bool(opts["orphan"])
        self.routing = CapsuleRouting(
            d_in,
            self.num_labels + int(self.orphan),
            check_int(opts["d_caps"], "d_caps"),
            check_int(opts["iterations"], "iterations"),
            bias=bool(opts.get("bias", False)),
        )

    def _head_spec(self, attention: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the head -- "routing", "attention" or "mean" --, its options) of an attention
        spec; sets ``uniform``."""
        self.uniform = False
        if isinstance(attention, str):
            if attention == "mean":
                return "mean", {}
            if attention in (*_ROUTING_NAMES, "uniform"):
                self.uniform = attention == "uniform"
                return "routing", {}
            if attention in ("capsule-attention", "rnn-capsule"):
                return "attention", {}
            raise ConfigError(
                "attention must be 'routing', 'capsule-attention', 'mean', 'uniform' or a "
                f"dict spec, got {attention!r}"
            )
        spec, self.uniform = dict_spec(attention)
        routing = bool(spec.pop("routing", False)) or any(k in spec for k in _ROUTING_KEYS)
        if not routing:
            return "attention", spec
        unknown = sorted(set(spec) - set(_ROUTING_KEYS))
        if unknown:
            raise ConfigError(
                f"routing takes the options {', '.join(_ROUTING_KEYS)}; got {unknown}"
            )
        return "routing", spec

    # ------------------------------------------------------------------ parts

    def encode(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Encoder states ``[B, n, d_h]`` (zero on padding) of checked inputs."""
        x = self.dropout(self.embedding(tokens))
        x = x * mask.unsqueeze(-1).to(x.dtype)
        return self.dropout(self.encoder(x, mask))

    def _route(self, hidden: Tensor, mask: Tensor) -> MultiLabelOutput:
        assert self.routing is not None
        L = self.num_labels
        primary = hidden
        if self.primary is not None:
            primary = squash(self.primary(hidden)) * mask.unsqueeze(-1).to(hidden.dtype)
        if self.uniform:
            u = self.routing.predictions(primary)  # [B, n, L(+1), d_caps]
            s = masked_mean(u, mask)[:, :L]
            sq = (s * s).sum(-1)
            probs, v = sq / (1 + sq), squash(s)
            w = uniform_weights(mask, hidden.dtype)
            weights = w[:, None, :].expand(-1, L, -1)
        else:
            out = self.routing(primary, mask=mask)
            probs, v, weights = out.probs[:, :L], out.capsules[:, :L], out.weights[:, :L]
        p = probs.clamp(PROB_EPS, 1 - PROB_EPS)
        logits = torch.log(p) - torch.log1p(-p)
        return MultiLabelOutput(probs, logits, weights, hidden, v)

    def _attend(self, hidden: Tensor, mask: Tensor) -> MultiLabelOutput:
        caps = self.capsule_attention
        assert caps is not None
        if self.uniform:
            w = uniform_weights(mask, hidden.dtype)
            contexts = []
            for capsule in caps.capsules:
                values = capsule.value_proj(hidden) if capsule.value_proj is not None else hidden
                contexts.append((w.unsqueeze(-1) * values).sum(1))
            ctx = torch.stack(contexts, 1)  # [B, L, d_v]
            logits = (ctx * caps.prob_weight).sum(-1) + caps.prob_bias
            weights = w[:, None, :].expand(-1, self.num_labels, -1)
            return MultiLabelOutput(torch.sigmoid(logits), logits, weights, hidden, ctx)
        out = caps(hidden, mask=mask, need_weights=True)
        return MultiLabelOutput(out.probs, out.logits, out.weights, hidden, out.contexts, out)

    def classify(self, hidden: Tensor, mask: Tensor) -> MultiLabelOutput:
        """The attention and output layers on encoder states ``hidden`` ``[B, n, d_h]``."""
        if self.head == "routing":
            return self._route(hidden, mask)
        if self.head == "attention":
            return self._attend(hidden, mask)
        assert self.linear is not None
        logits = self.linear(masked_mean(hidden, mask))
        return MultiLabelOutput(torch.sigmoid(logits), logits, None, hidden)

    def forward(
        self, tokens: Tensor, lengths: Tensor | None = None, mask: Tensor | None = None
    ) -> MultiLabelOutput:
        """Label probabilities of ``tokens`` ``[B, n]`` (see the class docstring)."""
        m = token_mask(tokens, lengths, mask, vocab_size=self.vocab_size)
        return self.classify(self.encode(tokens, m), m)

    def loss(self, output: MultiLabelOutput, targets: Tensor) -> Tensor:
        """The training loss, averaged over the batch: the margin loss of the capsule
        lengths, or the BCE summed over the labels (plus the capsule attention's
        reconstruction term when ``reconstruction > 0``). ``targets``: multi-hot
        ``[B, L]`` (0/1, float or bool)."""
        if not isinstance(targets, Tensor):
            raise TypeError(f"targets must be a torch.Tensor [B, L], got {type(targets).__name__}")
        B, L = output.probs.shape
        if tuple(targets.shape) != (B, L):
            raise ValueError(
                f"targets has shape {tuple(targets.shape)}, expected multi-hot [B, L] = [{B}, {L}]"
            )
        y = targets.to(output.probs.dtype)
        if ((y != 0) & (y != 1)).any():
            raise ValueError("targets [B, L] must hold only 0 and 1")
        if self.loss_name == "margin":
            return margin_loss(output.probs, y)
        if self.head == "attention" and self.reconstruction > 0 and output.extra is not None:
            return capsule_loss(output.extra, y, lam=self.reconstruction)  # type: ignore[return-value]
        if self.head == "routing":
            p = output.probs.clamp(PROB_EPS, 1 - PROB_EPS)
            return F.binary_cross_entropy(p, y, reduction="none").sum(-1).mean()
        return F.binary_cross_entropy_with_logits(output.logits, y, reduction="none").sum(-1).mean()
