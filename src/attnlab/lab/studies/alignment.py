"""``attnlab aer-table``: the translator's attention as word alignment, over trained runs.

* :func:`translator_aer`: the AER of a trained ``translation`` run's attention on a split
  against the split's gold alignments (the silver Strong's-number links for the Bible).
* :func:`aer_table`: per mechanism of an ablation directory, AER / precision / recall mean
  ± sample std over seeds beside the split's BLEU (``metrics.json``), with the baseline
  aligners of :func:`~attnlab.evaluation.attention_alignment.baseline_aers`;
  :func:`format_aer_table` prints it (plain text or Markdown); ``attnlab aer-table``
  (:data:`aer_table_command`).

The measures (link extraction, AER, baselines, the argmax oracle) are the pure functions of
:mod:`attnlab.evaluation.attention_alignment`; this module loads the runs. Cost: one
teacher-forced pass over the split per run, plus the measures' cost.

Source: M.-T. Luong, H. Pham and C. D. Manning, "Effective Approaches to Attention-based
Neural Machine Translation", EMNLP 2015 (AER of global / local attention, table 6).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab._checks import check_flags, check_path
from attnlab.data._common import check_split
from attnlab.evaluation.aer import AERResult
from attnlab.evaluation.attention_alignment import (
    EXTRACTIONS,
    SCOPES,
    SPLITS,
    attention_links,
    baseline_aers,
    score_links,
    translation_part,
)
from attnlab.lab.ablation_record import read_ablation_record
from attnlab.lab.progress import ProgressBar
from attnlab.lab.seed_stats import mean_std

__all__ = [
    "AERRow",
    "aer_table",
    "aer_table_command",
    "format_aer_table",
    "translator_aer",
]


# ----------------------------------------------------------------------------- runs


def _load_run(run_dir: str | Path, cache: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """``(task, data, model)`` of a finished ``translation`` run
    (:func:`attnlab.lab.training.load_run`: its checkpoint checked against ``run.json``),
    with the data shared through ``cache`` between runs with the same task options."""
    from attnlab.lab.training import load_run, read_run

    info = read_run(run_dir)
    if info.get("task") != "translation":
        raise ValueError(f"run {str(run_dir)!r} is a {info.get('task')!r} run, not 'translation'")
    return load_run(run_dir, data_cache=cache)


def translator_aer(
    run_dir: str | Path,
    split: str = "test",
    *,
    extraction: str = "argmax",
    threshold: float = 0.5,
    scope: str = "all",
    _cache: dict[str, Any] | None = None,
) -> AERResult:
    """AER, precision and recall of a ``translation`` run's attention on ``split``.

    Loads the run (its options, data and best-epoch weights), computes the teacher-forced
    attention of every pair (``TranslationTask.attention_matrices``: gold target words
    only, the EOS step left out, real source words only), extracts links
    (:func:`~attnlab.evaluation.attention_alignment.attention_links`) and scores them
    against ``data.split(split).alignments``. ``scope="linked"`` counts only links between
    words that the gold links at all
    (:func:`~attnlab.evaluation.attention_alignment.restrict_to_linked`).
    """
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {', '.join(EXTRACTIONS)}, got {extraction!r}")
    check_split(split, SPLITS, none=False)
    task, data, model = _load_run(check_path(run_dir, "run_dir"), _cache)
    part = translation_part(data, split)
    matrices = task.attention_matrices(model, data, split)
    links = attention_links(matrices, extraction=extraction, threshold=threshold)
    return score_links(part.alignments, links, scope)


# ----------------------------------------------------------------------------- tables


@dataclass
class AERRow:
    """One row of an AER table: a mechanism over seeds, or a baseline (``n`` = 0, no
    BLEU). The figures are means over seeds of the finite values
    (:func:`attnlab.lab.seed_stats.mean_std`: None without any); ``*_std`` is the sample
    standard deviation over seeds (None for one seed)."""

    mechanism: str
    n: int
    aer: float | None
    aer_std: float | None
    precision: float | None
    precision_std: float | None
    recall: float | None
    recall_std: float | None
    bleu: float | None = None
    bleu_std: float | None = None
    kind: str = "attention"
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _option_tag(options: Mapping[str, Any]) -> str:
    lam = options.get("supervise") or 0.0
    if not lam:
        return ""
    div = options.get("supervise_divergence", "ce")
    return f" +sup λ={lam:g}" + ("" if div == "ce" else f" {div}")


def _read_ablation(root: Path) -> dict[str, Any]:
    """The checked ``ablation.json`` of a translation ablation (:class:`ValueError`
    otherwise, :class:`AblationRecordError` naming a missing or damaged record)."""
    meta = read_ablation_record(root)
    if meta.get("task") != "translation":
        task = meta.get("task")
        what = f"a {task!r} ablation" if task else "an ablation without a task"
        raise ValueError(f"{str(root)!r} is {what}, not 'translation'")
    return meta


def _is_done(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run (no ``run.json``: not yet); a damaged
    ``run.json`` raises :class:`~attnlab.lab.checkpoint.RunFileError` naming it."""
    from attnlab.lab.training import read_run

    if not (run_dir / "run.json").is_file():
        return False
    return read_run(run_dir).get("status") == "done"


def _run_row(run_dir: Path, seed: int, split: str, **aer_kw: Any) -> dict[str, Any]:
    """One finished run's AER figures and its ``split`` BLEU (none for train)."""
    from attnlab.lab.training import read_metrics

    bleu = read_metrics(run_dir).get(split, {}).get("bleu")  # checked before the slow part
    result = translator_aer(run_dir, split, **aer_kw)
    return {"seed": seed, "bleu": bleu, **result.as_dict()}


def _mechanism_row(label: str, runs: list[dict[str, Any]]) -> AERRow:
    """The mean ± sample std over the seeds' runs."""
    aer, aer_std, _ = mean_std(r["aer"] for r in runs)
    p, p_std, _ = mean_std(r["precision"] for r in runs)
    r_, r_std, _ = mean_std(r["recall"] for r in runs)
    bleu, bleu_std, _ = mean_std(r["bleu"] for r in runs)  # None: no run has a BLEU
    return AERRow(label, len(runs), aer, aer_std, p, p_std, r_, r_std, bleu, bleu_std, runs=runs)


def _baseline_rows(
    meta: Mapping[str, Any], split: str, eflomal: bool, scope: str, cache: dict[str, Any]
) -> list[AERRow]:
    from attnlab.lab.config import resolve_task
    from attnlab.lab.training import task_data

    options = meta.get("task_options") or {}
    data = task_data(resolve_task("translation", options), cache)
    return [
        AERRow(name, 0, res.aer, None, res.precision, None, res.recall, None, kind="baseline")
        for name, res in baseline_aers(data, split, eflomal=eflomal, scope=scope).items()
    ]


def aer_table(
    ablation_dir: str | Path,
    split: str = "test",
    *,
    extraction: str = "argmax",
    threshold: float = 0.5,
    baselines: bool = False,
    eflomal: bool = True,
    scope: str = "all",
    progress: bool = False,
    _cache: dict[str, Any] | None = None,
) -> list[AERRow]:
    """AER rows of a ``translation`` ablation directory (``attnlab ablate translation ...``).

    For every mechanism of the ablation's grid (in grid order; its label as in the
    ablation table, with `` +sup λ=...`` when the runs trained with supervised attention),
    over the seeds whose run finished: the mean ± sample std of the AER, precision and
    recall of :func:`translator_aer` and of the ``split``'s BLEU from ``metrics.json``
    (none for train); a ``ValueError`` when no run of the grid has finished. With
    ``baselines=True`` the rows of
    :func:`~attnlab.evaluation.attention_alignment.baseline_aers` on the ablation's data
    follow (``kind="baseline"``). ``scope`` as in :func:`translator_aer`. ``progress``: a
    bar over the finished runs (each is loaded and decodes its split) and the baselines.
    """
    from attnlab.lab.ablation import run_id
    from attnlab.lab.task import spec_label

    check_flags(progress=progress)
    root = check_path(ablation_dir, "ablation_dir")
    meta = _read_ablation(root)
    cache: dict[str, Any] = {} if _cache is None else _cache
    tag = _option_tag(meta.get("task_options") or {})
    aer_kw = {"extraction": extraction, "threshold": threshold, "scope": scope, "_cache": cache}
    finished = []  # (spec, its finished run directories with their seeds)
    for spec in meta.get("grid", []):
        dirs = [(root / "runs" / run_id(spec, seed), seed) for seed in meta.get("seeds", [])]
        finished.append((spec, [(d, seed) for d, seed in dirs if _is_done(d)]))
    total = sum(len(done) for _, done in finished) + bool(baselines)
    rows: list[AERRow] = []
    with ProgressBar(progress, total=total, desc=f"AER {root.name}", unit="run") as bar:
        for spec, done in finished:
            runs = [bar.step(_run_row(d, seed, split, **aer_kw)) for d, seed in done]
            if runs:
                rows.append(_mechanism_row(spec_label(spec) + tag, runs))
        if not rows:  # an empty table, or only the baselines, said nothing of the runs
            raise ValueError(f"{str(root)!r} holds no finished translation run")
        if baselines:
            rows += bar.step(_baseline_rows(meta, split, eflomal, scope, cache))
    return rows


def _pct(mean: float | None, std: float | None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if std is None:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} ± {100 * std:.1f}"


def _num(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def format_aer_table(rows: Sequence[AERRow], *, markdown: bool = False) -> str:
    """The rows as a plain-text or Markdown table (AER, precision, recall in %, BLEU)."""
    header = ["mechanism", "n", "AER %", "precision %", "recall %", "BLEU"]
    cells = [
        [
            r.mechanism,
            str(r.n) if r.kind == "attention" else "-",
            _pct(r.aer, r.aer_std),
            _pct(r.precision, r.precision_std),
            _pct(r.recall, r.recall_std),
            _num(r.bleu, r.bleu_std),
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["--:"] * 5) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    widths = [max(len(x[i]) for x in [header, *cells]) for i in range(len(header))]

    def line(c: Sequence[str]) -> str:
        return "  ".join(
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(c, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, cells)])


def _aer_table_command() -> Any:
    import click

    @click.command("aer-table")
    @click.argument(
        "ablation_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False)
    )
    @click.option("--split", type=click.Choice(SPLITS), default="test", show_default=True)
    @click.option(
        "--extraction", type=click.Choice(EXTRACTIONS), default="argmax", show_default=True
    )
    @click.option("--threshold", type=click.FloatRange(0, 1, min_open=True), default=0.5)
    @click.option(
        "--baselines/--no-baselines",
        default=True,
        show_default=True,
        help="Add the diagonal, eflomal and argmax-oracle rows.",
    )
    @click.option("--eflomal/--no-eflomal", default=True, show_default=True)
    @click.option(
        "--scope",
        type=click.Choice(SCOPES),
        default="all",
        show_default=True,
        help="'linked': count only links between words the gold links at all.",
    )
    @click.option("--markdown", is_flag=True, help="Print a Markdown table.")
    @click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
    @click.option("--no-progress", is_flag=True, help="No progress bar.")
    def aer_table_command(
        ablation_dirs: tuple[str, ...],
        split: str,
        extraction: str,
        threshold: float,
        baselines: bool,
        eflomal: bool,
        scope: str,
        markdown: bool,
        as_json: bool,
        no_progress: bool,
    ) -> None:
        """AER of the attention of translation ablations (ABLATION_DIRS from `attnlab
        ablate translation ...`) against the silver alignments, per mechanism: mean ± std
        over seeds of AER, precision, recall and BLEU, with baseline aligners (computed on
        the data of the last directory)."""
        from attnlab.lab.errors import failing_on

        cache: dict[str, Any] = {}
        rows: list[AERRow] = []
        # not a translation ablation, a bad run in it (also a ConfigError): exit 2; the data
        # not installed: exit 1
        with failing_on(FileNotFoundError, ValueError):
            for k, d in enumerate(ablation_dirs):
                rows += aer_table(
                    d,
                    split,
                    extraction=extraction,
                    threshold=threshold,
                    baselines=baselines and k == len(ablation_dirs) - 1,
                    eflomal=eflomal,
                    scope=scope,
                    progress=not no_progress,
                    _cache=cache,
                )
        if as_json:
            click.echo(json.dumps([r.to_json() for r in rows], indent=2))
            return
        click.echo(format_aer_table(rows, markdown=markdown))

    return aer_table_command


aer_table_command = _aer_table_command()
