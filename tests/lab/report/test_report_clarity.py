"""What the report says to someone reading it for the first time: the data a run used,
peak memory below what the CPU measurement can see, no empty paired-tests section, the
uniform baselines' heatmaps, the viewer's numbers, and damaged run directories.

Synthetic directories from ``report_fixtures`` (the documented layout); the HTML is read
back with the stdlib parser of ``report_fixtures``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_fixtures import (
    matrix_example,
    parse,
    run_id,
    table_rows,
    write_ablation_dir,
    write_run_dir,
)

from attnlab.lab.report import (
    PEAK_MEMORY_FLOOR_MB,
    ReportError,
    heat_colour,
    render_report,
    report_command,
    theme,
)

ADD = {"score": "additive", "align": "soft"}
DOT = {"score": "dot", "align": "soft"}
UNIFORM = {"name": "uniform"}


def _meta(text: str) -> dict[str, str]:
    """The overview's ``<dt>``/``<dd>`` pairs as {term: text}."""
    doc = parse(text)
    terms = [el["text"] for el in doc.find("dt")]
    values = [el["text"] for el in doc.find("dd")]
    return dict(zip(terms, values, strict=True))


def _cost(**values) -> dict:
    return {"parameters": 10, "train_seconds": 1.0, "seconds_per_epoch": 1.0,
            "eval_ms_per_example": 0.1, **values}  # fmt: skip


# ----------------------------------------------------------------------------- data row


def test_data_row_names_the_data_the_run_used(tmp_path: Path) -> None:
    options = {"epochs": 1, "data": "sst", "path": "/data/sst.csv", "encoder": "cnn"}
    root = write_run_dir(tmp_path / "run", attention=ADD, task="sentiment", task_options=options)
    data = _meta(render_report(root))["data"]
    assert data == "data=sst, path=/data/sst.csv"
    assert "VADER" not in data and "Rotten" not in data  # not every source the task can read


def test_data_row_of_a_task_without_a_data_option_is_its_source(tmp_path: Path) -> None:
    import toy_task  # registers "toy" (tests/lab is on the path)

    root = write_run_dir(tmp_path / "run", attention=ADD, task="toy")
    assert _meta(render_report(root))["data"] == toy_task.ToyTask.data_source


# ----------------------------------------------------------------------------- memory


def test_peak_memory_below_the_floor_is_not_shown_as_zero(tmp_path: Path) -> None:
    runs = [
        {"attention": ADD, "seed": 0, "cost": _cost(peak_memory_mb=175.8671875)},
        {"attention": ADD, "seed": 1, "cost": _cost(peak_memory_mb=12.5)},
        # later runs of one process reuse what the earlier ones freed
        {"attention": DOT, "seed": 0, "cost": _cost(peak_memory_mb=0.0546875)},
        {"attention": DOT, "seed": 1, "cost": _cost(peak_memory_mb=0.00390625)},
    ]
    text = render_report(write_ablation_dir(tmp_path / "abl", runs))
    rows = table_rows(parse(text), "cost-table")

    def peak(label: str) -> dict:
        (cell,) = [
            c for c in rows_by_label(rows)[label] if c["attrs"]["data-key"] == "peak_memory_mb"
        ]
        return cell

    assert peak("align=soft,score=additive")["text"] == "94.2"
    small = peak("align=soft,score=dot")
    assert small["text"] == f"< {PEAK_MEMORY_FLOOR_MB:g} †"
    assert float(small["attrs"]["data-value"]) == pytest.approx((0.0546875 + 0.00390625) / 2)
    assert small["attrs"]["title"] == "per seed: 0.0547, 0.0039"
    assert "† Below 0.1 MB: the runs needed no memory beyond what their process" in text


def rows_by_label(rows: dict) -> dict[str, list[dict]]:
    """The cost table has no data-label: key its rows by the first cell's text."""
    return {cells[0]["text"]: cells[1:] for cells in rows.values()}


def test_peak_memory_on_cuda_is_its_own_count(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD, cost=_cost(peak_memory_mb=0.0625))
    info = json.loads((root / "run.json").read_text())
    info["device"] = "cuda:0"
    (root / "run.json").write_text(json.dumps(info))
    text = render_report(root)
    (cells,) = rows_by_label(table_rows(parse(text), "cost-table")).values()
    (cell,) = [c for c in cells if c["attrs"]["data-key"] == "peak_memory_mb"]
    assert cell["text"] == "0.062"
    assert "† Below" not in text


def test_overview_names_the_gpu_and_the_precision(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    info = json.loads((root / "run.json").read_text())
    info.update(device="cuda", device_name="NVIDIA H100 80GB HBM3", precision="bf16")
    (root / "run.json").write_text(json.dumps(info))
    meta = _meta(render_report(root))
    assert meta["device"] == "cuda (NVIDIA H100 80GB HBM3)"
    assert meta["precision"] == "bf16"


def test_overview_names_the_compile_backend_only_where_a_run_was_compiled(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    assert "torch.compile" not in _meta(render_report(root))  # eager: nothing to say
    info = json.loads((root / "run.json").read_text())
    info["compile"] = "inductor"
    (root / "run.json").write_text(json.dumps(info))
    assert _meta(render_report(root))["torch.compile"] == "inductor"


def test_overview_says_which_runs_went_on_after_an_interruption(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    assert "resumed" not in _meta(render_report(root))
    info = json.loads((root / "run.json").read_text())
    info["resumed_after"] = [3, 7]
    (root / "run.json").write_text(json.dumps(info))
    assert _meta(render_report(root))["resumed"] == (
        "run after epochs 3, 7 (times summed over the processes, memory their largest)"
    )
    info["resumed_after"] = []
    (root / "run.json").write_text(json.dumps(info))
    assert "resumed" not in _meta(render_report(root))


def test_runs_without_a_recorded_precision_trained_in_float32(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    info = json.loads((root / "run.json").read_text())
    info.pop("precision", None)
    info["device"] = "cpu"
    (root / "run.json").write_text(json.dumps(info))
    meta = _meta(render_report(root))
    assert meta["device"] == "cpu" and meta["precision"] == "fp32"


# ----------------------------------------------------------------------------- paired tests


def test_a_single_run_has_no_paired_tests_section(tmp_path: Path) -> None:
    text = render_report(write_run_dir(tmp_path / "run", attention=ADD))
    assert '<section id="analysis">' not in text
    assert 'href="#analysis"' not in text


def test_an_ablation_without_pairs_says_why(tmp_path: Path) -> None:
    runs = [{"attention": ADD, "seed": s, "test": {"accuracy": 0.5 + s / 10}} for s in (0, 1)]
    text = render_report(write_ablation_dir(tmp_path / "abl", runs))
    section = re.search(r'<section id="analysis">(.*?)</section>', text, re.S)
    assert section is not None
    assert "No paired tests: they need at least two mechanisms" in section.group(1)
    assert "<table" not in section.group(1)


# ----------------------------------------------------------------------------- heatmaps


def _tokens(weights: list[float], title: str = "test #0") -> dict:
    return {"title": title, "rows": ["attention"], "cols": [f"w{i}" for i in range(len(weights))],
            "weights": [weights], "kind": "tokens"}  # fmt: skip


def _token_colours(text: str) -> list[str]:
    section = re.search(r'<section id="attention">(.*?)</section>', text, re.S).group(1)
    return re.findall(r'class="tok" style="background:(rgb\([^)]*\))', section)


def test_uniform_weights_are_not_drawn_in_full_colour(tmp_path: Path) -> None:
    quarter = [0.25, 0.25, 0.25, 0.25]
    root = write_run_dir(tmp_path / "run", attention=UNIFORM, examples=[_tokens(quarter)])
    text = render_report(root)
    expected = "rgb({},{},{})".format(*heat_colour(0.25))
    assert _token_colours(text) == [expected] * 4
    assert "uniform: every weight 0.25" in text
    # a row that is not uniform still has its largest weight in full colour
    root = write_run_dir(tmp_path / "run2", attention=ADD, examples=[_tokens([0.1, 0.2, 0.7])])
    colours = _token_colours(render_report(root))
    assert colours[2] == "rgb({},{},{})".format(*heat_colour(1.0))
    assert colours[0] == "rgb({},{},{})".format(*heat_colour(0.1 / 0.7))


def test_uniform_matrix_is_shaded_by_its_weights(tmp_path: Path) -> None:
    example = matrix_example()
    example["weights"] = [[1 / 3] * 3, [1 / 3] * 3]
    text = render_report(write_run_dir(tmp_path / "run", attention=UNIFORM, examples=[example]))
    cells = re.findall(r'class="cell" style="background:(rgb\([^)]*\))', text)
    assert cells == ["rgb({},{},{})".format(*heat_colour(1 / 3))] * 6
    assert "uniform: every weight 0.3333" in text


# ----------------------------------------------------------------------------- viewer numbers

NODE = shutil.which("node")


def _node(expression: str) -> object:
    script = theme.asset("weights.js") + f"\nconsole.log(JSON.stringify({expression}));\n"
    proc = subprocess.run(
        [NODE, "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(proc.stdout)


@pytest.mark.skipif(NODE is None, reason="no node.js to run the viewer's number helpers")
def test_viewer_writes_weights_with_four_significant_digits() -> None:
    got = _node(
        "[0.10000000149011612, 0.123456789, 1234.5678, 1e-7, NaN, 'x'].map(attnlabWeights.fmt)"
    )
    assert got == ["0.1000", "0.1235", "1235", "1.000e-7", "n/a", "n/a"]


@pytest.mark.skipif(NODE is None, reason="no node.js to run the viewer's number helpers")
def test_viewer_shades_a_uniform_row_by_its_weights() -> None:
    got = _node(
        "[attnlabWeights.scale([0.25, 0.25, 0.25, 0.25]), attnlabWeights.scale([0.1, 0.5]),"
        " attnlabWeights.uniform([0.25, 0.25]), attnlabWeights.uniform([0.2]),"
        " attnlabWeights.uniform([0.1, 0.5]), attnlabWeights.scale([0, 0])]"
    )
    assert got == [1, 0.5, True, False, False, 1]


def test_viewer_readout_uses_the_rounded_weight() -> None:
    # the read-out shows fmt(weight), not the float's 17 digits (exact() is only for the
    # data-weight attributes)
    viewer_js = theme.asset("weights.js") + theme.asset("viewer.js")
    tell = re.search(r"Viewer\.prototype\.tell = function[^}]*}", viewer_js)
    assert tell is not None
    assert "fmt(weight)" in tell.group(0) and "exact(" not in tell.group(0)


# ----------------------------------------------------------------------------- damaged runs


def _ablation_with_damage(tmp_path: Path, *, sqlite: bool = True) -> Path:
    runs = [
        {"attention": ADD, "seed": 0, "test": {"accuracy": 0.6}},
        {"attention": ADD, "seed": 1, "test": {"accuracy": 0.8}},
        {"attention": DOT, "seed": 0, "test": {"accuracy": 0.5}},
    ]
    root = write_ablation_dir(tmp_path / "abl", runs, sqlite=sqlite)
    (root / "runs" / run_id(ADD, 1) / "metrics.json").write_text("[1, 2]")  # not an object
    (root / "runs" / run_id(DOT, 0) / "run.json").write_text('{"task": "toy",')  # cut short
    return root


def test_report_skips_unreadable_runs_with_one_warning_each(tmp_path: Path) -> None:
    root = _ablation_with_damage(tmp_path)
    result = CliRunner().invoke(report_command, [str(root)])
    assert result.exit_code == 0, result.output
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2, result.stderr
    assert all(w.startswith("warning: cannot read the run directory ") for w in warnings)
    assert any("metrics.json holds a JSON list, not an object" in w for w in warnings)
    assert any("run.json" in w for w in warnings)
    assert all("results.sqlite is used" in w for w in warnings)
    text = (root / "report.html").read_text()
    # the store has both runs: their numbers still count (additive: 0.6 and 0.8)
    doc = parse(text)
    cells = table_rows(doc, "ablation-table")["align=soft,score=additive"]
    (acc,) = [c for c in cells if c["attrs"].get("data-metric") == "accuracy"]
    assert float(acc["attrs"]["data-value"]) == pytest.approx(0.7)
    failed = table_rows(doc, "failed-table")
    statuses = sorted(cells[2]["text"] for cells in failed.values())
    assert statuses == ["unreadable", "unreadable"]


def test_unreadable_runs_without_a_store_are_left_out(tmp_path: Path) -> None:
    root = _ablation_with_damage(tmp_path, sqlite=False)
    warnings: list[str] = []
    text = render_report(root, on_warning=warnings.append)
    assert len(warnings) == 2 and all(w.endswith("it is left out") for w in warnings)
    cells = table_rows(parse(text), "ablation-table")["align=soft,score=additive"]
    (acc,) = [c for c in cells if c["attrs"].get("data-metric") == "accuracy"]
    assert float(acc["attrs"]["data-value"]) == pytest.approx(0.6)
    assert "2 with unreadable files" in _meta(text)["runs"]


def test_a_damaged_store_row_is_no_finished_seed(tmp_path: Path) -> None:
    """A row of results.sqlite whose JSON is damaged is the store's own "damaged" (ablate
    refuses it): a run known only from it is listed unreadable, not counted as a finished
    seed without metrics (the seeds column said 2 for one mean); beside a readable run
    directory the directory speaks alone. One warning per damaged row."""
    import sqlite3

    runs = [
        {"attention": ADD, "seed": 0, "test": {"accuracy": 0.6}},
        {"attention": ADD, "seed": 1, "test": {"accuracy": 0.8}},
        {"attention": DOT, "seed": 0, "test": {"accuracy": 0.5}},
    ]
    root = write_ablation_dir(tmp_path / "abl", runs)
    con = sqlite3.connect(root / "results.sqlite")
    con.execute("UPDATE runs SET test_json='{bad' WHERE run_id=?", (run_id(ADD, 0),))
    con.execute("UPDATE runs SET dev_json='[1]' WHERE run_id=?", (run_id(DOT, 0),))
    con.commit()
    con.close()
    shutil.rmtree(root / "runs" / run_id(ADD, 0))  # known from its damaged row only
    warnings: list[str] = []
    doc = parse(render_report(root, on_warning=warnings.append))
    assert sorted(warnings) == [
        f"the row of run {run_id(ADD, 0)!r} in results.sqlite is damaged: invalid JSON in "
        "test_json (Expecting property name enclosed in double quotes: line 1 column 2 (char "
        "1))",
        f"the row of run {run_id(DOT, 0)!r} in results.sqlite is damaged: dev_json holds "
        "list, not an object",
    ]
    cells = table_rows(doc, "ablation-table")["align=soft,score=additive"]
    (acc,) = [c for c in cells if c["attrs"].get("data-metric") == "accuracy"]
    assert float(acc["attrs"]["data-value"]) == pytest.approx(0.8)
    assert acc["attrs"]["data-n"] == "1"
    failed = {
        cells[3]["text"]: cells[2]["text"] for cells in table_rows(doc, "failed-table").values()
    }
    assert failed[run_id(ADD, 0)] == "unreadable"
    assert failed[run_id(DOT, 0)] == "unrecorded"


def test_a_damaged_single_run_is_one_line_error(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    (root / "metrics.json").write_text('["not", "an", "object"]')
    with pytest.raises(ReportError, match=r"metrics\.json holds a JSON list"):
        render_report(root)
    result = CliRunner().invoke(report_command, [str(root)])
    assert result.exit_code == 2  # bad input, as every attnlab command (was 1, "Error: ")
    assert result.stderr.strip().splitlines() == [
        f"error: {root / 'metrics.json'} holds a JSON list, not an object (a damaged file?)"
    ]


# ----------------------------------------------------------------------------- run folders


def test_a_folder_of_run_directories_is_reported_like_an_ablation(tmp_path: Path) -> None:
    """What ``attnlab train toy -a ... --seed 0 --seed 1`` fills: one row per attention with
    the mean over its seeds; hidden work folders and other folders are ignored."""
    root = tmp_path / "runs" / "toy"
    for seed, acc in ((0, 0.6), (1, 0.8)):
        write_run_dir(root / f"add--seed{seed}", attention=ADD, seed=seed, test={"accuracy": acc})
    write_run_dir(root / "dot--seed0", attention=DOT, test={"accuracy": 0.5})
    (root / ".work-1234").mkdir()
    (root / "notes").mkdir()
    result = CliRunner().invoke(report_command, [str(root)])
    assert result.exit_code == 0, result.output
    text = (root / "report.html").read_text(encoding="utf-8")
    assert "<title>attnlab run folder report: toy</title>" in text
    doc = parse(text)
    rows = table_rows(doc, "ablation-table")
    assert sorted(rows) == ["align=soft,score=additive", "align=soft,score=dot"]
    (acc,) = [c for c in rows["align=soft,score=additive"] if c["attrs"].get("data-metric")]
    assert float(acc["attrs"]["data-value"]) == pytest.approx(0.7)
    meta = _meta(text)
    assert meta["seeds"] == "0, 1" and meta["runs"] == "3 done"
    assert meta["source"] == f"{root} (run folder)"


@pytest.mark.parametrize(
    ("other", "text"),
    [
        ({"task": "sentiment"}, "are of different tasks (toy, sentiment)"),
        ({"task_options": {"epochs": 5}}, "differ in the task option(s) batch_size, epochs, lr"),
    ],
)
def test_a_folder_of_runs_of_different_settings_is_refused(tmp_path: Path, other, text) -> None:
    write_run_dir(tmp_path / "a--seed0", attention=ADD)
    write_run_dir(tmp_path / "b--seed0", attention=ADD, **other)
    with pytest.raises(ReportError, match=re.escape(text)):
        render_report(tmp_path)
    result = CliRunner().invoke(report_command, [str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: the runs in {tmp_path} {text}: report one run directory at a time, or "
        "compare settings with `attnlab ablate`"
    ]
