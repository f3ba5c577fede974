"""A visual question answering model with co-attention (Lu et al. 2016), the attention
swappable.

The survey's general task model (TAXONOMY section 0) for VQA:

    V = CNN(image) + P                   feature model: a grid of R = g x g region vectors
                                         [B, R, d] (+ a learned embedding P of each
                                         region's position, ``region_positions=True``)
    Q = BiRNN(E[w_1..w_n])               feature model: word vectors [B, n, d]
    (c_q, a_q), (c_v, a_v) = CoAtt(Q, V) attention model: co-attention between the words
                                         and the regions (each guided by the other)
    y = W_o tanh(W_h [c_q; c_v] + b_h) + b_o     output model: logits over the answers

The co-attention is chosen by a spec:

* ``"parallel"`` (default): Lu et al.'s parallel co-attention,
  :class:`~attnlab.feature.co_attention.ParallelCoAttention`: affinity
  ``A = tanh(Q W_A V^T)``, ``e_q = w_q^T tanh(W_q Q + A W_v V)``,
  ``e_v = w_v^T tanh(W_v V + A^T W_q Q)``, ``a = align(e)``;
* ``"alternating"``: Lu et al.'s alternating co-attention
  (:class:`~attnlab.feature.co_attention.AlternatingCoAttention`): summarise the question
  with a query-less attention, attend over the regions with that summary as the query,
  then over the words with the attended image as the query (``score`` pluggable,
  additive by default);
* ``"interactive"``: Ma et al. 2017's interactive co-attention (each side attended with
  the other's mean as the query);
* a dict ``{"co_attention": "parallel" | "alternating" | "interactive", **options}``: the
  options go to the co-attention module (``align``, ``score``, ``affinity``, ``scores``,
  ``d_w``, ...). Without ``co_attention``, a ``score`` key selects ``"alternating"``
  (parallel co-attention has no score function: its scores come from the affinity), else
  ``"parallel"``. ``"uniform": True`` gives the uniform baseline of that co-attention;
* a built module called as ``module(Q, V, mask_q, mask_v)`` returning a
  :class:`~attnlab.feature.co_attention.CoAttentionOutput` with sizes ``d``;
* the baselines ``"mean"`` (``c_q`` = mean of the real words, ``c_v`` = mean of the
  regions; no attention parameters) and ``"uniform"`` (the default co-attention kept, its
  weights replaced by ``1/n`` and ``1/R``: the same contexts as mean pooling).

Source: J. Lu, J. Yang, D. Batra, D. Parikh, "Hierarchical Question-Image Co-Attention for
Visual Question Answering", NeurIPS 2016. (HieCoAtt co-attends at the word, phrase and
question levels; this model co-attends once, over BiRNN word states.)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags, check_int, found_on_host
from attnlab._recurrent import bound_rnn_weights
from attnlab.feature.co_attention import CoAttentionOutput, masked_mean
from attnlab.models._inputs import (
    check_choice,
    check_dropout,
    check_index,
    check_sizes,
    token_mask,
)
from attnlab.models._pooling import uniform_weights
from attnlab.models._rnn import run_packed
from attnlab.output import output_pytree
from attnlab.registry import Configurable, get, register

__all__ = ["CO_ATTENTIONS", "VQAModel", "VQAOutput"]

BASELINES = ("mean", "uniform")
#: the co-attention variants by their short names -> registry names (kind "feature")
CO_ATTENTIONS = {
    "parallel": "parallel-co-attention",
    "alternating": "alternating-co-attention",
    "interactive": "interactive-co-attention",
}
ENCODERS = ("bilstm", "bigru")


@output_pytree()
@dataclass
class VQAOutput:
    """What :class:`VQAModel` returns.

    Attributes:
        logits: ``[B, C]`` answer scores (before softmax).
        region_weights: ``[B, R]`` attention over the image regions (row-major over the
            ``grid x grid`` cells; ``1/R`` for the baselines).
        word_weights: ``[B, n]`` attention over the question words (0 on padding; ``1/len``
            over the real words for the baselines).
        regions: ``[B, R, d]`` the region features ``V``.
        words: ``[B, n, d]`` the word features ``Q`` (0 on padding).
        log_prob: for stochastic alignments, the log-probability of the sampled choices
            ``[B]`` (for a REINFORCE loss); else None.
        extras: the co-attention's extras (affinity, scores, ...).
    """

    logits: Tensor
    region_weights: Tensor
    word_weights: Tensor
    regions: Tensor
    words: Tensor
    log_prob: Tensor | None = None
    extras: dict[str, Any] = field(default_factory=dict)


@register("model", "vqa", aliases=("vqa-model", "vqa-co-attention"))
class VQAModel(Configurable):
    """VQA model: CNN regions + BiRNN words -> co-attention -> answer classifier.

    Args:
        vocab_size: number of word ids (``padding_idx`` is the padding id).
        num_answers: ``C``, the number of answer classes.
        embed_dim: word embedding size ``d_e`` (default 32).
        hidden_size: ``h``; the RNN has ``h`` units per direction and the regions and
            words both have ``d = 2 h`` features (default 32).
        encoder: ``"bilstm"`` or ``"bigru"``.
        image_size: input images are ``image_size x image_size x 3`` (default 64).
        grid: the CNN gives ``grid x grid`` regions (default 8); ``image_size / grid`` must
            be a power of 2 (one 3x3 conv + ReLU + 2x2 max-pool block per halving).
        channels: the conv widths of all blocks but the last (which has ``d``); a shorter
            tuple repeats its last entry (default ``(16, 32)``).
        region_positions: add a learned embedding of each region's position to ``V``.
        attention: see the module docstring (default ``"parallel"``).
        dropout: on the pooled vector (training only).
        padding_idx: the padding word id (default 0).

    Shapes: ``forward(images [B, H, W, 3] (uint8 0..255 or float 0..1), tokens [B, n]
    long, lengths [B] | None, mask [B, n] | None)`` -> :class:`VQAOutput`. Give ``lengths``
    (real words first) or a prefix ``mask``; with neither, every position is a real word.

    Cost: the CNN (O(B H W 9 sum c_in c_out)) and the BiRNN (O(B n 8 h (d_e + h)) for the
    LSTM, sequential in n) dominate; parallel co-attention adds O(B n R d + B (n + R) d
    d_w), the output layer O(B d (d + C)).

    Source: Lu et al. 2016 (see the module docstring).

    :formula: V = CNN(image) [B, R, d]; Q = BiRNN(E[w]) [B, n, d]; (c_q, c_v) = CoAtt(Q, V); y =
        W_o tanh(W_h [c_q; c_v] + b_h) + b_o
    :source: Lu, Yang, Batra & Parikh 2016, Hierarchical Question-Image Co-Attention for Visual
        Question Answering, NeurIPS
    :cost: CNN O(B H W k^2 sum c_in c_out) + BiRNN O(B n h (d_e + h)) + parallel co-attention
        O(B n R d) + output O(B d C)
    """

    def __init__(
        self,
        vocab_size: int,
        num_answers: int,
        *,
        embed_dim: int = 32,
        hidden_size: int = 32,
        encoder: str = "bilstm",
        image_size: int = 64,
        grid: int = 8,
        channels: Sequence[int] = (16, 32),
        region_positions: bool = True,
        attention: str | dict[str, Any] | nn.Module = "parallel",
        dropout: float = 0.0,
        padding_idx: int | None = 0,
    ) -> None:
        super().__init__()
        check_sizes(vocab_size=vocab_size, num_answers=num_answers, embed_dim=embed_dim)
        check_sizes(hidden_size=hidden_size, image_size=image_size, grid=grid)
        check_choice(encoder, "encoder", ENCODERS)
        ratio = image_size // grid
        if image_size % grid or ratio < 2 or ratio & (ratio - 1):
            raise ConfigError(
                f"image_size / grid must be a power of 2 >= 2, got image_size={image_size}, "
                f"grid={grid}"
            )
        widths = [check_int(c, "channels") for c in channels]
        if not widths:
            raise ConfigError("channels must hold at least one width")
        check_dropout(dropout)
        check_index(vocab_size, padding_idx=padding_idx)

        self.vocab_size, self.num_answers = vocab_size, num_answers
        self.image_size, self.grid = image_size, grid
        self.num_regions = grid * grid
        d = self.d = 2 * hidden_size
        stages = int(math.log2(ratio))
        sizes = [3] + [widths[min(i, len(widths) - 1)] for i in range(stages - 1)] + [d]
        blocks: list[nn.Module] = []
        for c_in, c_out in itertools.pairwise(sizes):
            blocks += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        self.cnn = nn.Sequential(*blocks)
        check_flags(region_positions=region_positions)
        if region_positions:
            self.positions = nn.Parameter(torch.randn(self.num_regions, d) * 0.1)
        else:
            self.register_parameter("positions", None)

        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        rnn = nn.LSTM if encoder == "bilstm" else nn.GRU
        self.rnn = rnn(embed_dim, hidden_size, batch_first=True, bidirectional=True)
        self._rnn_weights = bound_rnn_weights(self, "rnn")

        self.uniform = False
        self.co_attention: nn.Module | None = self._build_attention(attention, d)
        self.hidden = nn.Linear(2 * d, d)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(d, num_answers)

    def _build_attention(self, attention: Any, d: int) -> nn.Module | None:
        if isinstance(attention, nn.Module):
            return attention
        if isinstance(attention, str):
            if attention == "mean":
                return None
            if attention == "uniform":
                self.uniform = True
                return get("feature", CO_ATTENTIONS["parallel"]).cls(d, d)
            if attention in CO_ATTENTIONS:
                return get("feature", CO_ATTENTIONS[attention]).cls(d, d)
            raise ConfigError(
                f"attention must be one of {sorted(CO_ATTENTIONS)}, 'mean', 'uniform', a dict "
                f"spec or a module, got {attention!r}"
            )
        if isinstance(attention, Mapping):
            spec = dict(attention)
            name = spec.pop("name", None)
            if name in BASELINES and not spec:
                return self._build_attention(name, d)
            if name is not None:
                raise ConfigError(
                    f"the model's attention dict takes co_attention=..., not name={name!r} "
                    "(presets are the task's business)"
                )
            self.uniform = bool(spec.pop("uniform", False))
            variant = spec.pop("co_attention", "alternating" if "score" in spec else "parallel")
            if variant not in CO_ATTENTIONS:
                raise ConfigError(
                    f"co_attention must be one of {sorted(CO_ATTENTIONS)}, got {variant!r}"
                )
            return get("feature", CO_ATTENTIONS[variant]).cls(d, d, **spec)
        raise ConfigError(
            f"attention must be a name, a dict spec or a module, got {type(attention).__name__}"
        )

    # ------------------------------------------------------------------ inputs

    def _check_images(self, images: Tensor) -> Tensor:
        if not isinstance(images, Tensor):
            raise TypeError(f"images must be a torch.Tensor, got {type(images).__name__}")
        s = self.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (s, s, 3):
            raise ValueError(
                f"images has shape {tuple(images.shape)}, expected [B, H, W, 3] = [B, {s}, {s}, 3]"
            )
        param = self.output.weight
        if images.dtype == torch.uint8:
            return images.to(param.dtype) / 255.0
        if not images.dtype.is_floating_point:
            raise TypeError(
                f"images has dtype {images.dtype}, expected uint8 (0..255) or float (0..1)"
            )
        return images.to(param.dtype)

    def _check_tokens(
        self, tokens: Tensor, lengths: Tensor | None, mask: Tensor | None, batch: int
    ) -> Tensor:
        return token_mask(
            tokens,
            lengths,
            mask,
            vocab_size=self.vocab_size,
            batch=batch,
            batch_of="the number of images",
            prefix="the question encoder",
        )

    @staticmethod
    def _check_index(index: Tensor, m: int) -> Tensor:
        if not isinstance(index, Tensor):
            raise TypeError(f"image_index must be a torch.Tensor [B], got {type(index).__name__}")
        if index.dtype.is_floating_point or index.dtype == torch.bool or index.dim() != 1:
            raise TypeError(
                f"image_index has dtype {index.dtype} and shape {tuple(index.shape)}, expected "
                "an integer tensor [B]"
            )
        if found_on_host((index < 0) | (index >= m)):
            raise ValueError(
                f"image_index holds values in [{int(index.min())}, {int(index.max())}], outside "
                f"[0, M) = [0, {m}) for {m} images"
            )
        return index.long()

    # ------------------------------------------------------------------ parts

    def encode_image(self, images: Tensor) -> Tensor:
        """Region features ``V`` ``[B, R, d]`` of checked float images ``[B, H, W, 3]``."""
        fmap = self.cnn(images.permute(0, 3, 1, 2))  # [B, d, g, g]
        regions = fmap.flatten(2).transpose(1, 2)  # [B, R, d], row-major cells
        if self.positions is not None:
            regions = regions + self.positions
        return regions

    def encode_question(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """Word features ``Q`` ``[B, n, d]`` (0 on padding)."""
        B, n = tokens.shape
        x = self.embedding(tokens)
        if B == 0 or n == 0:
            return x.new_zeros(B, n, self.d)
        h = run_packed(self._rnn_weights, x, mask.sum(1), training=self.training)
        return h * mask.unsqueeze(-1).to(h.dtype)

    def forward(
        self,
        images: Tensor,
        tokens: Tensor,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        image_index: Tensor | None = None,
    ) -> VQAOutput:
        """Answer the questions ``tokens`` about ``images`` (see the class docstring).

        With ``image_index`` ``[B]`` (long), ``images`` holds ``M`` distinct images
        ``[M, H, W, 3]`` and question ``i`` is about ``images[image_index[i]]``: the CNN runs
        once per image however many questions ask about it.
        """
        imgs = self._check_images(images)
        if image_index is None:
            m = self._check_tokens(tokens, lengths, mask, imgs.shape[0])
            V = self.encode_image(imgs)
        else:
            index = self._check_index(image_index, imgs.shape[0])
            m = self._check_tokens(tokens, lengths, mask, index.shape[0])
            V = self.encode_image(imgs)[index]
        Q = self.encode_question(tokens, m)
        log_prob, extras = None, {}
        if self.co_attention is None or self.uniform:
            wq = uniform_weights(m, Q.dtype)
            wv = V.new_full(V.shape[:2], 1.0 / V.shape[1])
            pooled = torch.cat([masked_mean(Q, m), V.mean(1)], -1)
        else:
            out: CoAttentionOutput = self.co_attention(Q, V, mask1=m, mask2=None)
            wq, wv = out.a1, out.a2
            pooled = torch.cat([out.c1, out.c2], -1)
            extras = dict(out.extras)
            parts = [v for k, v in extras.items() if k.startswith("log_prob")]
            if parts:
                log_prob = sum(p.reshape(p.shape[0], -1).sum(1) for p in parts)
        h = torch.tanh(self.hidden(self.dropout(pooled)))
        logits = self.output(self.dropout(h))
        return VQAOutput(logits, wv, wq, V, Q, log_prob, extras)
