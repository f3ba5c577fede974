"""Baseline word aligners to set beside attention-derived alignments in an AER table.

* :func:`diagonal_alignment`: target word ``j`` of ``T`` links to source word
  ``round(j (S - 1) / (T - 1))`` (the monotone diagonal; O(T)). A translator whose attention
  does no better than this has learned position, not translation.
* :func:`eflomal_alignment`: the Bayesian IBM-style aligner eflomal (Östling & Tiedemann
  2016; ``pip install eflomal``, in ``attnlab[eval]``), run in both directions over the whole
  corpus and symmetrised with :func:`~attnlab.evaluation.extraction.symmetrize`
  (grow-diag-final-and by default). Unsupervised: it sees only the sentence pairs.

Sources: R. Östling and J. Tiedemann, "Efficient Word Alignment with Markov Chain Monte
Carlo", The Prague Bulletin of Mathematical Linguistics 106, 2016.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from attnlab._checks import check_optional_int
from attnlab.data.pharaoh import read_pharaoh
from attnlab.evaluation.extraction import symmetrize

__all__ = ["diagonal_alignment", "eflomal_alignment", "eflomal_directions"]

Link = tuple[int, int]


def diagonal_alignment(source_length: int, target_length: int) -> frozenset[Link]:
    """Each target word linked to the source word at the same relative position."""
    if source_length < 0 or target_length < 0:
        raise ValueError("lengths must be >= 0")
    if source_length == 0 or target_length == 0:
        return frozenset()
    if target_length == 1:
        return frozenset({(0, 0)})
    scale = (source_length - 1) / (target_length - 1)
    return frozenset((int(j * scale + 0.5), j) for j in range(target_length))


def eflomal_directions(
    source: Sequence[Sequence[str]],
    target: Sequence[Sequence[str]],
    *,
    iterations: int | None = None,
    samplers: int = 3,
) -> tuple[list[frozenset[Link]], list[frozenset[Link]]]:
    """eflomal's source->target and target->source links per pair (both as
    ``(source, target)`` links), from one run over the corpus."""
    try:
        from eflomal import Aligner
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "eflomal is not installed: pip install eflomal (or 'attnlab[eval]')"
        ) from None
    if len(source) != len(target):
        raise ValueError(f"{len(source)} source and {len(target)} target sentences")
    if check_optional_int(iterations, "iterations", error=ValueError):
        iterations = (iterations, iterations, iterations)  # IBM1, HMM and fertility stages
    aligner = Aligner(n_iterations=iterations, n_samplers=samplers)
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        src_lines = [" ".join(s) + "\n" for s in source]
        tgt_lines = [" ".join(t) + "\n" for t in target]
        aligner.align(
            src_lines, tgt_lines, links_filename_fwd=str(fwd), links_filename_rev=str(rev)
        )
        forward = [a.possible for a in read_pharaoh(fwd)]
        reverse = [a.possible for a in read_pharaoh(rev)]
    missing = len(source) - len(forward)
    forward += [frozenset()] * max(0, missing)
    reverse += [frozenset()] * max(0, len(source) - len(reverse))
    return forward, reverse


def eflomal_alignment(
    source: Sequence[Sequence[str]],
    target: Sequence[Sequence[str]],
    *,
    method: str = "grow-diag-final-and",
    iterations: int | None = None,
    samplers: int = 3,
) -> list[frozenset[Link]]:
    """Align a corpus with eflomal in both directions and symmetrise (``method`` as in
    :func:`~attnlab.evaluation.extraction.symmetrize`; ``"forward"`` / ``"reverse"`` return
    one direction)."""
    forward, reverse = eflomal_directions(source, target, iterations=iterations, samplers=samplers)
    if method == "forward":
        return forward
    if method == "reverse":
        return reverse
    return [symmetrize(f, r, method) for f, r in zip(forward, reverse, strict=True)]
