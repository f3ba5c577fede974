"""``attnlab report DIR``: one self-contained HTML file for a run or an ablation.

The report reads the documented directory layouts (``docs/lab/report.md``) and nothing
else: a *run directory* (``run.json``, ``metrics.json``, ``history.json``, ``cost.json``,
``examples.json``) or an *ablation directory* (``ablation.json``, ``results.sqlite``,
``runs/<run_id>/``). It never imports the trainer or the results store, so a report can be
written for results produced by another version of the library.

Everything is inline -- CSS, JavaScript, the learning curves (SVG drawn here), the
attention heatmaps (HTML tables and spans, images as PNG data URIs written here) -- so the
file opens offline and contains no external URL. Text from the runs (tokens, labels,
errors) is escaped.

The package, one concept a module (each imports only those above it):

* :mod:`~attnlab.lab.report.data` -- reading the directories and the store into
  :class:`ReportData` (:func:`load_report_data`);
* :mod:`~attnlab.lab.report.statistics` -- means over seeds, the best mechanism, the paired
  tests (the measures are :mod:`attnlab.evaluation.significance`), mean learning curves;
* :mod:`~attnlab.lab.report.theme` -- the colours and the CSS / JavaScript files of
  ``assets/`` (read with :mod:`importlib.resources` when a page is built);
  :mod:`~attnlab.lab.report.markup` -- escaping and number formats;
* :mod:`~attnlab.lab.report.charts` -- SVG line charts and scatters;
  :mod:`~attnlab.lab.report.png` -- the PNG encoder;
* :mod:`~attnlab.lab.report.heatmaps` -- shaded tokens, tables and image grids;
  :mod:`~attnlab.lab.report.views` -- the extra views an example's ``extra`` asks for
  (hierarchy, co-attention, heads, a second token sequence: :func:`extra_views`);
  :mod:`~attnlab.lab.report.examples` -- one example as an HTML block;
* the sections: :mod:`~attnlab.lab.report.overview`, :mod:`~attnlab.lab.report.tables`
  (ablation table, paired tests, cost, failed runs), :mod:`~attnlab.lab.report.curves`,
  :mod:`~attnlab.lab.report.viewer` (the interactive viewer and its embedded JSON),
  :mod:`~attnlab.lab.report.explanation` (``attnlab explain``'s results), on
  :mod:`~attnlab.lab.report.context` (:class:`Section`, :class:`ReportContext`);
* :mod:`~attnlab.lab.report.sections` -- :data:`SECTIONS` and :func:`add_section`;
  :mod:`~attnlab.lab.report.page` -- :func:`render_report`, :func:`write_report`;
  :mod:`~attnlab.lab.report.command` -- ``attnlab report``.

The page is a list of :class:`Section` objects. :data:`SECTIONS` holds the default ones
(header, ablation table, paired tests, failed runs, learning curves, attention examples,
the viewer, the explanation tests, cost); :func:`add_section` adds one (for every later
report) and ``write_report(..., sections=[...])`` chooses them for one report.
"""

from attnlab.lab.report.charts import line_chart_svg, scatter_svg
from attnlab.lab.report.command import report_command
from attnlab.lab.report.context import ReportContext, Section
from attnlab.lab.report.data import ReportData, ReportError, RunRecord, load_report_data
from attnlab.lab.report.examples import render_example
from attnlab.lab.report.explanation import read_explanation, render_explanation
from attnlab.lab.report.page import render_report, write_report
from attnlab.lab.report.png import png_bytes, png_data_uri
from attnlab.lab.report.sections import SECTIONS, add_section
from attnlab.lab.report.statistics import mean_std, paired_analysis, summarize
from attnlab.lab.report.tables import PEAK_MEMORY_FLOOR_MB
from attnlab.lab.report.theme import heat_colour
from attnlab.lab.report.viewer import script_json, viewer_payload
from attnlab.lab.report.views import extra_views

__all__ = [
    "PEAK_MEMORY_FLOOR_MB",
    "SECTIONS",
    "ReportContext",
    "ReportData",
    "ReportError",
    "RunRecord",
    "Section",
    "add_section",
    "extra_views",
    "heat_colour",
    "line_chart_svg",
    "load_report_data",
    "mean_std",
    "paired_analysis",
    "png_bytes",
    "png_data_uri",
    "read_explanation",
    "render_example",
    "render_explanation",
    "render_report",
    "report_command",
    "scatter_svg",
    "script_json",
    "summarize",
    "viewer_payload",
    "write_report",
]
