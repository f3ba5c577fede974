"""The interactive attention viewer: the JSON it embeds (every example of every finished
run) and its section; its script and stylesheet are ``assets/weights.js``,
``assets/viewer.js`` and ``assets/viewer.css`` (no library, works from ``file://``).

The viewer reads ``<script type="application/json" id="viewer-data">`` and draws into
``#attention-viewer`` a toolbar (mechanism, seed, previous / next example, a second
mechanism to compare with), one panel per mechanism shown (the map by the example's kind
and its extra views) and a read-out of the weight under the pointer. Without JavaScript the
section keeps a short note and the static heatmaps stay.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attnlab.lab.files import jsonable
from attnlab.lab.report.context import ReportContext, Section
from attnlab.lab.report.data import ReportData
from attnlab.lab.report.png import png_data_uri
from attnlab.lab.report.theme import HEAT_RGB, asset
from attnlab.lab.report.views import extra_views, floats, strings

__all__ = ["VIEWER_SECTION", "script_json", "section_viewer", "viewer_payload"]

_SCRIPT_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def script_json(payload: Any) -> str:
    """``payload`` as JSON that is safe inside ``<script type="application/json">``: no
    ``<``, ``>`` or ``&`` (written as ``\\u003c`` ...), no line separators U+2028/9, no NaN."""
    text = json.dumps(jsonable(payload), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for ch, rep in _SCRIPT_ESCAPES:
        text = text.replace(ch, rep)
    return text


def _image_uri(image: Any) -> str | None:
    if not image:
        return None
    try:
        return png_data_uri(image)
    except (TypeError, ValueError, IndexError):
        return None


def _viewer_example(example: Mapping[str, Any]) -> dict[str, Any]:
    out = {
        k: example.get(k)
        for k in ("title", "kind", "rows", "cols", "weights", "label", "prediction", "grid")
    }
    out["kind"] = str(out.get("kind") or "tokens")
    out["rows"] = strings(out.get("rows")) or []
    out["cols"] = strings(out.get("cols")) or []
    out["weights"] = [floats(r) or [] for r in (example.get("weights") or [])]
    out["image"] = _image_uri(example.get("image"))
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
    ``views`` holds the extra views (:func:`~attnlab.lab.report.views.extra_views`)."""
    mechanisms = []
    for label in data.labels:
        runs = [
            {
                "seed": r.seed,
                "run_id": r.run_id,
                "examples": [_viewer_example(e) for e in r.examples],
            }
            for r in data.runs_of(label)
            if r.examples
        ]
        if runs:
            mechanisms.append({"label": label, "runs": runs})
    return {"heat": list(HEAT_RGB), "mechanisms": mechanisms}


def section_viewer(ctx: ReportContext) -> str:
    """The viewer's mount point, its note, and the embedded examples."""
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


#: The viewer's section, with its stylesheet and script (the number helpers first).
VIEWER_SECTION = Section(
    "viewer",
    "Interactive attention viewer",
    section_viewer,
    css=asset("viewer.css"),
    js=asset("weights.js") + asset("viewer.js"),
)
