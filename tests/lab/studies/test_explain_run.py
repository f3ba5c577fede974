"""`attnlab explain RUN_DIR` end to end on a trained toy run."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import toy_task  # noqa: F401  (registers the "toy" task)

from attnlab.lab.studies import explanation
from attnlab.lab.studies.explanation import explain_command, explain_run
from attnlab.lab.training import train_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("explain")
    a = train_run("toy", {"name": "tanh"}, seed=0, out_dir=root / "a", progress=False)
    b = train_run("toy", {"name": "tanh"}, seed=1, out_dir=root / "b", progress=False)
    return Path(a.run_dir), Path(b.run_dir)


QUICK = dict(
    max_instances=48,
    permutations=10,
    adversarial_steps=20,
    lambdas=(0.0, 1.0),
    mlp_epochs=2,
    adversarial_epochs=1,
    max_train=128,
    progress=False,
)


@pytest.mark.slow
def test_explain_run_writes_every_test(runs: tuple[Path, Path]) -> None:
    run, other = runs
    r = explain_run(run, compare=[other], **QUICK)
    saved = json.loads((run / "explanation" / "explanation.json").read_text())
    assert saved["instances"] == r["instances"] == 48
    assert set(saved["kendall"]) == {"attention-gradient", "attention-loo", "gradient-loo"}
    for v in saved["kendall"].values():
        assert -1 <= v["mean"] <= 1 and 0 <= v["significant"] <= 1
    assert len(saved["permutation"]["per_instance"]) == len(saved["permutation"]["max_weight"])
    assert 0 <= saved["adversarial"]["max_jsd"]["mean"] <= saved["adversarial"]["jsd_bound"]
    assert set(saved["frozen_weights"]) == {"uniform", "learned", "transferred", "adversarial"}
    assert [s["lambda"] for s in saved["adversarial_models"]] == [0.0, 1.0]
    assert saved["seed_variance"]["runs"] == [str(other)]
    assert 0 <= saved["uniform"]["uniform_accuracy"] <= 1
    # the toy model is right on every test sentence, so the learned weights give accuracy 1
    assert saved["uniform"]["learned_accuracy"] == pytest.approx(1.0)
    if "plots" in saved:
        for name in saved["plots"]:
            assert (run / "explanation" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_command_and_errors(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = runs
    out = CliRunner().invoke(explain_command, [str(run), "--quick", "--no-progress"])
    assert out.exit_code == 0, out.output
    assert "Kendall tau" in out.output and "frozen-weight MLP F1" in out.output
    mean_run = train_run("toy", {"name": "mean"}, seed=0, out_dir=tmp_path / "m", progress=False)
    out = CliRunner().invoke(explain_command, [str(mean_run.run_dir), "--quick", "--no-progress"])
    assert out.exit_code != 0
    assert "attention weights" in out.output


@pytest.mark.slow
def test_explain_takes_plugins_for_the_runs_task(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """A run of a plugin's task: without ``--plugin`` the task is unknown (one line naming
    ``--plugin``), with it the tests run (explain had no ``--plugin``, so a plugin task's
    run could not be explained from the command line). A fresh process, so that the
    plugin is not registered already."""
    import subprocess

    run, _ = runs
    repo = Path(__file__).resolve().parents[3]
    cmd = [sys.executable, "-m", "attnlab", "explain", str(run), "--quick", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "OMP_NUM_THREADS": "1"}
    without = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert without.returncode == 2, without.stderr
    assert "unknown task 'toy'" in without.stderr and "--plugin MODULE" in without.stderr
    assert "Traceback" not in without.stderr
    plugin = ["--plugin", "tests.lab.toy_task", "--max-instances", "16"]
    done = subprocess.run(
        cmd + plugin, cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "Kendall tau" in done.stdout


def test_explain_names_a_plugin_that_cannot_be_imported(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        explain_command, [str(tmp_path), "--plugin", "no_such_plugin_xyz", "--no-progress"]
    )
    assert out.exit_code == 2
    assert "error: --plugin 'no_such_plugin_xyz' cannot be imported" in out.output
    assert "Traceback" not in out.output


def test_task_batches_draw_a_seeded_sample_not_the_first_rows() -> None:
    """A split sorted by label must not give a one-class sample."""
    from attnlab.lab.studies.explanation import task_batches
    from attnlab.lab.training import resolve_task

    task = resolve_task("toy", {"n_eval": 80})
    data = task.load_data()
    sample = task_batches(task, data, "test", 8, 24, seed=0)
    again = task_batches(task, data, "test", 8, 24, seed=0)
    other = task_batches(task, data, "test", 8, 24, seed=1)
    ys = [int(v) for _, _, y in sample for v in y]
    assert len(ys) == 24
    assert ys == [int(v) for _, _, y in again for v in y]
    assert ys != [int(v) for _, _, y in other for v in y]
    assert 0 < sum(ys) < 24


def test_compare_runs_are_checked_before_the_first_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --compare run of another task, or of another mechanism (here one without attention
    weights), the run itself, its seed again or other task options stop the command with
    one line naming it before any test runs (not with a traceback after all of them); so
    does a --uniform-run that is not the uniform baseline."""
    tiny = {"epochs": 1, "n_train": 64, "n_eval": 32}
    run = train_run("toy", "tanh", options=tiny, out_dir=tmp_path / "run", progress=False)
    pointer = train_run(
        "pointer",
        options={"epochs": 1, "train_size": 64, "dev_size": 16, "test_size": 16},
        out_dir=tmp_path / "pointer",
        progress=False,
    )
    mean = train_run("toy", "mean", options=tiny, out_dir=tmp_path / "mean", progress=False)
    again = train_run("toy", "tanh", options=tiny, out_dir=tmp_path / "again", progress=False)
    longer = train_run(
        "toy", "tanh", seed=1, options={**tiny, "epochs": 2}, out_dir=tmp_path / "longer",
        progress=False,
    )  # fmt: skip
    damaged = train_run("toy", "uniform", options=tiny, out_dir=tmp_path / "u", progress=False)
    (damaged.run_dir / "metrics.json").write_text("[1, 2]")  # read after the other tests
    wrong_task = f"compare run {str(pointer.run_dir)!r} is a run of task 'pointer', not 'toy'"
    for other, text, flag in (
        (pointer, wrong_task, "--compare"),
        (mean, "was trained with attention 'mean', the run with 'tanh'", "--compare"),
        (run, "is the run itself: give runs of other seeds", "--compare"),
        (again, "has seed 0 again: give other seeds", "--compare"),
        (longer, "was trained with other task options: epochs", "--compare"),
        (
            again,
            "is not a run of the uniform baseline (train one with -a uniform)",
            "--uniform-run",
        ),
        (damaged, "metrics.json", "--uniform-run"),
    ):
        monkeypatch.setattr(explanation, "_open_study", _no_study)
        argv = [str(run.run_dir), "--quick", "--no-progress", flag, str(other.run_dir)]
        res = CliRunner().invoke(explain_command, argv)
        assert res.exit_code == 2, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), res.output
        assert text in lines[0] and str(other.run_dir) in lines[0]
        assert "uniform_run" not in lines[0]  # the words of a user, not a parameter name
        assert not (run.run_dir / "explanation").exists()  # no test ran, nothing written


def _no_study(*_: object, **__: object) -> None:
    raise AssertionError("the study was opened: a test would have run")


@pytest.mark.parametrize("epsilon", ["nan", "inf", "-inf", "0", "-0.1"])
def test_epsilon_is_a_finite_number_above_0(runs: tuple[Path, Path], epsilon: str) -> None:
    """NaN and inf passed the old ``epsilon <= 0`` test and searched with no bound."""
    run, _ = runs
    argv = [str(run), "--quick", "--no-progress", "--epsilon", epsilon]
    res = CliRunner().invoke(explain_command, argv)
    assert res.exit_code == 2, res.output
    assert res.output.strip().startswith("error: epsilon must be a finite number > 0, got ")


@pytest.mark.parametrize(
    ("setting", "error", "message"),
    [
        ({"max_instances": 0}, ValueError, "max_instances must be an int >= 1 or None, got 0"),
        ({"max_instances": 2.5}, ValueError, "max_instances must be an int >= 1 or None"),
        ({"max_train": -1}, ValueError, "max_train must be an int >= 1 or None, got -1"),
        ({"mlp_epochs": 0}, ValueError, "mlp_epochs must be an int >= 1, got 0"),
        ({"adversarial_steps": -1}, ValueError, "adversarial_steps must be an int >= 1"),
        ({"adversarial_epochs": "3"}, ValueError, "adversarial_epochs must be an int >= 1"),
        ({"lambdas": []}, ValueError, "lambdas must be a non-empty list of numbers >= 0"),
        ({"lambdas": [0.5, float("nan")]}, ValueError, "each of lambdas must be a number >= 0"),
        ({"lambdas": [-1.0]}, ValueError, "each of lambdas must be a number >= 0, got -1.0"),
        ({"seed": "1"}, ValueError, "seed must be an int, got '1'"),
        ({"plots": "no"}, TypeError, "plots must be a bool, got 'no'"),
        ({"progress": 1}, TypeError, "progress must be a bool, got 1"),
    ],
)
def test_bad_settings_fail_before_the_run_is_loaded(
    runs: tuple[Path, Path], setting: dict, error: type, message: str, monkeypatch
) -> None:
    """Each used to run (max_instances=-1, lambdas=[nan], plots="no": minutes of tests on
    nonsense) or to fail deep inside (max_instances=0: an IndexError; seed="1")."""
    import attnlab.lab.training as training

    def not_loaded(*args, **kwargs):  # pragma: no cover - the settings fail first
        raise AssertionError("the run was loaded before the settings were checked")

    monkeypatch.setattr(training, "load_run", not_loaded)
    run, _ = runs
    with pytest.raises(error, match=re.escape(message)):
        explain_run(run, **{**QUICK, **setting})


def test_one_compare_run_may_be_given_as_a_path(runs: tuple[Path, Path], monkeypatch) -> None:
    """A path given alone is one run, not a sequence of one-character paths ("/", "t", ...)."""
    import attnlab.lab.studies.explanation as explanation

    seen = []
    monkeypatch.setattr(explanation, "_check_other_runs", lambda r, c, u: seen.append(list(c)))
    monkeypatch.setattr(explanation, "_open_study", _stop)
    run, other = runs
    with pytest.raises(_Stopped):
        explain_run(run, compare=str(other), **QUICK)
    assert seen == [[Path(other)]]


def test_the_other_runs_expand_the_home_folder(runs: tuple[Path, Path], monkeypatch) -> None:
    """``~`` in ``compare`` / ``uniform_run`` is the home folder, as in ``run_dir``: the run
    itself given as ``~/a`` is found to be the run itself."""
    run, other = runs
    monkeypatch.setenv("HOME", str(run.parent))
    with pytest.raises(ValueError, match=r"is the run itself"):
        explain_run(run, compare=["~/" + run.name], **QUICK)
    with pytest.raises(ValueError, match=r"is not a run of the uniform baseline"):
        explain_run(run, uniform_run="~/" + other.name, **QUICK)
    with pytest.raises(TypeError, match="compare must be a path"):
        explain_run(run, compare=[3], **QUICK)


class _Stopped(Exception):
    pass


def _stop(*args, **kwargs):
    raise _Stopped
