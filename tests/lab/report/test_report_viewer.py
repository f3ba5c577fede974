"""The interactive attention viewer of the report in headless Chromium.

* With the fragment ``#viewer-selftest`` the page dispatches real click events (the next
  button, a matrix row, a token, the compare selector) and writes the viewer's state before
  and after each into ``#viewer-selftest``; read back with ``--dump-dom``, the state must
  have changed the way each click says. Negative control: the same page without the
  fragment stays on the first example with nothing selected.
* No console errors, and the viewer's toolbar colour is in the screenshot. Negative control:
  without JavaScript (the page with its scripts removed) the viewer colour is absent while
  the static heatmaps (the heat colour) remain -- the page degrades to the static report.

Skipped when no Chromium is installed (Debian package ``chromium``).
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from report_fixtures import (
    coattention_example,
    colour_pixels,
    heads_example,
    hierarchy_example,
    image_example,
    matrix_example,
    needs_chromium,
    open_report_page,
    tokens_example,
    write_ablation_dir,
)

from attnlab.lab.report import theme, write_report

pytestmark = needs_chromium

WINDOW = (1280, 4000)


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """Two mechanisms x two seeds; examples: tokens (with a ``</script>`` token), matrix,
    image, hierarchy, co-attention, heads. max_examples=2 keeps the static section short."""
    examples = [
        tokens_example(tokens=["a", "</script><b>", "good", "film"]),
        matrix_example(),
        image_example(),
        hierarchy_example(),
        coattention_example(),
        heads_example(),
    ]
    runs = [
        {"attention": spec, "seed": seed, "test": {"accuracy": 0.5 + 0.1 * seed}}
        | {"examples": examples}
        for spec in ({"name": "mean"}, {"score": "additive"})
        for seed in (0, 1)
    ]
    return write_report(write_ablation_dir(tmp_path / "abl", runs), max_examples=2)


def viewer_attrs(dom: str) -> dict[str, str]:
    tag = re.search(r'<div id="attention-viewer"[^>]*>', dom)
    assert tag, "no viewer element in the DOM"
    return {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', tag.group(0))}


def selftest_result(dom: str) -> tuple[dict[str, str], str]:
    match = re.search(r'<pre id="viewer-selftest"([^>]*)>(.*?)</pre>', dom, re.S)
    assert match, "no #viewer-selftest element"
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))
    return attrs, html.unescape(match.group(2))


def test_clicks_change_the_view(report: Path, tmp_path: Path) -> None:
    dom, errors, shot = open_report_page(
        report, tmp_path, fragment="#viewer-selftest", window=WINDOW
    )
    assert errors == []
    attrs, text = selftest_result(dom)
    assert attrs.get("data-status") == "done"
    result = json.loads(text)
    before = result["before"]
    steps = {s["action"]: s for s in result["steps"]}
    assert set(steps) == {"next", "matrix", "row", "token", "compare"}
    # the first example of the first mechanism, seed 0; nothing clicked yet
    assert (before["mechanism"], before["seed"], before["example"]) == ("mean", "0", 0)
    assert before["kind"] == "tokens" and before["readout"] == "" and before["panels"] == 1
    # next: the second example (the alignment matrix), its first row selected
    after = steps["next"]["state"]
    assert after["example"] == 1 and after["title"] == "alignment #0"
    assert after["kind"] == "matrix" and after["selected_row"] == "la"
    # a click on the second row header selects the target word "casa"
    row = steps["row"]["state"]
    assert row["row"] == 1 and row["selected_row"] == "casa"
    # a click on a token of the row view shows its weight with 4 significant digits
    token = steps["token"]
    assert token["weight"] == "0.1"
    assert token["state"]["readout"] == "casa → the: 0.1000"
    # choosing a second mechanism puts a second panel beside the first
    assert steps["compare"]["state"]["panels"] == 2
    final = viewer_attrs(dom)
    assert final["data-example"] == "1" and final["data-row"] == "1"
    assert final["data-compare"] == "score=additive"
    # the viewer's toolbar is drawn: its colour is in the screenshot
    assert colour_pixels(shot, theme.VIEWER_RGB) > 2000


def test_negative_controls(report: Path, tmp_path: Path) -> None:
    # without the fragment: the viewer is drawn but no click happens -- nothing changes
    dom, errors, shot = open_report_page(report, tmp_path, window=WINDOW)
    assert errors == []
    attrs, text = selftest_result(dom)
    assert text == "" and "data-status" not in attrs
    state = viewer_attrs(dom)
    assert state["data-example"] == "0" and state["data-row"] == "0"
    assert state["data-compare"] == "" and "data-readout" not in state
    assert state["data-title"] == "test #0"
    assert colour_pixels(shot, theme.VIEWER_RGB) > 2000

    # without JavaScript (the same page with every executable script removed; Chromium's
    # --dump-dom and --screenshot need JavaScript themselves): no viewer -- its colour is
    # absent -- while the note and the static heatmaps stay
    text = report.read_text(encoding="utf-8")
    no_js = tmp_path / "no-js.html"
    no_js.write_text(re.sub(r"<script>.*?</script>", "", text, flags=re.S), encoding="utf-8")
    assert "<script>" not in no_js.read_text(encoding="utf-8")
    dom, _, shot = open_report_page(no_js, tmp_path, fragment="#viewer-selftest", window=WINDOW)
    assert "data-example" not in viewer_attrs(dom)
    assert "The interactive viewer needs JavaScript" in dom
    assert selftest_result(dom)[1] == ""
    assert colour_pixels(shot, theme.VIEWER_RGB) == 0
    assert colour_pixels(shot, theme.HEAT_RGB) > 300


def test_script_token_does_not_break_the_page(tmp_path: Path) -> None:
    """A token "</script>" inside the embedded JSON must neither end the script block nor
    inject markup: the page parses, the viewer draws the token as text."""
    runs = [
        {
            "attention": {"name": "mean"},
            "seed": 0,
            "examples": [
                tokens_example(tokens=["</script><script>window.pwned=1</script>", "x"]),
                matrix_example(),
            ],
        }
    ]
    page = write_report(write_ablation_dir(tmp_path / "abl", runs))
    dom, errors, _ = open_report_page(page, tmp_path, fragment="#viewer-selftest", window=WINDOW)
    assert errors == []
    assert selftest_result(dom)[0].get("data-status") == "done"
    # the token is text inside a viewer span (escaped in the serialised DOM)
    assert '<span class="vtok"' in dom
    assert "&lt;/script&gt;&lt;script&gt;window.pwned=1&lt;/script&gt;" in dom
    assert "<script>window.pwned" not in dom
