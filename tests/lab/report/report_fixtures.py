"""Synthetic run and ablation directories in the documented layout (docs/lab/report.md),
written with plain json / sqlite3 so that the report's tests do not need the trainer or
the results store."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import struct
import subprocess
import zlib
from collections.abc import Mapping, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnlab.lab.task import AttentionExample, spec_label, spec_slug

VERSIONS = {"attnlab": "0.0.test", "torch": "2.x-test", "python": "3.11.test"}


def tokens_example(title: str = "test #0", tokens: Sequence[str] | None = None) -> dict:
    tokens = list(tokens or ["a", "good", "film"])
    n = len(tokens)
    weights = [[(i + 1) / (n * (n + 1) / 2) for i in range(n)]]  # the last token is largest
    return AttentionExample(
        title=title,
        rows=["attention"],
        cols=tokens,
        weights=weights,
        label="positive",
        prediction="positive",
        kind="tokens",
    ).to_json()


def matrix_example(title: str = "alignment #0") -> dict:
    return AttentionExample(
        title=title,
        rows=["la", "casa"],
        cols=["the", "house", "</s>"],
        weights=[[0.8, 0.15, 0.05], [0.1, 0.85, 0.05]],
        label="la casa",
        prediction="la casa",
        kind="matrix",
    ).to_json()


def image_example(title: str = "image #0", *, with_image: bool = True) -> dict:
    size = 8
    image = [[[x / (size - 1), y / (size - 1), 0.5] for x in range(size)] for y in range(size)]
    weights = [[0.1, 0.2, 0.3, 0.4]]
    return AttentionExample(
        title=title,
        rows=["what shape?"],
        cols=["cell 0", "cell 1", "cell 2", "cell 3"],
        weights=weights,
        label="circle",
        prediction="square",
        kind="image",
        grid=(2, 2),
        image=image if with_image else None,
    ).to_json()


def hierarchy_example(title: str = "document #0") -> dict:
    """A document of two sentences with the hierarchical extra keys (sentence weights 0.25,
    0.75; the words' weights within each sentence)."""
    sentences = [["it", "rained"], ["great", "<b>fun</b>", "though"]]
    word_weights = [[0.4, 0.6], [0.5, 0.3, 0.2]]
    sentence_weights = [0.25, 0.75]
    cols = [w for s in sentences for w in s]
    flat = [b * w for b, ws in zip(sentence_weights, word_weights, strict=True) for w in ws]
    return AttentionExample(
        title=title,
        rows=["attention"],
        cols=cols,
        weights=[flat],
        label="positive",
        prediction="positive",
        kind="tokens",
        extra={
            "sentences": sentences,
            "word_weights": word_weights,
            "sentence_weights": sentence_weights,
            "document_id": "doc-7",
        },
    ).to_json()


def coattention_example(title: str = "target #0") -> dict:
    """Co-attention between a target phrase (2 tokens) and its context (3 tokens)."""
    return AttentionExample(
        title=title,
        rows=["context"],
        cols=["the", "battery", "lasts"],
        weights=[[0.2, 0.5, 0.3]],
        label="positive",
        prediction="negative",
        kind="tokens",
        extra={
            "tokens_a": ["battery", "life"],
            "weights_a": [0.7, 0.3],
            "tokens_b": ["the", "battery", "lasts"],
            "weights_b": [0.2, 0.5, 0.3],
            "affinity": [[-0.5, 1.5, 0.25], [0.0, 0.5, 1.0]],
            "name_a": "target",
            "name_b": "context",
        },
    ).to_json()


def heads_example(title: str = "heads #0") -> dict:
    """A 2 x 3 alignment with three heads (each head's weights given)."""
    heads = [
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
        [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]],
        [[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]],
    ]
    mean = [[sum(h[i][j] for h in heads) / 3 for j in range(3)] for i in range(2)]
    return AttentionExample(
        title=title,
        rows=["la", "casa"],
        cols=["the", "house", "</s>"],
        weights=mean,
        kind="matrix",
        extra={"heads": heads, "head_names": ["h0", "h1", "h2"]},
    ).to_json()


def tiny_png(rgb: tuple[int, int, int] = (10, 200, 30), size: int = 2) -> bytes:
    """A valid ``size`` x ``size`` PNG of one colour (written here with zlib)."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


EXPLANATION = {
    "run": "ignored",
    "instances": 5,
    "kendall": {
        "attention-gradient": {"mean": 0.4125, "std": 0.125, "significant": 0.6, "n": 5},
        "attention-loo": {"mean": -0.0625, "std": 0.25, "significant": 0.2, "n": 5},
        "gradient-loo": {"mean": 0.3, "std": 0.05, "significant": 1.0, "n": 4},
    },
    "permutation": {
        "median_tvd": {"mean": 0.05, "std": 0.02, "median": 0.04, "n": 4},
        "per_instance": [0.01, 0.04, 0.05, 0.1],
        "max_weight": [0.3, 0.5, 0.2, 0.9],
    },
    "adversarial": {
        "epsilon": 0.01,
        "max_jsd": {"mean": 0.5, "std": 0.1, "median": 0.55, "n": 4},
        "jsd_bound": 0.6931471805599453,
        "fraction_above_half_bound": 0.75,
        "per_instance": [0.4, 0.6, 0.55, 0.45],
        "max_weight": [0.3, 0.5, 0.2, 0.9],
    },
    "uniform": {
        "learned_accuracy": 0.8,
        "learned_f1": 0.75,
        "uniform_accuracy": 0.7,
        "uniform_f1": 0.6,
    },
    "frozen_weights": {
        "uniform": {"accuracy": 0.6, "f1": 0.55},
        "learned": {"accuracy": 0.7, "f1": 0.65},
        "transferred": {"accuracy": 0.8, "f1": 0.78},
    },
    "adversarial_models": [
        {"lambda": 0.0, "mean_tvd": 0.01, "mean_jsd": 0.02, "accuracy": 0.8},
        {"lambda": 0.5, "mean_tvd": 0.03, "mean_jsd": 0.3, "accuracy": 0.79},
        {"lambda": 1.0, "mean_tvd": 0.04, "mean_jsd": 0.45, "accuracy": 0.77},
    ],
    "seed_variance": {
        "runs": ["other-run"],
        "mean_jsd": 0.125,
        "mean_tvd": 0.0625,
        "jsd": [0.1, 0.15],
        "tvd": [0.05, 0.075],
    },
    "plots": ["permutation.png", "adversarial.png"],
}


def write_explanation(
    run_dir: Path, result: Mapping[str, Any] | None = None, *, plots: bool = True
) -> dict:
    """``run_dir/explanation/explanation.json`` in the layout ``attnlab explain`` writes
    (:data:`EXPLANATION` by default) and, with ``plots``, the PNGs it names (each a tiny
    PNG of its own colour). Returns the result written."""
    result = json.loads(json.dumps(result if result is not None else EXPLANATION))
    out = run_dir / "explanation"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "explanation.json", result)
    if plots:
        for i, name in enumerate(result.get("plots") or []):
            (out / name).write_bytes(tiny_png((10 + 40 * i, 200, 30)))
    return result


def write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")


def write_run_dir(
    run_dir: Path,
    *,
    attention: Mapping[str, Any],
    seed: int = 0,
    task: str = "toy",
    status: str = "done",
    test: Mapping[str, float] | None = None,
    dev: Mapping[str, float] | None = None,
    history: Sequence[Mapping[str, Any]] | None = None,
    cost: Mapping[str, Any] | None = None,
    examples: Sequence[Mapping[str, Any]] | None = None,
    primary: str = "accuracy",
    higher_is_better: Any = True,
    error: str | None = None,
    task_options: Mapping[str, Any] | None = None,
) -> Path:
    """One run directory (run.json and, for a finished run, metrics / history / cost /
    examples)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(
        run_dir / "run.json",
        {
            "task": task,
            "task_options": dict(task_options or {"epochs": 3, "batch_size": 8, "lr": 0.01}),
            "attention": dict(attention),
            "label": spec_label(attention),
            "seed": seed,
            "device": "cpu",
            "status": status,
            "started": "2024-05-01T10:00:00+00:00",
            "finished": "2024-05-01T10:01:00+00:00",
            "versions": VERSIONS,
            "error": error,
        },
    )
    if status != "done":
        return run_dir
    test = dict(test or {"accuracy": 0.5})
    dev = dict(dev or test)
    write_json(
        run_dir / "metrics.json",
        {
            "primary": primary,
            "higher_is_better": higher_is_better,
            "best_epoch": len(history or [1]),
            "dev": dev,
            "test": test,
        },
    )
    if history is None:
        history = [
            {"epoch": e, "train_loss": 1.0 / e, "dev": {primary: 0.5 + 0.1 * e}, "seconds": 1.0}
            for e in (1, 2, 3)
        ]
    write_json(run_dir / "history.json", list(history))
    write_json(
        run_dir / "cost.json",
        dict(
            cost
            or {
                "parameters": 100,
                "train_seconds": 3.0,
                "seconds_per_epoch": 1.0,
                "eval_ms_per_example": 0.5,
                "peak_memory_mb": None,
            }
        ),
    )
    write_json(run_dir / "examples.json", list(examples or []))
    return run_dir


def run_id(attention: Mapping[str, Any], seed: int) -> str:
    return f"{spec_slug(attention)}--seed{seed}"


def write_ablation_dir(
    root: Path,
    runs: Sequence[Mapping[str, Any]],
    *,
    task: str = "toy",
    sqlite: bool = True,
    task_options: Mapping[str, Any] | None = None,
) -> Path:
    """An ablation directory: ablation.json, runs/<run_id>/ for every run in ``runs`` (the
    keyword arguments of :func:`write_run_dir`; ``"attention"`` and ``"seed"`` required)
    and, with ``sqlite``, results.sqlite with one row per run."""
    root.mkdir(parents=True, exist_ok=True)
    grid: list[dict] = []
    seeds: list[int] = []
    for r in runs:
        if dict(r["attention"]) not in grid:
            grid.append(dict(r["attention"]))
        if r["seed"] not in seeds:
            seeds.append(r["seed"])
    write_json(
        root / "ablation.json",
        {
            "task": task,
            "task_options": dict(task_options or {"epochs": 3, "batch_size": 8, "lr": 0.01}),
            "grid": grid,
            "seeds": seeds,
            "executor": "local",
            "created": "2024-05-01T09:59:00+00:00",
        },
    )
    rows = []
    for r in runs:
        rid = run_id(r["attention"], r["seed"])
        run_dir = write_run_dir(root / "runs" / rid, task=task, **r)
        metrics = (
            json.loads((run_dir / "metrics.json").read_text())
            if r.get("status", "done") == "done"
            else {}
        )
        rows.append(
            (
                rid,
                task,
                spec_label(r["attention"]),
                json.dumps(dict(r["attention"])),
                r["seed"],
                r.get("status", "done"),
                json.dumps(metrics.get("dev")) if metrics else None,
                json.dumps(metrics.get("test")) if metrics else None,
                (run_dir / "cost.json").read_text() if metrics else None,
                str(run_dir),
                "2024-05-01T10:01:00+00:00",
                r.get("error"),
            )
        )
    if sqlite:
        con = sqlite3.connect(root / "results.sqlite")
        con.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, task TEXT, label TEXT, "
            "attention_json TEXT, seed INTEGER, status TEXT, dev_json TEXT, test_json TEXT, "
            "cost_json TEXT, run_dir TEXT, finished TEXT, error TEXT)"
        )
        con.executemany("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
        con.commit()
        con.close()
    return root


# ----------------------------------------------------------------------------- reading HTML


class Cells(HTMLParser):
    """Every element's (tag, attrs, text) in document order, with the text of its subtree."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self._open)}
        self.elements.append(el)
        if tag not in ("br", "img", "meta", "input", "link", "hr", "circle", "line", "rect"):
            self._open.append(el)

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i]["tag"] == tag:
                del self._open[i:]
                break

    def handle_data(self, data):
        for el in self._open:
            el["text"] += data

    def find(self, tag=None, **attrs):
        out = []
        for el in self.elements:
            if tag is not None and el["tag"] != tag:
                continue
            if all(el["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items()):
                out.append(el)
        return out


def parse(text: str) -> Cells:
    p = Cells()
    p.feed(text)
    p.close()
    return p


def table_rows(doc: Cells, table_id: str) -> dict[str, list[dict]]:
    """{row label: [td elements]} of the table with that id."""
    rows: dict[str, list[dict]] = {}
    for el in doc.elements:
        if el["tag"] != "td":
            continue
        tables = [p for p in el["parents"] if p["tag"] == "table"]
        if not tables or tables[-1]["attrs"].get("id") != table_id:
            continue
        tr = [p for p in el["parents"] if p["tag"] == "tr"][-1]
        rows.setdefault(tr["attrs"].get("data-label") or str(id(tr)), []).append(el)
    return rows


# ----------------------------------------------------------------------------- chromium

CHROMIUM_TIMEOUT_S = 25


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


CHROMIUM = find_chromium()
#: the mark of the tests that open the report in headless Chromium
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless Chromium (apt install chromium)"
)


def run_chromium(url: str, tmp: Path, *args: str) -> tuple[str, str]:
    """Run Chromium headless on ``url`` (a file:// URI, maybe with a fragment) in a fresh
    profile; (stdout, stderr). The whole process tree is killed on timeout."""
    assert CHROMIUM is not None
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    profile.mkdir()
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        "--disable-extensions",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        url,
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "HOME": str(tmp)},
    )
    try:
        out, err = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"chromium did not finish within {CHROMIUM_TIMEOUT_S} s: {' '.join(cmd)}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return out, err


def open_report_page(
    page: Path, tmp: Path, *args: str, fragment: str = "", window: tuple[int, int] = (1280, 2400)
) -> tuple[str, list[str], Path]:
    """Open the report ``page`` (with ``fragment``) once in headless Chromium with the
    extra ``args``: its DOM (``--dump-dom``), its JavaScript errors (the console error lines
    Chromium logs to stderr, and what the page's own recorder -- window.onerror,
    console.error -- wrote into #report-errors) and a screenshot of ``window`` (width,
    height). Fails when no DOM or screenshot came back or the error recorder is missing."""
    shot = tmp / f"shot-{len(list(tmp.glob('shot-*')))}.png"
    dom, stderr = run_chromium(
        page.resolve().as_uri() + fragment,
        tmp,
        "--dump-dom",
        f"--screenshot={shot}",
        f"--window-size={window[0]},{window[1]}",
        *args,
    )
    assert "</body>" in dom.lower(), f"no DOM dumped:\n{stderr[-2000:]}"
    assert shot.is_file(), f"chromium wrote no screenshot:\n{stderr[-2000:]}"
    errors = console_errors(stderr)
    recorded = re.search(r'<pre id="report-errors" data-count="(\d+)">(.*?)</pre>', dom, re.S)
    assert recorded, "the report's error recorder is missing from the DOM"
    if recorded.group(1) != "0":
        errors.append(recorded.group(2))
    return dom, errors, shot


def console_errors(stderr: str) -> list[str]:
    """The JavaScript console error lines Chromium logged to stderr."""
    return [
        line
        for line in stderr.splitlines()
        if ":CONSOLE" in line and ("Uncaught" in line or "ERROR:CONSOLE" in line)
    ]


def colour_pixels(png: Path, rgb: tuple[int, int, int], tol: int = 3) -> int:
    """How many pixels of a screenshot have the colour ``rgb`` (within ``tol`` per channel)."""
    image = pytest.importorskip("matplotlib.image").imread(str(png))
    pixels = np.asarray(image)[..., :3]
    if pixels.dtype != np.uint8:
        pixels = np.round(pixels * 255)
    diff = np.abs(pixels.astype(np.int16) - np.asarray(rgb, dtype=np.int16)).max(axis=-1)
    return int((diff <= tol).sum())
