"""The inpainting task: mirrored mosaics with a hidden block, a CNN with a non-local block,
PSNR / SSIM / twin-attention metrics, the presets and baselines, an end-to-end train_run,
and a learning test that attention passes and the same CNN without attention fails."""

from __future__ import annotations

import math

import pytest
import torch
from task_harness import check_deterministic, check_train_run, run_spec, spec_id

from attnlab._checks import ConfigError
from attnlab.lab.tasks.inpainting import InpaintingTask, twin_attention
from attnlab.lab.training import train_run
from attnlab.models.inpainter import Inpainter

pytest.importorskip("torchmetrics", reason="PSNR and SSIM need torchmetrics (attnlab[eval])")

TINY = {"train_size": 24, "dev_size": 6, "test_size": 5, "channels": 4, "batch_size": 8}
SPECS = [{}, *({"name": p} for p in InpaintingTask.presets), {"name": "none"}, {"name": "mean"}]
SPECS.append({"score": "general", "align": "sparsemax"})


@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline(spec) -> None:
    task = InpaintingTask(**TINY)
    data = task.load_data()
    _, metrics, examples = run_spec(task, data, spec, 8, model_type=Inpainter, n=3)
    assert set(task.metrics) <= set(metrics)
    assert metrics["psnr_masked"] > 0 and metrics["psnr"] > metrics["psnr_masked"]
    assert 0 < metrics["ssim"] <= 1 and metrics["mse_masked"] >= 0
    without = spec.get("name") in ("none", "mean")
    assert math.isnan(metrics["twin_attention"]) == without
    if without:
        assert examples == []
        return
    assert 0 <= metrics["twin_attention"] <= 1
    assert metrics["twin_attention_uniform"] == pytest.approx(4 / 60)
    assert len(examples) == 3
    for ex in examples:
        assert ex.kind == "image" and ex.grid == (8, 8) and len(ex.cols) == 64
        assert len(ex.rows) == 4  # the hidden block covers 2 x 2 cells
        for row in ex.weights:
            assert sum(row) == pytest.approx(1.0, abs=1e-4)


def test_one_seed_one_model() -> None:
    task = InpaintingTask(**TINY)
    check_deterministic(task, task.load_data(), {}, 8)


def test_twin_attention_is_the_mass_on_the_mirror_cells() -> None:
    hidden = torch.zeros(1, 2, 4, dtype=torch.bool)
    hidden[0, 0, 0] = True  # cell (0, 0); its twin is (0, 3) = index 3
    weights = torch.full((1, 8, 8), 1 / 8)
    weights[0, 0] = torch.tensor([0, 0.1, 0.2, 0.6, 0.1, 0, 0, 0])
    assert twin_attention(weights, hidden).tolist() == pytest.approx([0.6])


def test_options_presets_and_errors() -> None:
    task = InpaintingTask(preset="paper")
    assert task.options["size"] == 32 and task.options["block"] == 8
    assert InpaintingTask(preset="cpu").options["train_size"] == 4000
    with pytest.raises(ConfigError, match="option gap must be an int >= 0"):
        InpaintingTask(gap=-1)
    with pytest.raises(ConfigError, match="option positions must be one of"):
        InpaintingTask(positions="rotary")
    with pytest.raises(ConfigError, match="the image options do not work together"):
        InpaintingTask(block=8, gap=2, **TINY).load_data()
    with pytest.raises(ConfigError, match="no attention preset"):
        InpaintingTask(**TINY).resolve_attention({"name": "uniform"})


def test_train_run_end_to_end(tmp_path) -> None:
    task = InpaintingTask(epochs=2, **TINY)
    for spec in ({"name": "non-local"}, {"name": "none"}):
        check_train_run(
            task, spec, tmp_path / spec["name"], num_threads=1, primary="psnr_masked",
            metric_names=task.metrics, epochs=2,
        )  # fmt: skip
    _, examples = check_train_run(
        task, {}, tmp_path / "default", num_threads=1, example_kind="image"
    )
    assert examples[0]["image"] and examples[0]["extra"]["twin_attention"] >= 0


def _learn(spec: str, seed: int, out_dir) -> dict[str, float]:
    """The test metrics of the trainer's run on 2,000 mosaics for 16 epochs (1,008 steps)."""
    options = {"train_size": 2000, "dev_size": 20, "test_size": 200, "epochs": 16}
    result = train_run(
        "inpainting", spec, seed=seed, options=options, out_dir=out_dir, progress=False,
        num_threads=1,
    )  # fmt: skip
    return result.metrics["test"]


@pytest.mark.slow
def test_attention_copies_the_twin_that_the_cnn_cannot_see(tmp_path) -> None:
    # seeds 0-4 (checked locally): non-local 34.5-36.7 dB on the hidden block, twin
    # attention 0.987-0.993 (floor 0.067); none 10.85-10.88 dB (the mean colour's PSNR)
    seed = 0
    attention = _learn("non-local", seed, tmp_path / "non-local")
    none = _learn("none", seed, tmp_path / "none")
    assert attention["psnr_masked"] > none["psnr_masked"] + 10, (attention, none)
    assert none["psnr_masked"] < 12  # no better than the mean colour
    assert attention["twin_attention"] > 0.5 > 5 * attention["twin_attention_uniform"]
