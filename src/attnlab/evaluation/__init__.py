"""Evaluating attention (survey section 5; TAXONOMY section 5).

* :mod:`.aer` -- alignment error rate, precision and recall over a corpus
  (:func:`alignment_error_rate`; ``attnlab aer GOLD HYP``).
* :mod:`.extraction` -- hard alignments from attention matrices (:func:`argmax_links`,
  :func:`threshold_links`) and symmetrisation (:func:`symmetrize`).
"""

from attnlab.evaluation.aer import AERResult, alignment_error_rate
from attnlab.evaluation.extraction import argmax_links, symmetrize, threshold_links

__all__ = [
    "AERResult",
    "alignment_error_rate",
    "argmax_links",
    "symmetrize",
    "threshold_links",
]
