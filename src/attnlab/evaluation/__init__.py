"""Evaluating attention (survey section 4; TAXONOMY section 5): pure measures -- tensors
and arrays in, numbers out. Nothing here trains or loads a run, and nothing imports the
lab: the studies that apply these measures to trained runs (``attnlab explain``,
``correctness``, ``aer-table``) are in :mod:`attnlab.lab.studies`.

* :mod:`.aer` -- alignment error rate, precision and recall over a corpus
  (:func:`alignment_error_rate`; ``attnlab aer GOLD HYP``).
* :mod:`.extraction` -- hard alignments from attention matrices (:func:`argmax_links`,
  :func:`threshold_links`) and symmetrisation (:func:`symmetrize`).
* :mod:`.supervision` -- supervised attention: :class:`SupervisedAttentionLoss`,
  :func:`attention_supervision_loss`, :func:`links_to_weights`.
* :mod:`.attention_alignment` -- a translator's attention as word alignment: links from
  attention matrices, their AER, the baseline aligners and the argmax oracle.
* :mod:`.correctness` -- attention correctness: :func:`attention_mass`,
  :func:`rank_correlation`, :func:`region_to_grid`; :mod:`.vqa_correctness` -- the
  per-question scores and their summary for easy-VQA region weights.
* :mod:`.significance` -- ablation analysis over seeds: :func:`paired_comparison`,
  :func:`compare_to_baseline`.
* :mod:`.divergences` -- :func:`tvd`, :func:`jsd`, :func:`kl`.
* :mod:`.explanation` -- Jain & Wallace (2019): gradient and leave-one-out importance,
  Kendall tau, the permutation test, adversarial attention.
* :mod:`.diagnostics` -- Wiegreffe & Pinter (2019): uniform weights, seed variance, the
  frozen-weight MLP, adversarial model training.
"""

from attnlab.evaluation.aer import AERResult, alignment_error_rate
from attnlab.evaluation.correctness import attention_mass, rank_correlation, region_to_grid
from attnlab.evaluation.extraction import argmax_links, symmetrize, threshold_links
from attnlab.evaluation.significance import (
    PairedComparison,
    compare_to_baseline,
    paired_comparison,
)
from attnlab.evaluation.supervision import (
    SupervisedAttentionLoss,
    attention_supervision_loss,
    links_to_weights,
)

__all__ = [
    "AERResult",
    "PairedComparison",
    "SupervisedAttentionLoss",
    "alignment_error_rate",
    "argmax_links",
    "attention_mass",
    "attention_supervision_loss",
    "compare_to_baseline",
    "links_to_weights",
    "paired_comparison",
    "rank_correlation",
    "region_to_grid",
    "symmetrize",
    "threshold_links",
]
