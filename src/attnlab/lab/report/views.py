"""The extra views of an attention example, drawn from the keys of its ``extra``.

Conventions for ``AttentionExample.extra`` (``docs/lab/report.md``): keys a task may fill so
that the report draws more than the main map -- a hierarchy (sentences, their words'
weights and the sentences' weights), co-attention between two inputs, the heads of a
multi-head map, and a second token sequence (``words``). Each view consumes its keys; the
remaining extra keys are listed as text under the example. The same view data is embedded
for the interactive viewer (:mod:`attnlab.lab.report.viewer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attnlab.lab.report.heatmaps import bar, row_scale, table_heat, token_spans
from attnlab.lab.report.markup import esc
from attnlab.lab.report.statistics import as_float
from attnlab.lab.seed_stats import finite

__all__ = [
    "COATTENTION_KEYS",
    "COATTENTION_OPTIONAL",
    "HEADS_KEYS",
    "HEADS_OPTIONAL",
    "HIERARCHY_KEYS",
    "VIEW_RENDERERS",
    "WORDS_KEYS",
    "WORDS_OPTIONAL",
    "coattention_view",
    "extra_views",
    "floats",
    "heads_view",
    "hierarchy_view",
    "render_coattention",
    "render_heads",
    "render_hierarchy",
    "render_words",
    "strings",
    "words_view",
]


def floats(value: Any) -> list[float] | None:
    """``value`` as a list of floats (non-numbers become NaN), or None if it is not a list."""
    if not isinstance(value, (list, tuple)):
        return None
    return [as_float(v) for v in value]


def _matrix(value: Any) -> list[list[float]] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    rows = [floats(r) for r in value]
    if any(r is None for r in rows):
        return None
    return rows  # type: ignore[return-value]


def strings(value: Any) -> list[str] | None:
    """``value`` as a list of texts (None as ``""``), or None if it is not a list."""
    if not isinstance(value, (list, tuple)):
        return None
    return ["" if v is None else str(v) for v in value]


# ----------------------------------------------------------------------------- view data

# The keys of ``extra`` each view reads: those it needs, and those it may use.
HIERARCHY_KEYS = ("sentences", "word_weights", "sentence_weights")
COATTENTION_KEYS = ("tokens_a", "weights_a", "tokens_b", "weights_b")
COATTENTION_OPTIONAL = ("affinity", "name_a", "name_b")
HEADS_KEYS = ("heads",)
HEADS_OPTIONAL = ("head_names",)
WORDS_KEYS = ("words", "word_weights")
WORDS_OPTIONAL = ("words_name",)


def hierarchy_view(extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The hierarchical view's data (sentences, per-sentence word weights, sentence weights)
    when ``extra`` follows the convention and the lengths agree, else None."""
    sentences = extra.get("sentences")
    words = extra.get("word_weights")
    sw = floats(extra.get("sentence_weights"))
    if not isinstance(sentences, (list, tuple)) or not isinstance(words, (list, tuple)):
        return None
    sents = [strings(s) for s in sentences]
    ww = [floats(w) for w in words]
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
    ta, tb = strings(extra.get("tokens_a")), strings(extra.get("tokens_b"))
    wa, wb = floats(extra.get("weights_a")), floats(extra.get("weights_b"))
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


def _head_maps(heads: Sequence[Any]) -> list[list[list[float]]] | None:
    """Every head as a rectangular matrix of one shape (a head given as one flat list is one
    row), or None."""
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
    return maps


def heads_view(
    extra: Mapping[str, Any], rows: Sequence[str], cols: Sequence[str]
) -> dict[str, Any] | None:
    """The multi-head view's data: ``heads [H][n_rows][n_cols]`` (a head given as one list
    is one row); row / column labels from the example when the sizes agree."""
    heads = extra.get("heads")
    if not isinstance(heads, (list, tuple)) or not heads:
        return None
    maps = _head_maps(heads)
    if maps is None:
        return None
    n_rows, n_cols = len(maps[0]), len(maps[0][0])
    names = strings(extra.get("head_names"))
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
    words, weights = strings(extra.get("words")), floats(extra.get("word_weights"))
    if words is None or weights is None or len(words) != len(weights) or not words:
        return None
    return {"words": words, "weights": weights, "name": str(extra.get("words_name") or "words")}


def extra_views(example: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The views an example's ``extra`` asks for (``{"hierarchy": ..., "coattention": ...,
    "heads": ..., "words": ...}``) and the extra keys they consume."""
    extra = example.get("extra") or {}
    if not isinstance(extra, Mapping):
        return {}, set()
    rows, cols = list(example.get("rows") or []), list(example.get("cols") or [])
    found = (
        ("hierarchy", hierarchy_view(extra), HIERARCHY_KEYS),
        ("coattention", coattention_view(extra), COATTENTION_KEYS + COATTENTION_OPTIONAL),
        ("heads", heads_view(extra, rows, cols), HEADS_KEYS + HEADS_OPTIONAL),
        ("words", words_view(extra), WORDS_KEYS + WORDS_OPTIONAL),
    )
    views = {name: view for name, view, _ in found if view is not None}
    used = {key for _, view, keys in found if view is not None for key in keys}
    return views, used


# ----------------------------------------------------------------------------- drawing


def render_hierarchy(view: Mapping[str, Any]) -> str:
    """Sentence weights as bars (relative to the largest) beside each sentence's words
    shaded by their word weights (relative to the sentence's largest)."""
    sw = view["sentence_weights"]
    scale = row_scale(sw)
    rows = []
    for j, (sent, ww, w) in enumerate(
        zip(view["sentences"], view["word_weights"], sw, strict=True)
    ):
        rows.append(
            f'<tr class="sentence" data-sentence="{j}" data-weight="{w!r}">'
            f'<td class="sw" title="sentence {j}: {w:.4f}">{bar(w, scale)} '
            f'<span class="num">{w:.3f}</span></td>'
            f'<td class="words">{token_spans(sent, ww, "tok word")}</td></tr>'
        )
    return (
        '<div class="view hierarchy"><div class="viewtitle">sentence and word weights</div>'
        f'<table class="hier">{"".join(rows)}</table></div>'
    )


def _side(view: Mapping[str, Any], side: str) -> str:
    """One input of a co-attention view as a labelled line of shaded tokens."""
    return (
        f'<p class="tokens side-{side}"><span class="rowlabel">{esc(view[f"name_{side}"])}</span>'
        f"{token_spans(view[f'tokens_{side}'], view[f'weights_{side}'])}</p>"
    )


def render_coattention(view: Mapping[str, Any]) -> str:
    """Both inputs as shaded token lines (each relative to its largest weight) and, when
    given, the affinity matrix (shaded from its smallest to its largest entry)."""
    parts = [
        '<div class="view coattention"><div class="viewtitle">co-attention</div>',
        _side(view, "a"),
        _side(view, "b"),
    ]
    aff = view.get("affinity")
    if aff:
        vals = finite(v for r in aff for v in r)
        parts.append(
            '<div class="muted small">affinity (rows: '
            f"{esc(view['name_a'])}, columns: {esc(view['name_b'])})</div>"
        )
        parts.append(
            table_heat(
                view["tokens_a"],
                view["tokens_b"],
                aff,
                cell_cls="acell",
                table_cls="heat affinity",
                lo=min([*vals, 0.0]),
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
            + table_heat(
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
    """The second token sequence as one labelled line of shaded tokens."""
    return (
        f'<div class="view words"><p class="tokens"><span class="rowlabel">'
        f"{esc(view['name'])}</span>{token_spans(view['words'], view['weights'])}</p></div>"
    )


#: The renderer of each extra view, by the view's name in :func:`extra_views`.
VIEW_RENDERERS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "words": render_words,
    "hierarchy": render_hierarchy,
    "coattention": render_coattention,
    "heads": render_heads,
}
