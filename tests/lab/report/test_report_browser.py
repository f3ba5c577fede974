"""The report in headless Chromium: it renders without console errors, and the ablation
table and a heatmap are visible in a screenshot.

Both checks have a negative control (a page with a deliberate JavaScript error; a report
without attention examples), so that a check which cannot fail is caught. Skipped when no
Chromium is installed (Debian package ``chromium``).
"""

from __future__ import annotations

from pathlib import Path

from report_fixtures import (
    colour_pixels,
    image_example,
    matrix_example,
    needs_chromium,
    open_report_page,
    tokens_example,
    write_ablation_dir,
)

from attnlab.lab.report import theme, write_report

pytestmark = needs_chromium


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
    _, errors, shot = open_report_page(report, tmp_path)
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
    _, errors, _ = open_report_page(broken, tmp_path)
    assert errors and all("undefinedFunctionForTheTest" in e for e in errors)

    # the same ablation without attention examples has the table but no heatmap: the heat
    # colour must be absent from its screenshot
    bare = write_report(make_ablation(tmp_path / "bare", examples=False), tmp_path / "bare.html")
    _, errors, shot = open_report_page(bare, tmp_path)
    assert errors == []
    assert colour_pixels(shot, theme.TABLE_HEADER_RGB) > 2000
    assert colour_pixels(shot, theme.HEAT_RGB) == 0
