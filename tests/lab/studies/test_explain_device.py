"""`attnlab explain --device`: auto / cpu / cuda, a bad device refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import toy_task  # noqa: F401  (registers the "toy" task)

from attnlab.lab.studies.explanation import explain_command, explain_run
from attnlab.lab.training import train_run

QUICK = dict(
    max_instances=16,
    permutations=4,
    adversarial_steps=5,
    lambdas=(1.0,),
    mlp_epochs=1,
    adversarial_epochs=1,
    max_train=32,
    progress=False,
    plots=False,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain-device")
    opts = {"epochs": 1, "n_train": 64, "n_eval": 16}
    return Path(train_run("toy", "tanh", options=opts, out_dir=root / "r", progress=False).run_dir)


@pytest.mark.parametrize(("device", "text"), [("tpu", "device 'tpu'"), ("cuda:99", "cuda:99")])
def test_a_bad_device_is_one_line_before_anything_is_written(run, device, text):
    result = CliRunner().invoke(explain_command, [str(run), "--quick", "--device", device])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0]
    assert not (run / "explanation").exists()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_explain_on_cuda_agrees_with_the_cpu(run, tmp_path):
    cpu = explain_run(run, device="cpu", **QUICK)
    gpu = explain_run(run, device="cuda", **QUICK)
    assert gpu["instances"] == cpu["instances"]
    for pair, v in cpu["kendall"].items():
        assert gpu["kendall"][pair]["mean"] == pytest.approx(v["mean"], abs=0.05)
    assert gpu["uniform"]["learned_accuracy"] == pytest.approx(cpu["uniform"]["learned_accuracy"])
    json.loads((run / "explanation" / "explanation.json").read_text())
