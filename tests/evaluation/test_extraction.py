"""Hard alignments from attention matrices and symmetrisation, against hand-worked cases."""

from __future__ import annotations

import pytest
import torch

from attnlab.evaluation.extraction import argmax_links, symmetrize, threshold_links

# rows: target words 0..2; columns: source words 0..3
W = [
    [0.7, 0.1, 0.1, 0.1],
    [0.2, 0.2, 0.5, 0.1],
    [0.0, 0.45, 0.45, 0.1],  # a tie: argmax takes the first
]


def test_argmax_one_link_per_target_word() -> None:
    assert argmax_links(W) == {(0, 0), (2, 1), (1, 2)}
    assert argmax_links(torch.tensor(W)) == {(0, 0), (2, 1), (1, 2)}
    # a [S, T] matrix of a target->source model: rows are source words
    assert argmax_links(W, transpose=True) == {(0, 0), (1, 2), (2, 1)}


def test_argmax_skips_empty_rows_and_checks_shape() -> None:
    assert argmax_links([[0.0, 0.0], [0.0, 1.0]]) == {(1, 1)}
    with pytest.raises(ValueError, match=r"expected a \[T, S\]"):
        argmax_links([0.5, 0.5])


def test_threshold() -> None:
    assert threshold_links(W, 0.45) == {(0, 0), (2, 1), (1, 2), (2, 2)}
    assert threshold_links(W, 0.8) == frozenset()
    with pytest.raises(ValueError, match="threshold"):
        threshold_links(W, 0.0)


def test_symmetrize_grow_diag_by_hand() -> None:
    a = {(0, 0), (1, 1), (2, 1)}
    b = {(0, 0), (1, 1), (1, 2)}
    assert symmetrize(a, b, "intersection") == {(0, 0), (1, 1)}
    assert symmetrize(a, b, "union") == a | b
    # (2,1) and (1,2) neighbour (1,1) and each brings an unaligned word
    assert symmetrize(a, b, "grow-diag") == a | b


def test_symmetrize_final_steps_by_hand() -> None:
    a = {(0, 0), (3, 3), (0, 2)}
    b = {(0, 0)}
    # (3,3) is not next to (0,0); (0,2) is two columns away
    assert symmetrize(a, b, "grow-diag") == {(0, 0)}
    # final: a union link with an unaligned source OR target word
    assert symmetrize(a, b, "grow-diag-final") == {(0, 0), (3, 3), (0, 2)}
    # final-and: both words unaligned; source 0 is aligned, so (0,2) stays out
    assert symmetrize(a, b, "grow-diag-final-and") == {(0, 0), (3, 3)}


def test_symmetrize_rejects_unknown_method() -> None:
    with pytest.raises(ValueError, match="grow-diag-final"):
        symmetrize(set(), set(), "grow")


@pytest.mark.parametrize("bad", [float("nan"), "0.5", 0, 1.5, True])
def test_threshold_links_refuses_a_threshold_outside_zero_one(bad):
    with pytest.raises(ValueError, match=r"^threshold must be a number in \(0, 1\], got "):
        threshold_links(torch.eye(2), bad)


def test_symmetrize_refuses_what_is_not_links():
    with pytest.raises(TypeError, match=r"^source_to_target must be \(source, target\) links"):
        symmetrize("0-0", {(0, 0)})
    with pytest.raises(TypeError, match=r"^target_to_source must be .* got \(1, -2\)$"):
        symmetrize({(0, 0)}, [(1, -2)])
    assert symmetrize([[0, 0]], [(0, 0)], "intersection") == {(0, 0)}  # lists are pairs too
