"""Baseline aligners: the diagonal by hand, eflomal on a corpus with a known alignment."""

from __future__ import annotations

import random

import pytest

from attnlab.data.pharaoh import Alignment
from attnlab.evaluation.aer import alignment_error_rate
from attnlab.evaluation.aligners import diagonal_alignment, eflomal_alignment


def test_diagonal_by_hand() -> None:
    # S = 5, T = 3: target j -> round(j * 4 / 2) = 0, 2, 4
    assert diagonal_alignment(5, 3) == {(0, 0), (2, 1), (4, 2)}
    # S = 2, T = 4: round(j / 3) = 0, 0, 1, 1
    assert diagonal_alignment(2, 4) == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert diagonal_alignment(3, 1) == {(0, 0)}
    assert diagonal_alignment(0, 3) == frozenset()
    with pytest.raises(ValueError):
        diagonal_alignment(-1, 2)


@pytest.mark.slow
def test_eflomal_recovers_a_word_for_word_corpus() -> None:
    """Target sentences are the source words through a fixed dictionary, with adjacent words
    swapped at random: the true links are known. eflomal finds most of them; the diagonal
    does worse."""
    pytest.importorskip("eflomal", reason="eflomal is not installed (attnlab[eval])")
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(40)]
    source, target, gold = [], [], []
    for _ in range(400):
        n = rng.randint(3, 8)
        s = [rng.choice(vocab) for _ in range(n)]
        order = list(range(n))
        for k in range(0, n - 1, 2):
            if rng.random() < 0.5:
                order[k], order[k + 1] = order[k + 1], order[k]
        t = ["x" + s[i][1:] for i in order]
        source.append(s)
        target.append(t)
        gold.append(Alignment(sure=frozenset((i, j) for j, i in enumerate(order))))
    hyp = eflomal_alignment(source, target, method="intersection")
    diag = [diagonal_alignment(len(s), len(t)) for s, t in zip(source, target, strict=True)]
    aer = alignment_error_rate(gold, hyp).aer
    aer_diag = alignment_error_rate(gold, diag).aer
    assert aer < 0.1, aer
    assert aer_diag > 0.2, aer_diag
    with pytest.raises(ValueError, match="sentences"):
        eflomal_alignment(source[:2], target[:1])
