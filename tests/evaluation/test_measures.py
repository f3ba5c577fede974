"""The shared parts of the evaluation measures: result records, the pairing check, and the
conversion of the maps a measure reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from attnlab.evaluation import (
    correctness,
    explanation,
    extraction,
    iou,
    monotonicity,
    vqa_correctness,
)
from attnlab.evaluation._measures import Record, as_array, check_paired, check_weights
from attnlab.evaluation.aer import AERResult
from attnlab.evaluation.significance import PairedComparison


def test_record_as_dict_lists_the_fields_in_order():
    @dataclass(frozen=True)
    class Score(Record):
        value: float
        n: int

    assert Score(0.5, 3).as_dict() == {"value": 0.5, "n": 3}
    assert issubclass(AERResult, Record) and issubclass(PairedComparison, Record)


def test_check_paired():
    check_paired([1, 2], ["a", "b"], references_are="references", give="hypothesis per reference")
    with pytest.raises(ValueError, match=r"^2 reference sets but 1 hypotheses; give one list$"):
        check_paired([1, 2], ["a"], references_are="reference sets", give="list")


# ---------------------------------------------------------------- the maps a measure reads


def test_as_array_reads_every_tensor_a_model_gives():
    x = torch.tensor([[0.25, 0.75], [1.0, 0.0]])
    expected = x.double().numpy()
    for t in (x, x.bfloat16(), x.half(), x.clone().requires_grad_(True), x.double()):
        a = as_array(t)
        assert a.dtype == np.float64
        np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(as_array([[0.25, 0.75], [1, 0]]), expected)
    kept = as_array(torch.tensor([1, 2], dtype=torch.uint8), None)
    assert kept.dtype == np.uint8
    assert as_array(torch.tensor([True, False]), bool).dtype == np.bool_


def test_check_weights():
    a = np.array([[0.5, 0.5]])
    assert check_weights(a) is a
    for bad in (np.array([[0.5, np.nan]]), np.array([[1.5, -0.5]]), np.array([[np.inf, 0]])):
        with pytest.raises(ValueError, match=r"^weights must be finite and non-negative$"):
            check_weights(bad)
    with pytest.raises(ValueError, match=r"^attention must be finite"):
        check_weights(np.array([-1.0]), "attention")


_T, _S = 4, 5
_GRID = (2, 3)


def _map_measures() -> dict[str, tuple[Callable[[Any], Any], tuple[int, ...]]]:
    """Every measure that reads an attention map given as a tensor or an array: the call
    on one map, and the map's shape."""
    region = np.zeros((6, 9), dtype=bool)
    region[:3, :3] = True
    fractions = np.array([0.0, 1.0, 0.5, 0.0, 0.0, 0.25])
    return {
        "argmax_links": (extraction.argmax_links, (_T, _S)),
        "threshold_links": (lambda w: extraction.threshold_links(w, 0.2), (_T, _S)),
        "diagonal_mass": (monotonicity.diagonal_mass, (_T, _S)),
        "forward_fraction": (monotonicity.forward_fraction, (_T, _S)),
        "centroid_correlation": (monotonicity.centroid_correlation, (_T, _S)),
        "rank_correlation": (lambda w: correctness.rank_correlation(w, fractions), (6,)),
        "attention_region": (lambda w: iou.attention_region(w, _GRID), (6,)),
        "attention_iou": (lambda w: iou.attention_iou(w, region, _GRID), (6,)),
        "question_scores": (lambda w: vqa_correctness.question_scores(w, fractions), (6,)),
        "kendall_per_instance": (
            lambda w: (
                explanation.kendall_per_instance(w, w.flip(-1), torch.tensor([_S] * _T))
                if isinstance(w, torch.Tensor)
                else explanation.kendall_per_instance(
                    torch.as_tensor(w), torch.as_tensor(w).flip(-1), torch.tensor([_S] * _T)
                )
            ),
            (_T, _S),
        ),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@pytest.mark.parametrize("measure", sorted(_map_measures()))
@pytest.mark.parametrize("form", ["bfloat16", "float16", "requires_grad"])
def test_map_measures_read_half_precision_and_autograd_tensors(measure, form):
    """A model trained in mixed precision hands bfloat16 / float16 maps, and one evaluated
    without no_grad hands maps that require grad: every measure reads them as the same
    numbers in float64 (the maps below are exact in bfloat16: multiples of 1/16)."""
    call, shape = _map_measures()[measure]
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 16, shape, generator=g).double() / 16
    w = w / w.sum(-1, keepdim=True).clamp(min=1e-9) if len(shape) == 2 else w
    w = (w * 64).round() / 64  # exact in bfloat16's 8-bit mantissa
    if form == "requires_grad":
        t = w.float().requires_grad_(True)
    else:
        t = w.to(getattr(torch, form))
    assert torch.equal(t.double(), w)
    assert _same(call(t), call(w.numpy()))


@pytest.mark.parametrize("measure", ["argmax_links", "threshold_links", "diagonal_mass"])
def test_map_measures_refuse_nan_and_negative_weights(measure):
    call, shape = _map_measures()[measure]
    w = torch.full(shape, 1.0 / shape[-1])
    for bad in (float("nan"), -0.5):
        w[1, 2] = bad
        with pytest.raises(ValueError, match=r"^weights must be finite and non-negative$"):
            call(w)
