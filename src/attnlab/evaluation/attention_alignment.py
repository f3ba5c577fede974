"""The attention of a translator as word alignment: links, their AER and the baselines.

* :func:`attention_links`: hard links from attention matrices ``[T_i, S_i]`` (one per
  sentence pair; rows = target words without the EOS step, columns = source words), by
  ``argmax`` (one link per target word) or ``threshold``.
* :func:`score_links`: the AER, precision and recall of predicted links against gold
  alignments over a corpus, for all links (``scope="all"``) or only those between words
  that the gold links at all (``scope="linked"``, :func:`restrict_to_linked`).
* :func:`baseline_aers`: the same scores for the diagonal aligner and for eflomal
  (forward, reverse, intersection, grow-diag-final-and) run unsupervised on *all* pairs of
  a translation corpus (train + dev + test text: an unsupervised aligner may see it),
  scored on one split; plus the ``argmax oracle`` (:func:`oracle_argmax_links`), the best
  AER any one-link-per-target-word extraction can reach against that gold.

Links are 0-indexed ``(source i, target j)``; the attention matrix is target x source, so
the link of row ``j``'s argmax column ``i`` is ``(i, j)``. The AER counts over the whole
corpus (Och & Ney 2003; :func:`~attnlab.evaluation.aer.alignment_error_rate`). Cost:
O(sum_i T_i S_i) for the extraction; eflomal O(iterations x corpus tokens). The study on
trained runs (``attnlab aer-table``) is :mod:`attnlab.lab.studies.alignment`.

Sources: M.-T. Luong, H. Pham and C. D. Manning, "Effective Approaches to Attention-based
Neural Machine Translation", EMNLP 2015 (AER of global / local attention, table 6);
F. J. Och and H. Ney, Computational Linguistics 29(1), 2003; R. Östling and J. Tiedemann,
"Efficient Word Alignment with Markov Chain Monte Carlo", PBML 106, 2016.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnlab.data._common import check_split
from attnlab.data.pharaoh import Alignment
from attnlab.evaluation.aer import AERResult, alignment_error_rate
from attnlab.evaluation.aligners import diagonal_alignment, eflomal_directions
from attnlab.evaluation.extraction import argmax_links, symmetrize, threshold_links

__all__ = [
    "EXTRACTIONS",
    "SCOPES",
    "SPLITS",
    "attention_links",
    "baseline_aers",
    "oracle_argmax_links",
    "restrict_to_linked",
    "score_links",
    "translation_part",
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
    target word, a link to a source position no gold link uses (the one after the largest
    gold source position: never in the gold, so it counts as predicted and wrong)."""
    out = []
    for g, n in zip(gold, target_lengths, strict=True):
        links = set()
        unused = 1 + max((i for i, _ in g.possible), default=-1)
        for j in range(n):
            sure = sorted(i for i, t in g.sure if t == j)
            poss = sorted(i for i, t in g.possible if t == j)
            best = sure or poss
            links.add((best[0], j) if best else (unused, j))
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


def score_links(gold: Sequence[Alignment], predicted: Sequence[Any], scope: str) -> AERResult:
    """AER, precision and recall of ``predicted`` link sets against ``gold`` over the whole
    corpus; ``scope="linked"`` first keeps only the links :func:`restrict_to_linked` keeps."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if scope == "linked":
        predicted = restrict_to_linked([frozenset(p) for p in predicted], gold)
    return alignment_error_rate(list(gold), list(predicted))


def translation_part(data: Any, split: str) -> Any:
    """``data.split(split)`` checked to be a part of a translation corpus: it has
    ``source``, ``target`` and ``alignments``, and every pair has a gold alignment."""
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
    check_split(split, SPLITS, none=False)
    part = translation_part(corpus, split)
    gold = list(part.alignments)
    out: dict[str, AERResult] = {}
    diag = [
        diagonal_alignment(len(s), len(t)) for s, t in zip(part.source, part.target, strict=True)
    ]
    out["diagonal"] = score_links(gold, diag, scope)
    if eflomal and _has_eflomal():
        fwd, rev = _eflomal_links(corpus, split, iterations)
        out["eflomal forward"] = score_links(gold, fwd, scope)
        out["eflomal reverse"] = score_links(gold, rev, scope)
        for method in ("intersection", "grow-diag-final-and"):
            sym = [symmetrize(f, r, method) for f, r in zip(fwd, rev, strict=True)]
            out[f"eflomal {method}"] = score_links(gold, sym, scope)
    if oracle:
        out["argmax oracle"] = score_links(
            gold, oracle_argmax_links(gold, [len(t) for t in part.target]), scope
        )
    return out


def _has_eflomal() -> bool:
    try:
        import eflomal  # noqa: F401
    except ModuleNotFoundError:
        return False
    return True


def _eflomal_links(
    corpus: Any, split: str, iterations: int | None
) -> tuple[list[frozenset[Link]], list[frozenset[Link]]]:
    """eflomal's forward and reverse links of ``split``'s pairs, aligned unsupervised on
    the pairs of every split (their order: train, dev, test)."""
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
    n = len(corpus.split(split).source)
    return forward[offset : offset + n], reverse[offset : offset + n]
