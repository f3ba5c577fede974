"""Tests of attnlab.lab.resume: an interrupted run goes on after its last finished epoch
and ends as an uninterrupted run would, bit for bit on the CPU."""

from __future__ import annotations

import json
import os
import random
import signal
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from attnlab.lab import resume as resume_module
from attnlab.lab import training
from attnlab.lab.resume import EpochState, ResumeFile, capture_rng, restore_rng, resume_path
from attnlab.lab.training import train_run

STATE = ".r.resume.safetensors"


@pytest.fixture
def toy(toy_task_module):
    return toy_task_module.ToyTask


def _run(tmp_path: Path, name: str = "r", **kw):
    # dropout draws from torch's random state: a resume must restore it too
    kw.setdefault("options", {"epochs": 4, "dropout": 0.3})
    kw.setdefault("seed", 5)
    return train_run("toy", "tanh", out_dir=tmp_path / name, progress=False, **kw)


def _interrupt_epoch(monkeypatch, at: int) -> None:
    """Make training raise KeyboardInterrupt when epoch ``at`` starts."""
    real = training._Trainer.epoch

    def epoch(self, number):
        if number == at:
            raise KeyboardInterrupt
        return real(self, number)

    monkeypatch.setattr(training._Trainer, "epoch", epoch)


def _same_run(a: Path, b: Path) -> None:
    """The two run directories hold the same weights, metrics and history (but times)."""
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert json.loads((a / "metrics.json").read_text()) == json.loads(
        (b / "metrics.json").read_text()
    )
    drop = ("seconds", "examples_per_second", "data_share")

    def history(run: Path):
        return [
            {k: v for k, v in h.items() if k not in drop}
            for h in json.loads((run / "history.json").read_text())
        ]

    assert history(a) == history(b)


def test_an_interrupted_run_goes_on_and_ends_as_an_uninterrupted_one(tmp_path, toy, monkeypatch):
    whole = _run(tmp_path / "whole")
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    stopped = json.loads((tmp_path / "r" / "run.json").read_text())
    assert (stopped["status"], stopped["error"]) == ("failed", "KeyboardInterrupt")
    assert (tmp_path / STATE).is_file()
    again = _run(tmp_path)
    _same_run(whole.run_dir, again.run_dir)
    run = json.loads((again.run_dir / "run.json").read_text())
    assert run["status"] == "done" and run["resumed_after"] == [2]
    assert json.loads((whole.run_dir / "run.json").read_text())["resumed_after"] == []
    assert [h["epoch"] for h in again.history] == [1, 2, 3, 4]
    assert not (tmp_path / STATE).exists()  # removed once the run is done
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "whole"]


def test_a_run_interrupted_twice_lists_both_epochs(tmp_path, toy, monkeypatch):
    whole = _run(tmp_path / "whole")
    for at in (2, 4):
        with monkeypatch.context() as patch:
            _interrupt_epoch(patch, at)
            with pytest.raises(KeyboardInterrupt):
                _run(tmp_path)
    again = _run(tmp_path)
    _same_run(whole.run_dir, again.run_dir)
    assert json.loads((again.run_dir / "run.json").read_text())["resumed_after"] == [1, 3]
    # the time of every part is counted: at least the seconds of the epochs in the history
    assert again.cost["train_seconds"] >= sum(h["seconds"] for h in again.history) * 0.99


def _constant_dev(toy):
    class Flat(toy):
        """The dev accuracy never improves: with patience 2 the run stops after epoch 3."""

        def evaluate(self, model, data, split):
            real = super().evaluate(model, data, split)
            return {**real, "accuracy": 0.5} if split == "dev" else real

    return Flat


def test_the_cost_counts_the_processes_the_run_resumed_from(tmp_path, toy, monkeypatch):
    """The training time adds up; the peak memory is the largest of the processes."""
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    path = tmp_path / STATE
    with safe_open(str(path), framework="pt") as handle:
        prints = json.loads(handle.metadata()["attnlab_resume"])["fingerprint"]
    saved = ResumeFile(path, prints)
    state = saved.load()
    assert state is not None and state.counters["train_seconds"] > 0
    state.counters.update(train_seconds=1000.0, peak_memory_mb=4096.0)
    saved.save(state)
    again = _run(tmp_path)
    assert again.cost["peak_memory_mb"] == 4096.0
    assert again.cost["train_seconds"] > 1000.0  # the 1000 s before, and this process's
    assert again.cost["seconds_per_epoch"] == again.cost["train_seconds"] / 4


@pytest.mark.parametrize("where", ["epoch 3", "test"])
def test_early_stopping_is_the_same_after_a_resume(tmp_path, toy, monkeypatch, where):
    flat = _constant_dev(toy)
    options = {"epochs": 6, "patience": 2}

    def run(name):
        return train_run(flat(**options), "tanh", seed=1, out_dir=tmp_path / name, progress=False)

    whole = run("whole")
    assert whole.metrics["epochs_trained"] == 3 and whole.metrics["best_epoch"] == 1
    with monkeypatch.context() as patch:
        if where == "test":  # every epoch is done: the resumed run trains none
            real = training._evaluate

            def evaluate(task, model, data, split):
                if split == "test":
                    raise KeyboardInterrupt
                return real(task, model, data, split)

            patch.setattr(training, "_evaluate", evaluate)
        else:
            _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            run("r")
    again = run("r")
    _same_run(whole.run_dir, again.run_dir)
    resumed = json.loads((again.run_dir / "run.json").read_text())["resumed_after"]
    assert resumed == ([3] if where == "test" else [2])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_killed_run_goes_on_after_its_last_saved_epoch(tmp_path, toy):
    """SIGKILL (no handler runs) once the state of an epoch is on disk; the run started
    again goes on from there and matches a run that was never killed. Eight epochs: the
    kill must land before the last one ends (the finished run removes its state), which
    gives a loaded machine's test process about a second to notice the first state."""
    options = {"epochs": 8, "dropout": 0.3, "step_sleep": 0.03}
    pid = os.fork()
    if pid == 0:
        try:
            _run(tmp_path, options=options)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / STATE).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert (tmp_path / STATE).exists()
    again = _run(tmp_path, options=options)
    whole = _run(tmp_path / "whole", options=options)
    _same_run(whole.run_dir, again.run_dir)
    resumed = json.loads((again.run_dir / "run.json").read_text())["resumed_after"]
    assert len(resumed) == 1 and 1 <= resumed[0] <= 8


def test_a_resumed_run_says_so_when_it_shows_progress(tmp_path, toy, monkeypatch, capsys):
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    train_run("toy", "tanh", seed=5, options={"epochs": 4, "dropout": 0.3}, out_dir="r")
    err = capsys.readouterr().err
    assert "resuming after epoch 2 of 4 (.r.resume.safetensors)" in err


def test_resume_false_starts_from_epoch_one(tmp_path, toy, monkeypatch):
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    seen = []
    real = training._Trainer.epoch

    def epoch(self, number):
        seen.append(number)
        return real(self, number)

    monkeypatch.setattr(training._Trainer, "epoch", epoch)
    again = _run(tmp_path, resume=False)
    assert seen == [1, 2, 3, 4]
    assert json.loads((again.run_dir / "run.json").read_text())["resumed_after"] == []
    assert not (tmp_path / STATE).exists()


def test_a_state_of_other_settings_is_not_used(tmp_path, toy, monkeypatch):
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    with pytest.warns(UserWarning, match=r"other settings \(seed differ\); training from epoch 1"):
        other = _run(tmp_path, seed=6)
    assert json.loads((other.run_dir / "run.json").read_text())["resumed_after"] == []
    _same_run(_run(tmp_path / "whole", seed=6).run_dir, other.run_dir)


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),  # truncated
        lambda p: p.write_bytes(b"not a safetensors file"),
        lambda p: p.write_bytes(b""),
    ],
)
def test_a_damaged_state_warns_and_trains_from_epoch_one(tmp_path, toy, monkeypatch, damage):
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path)
    damage(tmp_path / STATE)
    with pytest.warns(UserWarning, match=r"cannot resume from .*r\.resume\.safetensors .*epoch 1"):
        again = _run(tmp_path)
    assert json.loads((again.run_dir / "run.json").read_text())["resumed_after"] == []
    _same_run(_run(tmp_path / "whole").run_dir, again.run_dir)


def test_a_state_that_cannot_be_written_warns_once_and_the_run_goes_on(tmp_path, toy, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(resume_module, "save_file", full)
    with pytest.warns(UserWarning, match="cannot write the resume state") as caught:
        result = _run(tmp_path)
    assert len([w for w in caught if "resume state" in str(w.message)]) == 1
    assert result.metrics["epochs_trained"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary file left


def test_a_half_written_state_of_a_killed_process_is_removed(tmp_path, toy):
    """A process killed while writing leaves its temporary file (the state itself is only
    ever replaced whole): the next start of the run removes it."""
    leftover = tmp_path / f"{STATE}.a1b2c3"
    leftover.write_bytes(b"half")
    other = tmp_path / ".rr.resume.safetensors.x9"  # another run's: not touched
    other.write_bytes(b"half")
    _run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "r"]


def test_the_state_file_gets_the_mode_of_a_new_file_or_keeps_its_own(tmp_path):
    file = ResumeFile(tmp_path / STATE, {"seed": 1})
    model = torch.nn.Linear(2, 2)
    state = _state(model, torch.optim.Adam(model.parameters()))
    old = os.umask(0o027)
    try:
        file.save(state)
        assert file.path.stat().st_mode & 0o777 == 0o640
        file.path.chmod(0o600)  # made private by its owner: the next epoch's write keeps that
        file.save(state)
    finally:
        os.umask(old)
    assert file.path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [STATE]


def test_resume_path():
    assert resume_path("runs/toy/a--seed0") == Path("runs/toy/.a--seed0.resume.safetensors")


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> EpochState:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return EpochState(
        epoch=3,
        history=[{"epoch": 1, "train_loss": 0.5, "dev": {"accuracy": float("nan")}}],
        best={"epoch": 2, "value": 0.75, "dev": {"accuracy": 0.75}},
        best_state={k: v + 1 for k, v in model.state_dict().items()},
        model=model.state_dict(),
        optimizer=optimizer.state_dict(),
        scaler=scaler.state_dict(),
        generator=torch.Generator().manual_seed(9).get_state(),
        rng=capture_rng(torch.device("cpu")),
        counters={"train_seconds": 1.5},
        resumed_after=[1],
    )


def test_a_saved_state_reads_back_the_same(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to(torch.bfloat16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    model(torch.randn(5, 3, dtype=torch.bfloat16)).float().sum().backward()
    optimizer.step()
    state = _state(model, optimizer)
    file = ResumeFile(tmp_path / "s.safetensors", {"seed": 1})
    file.save(state)
    back = file.load()
    assert back is not None
    assert (back.epoch, back.best, back.counters, back.resumed_after) == (
        3,
        state.best,
        state.counters,
        [1],
    )
    assert json.dumps(back.history) == json.dumps(state.history)  # NaN kept
    for saved, loaded in ((state.model, back.model), (state.best_state, back.best_state)):
        assert saved.keys() == loaded.keys()
        for k in saved:
            assert torch.equal(saved[k], loaded[k]) and saved[k].dtype == loaded[k].dtype
    assert torch.equal(back.generator, state.generator)
    assert back.scaler == state.scaler
    fresh = torch.optim.Adam(model.parameters(), lr=0.5)
    fresh.load_state_dict(back.optimizer)
    again = fresh.state_dict()
    assert again["param_groups"] == json.loads(json.dumps(state.optimizer["param_groups"]))
    for index, entry in state.optimizer["state"].items():
        for name, value in entry.items():
            assert torch.equal(again["state"][index][name], value), (index, name)
    assert [p.name for p in tmp_path.iterdir()] == ["s.safetensors"]


# the legacy global numpy state is the one that seed_everything seeds and a resume restores
# ruff: noqa: NPY002


def test_the_random_states_come_back():
    rng = capture_rng(torch.device("cpu"))
    first = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    restore_rng(rng, torch.device("cpu"))
    second = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    assert torch.equal(first[0], second[0])
    assert np.array_equal(first[1], second[1])
    assert first[2] == second[2]


def test_the_random_states_come_back_through_the_file(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    np.random.randn()  # a cached Gaussian in numpy's state
    random.gauss(0.0, 1.0)  # and in Python's
    file = ResumeFile(tmp_path / "s.safetensors", {})
    file.save(_state(model, optimizer))
    first = (torch.rand(3), np.random.randn(3), [random.gauss(0.0, 1.0) for _ in range(3)])
    back = file.load()
    assert back is not None
    restore_rng(back.rng, torch.device("cpu"))
    second = (torch.rand(3), np.random.randn(3), [random.gauss(0.0, 1.0) for _ in range(3)])
    assert torch.equal(first[0], second[0])
    assert np.array_equal(first[1], second[1])
    assert first[2] == second[2]


def test_no_file_loads_nothing_and_removing_none_is_fine(tmp_path):
    file = ResumeFile(tmp_path / "none.safetensors", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert file.load() is None
    file.remove()


def test_a_safetensors_file_of_something_else_is_not_a_state(tmp_path):
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "s.safetensors"))
    with pytest.warns(UserWarning, match="not a resume state"):
        assert ResumeFile(tmp_path / "s.safetensors", {}).load() is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.cuda
@needs_cuda
def test_the_cuda_random_state_comes_back_through_the_file(tmp_path):
    cuda = torch.device("cuda")
    model = torch.nn.Linear(2, 2).to(cuda)
    optimizer = torch.optim.Adam(model.parameters())
    file = ResumeFile(tmp_path / "s.safetensors", {})
    state = _state(model, optimizer)
    state.rng = capture_rng(cuda)
    file.save(state)
    first = torch.rand(5, device=cuda)
    back = file.load()
    assert back is not None and back.rng["cuda"] is not None
    restore_rng(back.rng, cuda)
    assert torch.equal(first, torch.rand(5, device=cuda))


@pytest.mark.cuda
@needs_cuda
def test_an_interrupted_cuda_run_goes_on_and_ends_as_an_uninterrupted_one(
    tmp_path, toy, monkeypatch
):
    """On CUDA the dropout masks come from the device's generator: a resume restores it,
    so the resumed run ends with the uninterrupted run's weights and metrics (compared
    to float32 rounding: the device's kernels need not be bitwise repeatable)."""
    from safetensors.torch import load_file

    whole = _run(tmp_path / "whole", device="cuda")
    with monkeypatch.context() as patch:
        _interrupt_epoch(patch, 3)
        with pytest.raises(KeyboardInterrupt):
            _run(tmp_path, device="cuda")
    again = _run(tmp_path, device="cuda")
    assert json.loads((again.run_dir / "run.json").read_text())["resumed_after"] == [2]
    a, b = (load_file(str(r.run_dir / "model.safetensors")) for r in (whole, again))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    ma, mb = (json.loads((r.run_dir / "metrics.json").read_text()) for r in (whole, again))
    assert ma.keys() == mb.keys()
    for key, value in ma.items():
        if isinstance(value, float):
            assert mb[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
