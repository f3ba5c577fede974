"""Hard word alignments from soft attention matrices, and symmetrisation of two directions.

A translator's attention for one sentence pair is a matrix ``W [T, S]``: row ``j`` holds the
weights of target word ``j`` over the ``S`` source words. Links are ``(source i, target j)``,
0-indexed, as in :class:`attnlab.data.Alignment`.

* :func:`argmax_links`: each target word links to its most attended source word
  (Luong et al. 2015; one link per target row, O(T S)).
* :func:`threshold_links`: every cell with weight >= ``threshold`` (O(T S)).
* :func:`symmetrize`: combine a source->target and a target->source alignment by
  ``intersection``, ``union``, ``grow-diag``, ``grow-diag-final`` or
  ``grow-diag-final-and`` (Koehn et al. 2003, the heuristics of Moses' symmetrisation;
  O((S T)^2) in the worst case for the growing loop, fine for sentence lengths).

Sources: M.-T. Luong, H. Pham and C. D. Manning, "Effective Approaches to Attention-based
Neural Machine Translation", EMNLP 2015; P. Koehn, F. J. Och and D. Marcu, "Statistical
Phrase-Based Translation", NAACL 2003.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from attnlab._checks import check_number
from attnlab.data.pharaoh import as_links
from attnlab.evaluation._measures import as_array, check_weights

__all__ = ["SYMMETRIZATIONS", "argmax_links", "symmetrize", "threshold_links"]

Link = tuple[int, int]
SYMMETRIZATIONS = ("intersection", "union", "grow-diag", "grow-diag-final", "grow-diag-final-and")
_NEIGHBOURS = ((-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1))


def _matrix(weights: Any) -> np.ndarray:
    m = as_array(weights)
    if m.ndim != 2:
        raise ValueError(f"weights has shape {m.shape}, expected a [T, S] attention matrix")
    return check_weights(m)


def argmax_links(weights: Any, *, transpose: bool = False) -> frozenset[Link]:
    """One link per row: ``(argmax_i W[j, i], j)`` for each target word ``j``.

    Args:
        weights: ``[T, S]`` (target rows over source columns); with ``transpose=True`` a
            ``[S, T]`` matrix from a target->source model (rows are source words), giving one
            link per source word instead.
    Rows that are all zero (padding, empty attention) give no link.
    """
    m = _matrix(weights)
    links = set()
    for r, row in enumerate(m):
        if not row.size or not np.any(row > 0):
            continue
        c = int(np.argmax(row))
        links.add((r, c) if transpose else (c, r))
    return frozenset(links)


def threshold_links(weights: Any, threshold: float, *, transpose: bool = False) -> frozenset[Link]:
    """Every cell with weight >= ``threshold`` (``threshold`` a number in (0, 1])."""
    check_number(threshold, "threshold", low=0, high=1, open_low=True, error=ValueError)
    m = _matrix(weights)
    rows, cols = np.nonzero(m >= threshold)
    if transpose:
        return frozenset(zip(rows.tolist(), cols.tolist(), strict=True))
    return frozenset(zip(cols.tolist(), rows.tolist(), strict=True))


def symmetrize(
    source_to_target: Iterable[Link],
    target_to_source: Iterable[Link],
    method: str = "grow-diag-final",
) -> frozenset[Link]:
    """Combine two directional alignments (both as ``(source, target)`` links).

    ``grow-diag`` starts from the intersection and repeatedly adds a union link that
    neighbours (incl. diagonally) an aligned point when its source or its target word is
    still unaligned; ``-final`` then adds the remaining union links whose source or target
    word is unaligned; ``-final-and`` requires both to be unaligned.
    """
    if method not in SYMMETRIZATIONS:
        raise ValueError(f"method must be one of {', '.join(SYMMETRIZATIONS)}, got {method!r}")
    a = as_links(source_to_target, "source_to_target")
    b = as_links(target_to_source, "target_to_source")
    union = a | b
    if method == "intersection":
        return a & b
    if method == "union":
        return union
    links = set(a & b)
    src_done = {i for i, _ in links}
    tgt_done = {j for _, j in links}
    while _grow_diag_step(links, union, src_done, tgt_done):
        pass
    if method.startswith("grow-diag-final"):
        both = method.endswith("-and")
        for direction in (a, b):
            for i, j in sorted(direction):
                free_s, free_t = i not in src_done, j not in tgt_done
                if (free_s and free_t) if both else (free_s or free_t):
                    links.add((i, j))
                    src_done.add(i)
                    tgt_done.add(j)
    return frozenset(links)


def _grow_diag_step(
    links: set[Link], union: frozenset[Link], src_done: set[int], tgt_done: set[int]
) -> bool:
    """One sweep of grow-diag over the links in order: add each union link that
    neighbours a link (incl. diagonally) and has an unaligned source or target word.
    Whether it added any."""
    added = False
    for i, j in sorted(links):
        for di, dj in _NEIGHBOURS:
            cand = (i + di, j + dj)
            if cand in union and cand not in links:
                if cand[0] not in src_done or cand[1] not in tgt_done:
                    links.add(cand)
                    src_done.add(cand[0])
                    tgt_done.add(cand[1])
                    added = True
    return added
