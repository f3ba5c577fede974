"""Task ``vqa``: visual question answering on easy-VQA with co-attention (Lu et al. 2016).

The task model is :class:`attnlab.models.vqa.VQAModel`: a small CNN gives an 8 x 8 grid of
region vectors, a BiLSTM the question's word vectors, co-attention between the two (each
guided by the other) gives one context per side, and a tanh layer + linear output scores
the 13 answers; trained with cross-entropy (plus a REINFORCE term for stochastic
alignments).

Data: easy-VQA (``easy-vqa`` 1.0, MIT licence; :func:`attnlab.data.easy_vqa.load_easy_vqa`):
64x64 images of one coloured shape, questions about its colour, its shape or yes/no;
train / dev (10 % of the train images, all their questions) / test (the package's).

Attention presets: ``parallel`` (default; Lu et al.'s parallel co-attention), ``alternating``
(Lu et al.'s alternating co-attention), ``interactive`` (Ma et al. 2017), ``parallel-max``
(parallel with max-pooled affinity scores) and the baselines ``mean`` and ``uniform``. Any
other key goes to the co-attention module (``co_attention``, ``align``, ``score``,
``affinity``, ``scores``, ``d_w``, ...). Metrics: accuracy (selection), macro F1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.data._common import simple_tokenize
from attnlab.data.easy_vqa import IMAGE_SIZE
from attnlab.data.vocab import Vocab
from attnlab.lab.task import AttentionExample, TaskData, register_task
from attnlab.lab.tasks._shared import ClassifierTask, accuracy_and_f1, check_int_list_options
from attnlab.models.vqa import ENCODERS, VQAModel

__all__ = ["VQAData", "VQATask", "vqa_metrics"]

#: the grids :class:`VQAModel` takes on easy-VQA's images: ``IMAGE_SIZE / grid`` a power
#: of 2 >= 2 (1, 2, 4, 8, 16, 32 for 64x64 images)
GRIDS = tuple(IMAGE_SIZE >> k for k in range(IMAGE_SIZE.bit_length() - 1, 0, -1))


@dataclass(frozen=True)
class VQAData:
    """One split, ready for batching.

    Attributes:
        images: ``[M, H, W, 3]`` uint8.
        image_index: ``[N]`` long, the image of each question (a row of ``images``);
            questions about one image are consecutive.
        tokens: ``[N, L]`` long word ids (0-padded). lengths: ``[N]`` long.
        labels: ``[N]`` long answer ids.
        words: the question words. types: the question types.
    """

    images: Tensor
    image_index: Tensor
    tokens: Tensor
    lengths: Tensor
    labels: Tensor
    words: tuple[tuple[str, ...], ...]
    types: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def vqa_metrics(labels: np.ndarray, pred: np.ndarray, num_classes: int) -> dict[str, float]:
    """Accuracy and macro F1 over the answer classes present among the labels
    (scikit-learn)."""
    return accuracy_and_f1(labels, pred, None, "f1_macro")


@register_task("vqa")
class VQATask(ClassifierTask):
    """easy-VQA with :class:`~attnlab.models.vqa.VQAModel`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        max_train: at most this many training questions (all the questions of a seeded
            sample of images; default 12000, None = all 34,679).
        max_dev, max_test: at most this many dev / test questions (the first images' ones;
            None = all).
        split_seed: seed of the dev split and of the ``max_train`` sample.
        embed_dim, hidden_size, encoder (``"bilstm"``/``"bigru"``), channels (a non-empty
            list of ints >= 1), grid, region_positions, dropout: the model (see
            :class:`VQAModel`).
        reinforce_weight: weight of the REINFORCE term of stochastic alignments.

    Batches group the questions of an image (the CNN runs once per image); ``shuffle``
    shuffles the images.

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: the sizes
    and training of Lu et al.'s co-attention (2016, NIPS, section 4.2) -- word embeddings
    and question / region features of 512 (a BiLSTM of 256 per direction), dropout 0.5,
    mini-batches of 300, learning rate 4e-4, up to 256 epochs with early stopping after 5
    epochs without a better dev accuracy (``patience=5``; the best dev epoch is kept), no
    gradient clipping (their code has none) -- on every easy-VQA training question. Not
    reproduced: their VGG / ResNet image features (196 regions; the task's small CNN and
    8 x 8 = 64 regions here: easy-VQA's 64x64 images), their hierarchical question
    encoder (word, phrase and question levels, each co-attended, joined by a recursive
    MLP; one BiLSTM and one co-attention here), dropout on every layer (here on the pooled
    vector only) and RMSprop with its learning-rate decay (Adam, constant, here).

    :formula: V = CNN(image) [R = 8x8 regions]; Q = BiLSTM(E[w]); (c_q, c_v) = CoAtt(Q, V);
        p(answer) = softmax(W_o tanh(W_h [c_q; c_v] + b_h) + b_o)
    :source: Lu, Yang, Batra & Parikh 2016, Hierarchical Question-Image Co-Attention for Visual
        Question Answering, NeurIPS; data: easy-VQA (Zhou 2020, MIT licence)
    :cost: CNN once per image + BiLSTM O(n 8 h (d_e + h)) + co-attention O(n R d) per question
    """

    eval_batch_size = 256
    scores = staticmethod(vqa_metrics)
    metrics: ClassVar[tuple[str, ...]] = ("accuracy", "f1_macro")
    higher_is_better: ClassVar[bool] = True
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "embed_dim": 512,
            "hidden_size": 256,
            "dropout": 0.5,
            "batch_size": 300,
            "lr": 4e-4,
            "epochs": 256,
            "patience": 5,
            "grad_clip": 0.0,
            "max_train": None,
            "max_dev": None,
        },
    }
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 4,
        "batch_size": 64,
        "lr": 2e-3,
        "max_train": 12000,
        "max_dev": 2000,
        "max_test": None,
        "split_seed": 0,
        "embed_dim": 32,
        "hidden_size": 32,
        "encoder": "bilstm",
        "channels": [8, 16],
        "grid": 8,
        "region_positions": True,
        "dropout": 0.0,
        "reinforce_weight": 1.0,
    }
    default_attention: ClassVar[dict[str, Any]] = {"co_attention": "parallel"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "parallel": {"co_attention": "parallel"},
        "alternating": {"co_attention": "alternating"},
        "interactive": {"co_attention": "interactive"},
        "parallel-max": {"co_attention": "parallel", "scores": "max"},
    }
    data_source: ClassVar[str] = "easy-VQA images and questions (easy-vqa 1.0, MIT licence)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.check_int_options("max_train", "max_dev", "max_test", optional=True)
        self.check_option_choice("encoder", ENCODERS)
        # before any data is read (the model refused it after the data was loaded): the
        # CNN halves the easy-VQA images down to grid x grid cells
        self.check_int_options("grid")
        self.check_option_choice("grid", GRIDS)
        check_int_list_options(self, "channels")  # a bare 16 failed after the data

    # ------------------------------------------------------------------ data

    def load_data(self) -> TaskData:
        from attnlab.data.easy_vqa import load_easy_vqa

        o = self.options
        ds = load_easy_vqa(seed=int(o["split_seed"]))
        train = _limit(ds.train, o["max_train"], seed=int(o["split_seed"]))
        dev = _limit(ds.dev, o["max_dev"], seed=None)
        test = _limit(ds.test, o["max_test"], seed=None)
        words = {
            name: [tuple(simple_tokenize(q, lower=True)) for q in part.questions]
            for name, part in (("train", train), ("dev", dev), ("test", test))
        }
        vocab = Vocab.from_corpus(words["train"])
        answer_id = {a: i for i, a in enumerate(ds.answers)}

        def prepare(name: str, part: Any) -> VQAData:
            toks = words[name]
            lengths = [len(t) for t in toks]
            tokens = torch.zeros(len(toks), max([1, *lengths]), dtype=torch.long)
            for i, t in enumerate(toks):
                if t:
                    tokens[i, : len(t)] = torch.tensor(vocab.encode(t), dtype=torch.long)
            return VQAData(
                images=torch.from_numpy(np.ascontiguousarray(part.images)),
                image_index=torch.from_numpy(np.asarray(part.question_images, dtype=np.int64)),
                tokens=tokens,
                lengths=torch.tensor(lengths, dtype=torch.long),
                labels=torch.tensor([answer_id[a] for a in part.answers], dtype=torch.long),
                words=tuple(toks),
                types=tuple(part.question_types),
            )

        info = {
            "vocab": vocab,
            "answers": tuple(ds.answers),
            "num_classes": len(ds.answers),
            "image_size": int(ds.train.images.shape[1]),
            "version": ds.version,
        }
        return TaskData(prepare("train", train), prepare("dev", dev), prepare("test", test), info)

    def batch_indices(self, part: VQAData, batch_size: int, **order: Any) -> Iterator[list[int]]:
        """The questions of an image in one batch (:func:`image_grouped_order`; ``order``:
        ``shuffle`` and ``generator``, as in :meth:`Task.batch_indices`)."""
        return image_grouped_order(part, batch_size, **order)

    def make_batch(self, data: TaskData, part: VQAData, idx: list[int]) -> dict[str, Tensor]:
        return vqa_batch(part, idx)

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        return VQAModel(
            len(data.info["vocab"]),
            data.info["num_classes"],
            embed_dim=int(o["embed_dim"]),
            hidden_size=int(o["hidden_size"]),
            encoder=o["encoder"],
            image_size=int(data.info.get("image_size", 64)),
            grid=int(o["grid"]),
            channels=tuple(int(c) for c in o["channels"]),
            region_positions=bool(o["region_positions"]),
            attention=self.model_attention(attention),
            dropout=float(o["dropout"]),
            padding_idx=data.info["vocab"].pad_index or 0,
        )

    # ------------------------------------------------------------------ training

    @staticmethod
    def model_output(model: nn.Module, batch: Mapping[str, Tensor]) -> Any:
        return model(
            batch["images"], batch["tokens"], batch["lengths"], image_index=batch["image_index"]
        )

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The first question about each of the first ``n`` test images: the region
        weights on the image (grid 8 x 8) and the word weights in ``extra``."""
        part: VQAData = data.test
        if len(part) == 0 or n <= 0:
            return []
        first = torch.ones(len(part), dtype=torch.bool)
        first[1:] = part.image_index[1:] != part.image_index[:-1]
        rows = torch.nonzero(first).flatten()[:n].tolist()
        device = next(model.parameters()).device
        imgs = part.images[part.image_index[rows]]
        out = model(imgs.to(device), part.tokens[rows].to(device), part.lengths[rows].to(device))
        answers = data.info["answers"]
        grid = int(getattr(model, "grid", 0)) or math.isqrt(out.region_weights.shape[1])
        pred = out.logits.argmax(-1).tolist()
        examples = []
        for k, i in enumerate(rows):
            length = int(part.lengths[i])
            image = (imgs[k].float() / 255.0).numpy().round(4).tolist()
            words = list(part.words[i])
            examples.append(
                AttentionExample(
                    title=f"test #{i}: {' '.join(words)}",
                    rows=["regions"],
                    cols=[f"({r},{c})" for r in range(grid) for c in range(grid)],
                    weights=[out.region_weights[k].float().cpu().tolist()],
                    label=answers[int(part.labels[i])],
                    prediction=answers[pred[k]],
                    kind="image",
                    grid=(grid, grid),
                    image=image,
                    extra={
                        "question": " ".join(words),
                        "words": words,
                        "word_weights": out.word_weights[k, :length].float().cpu().tolist(),
                        "question_type": part.types[i],
                    },
                )
            )
        return examples


def image_grouped_order(
    part: VQAData,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
) -> Iterator[list[int]]:
    """The question indices of each batch of ``batch_size`` questions, the questions of an
    image together (in image order, or a shuffled image order from ``generator``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    N = len(part)
    if N == 0:
        return
    if shuffle:
        m = int(part.images.shape[0])
        rank = torch.empty(m, dtype=torch.long)
        rank[torch.randperm(m, generator=generator)] = torch.arange(m)
        # stable sort by the image's rank keeps an image's questions together, in order
        order = torch.sort(rank[part.image_index], stable=True).indices
    else:
        order = torch.arange(N)
    for start in range(0, N, batch_size):
        yield order[start : start + batch_size].tolist()


def vqa_batch(part: VQAData, idx: list[int]) -> dict[str, Tensor]:
    """The batch of the questions ``idx``: ``images`` ``[M, H, W, 3]`` uint8 (the batch's
    distinct images), ``image_index`` ``[B]`` (into ``images``), ``tokens``, ``lengths``,
    ``labels``, ``index`` (the questions' rows in the split)."""
    index = torch.tensor(idx, dtype=torch.long)
    used, inverse = torch.unique(part.image_index[index], return_inverse=True)
    width = max(int(part.lengths[index].max()), 1)
    return {
        "images": part.images[used],
        "image_index": inverse,
        "tokens": part.tokens[index, :width],
        "lengths": part.lengths[index],
        "labels": part.labels[index],
        "index": index,
    }


def vqa_batches(
    part: VQAData,
    batch_size: int,
    *,
    shuffle: bool = False,
    generator: torch.Generator | None = None,
) -> Iterator[dict[str, Tensor]]:
    """Batches of ``batch_size`` questions, the questions of an image together
    (:func:`image_grouped_order`, :func:`vqa_batch`)."""
    for idx in image_grouped_order(part, batch_size, shuffle=shuffle, generator=generator):
        yield vqa_batch(part, idx)


def _limit(part: Any, limit: int | None, *, seed: int | None) -> Any:
    """At most ``limit`` questions: all the questions of whole images, the images taken in a
    seeded random order (``seed``) or in order (``None``); the last image may be cut."""
    if limit is None or len(part) <= limit:
        return part
    m = part.images.shape[0]
    image_order = np.random.default_rng(seed).permutation(m) if seed is not None else np.arange(m)
    rank = np.empty(m, dtype=np.int64)
    rank[image_order] = np.arange(m)
    order = np.argsort(rank[part.question_images], kind="stable")
    return part.subset(order[:limit])
