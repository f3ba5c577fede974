"""Attention figures as PNG files (matplotlib, Agg backend; ``pip install 'attnlab[eval]'``).

* :func:`plot_matrix` -- an attention or alignment matrix (rows: queries / target words,
  columns: keys / source words), gold links optionally marked (sure: squares, possible:
  dots), as in Bahdanau et al. (2015) and Luong et al. (2015).
* :func:`plot_heads` -- a grid of the heads of a multi-head attention, one panel per head
  (Vaswani et al. 2017; Clark et al. 2019).
* :func:`plot_coattention` -- the affinity matrix between two inputs with each side's
  attention as a bar along its axis (co-attention; Lu et al. 2016).
* :func:`plot_hierarchy` -- a document's sentence weights beside a heatmap of each
  sentence's word weights (hierarchical attention; Yang et al. 2016).
* :func:`plot_image_attention` -- attention over a grid of image cells overlaid on the
  image (Xu et al. 2015).
* :func:`plot_scatter` -- one point per instance, e.g. Jain & Wallace's max attention vs
  median output change under permutation, or JSD vs TVD.

Every function returns the PNG as bytes and writes it to ``path`` when given (atomically,
the folders above it made; an empty path or a folder is a ``ValueError``). Figures are
closed after saving, also when saving fails, so loops do not leak memory. A matrix that is
empty or holds NaN or infinity is refused (a NaN cell would look like an empty one).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnlab._atomic import write_file
from attnlab._checks import check_int, check_number, check_path
from attnlab.data.pharaoh import as_links

__all__ = [
    "plot_coattention",
    "plot_heads",
    "plot_hierarchy",
    "plot_image_attention",
    "plot_matrix",
    "plot_scatter",
]


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "attnlab.viz needs matplotlib: pip install 'attnlab[eval]'"
        ) from None
    return plt


def _numpy(x: Any) -> Any:
    """A tensor (on any device, one that requires grad too) as a NumPy array; anything
    else as it is."""
    return x.detach().float().cpu().numpy() if hasattr(x, "detach") else x


def _array(x: Any, ndim: int, name: str) -> np.ndarray:
    a = np.asarray(_numpy(x), dtype=np.float64)
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {a.shape}, expected {ndim} dimensions")
    if a.size == 0:
        raise ValueError(f"{name} has shape {a.shape}: nothing to draw")
    if not np.isfinite(a).all():  # a NaN cell would be drawn as an empty one
        raise ValueError(f"{name} must be finite")
    return a


def _values(x: Any, name: str) -> np.ndarray:
    """A sequence of numbers (a list, an array, a tensor, one that requires grad) as floats."""
    try:
        return np.asarray(_numpy(x), dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(x).__name__}") from None


def _image(image: Any) -> np.ndarray:
    """``image`` as ``[H, W, 3]`` floats in [0, 1]: ``[H, W, C]`` or, as PyTorch holds
    images, ``[C, H, W]`` (C = 1, 3 or 4; the last axis wins when both could be channels),
    or ``[H, W]`` grey; integer images (uint8) are divided by 255, and so are float ones
    whose values exceed 1."""
    dtype = getattr(image, "dtype", None)
    is_float = getattr(dtype, "is_floating_point", None)  # torch
    integer = (
        (not is_float)
        if is_float is not None
        else np.issubdtype(np.asarray(image).dtype, np.integer)
    )
    shape = tuple(np.shape(image))
    bad = ValueError(
        f"image has shape {shape}, expected [H, W, C] or [C, H, W] with C = 1, 3 or 4, or "
        "[H, W] grey"
    )
    if len(shape) not in (2, 3):
        raise bad
    img = _array(image, len(shape), "image")
    if img.ndim == 2:
        img = img[:, :, None]
    elif img.shape[-1] not in (1, 3, 4) and img.shape[0] in (1, 3, 4):
        img = img.transpose(1, 2, 0)  # channels first
    if img.shape[-1] not in (1, 3, 4):
        raise bad
    img = np.repeat(img, 3, axis=-1) if img.shape[-1] == 1 else img[..., :3]
    return img / 255.0 if integer or img.max() > 1.0 else img


def _grid(weights: Any) -> np.ndarray:
    """``weights`` as an ``[h, w]`` grid; a flat ``[R]`` vector (a model's region weights)
    is a square ``g x g`` grid."""
    if np.ndim(weights) == 1:
        flat = _array(weights, 1, "weights")
        g = math.isqrt(flat.size)
        if g * g != flat.size:
            raise ValueError(
                f"weights has {flat.size} values: a flat grid needs a square number of cells "
                "(or give it as [h, w])"
            )
        return flat.reshape(g, g)
    return _array(weights, 2, "weights")


def _labels(labels: Sequence[str] | None, n: int, name: str) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    if len(labels) != n:
        raise ValueError(f"{name} has {len(labels)} labels for {n} positions")
    return [str(s) for s in labels]


def _target(path: str | Path | None) -> Path | None:
    """The PNG file to write (checked before the figure is saved): a path that is not
    empty and not a folder; the folders above it are made."""
    if path is None:
        return None
    target = check_path(path, "path")
    if target.is_dir():
        raise ValueError(f"path {target} is a folder: name the PNG file to write")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def _finish(fig: Any, path: str | Path | None) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    try:
        target = _target(path)
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    data = buf.getvalue()
    if target is not None:
        write_file(target, lambda tmp: tmp.write_bytes(data))  # atomically
    return data


def plot_matrix(
    weights: Any,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    *,
    sure: Iterable[tuple[int, int]] = (),
    possible: Iterable[tuple[int, int]] = (),
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """``weights [n_rows, n_cols]`` as a grey-scale heatmap; gold links are ``(col, row)``
    pairs -- ``(source, target)`` in the alignment convention of :mod:`attnlab.data`."""
    plt = _plt()
    w = _array(weights, 2, "weights")
    r, c = _labels(rows, w.shape[0], "rows"), _labels(cols, w.shape[1], "cols")
    marks = [
        (sorted(as_links(links, name)), marker)  # checked before a figure is opened
        for links, marker, name in ((sure, "s", "sure"), (possible, "o", "possible"))
    ]
    fig, ax = plt.subplots(figsize=(max(3.0, 0.35 * len(c) + 1.5), max(2.5, 0.35 * len(r) + 1)))
    ax.imshow(w, cmap="Greys", vmin=0.0, vmax=max(float(w.max()), 1e-9), aspect="auto")
    for links, marker in marks:
        pts = [(i, j) for i, j in links if i < w.shape[1] and j < w.shape[0]]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.scatter(xs, ys, marker=marker, s=60, facecolors="none", edgecolors="tab:red")
    ax.set_xticks(range(len(c)), c, rotation=90)
    ax.set_yticks(range(len(r)), r)
    if title:
        ax.set_title(title)
    return _finish(fig, path)


def plot_heads(
    weights: Any,
    rows: Sequence[str] | None = None,
    cols: Sequence[str] | None = None,
    *,
    columns: int = 4,
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """One panel per head of ``weights [H, n_q, n_k]``."""
    plt = _plt()
    w = _array(weights, 3, "weights")
    H = w.shape[0]
    if H == 0:
        raise ValueError("weights has no heads")
    r, c = _labels(rows, w.shape[1], "rows"), _labels(cols, w.shape[2], "cols")
    ncol = min(check_int(columns, "columns", error=ValueError), H)
    nrow = -(-H // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol, 3 * nrow), squeeze=False)
    for h in range(nrow * ncol):
        ax = axes[h // ncol][h % ncol]
        if h >= H:
            ax.axis("off")
            continue
        ax.imshow(w[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xticks(range(len(c)), c, rotation=90, fontsize=7)
        ax.set_yticks(range(len(r)), r, fontsize=7)
    if title:
        fig.suptitle(title)
    return _finish(fig, path)


def plot_coattention(
    affinity: Any,
    tokens_a: Sequence[str],
    tokens_b: Sequence[str],
    weights_a: Any,
    weights_b: Any,
    *,
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """The affinity ``[n_a, n_b]`` between two inputs, with input A's weights ``[n_a]`` as a
    bar chart on the left and input B's ``[n_b]`` on top."""
    plt = _plt()
    aff = _array(affinity, 2, "affinity")
    wa, wb = _array(weights_a, 1, "weights_a"), _array(weights_b, 1, "weights_b")
    if aff.shape != (wa.size, wb.size):
        raise ValueError(f"affinity has shape {aff.shape}, expected ({wa.size}, {wb.size})")
    ta, tb = _labels(tokens_a, wa.size, "tokens_a"), _labels(tokens_b, wb.size, "tokens_b")
    fig = plt.figure(figsize=(2 + 0.4 * wb.size, 2 + 0.4 * wa.size))
    grid = fig.add_gridspec(2, 2, width_ratios=(1, 4), height_ratios=(1, 4))
    top = fig.add_subplot(grid[0, 1])
    top.bar(range(wb.size), wb, color="tab:orange")
    top.set_xticks([])
    left = fig.add_subplot(grid[1, 0])
    left.barh(range(wa.size), wa, color="tab:blue")
    left.invert_yaxis()
    left.set_yticks(range(wa.size), ta)
    main = fig.add_subplot(grid[1, 1])
    main.imshow(aff, cmap="RdBu_r", aspect="auto")
    main.set_xticks(range(wb.size), tb, rotation=90)
    main.set_yticks([])
    if title:
        fig.suptitle(title)
    return _finish(fig, path)


def plot_hierarchy(
    sentences: Sequence[Sequence[str]],
    word_weights: Sequence[Sequence[float]],
    sentence_weights: Sequence[float],
    *,
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """Sentence weights ``[S]`` (bars, left) beside each sentence's word weights (a heat
    row; one weight per word). The weights must be finite (NaN or infinity is a
    ``ValueError``, never drawn as an empty cell), the sentence weights one vector of ``S``
    numbers; a sentence without words is drawn as an empty row, a document without
    sentences is refused (nothing to draw)."""
    plt = _plt()
    S = len(sentences)
    sent = _array(sentence_weights, 1, "sentence_weights")
    if len(word_weights) != S or sent.size != S:
        raise ValueError("sentences, word_weights and sentence_weights must have one entry each")
    width = max((len(s) for s in sentences), default=1) or 1
    grid = np.zeros((S, width))  # the cells right of a short sentence stay blank (weight 0)
    for i, (words, weights) in enumerate(zip(sentences, word_weights, strict=True)):
        name = f"word_weights[{i}]"
        ws = _array(weights, 1, name) if len(words) else _values(weights, name)
        if len(words) != len(ws):
            raise ValueError(f"sentence {i} has {len(words)} words and {len(ws)} weights")
        grid[i, : len(ws)] = ws
    fig, (bars, heat) = plt.subplots(
        1, 2, figsize=(2 + 0.6 * width, 1 + 0.5 * S), gridspec_kw={"width_ratios": (1, 5)}
    )
    bars.barh(range(S), sent, color="tab:red")
    bars.invert_yaxis()
    bars.set_yticks(range(S), [f"s{i}" for i in range(S)])
    heat.imshow(grid, cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i, words in enumerate(sentences):
        for j, word in enumerate(words):
            heat.text(j, i, word, ha="center", va="center", fontsize=7)
    heat.set_xticks([])
    heat.set_yticks([])
    if title:
        fig.suptitle(title)
    return _finish(fig, path)


def plot_image_attention(
    image: Any,
    weights: Any,
    *,
    alpha: float = 0.6,
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """``image [H, W, 3]`` (floats in [0, 1] or uint8; also ``[3, H, W]`` as PyTorch holds
    images, 1 or 4 channels, or ``[H, W]`` grey) with ``weights [h, w]`` over a grid of
    cells (``H``, ``W`` multiples of ``h``, ``w``; a flat ``[h * h]`` vector is a square
    grid) overlaid, upsampled by nearest cell; ``alpha`` (in [0, 1]) is the overlay's
    opacity."""
    check_number(alpha, "alpha", low=0, high=1, error=ValueError)
    plt = _plt()
    img = _image(image)
    w = _grid(weights)
    H, W = img.shape[:2]
    h, wd = w.shape
    if H % h or W % wd:
        raise ValueError(f"a {H}x{W} image cannot hold a {h}x{wd} attention grid evenly")
    up = np.kron(w / max(float(w.max()), 1e-12), np.ones((H // h, W // wd)))
    fig, ax = plt.subplots(figsize=(3, 3))
    ax.imshow(img)
    ax.imshow(up, cmap="jet", alpha=alpha, vmin=0, vmax=1)
    ax.axis("off")
    if title:
        ax.set_title(title)
    return _finish(fig, path)


def plot_scatter(
    x: Sequence[float],
    y: Sequence[float],
    *,
    xlabel: str,
    ylabel: str,
    groups: Sequence[Any] | None = None,
    title: str = "",
    path: str | Path | None = None,
) -> bytes:
    """A scatter plot with one point per instance, coloured by ``groups`` (e.g. the class)."""
    plt = _plt()
    xs, ys = _values(x, "x"), _values(y, "y")
    if xs.shape != ys.shape:
        raise ValueError(f"x has {xs.size} values and y {ys.size}")
    if groups is not None and len(groups) != xs.size:
        raise ValueError(f"groups has {len(groups)} entries for {xs.size} points")
    fig, ax = plt.subplots(figsize=(4, 3))
    if groups is None:
        ax.scatter(xs, ys, s=8, alpha=0.6)
    else:
        g = np.asarray(list(groups))
        for value in sorted(set(g.tolist()), key=str):
            sel = g == value
            ax.scatter(xs[sel], ys[sel], s=8, alpha=0.6, label=str(value))
        ax.legend(fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return _finish(fig, path)
