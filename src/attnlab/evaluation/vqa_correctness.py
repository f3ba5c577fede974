"""Attention correctness of VQA region weights on easy-VQA: the pure measures.

easy-VQA images hold one shape on a plain background and every question asks about that
shape, so the gold region of a question is the shape itself
(:func:`~attnlab.data.easy_vqa.shape_region`). Pooled onto the model's ``g x g`` attention
grid (:func:`~attnlab.evaluation.correctness.region_to_grid`) it becomes ``r_k``, the
fraction of cell ``k``'s pixels inside the shape. For the region weights ``a`` (``[R]``,
``R = g^2``, summing to 1) of every question :func:`question_scores` computes

* ``mass``: the attention mass inside the region, ``sum_k a_k r_k`` (Liu et al. 2017's
  attention correctness with cell fractions);
* ``mass_touch``: ``sum_{k: r_k > 0} a_k``, the mass on the cells that touch the shape;
* ``spearman``: Spearman's rho between ``a`` and ``r`` (Das et al. 2016's rank correlation;
  ties get their mean rank; NaN when ``a`` or ``r`` is constant);
* ``pointing``: 1 when the cell of largest weight touches the shape, else 0 (the
  "pointing game"; ties share the hit: the fraction of the tied cells that touch it);

and :func:`correctness_summary` aggregates them (mean, std, count of defined values) over
all questions, by question type (shape / color / yes/no) and by whether the model's
answer is right. The same numbers
are computed for two reference maps on the same questions, so a reader sees whether the
model beats chance:

* ``uniform``: ``a_k = 1/R``: its mass is the area fraction of the region
  ``mean_k r_k``; its Spearman is undefined (constant map: NaN, reported with ``n = 0``);
* ``random``: one ``Dirichlet(1, ..., 1)`` map per question (seeded): a random
  attention map whose expected mass is also the area fraction and expected rho 0.

The paired ``lift`` (model mass minus uniform mass, and the share of questions where the
model puts more mass on the shape than uniform attention) is reported too. The study on a
trained run (``attnlab correctness RUN_DIR``, writing ``RUN_DIR/correctness.json``) is
:mod:`attnlab.lab.studies.vqa_correctness`.

Cost: O(R log R) per question for the ranks.

Sources: C. Liu, J. Mao, F. Sha and A. Yuille, "Attention Correctness in Neural Image
Captioning", AAAI 2017; A. Das, H. Agrawal, C. L. Zitnick, D. Parikh and D. Batra, "Human
Attention in Visual Question Answering: Do Humans and Deep Networks Look at the Same
Regions?", EMNLP 2016.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from attnlab._checks import check_positive
from attnlab.data.easy_vqa import shape_region
from attnlab.evaluation._measures import as_array
from attnlab.evaluation.correctness import attention_mass, rank_correlation, region_to_grid

__all__ = [
    "MAPS",
    "METRICS",
    "QUESTION_TYPES",
    "check_alpha",
    "correctness_summary",
    "question_scores",
    "region_fractions",
]

#: the per-question scores, in the order the table prints them
METRICS = ("mass", "mass_touch", "spearman", "pointing")
#: the attention maps compared: the model's and the two references
MAPS = ("model", "uniform", "random")
#: easy-VQA question types (see :func:`attnlab.data.easy_vqa.question_type`)
QUESTION_TYPES = ("shape", "color", "yes/no")


def region_fractions(images: Any, grid: tuple[int, int]) -> np.ndarray:
    """The gold region of every image on the attention grid: ``[M, h * w]`` float, the
    fraction of each cell's pixels inside the image's shape (row-major cells, as the VQA
    model's region weights)."""
    imgs = as_array(images, None)
    if imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"images has shape {imgs.shape}, expected [M, H, W, 3]")
    h, w = grid
    out = np.zeros((imgs.shape[0], h * w), dtype=np.float64)
    for i, image in enumerate(imgs):
        out[i] = region_to_grid(shape_region(image), (h, w)).ravel()
    return out


def _pointing(weights: np.ndarray, touch: np.ndarray) -> float:
    top = weights >= weights.max() - 1e-12 * max(1.0, abs(float(weights.max())))
    return float(touch[top].mean())


def question_scores(weights: Any, fractions: Any) -> dict[str, float]:
    """The four scores of one attention map ``weights`` ``[R]`` against the region
    fractions ``fractions`` ``[R]`` (see the module docstring)."""
    a = torch.as_tensor(as_array(weights))
    r = as_array(fractions)
    if a.shape != r.shape or a.dim() != 1:
        raise ValueError(
            f"weights {tuple(a.shape)} and fractions {r.shape} must be equal 1-d maps [R]"
        )
    touch = r > 0
    return {
        "mass": float(attention_mass(a, torch.as_tensor(r))),
        "mass_touch": float(attention_mass(a, torch.as_tensor(touch))),
        "spearman": rank_correlation(a, r),
        "pointing": _pointing(a.numpy(), touch),
    }


def _stats(values: Sequence[float]) -> dict[str, float | int]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    if not v.size:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std()), "n": int(v.size)}


def _summary(rows: list[dict[str, float]], groups: Mapping[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, idx in groups.items():
        out[name] = {m: _stats([rows[i][m] for i in idx]) for m in METRICS}
    return out


def check_alpha(alpha: float) -> None:
    """The Dirichlet concentration must be a finite number > 0 (ValueError)."""
    check_positive(alpha, "alpha", error=ValueError)


def _per_question(
    weights: np.ndarray, fractions: np.ndarray, random_maps: np.ndarray
) -> dict[str, list[dict[str, float]]]:
    """The scores of every question for the model's, the uniform and the random map."""
    uniform = np.full(weights.shape[1], 1.0 / weights.shape[1])
    per_map: dict[str, list[dict[str, float]]] = {m: [] for m in MAPS}
    for i in range(len(weights)):
        per_map["model"].append(question_scores(weights[i], fractions[i]))
        per_map["uniform"].append(question_scores(uniform, fractions[i]))
        per_map["random"].append(question_scores(random_maps[i], fractions[i]))
    return per_map


def _spread(maps: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Per map: the largest weight and the normalised entropy ``H(a) / log R``."""
    out = {}
    for name, a in maps.items():
        n, R = a.shape
        entropy = _entropy(a) / math.log(R) if R > 1 else np.ones(n)
        out[name] = {"max_weight": _stats(a.max(1).tolist()), "entropy": _stats(entropy.tolist())}
    return out


def correctness_summary(
    weights: Any,
    fractions: Any,
    correct: Any,
    types: Sequence[str],
    *,
    seed: int = 0,
    alpha: float = 1.0,
) -> dict[str, Any]:
    """The correctness figures of ``N`` questions (see the module docstring).

    Args:
        weights: the model's region weights ``[N, R]`` (rows summing to 1).
        fractions: the gold region of each question on the same grid ``[N, R]``
            (:func:`region_fractions`).
        correct: ``[N]`` bool, whether the model's answer is right.
        types: the ``N`` question types (``"shape"``, ``"color"``, ``"yes/no"``, ...).
        seed: seed of the random ``Dirichlet(alpha, ..., alpha)`` reference maps.
        alpha: their concentration (1 = uniform over the simplex).

    Returns ``accuracy``, ``accuracy_by_type``, ``model_is_uniform`` (True when every map
    is ``1/R``, as for the mean baseline), ``region`` (``area``: statistics of
    ``mean_k r_k``; ``touched``: of the fraction of cells touching the shape), ``maps``
    (``model`` / ``uniform`` / ``random``, each ``{"overall": {metric: stats}, "by_type":
    {type: {...}}, "by_correct": {"correct" | "wrong": {...}}}`` with stats ``{"mean",
    "std", "n"}``), ``spread`` (per map: ``max_weight`` and ``entropy`` = ``H(a) / log
    R``, 1 for uniform), ``lift`` (``mass_minus_uniform`` stats and
    ``share_above_uniform``) and ``reference`` (``seed``, ``alpha``).
    """
    check_alpha(alpha)
    weights = as_array(weights)
    fractions = as_array(fractions)
    correct = as_array(correct, bool)
    n, R = weights.shape
    random_maps = np.random.default_rng(seed).dirichlet(np.full(R, float(alpha)), size=n)
    per_map = _per_question(weights, fractions, random_maps)
    kinds = list(QUESTION_TYPES) + sorted(set(types) - set(QUESTION_TYPES))
    by_type = {t: np.flatnonzero([x == t for x in types]) for t in kinds}
    by_correct = {"correct": np.flatnonzero(correct), "wrong": np.flatnonzero(~correct)}
    maps = {
        m: {
            "overall": _summary(per_map[m], {"overall": np.arange(n)})["overall"],
            "by_type": _summary(per_map[m], by_type),
            "by_correct": _summary(per_map[m], by_correct),
        }
        for m in MAPS
    }
    uniform = np.full((n, R), 1.0 / R)
    diff = [
        a["mass"] - b["mass"] for a, b in zip(per_map["model"], per_map["uniform"], strict=True)
    ]
    return {
        "accuracy": float(correct.mean()),
        "accuracy_by_type": {
            t: float(correct[idx].mean()) if len(idx) else math.nan for t, idx in by_type.items()
        },
        "model_is_uniform": bool(np.allclose(weights, 1.0 / R, atol=1e-6)),
        "region": {
            "area": _stats(fractions.mean(1).tolist()),
            "touched": _stats((fractions > 0).mean(1).tolist()),
        },
        "maps": maps,
        "spread": _spread({"model": weights, "uniform": uniform, "random": random_maps}),
        "lift": {
            "mass_minus_uniform": _stats(diff),
            "share_above_uniform": float(np.mean(np.asarray(diff) > 1e-9)),
        },
        "reference": {"seed": seed, "alpha": float(alpha)},
    }


def _entropy(maps: np.ndarray) -> np.ndarray:
    p = np.clip(maps, 0.0, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(1)
