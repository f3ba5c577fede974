"""Target-dependent sentiment with rotatory attention: LCR-Rot (Zheng & Xia 2018) and
LCR-Rot-hop (Wallaart & Frasincar 2019), with the attention swappable.

A sentence is cut around the target phrase into a left context, the target and a right
context. Each part has its own BiLSTM; rotatory attention
(:class:`~attnlab.feature.rotatory.LCRRotHop`) lets the target and the two contexts attend
to each other in turn, and a linear layer classifies the concatenated vectors:

    H_l = BiLSTM_l(E[left]),  H_t = BiLSTM_t(E[target]),  H_r = BiLSTM_r(E[right])
    r_tl = r_tr = mean(H_t)
    for s = 1..S:  r_l  = att(H_l, r_tl);  r_r  = att(H_r, r_tr)
                   r_tl = att(H_t, r_l);   r_tr = att(H_t, r_r)
    y = W_o [r_l; r_r; r_tl; r_tr] + b_o

``att(H, q)`` is an :class:`attnlab.Attention`; the papers' is the activated general score
``tanh(h^T W q + b)`` with softmax alignment. ``S = 1`` is LCR-Rot, ``S = 3`` the default
of LCR-Rot-hop.

Sources: Shiliang Zheng and Rui Xia 2018, "Left-Center-Right Separated Neural Network for
Aspect-based Sentiment Analysis with Rotatory Attention", arXiv:1802.00892; Olaf Wallaart
and Flavius Frasincar 2019, "A Hybrid Approach for Aspect-Based Sentiment Analysis Using a
Lexicalized Domain Ontology and Attentional Neural Models", ESWC 2019, LNCS 11503.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Unpack

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags
from attnlab.feature.rotatory import LCRRotHop, masked_mean
from attnlab.models._inputs import dict_spec, token_mask
from attnlab.models._pooling import uniform_context, uniform_weights
from attnlab.models._rnn import masked_rnn
from attnlab.models._text import TextClassifier, TextOptions
from attnlab.output import output_pytree
from attnlab.registry import register

__all__ = ["PARTS", "TargetOutput", "TargetSentimentClassifier"]

PARTS = ("left", "target", "right")
ENCODERS = ("bilstm", "bigru", "lstm", "gru")
_DEFAULT_NAMES = ("lcr-rot-hop", "rotatory", "lcr-rot")


@output_pytree()
@dataclass
class TargetOutput:
    """What :class:`TargetSentimentClassifier` returns.

    Attributes:
        logits: ``[B, C]`` class scores.
        representation: ``[r_l; r_r; r_tl; r_tr]`` ``[B, 4 d_h]`` fed to the output layer.
        hops: one dict per hop with the weights ``"left"`` ``[B, n_l]``, ``"right"``
            ``[B, n_r]``, ``"target_left"`` and ``"target_right"`` ``[B, n_t]`` (zero on
            padding; summing to 1 over the real tokens of a non-empty part). Empty for mean
            pooling.
        hidden: the BiLSTM states of each part, ``{"left": [B, n_l, d_h], ...}`` (zero on
            padding).
        masks: the token masks of each part, ``{"left": [B, n_l], ...}``.
    """

    logits: Tensor
    representation: Tensor
    hops: list[dict[str, Tensor]] = field(default_factory=list)
    hidden: dict[str, Tensor] = field(default_factory=dict)
    masks: dict[str, Tensor] = field(default_factory=dict)

    @property
    def weights(self) -> dict[str, Tensor] | None:
        """The weights of the last hop (None for mean pooling)."""
        return self.hops[-1] if self.hops else None


@register("model", "target-sentiment", aliases=("lcr-rot-hop-classifier", "target"))
class TargetSentimentClassifier(TextClassifier, default_embed_dim=300, encoder_names=ENCODERS):
    """LCR-Rot-hop: three BiLSTMs, rotatory attention over S hops, a linear output layer.

    Args:
        vocab_size: number of token ids (default: the rows of ``embeddings``).
        num_classes: ``C`` (default 3: negative, neutral, positive).
        embed_dim: embedding size ``d_e`` (default: the columns of ``embeddings``, else 300
            as in the papers).
        embeddings: pretrained matrix ``[vocab_size, d_e]`` (tensor, numpy array or
            ``attnlab.data.Embeddings``); copied.
        freeze_embeddings: keep the embedding matrix fixed during training.
        padding_idx: the padding id, or None.
        encoder: ``"bilstm"`` (default, the papers'), ``"bigru"``, ``"lstm"`` or ``"gru"``;
            one per part, ``hidden_size`` units per direction.
        hidden_size: units per direction (default 300, as in the papers); ``d_h = 2
            hidden_size`` for the bidirectional encoders.
        attention: ``"lcr-rot-hop"`` (default: activated general score, softmax, ``hops``
            rotations), ``"lcr-rot"`` (one rotation), a dict ``{"score": ..., "align": ...,
            "hops": ..., "share_weights": ..., **options}`` (any registered score that takes
            a query, any alignment; ``"uniform": True`` gives its uniform baseline), or the
            baselines ``"mean"`` and ``"uniform"``.
        hops: ``S`` for the default attention (default 3, as in LCR-Rot-hop).
        share_weights: reuse the four attentions in every hop (default) or give each hop
            its own.
        dropout: dropout on the embeddings and on the representation (training only).

    Shapes: ``forward(left [B, n_l], target [B, n_t], right [B, n_r] long, *,
    left_lengths, target_lengths, right_lengths [B] | None, left_mask, target_mask,
    right_mask [B, n] bool | None)`` -> :class:`TargetOutput` (``logits`` ``[B, C]``).
    For each part give its lengths (real tokens first) or its mask (True = real token,
    any pattern); with neither every position is real. Any part may be empty (``n = 0``
    or length 0, e.g. a target at the start of the sentence has no left context): its
    vector is zero.

    Baselines: ``"mean"`` gives ``[mean H_l; mean H_r; mean H_t; mean H_t]`` (no attention
    parameters, the same output layer). ``"uniform"`` keeps the rotatory attention
    (parameters and checkpoint layout) but sets every weight to ``1/n`` over the real
    tokens of the part; it pools each attention's values (the states themselves with
    the default attention, so it equals mean pooling). ``model.uniform = True`` on a
    trained model gives the uniform test.

    Cost: the BiLSTMs O(B (n_l + n_t + n_r) 8 h (d_e + h)), sequential in the length;
    the rotatory attention O(S B (n_l + n_r + 2 n_t) d_h^2) for the activated general
    score; the output layer O(B 4 d_h C).

    Sources: Zheng & Xia 2018 (LCR-Rot), arXiv:1802.00892; Wallaart & Frasincar 2019
    (LCR-Rot-hop), ESWC.

    :formula: H_p = BiLSTM_p(E[part]) for p in left, target, right; r_tl = r_tr = mean(H_t); for
        s = 1..S: r_l = att(H_l, r_tl); r_r = att(H_r, r_tr); r_tl = att(H_t, r_l); r_tr =
        att(H_t, r_r); y = W_o [r_l; r_r; r_tl; r_tr] + b_o
    :source: Zheng & Xia 2018, Left-Center-Right Separated Neural Network for Aspect-based
        Sentiment Analysis with Rotatory Attention (LCR-Rot); Wallaart & Frasincar 2019, A
        Hybrid Approach for Aspect-Based Sentiment Analysis Using a Lexicalized Domain Ontology
        and Attentional Neural Models, ESWC (LCR-Rot-hop)
    :cost: BiLSTMs O(B (n_l + n_t + n_r) 8 h (d_e + h)) (sequential in n) + rotatory attention
        O(S B (n_l + n_r + 2 n_t) d_h^2) + output O(B 4 d_h C)
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_classes: int = 3,
        *,
        encoder: str = "bilstm",
        hidden_size: int = 300,
        attention: str | dict[str, Any] = "lcr-rot-hop",
        hops: int = 3,
        share_weights: bool = True,
        **text: Unpack[TextOptions],
    ) -> None:
        super().__init__(
            vocab_size, encoder, text, num_classes=num_classes, hidden_size=hidden_size, hops=hops
        )
        self.num_classes = int(num_classes)
        self.encoders = nn.ModuleDict(
            {p: masked_rnn(encoder, self.embed_dim, hidden_size) for p in PARTS}
        )
        d_h = self.d_h = self.encoders["left"].out_dim

        self.uniform = False
        check_flags(share_weights=share_weights)
        self.rotatory: LCRRotHop | None = self._make_attention(attention, hops, share_weights)
        self.out_dim = 4 * d_h if self.rotatory is None else self._rotatory_size()
        self.output = nn.Linear(self.out_dim, num_classes)

    # ------------------------------------------------------------------ parts

    def _make_attention(self, attention: Any, hops: int, share_weights: bool) -> LCRRotHop | None:
        """The rotatory attention of a spec (None for the mean baseline); sets ``uniform``."""
        d_h = self.d_h
        if isinstance(attention, str):
            if attention == "mean":
                return None
            if attention in (*_DEFAULT_NAMES, "uniform"):
                self.uniform = attention == "uniform"
                n_hops = 1 if attention == "lcr-rot" else hops
                return LCRRotHop(d_h, d_h, hops=n_hops, share_weights=share_weights)
            raise ConfigError(
                "attention must be 'lcr-rot-hop', 'lcr-rot', 'mean', 'uniform' or a dict "
                f"spec, got {attention!r}"
            )
        spec, self.uniform = dict_spec(attention)
        score = spec.pop("score", "activated-general")
        align = spec.pop("align", "soft")
        n_hops = spec.pop("hops", hops)
        shared = spec.pop("share_weights", share_weights)
        return LCRRotHop(
            d_h, d_h, hops=n_hops, share_weights=shared, score=score, align=align, **spec
        )

    def _rotatory_size(self) -> int:
        assert self.rotatory is not None
        with torch.no_grad():
            param = next(self.rotatory.parameters(), None)
            dtype = param.dtype if param is not None else torch.float32
            was = self.rotatory.training
            self.rotatory.eval()
            z = torch.zeros(1, 1, self.d_h, dtype=dtype)
            out = self.rotatory(z, z, z)
            self.rotatory.train(was)
        return int(out.output.shape[-1])

    def _check_part(self, name: str, tokens: Any, lengths: Any, mask: Any, B: int | None) -> Tensor:
        return token_mask(tokens, lengths, mask, vocab_size=self.vocab_size, part=name, batch=B)

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        left: Tensor,
        target: Tensor,
        right: Tensor,
        *,
        left_lengths: Tensor | None = None,
        target_lengths: Tensor | None = None,
        right_lengths: Tensor | None = None,
        left_mask: Tensor | None = None,
        target_mask: Tensor | None = None,
        right_mask: Tensor | None = None,
    ) -> TargetOutput:
        """Classify the sentiment towards ``target`` (see the class docstring)."""
        tm = self._check_part("target", target, target_lengths, target_mask, None)
        B = target.shape[0]
        lm = self._check_part("left", left, left_lengths, left_mask, B)
        rm = self._check_part("right", right, right_lengths, right_mask, B)
        masks = {"left": lm, "target": tm, "right": rm}
        tokens = {"left": left, "target": target, "right": right}
        x = {}
        for part in PARTS:
            e = self.dropout(self.embedding(tokens[part]))
            x[part] = e * masks[part][..., None].to(e.dtype)
        return self.classify(x, masks)

    def encode(self, x: dict[str, Tensor], masks: dict[str, Tensor]) -> dict[str, Tensor]:
        """The BiLSTM states of each part (zero on padding) from its word vectors."""
        return {p: self.encoders[p](x[p], masks[p]) for p in PARTS}

    def classify(self, x: dict[str, Tensor], masks: dict[str, Tensor]) -> TargetOutput:
        """The model after the embeddings: ``x[part]`` ``[B, n, d_e]`` with ``masks[part]``
        ``[B, n]`` (used by gradcheck)."""
        h = self.encode(x, masks)
        hl, ht, hr = h["left"], h["target"], h["right"]
        ml, mt, mr = masks["left"], masks["target"], masks["right"]
        hops: list[dict[str, Tensor]] = []
        if self.rotatory is None:
            t = masked_mean(ht, mt)
            rep = torch.cat([masked_mean(hl, ml), masked_mean(hr, mr), t, t], dim=-1)
        elif self.uniform:
            rep, hops = self._uniform(hl, ht, hr, ml, mt, mr)
        else:
            out = self.rotatory(hl, ht, hr, left_mask=ml, target_mask=mt, right_mask=mr)
            rep, hops = out.output, out.hops
        logits = self.output(self.dropout(rep))
        return TargetOutput(logits, rep, hops, h, masks)

    def _uniform(
        self, hl: Tensor, ht: Tensor, hr: Tensor, ml: Tensor, mt: Tensor, mr: Tensor
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """Rotatory attention with every weight ``1/n`` over the real tokens of its part
        (each of the four attentions pools its own values)."""
        assert self.rotatory is not None

        wl, wt, wr = (uniform_weights(m, h.dtype) for m, h in ((ml, hl), (mt, ht), (mr, hr)))
        hops, contexts = [], []
        for s in range(self.rotatory.hops):
            rot = self.rotatory.rotations[s % len(self.rotatory.rotations)]
            contexts = []
            for attn, w, feats in (
                (rot.left, wl, hl),
                (rot.right, wr, hr),
                (rot.target_left, wt, ht),
                (rot.target_right, wt, ht),
            ):
                contexts.append(uniform_context(attn, w, feats))
            hops.append({"left": wl, "right": wr, "target_left": wt, "target_right": wt})
        return torch.cat(contexts, dim=-1), hops
