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

Besides the static heatmaps, the page embeds every example of every run as JSON for an
interactive viewer (:mod:`attnlab.lab._viewer_assets`; no library, works from ``file://``),
draws the views that an example's ``extra`` asks for (hierarchy, co-attention, heads, a
second token sequence: :func:`extra_views`), and shows the results of ``attnlab explain``
(``RUN_DIR/explanation/explanation.json`` as tables and SVG scatters, and its PNG plots
that the SVGs do not repeat, inlined).

The page is a list of :class:`Section` objects. :data:`SECTIONS` holds the default ones
(header, ablation table, failed runs, learning curves, attention examples, the viewer,
the explanation tests, cost);
:func:`add_section` adds one (for every later report) and ``write_report(...,
sections=[...])`` chooses them for one report.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import math
import sqlite3
import statistics
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from attnlab.lab import _report_assets as assets
from attnlab.lab import _viewer_assets as viewer_assets

__all__ = [
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
    "png_data_uri",
    "read_explanation",
    "render_explanation",
    "render_report",
    "report_command",
    "scatter_svg",
    "script_json",
    "summarize",
    "viewer_payload",
    "write_report",
]

_LOWER_IS_BETTER_HINTS = ("loss", "error", "perplexity", "ppl", "aer", "wer", "cer", "mse", "mae")


class ReportError(ValueError):
    """The directory is not a run or an ablation directory (or its files are unreadable)."""


# ----------------------------------------------------------------------------- reading


@dataclass
class RunRecord:
    """One run as read from its directory (and the results store, when there is one)."""

    run_id: str
    label: str
    seed: int | None
    status: str  # "done", "failed", or whatever the store says (e.g. "running")
    run_dir: Path | None = None
    run: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.status == "done"


@dataclass
class ReportData:
    """Everything the sections draw from: the runs and the ablation's description."""

    root: Path
    kind: str  # "run" or "ablation"
    ablation: dict[str, Any]
    runs: list[RunRecord]
    #: run directories that could not be read: (run id, why), one line each
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def done(self) -> list[RunRecord]:
        return [r for r in self.runs if r.done]

    @property
    def not_done(self) -> list[RunRecord]:
        return [r for r in self.runs if not r.done]

    @property
    def task(self) -> str | None:
        if self.ablation.get("task"):
            return str(self.ablation["task"])
        for r in self.runs:
            if r.run.get("task"):
                return str(r.run["task"])
        return None

    @property
    def labels(self) -> list[str]:
        """Mechanism labels: the grid's order first, then any others in order of appearance."""
        order: list[str] = []
        for spec in self.ablation.get("grid") or []:
            label = _spec_label(spec)
            if label not in order:
                order.append(label)
        present = {r.label for r in self.runs}
        order = [x for x in order if x in present]
        for r in self.runs:
            if r.label not in order:
                order.append(r.label)
        return order

    def runs_of(self, label: str, *, done_only: bool = True) -> list[RunRecord]:
        runs = [r for r in self.runs if r.label == label and (r.done or not done_only)]
        return sorted(runs, key=lambda r: (r.seed is None, r.seed or 0, r.run_id))

    @property
    def primary(self) -> str | None:
        for r in self.done:
            if r.metrics.get("primary"):
                return str(r.metrics["primary"])
        return None

    @property
    def test_metrics(self) -> list[str]:
        """Test metric names: the primary first, then in the order the runs list them."""
        names: list[str] = []
        primary = self.primary
        for r in self.done:
            for name in (r.metrics.get("test") or {}).keys():
                if name not in names:
                    names.append(name)
        if primary in names:
            names.remove(primary)
            names.insert(0, primary)
        return names

    def higher_is_better(self, metric: str) -> bool:
        """Direction of a metric: ``metrics.json``'s ``higher_is_better`` (a bool for the
        primary metric, or a ``{metric: bool}`` dict); for other metrics a guess from the
        name (loss, error, perplexity, AER, WER, ... are lower-is-better)."""
        for r in self.done:
            hib = r.metrics.get("higher_is_better")
            if isinstance(hib, Mapping) and metric in hib:
                return bool(hib[metric])
            if isinstance(hib, bool) and metric == r.metrics.get("primary"):
                return hib
        lowered = metric.lower()
        return not any(hint in lowered for hint in _LOWER_IS_BETTER_HINTS)


def _spec_label(spec: Any) -> str:
    if isinstance(spec, Mapping):
        from attnlab.lab.task import spec_label

        return spec_label(spec)
    return str(spec)


def _read_json(path: Path, default: Any) -> Any:
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ReportError(f"cannot read {path}: {err}") from err


def _read_typed(path: Path, default: Any, kind: type) -> Any:
    """:func:`_read_json` of a file that must hold a JSON object (``kind=dict``) or array
    (``kind=list``); anything else raises :class:`ReportError` naming the file."""
    value = _read_json(path, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "an array"
        raise ReportError(
            f"{path} holds a JSON {type(value).__name__}, not {expected} (a damaged file?)"
        )
    return value


def _read_run_dir(run_dir: Path, run_id: str | None = None) -> RunRecord:
    """One run directory; :class:`ReportError` (one line, naming the file) when one of its
    JSON files is unreadable or of the wrong type."""
    run = _read_typed(run_dir / "run.json", {}, dict)
    label = run.get("label")
    if label is None:
        label = _spec_label(run.get("attention") or {})
    metrics = _read_typed(run_dir / "metrics.json", {}, dict)
    status = str(run.get("status") or ("done" if metrics else "unknown"))
    error = run.get("error")
    if status == "done" and not (metrics.get("test") or metrics.get("dev")):
        status, error = "failed", error or "metrics.json is missing or empty"
    examples = _read_typed(run_dir / "examples.json", [], list)
    history = _read_typed(run_dir / "history.json", [], list)
    return RunRecord(
        run_id=run_id or run_dir.name,
        label=str(label),
        seed=run.get("seed"),
        status=status,
        run_dir=run_dir,
        run=run,
        metrics=metrics,
        history=[h for h in history if isinstance(h, dict)],
        cost=_read_typed(run_dir / "cost.json", {}, dict),
        examples=[e for e in examples if isinstance(e, dict)],
        error=None if error is None else str(error),
    )


def _one_line(error: BaseException) -> str:
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    return lines[0] if lines else type(error).__name__


def _store_record(run_id: str, row: Mapping[str, Any]) -> RunRecord:
    """A run known only from its row in ``results.sqlite``."""
    status = str(row.get("status") or "unknown")
    metrics = {}
    if status == "done":
        metrics = {
            "dev": _loads(row.get("dev_json")) or {},
            "test": _loads(row.get("test_json")) or {},
        }
    cost = _loads(row.get("cost_json"))
    return RunRecord(
        run_id=run_id,
        label=str(row.get("label") or _spec_label(_loads(row.get("attention_json")))),
        seed=row.get("seed"),
        status=status,
        metrics=metrics,
        cost=cost if isinstance(cost, dict) else {},
        error=None if row.get("error") is None else str(row["error"]),
    )


def _read_store(path: Path) -> dict[str, dict[str, Any]]:
    """The ``runs`` table of ``results.sqlite`` as {run_id: row}, read with the stdlib."""
    if not path.is_file():
        return {}
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error as err:
        raise ReportError(f"cannot open {path}: {err}") from err
    try:
        con.row_factory = sqlite3.Row
        rows = con.execute("SELECT * FROM runs").fetchall()
    except sqlite3.Error as err:
        raise ReportError(f"cannot read the runs table of {path}: {err}") from err
    finally:
        con.close()
    return {str(row["run_id"]): dict(row) for row in rows}


def load_report_data(
    path: str | Path, *, on_warning: Callable[[str], None] | None = None
) -> ReportData:
    """Read a run directory (has ``run.json``) or an ablation directory (has
    ``ablation.json`` and/or ``runs/``).

    In an ablation directory the status of every run comes from ``results.sqlite`` when the
    file is there (a run the store lists without a directory is shown as failed or
    unfinished); without the store, every ``runs/*/run.json`` counts with its own status.
    A run directory of an ablation whose files cannot be read (invalid JSON, a
    ``metrics.json`` that is not an object, ...) is skipped: its row in the store is used
    when there is one, it is listed with the failed runs, and ``on_warning`` gets one line
    saying so. An unreadable file of a single run directory raises :class:`ReportError`.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such directory: {root}")
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory (expected a run or an ablation directory)")
    if (root / "run.json").is_file():
        record = _read_run_dir(root)
        ablation = {
            "task": record.run.get("task"),
            "task_options": record.run.get("task_options", {}),
            "grid": [record.run.get("attention", {})],
            "seeds": [record.seed],
            "created": record.run.get("started"),
        }
        return ReportData(root=root, kind="run", ablation=ablation, runs=[record])
    runs_dir = root / "runs"
    if not (root / "ablation.json").is_file() and not runs_dir.is_dir():
        raise ReportError(
            f"{root} is neither a run directory (no run.json) nor an ablation directory "
            "(no ablation.json and no runs/ folder)"
        )
    ablation = _read_json(root / "ablation.json", {})
    store = _read_store(root / "results.sqlite")
    records: list[RunRecord] = []
    seen: set[str] = set()
    run_dirs = (
        sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        if runs_dir.is_dir()
        else []
    )  # hidden folders are the trainer's unfinished work
    unreadable: list[tuple[str, str]] = []
    for run_dir in run_dirs:
        if not (run_dir / "run.json").is_file() and run_dir.name not in store:
            continue
        row = store.get(run_dir.name)
        try:
            record = _read_run_dir(run_dir)
        except (ValueError, OSError) as err:  # ReportError, JSON, encoding, a trainer's own
            why = _one_line(err)
            unreadable.append((run_dir.name, why))
            if on_warning is not None:
                use = "its row in results.sqlite is used" if row else "it is left out"
                on_warning(f"cannot read the run directory {run_dir}: {why}; {use}")
            continue  # a store row is read below like any run without a directory
        if row is not None:
            record.status = str(row.get("status") or record.status)
            if record.status == "done" and not record.metrics:
                record.metrics = {
                    "dev": _loads(row.get("dev_json")) or {},
                    "test": _loads(row.get("test_json")) or {},
                }
                record.cost = record.cost or _loads(row.get("cost_json")) or {}
            if record.status != "done":
                record.error = record.error or (row.get("error") and str(row["error"]))
            if not record.run and row.get("label"):
                record.label = str(row["label"])
                record.seed = row.get("seed")
        elif store:  # the store knows every finished run: a directory it lacks is unfinished
            if record.status == "done":
                record.status = "unrecorded"
        records.append(record)
        seen.add(run_dir.name)
    for run_id, row in store.items():
        if run_id not in seen:
            records.append(_store_record(run_id, row))
    return ReportData(
        root=root,
        kind="ablation",
        ablation=ablation if isinstance(ablation, dict) else {},
        runs=records,
        unreadable=unreadable,
    )


def _loads(text: Any) -> Any:
    if text is None or text == "":
        return None
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return None


# ----------------------------------------------------------------------------- numbers


def _finite(values: Iterable[Any]) -> list[float]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out.append(float(v))
    return out


def mean_std(values: Iterable[Any]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation (n - 1 in the denominator; None for one value) and
    count of the finite numbers among ``values``."""
    xs = _finite(values)
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)


def summarize(data: ReportData) -> dict[str, dict[str, Any]]:
    """Per mechanism label: ``{"seeds": n_done, "failed": n_not_done, "test": {metric:
    (mean, std, n)}, "best": {metric, ...}}`` -- the numbers of the ablation table."""
    metrics = data.test_metrics
    table: dict[str, dict[str, Any]] = {}
    for label in data.labels:
        runs = data.runs_of(label)
        table[label] = {
            "seeds": len(runs),
            "failed": len([r for r in data.runs_of(label, done_only=False) if not r.done]),
            "test": {
                m: mean_std((r.metrics.get("test") or {}).get(m) for r in runs) for m in metrics
            },
            "best": set(),
        }
    for m in metrics:
        means = {
            lab: row["test"][m][0] for lab, row in table.items() if row["test"][m][0] is not None
        }
        if not means:
            continue
        pick = max if data.higher_is_better(m) else min
        best = pick(means.values())
        for lab, value in means.items():
            if value == best:
                table[lab]["best"].add(m)
    return table


def _fmt_num(value: float | None) -> str:
    """4 decimals below 100, 2 below 100,000, else 4 significant digits."""
    if value is None:
        return "–"
    if abs(value) < 100:
        return f"{value:.4f}"
    if abs(value) < 1e5:
        return f"{value:.2f}"
    return f"{value:.4g}"


def _fmt_mean_std(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "–"
    if std is None:
        return _fmt_num(mean)
    return f"{_fmt_num(mean)} ± {_fmt_num(std)}"


# ----------------------------------------------------------------------------- drawing


def esc(value: Any) -> str:
    """HTML-escape any value (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def heat_colour(t: float) -> tuple[int, int, int]:
    """White (t = 0) to the heat colour (t = 1), linearly in RGB."""
    t = 0.0 if not math.isfinite(t) else min(max(t, 0.0), 1.0)
    return tuple(round(255 + (c - 255) * t) for c in assets.HEAT_RGB)  # type: ignore[return-value]


def _rgb(rgb: Sequence[int]) -> str:
    return "rgb({},{},{})".format(*rgb)


def _nice_step(span: float, ticks: int = 5) -> float:
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def _ticks(lo: float, hi: float, ticks: int = 5) -> tuple[float, float, list[float]]:
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = _nice_step(hi - lo, ticks)
    start = math.floor(lo / step) * step
    stop = math.ceil(hi / step) * step
    values = []
    v = start
    while v <= stop + step * 1e-9:
        values.append(round(v, 12))
        v += step
    return start, stop, values


def _tick_text(v: float) -> str:
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


def line_chart_svg(
    series: Sequence[tuple[str, str, Sequence[tuple[float, float]]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 540,
    height: int = 320,
) -> str:
    """An inline SVG line chart: ``series`` is ``[(name, colour, [(x, y), ...]), ...]``;
    axes with ticks, a grid, a legend; points are marked (so one-epoch runs show)."""
    pts = [(x, y) for _, _, s in series for x, y in s if math.isfinite(x) and math.isfinite(y)]
    left, right, top = 64, 16, 28
    legend_h = 16 * len(series)
    plot_w, plot_h = width - left - right, height - top - 44
    total_h = height + legend_h
    out = [
        f'<svg class="chart" width="{width}" height="{total_h}" '
        f'viewBox="0 0 {width} {total_h}" role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="18" style="font-size:13px;font-weight:600">{esc(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{left}" y="{top + plot_h / 2:.0f}">no data</text></svg>')
        return "".join(out)
    x0, x1, xt = _ticks(min(p[0] for p in pts), max(p[0] for p in pts), 6)
    if all(float(x).is_integer() for x, _ in pts):
        xt = [v for v in xt if float(v).is_integer()]
    y0, y1, yt = _ticks(min(p[1] for p in pts), max(p[1] for p in pts), 5)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    for v in yt:
        y = sy(v)
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(_tick_text(v))}</text>'
        )
    for v in xt:
        x = sx(v)
        out.append(
            f'<line class="axis" x1="{x:.1f}" x2="{x:.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{esc(_tick_text(v))}</text>'
        )
    out.append(
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>'
        f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>'
    )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle">'
        f"{esc(x_label)}</text>"
    )
    out.append(
        f'<text transform="translate(14,{top + plot_h / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{esc(y_label)}</text>'
    )
    for i, (name, colour, s) in enumerate(series):
        good = [(x, y) for x, y in s if math.isfinite(x) and math.isfinite(y)]
        if len(good) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
            out.append(
                f'<polyline fill="none" stroke="{esc(colour)}" stroke-width="2" points="{path}"/>'
            )
        for x, y in good:
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{esc(colour)}">'
                f"<title>{esc(name)}: {esc(_fmt_num(y))} (epoch {esc(_tick_text(x))})</title></circle>"
            )
        ly = top + plot_h + 44 + 16 * i
        out.append(
            f'<line x1="{left}" x2="{left + 22}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{esc(colour)}" stroke-width="3"/>'
            f'<text x="{left + 28}" y="{ly}">{esc(name)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)
    )


def png_bytes(pixels: Sequence[Sequence[Sequence[float]]]) -> bytes:
    """An 8-bit RGB PNG of an ``H x W x 3`` nested sequence of floats in [0, 1]."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if height == 0 or width == 0:
        raise ValueError("png_bytes needs an image of at least 1 x 1 pixels")
    raw = bytearray()
    for row in pixels:
        if len(row) != width:
            raise ValueError("png_bytes: rows of the image differ in length")
        raw.append(0)  # filter type 0 (none)
        for px in row:
            if len(px) < 3:
                raise ValueError("png_bytes: every pixel needs 3 channels (RGB)")
            for c in px[:3]:
                c = float(c)
                raw.append(0 if not math.isfinite(c) else round(min(max(c, 0.0), 1.0) * 255))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(bytes(raw), 9))
        + _png_chunk(b"IEND", b"")
    )


def png_data_uri(pixels: Sequence[Sequence[Sequence[float]]]) -> str:
    """``data:image/png;base64,...`` of :func:`png_bytes`."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(pixels)).decode("ascii")


def _is_uniform(row: Iterable[Any]) -> bool:
    """Whether every finite weight of ``row`` (at least two, positive) is the same: the
    attention of the ``uniform`` and ``mean`` baselines."""
    vals = _finite(row)
    return len(vals) > 1 and vals[0] > 0 and all(abs(v - vals[0]) <= 1e-6 * vals[0] for v in vals)


def _row_scale(row: Sequence[float]) -> float:
    """What the shading of ``row`` divides by: its largest weight, so that the largest is
    drawn in full colour -- except for a uniform row, whose weights (1/n) are drawn as they
    are (else every token of a uniform row would be in full colour)."""
    if _is_uniform(row):
        return 1.0
    vals = _finite(row)
    top = max(vals) if vals else 0.0
    return top if top > 0 else 1.0


def _uniform_note(row: Sequence[Any]) -> str:
    """A muted note for a uniform row (else ``""``)."""
    if not _is_uniform(row):
        return ""
    w = _finite(row)[0]
    return f'<span class="muted small uniform"> uniform: every weight {w:.4g}</span>'


def _cell_style(t: float) -> str:
    rgb = heat_colour(t)
    text = "#ffffff" if t > 0.6 else "#1e1e1e"
    return f"background:{_rgb(rgb)};color:{text}"


def _as_float(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


def render_tokens(example: Mapping[str, Any]) -> str:
    """A ``tokens`` example: each row as the sentence with each token shaded by its weight
    (relative to the row's largest weight); the weight is in the tooltip."""
    rows = list(example.get("rows") or [])
    cols = list(example.get("cols") or [])
    weights = example.get("weights") or []
    out = []
    for i, row in enumerate(weights):
        scale = _row_scale(row)
        label = rows[i] if i < len(rows) else ""
        spans = []
        for tok, w in zip(cols, row, strict=False):
            w = _as_float(w)
            t = w / scale if math.isfinite(w) else 0.0
            spans.append(
                f'<span class="tok" style="{_cell_style(t)}" '
                f'title="{esc(f"{w:.4f}")}" data-weight="{w!r}">{esc(tok)}</span>'
            )
        head = (
            f'<span class="rowlabel">{esc(label)}</span>'
            if len(weights) > 1 or label not in ("", "attention")
            else ""
        )
        out.append(f'<p class="tokens">{head}{" ".join(spans)}{_uniform_note(row)}</p>')
    return "".join(out)


def render_matrix(example: Mapping[str, Any]) -> str:
    """A ``matrix`` example: a rows x cols table of cells shaded by weight (relative to the
    largest weight of the matrix), row and column labels, the value in each tooltip."""
    rows = list(example.get("rows") or [])
    cols = list(example.get("cols") or [])
    weights = example.get("weights") or []
    every = [w for r in weights for w in r]
    scale = _row_scale(every)
    head = "".join(f'<th class="col" scope="col">{esc(c)}</th>' for c in cols)
    body = []
    for i, row in enumerate(weights):
        cells = []
        for j, w in enumerate(row):
            w = _as_float(w)
            t = w / scale if math.isfinite(w) else 0.0
            name = f"{rows[i] if i < len(rows) else i} → {cols[j] if j < len(cols) else j}"
            cells.append(
                f'<td class="cell" style="{_cell_style(t)}" title="{esc(f"{name}: {w:.4f}")}" '
                f'data-weight="{w!r}"></td>'
            )
        label = rows[i] if i < len(rows) else ""
        body.append(f'<tr><th class="row" scope="row">{esc(label)}</th>{"".join(cells)}</tr>')
    note = f"<div>{_uniform_note(every)}</div>" if _is_uniform(every) else ""
    return (
        f'<table class="heat"><thead><tr><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>{note}"
    )


def render_image(example: Mapping[str, Any], *, size: int = 192, max_rows: int = 4) -> str:
    """An ``image`` example: the picture (a PNG data URI) with the attention grid drawn over
    it (one overlay per row, at most ``max_rows``); without a picture, the grid alone."""
    rows = list(example.get("rows") or [])
    cols = list(example.get("cols") or [])
    weights = example.get("weights") or []
    grid = example.get("grid")
    if grid and len(grid) == 2:
        gh, gw = int(grid[0]), int(grid[1])
    else:
        gh, gw = 1, len(cols)
    if gh * gw != len(cols) or gh <= 0 or gw <= 0:
        return render_matrix(example)  # a grid that does not fit the columns: show the numbers
    image = example.get("image")
    img_html = ""
    width = size
    height = size
    if image:
        try:
            ih, iw = len(image), len(image[0])
            height = round(size * ih / iw) if iw else size
            img_html = (
                f'<img src="{png_data_uri(image)}" width="{width}" height="{height}" '
                f'alt="{esc(example.get("title", "image"))}">'
            )
        except (TypeError, ValueError, IndexError):
            img_html = ""
    cw, ch = width / gw, height / gh
    boxes = []
    for i, row in enumerate(weights[:max_rows]):
        scale = _row_scale(row)
        rects = []
        for k, w in enumerate(row):
            w = _as_float(w)
            t = w / scale if math.isfinite(w) else 0.0
            r, c = divmod(k, gw)
            if img_html:
                fill = f'fill="{_rgb(assets.HEAT_RGB)}" fill-opacity="{0.75 * t:.3f}"'
            else:
                fill = f'fill="{_rgb(heat_colour(t))}"'
            rects.append(
                f'<rect x="{c * cw:.2f}" y="{r * ch:.2f}" width="{cw:.2f}" height="{ch:.2f}" '
                f'{fill} stroke="#ffffff" stroke-opacity="0.35">'
                f"<title>{esc(cols[k] if k < len(cols) else k)}: {w:.4f}</title></rect>"
            )
        cls = "overlay" if img_html else ""
        svg = (
            f'<svg class="{cls}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">{"".join(rects)}</svg>'
        )
        label = rows[i] if i < len(rows) else ""
        caption = (
            f'<div class="muted" style="font-size:11px">{esc(label)}</div>'
            if label and label != "attention"
            else ""
        )
        boxes.append(f'<div><div class="imagebox">{img_html}{svg}</div>{caption}</div>')
    more = (
        f'<div class="muted">({len(weights) - max_rows} more rows not shown)</div>'
        if len(weights) > max_rows
        else ""
    )
    return f'<div class="imagepair">{"".join(boxes)}</div>{more}'


# ----------------------------------------------------------------------------- extra views
#
# Conventions for ``AttentionExample.extra`` (docs/lab/report.md): keys a task may fill so
# that the report draws more than the main map. Each view consumes its keys; the remaining
# extra keys are listed as text under the example.

HIERARCHY_KEYS = ("sentences", "word_weights", "sentence_weights")
COATTENTION_KEYS = ("tokens_a", "weights_a", "tokens_b", "weights_b")
COATTENTION_OPTIONAL = ("affinity", "name_a", "name_b")
HEADS_KEYS = ("heads",)
HEADS_OPTIONAL = ("head_names",)
WORDS_KEYS = ("words", "word_weights")
WORDS_OPTIONAL = ("words_name",)


def _floats(value: Any) -> list[float] | None:
    """``value`` as a list of floats (non-numbers become NaN), or None if it is not a list."""
    if not isinstance(value, (list, tuple)):
        return None
    return [_as_float(v) for v in value]


def _matrix(value: Any) -> list[list[float]] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    rows = [_floats(r) for r in value]
    if any(r is None for r in rows):
        return None
    return rows  # type: ignore[return-value]


def _strings(value: Any) -> list[str] | None:
    if not isinstance(value, (list, tuple)):
        return None
    return ["" if v is None else str(v) for v in value]


def hierarchy_view(extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The hierarchical view's data (sentences, per-sentence word weights, sentence weights)
    when ``extra`` follows the convention and the lengths agree, else None."""
    sentences = extra.get("sentences")
    words = extra.get("word_weights")
    sw = _floats(extra.get("sentence_weights"))
    if not isinstance(sentences, (list, tuple)) or not isinstance(words, (list, tuple)):
        return None
    sents = [_strings(s) for s in sentences]
    ww = [_floats(w) for w in words]
    if sw is None or any(s is None for s in sents) or any(w is None for w in ww):
        return None
    if not (len(sents) == len(ww) == len(sw)):
        return None
    if any(len(s) != len(w) for s, w in zip(sents, ww, strict=True)):  # type: ignore[arg-type]
        return None
    return {"sentences": sents, "word_weights": ww, "sentence_weights": sw}


def coattention_view(extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The co-attention view's data (two token lists with their weights, the optional
    affinity ``[len(tokens_a)][len(tokens_b)]`` and the names of the two inputs)."""
    ta, tb = _strings(extra.get("tokens_a")), _strings(extra.get("tokens_b"))
    wa, wb = _floats(extra.get("weights_a")), _floats(extra.get("weights_b"))
    if ta is None or tb is None or wa is None or wb is None:
        return None
    if len(ta) != len(wa) or len(tb) != len(wb):
        return None
    view: dict[str, Any] = {
        "tokens_a": ta,
        "weights_a": wa,
        "tokens_b": tb,
        "weights_b": wb,
        "name_a": str(extra.get("name_a") or "input A"),
        "name_b": str(extra.get("name_b") or "input B"),
        "affinity": None,
    }
    aff = _matrix(extra.get("affinity"))
    if aff is not None and len(aff) == len(ta) and all(len(r) == len(tb) for r in aff):
        view["affinity"] = aff
    return view


def heads_view(
    extra: Mapping[str, Any], rows: Sequence[str], cols: Sequence[str]
) -> dict[str, Any] | None:
    """The multi-head view's data: ``heads [H][n_rows][n_cols]`` (a head given as one list
    is one row); row / column labels from the example when the sizes agree."""
    heads = extra.get("heads")
    if not isinstance(heads, (list, tuple)) or not heads:
        return None
    maps = []
    for head in heads:
        if isinstance(head, (list, tuple)) and head and not isinstance(head[0], (list, tuple)):
            head = [head]
        m = _matrix(head)
        if m is None or len({len(r) for r in m}) != 1:
            return None
        maps.append(m)
    n_rows, n_cols = len(maps[0]), len(maps[0][0])
    if any(len(m) != n_rows or len(m[0]) != n_cols for m in maps):
        return None
    names = _strings(extra.get("head_names"))
    if names is None or len(names) != len(maps):
        names = [f"head {h}" for h in range(len(maps))]
    return {
        "heads": maps,
        "names": names,
        "rows": list(rows) if len(rows) == n_rows else [str(i) for i in range(n_rows)],
        "cols": list(cols) if len(cols) == n_cols else [str(j) for j in range(n_cols)],
    }


def words_view(extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """A second token sequence with one weight per token (``words`` + a flat
    ``word_weights``, e.g. a VQA model's attention over the question)."""
    if "sentences" in extra:
        return None  # word_weights belongs to the hierarchical view
    words, weights = _strings(extra.get("words")), _floats(extra.get("word_weights"))
    if words is None or weights is None or len(words) != len(weights) or not words:
        return None
    return {"words": words, "weights": weights, "name": str(extra.get("words_name") or "words")}


def _token_spans(tokens: Sequence[str], weights: Sequence[float], cls: str = "tok") -> str:
    scale = _row_scale(weights)
    spans = []
    for tok, w in zip(tokens, weights, strict=False):
        t = w / scale if math.isfinite(w) else 0.0
        spans.append(
            f'<span class="{cls}" style="{_cell_style(t)}" title="{esc(f"{w:.4f}")}" '
            f'data-weight="{w!r}">{esc(tok)}</span>'
        )
    return " ".join(spans)


def _bar(w: float, scale: float, width: int = 80) -> str:
    t = w / scale if math.isfinite(w) and scale > 0 else 0.0
    t = min(max(t, 0.0), 1.0)
    return (
        f'<span class="wbar" style="width:{width}px"><span style="width:{t * width:.1f}px;'
        f'background:{_rgb(assets.HEAT_RGB)}"></span></span>'
    )


def render_hierarchy(view: Mapping[str, Any]) -> str:
    """Sentence weights as bars (relative to the largest) beside each sentence's words
    shaded by their word weights (relative to the sentence's largest)."""
    sw = view["sentence_weights"]
    scale = _row_scale(sw)
    rows = []
    for j, (sent, ww, w) in enumerate(
        zip(view["sentences"], view["word_weights"], sw, strict=True)
    ):
        rows.append(
            f'<tr class="sentence" data-sentence="{j}" data-weight="{w!r}">'
            f'<td class="sw" title="sentence {j}: {w:.4f}">{_bar(w, scale)} '
            f'<span class="num">{w:.3f}</span></td>'
            f'<td class="words">{_token_spans(sent, ww, "tok word")}</td></tr>'
        )
    return (
        '<div class="view hierarchy"><div class="viewtitle">sentence and word weights</div>'
        f'<table class="hier">{"".join(rows)}</table></div>'
    )


def _table_heat(
    rows: Sequence[str],
    cols: Sequence[str],
    weights: Sequence[Sequence[float]],
    *,
    cell_cls: str,
    table_cls: str,
    lo: float = 0.0,
    labels: bool = True,
) -> str:
    vals = _finite(v for r in weights for v in r)
    hi = max(vals) if vals else 1.0
    span = hi - lo if hi > lo else 1.0
    head = (
        "<thead><tr><th></th>"
        + "".join(f'<th class="col" scope="col">{esc(c)}</th>' for c in cols)
        + "</tr></thead>"
        if labels
        else ""
    )
    body = []
    for i, row in enumerate(weights):
        cells = []
        for j, w in enumerate(row):
            t = (w - lo) / span if math.isfinite(w) else 0.0
            name = f"{rows[i] if i < len(rows) else i} → {cols[j] if j < len(cols) else j}"
            cells.append(
                f'<td class="{cell_cls}" style="{_cell_style(t)}" '
                f'title="{esc(f"{name}: {w:.4f}")}" data-weight="{w!r}"></td>'
            )
        label = f'<th class="row" scope="row">{esc(rows[i] if i < len(rows) else "")}</th>'
        body.append(f"<tr>{label if labels else ''}{''.join(cells)}</tr>")
    return f'<table class="{table_cls}">{head}<tbody>{"".join(body)}</tbody></table>'


def render_coattention(view: Mapping[str, Any]) -> str:
    """Both inputs as shaded token lines (each relative to its largest weight) and, when
    given, the affinity matrix (shaded from its smallest to its largest entry)."""
    parts = [
        '<div class="view coattention"><div class="viewtitle">co-attention</div>',
        f'<p class="tokens side-a"><span class="rowlabel">{esc(view["name_a"])}</span>'
        f"{_token_spans(view['tokens_a'], view['weights_a'])}</p>",
        f'<p class="tokens side-b"><span class="rowlabel">{esc(view["name_b"])}</span>'
        f"{_token_spans(view['tokens_b'], view['weights_b'])}</p>",
    ]
    aff = view.get("affinity")
    if aff:
        vals = _finite(v for r in aff for v in r)
        lo = min([*vals, 0.0])
        parts.append(
            '<div class="muted small">affinity (rows: '
            f"{esc(view['name_a'])}, columns: {esc(view['name_b'])})</div>"
        )
        parts.append(
            _table_heat(
                view["tokens_a"],
                view["tokens_b"],
                aff,
                cell_cls="acell",
                table_cls="heat affinity",
                lo=lo,
            )
        )
    parts.append("</div>")
    return "".join(parts)


def render_heads(view: Mapping[str, Any]) -> str:
    """One small heatmap per head (each shaded relative to its own largest weight)."""
    panels = []
    for name, m in zip(view["names"], view["heads"], strict=True):
        panels.append(
            f'<div class="head"><div class="muted small">{esc(name)}</div>'
            + _table_heat(
                view["rows"], view["cols"], m, cell_cls="hcell", table_cls="heat mini", labels=False
            )
            + "</div>"
        )
    return (
        '<div class="view heads"><div class="viewtitle">'
        f"{len(panels)} heads (rows: {esc(', '.join(view['rows'][:6]))}"
        f"{'…' if len(view['rows']) > 6 else ''})</div>"
        f'<div class="headgrid">{"".join(panels)}</div></div>'
    )


def render_words(view: Mapping[str, Any]) -> str:
    return (
        f'<div class="view words"><p class="tokens"><span class="rowlabel">'
        f"{esc(view['name'])}</span>{_token_spans(view['words'], view['weights'])}</p></div>"
    )


def extra_views(example: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The views an example's ``extra`` asks for (``{"hierarchy": ..., "coattention": ...,
    "heads": ..., "words": ...}``) and the extra keys they consume."""
    extra = example.get("extra") or {}
    if not isinstance(extra, Mapping):
        return {}, set()
    views: dict[str, Any] = {}
    used: set[str] = set()
    v = hierarchy_view(extra)
    if v is not None:
        views["hierarchy"] = v
        used |= set(HIERARCHY_KEYS)
    v = coattention_view(extra)
    if v is not None:
        views["coattention"] = v
        used |= set(COATTENTION_KEYS + COATTENTION_OPTIONAL)
    v = heads_view(extra, list(example.get("rows") or []), list(example.get("cols") or []))
    if v is not None:
        views["heads"] = v
        used |= set(HEADS_KEYS + HEADS_OPTIONAL)
    v = words_view(extra)
    if v is not None:
        views["words"] = v
        used |= set(WORDS_KEYS + WORDS_OPTIONAL)
    return views, used


VIEW_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "words": render_words,
    "hierarchy": render_hierarchy,
    "coattention": render_coattention,
    "heads": render_heads,
}


RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "tokens": render_tokens,
    "matrix": render_matrix,
    "image": render_image,
}


def render_example(example: Mapping[str, Any]) -> str:
    """One attention example (an ``AttentionExample.to_json()`` dict) as an HTML block."""
    kind = str(example.get("kind") or "tokens")
    renderer = RENDERERS.get(kind, render_matrix)
    try:
        body = renderer(example)
    except Exception as err:  # a malformed example must not lose the whole report
        body = f'<p class="muted">cannot draw this example: {esc(err)}</p>'
    gold = []
    if example.get("label") is not None:
        gold.append(f"gold: <b>{esc(example['label'])}</b>")
    if example.get("prediction") is not None:
        gold.append(f"predicted: <b>{esc(example['prediction'])}</b>")
    extra = example.get("extra") or {}
    views, used = extra_views(example)
    views_html = ""
    for name, view in views.items():
        try:
            views_html += VIEW_RENDERERS[name](view)
        except Exception as err:  # a malformed view must not lose the page
            views_html += f'<p class="muted">cannot draw the {esc(name)} view: {esc(err)}</p>'
    extra_html = ""
    rest = {k: v for k, v in extra.items() if k not in used} if isinstance(extra, Mapping) else {}
    if rest:
        items = ", ".join(
            f"{esc(k)}: {esc(json.dumps(v) if not isinstance(v, str) else v)}"
            for k, v in rest.items()
        )
        extra_html = f'<div class="gold">{items}</div>'
    gold_html = f'<div class="gold">{" · ".join(gold)}</div>' if gold else ""
    return (
        f'<div class="example" data-kind="{esc(kind)}"><h4>{esc(example.get("title", ""))}</h4>'
        f"{body}{views_html}{gold_html}{extra_html}</div>"
    )


# ----------------------------------------------------------------------------- sections


@dataclass
class ReportContext:
    """What a section's ``render`` receives."""

    data: ReportData
    title: str
    max_examples: int = 4
    generated: str = ""

    def colour(self, label: str) -> str:
        """The mechanism's colour (the same in every chart)."""
        labels = self.data.labels
        i = labels.index(label) if label in labels else len(labels)
        return assets.SERIES_COLOURS[i % len(assets.SERIES_COLOURS)]


@dataclass
class Section:
    """One part of the page. ``render(ctx)`` returns the section's inner HTML, or ``""`` to
    leave the section out; ``css`` and ``js`` are inlined once per report (``js`` runs at
    the end of the body; use ``attnlabReport.onReady(fn)`` for code that needs the DOM)."""

    id: str
    title: str
    render: Callable[[ReportContext], str]
    css: str = ""
    js: str = ""


def _section_header(ctx: ReportContext) -> str:
    data = ctx.data
    ab = data.ablation
    first = data.runs[0].run if data.runs else {}
    items: list[tuple[str, str]] = [("task", esc(data.task or "unknown"))]
    options = ab.get("task_options") or first.get("task_options") or {}
    data_used = _data_used(first, options, data.task)
    if data_used:
        items.append(("data", data_used))
    items.append(("source", f"<code>{esc(data.root)}</code> ({esc(data.kind)})"))
    if options:
        opts = ", ".join(
            f"<code>{esc(k)}={esc(json.dumps(v) if not isinstance(v, str) else v)}</code>"
            for k, v in sorted(options.items())
        )
        items.append(("options", opts))
    if ab.get("grid"):
        items.append(
            ("mechanisms", ", ".join(f"<code>{esc(_spec_label(s))}</code>" for s in ab["grid"]))
        )
    seeds = ab.get("seeds") or sorted({r.seed for r in data.runs if r.seed is not None})
    if seeds:
        items.append(("seeds", esc(", ".join(str(s) for s in seeds))))
    if ab.get("executor"):
        items.append(("executor", esc(ab["executor"])))
    dates = [r.run.get("started") for r in data.runs] + [r.run.get("finished") for r in data.runs]
    dates = sorted(str(d) for d in dates if d)
    when = ab.get("created") or (dates[0] if dates else None)
    if when:
        span = f"{esc(when)}"
        if dates and dates[-1] != when:
            span += f" – {esc(dates[-1])}"
        items.append(("date", span))
    items.append(("report written", esc(ctx.generated)))
    versions: dict[str, set[str]] = {}
    devices: set[str] = set()
    precisions: set[str] = set()
    for r in data.runs:
        for k, v in (r.run.get("versions") or {}).items():
            versions.setdefault(str(k), set()).add(str(v))
        if r.run.get("device"):
            name = r.run.get("device_name")
            devices.add(str(r.run["device"]) + (f" ({name})" if name else ""))
            # runs written before the precision was recorded trained in float32
            precisions.add(str(r.run.get("precision") or "fp32"))
    if versions:
        items.append(
            (
                "versions",
                ", ".join(
                    f"{esc(k)} {esc(' / '.join(sorted(v)))}" for k, v in sorted(versions.items())
                ),
            )
        )
    if devices:
        items.append(("device", esc(", ".join(sorted(devices)))))
        items.append(("precision", esc(", ".join(sorted(precisions)))))
    n_done, n_other = len(data.done), len(data.not_done)
    runs_text = f"{n_done} done" + (f", {n_other} not done" if n_other else "")
    if data.unreadable:
        runs_text += f", {len(data.unreadable)} with unreadable files"
    items.append(("runs", runs_text))
    return '<dl class="meta">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


#: Task options that choose the data (``data=sst``, ``corpus=bible``, ``problem=hull``, ...),
#: in the order the report names them.
DATA_OPTIONS = ("data", "dataset", "corpus", "problem", "source", "target", "tables", "path")


def _data_used(run: Mapping[str, Any], options: Mapping[str, Any], task: str | None) -> str:
    """The data row: what ``run.json`` says (``data``), else the task options that choose
    the data (the data this run used, not every source the task can read), else the
    task's one-line ``data_source``."""
    if run.get("data"):
        return esc(run["data"])
    chosen = [
        f"<code>{esc(k)}={esc(options[k])}</code>"
        for k in DATA_OPTIONS
        if isinstance(options.get(k), (str, int, float)) and options.get(k) != ""
    ]
    if chosen:
        return ", ".join(chosen)
    return esc(_task_data_source(task))


def _task_data_source(task: str | None) -> str:
    if not task:
        return ""
    try:
        from attnlab import registry

        return str(getattr(registry.get("task", task).cls, "data_source", "") or "")
    except Exception:  # an unknown task, or one whose module does not import here
        return ""


def _section_table(ctx: ReportContext) -> str:
    data = ctx.data
    metrics = data.test_metrics
    if not data.labels:
        return '<p class="muted">no runs.</p>'
    table = summarize(data)
    arrows = {m: ("↑" if data.higher_is_better(m) else "↓") for m in metrics}
    head = '<th class="label">mechanism</th>' + "".join(
        f'<th title="{"higher" if data.higher_is_better(m) else "lower"} is better">'
        f"{esc(m)} {arrows[m]}</th>"
        for m in metrics
    )
    head += "<th>seeds</th><th>failed</th>"
    body = []
    for label, row in table.items():
        cells = [f'<td class="label"><code>{esc(label)}</code></td>']
        for m in metrics:
            mean, std, n = row["test"][m]
            best = m in row["best"]
            cls = ' class="best"' if best else ""
            value = "" if mean is None else f"{mean:.17g}"
            sd = "" if std is None else f"{std:.17g}"
            cells.append(
                f'<td{cls} data-metric="{esc(m)}" data-value="{value}" data-std="{sd}" '
                f'data-n="{n}">'
                f"{esc(_fmt_mean_std(mean, std))}</td>"
            )
        cells.append(f'<td data-value="{row["seeds"]}">{row["seeds"]}</td>')
        cells.append(f'<td data-value="{row["failed"]}">{row["failed"]}</td>')
        body.append(f'<tr data-label="{esc(label)}">{"".join(cells)}</tr>')
    note = (
        '<p class="muted">Test metrics, mean ± sample standard deviation over the seeds that '
        "finished (no ± with one seed). ★ marks the best mechanism per metric (↑ higher is "
        "better, ↓ lower is better).</p>"
    )
    if not metrics:
        note += '<p class="muted">No finished run has test metrics.</p>'
    return (
        f'<table class="data sortable" id="ablation-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>{note}"
    )


def paired_analysis(data: ReportData, metric: str) -> dict[str, dict[str, Any]]:
    """Each mechanism against each baseline present (``mean``, ``uniform``) and against the
    best mechanism, on ``metric``, paired by seed (:mod:`attnlab.evaluation.significance`).
    Returns ``{reference: {label: PairedComparison.as_dict()}}``."""
    from attnlab.evaluation.significance import compare_to_baseline

    scores: dict[str, dict[int, float]] = {}
    for label in data.labels:
        for r in data.runs_of(label):
            value = (r.metrics.get("test") or {}).get(metric)
            if r.seed is not None and isinstance(value, (int, float)) and math.isfinite(value):
                scores.setdefault(label, {})[int(r.seed)] = float(value)
    refs = [b for b in ("mean", "uniform") if b in scores]
    higher = data.higher_is_better(metric)
    ranked = sorted(
        (lab for lab in scores if lab not in ("mean", "uniform")),
        key=lambda lab: sum(scores[lab].values()) / len(scores[lab]),
        reverse=higher,
    )
    if ranked:
        refs.append(ranked[0])
    return {
        ref: {k: v.as_dict() for k, v in compare_to_baseline(scores, ref).items()} for ref in refs
    }


def _section_analysis(ctx: ReportContext) -> str:
    data = ctx.data
    metric = data.primary or (data.test_metrics[0] if data.test_metrics else None)
    if metric is None:
        return '<p class="muted">no finished runs with test metrics.</p>'
    analysis = paired_analysis(data, metric)
    if not any(analysis.values()):
        if data.kind == "run":
            return ""  # one run: nothing to pair it with
        return (
            '<p class="muted">No paired tests: they need at least two mechanisms with '
            "finished runs on the same seeds.</p>"
        )
    parts = []
    for ref, rows in analysis.items():
        if not rows:
            continue
        body = []
        for label, c in rows.items():
            body.append(
                f'<tr data-label="{esc(label)}"><td class="label"><code>{esc(label)}</code></td>'
                f"<td>{c['n']}</td><td>{_fmt_num(c['diff'])}</td>"
                f"<td>{_fmt_num(c['effect_size'])}</td><td>{_fmt_num(c['t_p'])}</td>"
                f"<td>{_fmt_num(c['perm_p'])} (floor {_fmt_num(c['min_perm_p'])})</td></tr>"
            )
        parts.append(
            f"<h3>vs <code>{esc(ref)}</code> on test {esc(metric)}</h3>"
            f'<table class="data" id="analysis-{esc(ref)}"><thead><tr><th class="label">'
            "mechanism</th><th>paired seeds</th><th>mean difference</th><th>Cohen's d_z</th>"
            "<th>paired t-test p</th><th>sign-flip p</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
        )
    note = (
        '<p class="muted">Differences are mechanism minus reference over the seeds both ran '
        "(paired by seed). d_z = mean difference / sd of the differences. The exact sign-flip "
        "test cannot go below 2/2^n with n seeds (the floor), so few seeds cannot reach "
        "p &lt; 0.05 however large the effect; read the effect size with it.</p>"
    )
    return "".join(parts) + note


def _mean_curve(runs: Sequence[RunRecord], get: Callable[[Mapping[str, Any]], Any]) -> list:
    by_epoch: dict[float, list[float]] = {}
    for r in runs:
        for i, h in enumerate(r.history, start=1):
            epoch = h.get("epoch", i)
            value = get(h)
            if _finite([value]) and _finite([epoch]):
                by_epoch.setdefault(float(epoch), []).append(float(value))
    return [(e, statistics.fmean(v)) for e, v in sorted(by_epoch.items())]


def _section_curves(ctx: ReportContext) -> str:
    data = ctx.data
    if not any(r.history for r in data.done):
        return ""
    primary = data.primary
    loss, dev = [], []
    for label in data.labels:
        runs = data.runs_of(label)
        colour = ctx.colour(label)
        curve = _mean_curve(runs, lambda h: h.get("train_loss"))
        if curve:
            loss.append((label, colour, curve))
        if primary:
            curve = _mean_curve(runs, lambda h, p=primary: (h.get("dev") or {}).get(p))
            if curve:
                dev.append((label, colour, curve))
    charts = [
        line_chart_svg(loss, title="train loss", x_label="epoch", y_label="train loss"),
    ]
    if primary:
        charts.append(
            line_chart_svg(dev, title=f"dev {primary}", x_label="epoch", y_label=f"dev {primary}")
        )
    return (
        f'<div class="charts">{"".join(charts)}</div>'
        '<p class="muted">One line per mechanism: the mean over its seeds at each epoch.</p>'
    )


def _section_examples(ctx: ReportContext) -> str:
    data = ctx.data
    parts = []
    for label in data.labels:
        runs = [r for r in data.runs_of(label) if r.examples]
        if not runs:
            continue
        first = runs[0]
        blocks = "".join(render_example(e) for e in first.examples[: ctx.max_examples])
        seed = "" if first.seed is None else f" (seed {esc(first.seed)})"
        parts.append(
            f'<div class="mechanism" data-label="{esc(label)}">'
            f'<h3><code>{esc(label)}</code>{seed}</h3><div class="examples">{blocks}</div></div>'
        )
    if not parts:
        return ""
    legend = (
        '<p class="muted">Attention on test examples (the first seed of each mechanism). '
        'Shading: 0 <span class="scale"></span> the largest weight of the row (of the map, '
        "for matrices); a uniform row (the mean and uniform baselines: every weight 1/n) is "
        "shaded by its weights themselves; hover for the value.</p>"
    )
    return legend + "".join(parts)


#: CPU peak-memory means below this (MB) are shown as "< 0.1 †": the run fit in memory its
#: process already held (see :func:`_section_cost`).
PEAK_MEMORY_FLOOR_MB = 0.1


def _section_cost(ctx: ReportContext) -> str:
    data = ctx.data
    if not any(r.cost for r in data.done):
        return ""
    fields = [
        ("parameters", "parameters", 0),
        ("seconds_per_epoch", "s / epoch", 3),
        ("eval_ms_per_example", "eval ms / example", 3),
        ("peak_memory_mb", "peak memory (MB)", 1),
    ]
    head = '<th class="label">mechanism</th>' + "".join(f"<th>{esc(t)}</th>" for _, t, _ in fields)
    body = []
    below = False
    for label in data.labels:
        runs = data.runs_of(label)
        cells = [f'<td class="label"><code>{esc(label)}</code></td>']
        for key, _, digits in fields:
            mean, _, _ = mean_std(r.cost.get(key) for r in runs)
            title = ""
            if mean is None:
                text = "n/a"
            elif key == "peak_memory_mb" and mean < PEAK_MEMORY_FLOOR_MB:
                if any(str(r.run.get("device") or "cpu").startswith("cuda") for r in runs):
                    text = f"{mean:.2g}"  # CUDA's own count of the run's tensors
                else:
                    text, below = f"< {PEAK_MEMORY_FLOOR_MB:g} †", True
            elif digits == 0:
                text = f"{round(mean):,}"
            else:
                text = f"{mean:.{digits}f}"
            if key == "peak_memory_mb" and mean is not None:
                each = ", ".join(_fmt_num(v) for v in _finite(r.cost.get(key) for r in runs))
                title = f' title="per seed: {esc(each)}"'
            value = "" if mean is None else f"{mean:.17g}"
            cells.append(f'<td data-key="{key}" data-value="{value}"{title}>{esc(text)}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    dagger = (
        f" † Below {PEAK_MEMORY_FLOOR_MB:g} MB: the runs needed no memory beyond what their "
        "process already held -- an earlier run in the same process (an ablation with "
        "--jobs 1, a worker of --jobs N, the demo) had freed it. It does not mean the "
        "mechanism needs none."
        if below
        else ""
    )
    return (
        f'<table class="data sortable" id="cost-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
        '<p class="muted">Means over the finished seeds; n/a where the run did not measure it. '
        "Peak memory as the trainer measured it (on CUDA the peak allocated memory; on the CPU "
        "the largest increase of the resident memory over its value after the data is "
        "loaded, sampled every 10 ms: memory the process newly needed, so runs that share a "
        "process are not comparable -- the first includes one-time costs, later ones reuse "
        f"freed memory; hover a cell for the value of each seed).{esc(dagger)}</p>"
    )


def _section_failed(ctx: ReportContext) -> str:
    runs = ctx.data.not_done
    if not runs and not ctx.data.unreadable:
        return ""
    rows = []
    entries = [(r.label, r.seed, r.status, r.run_id, r.error or "") for r in runs]
    known = {r.run_id: r for r in ctx.data.runs}
    for run_id, why in ctx.data.unreadable:  # its files are damaged; the store may know it
        r = known.get(run_id)
        note = f"{why} (the report uses its row in results.sqlite)" if r is not None else why
        label, seed = (r.label, r.seed) if r is not None else ("?", None)
        entries.append((label, seed, "unreadable", run_id, note))
    for label, seed, status, run_id, error in entries:
        rows.append(
            f'<tr class="failed"><td class="label"><code>{esc(label)}</code></td>'
            f"<td>{esc(seed if seed is not None else '')}</td>"
            f'<td class="label">{esc(status)}</td><td class="label mono">{esc(run_id)}</td>'
            f'<td class="label"><pre>{esc(error)}</pre></td></tr>'
        )
    return (
        '<table class="data" id="failed-table"><thead><tr><th class="label">mechanism</th>'
        '<th>seed</th><th class="label">status</th><th class="label">run</th>'
        f'<th class="label">error</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


# ----------------------------------------------------------------------------- viewer


def _clean(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def script_json(payload: Any) -> str:
    """``payload`` as JSON that is safe inside ``<script type="application/json">``: no
    ``<``, ``>`` or ``&`` (written as ``\\u003c`` ...), no line separators U+2028/9, no NaN."""
    text = json.dumps(_clean(payload), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for ch, rep in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, rep)
    return text


def _viewer_example(example: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        k: example.get(k)
        for k in ("title", "kind", "rows", "cols", "weights", "label", "prediction", "grid")
    }
    out["kind"] = str(out.get("kind") or "tokens")
    out["rows"] = _strings(out.get("rows")) or []
    out["cols"] = _strings(out.get("cols")) or []
    out["weights"] = [_floats(r) or [] for r in (example.get("weights") or [])]
    image = example.get("image")
    out["image"] = None
    if image:
        try:
            out["image"] = png_data_uri(image)
        except (TypeError, ValueError, IndexError):
            out["image"] = None
    views, used = extra_views(example)
    out["views"] = views
    extra = example.get("extra") or {}
    out["extra"] = (
        {k: v for k, v in extra.items() if k not in used} if isinstance(extra, Mapping) else {}
    )
    return out


def viewer_payload(data: ReportData) -> dict[str, Any]:
    """What the interactive viewer embeds: every finished run's examples, per mechanism
    (in the table's order) and seed: ``{"heat": [r, g, b], "mechanisms": [{"label",
    "runs": [{"seed", "run_id", "examples": [...]}]}]}``. Pictures become PNG data URIs;
    ``views`` holds the extra views (:func:`extra_views`)."""
    mechanisms = []
    for label in data.labels:
        runs = []
        for r in data.runs_of(label):
            if not r.examples:
                continue
            runs.append(
                {
                    "seed": r.seed,
                    "run_id": r.run_id,
                    "examples": [_viewer_example(e) for e in r.examples],
                }
            )
        if runs:
            mechanisms.append({"label": label, "runs": runs})
    return {"heat": list(assets.HEAT_RGB), "mechanisms": mechanisms}


def _section_viewer(ctx: ReportContext) -> str:
    payload = viewer_payload(ctx.data)
    if not payload["mechanisms"]:
        return ""
    n = sum(len(run["examples"]) for m in payload["mechanisms"] for run in m["runs"])
    return (
        '<div id="attention-viewer" class="viewer">'
        '<p class="viewer-fallback muted">The interactive viewer needs JavaScript; the '
        'static heatmaps of <a href="#attention">Attention on test examples</a> show the '
        "first seed of each mechanism.</p></div>"
        f'<p class="muted">{n} examples of {len(payload["mechanisms"])} mechanism(s), every '
        "seed. Choose a mechanism, a seed and an example (◀ ▶); hover or click a token or "
        "cell for its exact weight; click a row of a matrix (e.g. a target word) to see "
        "its weights over the columns; compare two mechanisms on the same example.</p>"
        f'<script type="application/json" id="viewer-data">{script_json(payload)}</script>'
        '<pre id="viewer-selftest" class="selftest"></pre>'
    )


# ----------------------------------------------------------------------------- explanation


def scatter_svg(
    xs: Sequence[Any],
    ys: Sequence[Any],
    *,
    title: str,
    x_label: str,
    y_label: str,
    width: int = 420,
    height: int = 300,
) -> str:
    """An inline SVG scatter plot of the finite ``(x, y)`` pairs (one ``circle.pt`` each, in
    input order, with the values in its tooltip)."""
    pts = [
        (float(x), float(y))
        for x, y in zip(_num_or_nan(xs), _num_or_nan(ys), strict=False)
        if math.isfinite(x) and math.isfinite(y)
    ]
    left, right, top, bottom = 56, 14, 26, 42
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [
        f'<svg class="scatter" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{esc(title)}">',
        f'<text x="{left}" y="17" style="font-size:12px;font-weight:600">{esc(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{left}" y="{top + plot_h / 2:.0f}">no data</text></svg>')
        return "".join(out)
    x0, x1, xt = _ticks(min(p[0] for p in pts), max(p[0] for p in pts), 5)
    y0, y1, yt = _ticks(min(p[1] for p in pts), max(p[1] for p in pts), 5)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h

    for v in yt:
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{sy(v):.1f}" '
            f'y2="{sy(v):.1f}"/><text x="{left - 5}" y="{sy(v) + 4:.1f}" text-anchor="end">'
            f"{esc(_tick_text(v))}</text>"
        )
    for v in xt:
        out.append(
            f'<text x="{sx(v):.1f}" y="{top + plot_h + 15}" text-anchor="middle">'
            f"{esc(_tick_text(v))}</text>"
        )
    out.append(
        f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>'
        f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" '
        f'y2="{top + plot_h}"/>'
        f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 32}" text-anchor="middle">'
        f"{esc(x_label)}</text>"
        f'<text transform="translate(13,{top + plot_h / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{esc(y_label)}</text>'
    )
    for x, y in pts:
        out.append(
            f'<circle class="pt" cx="{sx(x):.2f}" cy="{sy(y):.2f}" r="3" '
            f'fill="{assets.SERIES_COLOURS[0]}" fill-opacity="0.6">'
            f"<title>{x:.4f}, {y:.4f}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)


def _num_or_nan(values: Any) -> list[float]:
    if not isinstance(values, (list, tuple)):
        return []
    return [_as_float(v) if not isinstance(v, bool) else float("nan") for v in values]


def _num_cell(value: Any, key: str, digits: int = 4) -> str:
    v = _as_float(value) if not isinstance(value, bool) else float("nan")
    if value is None or not math.isfinite(v):
        return f'<td data-key="{esc(key)}" data-value="">n/a</td>'
    text = str(int(v)) if isinstance(value, int) else f"{v:.{digits}f}"
    return f'<td data-key="{esc(key)}" data-value="{v:.17g}">{esc(text)}</td>'


def _explain_table(
    table_id: str, head: Sequence[str], rows: Sequence[tuple[str, Sequence[tuple[str, Any]]]]
) -> str:
    """A table whose first column is a text label and the others numbers (``(key, value)``
    pairs; a cell's ``data-key`` is its key, ``data-value`` its full-precision value)."""
    th = "".join(
        f'<th class="{"label" if i == 0 else ""}">{esc(h)}</th>' for i, h in enumerate(head)
    )
    body = []
    for label, cells in rows:
        tds = "".join(_num_cell(v, k) for k, v in cells)
        body.append(f'<tr data-label="{esc(label)}"><td class="label">{esc(label)}</td>{tds}</tr>')
    return (
        f'<table class="data explain" id="{esc(table_id)}"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def read_explanation(run: RunRecord) -> dict[str, Any] | None:
    """``RUN_DIR/explanation/explanation.json`` of a run (None when there is none)."""
    if run.run_dir is None:
        return None
    path = run.run_dir / "explanation" / "explanation.json"
    if not path.is_file():
        return None
    result = _read_json(path, None)
    return result if isinstance(result, dict) else None


#: The PNG plots of ``attnlab explain`` that the report draws itself as SVG (from the same
#: numbers), by the result key they come from: the PNG is left out when the SVG is drawn.
SVG_DRAWN_PLOTS = {"permutation": "permutation.png", "adversarial": "adversarial.png"}


def _explanation_plots(
    run: RunRecord, result: Mapping[str, Any], skip: Iterable[str] = ()
) -> list[tuple[str, str]]:
    """(name, data URI) of the PNG plots next to explanation.json: those the JSON lists, else
    every ``*.png`` of the folder (sorted), without the names in ``skip``. Only plain file
    names inside the folder."""
    folder = run.run_dir / "explanation" if run.run_dir is not None else None
    if folder is None:
        return []
    names = result.get("plots")
    if not isinstance(names, list):
        names = sorted(p.name for p in folder.glob("*.png"))
    out = []
    skipped = set(skip)
    for name in names:
        name = str(name)
        if "/" in name or "\\" in name or name.startswith(".") or not name.endswith(".png"):
            continue
        if name in skipped:
            continue
        path = folder / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if not data.startswith(b"\x89PNG\r\n\x1a\n"):
            continue
        out.append((name, "data:image/png;base64," + base64.b64encode(data).decode("ascii")))
    return out


def render_explanation(run: RunRecord, result: Mapping[str, Any], index: int) -> str:
    """One run's explanation results (``attnlab explain``) as tables, SVG scatters and the
    PNG plots that no SVG shows already (:data:`SVG_DRAWN_PLOTS`)."""
    p = f"explain-{index}"
    parts = [
        f'<div class="explanation" data-run="{esc(run.run_id)}">',
        f"<h3><code>{esc(run.label)}</code>"
        f"{'' if run.seed is None else f' (seed {esc(run.seed)})'}</h3>",
        f'<p class="muted">{esc(result.get("instances", "?"))} test instances; run '
        f"<code>{esc(run.run_id)}</code>.</p>",
    ]
    kendall = result.get("kendall")
    if isinstance(kendall, Mapping) and kendall:
        parts.append("<h4>Kendall τ between importance measures (Jain &amp; Wallace)</h4>")
        parts.append(
            _explain_table(
                f"{p}-kendall",
                ["pair", "mean τ", "std", "fraction p ≤ 0.05", "n"],
                [
                    (
                        str(k),
                        [
                            ("mean", v.get("mean")),
                            ("std", v.get("std")),
                            ("significant", v.get("significant")),
                            ("n", v.get("n")),
                        ],
                    )
                    for k, v in kendall.items()
                    if isinstance(v, Mapping)
                ],
            )
        )
    summaries = []
    perm = result.get("permutation")
    if isinstance(perm, Mapping) and isinstance(perm.get("median_tvd"), Mapping):
        s = perm["median_tvd"]
        summaries.append(
            (
                "permutation: median output TVD",
                [(k, s.get(k)) for k in ("mean", "std", "median", "n")],
            )
        )
    adv = result.get("adversarial")
    if isinstance(adv, Mapping) and isinstance(adv.get("max_jsd"), Mapping):
        s = adv["max_jsd"]
        summaries.append(
            (
                f"adversarial attention (TVD ≤ {adv.get('epsilon')}): max JSD",
                [(k, s.get(k)) for k in ("mean", "std", "median", "n")],
            )
        )
    if summaries:
        parts.append("<h4>Permutation and adversarial attention (Jain &amp; Wallace)</h4>")
        parts.append(
            _explain_table(f"{p}-summaries", ["test", "mean", "std", "median", "n"], summaries)
        )
        if isinstance(adv, Mapping):
            parts.append(
                _explain_table(
                    f"{p}-adversarial",
                    ["adversarial attention", "value"],
                    [
                        ("epsilon (TVD bound)", [("epsilon", adv.get("epsilon"))]),
                        ("JSD upper bound", [("jsd_bound", adv.get("jsd_bound"))]),
                        (
                            "fraction with max JSD > bound / 2",
                            [("fraction_above_half_bound", adv.get("fraction_above_half_bound"))],
                        ),
                    ],
                )
            )
    charts = []
    drawn = []  # the result keys drawn as SVG scatters
    if isinstance(perm, Mapping):
        drawn.append("permutation")
        charts.append(
            scatter_svg(
                perm.get("max_weight") or [],
                perm.get("per_instance") or [],
                title="permutation test",
                x_label="max attention weight",
                y_label="median output TVD",
            )
        )
    if isinstance(adv, Mapping):
        drawn.append("adversarial")
        charts.append(
            scatter_svg(
                adv.get("max_weight") or [],
                adv.get("per_instance") or [],
                title="adversarial attention",
                x_label="max attention weight",
                y_label="max JSD",
            )
        )
    if charts:
        parts.append(f'<div class="charts">{"".join(charts)}</div>')
    uni = result.get("uniform")
    if isinstance(uni, Mapping):
        parts.append("<h4>Uniform weights at test time (Wiegreffe &amp; Pinter)</h4>")
        rows = [
            (name, [("accuracy", uni.get(f"{name}_accuracy")), ("f1", uni.get(f"{name}_f1"))])
            for name in ("learned", "uniform")
        ]
        la, ua = _as_float(uni.get("learned_accuracy")), _as_float(uni.get("uniform_accuracy"))
        lf, uf = _as_float(uni.get("learned_f1")), _as_float(uni.get("uniform_f1"))
        rows.append(("learned − uniform", [("accuracy", la - ua), ("f1", lf - uf)]))
        parts.append(_explain_table(f"{p}-uniform", ["weights", "accuracy", "macro F1"], rows))
    fw = result.get("frozen_weights")
    if isinstance(fw, Mapping) and fw:
        parts.append("<h4>Frozen-weight MLP (Wiegreffe &amp; Pinter)</h4>")
        parts.append(
            _explain_table(
                f"{p}-frozen",
                ["weights", "accuracy", "macro F1"],
                [
                    (str(k), [("accuracy", v.get("accuracy")), ("f1", v.get("f1"))])
                    for k, v in fw.items()
                    if isinstance(v, Mapping)
                ],
            )
        )
    sweep = result.get("adversarial_models")
    if isinstance(sweep, list) and sweep:
        parts.append("<h4>Adversarial models (Wiegreffe &amp; Pinter)</h4>")
        parts.append(
            _explain_table(
                f"{p}-advmodels",
                ["λ", "mean output TVD", "mean attention JSD", "accuracy"],
                [
                    (
                        str(s.get("lambda")),
                        [
                            ("mean_tvd", s.get("mean_tvd")),
                            ("mean_jsd", s.get("mean_jsd")),
                            ("accuracy", s.get("accuracy")),
                        ],
                    )
                    for s in sweep
                    if isinstance(s, Mapping)
                ],
            )
        )
    sv = result.get("seed_variance")
    if isinstance(sv, Mapping):
        parts.append("<h4>Seed variance (Wiegreffe &amp; Pinter)</h4>")
        others = sv.get("runs") or []
        parts.append(
            _explain_table(
                f"{p}-seeds",
                ["against", "mean attention JSD", "mean output TVD", "instances"],
                [
                    (
                        f"{len(others)} other run(s)",
                        [
                            ("mean_jsd", sv.get("mean_jsd")),
                            ("mean_tvd", sv.get("mean_tvd")),
                            ("n", len(sv.get("jsd") or [])),
                        ],
                    )
                ],
            )
        )
        if others:
            parts.append(
                '<p class="muted small">compared with: '
                + ", ".join(f"<code>{esc(o)}</code>" for o in others)
                + "</p>"
            )
        if sv.get("jsd") and sv.get("tvd"):
            parts.append(
                scatter_svg(
                    sv["jsd"],
                    sv["tvd"],
                    title="seed variance per instance",
                    x_label="attention JSD",
                    y_label="output TVD",
                )
            )
    plots = _explanation_plots(run, result, skip=[SVG_DRAWN_PLOTS[k] for k in drawn])
    if plots:
        parts.append('<div class="plots">')
        for name, uri in plots:
            parts.append(
                f'<figure><img src="{uri}" alt="{esc(name)}" class="plot">'
                f"<figcaption>{esc(name)}</figcaption></figure>"
            )
        parts.append("</div>")
    parts.append("</div>")
    return "".join(parts)


def _section_explanation(ctx: ReportContext) -> str:
    parts = []
    index = 0
    for label in ctx.data.labels:
        for run in ctx.data.runs_of(label):
            result = read_explanation(run)
            if result is None:
                continue
            parts.append(render_explanation(run, result, index))
            index += 1
    if not parts:
        return ""
    note = (
        '<p class="muted">Results of <code>attnlab explain RUN_DIR</code> '
        "(<code>explanation/explanation.json</code>): Jain &amp; Wallace (2019) -- Kendall τ "
        "between attention, gradient and leave-one-out importance, the permutation test, "
        "adversarial attention; Wiegreffe &amp; Pinter (2019) -- uniform weights at test "
        "time, the frozen-weight MLP, adversarial models, seed variance. n/a: not computed "
        "(e.g. too short instances).</p>"
    )
    return note + "".join(parts)


SECTIONS: list[Section] = [
    Section("overview", "Overview", _section_header),
    Section("ablation", "Ablation table", _section_table),
    Section("analysis", "Ablation analysis: paired tests over seeds", _section_analysis),
    Section("failed", "Failed or unfinished runs", _section_failed),
    Section("curves", "Learning curves", _section_curves),
    Section("attention", "Attention on test examples", _section_examples),
    Section(
        "viewer",
        "Interactive attention viewer",
        _section_viewer,
        css=viewer_assets.VIEWER_CSS,
        js=viewer_assets.VIEWER_JS,
    ),
    Section("explanation", "Is attention explanation?", _section_explanation),
    Section("cost", "Cost per mechanism", _section_cost),
]
"""The default sections, in page order (:func:`add_section` changes it)."""


def add_section(
    section: Section, *, before: str | None = None, after: str | None = None
) -> Section:
    """Add a section to every later report (or replace the one with the same id): at the
    end, or ``before`` / ``after`` the section with that id. Returns the section."""
    if before is not None and after is not None:
        raise ValueError("give before or after, not both")
    for i, s in enumerate(SECTIONS):
        if s.id == section.id:
            del SECTIONS[i]
            break
    ids = [s.id for s in SECTIONS]
    anchor = before if before is not None else after
    if anchor is None:
        SECTIONS.append(section)
        return section
    if anchor not in ids:
        raise KeyError(f"no section {anchor!r}; sections: {', '.join(ids)}")
    index = ids.index(anchor) + (0 if before is not None else 1)
    SECTIONS.insert(index, section)
    return section


# ----------------------------------------------------------------------------- page


def render_report(
    path: str | Path,
    *,
    title: str | None = None,
    max_examples: int = 4,
    sections: Sequence[Section] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> str:
    """The report of a run or ablation directory as one HTML string (see :func:`write_report`)."""
    data = load_report_data(path, on_warning=on_warning)
    if title is None:
        what = "run" if data.kind == "run" else "ablation"
        title = f"attnlab {what} report: {data.task or Path(path).name}"
    ctx = ReportContext(
        data=data,
        title=title,
        max_examples=max_examples,
        generated=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    rendered = []
    for s in SECTIONS if sections is None else sections:
        body = s.render(ctx)
        if body:
            rendered.append((s, body))
    toc = " ".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s, _ in rendered)
    css = assets.CSS + "".join(s.css for s, _ in rendered if s.css)
    js = "".join(f"<script>{s.js}</script>" for s, _ in rendered if s.js)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="attnlab report">',
        f"<title>{esc(title)}</title>",
        f"<style>{css}</style>",
        f"<script>{assets.ERROR_RECORDER_JS}</script>",
        f"<script>{assets.MAIN_JS}</script>",
        "</head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<nav class="toc">{toc}</nav>',
        '<pre id="report-errors" data-count="0"></pre>',
    ]
    for s, body in rendered:
        parts.append(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{body}</section>')
    parts.append(js)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(
    path: str | Path,
    out: str | Path | None = None,
    *,
    title: str | None = None,
    max_examples: int = 4,
    sections: Sequence[Section] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Path:
    """Write the HTML report of a run directory or an ablation directory.

    Args:
        path: a run directory (has ``run.json``) or an ablation directory (has
            ``ablation.json`` and/or ``runs/``).
        out: the HTML file to write (default ``<path>/report.html``).
        title: the page title (default ``"attnlab ablation report: <task>"``).
        max_examples: attention examples drawn per mechanism (from its first seed).
        sections: the sections to render (default :data:`SECTIONS`).
        on_warning: called with one line for every run directory of an ablation that is
            skipped because its files cannot be read (the page lists them too).

    Returns:
        The path of the written file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ReportError: ``path`` is neither kind of directory, or a file of a single run
            directory, ``ablation.json`` or ``results.sqlite`` cannot be read.
    """
    text = render_report(
        path, title=title, max_examples=max_examples, sections=sections, on_warning=on_warning
    )
    target = Path(out) if out is not None else Path(path) / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    return target


@click.command("report")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=True, path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The HTML file to write (default: DIR/report.html).",
)
@click.option("--title", default=None, help="The page title.")
@click.option(
    "--max-examples",
    type=click.IntRange(min=0),
    default=4,
    show_default=True,
    help="Attention examples drawn per mechanism.",
)
def report_command(directory: Path, out: Path | None, title: str | None, max_examples: int) -> None:
    """Write a self-contained HTML report of a run or ablation directory DIR (the ablation
    table, learning curves, attention heatmaps on test examples, cost) and print its path.

    A run of an ablation whose files cannot be read is skipped with a warning on stderr.
    """

    def warn(message: str) -> None:
        click.echo(f"warning: {message}", err=True)

    try:
        target = write_report(
            directory, out, title=title, max_examples=max_examples, on_warning=warn
        )
    except (FileNotFoundError, ReportError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(str(target))
