"""The CSS and JavaScript inlined into every report (see :mod:`attnlab.lab.report`).

Plain strings, written for this project: the report must open offline, so nothing is
loaded from elsewhere. The colours that matter for the browser test are constants here
(``TABLE_HEADER_RGB``, ``HEAT_RGB``): the table header and the strongest attention cell.
"""

from __future__ import annotations

# The table header's background and the colour of the largest attention weight of a map.
# Both are chosen so that nothing else on the page uses them (the browser test looks for
# them in a screenshot).
TABLE_HEADER_RGB = (31, 58, 95)
HEAT_RGB = (204, 17, 102)

# Line colours of the learning curves (one per mechanism, cycled); none is close to the two
# colours above.
SERIES_COLOURS = (
    "#1b7fbf",
    "#e08a00",
    "#2e9e44",
    "#7a4fb5",
    "#8c564b",
    "#17becf",
    "#6b6b6b",
    "#bcbd22",
    "#d4589e",
    "#3b3b9e",
)


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


CSS = """
:root {
  --ink: #1e1e1e;
  --muted: #5c6370;
  --rule: #d9dde3;
  --head: @HEAD@;
  --heat: @HEAT@;
  --best: #fff3b0;
  --panel: #f6f7f9;
}
* { box-sizing: border-box; }
body {
  margin: 0 auto; max-width: 1200px; padding: 16px 24px 48px;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
  color: var(--ink); background: #ffffff;
}
h1 { font-size: 24px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--rule); }
h3 { font-size: 15px; margin: 16px 0 6px; }
nav.toc { font-size: 13px; color: var(--muted); margin-bottom: 8px; }
nav.toc a { color: inherit; margin-right: 12px; }
.muted { color: var(--muted); }
code, pre, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: var(--panel); padding: 8px; overflow-x: auto; white-space: pre-wrap; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 8px 0; }
dl.meta dt { font-weight: 600; }
dl.meta dd { margin: 0; }
table.data { border-collapse: collapse; margin: 8px 0; }
table.data th, table.data td { padding: 5px 10px; border: 1px solid var(--rule); text-align: right; }
table.data thead th { background: var(--head); color: #ffffff; font-weight: 600; cursor: pointer; }
table.data th.label, table.data td.label { text-align: left; }
table.data td.best { background: var(--best); font-weight: 700; }
table.data td.best::after { content: " \\2605"; color: #8a6d00; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
.chart { background: #ffffff; border: 1px solid var(--rule); }
.chart text { font-size: 11px; fill: var(--ink); }
.chart .axis { stroke: #333333; stroke-width: 1; }
.chart .grid { stroke: #e6e8eb; stroke-width: 1; }
.mechanism { margin: 12px 0 20px; }
.examples { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
.example { border: 1px solid var(--rule); padding: 8px 10px; max-width: 100%; }
.example h4 { margin: 0 0 6px; font-size: 13px; }
.example .gold { font-size: 12px; color: var(--muted); margin-top: 6px; }
p.tokens { margin: 4px 0; line-height: 2.0; max-width: 760px; }
p.tokens .rowlabel { font-size: 11px; color: var(--muted); margin-right: 6px; }
span.tok { padding: 2px 3px; margin: 0 1px; border-radius: 2px; }
table.heat { border-collapse: collapse; font-size: 11px; }
table.heat td.cell { width: 22px; min-width: 22px; height: 22px; border: 1px solid #ffffff; }
table.heat th { font-weight: 400; padding: 1px 4px; white-space: nowrap; }
table.heat th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;
  vertical-align: bottom; max-height: 120px; overflow: hidden; }
table.heat th.row { text-align: right; }
.scale { display: inline-block; width: 120px; height: 10px; vertical-align: middle;
  background: linear-gradient(to right, #ffffff, var(--heat)); border: 1px solid var(--rule); }
.imagepair { display: flex; gap: 8px; flex-wrap: wrap; }
.imagebox { position: relative; display: inline-block; }
.imagebox img, .imagebox svg { display: block; image-rendering: pixelated; }
.imagebox svg.overlay { position: absolute; left: 0; top: 0; }
.failed td { color: #7a1f1f; }
.small { font-size: 11px; }
.view { margin-top: 8px; }
.viewtitle { font-size: 11px; color: var(--muted); }
.wbar { display: inline-block; height: 10px; vertical-align: middle; background: var(--panel);
  border: 1px solid var(--rule); }
.wbar > span { display: block; height: 100%; }
table.hier { border-collapse: collapse; }
table.hier td { padding: 2px 6px; vertical-align: top; }
table.hier td.sw { white-space: nowrap; font-size: 11px; }
table.hier td.words { line-height: 2.0; }
table.heat td.acell { width: 18px; min-width: 18px; height: 18px; border: 1px solid #ffffff; }
.headgrid { display: flex; flex-wrap: wrap; gap: 8px; }
table.heat.mini td.hcell { width: 10px; min-width: 10px; height: 10px; border: 1px solid #ffffff;
  padding: 0; }
.explanation { margin: 12px 0 24px; }
.explanation h4 { margin: 12px 0 4px; font-size: 13px; }
.scatter { background: #ffffff; border: 1px solid var(--rule); }
.scatter text { font-size: 10px; fill: var(--ink); }
.scatter .axis { stroke: #333333; stroke-width: 1; }
.scatter .grid { stroke: #e6e8eb; stroke-width: 1; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plots figure { margin: 0; }
.plots img.plot { max-width: 520px; height: auto; border: 1px solid var(--rule); }
.plots figcaption { font-size: 11px; color: var(--muted); }
#report-errors:empty { display: none; }
#report-errors { color: #7a1f1f; background: #fff0f0; }
""".replace("@HEAD@", _hex(TABLE_HEADER_RGB)).replace("@HEAT@", _hex(HEAT_RGB))


# The error recorder runs first (in <head>), so that an error in any later script of the
# page is written into #report-errors (the browser test reads it back with --dump-dom).
ERROR_RECORDER_JS = """
(function () {
  var errors = [];
  function show() {
    var box = document.getElementById("report-errors");
    if (box) {
      box.setAttribute("data-count", String(errors.length));
      box.textContent = errors.join("\\n");
    }
  }
  window.__reportErrors = errors;
  window.addEventListener("error", function (event) {
    errors.push("error: " + (event.message || String(event.error)));
    show();
  });
  window.addEventListener("unhandledrejection", function (event) {
    errors.push("unhandled rejection: " + String(event.reason));
    show();
  });
  var original = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    show();
    if (original) { original.apply(console, arguments); }
  };
  document.addEventListener("DOMContentLoaded", show);
})();
"""

# Behaviour that needs JavaScript is an extra: the report reads fully without it.
# ``attnlabReport.onReady(fn)`` lets later sections hook in their own code.
MAIN_JS = """
(function () {
  var ready = [];
  window.attnlabReport = {
    onReady: function (fn) { ready.push(fn); }
  };

  function cellValue(cell) {
    var v = cell.getAttribute("data-value");
    if (v !== null && v !== "") { return parseFloat(v); }
    return cell.textContent.trim().toLowerCase();
  }

  function makeSortable(table) {
    var heads = table.querySelectorAll("thead th");
    Array.prototype.forEach.call(heads, function (th, index) {
      th.title = "click to sort";
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        if (!body) { return; }
        var rows = Array.prototype.slice.call(body.rows);
        var ascending = th.getAttribute("data-sorted") !== "asc";
        rows.sort(function (a, b) {
          var x = cellValue(a.cells[index]);
          var y = cellValue(b.cells[index]);
          if (typeof x === "number" && typeof y === "number") {
            if (isNaN(x)) { return 1; }
            if (isNaN(y)) { return -1; }
            return ascending ? x - y : y - x;
          }
          x = String(x); y = String(y);
          return ascending ? x.localeCompare(y) : y.localeCompare(x);
        });
        rows.forEach(function (row) { body.appendChild(row); });
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("data-sorted"); });
        th.setAttribute("data-sorted", ascending ? "asc" : "desc");
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), makeSortable);
    ready.forEach(function (fn) { fn(document); });
    document.body.setAttribute("data-report-ready", "1");
  });
})();
"""
