"""The ablation runner on the generated ``toy`` task (tests/lab/toy_task.py) with the real
trainer: grid syntax, the results store, resume (also after SIGKILL of a running
``attnlab ablate``), superset grids, refusals, failures, and the click command."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from ablation_processes import done_runs, sigkill_when
from click.testing import CliRunner

from attnlab._checks import ConfigError
from attnlab.lab import ablation as ablation_mod
from attnlab.lab.ablation import (
    AblationMismatchError,
    ablate_command,
    expand_grid,
    format_table,
    parse_seeds,
    parse_spec,
    run_ablation,
    run_id,
)
from attnlab.lab.store import MechanismSummary, ResultsStore
from attnlab.lab.task import spec_label

# the task "toy" (tests/lab/toy_task.py) is registered by a fixture, not at collection
pytestmark = pytest.mark.usefixtures("toy_task_module")

ROOT = Path(__file__).resolve().parents[2]
TINY = {"epochs": 2, "n_train": 64, "n_eval": 32}


def labels(specs):
    return [spec_label(s) for s in specs]


# ----------------------------------------------------------------------------- grids


def test_grid_text_is_the_cartesian_product():
    specs = expand_grid("score=additive,scaled-dot;align=soft,sparsemax")
    assert specs == [
        {"score": "additive", "align": "soft"},
        {"score": "additive", "align": "sparsemax"},
        {"score": "scaled-dot", "align": "soft"},
        {"score": "scaled-dot", "align": "sparsemax"},
    ]
    assert expand_grid("tanh,dot") == [{"name": "tanh"}, {"name": "dot"}]
    assert expand_grid("score=additive;d_w=8,16") == [
        {"score": "additive", "d_w": 8},
        {"score": "additive", "d_w": 16},
    ]


def test_grid_baselines_lists_mappings_and_duplicates():
    specs = expand_grid(["tanh", {"name": "mean"}, "score=additive,align=soft"], baselines=True)
    assert labels(specs) == ["mean", "uniform", "tanh", "align=soft,score=additive"]
    assert expand_grid({"score": ["a", "b"], "align": ["soft"]}) == [
        {"score": "a", "align": "soft"},
        {"score": "b", "align": "soft"},
    ]
    assert expand_grid(None) == []
    assert expand_grid([]) == []


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("grid.yaml", "- name: tanh\n- {score: additive, align: sparsemax}\n- mean\n"),
        ("grid.json", '[{"name": "tanh"}, {"score": "additive", "align": "sparsemax"}, "mean"]'),
        (
            "grid.toml",
            '[[grid]]\nname = "tanh"\n[[grid]]\nscore = "additive"\nalign = "sparsemax"\n'
            '[[grid]]\nname = "mean"\n',
        ),
    ],
)
def test_grid_files(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    expected = ["tanh", "align=sparsemax,score=additive", "mean"]
    assert labels(expand_grid(str(path))) == expected
    assert labels(expand_grid(path)) == expected


def test_grid_file_with_axes(tmp_path):
    path = tmp_path / "axes.yaml"
    path.write_text("axes:\n  score: [additive, dot]\n  align: [soft]\n")
    assert labels(expand_grid(str(path))) == ["align=soft,score=additive", "align=soft,score=dot"]


def test_grid_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="separate the axes with ';'"):
        expand_grid("score=additive,align=soft")
    with pytest.raises(ConfigError, match="given twice"):
        expand_grid("score=a;score=b")
    with pytest.raises(ConfigError, match="no values"):
        expand_grid("score=")
    with pytest.raises(ConfigError):
        expand_grid(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError):
        parse_spec("")


def test_parse_seeds():
    assert parse_seeds("0,1,2") == [0, 1, 2]
    assert parse_seeds("3, 3, 5") == [3, 5]
    assert parse_seeds(None, 4) == [0, 1, 2, 3]
    assert parse_seeds(None) == [0, 1, 2]
    assert parse_seeds([2, 7]) == [2, 7]
    with pytest.raises(ConfigError):
        parse_seeds("0,1", 2)
    with pytest.raises(ConfigError):
        parse_seeds("a,b")
    for bad in ([1.5], [True], ["1"], 2.0):  # not rounded to seed 1 or 2, not read as text
        with pytest.raises(ConfigError, match="seeds must be integers"):
            parse_seeds(bad)
    assert parse_seeds(s for s in (4, 5)) == [4, 5]  # any iterable of ints
    # Python's random takes -1 as 1: seeds -1 and 1 would share its stream
    for bad in ("-1,0", [0, -2], -3):
        with pytest.raises(ConfigError, match=r"^seeds must be an int >= 0, got -\d$"):
            parse_seeds(bad)


def test_run_id_format():
    assert run_id({"score": "additive", "align": "soft"}, 3) == "align=soft__score=additive--seed3"
    assert run_id({"name": "mean"}, 0) == "mean--seed0"


def test_format_table_marks_the_best_and_handles_one_and_zero_runs():
    summary = {
        "mean": MechanismSummary(
            "mean", {"name": "mean"}, 2, mean={"accuracy": 0.5}, std={"accuracy": 0.1}
        ),
        "tanh": MechanismSummary(
            "tanh", {"name": "tanh"}, 1, mean={"accuracy": 0.75}, std={"accuracy": None}
        ),
        "dot": MechanismSummary("dot", {"name": "dot"}, 0, failed=2),
    }
    lines = format_table(summary, ["accuracy"]).splitlines()
    assert "test accuracy" in lines[0]
    row = {
        line.split()[1] if line.startswith("*") else line.split()[0]: line for line in lines[2:5]
    }
    assert row["tanh"].startswith("* tanh") and "0.7500" in row["tanh"] and "±" not in row["tanh"]
    assert "0.5000 ± 0.1000" in row["mean"] and not row["mean"].startswith("*")
    assert "2 failed" in row["dot"]
    low = format_table(summary, ["accuracy"], higher_is_better=False).splitlines()
    assert any(line.startswith("* mean") for line in low)


# ----------------------------------------------------------------------------- running


def _started(out: Path, rid: str) -> str:
    return json.loads((out / "runs" / rid / "run.json").read_text())["started"] + str(
        (out / "runs" / rid / "run.json").stat().st_mtime_ns
    )


def test_with_progress_the_ablation_shows_its_runs_bars_in_process(tmp_path, capsys):
    grid = [{"name": "tanh"}]
    run_ablation("toy", grid, [0], out_dir=tmp_path / "q", options=TINY, progress=False)
    assert capsys.readouterr().err == ""
    run_ablation("toy", grid, [0], out_dir=tmp_path / "p", options=TINY, progress=True)
    err = capsys.readouterr().err
    assert "ablate toy" in err and "toy seed 0" in err and "epoch 2" in err


@pytest.mark.parametrize("progress", [False, True])
def test_the_ablation_tells_the_task_whether_its_data_may_show_progress(
    tmp_path, toy_task_module, progress
):
    seen: list[bool] = []

    class Watched(toy_task_module.ToyTask):
        def load_data(self):
            seen.append(self.progress)
            return super().load_data()

    run_ablation(Watched(**TINY), ["mean"], [0], out_dir=tmp_path / "a", progress=progress)
    assert seen[:1] == [progress]  # the check of the data, before any run


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"out_dir": ""}, ConfigError, "out_dir must not be empty"),
        ({"out_dir": 3}, TypeError, r"out_dir must be a path \(a str or os\.PathLike\), got int"),
        ({"progress": "no"}, TypeError, "progress must be a bool, got 'no'"),
        ({"options": [("epochs", 1)]}, ConfigError, "options must be a mapping"),
        ({"plugins": ["no_such_plugin_xyz"]}, ConfigError, "plugin 'no_such_plugin_xyz' cannot"),
        ({"plugins": "no_such_plugin_xyz"}, ConfigError, "plugin 'no_such_plugin_xyz' cannot"),
        ({"plugins": [""]}, ConfigError, "a plugin must be a module name"),
        ({"jobs": "2"}, ConfigError, "jobs must be an int >= 1, got '2'"),
    ],
)
def test_bad_arguments_are_one_line_before_anything_is_written(
    tmp_path, monkeypatch, kwargs, error, message
):
    monkeypatch.chdir(tmp_path)
    kwargs = {"out_dir": tmp_path / "abl", "progress": False, "options": TINY, **kwargs}
    with pytest.raises(error, match=message):
        run_ablation("toy", "tanh", [0], **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_run_ablation_records_every_run_and_resumes(tmp_path):
    out = tmp_path / "abl"
    grid = expand_grid(["tanh"], baselines=False)
    grid = [{"name": "mean"}, *grid]
    result = run_ablation("toy", grid, [0, 1], out_dir=out, options=TINY, progress=False)
    ids = {run_id(s, seed) for s in grid for seed in (0, 1)}
    assert set(result.ran) == ids and not result.failed and not result.skipped
    meta = json.loads((out / "ablation.json").read_text())
    assert meta["task"] == "toy" and meta["seeds"] == [0, 1] and meta["executor"] == "local"
    assert meta["grid"] == [{"name": "mean"}, {"name": "tanh"}]
    assert meta["task_options"]["epochs"] == 2 and meta["task_options"]["lr"] == 0.02
    store = ResultsStore(out / "results.sqlite")
    assert store.done_ids() == ids
    for rec in store.runs():
        run_json = json.loads((out / "runs" / rec.run_id / "run.json").read_text())
        metrics = json.loads((out / "runs" / rec.run_id / "metrics.json").read_text())
        assert run_json["status"] == "done" and run_json["seed"] == rec.seed
        assert rec.test == metrics["test"] and rec.dev == metrics["dev"]
        assert rec.cost["parameters"] > 0
    # the summary is the mean and sample std of the stored test metrics, by hand
    for label, s in result.summary.items():
        accs = [r.test["accuracy"] for r in store.runs() if r.label == label]
        assert s.n == 2 == len(accs)
        assert s.mean["accuracy"] == pytest.approx(sum(accs) / 2)
        assert s.std["accuracy"] == pytest.approx(abs(accs[0] - accs[1]) / 2**0.5)
    assert list(result.summary) == ["mean", "tanh"]
    before = {rid: _started(out, rid) for rid in ids}

    again = run_ablation("toy", grid, [0, 1], out_dir=out, options=TINY, progress=False)
    assert again.ran == [] and set(again.skipped) == ids
    assert {rid: _started(out, rid) for rid in ids} == before  # nothing retrained
    assert {k: v.mean for k, v in again.summary.items()} == {
        k: v.mean for k, v in result.summary.items()
    }

    # a superset (one more spec, one more seed) runs only the missing runs
    bigger = [*grid, {"name": "dot"}]
    more = run_ablation("toy", bigger, [0, 1, 2], out_dir=out, options=TINY, progress=False)
    new = {run_id(s, 2) for s in grid} | {run_id({"name": "dot"}, s) for s in (0, 1, 2)}
    assert set(more.ran) == new
    assert {rid: _started(out, rid) for rid in ids} == before
    assert len(ResultsStore(out).runs()) == 9
    assert json.loads((out / "ablation.json").read_text())["seeds"] == [0, 1, 2]


def test_resume_refuses_another_study(tmp_path):
    out = tmp_path / "abl"
    grid = [{"name": "mean"}, {"name": "tanh"}]
    run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    with pytest.raises(AblationMismatchError, match=r"epochs=2 -> 3"):
        run_ablation("toy", grid, [0], out_dir=out, options={**TINY, "epochs": 3}, progress=False)
    with pytest.raises(AblationMismatchError, match=r"lacks recorded mechanism.*tanh"):
        run_ablation("toy", grid[:1], [0], out_dir=out, options=TINY, progress=False)
    with pytest.raises(AblationMismatchError, match=r"seed\(s\) \[0\]"):
        run_ablation("toy", grid, [1], out_dir=out, options=TINY, progress=False)
    # another precision is another study (it resumed and mixed fp32 and bf16 runs)
    assert json.loads((out / "ablation.json").read_text())["precision"] == "fp32"
    with pytest.raises(AblationMismatchError, match=r"precision: recorded fp32, now bf16"):
        run_ablation(
            "toy", [*grid, {"name": "dot"}], [0], out_dir=out, options=TINY, progress=False,
            precision="bf16",
        )  # fmt: skip
    assert len(ResultsStore(out).runs()) == 2  # nothing ran
    # a record written before the precision was recorded counts as fp32
    record = json.loads((out / "ablation.json").read_text())
    del record["precision"]
    (out / "ablation.json").write_text(json.dumps(record))
    with pytest.raises(AblationMismatchError, match=r"precision: recorded fp32, now bf16"):
        run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False, precision="bf16")
    again = run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    assert again.ran == [] and json.loads((out / "ablation.json").read_text())["precision"] == (
        "fp32"
    )


def test_unknown_task_and_preset_fail_before_running(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown task 'nope'.*toy"):
        run_ablation("nope", ["mean"], [0], out_dir=tmp_path / "a", progress=False)
    with pytest.raises(ConfigError, match="no attention preset 'bogus'"):
        run_ablation("toy", ["bogus"], [0], out_dir=tmp_path / "b", options=TINY, progress=False)
    assert not (tmp_path / "b" / "results.sqlite").exists()


def test_a_spec_the_model_refuses_fails_before_the_directory_is_made(tmp_path):
    from attnlab.lab.training import ModelBuildError

    out = tmp_path / "abl"
    grid = ["dot", {"score": "additive", "d_w": -1}]
    with pytest.raises(ModelBuildError, match=r"'d_w=-1,score=additive'.*d_w must be a posi"):
        run_ablation("toy", grid, [0, 1], out_dir=out, options=TINY, progress=False)
    assert not out.exists()


def test_what_would_fail_every_run_fails_before_the_directory_is_made(tmp_path, monkeypatch):
    from attnlab.data._common import MissingDataError
    from attnlab.lab.executors import RayExecutor

    out = tmp_path / "abl"
    with pytest.raises(ConfigError, match="option grad_clip must be >= 0"):
        run_ablation("toy", ["tanh"], [0], out_dir=out, options={"grad_clip": -1}, progress=False)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"afile is a file, not a folder$"):
        run_ablation("toy", ["tanh"], [0], out_dir=tmp_path / "afile" / "x", progress=False)

    def missing(self):
        raise MissingDataError("no data here: pip install it")

    def no_ray(self, *args, **kwargs):
        raise ImportError("the Ray executor needs the optional dependency ray")

    monkeypatch.setattr(RayExecutor, "__init__", no_ray)
    with pytest.raises(ImportError, match="needs the optional dependency ray"):
        run_ablation("toy", ["tanh"], [0], out_dir=out, executor="ray", progress=False)
    monkeypatch.setattr(type(ablation_mod.resolve_task("toy")), "load_data", missing)
    with pytest.raises(MissingDataError, match="no data here"):
        run_ablation("toy", ["tanh", "dot"], [0, 1], out_dir=out, options=TINY, progress=False)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


def test_failed_runs_are_counted_and_retried(tmp_path, monkeypatch):
    import attnlab.lab.training as training

    real = training.train_run
    calls = []

    def flaky(task, attention, **kw):
        calls.append(spec_label(attention))
        if attention == {"name": "tanh"} and calls.count("tanh") == 1:
            raise RuntimeError("flaky failure")
        return real(task, attention, **kw)

    monkeypatch.setattr(training, "train_run", flaky)
    out = tmp_path / "abl"
    grid = [{"name": "mean"}, {"name": "tanh"}]
    first = run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    assert list(first.failed) == ["tanh--seed0"] and "flaky failure" in first.failed["tanh--seed0"]
    assert first.summary["tanh"].n == 0 and first.summary["tanh"].failed == 1
    store = ResultsStore(out)
    assert store.get("tanh--seed0").status == "failed"
    assert "RuntimeError: flaky failure" in store.get("tanh--seed0").error
    assert store.get("mean--seed0").status == "done"  # the other run went on
    second = run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    assert second.ran == ["tanh--seed0"] and second.skipped == ["mean--seed0"]
    assert not second.failed and store.get("tanh--seed0").status == "done"
    assert len(store.runs()) == 2


def test_a_finished_run_dir_missing_from_the_store_is_recorded_not_retrained(tmp_path):
    out = tmp_path / "abl"
    grid = [{"name": "mean"}]
    run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    stamp = _started(out, "mean--seed0")
    (out / "results.sqlite").unlink()  # as if the process died before recording it
    for extra in ("results.sqlite-wal", "results.sqlite-shm"):
        (out / extra).unlink(missing_ok=True)
    result = run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    assert result.recovered == ["mean--seed0"] and result.ran == []
    assert _started(out, "mean--seed0") == stamp
    assert ResultsStore(out).done_ids() == {"mean--seed0"}


def test_a_run_dir_of_other_options_is_trained_again_not_adopted(tmp_path):
    """With ``ablation.json`` and ``results.sqlite`` deleted, a rerun with other options
    finds the old run folders: they are runs of another study, not recovered ones."""
    out = tmp_path / "abl"
    grid = [{"name": "mean"}]
    run_ablation("toy", grid, [0], out_dir=out, options=TINY, progress=False)
    for name in ("ablation.json", "results.sqlite", "results.sqlite-wal", "results.sqlite-shm"):
        (out / name).unlink(missing_ok=True)
    other = {**TINY, "epochs": 1}
    result = run_ablation("toy", grid, [0], out_dir=out, options=other, progress=False)
    assert result.recovered == [] and result.ran == ["mean--seed0"]
    run = json.loads((out / "runs" / "mean--seed0" / "run.json").read_text())
    assert run["task_options"]["epochs"] == 1


def test_ablate_out_is_refused_where_runs_of_train_or_another_ablation_live(tmp_path):
    from attnlab.lab.training import train_run

    runs = tmp_path / "runs"
    train_run("toy", "mean", out_dir=runs / "mean--seed0", options=TINY, progress=False)
    abl = tmp_path / "abl"
    run_ablation("toy", ["mean"], [0], out_dir=abl, options=TINY, progress=False)
    refused = {
        runs: "it holds run directories of attnlab train (mean--seed0, ...)",
        runs / "mean--seed0": "a run directory; give a folder of its own",
        runs / "mean--seed0" / "x": "inside the run directory",
        abl / "runs": "inside the ablation directory",
    }
    for out, message in refused.items():
        where = re.escape(f"ablation directory {out}: ")
        with pytest.raises(ConfigError, match=rf"^{where}.*{re.escape(message)}"):
            run_ablation("toy", ["dot"], [0], out_dir=out, options=TINY, progress=False)
    assert not (runs / "ablation.json").exists() and not (abl / "runs" / "ablation.json").exists()


# ----------------------------------------------------------------------------- command


def test_ablate_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grid.yaml").write_text("- tanh\n")
    runner = CliRunner()
    args = ["toy", "--plugin", "tests.lab.toy_task", "--grid", "grid.yaml", "-a", "dot"]
    args += ["--seeds", "0", "-o", "epochs=2", "-o", "n_train=64", "-o", "n_eval=32"]
    res = runner.invoke(ablate_command, [*args, "--no-report"])
    assert res.exit_code == 0, res.output
    for label in ("mean", "uniform", "tanh", "dot", "test accuracy", "test f1"):
        assert label in res.output
    assert (tmp_path / "ablations" / "toy" / "results.sqlite").is_file()
    assert len(ResultsStore(tmp_path / "ablations" / "toy").done_ids()) == 4

    res = runner.invoke(ablate_command, [*args, "--no-report", "--no-baselines"])
    assert res.exit_code != 0 and "lacks recorded mechanism" in res.output

    res = runner.invoke(ablate_command, ["toy", "-a", "tanh", "--seeds", "1", "--num-seeds", "2"])
    assert res.exit_code != 0 and "not both" in res.output

    res = runner.invoke(ablate_command, ["toy", "--address", "x:1", "-a", "tanh"])
    assert res.exit_code != 0 and "--executor ray" in res.output


def test_ablate_command_without_progress_bars_prints_the_table_all_the_same(tmp_path):
    args = ["toy", "--plugin", "tests.lab.toy_task", "-a", "tanh", "--seeds", "0", "--no-report"]
    args += ["-o", "epochs=1", "-o", "n_train=64", "-o", "n_eval=32", "--out", str(tmp_path)]
    shown = CliRunner().invoke(ablate_command, args)
    quiet = CliRunner().invoke(ablate_command, [*args, "--no-progress"])
    assert shown.exit_code == quiet.exit_code == 0, quiet.output
    assert "ablate toy" in shown.stderr  # the bar over the runs
    assert quiet.stderr == ""
    # the same table, and the line that says the ablation resumed
    assert shown.stdout.strip().splitlines()[-6:] == quiet.stdout.strip().splitlines()[-6:]
    assert f"resuming {tmp_path}: 3 of 3 runs already done, 0 to run" in quiet.stdout
    assert "test accuracy" in quiet.stdout and "tanh" in quiet.stdout


def test_ablate_command_exits_1_when_runs_fail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        ablate_command,
        [
            *("toy", "--no-baselines", "-a", "tanh", "--seeds", "0"),
            *("-o", "fail_after_steps=1", "-o", "n_train=64", "--no-report"),
        ],
    )
    assert res.exit_code == 1, res.output
    assert "1 run(s) failed" in res.output and "failing on purpose" in res.output


def test_ablate_command_writes_the_report(tmp_path, monkeypatch):
    pytest.importorskip("attnlab.lab.report")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(
        ablate_command,
        ["toy", "-a", "tanh", "--seeds", "0", "-o", "epochs=1", "-o", "n_train=64"],
    )
    assert res.exit_code == 0, res.output
    line = [x for x in res.output.splitlines() if x.startswith("report: ")][-1]
    assert Path(line.removeprefix("report: ")).is_file()


def test_a_resumed_ablation_goes_on_inside_the_run_it_was_stopped_in(tmp_path, monkeypatch):
    """Ctrl-C in epoch 3 of a run: the same ablation run again trains that run from epoch 3
    on (attnlab.lab.resume) and records what an uninterrupted ablation records."""
    from attnlab.lab import training

    options = {"epochs": 3, "dropout": 0.3}

    def ablate(out):
        return run_ablation("toy", ["tanh"], [0], out_dir=out, options=options, progress=False)

    real = training._Trainer.epoch

    def epoch(self, number):
        if number == 3:
            raise KeyboardInterrupt
        return real(self, number)

    with monkeypatch.context() as patch:
        patch.setattr(training._Trainer, "epoch", epoch)
        with pytest.raises(KeyboardInterrupt):
            ablate(tmp_path / "a")
    resumed = ablate(tmp_path / "a")
    whole = ablate(tmp_path / "b")
    runs = [tmp_path / name / "runs" / run_id({"name": "tanh"}, 0) for name in ("a", "b")]
    assert [json.loads((r / "run.json").read_text())["resumed_after"] for r in runs] == [[2], []]
    assert (runs[0] / "model.safetensors").read_bytes() == (
        runs[1] / "model.safetensors"
    ).read_bytes()
    for metric in ("accuracy", "f1"):  # the costs (seconds, memory) differ, the metrics not
        assert resumed.summary["tanh"].mean[metric] == whole.summary["tanh"].mean[metric]
    assert not list((tmp_path / "a" / "runs").glob(".*"))  # no state or work folder left


# ----------------------------------------------------------------------------- SIGKILL


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path):
    """Kill `attnlab ablate` (SIGKILL) once at least one run is recorded and before all are;
    the rerun trains exactly the missing runs: no duplicates, nothing lost, the finished runs
    untouched."""
    out = tmp_path / "abl"
    cmd = [sys.executable, "-m", "attnlab", "ablate", "toy", "--plugin", "tests.lab.toy_task"]
    cmd += ["-a", "tanh", "-a", "dot", "--seeds", "0,1", "--out", str(out), "--no-report"]
    cmd += ["-o", "epochs=2", "-o", "n_train=64", "-o", "n_eval=32", "-o", "step_sleep=0.25"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    total = 4 * 2
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    db = out / "results.sqlite"
    sigkill_when(proc, lambda: done_runs(out) >= 1, "no run finished within 120 s")
    store = ResultsStore(out)
    done_before = store.done_ids()
    assert 1 <= len(done_before) < total, "the kill came too late to test resuming"
    stamps = {rid: _started(out, rid) for rid in done_before}

    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"{len(done_before)} of {total} runs already done" in rerun.stdout

    rows = sqlite3.connect(db).execute("SELECT run_id, status FROM runs").fetchall()
    ids = [r[0] for r in rows]
    expected = {run_id({"name": n}, s) for n in ("mean", "uniform", "tanh", "dot") for s in (0, 1)}
    assert len(ids) == len(set(ids)) == total  # no duplicate, no lost run
    assert set(ids) == expected and all(r[1] == "done" for r in rows)
    assert {rid: _started(out, rid) for rid in done_before} == stamps  # not retrained
    runs = [p for p in (out / "runs").iterdir() if not p.name.startswith(".")]
    assert {p.name for p in runs} == expected
    assert "mean" in rerun.stdout and "test accuracy" in rerun.stdout


def test_ablation_module_exports():
    assert set(ablation_mod.__all__) <= set(dir(ablation_mod))


def test_the_command_names_a_plugin_that_cannot_be_imported(tmp_path):
    res = CliRunner().invoke(
        ablate_command,
        ["toy", "-a", "tanh", "--plugin", "no_such_plugin_xyz", "--out", str(tmp_path / "a")],
    )
    assert res.exit_code == 2, res.output
    assert "plugin 'no_such_plugin_xyz' cannot be imported" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "a").exists()


def test_the_ablation_directory_expands_the_home_folder(tmp_path, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    options = {**TINY, "epochs": 1}
    result = run_ablation("toy", ["mean"], [0], out_dir="~/abl", options=options, progress=False)
    assert result.out_dir == home / "abl" and not result.failed
    assert ResultsStore("~/abl").done_ids() == set(result.ran)
    assert list(work.iterdir()) == []  # no folder named "~"


def test_ablations_started_together_take_turns_with_the_record(tmp_path, monkeypatch):
    """Two ablations started at once on one directory with different grids: each checks
    and writes ablation.json in turn (under the store's lock), so the later one sees the
    earlier one's record and is refused (its grid lacks the recorded mechanism), as if it
    had been started afterwards. Unlocked, both saw no record and both wrote theirs: the
    record lost a grid whose runs went on training into the store."""
    import threading

    out = tmp_path / "abl"
    both_checked = threading.Barrier(2, timeout=2.0)
    write_json = ablation_mod.write_json

    def write_after_the_other_looked(path, payload, **kwargs):
        if Path(path).name == "ablation.json":
            try:  # unlocked, the other thread has looked too by now; locked, it waits
                both_checked.wait()
            except threading.BrokenBarrierError:
                pass
        write_json(path, payload, **kwargs)

    monkeypatch.setattr(ablation_mod, "write_json", write_after_the_other_looked)
    outcomes: dict[str, object] = {}

    def ablate(name: str) -> None:
        try:
            grid = [{"name": name}]
            outcomes[name] = run_ablation(
                "toy", grid, [0], out_dir=out, options=TINY, progress=False
            )
        except Exception as error:  # the test looks at what each one raised
            outcomes[name] = error

    threads = [threading.Thread(target=ablate, args=(n,)) for n in ("tanh", "dot")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    refused = [n for n, o in outcomes.items() if isinstance(o, AblationMismatchError)]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    (kept,) = set(outcomes) - set(refused)
    assert "lacks recorded mechanism" in str(outcomes[refused[0]])
    assert json.loads((out / "ablation.json").read_text())["grid"] == [{"name": kept}]
    assert {r.label for r in ResultsStore(out).runs()} == {kept}


# ----------------------------------------------------------------------------- audit fixes


def test_seeds_take_spaces_around_commas_and_refuse_spaces_between_seeds():
    assert parse_seeds("0, 1") == [0, 1]
    assert parse_seeds(" 0 ,1 , 2 ") == [0, 1, 2]
    for bad in ("0 1", "0 1 2", "0, 1 2"):  # not seed [1], nor seed 12
        with pytest.raises(ConfigError, match="separate the seeds with commas"):
            parse_seeds(bad)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "0 1"], "error: seeds '0 1': separate the seeds with commas"),
        (["--seeds", "0 1 2"], "error: seeds '0 1 2': separate the seeds with commas"),
        (["--seeds", "0", "--seeds", "1"], "error: --seeds given 2 times"),
        (["-g", "tanh", "-g", "dot"], "error: -g/--grid given 2 times"),
    ],
)
def test_the_command_refuses_seeds_with_spaces_and_repeated_seeds_or_grids(tmp_path, args, message):
    out = tmp_path / "abl"
    res = CliRunner().invoke(
        ablate_command, ["toy", "-a", "tanh", *args, "--out", str(out), "--no-report"]
    )
    assert res.exit_code == 2, res.output
    assert res.output.strip().splitlines() == [res.output.strip()]  # one line
    assert res.output.startswith(message), res.output
    assert not out.exists()
