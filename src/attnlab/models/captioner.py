"""Image captioning with visual attention: "Show, Attend and Tell" (Xu et al. 2015), with
the attention swappable.

A small CNN turns the image into a ``g x g`` grid of annotation vectors ``a_1..a_R``
(``R = g^2``, row-major cells, each ``d`` features, plus a learned embedding of the cell's
position); an LSTM decoder generates the caption one word at a time::

    h_0 = tanh(W_h mean_l a_l),  c_0 = tanh(W_c mean_l a_l)
    e_{t,l} = score(h_{t-1}, a_l);  alpha_t = align(e_t);  z_t = sum_l alpha_{t,l} a_l
    h_t, c_t = LSTM([E y_{t-1}; z_t], (h_{t-1}, c_{t-1}))
    p(y_t) = softmax(W_o tanh(W_p [h_t; z_t; E y_{t-1}]))

Soft attention is ``align="soft"``; Xu et al.'s hard attention is ``align="hard"`` (one
cell sampled from ``softmax(e_t)``, trained with REINFORCE -- the ``log_prob`` of the
samples is returned for the task's loss -- or the straight-through Gumbel-softmax,
``estimator="gumbel"``). Any registered score works (Xu et al. use the additive one), and
any alignment but local-m (its window centre ``p_t = t`` needs keys ordered like the
words: a ``ConfigError``; local-p predicts the centre);
with ``score="location-aware"`` the previous step's weights are passed along. Baselines:
``"mean"`` (``z_t`` = the mean of the annotation vectors, no attention parameters) and
``"uniform"`` (the attention module kept, its weights replaced by ``1/R``).

Source: K. Xu, J. Ba, R. Kiros, K. Cho, A. Courville, R. Salakhutdinov, R. Zemel and Y.
Bengio, "Show, Attend and Tell: Neural Image Caption Generation with Visual Attention",
ICML 2015.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags, check_number
from attnlab.general.attention import Attention
from attnlab.models._decoder import decoder_attention, greedy_decode, teacher_forcing
from attnlab.models._inputs import check_dropout, check_index, check_sizes
from attnlab.models._pooling import uniform_context
from attnlab.output import output_pytree
from attnlab.registry import Configurable, register

__all__ = ["Caption", "CaptionerOutput", "ShowAttendTell", "grid_cnn", "image_tensor"]


@output_pytree()
@dataclass
class CaptionerOutput:
    """Teacher-forced result: ``logits`` ``[B, T, V]``, attention ``weights`` ``[B, T, R]``
    (one row per generated word: the attention that produced it), and for stochastic
    alignments the ``log_prob`` ``[B, T]`` of each step's sampled cell (else None)."""

    logits: Tensor
    weights: Tensor
    log_prob: Tensor | None = None


@dataclass
class Caption:
    """Greedy captions: ``tokens`` per image (ids, without BOS/EOS) and ``attention`` per
    image (``[len(tokens), R]``, the weights that produced each word)."""

    tokens: list[list[int]]
    attention: list[Tensor]


def grid_cnn(image_size: int, grid: int, channels: Sequence[int], out_dim: int) -> nn.Sequential:
    """A CNN from ``[B, 3, S, S]`` images to ``[B, out_dim, g, g]`` feature maps: one 3x3
    conv + ReLU + 2x2 max-pool block per halving of ``S / g`` (a power of 2); the blocks
    have the widths ``channels`` (the last entry repeated) and the last one ``out_dim``."""
    ratio = image_size // grid if grid > 0 else 0
    if grid < 1 or image_size % grid or ratio < 2 or ratio & (ratio - 1):
        raise ConfigError(
            f"image_size / grid must be a power of 2 >= 2, got image_size={image_size}, grid={grid}"
        )
    widths = [int(c) for c in channels]
    if not widths or min(widths) < 1:
        raise ConfigError(f"channels must hold positive widths, got {list(channels)}")
    stages = int(math.log2(ratio))
    sizes = [3] + [widths[min(i, len(widths) - 1)] for i in range(stages - 1)] + [out_dim]
    blocks: list[nn.Module] = []
    for c_in, c_out in itertools.pairwise(sizes):
        blocks += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*blocks)


def image_tensor(images: Tensor, size: int, dtype: torch.dtype) -> Tensor:
    """``[B, S, S, 3]`` images (uint8 0..255 or float 0..1) as float ``[B, 3, S, S]`` in
    [0, 1]; a wrong shape or dtype raises naming the expected one."""
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a torch.Tensor [B, S, S, 3], got {type(images).__name__}")
    if images.dim() != 4 or tuple(images.shape[1:]) != (size, size, 3):
        raise ValueError(
            f"images has shape {tuple(images.shape)}, expected [B, S, S, 3] = "
            f"[B, {size}, {size}, 3]"
        )
    if images.dtype == torch.uint8:
        x = images.to(dtype) / 255.0
    elif images.dtype.is_floating_point:
        x = images.to(dtype)
    else:
        raise TypeError(f"images has dtype {images.dtype}, expected uint8 or float")
    return x.permute(0, 3, 1, 2)


@register("model", "captioner", aliases=("show-attend-tell", "image-captioner"))
class ShowAttendTell(Configurable):
    """Show, Attend and Tell captioner (see the module docstring).

    Args:
        vocab_size: the number of word ids (``pad_idx``, ``bos_idx``, ``eos_idx`` among them).
        image_size: images are ``image_size x image_size x 3`` (default 32).
        grid: ``g``; ``image_size / g`` must be a power of 2 (default 4).
        channels: the CNN's widths before the last block (default ``(16,)``).
        embed_dim: word embedding size ``d_e``. hidden_size: ``d``, the LSTM size and the
            annotation vectors' size.
        attention: ``None`` (additive score, soft alignment), a score name, a dict
            ``{"score": ..., "align": ..., **options}`` for :class:`attnlab.Attention`
            (``"uniform": True`` gives that attention's uniform baseline), ``"mean"`` or
            ``"uniform"``.
        expected_mix: for hard attention trained with REINFORCE, the probability (drawn
            once per image and caption, during training) of using the expected context
            under the soft weights at every word instead of the sampled cells (Xu et al.
            use 0.5); 0 = always the sample. The Gumbel estimator ignores it.
        region_positions: add a learned embedding of each cell's position to its vector.
        dropout: on the inputs of both output layers, W_p and W_o (training only).
        pad_idx, bos_idx, eos_idx: the special word ids.

    Shapes: ``forward(images [B, S, S, 3], tokens_in [B, T])`` -> :class:`CaptionerOutput`
    (``tokens_in`` starts with BOS: the gold caption shifted right). ``greedy`` returns a
    :class:`Caption`.

    Cost: the CNN, then per word O(B d (d_e + d)) for the LSTM and O(B R d d_w) for the
    additive score (O(B R d) for a dot score).

    :formula: a = CNN(image) [R cells]; z_t = sum_l align(score(h_{t-1}, a_l)) a_l; h_t =
        LSTM([E y_{t-1}; z_t], h_{t-1}); p(y_t) = softmax(W_o tanh(W_p [h_t; z_t; E y_{t-1}]))
    :source: Xu et al. 2015, Show, Attend and Tell: Neural Image Caption Generation with Visual
        Attention
    :cost: CNN O(B S^2 9 sum c_in c_out) + per word O(B d (d_e + d)) + attention O(B R d_w d)
    """

    def __init__(
        self,
        vocab_size: int,
        *,
        image_size: int = 32,
        grid: int = 4,
        channels: Sequence[int] = (16,),
        embed_dim: int = 32,
        hidden_size: int = 64,
        attention: str | dict[str, Any] | None = None,
        expected_mix: float = 0.0,
        region_positions: bool = True,
        dropout: float = 0.0,
        pad_idx: int = 0,
        bos_idx: int = 1,
        eos_idx: int = 2,
    ) -> None:
        super().__init__()
        check_sizes(vocab_size=vocab_size, embed_dim=embed_dim, hidden_size=hidden_size)
        check_sizes(image_size=image_size, grid=grid)
        check_dropout(dropout)
        self.expected_mix = check_number(expected_mix, "expected_mix", low=0, high=1)
        check_flags(region_positions=region_positions)
        check_index(vocab_size, pad_idx=pad_idx, bos_idx=bos_idx, eos_idx=eos_idx)
        self.vocab_size, self.image_size, self.grid = vocab_size, image_size, grid
        self.pad_idx, self.bos_idx, self.eos_idx = pad_idx, bos_idx, eos_idx
        d = self.d = hidden_size
        self.num_regions = grid * grid
        self.cnn = grid_cnn(image_size, grid, channels, d)
        if region_positions:
            self.positions = nn.Parameter(torch.randn(self.num_regions, d) * 0.1)
        else:
            self.register_parameter("positions", None)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_idx)
        self.init_h = nn.Linear(d, d)
        self.init_c = nn.Linear(d, d)
        self.cell = nn.LSTMCell(embed_dim + d, d)
        self.pre_output = nn.Linear(2 * d + embed_dim, d)
        self.dropout = nn.Dropout(dropout)
        self.output = nn.Linear(d, vocab_size)

        self.attention: Attention | None
        self.attention, self.uniform = decoder_attention(
            attention, d, "additive", no_local_m="image regions have no order of words"
        )
        self.location = self.attention is not None and bool(
            getattr(self.attention.score, "uses_prev_weights", False)
        )

    # ------------------------------------------------------------------ parts

    def encode(self, images: Tensor) -> Tensor:
        """Annotation vectors ``[B, R, d]`` of ``[B, S, S, 3]`` images."""
        x = image_tensor(images, self.image_size, self.output.weight.dtype)
        fmap = self.cnn(x)  # [B, d, g, g]
        regions = fmap.flatten(2).transpose(1, 2)
        if self.positions is not None:
            regions = regions + self.positions
        return regions

    def init_state(self, regions: Tensor) -> dict[str, Tensor]:
        """The first state; in training with ``expected_mix`` > 0 it also holds the
        caption's coin ``"expected"`` ``[B]`` (bool): Xu et al. draw it once per image."""
        mean = regions.mean(1)
        B, R = regions.shape[:2]
        state = {
            "h": torch.tanh(self.init_h(mean)),
            "c": torch.tanh(self.init_c(mean)),
            "prev": regions.new_zeros(B, R),
        }
        if self._mixes():
            state["expected"] = torch.rand(B, device=regions.device) < self.expected_mix
        return state

    def _mixes(self) -> bool:
        """Whether captions may be trained with the expected context: training, hard
        attention with the REINFORCE estimator and ``expected_mix`` > 0 (otherwise no coin
        is drawn, so the random stream of the other attentions is untouched)."""
        align = getattr(self.attention, "align", None)
        return (
            self.training
            and self.expected_mix > 0
            and not self.uniform
            and getattr(align, "estimator", None) == "reinforce"
        )

    def attend(self, state: dict[str, Tensor], regions: Tensor) -> tuple[Tensor, Tensor, Any]:
        """Context ``[B, d]``, weights ``[B, R]`` and log_prob (``[B]`` or None) of a step."""
        if self.attention is None or self.uniform:
            B, R = regions.shape[:2]
            w = regions.new_full((B, R), 1.0 / R)
            return uniform_context(self.attention, w, regions), w, None
        extra = {"prev_weights": state["prev"]} if self.location else {}
        out = self.attention(state["h"], regions, need_weights=True, **extra)
        probs = out.extras.get("probs")
        if "expected" in state and out.log_prob is not None and probs is not None:
            # Xu et al. 2015 (4.1): "with probability 0.5 for a given image, we set the
            # sampled attention location to its expected value": every word of a caption
            # whose coin came up uses the soft weights; only the sampled captions enter
            # the REINFORCE term
            probs = probs.reshape(out.weights.shape)  # [B, R] (extras keep the query axis)
            coin = state["expected"]
            weights = torch.where(coin[:, None], probs, out.weights)
            # the values the sampled path reads: through the value projection, if any
            context = uniform_context(self.attention, weights, regions)
            return context, weights, out.log_prob * (~coin).to(out.log_prob.dtype)
        return out.context, out.weights, out.log_prob

    def step(
        self, y_prev: Tensor, state: dict[str, Tensor], regions: Tensor
    ) -> tuple[Tensor, dict[str, Tensor], Tensor, Any]:
        """One word: ``y_prev`` ``[B]`` -> logits ``[B, V]``, the new state, the weights
        ``[B, R]`` and the log_prob of a sampled cell (or None)."""
        emb = self.embedding(y_prev)
        z, weights, log_prob = self.attend(state, regions)
        h, c = self.cell(torch.cat([emb, z], -1), (state["h"], state["c"]))
        hidden = torch.tanh(self.pre_output(self.dropout(torch.cat([h, z, emb], -1))))
        logits = self.output(self.dropout(hidden))
        # the caption's coin (if any) rides along unchanged
        return logits, {**state, "h": h, "c": c, "prev": weights}, weights, log_prob

    # ------------------------------------------------------------------ training

    def forward(self, images: Tensor, tokens_in: Tensor) -> CaptionerOutput:
        """Teacher forcing over ``tokens_in`` ``[B, T]`` (BOS first)."""
        if not isinstance(tokens_in, Tensor) or tokens_in.dim() != 2:
            raise ValueError("tokens_in must be a [B, T] tensor of word ids (BOS first)")
        regions = self.encode(images)
        if tokens_in.shape[0] != regions.shape[0]:
            raise ValueError(
                f"tokens_in has {tokens_in.shape[0]} rows but there are {regions.shape[0]} images"
            )
        logits, weights, log_prob = teacher_forcing(
            lambda y, state: self.step(y, state, regions),
            self.init_state(regions),
            tokens_in,
            regions,
            self.vocab_size,
            regions.shape[1],
        )
        return CaptionerOutput(logits, weights, log_prob)

    @torch.no_grad()
    def greedy(self, images: Tensor, max_len: int = 20) -> Caption:
        """The most probable word at every step until EOS or ``max_len`` words (PAD and BOS
        are never generated)."""
        regions = self.encode(images)
        tokens, rows, _ = greedy_decode(self, regions, regions.shape[0], regions.device, max_len)
        return Caption(tokens, rows)
