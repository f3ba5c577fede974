"""The translator's attention as word alignment: AER tables in the style of Luong et al. 2015.

* :func:`attention_links`: hard links from teacher-forced attention matrices ``[T_i, S_i]``
  (one per sentence pair; rows = target words without the EOS step, columns = source
  words), by ``argmax`` (one link per target word) or ``threshold``.
* :func:`translator_aer`: the AER of a trained ``translation`` run's attention on a split
  against the split's gold alignments (the silver Strong's-number links for the Bible).
* :func:`baseline_aers`: the same scores for the diagonal aligner and for eflomal
  (forward, reverse, intersection, grow-diag-final-and) run unsupervised on *all* pairs of
  the task's corpus (train + dev + test text: an unsupervised aligner may see it), scored on
  the split; plus the ``argmax oracle``, the best AER any one-link-per-target-word
  extraction can reach against that gold (a gold link for every linked target word, a
  necessarily wrong link for every unlinked one).
* :func:`aer_table`: per mechanism of an ablation directory, AER / precision / recall mean
  ± sample std over seeds beside the test BLEU (``metrics.json``); :func:`format_aer_table`
  prints it (plain text or Markdown); ``attnlab aer-table`` (:data:`aer_table_command`).

Links are 0-indexed ``(source i, target j)``; the attention matrix is target x source, so
the link of row ``j``'s argmax column ``i`` is ``(i, j)``. The AER counts over the whole
split (Och & Ney 2003; :func:`~attnlab.evaluation.aer.alignment_error_rate`). Cost: one
teacher-forced pass over the split per run, O(sum_i T_i S_i) for the extraction; eflomal
O(iterations x corpus tokens).

Sources: M.-T. Luong, H. Pham and C. D. Manning, "Effective Approaches to Attention-based
Neural Machine Translation", EMNLP 2015 (AER of global / local attention, table 6);
F. J. Och and H. Ney, Computational Linguistics 29(1), 2003; R. Östling and J. Tiedemann,
"Efficient Word Alignment with Markov Chain Monte Carlo", PBML 106, 2016.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.data.pharaoh import Alignment
from attnlab.evaluation.aer import AERResult, alignment_error_rate
from attnlab.evaluation.aligners import diagonal_alignment, eflomal_directions
from attnlab.evaluation.extraction import argmax_links, symmetrize, threshold_links

__all__ = [
    "EXTRACTIONS",
    "SCOPES",
    "AERRow",
    "aer_table",
    "aer_table_command",
    "attention_links",
    "baseline_aers",
    "format_aer_table",
    "oracle_argmax_links",
    "restrict_to_linked",
    "translator_aer",
]

Link = tuple[int, int]
EXTRACTIONS = ("argmax", "threshold")
SCOPES = ("all", "linked")
SPLITS = ("train", "dev", "test")


def attention_links(
    matrices: Sequence[Any], *, extraction: str = "argmax", threshold: float = 0.5
) -> list[frozenset[Link]]:
    """Hard ``(source, target)`` links from attention matrices ``[T_i, S_i]`` (target rows).

    ``extraction="argmax"``: each target word ``j`` links to ``argmax_i W[j, i]`` (all-zero
    rows give none); ``"threshold"``: every cell with ``W[j, i] >= threshold``.
    """
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {', '.join(EXTRACTIONS)}, got {extraction!r}")
    if extraction == "argmax":
        return [argmax_links(m) for m in matrices]
    return [threshold_links(m, threshold) for m in matrices]


def oracle_argmax_links(
    gold: Sequence[Alignment], target_lengths: Sequence[int]
) -> list[frozenset[Link]]:
    """The best links a one-link-per-target-word extraction can give: for each target
    word with a sure (else possible) gold link, its smallest such link; for each unlinked
    target word, a link to a source position no gold link uses (``-1 - j``: never in the
    gold, so it counts as predicted and wrong)."""
    out = []
    for g, n in zip(gold, target_lengths, strict=True):
        links = set()
        for j in range(n):
            sure = sorted(i for i, t in g.sure if t == j)
            poss = sorted(i for i, t in g.possible if t == j)
            best = sure or poss
            links.add((best[0], j) if best else (-1 - j, j))
        out.append(frozenset(links))
    return out


def restrict_to_linked(
    predicted: Sequence[frozenset[Link]], gold: Sequence[Alignment]
) -> list[frozenset[Link]]:
    """Only the predicted links ``(i, j)`` whose source word ``i`` and target word ``j``
    both take part in some gold link of the pair (``scope="linked"``): silver gold that
    covers only some words (Strong's numbers tag content words) says nothing about the
    others, so links of those words are not counted as wrong."""
    out = []
    for links, g in zip(predicted, gold, strict=True):
        src = {i for i, _ in g.possible}
        tgt = {j for _, j in g.possible}
        out.append(frozenset((i, j) for i, j in links if i in src and j in tgt))
    return out


def _score(gold: Sequence[Alignment], predicted: Sequence[Any], scope: str) -> AERResult:
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if scope == "linked":
        predicted = restrict_to_linked([frozenset(p) for p in predicted], gold)
    return alignment_error_rate(list(gold), list(predicted))


def _translation_part(data: Any, split: str) -> Any:
    part = data.split(split)
    for attr in ("source", "target", "alignments"):
        if not hasattr(part, attr):
            raise TypeError(
                f"split {split!r} ({type(part).__name__}) has no {attr!r}: give the TaskData "
                "of the translation task (TranslationTask().load_data())"
            )
    if any(a is None for a in part.alignments):
        raise ValueError(f"split {split!r} has pairs without a gold alignment")
    return part


# ----------------------------------------------------------------------------- runs


def _load_run(run_dir: str | Path, cache: dict[str, Any] | None = None) -> tuple[Any, Any, Any]:
    """``(task, data, model)`` of a finished run like :func:`attnlab.lab.training.load_run`,
    with the data shared through ``cache`` between runs with the same task options."""
    from attnlab.lab.checkpoint import load_state
    from attnlab.lab.training import read_run, resolve_task, seed_everything

    info = read_run(run_dir)
    if info.get("status") != "done":
        raise ValueError(f"run {str(run_dir)!r} has status {info.get('status')!r}, not 'done'")
    if info.get("task") != "translation":
        raise ValueError(f"run {str(run_dir)!r} is a {info.get('task')!r} run, not 'translation'")
    options = info.get("task_options") or {}
    task = resolve_task("translation", options)
    key = json.dumps(options, sort_keys=True, default=str)
    if cache is not None and key in cache:
        data = cache[key]
    else:
        data = task.load_data()
        if cache is not None:
            cache[key] = data
    seed_everything(int(info.get("seed", 0)))
    model = task.build_model(data, task.resolve_attention(info.get("attention") or {}))
    load_state(model, Path(run_dir) / "model.safetensors", strict=True, device="cpu")
    return task, data, model.eval()


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
    (:func:`attention_links`) and scores them against ``data.split(split).alignments``.
    ``scope="linked"`` counts only links between words that the gold links at all
    (:func:`restrict_to_linked`).
    """
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {', '.join(EXTRACTIONS)}, got {extraction!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    task, data, model = _load_run(run_dir, _cache)
    part = _translation_part(data, split)
    matrices = task.attention_matrices(model, data, split)
    links = attention_links(matrices, extraction=extraction, threshold=threshold)
    return _score(part.alignments, links, scope)


# ----------------------------------------------------------------------------- baselines


def baseline_aers(
    corpus: Any,
    split: str = "test",
    *,
    eflomal: bool = True,
    iterations: int | None = None,
    oracle: bool = True,
    scope: str = "all",
) -> dict[str, AERResult]:
    """AER of the baseline aligners on ``split`` of ``corpus``.

    Args:
        corpus: the translation task's data (``TranslationTask(...).load_data()``: a
            TaskData whose splits have ``source``, ``target`` and ``alignments``).
        split: the split scored.
        eflomal: run eflomal (skipped, without error, when the package is missing) on the
            pairs of *all* splits -- it is unsupervised -- and score its links on ``split``.
        iterations: eflomal's iteration count (None: its default).
        oracle: add the ``argmax oracle`` row (see :func:`oracle_argmax_links`).
        scope: ``"all"`` or ``"linked"`` (see :func:`restrict_to_linked`).

    Returns ``{"diagonal": ..., "eflomal forward": ..., "eflomal reverse": ...,
    "eflomal intersection": ..., "eflomal grow-diag-final-and": ..., "argmax oracle": ...}``
    (:class:`~attnlab.evaluation.aer.AERResult` each).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    part = _translation_part(corpus, split)
    gold = list(part.alignments)
    out: dict[str, AERResult] = {}
    diag = [
        diagonal_alignment(len(s), len(t)) for s, t in zip(part.source, part.target, strict=True)
    ]
    out["diagonal"] = _score(gold, diag, scope)
    if eflomal:
        try:
            import eflomal as _eflomal  # noqa: F401
        except ModuleNotFoundError:
            eflomal = False
    if eflomal:
        source: list[Sequence[str]] = []
        target: list[Sequence[str]] = []
        offset = 0
        for name in SPLITS:
            p = corpus.split(name)
            if name == split:
                offset = len(source)
            source += list(p.source)
            target += list(p.target)
        forward, reverse = eflomal_directions(source, target, iterations=iterations)
        n = len(part.source)
        fwd, rev = forward[offset : offset + n], reverse[offset : offset + n]
        out["eflomal forward"] = _score(gold, fwd, scope)
        out["eflomal reverse"] = _score(gold, rev, scope)
        for method in ("intersection", "grow-diag-final-and"):
            sym = [symmetrize(f, r, method) for f, r in zip(fwd, rev, strict=True)]
            out[f"eflomal {method}"] = _score(gold, sym, scope)
    if oracle:
        out["argmax oracle"] = _score(
            gold, oracle_argmax_links(gold, [len(t) for t in part.target]), scope
        )
    return out


# ----------------------------------------------------------------------------- tables


@dataclass
class AERRow:
    """One row of an AER table: a mechanism over seeds, or a baseline (``n`` = 0, no
    BLEU). ``*_std`` is the sample standard deviation over seeds (None for one seed)."""

    mechanism: str
    n: int
    aer: float
    aer_std: float | None
    precision: float
    precision_std: float | None
    recall: float
    recall_std: float | None
    bleu: float | None = None
    bleu_std: float | None = None
    kind: str = "attention"
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def _option_tag(options: Mapping[str, Any]) -> str:
    lam = options.get("supervise") or 0.0
    if not lam:
        return ""
    div = options.get("supervise_divergence", "ce")
    return f" +sup λ={lam:g}" + ("" if div == "ce" else f" {div}")


def aer_table(
    ablation_dir: str | Path,
    split: str = "test",
    *,
    extraction: str = "argmax",
    threshold: float = 0.5,
    baselines: bool = False,
    eflomal: bool = True,
    scope: str = "all",
    _cache: dict[str, Any] | None = None,
) -> list[AERRow]:
    """AER rows of a ``translation`` ablation directory (``attnlab ablate translation ...``).

    For every mechanism of the ablation's grid (in grid order; its label as in the
    ablation table, with `` +sup λ=...`` when the runs trained with supervised attention),
    over the seeds whose run finished: the mean ± sample std of the AER, precision and
    recall of :func:`translator_aer` and of the test BLEU from ``metrics.json``. With
    ``baselines=True`` the rows of :func:`baseline_aers` on the ablation's data follow
    (``kind="baseline"``). ``scope`` as in :func:`translator_aer`.
    """
    from attnlab.lab.ablation import run_id
    from attnlab.lab.task import spec_label

    root = Path(ablation_dir)
    meta_path = root / "ablation.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{str(root)!r} is not an ablation directory (no ablation.json)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("task") != "translation":
        raise ValueError(f"{str(root)!r} is a {meta.get('task')!r} ablation, not 'translation'")
    cache: dict[str, Any] = {} if _cache is None else _cache
    tag = _option_tag(meta.get("task_options") or {})
    rows: list[AERRow] = []
    for spec in meta.get("grid", []):
        runs = []
        for seed in meta.get("seeds", []):
            run_dir = root / "runs" / run_id(spec, seed)
            info_path = run_dir / "run.json"
            if not info_path.is_file():
                continue
            if json.loads(info_path.read_text(encoding="utf-8")).get("status") != "done":
                continue
            result = translator_aer(
                run_dir,
                split,
                extraction=extraction,
                threshold=threshold,
                scope=scope,
                _cache=cache,
            )
            metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
            bleu = metrics.get(split, {}).get("bleu")
            runs.append({"seed": seed, "bleu": bleu, **result.as_dict()})
        if not runs:
            continue
        aer, aer_std = _mean_std([r["aer"] for r in runs])
        p, p_std = _mean_std([r["precision"] for r in runs])
        r_, r_std = _mean_std([r["recall"] for r in runs])
        bleus = [r["bleu"] for r in runs if r["bleu"] is not None]
        bleu, bleu_std = _mean_std(bleus) if bleus else (None, None)
        rows.append(
            AERRow(
                spec_label(spec) + tag,
                len(runs),
                aer,
                aer_std,
                p,
                p_std,
                r_,
                r_std,
                bleu,
                bleu_std,
                "attention",
                runs,
            )
        )
    if baselines:
        from attnlab.lab.training import resolve_task

        options = meta.get("task_options") or {}
        key = json.dumps(options, sort_keys=True, default=str)
        data = cache.get(key)
        if data is None:
            data = cache[key] = resolve_task("translation", options).load_data()
        for name, res in baseline_aers(data, split, eflomal=eflomal, scope=scope).items():
            rows.append(
                AERRow(
                    name, 0, res.aer, None, res.precision, None, res.recall, None, kind="baseline"
                )
            )
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
    ) -> None:
        """AER of the attention of translation ablations (ABLATION_DIRS from `attnlab
        ablate translation ...`) against the silver alignments, per mechanism: mean ± std
        over seeds of AER, precision, recall and BLEU, with baseline aligners (computed on
        the data of the last directory)."""
        from attnlab._checks import ConfigError
        from attnlab.data._common import MissingDataError

        cache: dict[str, Any] = {}
        rows: list[AERRow] = []
        try:
            for k, d in enumerate(ablation_dirs):
                rows += aer_table(
                    d,
                    split,
                    extraction=extraction,
                    threshold=threshold,
                    baselines=baselines and k == len(ablation_dirs) - 1,
                    eflomal=eflomal,
                    scope=scope,
                    _cache=cache,
                )
        except (FileNotFoundError, ValueError, ConfigError) as err:
            raise click.ClickException(str(err)) from None
        except MissingDataError as err:
            click.echo(f"error: {err}", err=True)
            raise SystemExit(1) from None
        if as_json:
            click.echo(json.dumps([r.to_json() for r in rows], indent=2))
            return
        click.echo(format_aer_table(rows, markdown=markdown))

    return aer_table_command


aer_table_command = _aer_table_command()
