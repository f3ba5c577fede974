"""The report in headless Chromium: it renders without console errors, and the ablation
table and a heatmap are visible in a screenshot.

Both checks have a negative control (a page with a deliberate JavaScript error; a report
without attention examples), so that a check which cannot fail is caught. Skipped when no
Chromium is installed (Debian package ``chromium``).
"""

from __future__ import annotations

import re
from pathlib import Path

from report_fixtures import (
    colour_pixels,
    console_errors,
    image_example,
    matrix_example,
    needs_chromium,
    run_chromium,
    tokens_example,
    write_ablation_dir,
)

from attnlab.lab.report import theme, write_report

pytestmark = needs_chromium


def load_page(page: Path, tmp: Path) -> tuple[list[str], Path]:
    """Open ``page`` once: its JavaScript errors (console error lines Chromium logs to
    stderr, and what the page's own recorder -- window.onerror, console.error -- wrote into
    #report-errors, read back with --dump-dom) and a 1280 x 2400 screenshot."""
    shot = tmp / f"{page.stem}.png"
    dom, stderr = run_chromium(
        page.resolve().as_uri(),
        tmp,
        "--dump-dom",
        f"--screenshot={shot}",
        "--window-size=1280,2400",
    )
    assert "</body>" in dom.lower(), f"no DOM dumped:\n{stderr[-2000:]}"
    assert shot.is_file(), f"chromium wrote no screenshot:\n{stderr[-2000:]}"
    errors = console_errors(stderr)
    recorded = re.search(r'<pre id="report-errors" data-count="(\d+)">(.*?)</pre>', dom, re.S)
    assert recorded, "the report's error recorder is missing from the DOM"
    if recorded.group(1) != "0":
        errors.append(recorded.group(2))
    return errors, shot


def make_ablation(root: Path, *, examples: bool) -> Path:
    """Two mechanisms x two seeds and a failed run; with or without attention examples."""
    shown = [
        tokens_example(tokens=["a", "<very>", "good", "film"]),
        matrix_example(),
        image_example(),
    ]
    runs = []
    for spec, accs in (({"name": "mean"}, (0.6, 0.7)), ({"score": "additive"}, (0.8, 0.9))):
        for seed, acc in enumerate(accs):
            runs.append(
                {
                    "attention": spec,
                    "seed": seed,
                    "test": {"accuracy": acc, "loss": 1 - acc},
                    "examples": shown if examples else [],
                }
            )
    runs.append({"attention": {"score": "dot"}, "seed": 0, "status": "failed", "error": "x"})
    return write_ablation_dir(root, runs)


def test_report_renders_without_errors_with_table_and_heatmap(tmp_path: Path) -> None:
    report = write_report(make_ablation(tmp_path / "abl", examples=True))
    errors, shot = load_page(report, tmp_path)
    assert errors == []
    header = colour_pixels(shot, theme.TABLE_HEADER_RGB)
    heat = colour_pixels(shot, theme.HEAT_RGB)
    assert header > 2000, f"table header colour: {header} pixels"
    assert heat > 300, f"heatmap colour: {heat} pixels"


def test_negative_controls(tmp_path: Path) -> None:
    # a deliberate JavaScript error in the report must be seen by the error check
    report = write_report(make_ablation(tmp_path / "abl", examples=True))
    broken = tmp_path / "broken.html"
    broken.write_text(
        report.read_text(encoding="utf-8").replace(
            "</body>", "<script>undefinedFunctionForTheTest();</script></body>"
        ),
        encoding="utf-8",
    )
    errors, _ = load_page(broken, tmp_path)
    assert errors and all("undefinedFunctionForTheTest" in e for e in errors)

    # the same ablation without attention examples has the table but no heatmap: the heat
    # colour must be absent from its screenshot
    bare = write_report(make_ablation(tmp_path / "bare", examples=False), tmp_path / "bare.html")
    errors, shot = load_page(bare, tmp_path)
    assert errors == []
    assert colour_pixels(shot, theme.TABLE_HEADER_RGB) > 2000
    assert colour_pixels(shot, theme.HEAT_RGB) == 0
