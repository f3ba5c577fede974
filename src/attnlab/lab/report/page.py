"""The page: the chosen sections assembled into one self-contained HTML file (the
stylesheets and scripts inlined, nothing loaded from elsewhere), written atomically."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from attnlab._checks import ConfigError, check_callable, check_int, check_path
from attnlab.lab.files import check_folder, make_folder, utc_now, write_text
from attnlab.lab.report.context import ReportContext, Section
from attnlab.lab.report.data import load_report_data
from attnlab.lab.report.markup import esc
from attnlab.lab.report.sections import SECTIONS
from attnlab.lab.report.theme import asset

__all__ = ["render_report", "write_report"]


def _page(title: str, rendered: Sequence[tuple[Section, str]]) -> str:
    """The HTML document of the rendered sections: head (styles, the error recorder, the
    page script), title, table of contents, the sections, then the sections' scripts."""
    toc = " ".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s, _ in rendered)
    css = asset("report.css") + "".join(s.css for s, _ in rendered if s.css)
    js = "".join(f"<script>{s.js}</script>" for s, _ in rendered if s.js)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="attnlab report">',
        f"<title>{esc(title)}</title>",
        f"<style>{css}</style>",
        # the error recorder runs first, so that an error in any later script of the page
        # is written into #report-errors (the browser test reads it back)
        f"<script>{asset('errors.js')}</script>",
        f"<script>{asset('report.js')}</script>",
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


def _check_settings(
    title: object, max_examples: object, sections: object, on_warning: object
) -> None:
    """The report's settings, checked before anything is read (one line each)."""
    if title is not None and not isinstance(title, str):
        raise ConfigError(f"title must be text or None, got {type(title).__name__}")
    check_int(max_examples, "max_examples", 0)
    if sections is not None:
        if isinstance(sections, str | Section) or not isinstance(sections, Sequence):
            raise ConfigError(f"sections must be a sequence of Section, got {sections!r}")
        for section in sections:
            if not isinstance(section, Section):
                raise ConfigError(f"sections must hold Section objects, got {section!r}")
    if on_warning is not None:
        check_callable(on_warning, "on_warning")


def render_report(
    path: str | Path,
    *,
    title: str | None = None,
    max_examples: int = 4,
    sections: Sequence[Section] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> str:
    """The report of a run or ablation directory as one HTML string (see :func:`write_report`)."""
    _check_settings(title, max_examples, sections, on_warning)
    data = load_report_data(check_path(path, "path"), on_warning=on_warning)
    if title is None:
        title = f"attnlab {data.kind} report: {data.task or Path(path).name}"
    ctx = ReportContext(data=data, title=title, max_examples=max_examples, generated=utc_now())
    rendered = []
    for s in SECTIONS if sections is None else sections:
        body = s.render(ctx)
        if body:
            rendered.append((s, body))
    return _page(title, rendered)


def write_report(
    path: str | Path,
    out: str | Path | None = None,
    *,
    title: str | None = None,
    max_examples: int = 4,
    sections: Sequence[Section] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> Path:
    """Write the HTML report of a run directory, an ablation directory or a folder of run
    directories.

    Args:
        path: a run directory (has ``run.json``), an ablation directory (has
            ``ablation.json`` and/or ``runs/``) or a folder of run directories of one task
            and the same task options (what ``attnlab train`` fills).
        out: the HTML file to write (default ``<path>/report.html``).
        title: the page title (default ``"attnlab ablation report: <task>"``).
        max_examples: attention examples drawn per mechanism (from its first seed).
        sections: the sections to render (default :data:`SECTIONS`).
        on_warning: called with one line for every run directory of an ablation that is
            skipped because its files cannot be read (the page lists them too).

    Returns:
        The path of the written file (written atomically: a reader never sees half a page).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ReportError: ``path`` is none of these directories, the runs of a folder of run
            directories differ in task or task options, or a file of a single run
            directory, ``ablation.json`` or ``results.sqlite`` cannot be read.
        ConfigError: a file stands where a folder above ``out`` must be, ``out`` is a
            folder, or a setting is off (an empty ``path``, ``max_examples < 0``, a
            section that is no :class:`Section`): checked before anything is read.
    """
    path = check_path(path)
    if out is not None:
        out = check_path(out, "out")
        if out.is_dir():
            raise ConfigError(f"report file {out} is a folder: name the HTML file to write")
        check_folder(out.parent, f"report file {out}")
    text = render_report(
        path, title=title, max_examples=max_examples, sections=sections, on_warning=on_warning
    )
    target = out if out is not None else path / "report.html"
    make_folder(target.parent, f"report file {target}")
    write_text(target, text)
    return target
