"""Task ``captioning``: image captioning with soft and hard visual attention ("Show, Attend
and Tell", Xu et al. 2015) on generated scenes with known object masks.

Data (:mod:`attnlab.data.scenes`, generated from ``data_seed``; nothing to install):
scenes of 2 (or ``min_objects..max_objects``) coloured shapes, captioned left to right,
``"red circle and blue square"``. Every colour and shape word describes one object whose
pixel mask is known, so besides the caption metrics the task measures where the attention
of each object word falls.

Model: :class:`attnlab.models.captioner.ShowAttendTell` (a CNN's ``g x g`` grid of
annotation vectors with position embeddings, an LSTM decoder attending over them at every
word). Loss: cross-entropy of the caption (teacher forcing) plus, for hard attention
trained with REINFORCE, ``reinforce_weight`` times the score-function term with reward
``-`` (the caption's cross-entropy) and the batch mean as baseline.

Attention presets: ``soft`` (default; additive score, soft alignment: Xu et al.'s
deterministic soft attention), ``hard`` (additive score, one cell sampled per word,
REINFORCE: their stochastic hard attention; as in the paper, with probability
``expected_mix`` = 0.5 an image's caption is trained with the expected context at every
word instead of the samples), ``hard-gumbel`` (the same, straight-through
Gumbel-softmax), ``dot`` (scaled dot product), ``location`` (location-aware score,
Chorowski et al. 2015), and the baselines ``mean`` (the mean of the annotation vectors at
every word: no attention) and ``uniform``.

Metrics: ``bleu`` (selection; corpus BLEU-4 of the greedy captions, sacrebleu),
``meteor`` (NLTK, WordNet synonyms when ``wordnet-base`` is installed, else the exact and
stem stages; NaN without NLTK), ``caption_accuracy`` (captions generated exactly), ``iou``
(the mean over the test words that name an object of the IoU between the attention that
produced the word -- gold prefix, teacher forcing -- thresholded at half its maximum, and
the object's mask; :mod:`attnlab.evaluation.iou`); ``iou_uniform`` is the same for uniform
attention (the object's area fraction): the floor.

Option presets (``-o preset=NAME``, as for every task): ``cpu`` (the defaults: 32x32
images, 4x4 grid, 2 objects of 4 colours, 4,000 training scenes: minutes on a CPU) and
``paper`` (64x64 images, an 8x8 grid of 64 annotation vectors, 2-4 objects of 6 colours,
50,000 training scenes, a 256-unit LSTM, 20 epochs); options given beside a preset win.
The option ``scale`` (``small`` / ``paper``) of earlier releases still works, as the
presets ``cpu`` / ``paper``, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab._deprecation import warn_deprecated
from attnlab.data.scenes import COLORS, JOIN, SHAPES, make_scenes
from attnlab.data.vocab import Vocab
from attnlab.evaluation.iou import attention_iou
from attnlab.evaluation.meteor import meteor_or_nan
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.lab.tasks._shared import add_reinforce, check_int_list_options
from attnlab.models.captioner import ShowAttendTell

__all__ = ["SCALES", "CaptionData", "CaptioningTask"]

IGNORE = -1
SPECIALS = ("<pad>", "<bos>", "<eos>")

#: the scene, model and training sizes of the presets ``cpu`` (the defaults; the deprecated
#: ``scale=small``) and ``paper``; options given explicitly override them
SCALES: dict[str, dict[str, Any]] = {
    "small": {
        "epochs": 8,
        "image_size": 32,
        "grid": 4,
        "min_objects": 2,
        "max_objects": 2,
        "object_size": 8,
        "colors": 4,
        "shapes": 3,
        "train_size": 4000,
        "dev_size": 500,
        "test_size": 500,
        "embed_dim": 32,
        "hidden_size": 64,
        "channels": [16],
        "batch_size": 32,
        "dropout": 0.0,
    },
    "paper": {
        "epochs": 20,
        "image_size": 64,
        "grid": 8,
        "min_objects": 2,
        "max_objects": 4,
        "object_size": 10,
        "colors": 6,
        "shapes": 3,
        "train_size": 50000,
        "dev_size": 2000,
        "test_size": 2000,
        "embed_dim": 128,
        "hidden_size": 256,
        "channels": [32, 64],
        "batch_size": 64,
        "dropout": 0.5,
    },
}


_SCALE_PRESETS = {"small": "cpu", "paper": "paper"}


def _scale_as_preset(options: dict[str, Any]) -> dict[str, Any]:
    """The deprecated option ``scale`` (``small`` / ``paper``) as the option preset it
    became (``cpu`` / ``paper``), with a ``DeprecationWarning``; a ``ConfigError`` for an
    unknown scale or a ``scale`` beside a ``preset``."""
    options = dict(options)
    scale = options.pop("scale")
    if scale not in _SCALE_PRESETS:
        raise ConfigError(f"option scale must be one of {sorted(_SCALE_PRESETS)}, got {scale!r}")
    preset = _SCALE_PRESETS[scale]
    if options.get("preset") is not None:
        raise ConfigError(f"give the option preset only, not scale={scale!r} beside it")
    warn_deprecated(f"captioning: the option scale={scale!r} is deprecated; use preset={preset!r}")
    return {**options, "preset": preset}


@dataclass(frozen=True)
class CaptionData:
    """One split: ``images`` ``[N, S, S, 3]`` uint8, ``tokens_in`` ``[N, T]`` (BOS + the
    caption, 0-padded), ``targets`` ``[N, T]`` (the caption + EOS, ``-1``-padded),
    ``masks`` ``[N, K, S, S]`` bool object masks, ``word_objects`` ``[N, T]`` (the object
    each target word names, ``-1`` otherwise), ``captions`` the caption words."""

    images: Tensor
    tokens_in: Tensor
    targets: Tensor
    masks: Tensor
    word_objects: Tensor
    captions: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return int(self.images.shape[0])


@register_task("captioning")
class CaptioningTask(Task):
    """Captioning generated scenes with :class:`~attnlab.models.captioner.ShowAttendTell`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        preset: ``"cpu"`` (the defaults) or ``"paper"`` (sets the options below that are
            not given; ``scale="small"`` / ``"paper"`` is its deprecated spelling).
        image_size, grid, min_objects, max_objects, object_size, colors, shapes: the scenes
            and the attention grid (see :func:`attnlab.data.scenes.make_scenes`).
        train_size, dev_size, test_size: generated scenes per split.
        data_seed: train, dev and test use ``data_seed``, ``+ 1``, ``+ 2``.
        embed_dim, hidden_size, dropout: the model; channels: the widths of its CNN (a
            non-empty list of ints >= 1).
        reinforce_weight: weight of the REINFORCE term of hard attention.
        expected_mix: hard attention only: the probability, drawn once per image, of
            training its caption with the expected context (soft weights) instead of the
            sampled cells (Xu et al.'s 0.5).

    :formula: a = CNN(image) [g x g cells]; z_t = sum_l align(score(h_{t-1}, a_l)) a_l; h_t =
        LSTM([E y_{t-1}; z_t], h_{t-1}); p(y_t) = softmax(W_o tanh(W_p [h_t; z_t; E y_{t-1}]))
    :source: Xu et al. 2015, Show, Attend and Tell: Neural Image Caption Generation with Visual
        Attention (ICML), on generated scenes of coloured shapes (attnlab.data.scenes)
    :cost: CNN once per image + per word LSTM O(d (d_e + d)) + attention O(R d d_w)
    """

    metrics: ClassVar[tuple[str, ...]] = ("bleu", "meteor", "caption_accuracy", "iou")
    higher_is_better: ClassVar[bool] = True
    defaults: ClassVar[dict[str, Any]] = {
        **SCALES["small"],
        "lr": 2e-3,
        "data_seed": 0,
        "reinforce_weight": 1.0,
        "expected_mix": 0.5,
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "additive"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "soft": {"score": "additive"},
        "hard": {"score": "additive", "align": "hard"},
        "hard-gumbel": {"score": "additive", "align": "hard", "estimator": "gumbel"},
        "dot": {"score": "scaled-dot"},
        "location": {"score": "location-aware"},
    }
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {k: v for k, v in SCALES["paper"].items() if SCALES["small"][k] != v},
    }
    data_source: ClassVar[str] = "generated scenes of coloured shapes with masks (no package)"

    def __init__(self, **options: Any) -> None:
        if "scale" in options:
            options = _scale_as_preset(options)
        super().__init__(**options)
        o = self.options
        self.check_int_options(
            "image_size",
            "grid",
            "object_size",
            "colors",
            "shapes",
            "embed_dim",
            "hidden_size",
            "train_size",
            "dev_size",
            "test_size",
            "min_objects",
            "max_objects",
        )
        lo, hi = o["min_objects"], o["max_objects"]
        if hi < lo:
            raise ConfigError(f"option max_objects={hi} must be >= min_objects={lo}")
        if not 2 <= o["colors"] <= len(COLORS):
            raise ConfigError(f"option colors must be in [2, {len(COLORS)}], got {o['colors']}")
        self.check_number_options("expected_mix", low=0.0, high=1.0)  # before the scenes
        check_int_list_options(self, "channels")  # a bare 16 failed after the scenes

    # ------------------------------------------------------------------ data

    def load_data(self) -> TaskData:
        o = self.options
        vocab = Vocab([*COLORS, *SHAPES, JOIN], specials=SPECIALS, unk=None, pad="<pad>")
        seed = int(o["data_seed"])

        def make(count: int, offset: int) -> CaptionData:
            try:
                scenes = make_scenes(
                    count,
                    seed + offset,
                    size=int(o["image_size"]),
                    min_objects=int(o["min_objects"]),
                    max_objects=int(o["max_objects"]),
                    object_size=int(o["object_size"]),
                    colors=int(o["colors"]),
                    shapes=int(o["shapes"]),
                )
            except ValueError as err:
                raise ConfigError(f"the scene options do not work together: {err}") from None
            T = 3 * int(o["max_objects"])  # k colour-shape pairs, k - 1 "and", EOS
            tokens_in = torch.zeros(count, T, dtype=torch.long)
            targets = torch.full((count, T), IGNORE, dtype=torch.long)
            objects = torch.full((count, T), IGNORE, dtype=torch.long)
            bos, eos = vocab.index("<bos>"), vocab.index("<eos>")
            for i, (words, objs) in enumerate(
                zip(scenes.captions, scenes.word_objects, strict=True)
            ):
                ids = vocab.encode(words)
                n = len(ids)
                tokens_in[i, : n + 1] = torch.tensor([bos, *ids])
                targets[i, : n + 1] = torch.tensor([*ids, eos])
                objects[i, :n] = torch.tensor(objs)
            return CaptionData(
                images=torch.from_numpy(scenes.images),
                tokens_in=tokens_in,
                targets=targets,
                masks=torch.from_numpy(scenes.masks),
                word_objects=objects,
                captions=scenes.captions,
            )

        info = {"vocab": vocab, "max_len": 3 * int(o["max_objects"]) - 1}
        return self.generated_data(make, info)

    def make_batch(self, data: TaskData, part: CaptionData, idx: list[int]) -> dict[str, Tensor]:
        index = torch.tensor(idx, dtype=torch.long)
        width = int((part.targets[index] != IGNORE).sum(1).max())
        return {
            "images": part.images[index],
            "tokens_in": part.tokens_in[index, :width],
            "targets": part.targets[index, :width],
            "index": index,
        }

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        vocab: Vocab = data.info["vocab"]
        return ShowAttendTell(
            len(vocab),
            image_size=int(o["image_size"]),
            grid=int(o["grid"]),
            channels=tuple(int(c) for c in o["channels"]),
            embed_dim=int(o["embed_dim"]),
            hidden_size=int(o["hidden_size"]),
            attention=self.model_attention(attention),
            dropout=float(o["dropout"]),
            expected_mix=float(o["expected_mix"]),
            pad_idx=vocab.index("<pad>"),
            bos_idx=vocab.index("<bos>"),
            eos_idx=vocab.index("<eos>"),
        )

    # ------------------------------------------------------------------ training

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["images"], batch["tokens_in"])
        targets = batch["targets"]
        valid = targets != IGNORE
        ce = F.cross_entropy(
            out.logits.transpose(1, 2), targets, ignore_index=IGNORE, reduction="none"
        )
        per_caption = (ce * valid).sum(1)
        loss = per_caption.sum() / valid.sum().clamp(min=1)
        log_prob = None if out.log_prob is None else (out.log_prob * valid).sum(1)
        return add_reinforce(
            loss, log_prob, per_caption, float(self.options["reinforce_weight"]), model
        )

    def captions(self, model: nn.Module, data: TaskData, split: str) -> list[list[str]]:
        """The greedy captions of one split, as words."""
        part: CaptionData = data.split(split)
        vocab: Vocab = data.info["vocab"]
        device = next(model.parameters()).device
        out: list[list[str]] = []
        for start in range(0, len(part), 256):
            images = part.images[start : start + 256].to(device)
            dec = model.greedy(images, max_len=data.info["max_len"] + 1)
            out += [vocab.decode(t) for t in dec.tokens]
        return out

    def word_ious(self, model: nn.Module, data: TaskData, split: str) -> tuple[float, float]:
        """Mean IoU of the object words' attention (teacher forcing on the gold captions)
        and of uniform attention (see the module docstring)."""
        part: CaptionData = data.split(split)
        device = next(model.parameters()).device
        g = int(self.options["grid"])
        model_iou, floor = [], []
        uniform = np.full(g * g, 1.0 / (g * g))
        for batch in self.batches(data, split, 256):
            out = model(batch["images"].to(device), batch["tokens_in"].to(device))
            weights = out.weights.float().cpu().numpy()
            for row, i in enumerate(batch["index"].tolist()):
                for t, obj in enumerate(part.word_objects[i].tolist()):
                    if obj < 0:
                        continue
                    mask = part.masks[i, obj].numpy()
                    model_iou.append(attention_iou(weights[row, t], mask, (g, g)))
                    floor.append(attention_iou(uniform, mask, (g, g)))
        if not model_iou:
            return float("nan"), float("nan")
        return float(np.nanmean(model_iou)), float(np.nanmean(floor))

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        from attnlab.lab.tasks.translation import corpus_bleu

        part: CaptionData = data.split(split)
        hyps = self.captions(model, data, split)
        refs = [list(c) for c in part.captions]
        iou, iou_uniform = self.word_ious(model, data, split)
        exact = [h == r for h, r in zip(hyps, refs, strict=True)]
        return {
            "bleu": corpus_bleu(hyps, refs),
            "meteor": meteor_or_nan(hyps, refs),
            "caption_accuracy": float(np.mean(exact)) if exact else float("nan"),
            "iou": iou,
            "iou_uniform": iou_uniform,
        }

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The greedy captions of the first ``n`` test scenes: one overlay per colour or
        shape word (the attention that produced it) on the image."""
        part: CaptionData = data.test
        k = min(n, len(part))
        if k <= 0:
            return []
        vocab: Vocab = data.info["vocab"]
        device = next(model.parameters()).device
        g = int(self.options["grid"])
        dec = model.greedy(part.images[:k].to(device), max_len=data.info["max_len"] + 1)
        examples = []
        for b in range(k):
            words = vocab.decode(dec.tokens[b])
            keep = [t for t, w in enumerate(words) if w != JOIN]
            att = dec.attention[b].float().cpu()
            examples.append(
                AttentionExample(
                    title=f"test #{b}",
                    rows=[words[t] for t in keep],
                    cols=[f"({r},{c})" for r in range(g) for c in range(g)],
                    weights=[att[t].tolist() for t in keep],
                    label=" ".join(part.captions[b]),
                    prediction=" ".join(words),
                    kind="image",
                    grid=(g, g),
                    image=(part.images[b].float() / 255.0).numpy().round(4).tolist(),
                )
            )
        return examples
