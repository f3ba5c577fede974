"""``compile=`` of the lab's training (:func:`attnlab.lab.training.train_run`,
``attnlab train --compile``, ``attnlab ablate --compile``): the training steps run the
model's compiled forward, the results are eager mode's to rounding, ``run.json`` says
which backend, and a backend this installation lacks is one line before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from attnlab._checks import ConfigError
from attnlab.cli import main
from attnlab.lab import ablation, executors
from attnlab.lab.executors import RunJob, RunOutcome
from attnlab.lab.training import check_compile_backend, train_run

TOY = "tests.lab.toy_task"
TINY = {"epochs": 2, "n_train": 64, "n_eval": 16}
#: a backend that records every graph Dynamo hands it and runs it as it is
COUNTING = "attnlab_tests_counting"
GRAPHS: list[torch.fx.GraphModule] = []


@pytest.fixture
def counting_backend():
    from torch._dynamo import list_backends, register_backend

    if COUNTING not in list_backends(exclude_tags=()):

        def counting(gm: torch.fx.GraphModule, example_inputs):
            GRAPHS.append(gm)
            return gm.forward

        register_backend(counting, name=COUNTING)
    GRAPHS.clear()
    torch._dynamo.reset()
    yield GRAPHS
    torch._dynamo.reset()


def _run(*argv: str):
    return CliRunner().invoke(main, list(argv), catch_exceptions=False)


def _run_json(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


@pytest.mark.parametrize("backend", [COUNTING, "aot_eager"])
def test_a_compiled_run_is_the_eager_run(tmp_path, toy_task_module, counting_backend, backend):
    """The same seed eager and compiled: every epoch's training loss and the dev and test
    metrics agree (aot_eager: the forward and backward graphs of AOTAutograd); the
    counting backend shows the training steps did go through Dynamo."""
    eager = train_run("toy", "tanh", options=TINY, out_dir=tmp_path / "e", progress=False)
    assert not counting_backend
    compiled = train_run(
        "toy", "tanh", options=TINY, out_dir=tmp_path / "c", progress=False, compile=backend
    )
    if backend == COUNTING:
        assert counting_backend, "the training steps never reached the backend"
    losses = [h["train_loss"] for h in compiled.history]
    assert losses == pytest.approx([h["train_loss"] for h in eager.history], rel=1e-5)
    assert compiled.metrics["test"] == pytest.approx(eager.metrics["test"], rel=1e-5)
    assert _run_json(compiled.run_dir)["compile"] == backend
    assert _run_json(eager.run_dir)["compile"] is None


def test_a_compiled_recurrent_run_is_the_eager_run_with_a_graph_per_power_of_two(
    tmp_path, toy_task_module, counting_backend
):
    """A BiLSTM encoder over batches padded to lengths from 1 to 40: compiled, its
    recurrence runs the padded length rounded up to a power of two
    (``attnlab._checks.compiled_steps``), so the training steps take a graph per power
    of two (8, 16, 32, 64: at most 5 graphs with the first, static one) where they took
    one per length until Dynamo's recompile limit; the losses and metrics are eager's."""
    options = {**TINY, "n_train": 128, "max_len": 40, "encoder": "bilstm", "batch_size": 8}
    eager = train_run("toy", "tanh", options=options, out_dir=tmp_path / "e", progress=False)
    compiled = train_run(
        "toy", "tanh", options=options, out_dir=tmp_path / "c", progress=False, compile=COUNTING
    )
    assert 1 <= len(counting_backend) <= 5, f"{len(counting_backend)} graphs"
    losses = [h["train_loss"] for h in compiled.history]
    assert losses == pytest.approx([h["train_loss"] for h in eager.history], rel=1e-5)
    assert compiled.metrics["test"] == pytest.approx(eager.metrics["test"], rel=1e-5)


def test_a_backend_this_installation_lacks_is_refused_before_anything_is_written(
    tmp_path, toy_task_module
):
    message = r"^compile must be a torch\.compile backend \(inductor, .*\), got 'nope'$"
    with pytest.raises(ConfigError, match=message):
        train_run("toy", options=TINY, out_dir=tmp_path / "r", progress=False, compile="nope")
    with pytest.raises(ConfigError, match=r"got 3$"):
        check_compile_backend(3)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "out"
    for command in (["train", "toy"], ["ablate", "toy", "-a", "tanh", "--no-report"]):
        result = _run(*command, "--plugin", TOY, "--out", str(out), "--compile", "nope")
        assert result.exit_code == 2, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: compile must be"), lines
        assert lines[0].endswith("got 'nope'")
        assert not out.exists()


@pytest.mark.parametrize(("given", "backend"), [([], None), (["--compile"], "inductor")])
def test_train_compile_alone_means_inductor(tmp_path, monkeypatch, given, backend):
    """``--compile`` without a value is Inductor, before another option or at the end."""
    from attnlab.lab import training

    seen: list[str | None] = []

    def recording(*args, compile=None, **kwargs):
        seen.append(compile)
        raise ConfigError("stopped here")

    monkeypatch.setattr(training, "train_run", recording)
    for argv in (
        ["train", "toy", "--plugin", TOY, *given, "--out", str(tmp_path / "o")],
        ["train", "toy", "--plugin", TOY, "--out", str(tmp_path / "o"), *given],
    ):
        assert "stopped here" in _run(*argv).stderr
    assert seen == [backend, backend]


def test_train_compile_goes_into_run_json(tmp_path, counting_backend):
    out = tmp_path / "out"
    argv = ["train", "toy", "--plugin", TOY, "--no-progress", "--out", str(out)]
    result = _run(*argv, "--epochs", "1", "-o", "n_train=64", "--compile", COUNTING)
    assert result.exit_code == 0, result.output
    assert _run_json(out / "default--seed0")["compile"] == COUNTING
    assert counting_backend


def test_an_ablation_passes_its_backend_to_every_run(tmp_path, toy_task_module, monkeypatch):
    seen: list[RunJob] = []

    class Recorder:
        def run(self, jobs, on_done, should_run=None):
            for job in jobs:
                seen.append(job)
                on_done(RunOutcome(job.run_id, "failed", job.run_dir, error="not run"))

    monkeypatch.setattr(ablation, "make_executor", lambda *a, **k: Recorder())
    ablation.run_ablation(
        "toy", [{"name": "tanh"}], [0, 1], out_dir=tmp_path / "ab", options=TINY,
        progress=False, compile="aot_eager",
    )  # fmt: skip
    assert [j.compile for j in seen] == ["aot_eager"] * 2


def test_a_job_carries_its_backend_to_train_run(tmp_path, toy_task_module, counting_backend):
    job = RunJob(
        "r", "toy", {"name": "tanh"}, 0, str(tmp_path / "r"), options=TINY, compile=COUNTING
    )
    outcome = executors.execute_job(job)
    assert outcome.status == "done", outcome.error
    assert _run_json(outcome.run_dir)["compile"] == COUNTING
    assert counting_backend
