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
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.feature.multilevel import MaskedRNN
from attnlab.feature.rotatory import LCRRotHop, masked_mean
from attnlab.general.dimensionality import combine_single
from attnlab.masks import from_lengths
from attnlab.models.sentence import _embedding_shape
from attnlab.registry import Configurable, register

__all__ = ["PARTS", "TargetOutput", "TargetSentimentClassifier"]

PARTS = ("left", "target", "right")
ENCODERS = ("bilstm", "bigru", "lstm", "gru")
_RNN = {
    "bilstm": ("lstm", True),
    "bigru": ("gru", True),
    "lstm": ("lstm", False),
    "gru": ("gru", False),
}
_DEFAULT_NAMES = ("lcr-rot-hop", "rotatory", "lcr-rot")


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


@register(
    "model",
    "target-sentiment",
    formula=(
        "H_p = BiLSTM_p(E[part]) for p in left, target, right; r_tl = r_tr = mean(H_t); "
        "for s = 1..S: r_l = att(H_l, r_tl); r_r = att(H_r, r_tr); r_tl = att(H_t, r_l); "
        "r_tr = att(H_t, r_r); y = W_o [r_l; r_r; r_tl; r_tr] + b_o"
    ),
    source=(
        "Zheng & Xia 2018, Left-Center-Right Separated Neural Network for Aspect-based "
        "Sentiment Analysis with Rotatory Attention (LCR-Rot); Wallaart & Frasincar 2019, A "
        "Hybrid Approach for Aspect-Based Sentiment Analysis Using a Lexicalized Domain "
        "Ontology and Attentional Neural Models, ESWC (LCR-Rot-hop)"
    ),
    cost=(
        "BiLSTMs O(B (n_l + n_t + n_r) 8 h (d_e + h)) (sequential in n) + rotatory attention "
        "O(S B (n_l + n_r + 2 n_t) d_h^2) + output O(B 4 d_h C)"
    ),
    aliases=("lcr-rot-hop-classifier", "target"),
)
class TargetSentimentClassifier(Configurable):
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
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        num_classes: int = 3,
        *,
        embed_dim: int | None = None,
        embeddings: Any = None,
        freeze_embeddings: bool = False,
        padding_idx: int | None = 0,
        encoder: str = "bilstm",
        hidden_size: int = 300,
        attention: str | dict[str, Any] = "lcr-rot-hop",
        hops: int = 3,
        share_weights: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        matrix, vocab_size, embed_dim = _embedding_shape(embeddings, vocab_size, embed_dim)
        embed_dim = 300 if embed_dim is None else embed_dim
        for name, value in (
            ("vocab_size", vocab_size),
            ("num_classes", num_classes),
            ("embed_dim", embed_dim),
            ("hidden_size", hidden_size),
            ("hops", hops),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
        if padding_idx is not None and not 0 <= padding_idx < vocab_size:
            raise ConfigError(f"padding_idx={padding_idx} is outside [0, {vocab_size})")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
        if encoder not in ENCODERS:
            raise ConfigError(f"encoder must be one of {ENCODERS}, got {encoder!r}")

        self.vocab_size, self.num_classes = int(vocab_size), int(num_classes)
        self.padding_idx = padding_idx
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        if matrix is not None:
            with torch.no_grad():
                self.embedding.weight.copy_(matrix)
        self.embedding.weight.requires_grad_(not freeze_embeddings)
        self.dropout = nn.Dropout(dropout)
        cell, bidirectional = _RNN[encoder]
        self.encoders = nn.ModuleDict(
            {p: MaskedRNN(embed_dim, hidden_size, cell, bidirectional) for p in PARTS}
        )
        d_h = hidden_size * (2 if bidirectional else 1)
        self.d_h = d_h

        self.uniform = False
        self.rotatory: LCRRotHop | None
        if isinstance(attention, str):
            if attention == "mean":
                self.rotatory = None
            elif attention in (*_DEFAULT_NAMES, "uniform"):
                self.uniform = attention == "uniform"
                n_hops = 1 if attention == "lcr-rot" else hops
                self.rotatory = LCRRotHop(d_h, d_h, hops=n_hops, share_weights=share_weights)
            else:
                raise ConfigError(
                    "attention must be 'lcr-rot-hop', 'lcr-rot', 'mean', 'uniform' or a dict "
                    f"spec, got {attention!r}"
                )
        elif isinstance(attention, dict):
            spec = dict(attention)
            self.uniform = bool(spec.pop("uniform", False))
            score = spec.pop("score", "activated-general")
            align = spec.pop("align", "soft")
            n_hops = spec.pop("hops", hops)
            shared = spec.pop("share_weights", share_weights)
            self.rotatory = LCRRotHop(
                d_h, d_h, hops=n_hops, share_weights=shared, score=score, align=align, **spec
            )
        else:
            raise ConfigError(
                f"attention must be a name or a dict spec, got {type(attention).__name__}"
            )
        self.out_dim = 4 * d_h if self.rotatory is None else self._rotatory_size()
        self.output = nn.Linear(self.out_dim, num_classes)

    # ------------------------------------------------------------------ parts

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
        if not isinstance(tokens, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor [B, n], got {type(tokens).__name__}")
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(
                f"{name} has dtype {tokens.dtype} and shape {tuple(tokens.shape)}, expected an "
                "integer (torch.long) tensor [B, n] of token ids"
            )
        if tokens.dim() != 2 or (B is not None and tokens.shape[0] != B):
            want = "[B, n]" if B is None else f"[B, n] = [{B}, n]"
            raise ValueError(f"{name} has shape {tuple(tokens.shape)}, expected {want}")
        B, n = tokens.shape
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(
                f"{name} (shape {tuple(tokens.shape)}) holds ids in [{int(tokens.min())}, "
                f"{int(tokens.max())}], outside [0, vocab_size) = [0, {self.vocab_size})"
            )
        if lengths is not None and mask is not None:
            raise ValueError(f"give {name}_lengths or {name}_mask, not both")
        if lengths is not None:
            t = lengths if isinstance(lengths, Tensor) else torch.as_tensor(lengths)
            if t.dtype.is_floating_point or t.dtype == torch.bool:
                raise TypeError(
                    f"{name}_lengths has dtype {t.dtype} and shape {tuple(t.shape)}, expected "
                    f"an integer tensor [B] = [{B}]"
                )
            if tuple(t.shape) != (B,):
                raise ValueError(f"{name}_lengths has shape {tuple(t.shape)}, expected [B] = [{B}]")
            if B and (int(t.min()) < 0 or int(t.max()) > n):
                raise ValueError(
                    f"{name}_lengths (shape {tuple(t.shape)}) holds values in "
                    f"[{int(t.min())}, {int(t.max())}], outside [0, n] = [0, {n}] for {name} "
                    f"of shape {tuple(tokens.shape)}"
                )
            return from_lengths(t.to(tokens.device), n)[:, 0, :]
        if mask is not None:
            if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
                raise TypeError(
                    f"{name}_mask must be a torch.bool tensor [B, n] = [{B}, {n}], got "
                    f"{getattr(mask, 'dtype', type(mask).__name__)}"
                )
            if tuple(mask.shape) != (B, n):
                raise ValueError(
                    f"{name}_mask has shape {tuple(mask.shape)}, expected [B, n] = [{B}, {n}]"
                )
            return mask.to(tokens.device)
        return torch.ones(B, n, dtype=torch.bool, device=tokens.device)

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
            out = self.rotatory(hl, ht, hr, ml, mt, mr)
            rep, hops = out.output, out.hops
        logits = self.output(self.dropout(rep))
        return TargetOutput(logits, rep, hops, h, masks)

    def _uniform(
        self, hl: Tensor, ht: Tensor, hr: Tensor, ml: Tensor, mt: Tensor, mr: Tensor
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """Rotatory attention with every weight ``1/n`` over the real tokens of its part
        (each of the four attentions pools its own values)."""
        assert self.rotatory is not None

        def uniform(m: Tensor, dtype: torch.dtype) -> Tensor:
            w = m.to(dtype)
            return w / w.sum(1, keepdim=True).clamp(min=1.0)

        wl, wt, wr = uniform(ml, hl.dtype), uniform(mt, ht.dtype), uniform(mr, hr.dtype)
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
                values = attn.value_proj(feats) if attn.value_proj is not None else feats
                contexts.append(combine_single(w[:, None, :], values).squeeze(1))
            hops.append({"left": wl, "right": wr, "target_left": wt, "target_right": wt})
        return torch.cat(contexts, dim=-1), hops
