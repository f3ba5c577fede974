"""Inpainting with a non-local (self-attention) block between a small convolutional encoder
and decoder (Wang et al. 2018, "Non-local Neural Networks"), with the attention swappable.

The network sees the image with its hidden pixels set to 0 and the mask as a fourth
channel, and predicts every pixel::

    F = enc([x (1 - m); m])                       [B, c, g, g]: 3x3 conv + ReLU, then a
                                                  patch x patch conv of stride patch + ReLU
    t_p = LayerNorm([F_p; P_p])                   cell p's feature and its position
    y_p = F_p + W_O sum_{l visible} a_{p,l} W_V t_l,
          a_p = softmax_l(W_q t_p . W_k t_l / sqrt(d))   (or any score / alignment)
    x_hat = dec(y)                                [B, 3, S, S]: transposed patch conv +
                                                  ReLU, 3x3 conv + ReLU, 3x3 conv

``P_p`` encodes the cell's row and column (one-hot by default, or sinusoidal, or learned):
without positions the attention could not tell where a pixel's mirror twin is. The keys
are the cells without a hidden pixel. With one head and the scaled dot product this is
Wang et al.'s "embedded Gaussian" non-local block (pre-normalised, as in Transformers);
the attention is :class:`attnlab.query.MultiHeadAttention` built through the registry from
a spec (heads, score, alignment), so an ablation swaps only the attention. Baselines:
``"none"`` (the same CNN without the block: ``y = F``, no attention parameters) and
``"mean"`` (``y_p = F_p + W (mean of the visible t_l)``: global context without
attention). The output keeps the visible pixels: ``filled = x (1 - m) + x_hat m``.

Shapes: ``images`` ``[B, S, S, 3]`` floats in ``[0, 1]``, ``masks`` ``[B, S, S]`` bool
(True = hidden). Cost: the convolutions O(B S^2 9 c^2), the attention O(B g^4 d) over
the ``g^2`` cells (a 16 x 16 image with patch 2 is 64 cells).

Source: X. Wang, R. Girshick, A. Gupta and K. He, "Non-local Neural Networks", CVPR 2018.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_choice, check_int, check_module_dtype, check_tensor
from attnlab.general.padding import masked_mean
from attnlab.output import output_pytree
from attnlab.query.positional import sinusoidal_positions
from attnlab.registry import Configurable, build, register

__all__ = ["Inpainter", "InpainterOutput", "grid_positions"]

_BASELINES = ("none", "mean")
_POSITIONS = ("onehot", "sinusoidal", "learned", "none")


@output_pytree()
@dataclass
class InpainterOutput:
    """``pred`` ``[B, S, S, 3]`` (the network's every pixel), ``filled`` ``[B, S, S, 3]``
    (the visible pixels kept, the hidden ones predicted) and, when asked, the attention
    ``weights`` ``[B, g*g, g*g]`` over the ``g = S / patch`` cells (row-major cells,
    averaged over the heads; None without attention)."""

    pred: Tensor
    filled: Tensor
    weights: Tensor | None = None


def grid_positions(grid: int, kind: str = "onehot", dim: int = 16) -> Tensor:
    """``[grid * grid, d]``: the encoding of each cell's row and column, row-major, the row
    part first. ``"onehot"``: ``d = 2 grid`` indicator columns (a linear map of it is a
    learned table per row and per column); ``"sinusoidal"``: ``d = dim`` (even), the
    sinusoidal encoding (Vaswani et al. 2017, base ``4 grid`` so the frequencies suit a
    small grid) of the row and of the column, ``dim / 2`` columns each."""
    if kind == "onehot":
        half = torch.eye(grid, dtype=torch.get_default_dtype())
    elif dim % 2:
        raise ConfigError(f"position_dim must be even, got {dim}")
    else:
        half = sinusoidal_positions(grid, dim // 2, base=4.0 * grid)
    d = half.shape[1]
    rows = half[:, None, :].expand(grid, grid, d)
    cols = half[None, :, :].expand(grid, grid, d)
    return torch.cat([rows, cols], -1).reshape(grid * grid, 2 * d)


def _conv(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, padding=1)


def _attention_module(attention: Any, d_model: int, out_dim: int) -> nn.Module | None:
    if attention == "none":
        return None
    if attention == "mean":
        return nn.Linear(d_model, out_dim)
    if isinstance(attention, str):
        raise ConfigError(
            f"attention must be a spec dict or one of {_BASELINES}, got {attention!r}"
        )
    spec = dict(attention or {})
    spec.setdefault("num_heads", 1)
    return build(
        {"name": "multi-head", "kind": "query", "d_model": d_model, "out_dim": out_dim, **spec}
    )


@register("model", "inpainter", aliases=("non-local-inpainter",))
class Inpainter(Configurable):
    """A small CNN with an optional non-local attention block (see the module docstring).

    Args:
        size: images are ``size x size x 3``.
        channels: ``c``, the width of the convolutions (and of the attention's output).
        attention: a spec dict for :class:`attnlab.query.MultiHeadAttention`, built through
            the registry (``num_heads``, default 1: Wang et al.'s block; ``score``,
            ``align`` and their options), ``"none"`` or ``"mean"``.
        positions: how each cell's place is encoded (:func:`grid_positions`):
            ``"onehot"`` (default), ``"sinusoidal"``, ``"learned"`` (a table initialised
            with the sinusoidal one) or ``"none"`` (no positions: the twin cannot be found).
        position_dim: the size of the sinusoidal / learned encodings (even).
        patch: the encoder's last convolution has stride ``patch``: attention runs over a
            ``g x g`` grid, ``g = size / patch``, of ``patch x patch`` pixel cells.

    Shapes: ``forward(images [B, S, S, 3], masks [B, S, S], need_weights=False)`` ->
    :class:`InpainterOutput`.

    :formula: F = CNN([x (1-m); m]); y_p = F_p + sum_{l visible} a_{p,l} W_V [F_l; P_l], a_p =
        align(score(W_q [F_p; P_p], W_k [F_l; P_l])); x_hat = CNN'(y)
    :source: Wang et al. 2018, Non-local Neural Networks (CVPR)
    :cost: convolutions O(B S^2 9 c^2) + attention O(B S^4 d)
    """

    def __init__(
        self,
        size: int = 16,
        *,
        channels: int = 32,
        attention: str | dict[str, Any] | None = None,
        positions: str = "onehot",
        position_dim: int = 16,
        patch: int = 2,
    ) -> None:
        super().__init__()
        for name, value in (("size", size), ("channels", channels), ("patch", patch)):
            check_int(value, name)
        check_int(position_dim, "position_dim")
        check_choice(positions, "positions", _POSITIONS)
        if size % patch:
            raise ConfigError(f"size must be a multiple of patch, got size={size}, patch={patch}")
        self.size, self.channels, self.grid = size, channels, size // patch
        c = channels
        down = nn.Conv2d(c, c, patch, stride=patch)
        up = nn.ConvTranspose2d(c, c, patch, stride=patch)
        self.encoder = nn.Sequential(_conv(4, c), nn.ReLU(), down, nn.ReLU())
        self.decoder = nn.Sequential(up, nn.ReLU(), _conv(c, c), nn.ReLU(), _conv(c, 3))
        table = self._position_table(positions, position_dim)
        d_model = channels + table.shape[1]
        self.attention = _attention_module(attention, d_model, channels)
        self.norm = None if self.attention is None else nn.LayerNorm(d_model)
        self.mean_pool = attention == "mean"
        if positions == "learned":
            self.positions = nn.Parameter(table.clone())
        else:
            self.register_buffer("positions", table, persistent=False)

    def _position_table(self, positions: str, position_dim: int) -> Tensor:
        if positions == "none":
            return torch.zeros(self.grid**2, 0)
        kind = "sinusoidal" if positions == "learned" else positions
        return grid_positions(self.grid, kind, position_dim)

    def _check(self, images: Tensor, masks: Tensor) -> None:
        check_tensor(images, "images")  # uint8 pixels failed in the first convolution
        check_module_dtype(self, images, "images")
        if not isinstance(masks, Tensor):
            raise TypeError(f"masks must be a torch.Tensor, got {type(masks).__name__}")
        want = (self.size, self.size, 3)
        if images.dim() != 4 or tuple(images.shape[1:]) != want:
            raise ValueError(
                f"images must be [B, {self.size}, {self.size}, 3], got {tuple(images.shape)}"
            )
        if masks.dtype != torch.bool or tuple(masks.shape) != tuple(images.shape[:3]):
            raise ValueError(
                f"masks must be bool [B, {self.size}, {self.size}], got {masks.dtype} {tuple(masks.shape)}"
            )

    def _tokens(self, fmap: Tensor) -> Tensor:
        tokens = fmap.flatten(2).transpose(1, 2)  # [B, S*S, c]
        pos = self.positions.to(tokens.dtype).expand(tokens.shape[0], -1, -1)
        return torch.cat([tokens, pos], -1)

    def _context(
        self, fmap: Tensor, visible: Tensor, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        tokens = self.norm(self._tokens(fmap))
        if self.mean_pool:
            pooled = masked_mean(tokens, visible, keepdim=True)
            return self.attention(pooled).expand(-1, tokens.shape[1], -1), None
        out = self.attention(tokens, mask=visible[:, None, :], need_weights=need_weights)
        return out.context, out.weights

    def hidden_cells(self, masks: Tensor) -> Tensor:
        """``[B, g, g]`` bool: the cells of the feature grid that hold a hidden pixel."""
        p = self.size // self.grid
        return masks.reshape(-1, self.grid, p, self.grid, p).any(4).any(2)

    def forward(
        self, images: Tensor, masks: Tensor, *, need_weights: bool = False
    ) -> InpainterOutput:
        self._check(images, masks)
        m = masks[..., None].to(images.dtype)
        x = torch.cat([images * (1 - m), m], -1).permute(0, 3, 1, 2)
        fmap = self.encoder(x)
        weights = None
        if self.attention is not None:
            visible = ~self.hidden_cells(masks).flatten(1)
            context, weights = self._context(fmap, visible, need_weights)
            fmap = fmap + context.transpose(1, 2).reshape(fmap.shape)
        pred = self.decoder(fmap).permute(0, 2, 3, 1)
        filled = images * (1 - m) + pred * m
        return InpainterOutput(pred=pred, filled=filled, weights=weights)
