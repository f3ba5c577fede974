"""Task ``vqa``: every preset and baseline on a tiny generated TaskData (no data package
needed), and an end-to-end run on real easy-VQA (skipped when the package is absent)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from task_harness import (
    check_deterministic,
    check_metrics,
    check_train_run,
    real_data,
    run_spec,
    spec_id,
)

from attnlab._checks import ConfigError
from attnlab.data.vocab import Vocab
from attnlab.lab.task import TaskData
from attnlab.lab.tasks.vqa import VQAData, VQATask, vqa_batches, vqa_metrics
from attnlab.models.vqa import VQAModel

SPECS = [{}, *({"name": p} for p in VQATask.presets), {"name": "mean"}, {"name": "uniform"}]
SPECS += [
    {"name": "alternating", "score": "dot"},
    {"co_attention": "parallel", "align": "sparsemax"},
]
TINY = {"grid": 4, "channels": [4], "hidden_size": 4, "embed_dim": 4, "batch_size": 4}


def tiny_split(n_images: int, seed: int, vocab: Vocab) -> VQAData:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n_images, 16, 16, 3), generator=g, dtype=torch.uint8)
    per = 3
    image_index = torch.arange(n_images).repeat_interleave(per)
    words = [("what", "color", "is", "it")[: 1 + (i % 4)] for i in range(n_images * per)]
    lengths = torch.tensor([len(w) for w in words])
    tokens = torch.zeros(len(words), 4, dtype=torch.long)
    for i, w in enumerate(words):
        tokens[i, : len(w)] = torch.tensor(vocab.encode(w))
    labels = torch.randint(0, 3, (len(words),), generator=g)
    return VQAData(
        images, image_index, tokens, lengths, labels, tuple(words), ("color",) * len(words)
    )


def _tiny_data() -> TaskData:
    """Three splits of 4, 2 and 3 random 16x16 images, three questions each."""
    vocab = Vocab(["what", "color", "is", "it"])
    info = {
        "vocab": vocab,
        "answers": ("red", "blue", "yes"),
        "num_classes": 3,
        "image_size": 16,
        "version": "tiny",
    }
    return TaskData(tiny_split(4, 0, vocab), tiny_split(2, 1, vocab), tiny_split(3, 2, vocab), info)


@pytest.fixture
def task():
    return VQATask(**TINY)


@pytest.fixture
def data():
    return _tiny_data()


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline(task, data, spec):
    _, metrics, examples = run_spec(
        task, data, spec, 4, model_type=VQAModel, generator_seed=None, split="dev", n=2
    )
    assert list(metrics)[:2] == list(task.metrics)
    check_metrics(metrics, task.metrics, exact=False)
    assert len(examples) == 2
    for ex in examples:
        assert ex.kind == "image" and ex.grid == (4, 4)
        assert len(ex.cols) == 16 and len(ex.weights) == 1
        assert sum(ex.weights[0]) == pytest.approx(1.0, abs=1e-4)
        assert np.asarray(ex.image).shape == (16, 16, 3)
        assert 0.0 <= np.min(ex.image) and np.max(ex.image) <= 1.0
        n_words = len(ex.extra["words"])
        assert len(ex.extra["word_weights"]) == n_words
        assert ex.extra["question"] == " ".join(ex.extra["words"])
        assert ex.label in data.info["answers"] and ex.prediction in data.info["answers"]
    # the examples are the first question of each of the first test images
    assert [ex.title.split(":")[0] for ex in examples] == ["test #0", "test #3"]


def test_one_seed_one_model(task, data):
    check_deterministic(task, data, {}, 4)


def test_batches_group_images(data):
    part = data.train
    seen = []
    for batch in vqa_batches(part, 5, shuffle=True, generator=torch.Generator().manual_seed(1)):
        idx = batch["index"]
        # every question's image is the batch image it points at
        for row, i in enumerate(idx.tolist()):
            img = batch["images"][batch["image_index"][row]]
            assert torch.equal(img, part.images[part.image_index[i]])
        assert batch["images"].shape[0] == len(torch.unique(part.image_index[idx]))
        seen += idx.tolist()
    assert sorted(seen) == list(range(len(part)))
    # questions about one image stay together (consecutive) after shuffling
    order = part.image_index[torch.tensor(seen)].tolist()
    assert sum(a != b for a, b in itertools.pairwise(order)) == part.images.shape[0] - 1


def test_metrics_by_hand():
    m = vqa_metrics(np.array([0, 0, 1, 2]), np.array([0, 1, 1, 1]), 3)
    assert m["accuracy"] == pytest.approx(0.5)
    # per class F1: class 0: p=1, r=1/2 -> 2/3; class 1: p=1/3, r=1 -> 1/2; class 2: 0
    assert m["f1_macro"] == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)


def test_options():
    with pytest.raises(ConfigError, match="no option"):
        VQATask(bogus=1)
    with pytest.raises(ConfigError, match="max_train"):
        VQATask(max_train=0)
    with pytest.raises(ConfigError, match="preset"):
        VQATask().resolve_attention({"name": "bogus"})
    assert VQATask.metrics[0] == "accuracy"


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def real():
    return real_data(VQATask(max_train=150, max_dev=40, max_test=40, epochs=1, batch_size=32))


def test_real_data_limits(real):
    _, data = real
    assert len(data.train) == 150 and len(data.dev) == 40 and len(data.test) == 40
    assert data.info["num_classes"] == 13
    assert data.train.images.shape[1:] == (64, 64, 3)
    # whole images: a subsample keeps the questions of an image together
    assert data.train.images.shape[0] < 40


def test_real_train_run(real, tmp_path):
    pytest.importorskip("attnlab.lab.training")
    task, _ = real
    for spec in ({"name": "parallel"}, {"name": "mean"}):
        out = tmp_path / spec["name"]
        _, examples = check_train_run(
            task, spec, out, num_threads=1, task_name="vqa", primary="accuracy",
            example_kind="image",
        )  # fmt: skip
        metrics = json.loads((out / "metrics.json").read_text())
        assert 0.0 <= metrics["test"]["accuracy"] <= 1.0
        assert examples[0]["grid"] == [8, 8]
        assert len(examples[0]["weights"][0]) == 64


@pytest.mark.parametrize("value", [0, -1, None, 1.5, True, "8", 3, 12, 64, 10**23])
def test_grid_is_checked_before_any_data(value):
    """``grid`` failed only when the model was built, after the data was read (and 64 /
    grid must be a power of 2 >= 2 for easy-VQA's 64x64 images); now a one-line
    ConfigError naming the option at construction."""
    with pytest.raises(ConfigError) as caught:
        VQATask(grid=value)
    message = str(caught.value)
    assert message.startswith("option grid must be ") and "\n" not in message
    for grid in (1, 2, 4, 8, 16, 32):
        assert VQATask(grid=grid).options["grid"] == grid


@pytest.mark.parametrize("value", ["bogus", "lstm", None])
def test_encoder_is_checked_before_any_data(value):
    with pytest.raises(ConfigError, match=r"^option encoder must be 'bilstm' or 'bigru'"):
        VQATask(encoder=value)
