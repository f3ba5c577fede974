"""Tests of attnlab.lab.training (train_run, load_run) on the generated toy task."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.lab.task import AttentionExample
from attnlab.lab.training import (
    RUN_FILES,
    RunResult,
    load_run,
    move_batch,
    resolve_device,
    train_run,
)

RUN_KEYS = {
    "task",
    "task_options",
    "attention",
    "label",
    "seed",
    "device",
    "device_name",
    "precision",
    "status",
    "started",
    "finished",
    "versions",
    "error",
    "checkpoint_sha256",
    "resumed_after",
    "compile",
}


def _read(path: Path):
    return json.loads(path.read_text())


@pytest.fixture
def toy(toy_task_module):
    return toy_task_module.ToyTask


# ----------------------------------------------------------------------------- layout


def test_run_directory_layout(toy_run_dir):
    assert sorted(p.name for p in toy_run_dir.iterdir()) == sorted(RUN_FILES)
    run = _read(toy_run_dir / "run.json")
    assert set(run) == RUN_KEYS
    assert run["task"] == "toy"
    assert run["status"] == "done" and run["error"] is None
    assert run["attention"] == {} and run["label"] == "default"
    assert run["seed"] == 0 and run["device"] == "cpu" and run["compile"] is None
    assert run["task_options"]["epochs"] == 3
    assert run["task_options"]["n_train"] == 240  # all options after defaults
    assert set(run["versions"]) == {"attnlab", "torch", "python"}
    assert run["started"] <= run["finished"]

    metrics = _read(toy_run_dir / "metrics.json")
    assert set(metrics) == {
        "primary",
        "higher_is_better",
        "best_epoch",
        "epochs_trained",
        "dev",
        "test",
    }
    assert metrics["epochs_trained"] == 3  # no patience: every epoch is trained
    assert metrics["primary"] == "accuracy" and metrics["higher_is_better"] is True
    assert 1 <= metrics["best_epoch"] <= 3
    assert set(metrics["test"]) == set(metrics["dev"]) == {"accuracy", "f1"}
    assert all(0.0 <= v <= 1.0 for v in metrics["test"].values())

    history = _read(toy_run_dir / "history.json")
    assert [h["epoch"] for h in history] == [1, 2, 3]
    for h in history:
        assert set(h) == {
            "epoch",
            "train_loss",
            "dev",
            "seconds",
            "examples_per_second",
            "data_share",
        }
        assert h["train_loss"] > 0 and h["seconds"] >= 0
        assert h["examples_per_second"] > 0 and 0 < h["data_share"] < 1
    best = history[metrics["best_epoch"] - 1]
    assert best["dev"] == metrics["dev"]
    assert max(h["dev"]["accuracy"] for h in history) == metrics["dev"]["accuracy"]

    cost = _read(toy_run_dir / "cost.json")
    assert set(cost) == {
        "parameters",
        "train_seconds",
        "seconds_per_epoch",
        "eval_ms_per_example",
        "peak_memory_mb",
        "examples_per_second",
        "data_seconds",
        "data_share",
        "prefetch",
    }
    assert cost["prefetch"] == 0  # the CPU builds batches in the training thread
    assert cost["examples_per_second"] > 0 and 0 < cost["data_share"] < 1
    # SentenceClassifier(16 words, 2 classes, embed 8, average encoder 8, tanh attention 8):
    # embedding 16*8 + projection 8*8+8 + attention (W 8*8 + b 8 + w 8) + output 8*2+2
    assert cost["parameters"] == 128 + 72 + 80 + 18
    assert cost["seconds_per_epoch"] == pytest.approx(cost["train_seconds"] / 3)
    assert cost["peak_memory_mb"] is None or cost["peak_memory_mb"] >= 0

    examples = [AttentionExample.from_json(e) for e in _read(toy_run_dir / "examples.json")]
    assert len(examples) == 4
    for ex in examples:
        assert ex.kind == "tokens" and ex.rows == ["attention"]
        assert sum(ex.weights[0]) == pytest.approx(1.0, abs=1e-5)
    # no hidden temporary folder is left beside the run
    assert [p.name for p in toy_run_dir.parent.iterdir()] == [toy_run_dir.name]


def test_result_matches_the_files(tmp_path, toy):
    result = train_run(
        "toy", "mean", seed=1, options={"epochs": 2}, out_dir=tmp_path / "r", progress=False
    )
    assert isinstance(result, RunResult)
    assert result.run_dir == (tmp_path / "r").absolute()
    assert result.label == "mean"
    assert result.metrics == _read(tmp_path / "r" / "metrics.json")
    assert result.history == _read(tmp_path / "r" / "history.json")
    assert result.cost == _read(tmp_path / "r" / "cost.json")
    assert result.test == result.metrics["test"]
    # mean pooling has no attention parameters: 128 + 72 + 18
    assert result.cost["parameters"] == 218


def test_default_run_dir_and_replacing_a_run(tmp_path, monkeypatch, toy):
    monkeypatch.chdir(tmp_path)
    spec = {"name": "tanh", "d_w": 4}
    first = train_run("toy", spec, seed=3, options={"epochs": 1}, progress=False)
    assert first.run_dir == tmp_path / "runs" / "toy" / "tanh__d_w=4--seed3"
    (first.run_dir / "stale.txt").write_text("from an older run")
    again = train_run("toy", spec, seed=3, options={"epochs": 1}, progress=False)
    assert again.run_dir == first.run_dir
    assert not (again.run_dir / "stale.txt").exists()
    assert sorted(p.name for p in (tmp_path / "runs" / "toy").iterdir()) == [first.run_dir.name]


@pytest.mark.parametrize(
    ("umask", "folder", "file"), [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)]
)
def test_a_run_gets_the_modes_of_the_umask(tmp_path, toy, umask, folder, file):
    """The run directory and every file in it (the checkpoint too) get the modes the umask
    gives any new folder and file, so a group may read the runs under the usual 022."""
    old = os.umask(umask)
    try:
        result = train_run(
            "toy", "tanh", seed=0, options={"epochs": 1}, out_dir=tmp_path / "r", progress=False
        )
    finally:
        os.umask(old)
    assert result.run_dir.stat().st_mode & 0o777 == folder
    modes = {p.name: p.stat().st_mode & 0o777 for p in result.run_dir.iterdir()}
    assert "model.safetensors" in modes
    assert modes == dict.fromkeys(modes, file)


# ----------------------------------------------------------------------------- selection


@pytest.mark.parametrize("progress", [False, True])
def test_the_trainer_tells_the_task_whether_it_may_show_progress(tmp_path, toy, progress):
    seen: list[bool] = []

    class Watched(toy):
        def load_data(self):
            seen.append(self.progress)
            return super().load_data()

    task = Watched(epochs=1)
    train_run(task, "tanh", out_dir=tmp_path / "r", progress=progress)
    assert seen == [progress]
    assert task.progress is False  # the caller's task keeps its own flag


def _scripted(toy, values, higher=True):
    """A toy task whose dev metric follows ``values``; it records the model state at each
    dev evaluation and the state the test evaluation sees."""

    class Scripted(toy):
        higher_is_better = higher

        def __init__(self, **options):
            super().__init__(**options)
            self.dev_states: list[dict[str, torch.Tensor]] = []
            self.test_state: dict[str, torch.Tensor] | None = None

        def evaluate(self, model, data, split):
            real = super().evaluate(model, data, split)
            state = {k: v.clone() for k, v in model.state_dict().items()}
            if split == "dev":
                self.dev_states.append(state)
                return {**real, "accuracy": values[len(self.dev_states) - 1]}
            self.test_state = state
            return real

    return Scripted(epochs=len(values))


@pytest.mark.parametrize(
    ("values", "higher", "best"),
    [
        ([0.5, 0.9, 0.7, 0.8], True, 2),
        ([0.5, 0.3, 0.4, 0.2], True, 1),
        ([0.5, 0.3, 0.4, 0.35], False, 2),
        ([0.6, 0.6, 0.6], True, 1),  # ties keep the earliest epoch
        ([float("nan"), 0.2, 0.1], True, 2),  # NaN never wins
    ],
)
def test_best_epoch_selection_restores_that_state(tmp_path, toy, values, higher, best):
    task = _scripted(toy, values, higher)
    result = train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)
    assert result.metrics["best_epoch"] == best
    assert result.metrics["higher_is_better"] is higher
    assert result.metrics["dev"]["accuracy"] == values[best - 1]
    assert [h["dev"]["accuracy"] for h in result.history] == [v if v == v else None for v in values]
    # the test split was evaluated with the best epoch's weights, and those were saved
    assert len(task.dev_states) == len(values)
    chosen = task.dev_states[best - 1]
    for k, v in chosen.items():
        assert torch.equal(task.test_state[k], v), k
    _, _, model = load_run(result.run_dir)
    for k, v in model.state_dict().items():
        assert torch.equal(v, chosen[k]), k
    if best != len(values):  # the last epoch's weights differ from the saved ones
        last = task.dev_states[-1]
        assert any(not torch.equal(last[k], chosen[k]) for k in chosen)


# ----------------------------------------------------------------------------- determinism


def test_same_seed_same_run_and_other_seed_differs(tmp_path, toy):
    runs = [
        train_run(
            "toy", "dot", seed=s, options={"epochs": 2}, out_dir=tmp_path / f"{i}", progress=False
        )
        for i, s in enumerate((7, 7, 8))
    ]
    a, b, c = runs
    assert a.metrics == b.metrics
    assert [h["train_loss"] for h in a.history] == [h["train_loss"] for h in b.history]
    assert (a.run_dir / "model.safetensors").read_bytes() == (
        b.run_dir / "model.safetensors"
    ).read_bytes()
    assert [h["train_loss"] for h in a.history] != [h["train_loss"] for h in c.history]


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"options": [("epochs", 1)]}, ConfigError, "options must be a mapping of option names"),
        ({"options": "epochs=1"}, ConfigError, "options must be a mapping of option names"),
        ({"attention": 5}, ConfigError, "attention must be a mapping, spec text or None, got int"),
        ({"attention": ["dot"]}, ConfigError, "attention must be a mapping, spec text or None"),
        ({"progress": "no"}, TypeError, "progress must be a bool, got 'no'"),
        ({"resume": 1}, TypeError, "resume must be a bool, got 1"),
        ({"before_publish": 3}, TypeError, "before_publish must be callable, got int"),
        # Python's random takes -1 as 1: two seeds would share its stream
        ({"seed": -1}, ConfigError, "seed must be an int >= 0, got -1"),
        ({"seed": 1.0}, ConfigError, "seed must be an int, got 1.0"),
    ],
)
def test_bad_arguments_fail_before_training(tmp_path, toy, kwargs, error, message):
    """Each is refused at once, not after the training (a hook that is not callable) and
    not as a truthy value (``resume="no"``)."""
    kwargs = {"attention": "tanh", "options": {"epochs": 1}, "progress": False, **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        train_run("toy", out_dir=tmp_path / "r", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_the_attention_may_be_the_path_of_a_spec_file(tmp_path, toy):
    spec = tmp_path / "spec.json"
    spec.write_text('{"name": "tanh", "d_w": 3}')
    result = train_run("toy", spec, options={"epochs": 1}, out_dir=tmp_path / "r", progress=False)
    assert _read(result.run_dir / "run.json")["attention"] == {"name": "tanh", "d_w": 3}


def test_a_failing_run_writes_failed_status_and_reraises(tmp_path, toy):
    out = tmp_path / "r"
    with pytest.raises(RuntimeError, match="failing on purpose after 3 steps"):
        train_run("toy", "tanh", options={"fail_after_steps": 3}, out_dir=out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["run.json"]  # no model, no metrics
    run = _read(out / "run.json")
    assert set(run) == RUN_KEYS
    assert run["status"] == "failed"
    assert "RuntimeError" in run["error"] and "failing on purpose" in run["error"]
    assert run["finished"] is not None
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary folder left
    with pytest.raises(ValueError, match="status 'failed'"):
        load_run(out)


def test_failing_mid_training_never_leaves_a_done_directory(tmp_path, toy):
    """Training raises in epoch 2 (after epoch 1 was evaluated and kept as the best): the
    directory says failed; the best state of epoch 1 is not published as a finished run."""
    out = tmp_path / "r"
    with pytest.raises(RuntimeError):
        train_run("toy", options={"fail_after_steps": 10}, out_dir=out, progress=False)
    assert _read(out / "run.json")["status"] == "failed"
    assert not (out / "metrics.json").exists()
    assert not (out / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # Adam's first step is lr / (1 - 0.9) = 1e39 > float32's 3.4e38: torch raised
        # "RuntimeError: value cannot be converted to type float without overflow"
        ({"lr": 1e38}, "overflows at epoch 1, batch 1: lr=1e+38 is too large (Adam's first"),
        ({"lr": 1e38, "amsgrad": True}, "lr=1e+38 is too large"),
        ({"weight_decay": 1e39}, "weight_decay=1e+39 exceeds float32's largest value"),
    ],
)
def test_an_overflowing_adam_step_fails_the_run_in_one_line(tmp_path, toy, options, message):
    """A finite but huge lr or weight decay that torch cannot convert to float32 in the
    Adam step: a one-line FloatingPointError (which ``attnlab train`` prints as its one
    error line, exit 1) naming the option to lower, and the run recorded as failed."""
    out = tmp_path / "r"
    options = {"epochs": 1, "n_train": 32, "n_eval": 16, **options}
    with pytest.raises(FloatingPointError, match=re.escape(message)) as caught:
        train_run("toy", options=options, out_dir=out, progress=False)
    lowered = "weight_decay" if "weight_decay" in options else "lr"
    assert "\n" not in str(caught.value) and str(caught.value).endswith(f"; lower {lowered}")
    run = _read(out / "run.json")
    assert run["status"] == "failed" and run["error"].startswith("FloatingPointError: the Adam")


def test_parameters_that_turn_non_finite_in_the_last_step_fail_the_run(tmp_path, toy):
    """The only step of the run has a finite loss but an infinite gradient, so Adam writes NaN
    into the weights and no later loss sees them: the run fails after the epoch instead of
    publishing a "done" run with a NaN checkpoint."""

    class NaNGradient(toy):
        def loss(self, model, batch):
            w = next(model.parameters())
            # sqrt(0) = 0 adds nothing to the loss, but its gradient is infinite (and
            # Adam's update inf / inf is NaN)
            return super().loss(model, batch) + torch.sqrt(w - w.detach()).sum()

    task = NaNGradient(epochs=1, n_train=32, n_eval=16)  # one batch
    out = tmp_path / "r"
    with pytest.raises(FloatingPointError, match=r"parameter '.+' is not finite after epoch 1"):
        train_run(task, out_dir=out, progress=False)
    assert _read(out / "run.json")["status"] == "failed"
    assert not (out / "model.safetensors").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_killed_run_leaves_no_run_directory(tmp_path, toy):
    """SIGKILL mid-training (no exception handler runs): only the hidden work folder
    remains, without a run.json; the run directory itself never appears."""
    out = tmp_path / "r"
    pid = os.fork()
    if pid == 0:  # the child trains slowly until it is killed
        try:
            train_run(
                "toy", options={"epochs": 50, "step_sleep": 0.05}, out_dir=out, progress=False
            )
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".r.tmp-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    # the state of a finished epoch may be there too (test_resume.py): not a run directory
    leftovers = [p for p in tmp_path.iterdir() if not p.name.startswith(".r.resume.")]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".r.tmp-")
    assert not out.exists()
    assert not (leftovers[0] / "run.json").exists()


def test_bad_configuration_raises_before_anything_is_written(tmp_path, toy):
    out = tmp_path / "r"
    with pytest.raises(ConfigError, match="no option"):
        train_run("toy", options={"epochz": 3}, out_dir=out, progress=False)
    with pytest.raises(ConfigError, match="no attention preset 'bogus'"):
        train_run("toy", "bogus", out_dir=out, progress=False)
    with pytest.raises(ConfigError, match="stray comma"):
        train_run("toy", "score=dot,,", out_dir=out, progress=False)
    with pytest.raises(ConfigError, match=r"unknown task 'nope'; registered tasks: .*toy"):
        train_run("nope", out_dir=out, progress=False)
    with pytest.raises(ConfigError, match="epochs must be an int >= 1"):
        train_run("toy", options={"epochs": 0}, out_dir=out, progress=False)
    with pytest.raises(ConfigError, match="seed must be an int"):
        train_run("toy", seed="1", out_dir=out, progress=False)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- devices


def test_device_validation():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="not a device name"):
        resolve_device("gpu-please")
    with pytest.raises(ConfigError, match="use 'auto', 'cpu'"):
        resolve_device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_asked_for_but_absent(tmp_path, toy):
    with pytest.raises(ConfigError, match="CUDA is not available"):
        resolve_device("cuda")
    with pytest.raises(ConfigError, match="CUDA is not available"):
        train_run("toy", device="cuda:0", out_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_training_on_cuda(tmp_path, toy):
    result = train_run("toy", device="cuda", out_dir=tmp_path / "r", progress=False)
    assert result.metrics["test"]["accuracy"] > 0.9
    assert _read(result.run_dir / "run.json")["device"] == "cuda"
    assert result.cost["peak_memory_mb"] > 0


def test_move_batch():
    batch = {
        "a": torch.zeros(2),
        "nested": [torch.ones(1), (torch.ones(1), "text")],
        "n": 3,
    }
    moved = move_batch(batch, "cpu")
    assert moved["n"] == 3 and moved["nested"][1][1] == "text"
    assert isinstance(moved["nested"], list) and isinstance(moved["nested"][1], tuple)
    assert torch.equal(moved["a"], batch["a"])


# ----------------------------------------------------------------------------- the rest


def test_load_run_reproduces_the_test_metrics(toy_run_dir):
    task, data, model = load_run(toy_run_dir)
    assert task.name == "toy" and task.options["epochs"] == 3
    assert not model.training
    with torch.no_grad():
        got = task.evaluate(model, data, "test")
    assert got == _read(toy_run_dir / "metrics.json")["test"]


def test_num_threads_is_restored(tmp_path, toy):
    before = torch.get_num_threads()
    train_run("toy", options={"epochs": 1}, out_dir=tmp_path / "r", progress=False, num_threads=1)
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="num_threads"):
        train_run("toy", out_dir=tmp_path / "s", progress=False, num_threads=0)


def test_progress_bars_go_to_stderr(tmp_path, capsys, toy):
    train_run("toy", options={"epochs": 2}, out_dir=tmp_path / "r", progress=True)
    captured = capsys.readouterr()
    assert "toy seed 0" in captured.err and "epoch" in captured.err
    assert captured.out == ""
    train_run("toy", options={"epochs": 1}, out_dir=tmp_path / "q", progress=False)
    assert capsys.readouterr().err == ""


def test_baselines_and_presets_train(tmp_path, toy):
    """The mechanism and the baselines learn the toy task (the flag token decides)."""
    for spec in ("tanh", "sparsemax", "mean", "uniform"):
        result = train_run("toy", spec, out_dir=tmp_path / spec, progress=False)
        assert result.metrics["test"]["accuracy"] >= 0.9, spec


def test_peak_rss_sampler_sees_a_temporary_allocation():
    import time

    from attnlab.lab.training import _PeakRSS, _rss_mb

    if _rss_mb() is None:
        pytest.skip("no /proc/self/statm on this platform")
    sampler = _PeakRSS(interval=0.005)
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    time.sleep(0.1)
    del block
    peak = sampler.stop()
    assert peak is not None and peak >= 48, peak
    # a second sampler in the same process starts from the current level, not from zero
    again = _PeakRSS(interval=0.005)
    assert again.stop() < 16
