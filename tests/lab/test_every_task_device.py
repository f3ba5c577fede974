"""Every task of the lab trains one short epoch through train_run, writes a checkpoint that
loads back (checked against run.json's sha256), and gives finite metrics: on the CPU under
bf16 autocast (so every task's loss, evaluation and examples run under autocast on every
machine), and -- marked ``cuda``, skipped without a GPU -- on CUDA in fp32 and bf16, where
cuDNN flattens the recurrent weights (the checkpoint crash of issue 14)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny_tasks import TASKS, tiny_task

from attnlab.lab.checkpoint import load_state
from attnlab.lab.training import seed_everything, train_run

CUDA = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _train_and_reload(name: str, device: str, precision: str, tmp_path) -> None:
    task = tiny_task(name)
    result = train_run(
        task, None, device=device, precision=precision, out_dir=tmp_path / "r", progress=False
    )
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["status"] == "done"
    assert run["precision"] == precision
    assert torch.device(run["device"]).type == torch.device(device).type
    primary = result.metrics["primary"]
    assert math.isfinite(result.test[primary]), result.test
    assert math.isfinite(result.history[0]["train_loss"])
    # the checkpoint loads into a fresh model on the CPU, checked against its sha256
    seed_everything(1)
    data = task.load_data()
    model = task.build_model(data, task.resolve_attention(None))
    missing, unexpected = load_state(
        model, result.run_dir / "model.safetensors", device="cpu", sha256=run["checkpoint_sha256"]
    )
    assert missing == [] and unexpected == []


@pytest.mark.parametrize("name", TASKS)
def test_every_task_trains_under_bf16_on_the_cpu(name, tmp_path):
    _train_and_reload(name, "cpu", "bf16", tmp_path)


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("marks", [pytest.param(None, marks=CUDA, id="cuda")])
def test_every_task_trains_on_cuda_fp32(name, marks, tmp_path):
    _train_and_reload(name, "cuda", "fp32", tmp_path)


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("marks", [pytest.param(None, marks=CUDA, id="cuda")])
def test_every_task_trains_on_cuda_bf16(name, marks, tmp_path):
    _train_and_reload(name, "cuda", "bf16", tmp_path)
