"""Task ``inpainting``: fill a hidden block of a mirror-symmetric mosaic with a small CNN and
a non-local self-attention block (Wang et al. 2018), scored by PSNR and SSIM.

Data (:mod:`attnlab.data.mirrored_scenes`, generated from ``data_seed``; nothing to
install): ``size x size`` mosaics of random colours whose right half mirrors the left, with
one ``block x block`` square hidden on one side. The task is built so that the hidden
pixels can *only* be recovered from far away: neighbouring cells are independent, so the
surroundings say nothing about the hidden colours, and the twin block on the other side is
outside the receptive field of the network's convolutions. A CNN alone can do no better
than the mean colour (PSNR about 10.8 dB on the hidden block); self-attention over the
feature map, with positions, can find the twin and copy it. The comparison with the same
network without attention (baseline ``none``) therefore isolates what attention adds.

Model: :class:`attnlab.models.inpainter.Inpainter`. Loss: the mean squared error of the
hidden pixels. Attention presets: ``non-local`` (the default: one head, scaled dot product,
Wang et al.'s embedded-Gaussian block), ``multi-head`` (two heads), ``additive`` (one head,
additive score); any other ``score=``/``align=``/``num_heads=`` spec of
:class:`attnlab.query.MultiHeadAttention`; baselines ``none`` (no attention layer) and
``mean`` (the mean of the visible features instead of attention).

Metrics (:mod:`attnlab.evaluation.image_quality`, torchmetrics): ``psnr_masked``
(selection; PSNR of the hidden block), ``psnr`` and ``ssim`` of the whole filled image
(SSIM's ``11 x 11`` Gaussian window needs images of at least 11 pixels: NaN below; the
hidden block itself is too small for the window, so the whole image, whose visible pixels
are kept, stands for it), ``mse_masked``; ``twin_attention``: the attention mass of the hidden
cells on their mirror twins (1 = every hidden cell looks only at its twin; NaN without
attention) and ``twin_attention_uniform`` (the same for uniform attention over the visible
cells: the floor).

Option presets: ``cpu`` (16x16 images, 4,000 training images, 15 epochs: about a minute on
a CPU) and ``paper`` (32x32 images, 8x8 hidden blocks, 64 channels, 256 attention tokens
(about the size of Wang et al.'s res4 maps, 14 x 14), one block, 20,000 images, 30
epochs). Wang et al. insert non-local blocks into ResNets for video classification and
COCO detection; neither the data nor the backbone is reproduced here, only the block
(embedded Gaussian, residual) in a network small enough to isolate it. Also not theirs:
the block's inner width (channels plus one-hot positions, where theirs is half the
channels), the ``1/sqrt(d)`` scaling, keys without max-pooling, LayerNorm before the block
(theirs: batch norm after ``W_z``, initialised at zero) and the training (Adam, batches of
32; theirs SGD with momentum, weight decay 1e-4, batches of 64, 400k iterations).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data.mirrored_scenes import MirroredScenes, make_mirrored_scenes
from attnlab.evaluation.image_quality import psnr, ssim
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.lab.tasks._shared import evaluating
from attnlab.models.inpainter import Inpainter, InpainterOutput

__all__ = ["InpaintingTask", "Restorations", "twin_attention"]


@dataclass
class Restorations:
    """The filled images of one split with their targets: ``filled``, ``target``
    ``[N, S, S, 3]``, ``masks`` ``[N, S, S]``, ``boxes`` ``[N, 2]`` and the twin attention
    mass of each image ``[N]`` (NaN without attention)."""

    filled: Tensor
    target: Tensor
    masks: Tensor
    boxes: np.ndarray
    twin: Tensor


def twin_attention(weights: Tensor, hidden: Tensor) -> Tensor:
    """The mean attention mass of each image's hidden cells on the mirror images of those
    cells, ``[B]``: ``weights`` ``[B, g*g, g*g]`` (row-major cells), ``hidden`` ``[B, g, g]``
    bool. The mass counts the whole twin block: 1 means every hidden cell looks only inside
    it, not necessarily at its own mirror cell."""
    twin = hidden.flip(-1).flatten(1).to(weights.dtype)  # [B, g*g]
    rows = hidden.flatten(1).to(weights.dtype)
    mass = (weights * twin[:, None, :]).sum(-1)  # [B, g*g]
    return (mass * rows).sum(1) / rows.sum(1).clamp(min=1)


def _crops(images: Tensor, boxes: np.ndarray, block: int) -> Tensor:
    """``[N, 3, block, block]``: the hidden block of each ``[N, S, S, 3]`` image."""
    crops = [
        img[t : t + block, left : left + block]
        for img, (t, left) in zip(images, boxes, strict=True)
    ]
    return torch.stack(crops).permute(0, 3, 1, 2)


#: SSIM's window (Wang et al.'s 11 x 11 Gaussian); smaller images get NaN rather than a
#: window of another size, so the figures stay comparable with the literature's
_SSIM_WINDOW = 11


@register_task("inpainting")
class InpaintingTask(Task):
    """Inpainting mirrored mosaics with :class:`~attnlab.models.inpainter.Inpainter`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        size, cell, block, gap: the images (:func:`~attnlab.data.mirrored_scenes.make_mirrored_scenes`).
        train_size, dev_size, test_size: generated images per split.
        data_seed: train, dev and test use ``data_seed``, ``+ 1``, ``+ 2``.
        channels, patch, positions, position_dim: the model.

    :formula: x_hat = CNN'(F + NonLocal([F; P])), F = CNN([x (1-m); m]); loss = mean_{hidden p}
        ||x_hat_p - x_p||^2
    :source: Wang et al. 2018, Non-local Neural Networks (CVPR), on generated mirrored mosaics
        (attnlab.data.mirrored_scenes)
    :cost: convolutions O(S^2 9 c^2) + attention O((S/patch)^4 d) per image
    """

    metrics: ClassVar[tuple[str, ...]] = (
        "psnr_masked",
        "psnr",
        "ssim",
        "mse_masked",
        "twin_attention",
    )
    higher_is_better: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 15,
        "lr": 3e-3,
        "size": 16,
        "cell": 2,
        "block": 4,
        "gap": 2,
        "train_size": 4000,
        "dev_size": 200,
        "test_size": 200,
        "data_seed": 0,
        "channels": 32,
        "patch": 2,
        "positions": "onehot",
        "position_dim": 16,
    }
    default_attention: ClassVar[dict[str, Any]] = {"num_heads": 1}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "non-local": {"num_heads": 1},
        "multi-head": {"num_heads": 2},
        "additive": {"num_heads": 1, "score": "additive"},
    }
    baselines: ClassVar[tuple[str, ...]] = ("none", "mean")
    data_source: ClassVar[str] = (
        "generated mirror-symmetric mosaics with a hidden block (no package)"
    )
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},  # the defaults, as for every task
        "paper": {
            "epochs": 30,
            "size": 32,
            "block": 8,
            "gap": 4,
            "channels": 64,
            "position_dim": 32,
            "train_size": 20000,
            "dev_size": 1000,
            "test_size": 1000,
        },
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.check_int_options("size", "cell", "block", "train_size", "dev_size", "test_size")
        self.check_int_options("channels", "patch", "position_dim")
        self.check_int_options("gap", minimum=0)
        self.check_option_choice("positions", ("onehot", "sinusoidal", "learned", "none"))

    # ------------------------------------------------------------------ data and model

    def load_data(self) -> TaskData:
        o = self.options
        sizes = {k: int(o[k]) for k in ("size", "cell", "block", "gap")}

        def make(count: int, offset: int) -> MirroredScenes:
            try:
                return make_mirrored_scenes(count, int(o["data_seed"]) + offset, **sizes)
            except ValueError as err:
                raise ConfigError(f"the image options do not work together: {err}") from None

        return self.generated_data(make, {"size": sizes["size"], "block": sizes["block"]})

    def make_batch(self, data: TaskData, part: MirroredScenes, idx: list[int]) -> dict[str, Tensor]:
        index = np.asarray(idx, dtype=np.int64)
        return {
            "images": torch.from_numpy(part.images[index]),
            "masks": torch.from_numpy(part.masks[index]),
        }

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        return Inpainter(
            int(o["size"]),
            channels=int(o["channels"]),
            attention=self.model_attention(attention),
            positions=str(o["positions"]),
            position_dim=int(o["position_dim"]),
            patch=int(o["patch"]),
        )

    # ------------------------------------------------------------------ training and metrics

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["images"], batch["masks"])
        hidden = batch["masks"][..., None].to(out.pred.dtype)
        error = (out.pred - batch["images"]) ** 2 * hidden
        return error.sum() / (3 * hidden.sum()).clamp(min=1)

    def restore(self, model: nn.Module, data: TaskData, split: str) -> Restorations:
        """The model's filled images of one split (clamped to ``[0, 1]``) and twin masses."""
        part: MirroredScenes = data.split(split)
        device = next(model.parameters()).device
        filled, twins = [], []
        with evaluating(model):
            for batch in self.batches(data, split, 256):
                out = model(
                    batch["images"].to(device), batch["masks"].to(device), need_weights=True
                )
                filled.append(out.filled.clamp(0, 1).float().cpu())
                twins.append(self._twin(model, out, batch["masks"]))
        return Restorations(
            filled=torch.cat(filled),
            target=torch.from_numpy(part.images),
            masks=torch.from_numpy(part.masks),
            boxes=part.boxes,
            twin=torch.cat(twins),
        )

    @staticmethod
    def _twin(model: nn.Module, out: InpainterOutput, masks: Tensor) -> Tensor:
        if out.weights is None:
            return torch.full((masks.shape[0],), float("nan"))
        hidden = model.hidden_cells(masks.to(out.weights.device))
        return twin_attention(out.weights.float(), hidden).cpu()

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        if len(data.split(split)) == 0:
            return {name: float("nan") for name in self.metrics}
        r = self.restore(model, data, split)
        block, side = int(data.info["block"]), int(data.info["size"])
        got, want = _crops(r.filled, r.boxes, block), _crops(r.target, r.boxes, block)
        whole_got, whole_want = r.filled.permute(0, 3, 1, 2), r.target.permute(0, 3, 1, 2)
        hidden = r.masks.flatten(1).any(1)
        twin_floor = _uniform_twin_mass(r.masks, model)
        return {
            "psnr_masked": psnr(got, want),
            "psnr": psnr(whole_got, whole_want),
            "ssim": ssim(whole_got, whole_want) if side >= _SSIM_WINDOW else float("nan"),
            "mse_masked": float(((got - want) ** 2).mean()),
            "twin_attention": float(r.twin[hidden].mean()),
            "twin_attention_uniform": twin_floor,
        }

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The first ``n`` test images: one overlay per hidden cell (where it looked)."""
        part: MirroredScenes = data.test
        k = min(n, len(part))
        if k <= 0 or getattr(model, "attention", None) is None or model.mean_pool:
            return []
        device = next(model.parameters()).device
        batch = self.make_batch(data, part, list(range(k)))
        with evaluating(model):
            out = model(batch["images"].to(device), batch["masks"].to(device), need_weights=True)
        hidden = model.hidden_cells(batch["masks"].to(device)).cpu()
        twin = twin_attention(out.weights.float(), hidden.to(out.weights.device)).cpu()
        return [_example(b, out, hidden[b], batch, float(twin[b])) for b in range(k)]


def _uniform_twin_mass(masks: Tensor, model: nn.Module) -> float:
    """The twin mass of uniform attention over the visible cells (NaN without attention)."""
    if getattr(model, "attention", None) is None or model.mean_pool:
        return float("nan")
    hidden = model.hidden_cells(masks.to(next(model.parameters()).device)).cpu().flatten(1)
    n_twin = hidden.sum(1).float()
    return float((n_twin / (hidden.shape[1] - n_twin)).mean())


def _example(
    b: int, out: InpainterOutput, hidden: Tensor, batch: Mapping[str, Tensor], twin: float
) -> AttentionExample:
    g = hidden.shape[-1]
    cells = [(r, c) for r in range(g) for c in range(g)]
    rows = [i for i, (r, c) in enumerate(cells) if hidden[r, c]]
    shown = batch["images"][b] * (~batch["masks"][b])[..., None]
    return AttentionExample(
        title=f"test #{b}",
        rows=[f"hidden {cells[i]}" for i in rows],
        cols=[f"({r},{c})" for r, c in cells],
        weights=[out.weights[b, i].float().cpu().tolist() for i in rows],
        label="twin " + ", ".join(str((r, g - 1 - c)) for r, c in cells if hidden[r, c]),
        prediction=f"twin attention {twin:.2f}",
        kind="image",
        grid=(g, g),
        image=shown.numpy().round(4).tolist(),
        extra={"twin_attention": twin},
    )
