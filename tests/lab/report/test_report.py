"""The HTML report (attnlab.lab.report) on synthetic run and ablation directories.

Numbers are checked against means and standard deviations computed by hand here; the HTML
is read back with the stdlib parser.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import sqlite3
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from report_fixtures import (
    EXPLANATION,
    Cells,
    coattention_example,
    heads_example,
    hierarchy_example,
    image_example,
    matrix_example,
    parse,
    run_id,
    table_rows,
    tiny_png,
    tokens_example,
    write_ablation_dir,
    write_explanation,
    write_run_dir,
)

from attnlab._checks import ConfigError
from attnlab.lab.report import (
    SECTIONS,
    ReportError,
    Section,
    add_section,
    render_report,
    report_command,
    script_json,
    theme,
    write_report,
)

MEAN = {"name": "mean"}
ADD = {"score": "additive", "align": "soft"}
DOT = {"score": "dot", "align": "soft"}
HEAT = "rgb({},{},{})".format(*theme.HEAT_RGB)


def metric_cell(rows, label, metric):
    (cell,) = [c for c in rows[label] if c["attrs"].get("data-metric") == metric]
    return cell


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def ablation(tmp_path: Path) -> Path:
    """mean: accuracy 0.6, 0.7, 0.8 (loss 0.4, 0.3, 0.2); additive: 0.5, 0.5, 0.8 (loss 0.2,
    0.2, 0.5); dot: seed 0 only, 0.65 (loss 0.1), seed 1 failed."""
    runs = []
    for seed, (acc, loss) in enumerate([(0.6, 0.4), (0.7, 0.3), (0.8, 0.2)]):
        runs.append(
            {
                "attention": MEAN,
                "seed": seed,
                "test": {"accuracy": acc, "loss": loss},
                "history": [
                    {"epoch": 1, "train_loss": 1.0 + seed, "dev": {"accuracy": 0.5}},
                    {"epoch": 2, "train_loss": 0.5 + seed, "dev": {"accuracy": 0.6 + 0.1 * seed}},
                ],
                "cost": {
                    "parameters": 100 + 100 * seed,
                    "train_seconds": 2.0,
                    "seconds_per_epoch": 1.0 + seed,
                    "eval_ms_per_example": 0.25,
                    "peak_memory_mb": None,
                },
                "examples": [tokens_example(f"mean seed {seed}")],
            }
        )
    for seed, (acc, loss) in enumerate([(0.5, 0.2), (0.5, 0.2), (0.8, 0.5)]):
        runs.append(
            {
                "attention": ADD,
                "seed": seed,
                "test": {"accuracy": acc, "loss": loss},
                "examples": [tokens_example(f"additive seed {seed}"), matrix_example()],
            }
        )
    runs.append({"attention": DOT, "seed": 0, "test": {"accuracy": 0.65, "loss": 0.1}})
    runs.append(
        {"attention": DOT, "seed": 1, "status": "failed", "error": "ValueError: bad <mask> & co"}
    )
    return write_ablation_dir(tmp_path / "abl", runs)


# ----------------------------------------------------------------------------- the table


def test_table_mean_and_std_by_hand(ablation: Path) -> None:
    out = write_report(ablation)
    assert out == ablation / "report.html"
    doc = parse(out.read_text(encoding="utf-8"))
    rows = table_rows(doc, "ablation-table")
    assert list(rows) == ["mean", "align=soft,score=additive", "align=soft,score=dot"]
    # mean: 0.6, 0.7, 0.8 -> 0.7, sample std sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    cell = metric_cell(rows, "mean", "accuracy")
    assert float(cell["attrs"]["data-value"]) == pytest.approx(0.7)
    assert float(cell["attrs"]["data-std"]) == pytest.approx(0.1)
    assert cell["text"].strip() == "0.7000 ± 0.1000"
    # additive: 0.5, 0.5, 0.8 -> 0.6, sqrt((0.01 + 0.01 + 0.04) / 2) = sqrt(0.03)
    cell = metric_cell(rows, "align=soft,score=additive", "accuracy")
    assert float(cell["attrs"]["data-value"]) == pytest.approx(0.6)
    assert float(cell["attrs"]["data-std"]) == pytest.approx(0.17320508075688773)
    assert cell["text"].strip() == "0.6000 ± 0.1732"
    # loss of additive: 0.2, 0.2, 0.5 -> 0.3, the same std
    cell = metric_cell(rows, "align=soft,score=additive", "loss")
    assert float(cell["attrs"]["data-value"]) == pytest.approx(0.3)
    # dot: one finished seed -> no std
    cell = metric_cell(rows, "align=soft,score=dot", "accuracy")
    assert cell["text"].strip() == "0.6500"
    assert cell["attrs"]["data-std"] == ""
    assert cell["attrs"]["data-n"] == "1"
    # seeds and failed columns: the last two cells
    seeds_failed = {lab: [c["text"] for c in cells[-2:]] for lab, cells in rows.items()}
    assert seeds_failed == {
        "mean": ["3", "0"],
        "align=soft,score=additive": ["3", "0"],
        "align=soft,score=dot": ["1", "1"],
    }


def test_best_is_marked_in_each_direction(ablation: Path) -> None:
    doc = parse(render_report(ablation))
    rows = table_rows(doc, "ablation-table")
    best = {
        (label, c["attrs"]["data-metric"])
        for label, cells in rows.items()
        for c in cells
        if "best" in (c["attrs"].get("class") or "").split()
    }
    # accuracy (higher is better): mean 0.7 > dot 0.65 > additive 0.6;
    # loss (lower is better, by its name): dot 0.1 < mean 0.3 = additive 0.3
    assert best == {("mean", "accuracy"), ("align=soft,score=dot", "loss")}


def test_higher_is_better_from_metrics_json(tmp_path: Path) -> None:
    # "score" would be higher-is-better by name; metrics.json says lower for the primary,
    # and the dict form names the direction of another metric
    runs = [
        {
            "attention": MEAN,
            "seed": 0,
            "test": {"score": 1.0, "recall": 0.2},
            "primary": "score",
            "higher_is_better": False,
        },
        {
            "attention": ADD,
            "seed": 0,
            "test": {"score": 2.0, "recall": 0.9},
            "primary": "score",
            "higher_is_better": {"score": False, "recall": False},
        },
    ]
    root = write_ablation_dir(tmp_path / "abl", runs)
    rows = table_rows(parse(render_report(root)), "ablation-table")
    assert "best" in metric_cell(rows, "mean", "score")["attrs"].get("class", "")
    assert "best" not in metric_cell(rows, "align=soft,score=additive", "score")["attrs"].get(
        "class", ""
    )
    assert "best" in metric_cell(rows, "mean", "recall")["attrs"].get("class", "")


def test_error_metrics_by_name_are_lower_is_better(tmp_path: Path) -> None:
    """Metrics other than the primary take their direction from the name: the lowest PER
    and MSE are the best (the report once starred the highest)."""
    runs = [
        {"attention": MEAN, "seed": 0, "test": {"accuracy": 0.5, "per": 0.50, "mse_masked": 0.2}},
        {"attention": ADD, "seed": 0, "test": {"accuracy": 0.6, "per": 0.10, "mse_masked": 0.4}},
    ]
    root = write_ablation_dir(tmp_path / "abl", runs)
    rows = table_rows(parse(render_report(root)), "ablation-table")

    def best(spec: str, metric: str) -> bool:
        return "best" in metric_cell(rows, spec, metric)["attrs"].get("class", "")

    assert best("align=soft,score=additive", "per") and not best("mean", "per")
    assert best("mean", "mse_masked") and not best("align=soft,score=additive", "mse_masked")


def test_ties_are_all_marked(tmp_path: Path) -> None:
    runs = [
        {"attention": MEAN, "seed": 0, "test": {"accuracy": 0.5}},
        {"attention": ADD, "seed": 0, "test": {"accuracy": 0.5}},
    ]
    rows = table_rows(
        parse(render_report(write_ablation_dir(tmp_path / "a", runs))), "ablation-table"
    )
    assert all("best" in metric_cell(rows, lab, "accuracy")["attrs"]["class"] for lab in rows)


# ----------------------------------------------------------------------------- failed runs


def test_failed_runs_are_listed_and_left_out_of_the_means(ablation: Path) -> None:
    text = render_report(ablation)
    doc = parse(text)
    failed = table_rows(doc, "failed-table")
    assert len(failed) == 1
    (cells,) = failed.values()
    texts = [c["text"].strip() for c in cells]
    assert texts[:4] == ["align=soft,score=dot", "1", "failed", run_id(DOT, 1)]
    assert texts[4] == "ValueError: bad <mask> & co"  # escaped in the file, text once parsed
    assert "bad &lt;mask&gt; &amp; co" in text


def test_store_decides_the_status(tmp_path: Path) -> None:
    runs = [
        {"attention": MEAN, "seed": 0, "test": {"accuracy": 0.9}},
        {"attention": MEAN, "seed": 1, "test": {"accuracy": 0.1}},
    ]
    root = write_ablation_dir(tmp_path / "abl", runs)
    con = sqlite3.connect(root / "results.sqlite")
    # seed 1 is a failure according to the store, and a run that never got a directory
    con.execute("UPDATE runs SET status='failed', error='killed' WHERE seed=1")
    con.execute(
        "INSERT INTO runs (run_id, task, label, attention_json, seed, status, error) "
        "VALUES ('dot--seed0', 'toy', 'dot', '{\"score\": \"dot\"}', 0, 'failed', 'OOM')"
    )
    con.commit()
    con.close()
    doc = parse(render_report(root))
    rows = table_rows(doc, "ablation-table")
    assert float(metric_cell(rows, "mean", "accuracy")["attrs"]["data-value"]) == pytest.approx(0.9)
    failed = sorted(
        tuple(c["text"].strip() for c in cells[:5])
        for cells in table_rows(doc, "failed-table").values()
    )
    assert failed == [
        ("dot", "0", "failed", "dot--seed0", "OOM"),
        ("mean", "1", "failed", run_id(MEAN, 1), "killed"),
    ]


def test_without_store_every_run_json_counts(tmp_path: Path) -> None:
    runs = [
        {"attention": MEAN, "seed": 0, "test": {"accuracy": 0.4}},
        {"attention": MEAN, "seed": 1, "test": {"accuracy": 0.6}},
        {"attention": MEAN, "seed": 2, "status": "failed", "error": "boom"},
    ]
    root = write_ablation_dir(tmp_path / "abl", runs, sqlite=False)
    (root / "ablation.json").unlink()  # runs/ alone is enough
    doc = parse(render_report(root))
    cell = metric_cell(table_rows(doc, "ablation-table"), "mean", "accuracy")
    assert float(cell["attrs"]["data-value"]) == pytest.approx(0.5)
    assert cell["attrs"]["data-n"] == "2"
    assert len(table_rows(doc, "failed-table")) == 1


# ----------------------------------------------------------------------------- escaping, offline


def test_text_is_escaped(tmp_path: Path) -> None:
    nasty = ["<script>alert(1)</script>", "&amp;", '"quoted"', "it's", "<b>bold</b>"]
    spec = {"name": 'x<y>&"z"'}
    runs = [
        {
            "attention": spec,
            "seed": 0,
            "test": {"acc<u>racy": 0.5},
            "primary": "acc<u>racy",
            "examples": [tokens_example("title <i>", nasty)],
        }
    ]
    root = write_ablation_dir(tmp_path / "abl", runs, task_options={"sep": "</td><td>"})
    text = render_report(root, title="My <report> & co")
    assert "<script>alert(1)" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&amp;amp;" in text  # the literal token "&amp;" shows as such
    assert "<b>bold" not in text
    assert "<u>" not in text and "<i>" not in text
    assert "</td><td>" not in text
    assert "<title>My &lt;report&gt; &amp; co</title>" in text
    doc = parse(text)
    toks = [el["text"] for el in doc.find("span", **{"class": "tok"})]
    assert toks == nasty  # parsed back, every token is exactly its text
    (row,) = table_rows(doc, "ablation-table").values()
    assert row[0]["text"] == 'x<y>&"z"'


def test_no_external_resources(ablation: Path, tmp_path: Path) -> None:
    single = write_run_dir(
        tmp_path / "run",
        attention=ADD,
        examples=[
            tokens_example(),
            matrix_example(),
            image_example(),
            hierarchy_example(),
            coattention_example(),
            heads_example(),
        ],
    )
    write_explanation(single)
    for root in (ablation, single):
        text = write_report(root).read_text(encoding="utf-8")
        lowered = text.lower()
        for bad in ("http://", "https://", "//cdn", "ftp://"):
            assert bad not in lowered
        assert not re.search(r"<script[^>]*\bsrc\s*=", lowered)
        assert not re.search(r"<link[^>]*\bhref\s*=", lowered)
        assert "@import" not in lowered and "url(" not in lowered
        # every src= is inline data
        for src in re.findall(r'\bsrc="([^"]*)"', text):
            assert src.startswith("data:image/png;base64,")
        assert "<style>" in text and "<svg" in text


# ----------------------------------------------------------------------------- examples


def decode_png(data: bytes) -> tuple[int, int, list[list[tuple[int, int, int]]]]:
    """A decoder for the 8-bit RGB, filter-0 PNGs the report writes."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        payload = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", payload)
            assert (depth, colour, interlace) == (8, 2, 0)
        elif kind == b"IDAT":
            idat += payload
        pos += 12 + length
    raw = zlib.decompress(idat)
    rows = []
    stride = 1 + 3 * width
    for y in range(height):
        line = raw[y * stride : (y + 1) * stride]
        assert line[0] == 0
        rows.append([tuple(line[1 + 3 * x : 4 + 3 * x]) for x in range(width)])
    return width, height, rows


def test_each_example_kind_is_drawn(tmp_path: Path) -> None:
    root = write_run_dir(
        tmp_path / "run",
        attention=ADD,
        examples=[
            tokens_example("t", ["the", "good", "film"]),
            matrix_example("m"),
            image_example("i"),
            image_example("no picture", with_image=False),
        ],
    )
    text = render_report(root)
    doc = parse(text)
    kinds = [el["attrs"]["data-kind"] for el in doc.find("div", **{"class": "example"})]
    assert kinds == ["tokens", "matrix", "image", "image"]

    # tokens: weights 1/6, 2/6, 3/6; shading relative to the largest (3/6)
    spans = doc.find("span", **{"class": "tok"})
    assert [s["text"] for s in spans] == ["the", "good", "film"]
    assert [float(s["attrs"]["data-weight"]) for s in spans] == pytest.approx([1 / 6, 2 / 6, 0.5])
    # t = 1/3: 255 + (c - 255) / 3 per channel of HEAT_RGB = (204, 17, 102)
    assert "background:rgb(238,176,204)" in spans[0]["attrs"]["style"]
    assert f"background:{HEAT}" in spans[2]["attrs"]["style"]

    # matrix: 2 x 3 cells, row and column labels, shading relative to the matrix's max 0.85
    cells = doc.find("td", **{"class": "cell"})
    assert len(cells) == 6
    assert [float(c["attrs"]["data-weight"]) for c in cells] == pytest.approx(
        [0.8, 0.15, 0.05, 0.1, 0.85, 0.05]
    )
    assert f"background:{HEAT}" in cells[4]["attrs"]["style"]
    assert [th["text"] for th in doc.find("th", **{"class": "col"})] == ["the", "house", "</s>"]
    assert [th["text"] for th in doc.find("th", **{"class": "row"})] == ["la", "casa"]

    # image: the PNG holds the fixture's pixels (x / 7, y / 7, 0.5), and a 2 x 2 overlay
    (img,) = doc.find("img")
    payload = base64.b64decode(img["attrs"]["src"].split(",", 1)[1])
    width, height, pixels = decode_png(payload)
    assert (width, height) == (8, 8)
    assert pixels[0][0] == (0, 0, 128)
    assert pixels[7][7] == (255, 255, 128)
    assert pixels[2][5] == (round(5 / 7 * 255), round(2 / 7 * 255), 128)
    rects = doc.find("rect")
    assert len(rects) == 8  # 4 over the picture, 4 for the example without one
    # overlay opacity grows with the weight (0.1 .. 0.4 of the largest)
    opacities = [float(r["attrs"]["fill-opacity"]) for r in rects[:4]]
    assert opacities == pytest.approx([0.75 * w / 0.4 for w in (0.1, 0.2, 0.3, 0.4)], abs=1e-3)
    assert rects[7]["attrs"]["fill"] == HEAT
    assert float(rects[1]["attrs"]["x"]) > float(rects[0]["attrs"]["x"])  # cell 1 is right of 0
    assert float(rects[2]["attrs"]["y"]) > float(rects[0]["attrs"]["y"])  # cell 2 is below 0
    assert "gold: <b>circle</b>" in text and "predicted: <b>square</b>" in text


def test_examples_first_seed_and_max_examples(ablation: Path) -> None:
    doc = parse(render_report(ablation, max_examples=1))
    titles = [el["text"] for el in doc.find("h4")]
    # per mechanism, the first seed's examples, at most one; dot has none
    assert titles == ["mean seed 0", "additive seed 0"]
    doc = parse(render_report(ablation))
    assert [el["text"] for el in doc.find("h4")] == [
        "mean seed 0",
        "additive seed 0",
        "alignment #0",
    ]


# ----------------------------------------------------------------------------- curves, cost


def test_learning_curves_are_means_over_seeds(ablation: Path) -> None:
    text = render_report(ablation)
    doc = parse(text)
    svgs = doc.find("svg", **{"class": "chart"})
    assert [s["attrs"]["aria-label"] for s in svgs] == ["train loss", "dev accuracy"]
    titles = [el["text"] for el in doc.find("title")]
    # mean's train loss: epoch 1: (1 + 2 + 3) / 3 = 2, epoch 2: (0.5 + 1.5 + 2.5) / 3 = 1.5
    assert "mean: 2.0000 (epoch 1)" in titles
    assert "mean: 1.5000 (epoch 2)" in titles
    # mean's dev accuracy at epoch 2: (0.6 + 0.7 + 0.8) / 3 = 0.7
    assert "mean: 0.7000 (epoch 2)" in titles
    # legend: one entry per mechanism with a history
    for svg_text in re.findall(r'<svg class="chart".*?</svg>', text, re.S):
        for label in ("mean", "align=soft,score=additive", "align=soft,score=dot"):
            assert f">{label}</text>" in svg_text
        assert svg_text.count("<polyline") == 3


def test_cost_table_means(ablation: Path) -> None:
    rows = table_rows(parse(render_report(ablation)), "cost-table")
    cells = {c["attrs"]["data-key"]: c for c in rows[next(iter(rows))] if "data-key" in c["attrs"]}
    # mean's parameters 100, 200, 300 -> 200; s/epoch 1, 2, 3 -> 2; memory not measured
    assert cells["parameters"]["text"] == "200"
    assert float(cells["seconds_per_epoch"]["attrs"]["data-value"]) == pytest.approx(2.0)
    assert cells["eval_ms_per_example"]["text"] == "0.250"
    assert cells["peak_memory_mb"]["text"] == "n/a"


# ----------------------------------------------------------------------------- inputs, API, CLI


def test_single_run_directory(tmp_path: Path) -> None:
    root = write_run_dir(
        tmp_path / "run",
        attention=ADD,
        seed=7,
        test={"accuracy": 0.875},
        examples=[tokens_example()],
    )
    out = write_report(root, tmp_path / "out" / "r.html", title="one run")
    assert out == tmp_path / "out" / "r.html"
    doc = parse(out.read_text(encoding="utf-8"))
    rows = table_rows(doc, "ablation-table")
    cell = metric_cell(rows, "align=soft,score=additive", "accuracy")
    assert cell["text"].strip() == "0.8750"
    assert "best" in cell["attrs"]["class"]
    assert doc.find("span", **{"class": "tok"})
    assert "toy" in doc.find("dd")[0]["text"]
    text = out.read_text(encoding="utf-8")
    assert "2.x-test" in text and "3.11.test" in text  # versions in the header
    assert "seed 7" in text


def test_missing_and_wrong_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such directory"):
        write_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match=r"run\.json.*ablation\.json"):
        write_report(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    with pytest.raises(ReportError, match="cannot read"):
        write_report(bad)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_examples": -1}, "max_examples must be an int >= 0, got -1"),
        ({"max_examples": "3"}, "max_examples must be an int >= 0, got '3'"),
        ({"max_examples": True}, "max_examples must be an int >= 0, got True"),
        ({"title": 5}, "title must be text or None, got int"),
        ({"sections": ["x"]}, "sections must hold Section objects, got 'x'"),
        ({"sections": "overview"}, "sections must be a sequence of Section"),
        ({"on_warning": 3}, "on_warning must be callable, got int"),
        ({"out": ""}, "out must not be empty"),
    ],
)
def test_bad_settings_are_one_line_before_anything_is_read(
    ablation: Path, settings: dict, message: str
) -> None:
    with pytest.raises((ConfigError, TypeError), match=re.escape(message)):
        write_report(ablation, **settings)
    assert not (ablation / "report.html").exists()


def test_an_empty_path_or_an_out_folder_is_refused(
    ablation: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(ablation)  # "" would be this folder
    with pytest.raises(ConfigError, match="path must not be empty"):
        write_report("")
    with pytest.raises(ConfigError, match="is a folder: name the HTML file"):
        write_report(ablation, tmp_path)
    assert not (ablation / "report.html").exists()
    assert write_report(ablation, max_examples=0) == ablation / "report.html"  # 0 is allowed


def test_cli(ablation: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    result = runner.invoke(report_command, [str(ablation)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(ablation / "report.html")
    assert (ablation / "report.html").is_file()
    out = tmp_path / "x.html"
    result = runner.invoke(report_command, [str(ablation), "--out", str(out), "--title", "T<1>"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    assert "<h1>T&lt;1&gt;</h1>" in out.read_text(encoding="utf-8")
    (tmp_path / "empty").mkdir()
    result = runner.invoke(report_command, [str(tmp_path / "empty")])
    assert result.exit_code == 2  # bad input: "error: ...", exit 2 as every attnlab command
    assert "neither a run directory" in result.output
    result = runner.invoke(report_command, [str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "no such directory" in result.output
    # an empty DIR (an unset shell variable) is refused, not the working folder's report
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    result = runner.invoke(report_command, [""])
    assert result.exit_code == 2 and "is empty" in result.output
    assert list((tmp_path / "cwd").iterdir()) == []


def test_reading_a_wal_store_leaves_no_wal_files(ablation: Path) -> None:
    """results.sqlite is a WAL database (attnlab.lab.store): reading it for the report must
    not leave its -wal and -shm files behind (a read-only connection does)."""
    con = sqlite3.connect(ablation / "results.sqlite")
    assert con.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    con.close()
    assert not list(ablation.glob("results.sqlite-*"))  # a closed store leaves none
    write_report(ablation)
    assert not list(ablation.glob("results.sqlite-*"))


def test_sections_are_extensible(ablation: Path) -> None:
    extra = Section(
        "viewer",
        "Viewer",
        lambda ctx: f"<p id='v'>{len(ctx.data.runs)} runs</p>",
        css="#v { color: #123456; }",
        js="attnlabReport.onReady(function () {});",
    )
    saved = list(SECTIONS)
    try:
        add_section(extra, after="ablation")
        ids = [s.id for s in SECTIONS]
        assert ids.index("viewer") == ids.index("ablation") + 1
        text = render_report(ablation)
        assert "<p id='v'>8 runs</p>" in text and "#v { color: #123456; }" in text
        assert text.index('id="ablation"') < text.index('id="viewer"') < text.index('id="curves"')
        with pytest.raises(KeyError):
            add_section(extra, before="nope")
    finally:
        SECTIONS[:] = saved
    text = render_report(ablation, sections=[s for s in SECTIONS if s.id == "ablation"])
    assert 'id="ablation"' in text and 'id="curves"' not in text


def test_copied_directory_reports_the_same(ablation: Path, tmp_path: Path) -> None:
    # run_dir paths in the store may point elsewhere: the report goes by run_id
    copy = tmp_path / "copy"
    shutil.copytree(ablation, copy)
    shutil.rmtree(ablation)
    rows = table_rows(parse(render_report(copy)), "ablation-table")
    assert float(metric_cell(rows, "mean", "accuracy")["attrs"]["data-value"]) == pytest.approx(0.7)


def test_fixture_layout_matches_the_documented_one(ablation: Path) -> None:
    # the fixtures must keep to docs/lab/report.md (the contract the report reads)
    run = json.loads((ablation / "runs" / run_id(MEAN, 0) / "run.json").read_text())
    assert set(run) == {
        "task", "task_options", "attention", "label", "seed", "device", "status", "started",
        "finished", "versions", "error",
    }  # fmt: skip
    con = sqlite3.connect(ablation / "results.sqlite")
    cols = [r[1] for r in con.execute("PRAGMA table_info(runs)")]
    con.close()
    assert cols == [
        "run_id", "task", "label", "attention_json", "seed", "status", "dev_json",
        "test_json", "cost_json", "run_dir", "finished", "error",
    ]  # fmt: skip


# ----------------------------------------------------------------------------- end to end


def test_end_to_end_with_the_trainer(tmp_path: Path) -> None:
    """Train the toy task with train_run (2 mechanisms x 2 seeds) and report on it."""
    training = pytest.importorskip("attnlab.lab.training")
    pytest.importorskip("toy_task")  # registers the task "toy"
    results = {}
    for spec in ({"name": "mean"}, {"name": "tanh"}):
        for seed in (0, 1):
            out = tmp_path / "abl" / "runs" / run_id(spec, seed)
            res = training.train_run(
                "toy", spec, seed=seed, options={"epochs": 2}, out_dir=out, progress=False
            )
            results.setdefault(res.label, []).append(res)
    report = write_report(tmp_path / "abl")
    text = report.read_text(encoding="utf-8")
    doc = parse(text)
    rows = table_rows(doc, "ablation-table")
    assert sorted(rows) == ["mean", "tanh"]
    for label, runs in results.items():
        accs = [r.test["accuracy"] for r in runs]
        cell = metric_cell(rows, label, "accuracy")
        assert float(cell["attrs"]["data-value"]) == pytest.approx((accs[0] + accs[1]) / 2)
        assert float(cell["attrs"]["data-std"]) == pytest.approx(abs(accs[0] - accs[1]) / 2**0.5)
        assert metric_cell(rows, label, "f1")["attrs"]["data-n"] == "2"
    # curves of both mechanisms, heatmaps of the first seed (the toy task gives 4 examples)
    assert len(doc.find("svg", **{"class": "chart"})) == 2
    assert len(doc.find("div", **{"class": "example"})) == 8
    assert HEAT in text
    assert not table_rows(doc, "failed-table")
    # the single run directory reports too
    single = write_report(results["tanh"][0].run_dir, tmp_path / "one.html")
    rows = table_rows(parse(single.read_text(encoding="utf-8")), "ablation-table")
    assert list(rows) == ["tanh"]


def test_end_to_end_with_the_ablation_runner(tmp_path: Path) -> None:
    """The same through attnlab.lab.ablation.run_ablation (its results.sqlite decides)."""
    ablation = pytest.importorskip("attnlab.lab.ablation")
    pytest.importorskip("toy_task")
    result = ablation.run_ablation(
        "toy",
        [{"name": "mean"}, {"name": "dot"}],
        [0, 1],
        out_dir=tmp_path / "abl",
        options={"epochs": 2},
        progress=False,
    )
    text = write_report(result.out_dir).read_text(encoding="utf-8")
    doc = parse(text)
    rows = table_rows(doc, "ablation-table")
    assert list(rows) == ["mean", "dot"]  # the grid's order
    assert all(cells[-2]["text"] == "2" for cells in rows.values())  # two seeds each
    con = sqlite3.connect(result.out_dir / "results.sqlite")
    stored = con.execute("SELECT label, test_json FROM runs WHERE status = 'done'").fetchall()
    con.close()
    for label in rows:
        accs = [json.loads(t)["accuracy"] for lab, t in stored if lab == label]
        cell = metric_cell(rows, label, "accuracy")
        assert float(cell["attrs"]["data-value"]) == pytest.approx(sum(accs) / len(accs))


# ----------------------------------------------------------------------------- viewer


def viewer_json(text: str) -> tuple[str, dict]:
    """The raw text of the viewer's JSON block and its parsed value."""
    (raw,) = re.findall(
        r'<script type="application/json" id="viewer-data">(.*?)</script>', text, re.S
    )
    return raw, json.loads(raw)


def test_viewer_embeds_every_example_of_every_run(ablation: Path) -> None:
    text = render_report(ablation, max_examples=1)
    _, payload = viewer_json(text)
    assert payload["heat"] == list(theme.HEAT_RGB)
    # every finished run with examples, all seeds, all examples (max_examples only limits
    # the static section); dot has no examples, so it is not in the viewer
    got = {
        (m["label"], r["seed"]): [e["title"] for e in r["examples"]]
        for m in payload["mechanisms"]
        for r in m["runs"]
    }
    assert got == {
        **{("mean", s): [f"mean seed {s}"] for s in (0, 1, 2)},
        **{
            ("align=soft,score=additive", s): [f"additive seed {s}", "alignment #0"]
            for s in (0, 1, 2)
        },
    }
    assert [m["label"] for m in payload["mechanisms"]] == ["mean", "align=soft,score=additive"]
    runs = {(m["label"], r["seed"]): r for m in payload["mechanisms"] for r in m["runs"]}
    assert runs[("mean", 1)]["run_id"] == run_id(MEAN, 1)
    matrix = runs[("align=soft,score=additive", 2)]["examples"][1]
    assert matrix["kind"] == "matrix"
    assert matrix["rows"] == ["la", "casa"] and matrix["cols"] == ["the", "house", "</s>"]
    assert matrix["weights"] == [[0.8, 0.15, 0.05], [0.1, 0.85, 0.05]]
    assert matrix["label"] == "la casa"
    tokens = runs[("mean", 0)]["examples"][0]
    assert tokens["weights"][0] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    # the viewer's section and its script are in the page, once
    assert text.count('id="viewer-data"') == 1 and text.count('id="attention-viewer"') == 1
    assert "attnlabReport.onReady" in text


def test_viewer_json_is_escaped(tmp_path: Path) -> None:
    nasty = ["</script><script>alert(1)</script>", "<!--", "a&b", "line\u2028sep", "'\"\\"]
    example = tokens_example("t </script>", nasty)
    example["weights"] = [[0.1, float("nan"), 0.3, float("inf"), 0.6]]
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[example])
    text = render_report(root)
    raw, payload = viewer_json(text)
    # no character that could end or confuse the script element
    for bad in ("<", ">", "&", "\u2028", "\u2029"):
        assert bad not in raw
    assert "\\u003c/script\\u003e" in raw
    # only the page's own script elements close: as many </script> as <script
    assert text.count("</script>") == len(re.findall(r"<script[ >]", text))
    (ex,) = payload["mechanisms"][0]["runs"][0]["examples"]
    assert ex["cols"] == nasty and ex["title"] == "t </script>"
    assert ex["weights"] == [[0.1, None, 0.3, None, 0.6]]  # JSON has no NaN / Infinity
    assert "NaN" not in raw and "Infinity" not in raw


def test_script_json_by_hand() -> None:
    assert script_json({"a": "</script>"}) == '{"a":"\\u003c/script\\u003e"}'
    assert script_json(["&", float("nan")]) == '["\\u0026",null]'
    assert json.loads(script_json({"x": "\u2028<>"})) == {"x": "\u2028<>"}


def test_viewer_images_are_png_data_uris(tmp_path: Path) -> None:
    root = write_run_dir(
        tmp_path / "run",
        attention=ADD,
        examples=[image_example(), image_example("bare", with_image=False)],
    )
    _, payload = viewer_json(render_report(root))
    pic, bare = payload["mechanisms"][0]["runs"][0]["examples"]
    assert pic["grid"] == [2, 2] and bare["image"] is None
    assert pic["image"].startswith("data:image/png;base64,")
    width, height, pixels = decode_png(base64.b64decode(pic["image"].split(",", 1)[1]))
    assert (width, height) == (8, 8) and pixels[7][7] == (255, 255, 128)


def test_viewer_is_left_out_without_examples(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    text = render_report(root)
    assert 'id="viewer-data"' not in text and '<section id="viewer"' not in text


# ----------------------------------------------------------------------------- extra views


def test_hierarchy_view(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[hierarchy_example()])
    text = render_report(root)
    doc = parse(text)
    assert len(doc.find("div", **{"class": "view hierarchy"})) == 1
    sentences = doc.find("tr", **{"class": "sentence"})
    assert [float(s["attrs"]["data-weight"]) for s in sentences] == [0.25, 0.75]
    # bars relative to the largest sentence weight: 80 px * 0.25 / 0.75, 80 px
    bars = re.findall(r'<span class="wbar" style="width:80px"><span style="width:([\d.]+)px', text)
    assert [float(b) for b in bars] == pytest.approx([26.7, 80.0], abs=0.05)
    words = doc.find("span", **{"class": "tok word"})
    assert [w["text"] for w in words] == ["it", "rained", "great", "<b>fun</b>", "though"]
    assert [float(w["attrs"]["data-weight"]) for w in words] == [0.4, 0.6, 0.5, 0.3, 0.2]
    # word shading is relative to the sentence's largest word: "rained" (0.6) and "great"
    # (0.5) both get the full heat colour; "it": t = 2/3 -> 255 + (c - 255) * 2/3
    assert f"background:{HEAT}" in words[1]["attrs"]["style"]
    assert f"background:{HEAT}" in words[2]["attrs"]["style"]
    assert "background:rgb(221,96,153)" in words[0]["attrs"]["style"]
    # the consumed keys are not repeated as text; the others are
    assert "document_id: doc-7" in text
    assert "sentence_weights:" not in text
    _, payload = viewer_json(text)
    views = payload["mechanisms"][0]["runs"][0]["examples"][0]["views"]
    assert views["hierarchy"]["sentence_weights"] == [0.25, 0.75]
    assert views["hierarchy"]["sentences"][1] == ["great", "<b>fun</b>", "though"]


def test_coattention_view(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[coattention_example()])
    text = render_report(root)
    doc = parse(text)
    assert len(doc.find("div", **{"class": "view coattention"})) == 1
    side_a = [
        el
        for el in doc.find("span", **{"class": "tok"})
        if any(p["attrs"].get("class") == "tokens side-a" for p in el["parents"])
    ]
    side_b = [
        el
        for el in doc.find("span", **{"class": "tok"})
        if any(p["attrs"].get("class") == "tokens side-b" for p in el["parents"])
    ]
    assert [(s["text"], float(s["attrs"]["data-weight"])) for s in side_a] == [
        ("battery", 0.7),
        ("life", 0.3),
    ]
    assert [s["text"] for s in side_b] == ["the", "battery", "lasts"]
    assert ">target</span>" in text and ">context</span>" in text
    cells = doc.find("td", **{"class": "acell"})
    assert [float(c["attrs"]["data-weight"]) for c in cells] == [-0.5, 1.5, 0.25, 0.0, 0.5, 1.0]
    # shaded from the smallest (-0.5, white) to the largest (1.5, the heat colour);
    # 0.5 is half-way: 255 + (c - 255) / 2, rounded half to even: (230, 136, 178)
    assert "background:rgb(255,255,255)" in cells[0]["attrs"]["style"]
    assert f"background:{HEAT}" in cells[1]["attrs"]["style"]
    assert "background:rgb(230,136,178)" in cells[4]["attrs"]["style"]
    _, payload = viewer_json(text)
    co = payload["mechanisms"][0]["runs"][0]["examples"][0]["views"]["coattention"]
    assert co["affinity"] == [[-0.5, 1.5, 0.25], [0.0, 0.5, 1.0]]
    assert (co["name_a"], co["name_b"]) == ("target", "context")


def test_heads_view(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[heads_example()])
    text = render_report(root)
    doc = parse(text)
    tables = doc.find("table", **{"class": "heat mini"})
    assert len(tables) == 3
    cells = doc.find("td", **{"class": "hcell"})
    assert len(cells) == 18
    values = [float(c["attrs"]["data-weight"]) for c in cells]
    assert values[:6] == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert values[12:] == [0.2, 0.3, 0.5, 0.6, 0.3, 0.1]
    # each head relative to its own largest weight: head 2's 0.6 is full heat
    assert f"background:{HEAT}" in cells[15]["attrs"]["style"]
    assert f"background:{HEAT}" in cells[6]["attrs"]["style"]  # head 1's 0.5
    names = [el["text"] for el in doc.find("div", **{"class": "muted small"})]
    assert names == ["h0", "h1", "h2"]
    _, payload = viewer_json(text)
    heads = payload["mechanisms"][0]["runs"][0]["examples"][0]["views"]["heads"]
    assert heads["rows"] == ["la", "casa"] and heads["cols"] == ["the", "house", "</s>"]
    assert len(heads["heads"]) == 3


def test_words_view_and_mismatched_extras(tmp_path: Path) -> None:
    words = image_example("vqa")
    words["extra"] = {"words": ["what", "shape"], "word_weights": [0.25, 0.75], "qt": "shape"}
    broken = tokens_example("broken")
    broken["extra"] = {
        "sentences": [["a", "b"]],
        "word_weights": [[0.5]],  # one weight for two words: not a hierarchy
        "sentence_weights": [1.0],
        "tokens_a": ["x"],
        "weights_a": [1.0],  # no side b: not a co-attention
        "heads": [[[1.0, 0.0]], [[0.5]]],  # heads of different shapes
    }
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[words, broken])
    text = render_report(root)
    doc = parse(text)
    (view,) = doc.find("div", **{"class": "view words"})
    toks = [el for el in doc.find("span", **{"class": "tok"}) if view in el["parents"]]
    assert [(t["text"], float(t["attrs"]["data-weight"])) for t in toks] == [
        ("what", 0.25),
        ("shape", 0.75),
    ]
    assert "qt: shape" in text
    assert not doc.find("div", **{"class": "view hierarchy"})
    assert not doc.find("div", **{"class": "view coattention"})
    assert not doc.find("div", **{"class": "view heads"})
    # the malformed keys are still shown as text
    assert "sentence_weights: [1.0]" in text and "tokens_a: [&quot;x&quot;]" in text


# ----------------------------------------------------------------------------- explanation


def cells_by_key(doc: Cells, table_id: str) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for label, cells in table_rows(doc, table_id).items():
        out[label] = {
            c["attrs"]["data-key"]: (
                float(c["attrs"]["data-value"]) if c["attrs"]["data-value"] else None
            )
            for c in cells
            if "data-key" in c["attrs"]
        }
    return out


def test_explanation_section(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD, examples=[tokens_example()])
    write_explanation(root)
    text = render_report(root)
    doc = parse(text)
    assert '<section id="explanation">' in text
    e = EXPLANATION
    kendall = cells_by_key(doc, "explain-0-kendall")
    assert kendall == {
        k: {"mean": v["mean"], "std": v["std"], "significant": v["significant"], "n": v["n"]}
        for k, v in e["kendall"].items()
    }
    summaries = cells_by_key(doc, "explain-0-summaries")
    assert summaries["permutation: median output TVD"] == {
        "mean": 0.05,
        "std": 0.02,
        "median": 0.04,
        "n": 4,
    }
    assert summaries["adversarial attention (TVD ≤ 0.01): max JSD"] == {
        "mean": 0.5,
        "std": 0.1,
        "median": 0.55,
        "n": 4,
    }
    adv = cells_by_key(doc, "explain-0-adversarial")
    assert adv["fraction with max JSD > bound / 2"] == {"fraction_above_half_bound": 0.75}
    assert adv["JSD upper bound"]["jsd_bound"] == pytest.approx(0.6931471805599453)
    uniform = cells_by_key(doc, "explain-0-uniform")
    assert uniform["learned"] == {"accuracy": 0.8, "f1": 0.75}
    assert uniform["uniform"] == {"accuracy": 0.7, "f1": 0.6}
    assert uniform["learned − uniform"] == pytest.approx({"accuracy": 0.1, "f1": 0.15})
    frozen = cells_by_key(doc, "explain-0-frozen")
    assert frozen == {
        "uniform": {"accuracy": 0.6, "f1": 0.55},
        "learned": {"accuracy": 0.7, "f1": 0.65},
        "transferred": {"accuracy": 0.8, "f1": 0.78},
    }
    sweep = cells_by_key(doc, "explain-0-advmodels")
    assert sweep == {
        "0.0": {"mean_tvd": 0.01, "mean_jsd": 0.02, "accuracy": 0.8},
        "0.5": {"mean_tvd": 0.03, "mean_jsd": 0.3, "accuracy": 0.79},
        "1.0": {"mean_tvd": 0.04, "mean_jsd": 0.45, "accuracy": 0.77},
    }
    seeds = cells_by_key(doc, "explain-0-seeds")
    assert seeds == {"1 other run(s)": {"mean_jsd": 0.125, "mean_tvd": 0.0625, "n": 2.0}}
    assert "<code>other-run</code>" in text
    # the permutation and adversarial plots are drawn as SVG: their PNGs are not repeated
    assert [el for el in doc.find("img") if el["attrs"].get("class") == "plot"] == []


def test_explanation_png_plots_without_an_svg_are_inlined_once(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    result = json.loads(json.dumps(EXPLANATION))
    names = ["permutation.png", "adversarial.png", "adversarial_models.png"]
    result["plots"] = names
    write_explanation(root, result)
    doc = parse(render_report(root))
    svgs = [el["attrs"]["aria-label"] for el in doc.find("svg", **{"class": "scatter"})]
    assert svgs[:2] == ["permutation test", "adversarial attention"]
    figs = [el for el in doc.find("img") if el["attrs"].get("class") == "plot"]
    # the adversarial-models plot has no SVG: inline, its data URI decodes to the file
    assert [f["attrs"]["alt"] for f in figs] == ["adversarial_models.png"]
    data = base64.b64decode(figs[0]["attrs"]["src"].split(",", 1)[1])
    assert data == (root / "explanation" / "adversarial_models.png").read_bytes()
    assert data == tiny_png((90, 200, 30))
    # without the numbers of a scatter (e.g. an older explain), its PNG is shown
    del result["permutation"]
    write_explanation(root, result)
    figs = [
        el for el in parse(render_report(root)).find("img") if el["attrs"].get("class") == "plot"
    ]
    assert [f["attrs"]["alt"] for f in figs] == ["permutation.png", "adversarial_models.png"]


def test_explanation_scatter_svg(tmp_path: Path) -> None:
    root = write_run_dir(tmp_path / "run", attention=ADD)
    write_explanation(root, plots=False)
    text = render_report(root)
    svgs = re.findall(r'<svg class="scatter".*?</svg>', text, re.S)
    labels = [re.search(r'aria-label="([^"]*)"', s).group(1) for s in svgs]
    assert labels == ["permutation test", "adversarial attention", "seed variance per instance"]
    points = [
        (float(x), float(y))
        for x, y in re.findall(r'class="pt" cx="([\d.]+)" cy="([\d.]+)"', svgs[0])
    ]
    # max weight 0.3, 0.5, 0.2, 0.9 against median TVD 0.01, 0.04, 0.05, 0.1
    assert len(points) == 4
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    assert sorted(range(4), key=lambda i: xs[i]) == [2, 0, 1, 3]
    assert sorted(range(4), key=lambda i: -ys[i]) == [0, 1, 2, 3]  # SVG y grows downwards
    # equal steps in the data are equal steps on the page: x 0.3 -> 0.5 is twice 0.2 -> 0.3
    assert (xs[1] - xs[0]) == pytest.approx(2 * (xs[0] - xs[2]), abs=0.02)
    titles = re.findall(r"<title>([^<]*)</title>", svgs[0])
    assert titles == ["0.3000, 0.0100", "0.5000, 0.0400", "0.2000, 0.0500", "0.9000, 0.1000"]
    assert 'class="plot"' not in text  # no PNGs written: the SVGs stand alone


def test_explanation_every_seed_and_missing_values(tmp_path: Path) -> None:
    runs = [{"attention": ADD, "seed": s, "test": {"accuracy": 0.5}} for s in (0, 1)]
    runs.append({"attention": MEAN, "seed": 0, "test": {"accuracy": 0.5}})
    root = write_ablation_dir(tmp_path / "abl", runs)
    partial = json.loads(json.dumps(EXPLANATION))
    partial["kendall"]["attention-loo"]["mean"] = float("nan")  # written as NaN by json
    del partial["seed_variance"]
    write_explanation(root / "runs" / run_id(ADD, 1), partial, plots=False)
    write_explanation(root / "runs" / run_id(ADD, 0), plots=False)
    doc = parse(render_report(root))
    blocks = [el["attrs"]["data-run"] for el in doc.find("div", **{"class": "explanation"})]
    assert blocks == [run_id(ADD, 0), run_id(ADD, 1)]
    kendall = cells_by_key(doc, "explain-1-kendall")
    assert kendall["attention-loo"]["mean"] is None
    (cell,) = [
        c
        for c in table_rows(doc, "explain-1-kendall")["attention-loo"]
        if c["attrs"].get("data-key") == "mean"
    ]
    assert cell["text"] == "n/a"
    assert table_rows(doc, "explain-0-seeds") and not table_rows(doc, "explain-1-seeds")


def test_no_explanation_no_section(ablation: Path) -> None:
    assert '<section id="explanation">' not in render_report(ablation)


def test_ablation_analysis_pairs_by_seed(tmp_path):
    """The analysis section compares each mechanism with the baselines by seed: hand values
    for the mean difference, d_z and the sign-flip p."""
    from report_fixtures import write_ablation_dir

    from attnlab.lab.report import load_report_data, paired_analysis

    acc = {
        "mean": [0.70, 0.72, 0.71],
        "tanh": [0.75, 0.78, 0.74],  # differences 0.05, 0.06, 0.03
    }
    runs = [
        {"attention": {"name": name}, "seed": seed, "test": {"accuracy": v, "f1": v}}
        for name, values in acc.items()
        for seed, v in enumerate(values)
    ]
    root = write_ablation_dir(tmp_path / "abl", runs)
    data = load_report_data(root)
    analysis = paired_analysis(data, "accuracy")
    assert set(analysis) == {"mean", "tanh"}  # the baseline and the best mechanism
    c = analysis["mean"]["tanh"]
    d = [0.05, 0.06, 0.03]
    mean = sum(d) / 3
    sd = (sum((x - mean) ** 2 for x in d) / 2) ** 0.5
    assert c["n"] == 3
    assert c["diff"] == pytest.approx(mean)
    assert c["effect_size"] == pytest.approx(mean / sd)
    assert c["perm_p"] == pytest.approx(0.25)  # all three differences positive: 2 of 8 flips
    html = render_report(root)
    assert 'id="analysis-mean"' in html and "Cohen" in html


def test_report_paths_expand_the_home_folder(tmp_path, monkeypatch):
    from attnlab.lab.report import load_report_data

    monkeypatch.setenv("HOME", str(tmp_path))
    write_run_dir(tmp_path / "r", attention=ADD)
    assert load_report_data("~/r").root == tmp_path / "r"
    assert Path(write_report("~/r", out="~/page.html")) == tmp_path / "page.html"
    assert (tmp_path / "page.html").is_file()
    monkeypatch.chdir(tmp_path / "r")  # the default file goes beside the runs, not to ./~
    assert Path(write_report("~/r")) == tmp_path / "r" / "report.html"
    assert not (tmp_path / "r" / "~").exists()
    with pytest.raises(TypeError, match="path must be a path"):
        load_report_data(7)
