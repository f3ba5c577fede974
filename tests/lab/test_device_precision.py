"""Device and precision of the lab: ``--device auto``, ``--precision fp32|bf16|fp16``
(autocast, a gradient scaler for fp16), recorded in run.json; the Ray executor asks for a
GPU per CUDA run; bad values are one line, exit 2, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from attnlab._checks import ConfigError
from attnlab.cli import main
from attnlab.lab import ablation, executors
from attnlab.lab.executors import RayExecutor, RunJob, RunOutcome
from attnlab.lab.training import (
    PRECISIONS,
    precision_context,
    resolve_device,
    resolve_precision,
    train_run,
)

TOY = "tests.lab.toy_task"
TINY = {"epochs": 1, "n_train": 64, "n_eval": 16}


def _run(*argv: str):
    return CliRunner().invoke(main, list(argv), catch_exceptions=False)


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ----------------------------------------------------------------------------- device


def test_auto_is_cuda_when_available_else_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(" AUTO ") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_train_run_defaults_to_auto(tmp_path, toy_task_module, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = train_run("toy", options=TINY, out_dir=tmp_path / "r", progress=False)
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["device"] == "cpu" and run["precision"] == "fp32"
    assert run["device_name"] is None


# ----------------------------------------------------------------------------- precision


def test_precision_values():
    assert PRECISIONS == ("fp32", "bf16", "fp16")
    for p in PRECISIONS:
        assert resolve_precision(p, "cpu") == p
    for bad in ("fp8", "FP16", "half", "", None, 16):
        with pytest.raises(ConfigError, match="precision must be one of fp32, bf16, fp16"):
            resolve_precision(bad, "cpu")  # type: ignore[arg-type]


def test_bf16_refused_on_a_gpu_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Old GPU")
    with pytest.raises(ConfigError, match="'Old GPU' does not support bfloat16; use"):
        resolve_precision("bf16", "cuda")
    assert resolve_precision("fp16", "cuda") == "fp16"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_precision_context_autocasts_an_lstm_on_the_cpu(precision):
    """oneDNN's LSTM refuses reduced-precision inputs on CPUs without bf16 support; the
    context runs it anyway (and leaves oneDNN as it was)."""
    torch.manual_seed(0)
    lstm, linear = torch.nn.LSTM(4, 5, batch_first=True), torch.nn.Linear(5, 2)
    before = torch.backends.mkldnn.enabled
    with precision_context(torch.device("cpu"), precision):
        out = linear(lstm(torch.randn(2, 3, 4))[0])
    assert out.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert torch.backends.mkldnn.enabled == before
    with precision_context(torch.device("cpu"), "fp32"):
        assert linear(torch.randn(1, 5)).dtype == torch.float32


class _Spy:
    """Records the autocast state seen by the task's loss and evaluate."""

    def __init__(self) -> None:
        self.loss: set = set()
        self.evaluate: set = set()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_train_run_trains_under_autocast_and_records_it(
    tmp_path, toy_task_module, monkeypatch, precision
):
    spy = _Spy()
    toy = toy_task_module.ToyTask

    def state() -> tuple[bool, torch.dtype | None]:
        on = torch.is_autocast_enabled("cpu")
        return on, torch.get_autocast_dtype("cpu") if on else None

    class Spied(toy):
        def loss(self, model, batch):
            spy.loss.add(state())
            return super().loss(model, batch)

        def evaluate(self, model, data, split):
            spy.evaluate.add(state())
            return super().evaluate(model, data, split)

    scalers: list = []
    real = torch.amp.GradScaler

    class SpyScaler(real):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.scaled = 0
            scalers.append(self)

        def scale(self, outputs):
            self.scaled += 1
            return super().scale(outputs)

    monkeypatch.setattr(torch.amp, "GradScaler", SpyScaler)
    task = Spied(**TINY)
    result = train_run(
        task, "tanh", precision=precision, device="cpu", out_dir=tmp_path / "r", progress=False
    )
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert spy.loss == {(dtype is not None, dtype)}
    assert spy.evaluate == {(dtype is not None, dtype)}
    run = json.loads((result.run_dir / "run.json").read_text())
    assert run["precision"] == precision
    assert 0.0 <= result.test["accuracy"] <= 1.0
    (scaler,) = scalers
    assert scaler.is_enabled() == (precision == "fp16")  # loss scaling only for fp16
    assert scaler.scaled == 64 // 32


def test_fp32_is_unchanged_by_the_scaler(tmp_path, toy_task_module):
    """The default path gives the same numbers as plain loss.backward(): two runs with the
    same seed agree to the bit, and the checkpoint holds float32 weights."""
    a = train_run("toy", options=TINY, out_dir=tmp_path / "a", progress=False)
    b = train_run("toy", options=TINY, precision="fp32", out_dir=tmp_path / "b", progress=False)
    assert a.metrics == b.metrics
    assert a.history[0]["train_loss"] == b.history[0]["train_loss"]


# ----------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--precision", "fp8"], "precision must be one of fp32, bf16, fp16, got 'fp8'"),
        (["--device", "tpu"], "device 'tpu'"),
    ],
)
def test_train_bad_device_or_precision(tmp_path, extra, text):
    out = tmp_path / "out"
    argv = ["train", "toy", "--plugin", TOY, "--no-progress", "--out", str(out), *extra]
    assert text in _one_line_error(_run(*argv))
    assert not out.exists()


def test_train_precision_goes_into_run_json(tmp_path):
    out = tmp_path / "out"
    argv = ["train", "toy", "--plugin", TOY, "--no-progress", "--out", str(out)]
    result = _run(*argv, "--epochs", "1", "-o", "n_train=64", "--precision", "bf16")
    assert result.exit_code == 0, result.output
    run = json.loads((out / "default--seed0" / "run.json").read_text())
    assert run["precision"] == "bf16"
    assert run["device"] == str(resolve_device("auto"))


@pytest.mark.parametrize(
    ("extra", "text"),
    [(["--precision", "half"], "got 'half'"), (["--device", "cuda:99"], "cuda:99")],
)
def test_ablate_bad_device_or_precision(tmp_path, extra, text):
    out = tmp_path / "out"
    argv = ["ablate", "toy", "--plugin", TOY, "--out", str(out), "--no-report", "-a", "tanh"]
    assert text in _one_line_error(_run(*argv, "--seeds", "0", *extra))
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "text"),
    [(["--precision", "fp64"], "got 'fp64'"), (["--device", "gpu"], "device 'gpu'")],
)
def test_demo_bad_device_or_precision(tmp_path, extra, text):
    out = tmp_path / "demo"
    assert text in _one_line_error(_run("demo", "--quick", "--out", str(out), *extra))
    assert not out.exists()


# ----------------------------------------------------------------------------- ablation, Ray


def test_ablation_resolves_auto_and_passes_the_precision(tmp_path, toy_task_module, monkeypatch):
    """``auto`` becomes the concrete device in every job (so the Ray executor sees 'cuda'
    and asks for a GPU); the precision reaches every job."""
    seen: list[RunJob] = []

    class Recorder:
        def run(self, jobs, on_done, should_run=None):
            for job in jobs:
                if should_run is None or should_run(job):
                    seen.append(job)
                    on_done(RunOutcome(job.run_id, "failed", job.run_dir, error="not run"))

    monkeypatch.setattr(ablation, "make_executor", lambda *a, **k: Recorder())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ablation.run_ablation(
        "toy",
        [{"name": "tanh"}],
        [0, 1],
        out_dir=tmp_path / "ab",
        options=TINY,
        executor="ray",
        progress=False,
        precision="fp16",
    )
    assert [(j.device, j.precision) for j in seen] == [("cuda", "fp16")] * 2


class _FakeRay:
    """Just enough of ``ray`` for RayExecutor.run: records each task's num_gpus."""

    def __init__(self) -> None:
        self.gpus: dict[str, int] = {}
        self.results: dict[int, RunOutcome] = {}

    def is_initialized(self) -> bool:
        return True

    def remote(self, **_kw):
        fake = self

        class Remote:
            def options(self, num_gpus=0):
                class Call:
                    def remote(self, job):
                        fake.gpus[job.run_id] = num_gpus
                        ref = len(fake.results)
                        fake.results[ref] = RunOutcome(job.run_id, "done", job.run_dir)
                        return ref

                return Call()

        return lambda fn: Remote()

    def wait(self, refs, num_returns=1):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return self.results[ref]


def test_ray_asks_for_one_gpu_per_cuda_run(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setattr(executors, "_import_ray", lambda: fake)
    jobs = [
        RunJob("a", "toy", {}, 0, "/tmp/a", device="cuda"),
        RunJob("b", "toy", {}, 0, "/tmp/b", device="cuda:1"),
        RunJob("c", "toy", {}, 0, "/tmp/c", device="cpu"),
    ]
    done: list[str] = []
    RayExecutor().run(jobs, lambda outcome: done.append(outcome.run_id))
    assert fake.gpus == {"a": 1, "b": 1, "c": 0}
    assert sorted(done) == ["a", "b", "c"]


def test_a_job_carries_its_precision_to_train_run(tmp_path, toy_task_module):
    job = RunJob(
        "r", "toy", {"name": "tanh"}, 0, str(tmp_path / "r"), options=TINY, precision="bf16"
    )
    outcome = executors.execute_job(job)
    assert outcome.status == "done", outcome.error
    assert json.loads((Path(outcome.run_dir) / "run.json").read_text())["precision"] == "bf16"


def test_a_bad_device_name_is_one_short_line():
    """torch's own message lists two dozen backends; the line says what to type instead."""
    with pytest.raises(ConfigError) as caught:
        resolve_device("tpu")
    assert str(caught.value) == (
        "device 'tpu' is not a device name (try 'auto', 'cpu', 'cuda' or 'cuda:0')"
    )
