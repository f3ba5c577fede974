"""The overview section: what was run (task, data, options, mechanisms, seeds), where and
when (source, dates, versions, device, precision, torch.compile) and how many runs
finished."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnlab.lab.report.context import ReportContext
from attnlab.lab.report.data import ReportData, RunRecord, spec_text
from attnlab.lab.report.markup import esc, option_text

__all__ = ["DATA_OPTIONS", "section_overview"]

#: Task options that choose the data (``data=sst``, ``corpus=bible``, ``problem=hull``, ...),
#: in the order the report names them.
DATA_OPTIONS = ("data", "dataset", "corpus", "problem", "source", "target", "tables", "path")

Item = tuple[str, str]


def _task_data_source(task: str | None) -> str:
    """The task's one-line ``data_source`` (``""`` for an unknown task)."""
    if not task:
        return ""
    try:
        import attnlab.lab.tasks  # noqa: F401  (registers the built-in tasks)
        from attnlab import registry

        return str(getattr(registry.get("task", task).cls, "data_source", "") or "")
    except Exception:  # an unknown task, or one whose module does not import here
        return ""


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


def _options(options: Mapping[str, Any]) -> str | None:
    if not options:
        return None
    return ", ".join(f"<code>{esc(k)}={option_text(v)}</code>" for k, v in sorted(options.items()))


def _mechanisms(ablation: Mapping[str, Any]) -> str | None:
    if not ablation.get("grid"):
        return None
    return ", ".join(f"<code>{esc(spec_text(s))}</code>" for s in ablation["grid"])


def _seeds(data: ReportData) -> str | None:
    seeds = data.ablation.get("seeds") or sorted({r.seed for r in data.runs if r.seed is not None})
    return esc(", ".join(str(s) for s in seeds)) if seeds else None


def _dates(data: ReportData) -> str | None:
    """The ablation's creation (else the first start of a run) to the last date of a run."""
    dates = [r.run.get("started") for r in data.runs] + [r.run.get("finished") for r in data.runs]
    dates = sorted(str(d) for d in dates if d)
    when = data.ablation.get("created") or (dates[0] if dates else None)
    if not when:
        return None
    span = f"{esc(when)}"
    if dates and dates[-1] != when:
        span += f" – {esc(dates[-1])}"
    return span


def _environment(runs: Sequence[RunRecord]) -> list[Item]:
    """The versions, devices, precisions and ``torch.compile`` backends the runs record
    (the backends only where a run was compiled: its times include the compilation)."""
    versions: dict[str, set[str]] = {}
    devices: set[str] = set()
    precisions: set[str] = set()
    backends = {str(r.run.get("compile") or "none (eager)") for r in runs}
    for r in runs:
        for k, v in (r.run.get("versions") or {}).items():
            versions.setdefault(str(k), set()).add(str(v))
        if r.run.get("device"):
            name = r.run.get("device_name")
            devices.add(str(r.run["device"]) + (f" ({name})" if name else ""))
            # runs written before the precision was recorded trained in float32
            precisions.add(str(r.run.get("precision") or "fp32"))
    items = []
    if versions:
        text = ", ".join(
            f"{esc(k)} {esc(' / '.join(sorted(v)))}" for k, v in sorted(versions.items())
        )
        items.append(("versions", text))
    if devices:
        items.append(("device", esc(", ".join(sorted(devices)))))
        items.append(("precision", esc(", ".join(sorted(precisions)))))
    if backends - {"none (eager)"}:
        items.append(("torch.compile", esc(", ".join(sorted(backends)))))
    resumed = _resumed(runs)
    if resumed:
        items.append(("resumed", resumed))
    return items


def _resumed(runs: Sequence[RunRecord]) -> str | None:
    """The runs that went on after an interruption (``run.json``'s ``resumed_after``), and
    after which epochs: their times and peak memory are those of several processes."""
    parts = []
    for r in runs:
        after = r.run.get("resumed_after")
        if isinstance(after, list) and after:
            epochs = ", ".join(str(e) for e in after)
            parts.append(f"{esc(r.run_id)} after epoch{'s' if len(after) > 1 else ''} {epochs}")
    if not parts:
        return None
    return "; ".join(parts) + " (times summed over the processes, memory their largest)"


def _runs(data: ReportData) -> str:
    n_done, n_other = len(data.done), len(data.not_done)
    text = f"{n_done} done" + (f", {n_other} not done" if n_other else "")
    if data.unreadable:
        text += f", {len(data.unreadable)} with unreadable files"
    return text


def section_overview(ctx: ReportContext) -> str:
    """The overview as a definition list (rows without a value are left out)."""
    data = ctx.data
    ab = data.ablation
    first = data.runs[0].run if data.runs else {}
    options = ab.get("task_options") or first.get("task_options") or {}
    rows: list[tuple[str, str | None]] = [
        ("task", esc(data.task or "unknown")),
        ("data", _data_used(first, options, data.task) or None),
        ("source", f"<code>{esc(data.root)}</code> ({esc(data.kind)})"),
        ("options", _options(options)),
        ("mechanisms", _mechanisms(ab)),
        ("seeds", _seeds(data)),
        ("executor", esc(ab["executor"]) if ab.get("executor") else None),
        ("date", _dates(data)),
        ("report written", esc(ctx.generated)),
        *_environment(data.runs),
        ("runs", _runs(data)),
    ]
    return (
        '<dl class="meta">'
        + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows if v is not None)
        + "</dl>"
    )
