"""The attention of a translator as word alignment: link extraction and AER on hand-made
matrices (hand-computed numbers) and the baselines on a tiny hand corpus (the study on
trained runs is tested in tests/lab/studies/test_alignment_study.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnlab.data.pharaoh import Alignment
from attnlab.evaluation.attention_alignment import (
    attention_links,
    baseline_aers,
    oracle_argmax_links,
    restrict_to_linked,
)

# two pairs; matrices are target rows x source columns
W0 = [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]]  # T=2, S=3: argmax -> (1, 0), (0, 1)
W1 = [[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]]  # T=3, S=2: ties take the first column
GOLD = [
    Alignment(sure={(1, 0)}, possible_only={(2, 1)}),  # (0, 1) predicted: wrong
    Alignment(sure={(0, 0), (1, 1)}),  # (0, 2) predicted: wrong
]


def test_argmax_links_and_aer_by_hand() -> None:
    links = attention_links([W0, torch.tensor(W1)])
    assert links == [{(1, 0), (0, 1)}, {(0, 0), (1, 1), (0, 2)}]
    from attnlab.evaluation.aer import alignment_error_rate

    r = alignment_error_rate(GOLD, links)
    # |A| = 5, |S| = 3, |P| = 4; A&S = {(1,0), (0,0), (1,1)} = 3 = A&P
    assert (r.predicted, r.sure, r.hits_sure, r.hits_possible) == (5, 3, 3, 3)
    assert r.aer == pytest.approx(1 - 6 / 8)
    assert r.precision == pytest.approx(3 / 5) and r.recall == pytest.approx(1.0)


def test_threshold_links_by_hand() -> None:
    links = attention_links([W0, W1], extraction="threshold", threshold=0.5)
    assert links == [{(1, 0), (0, 1)}, {(0, 0), (1, 0), (1, 1), (0, 2)}]
    with pytest.raises(ValueError, match="extraction"):
        attention_links([W0], extraction="max")


def test_restrict_to_linked_and_oracle_by_hand() -> None:
    # pair 0: linked source {1, 2}, target {0, 1}: (0, 1) goes (source 0 unlinked)
    # pair 1: linked source {0, 1}, target {0, 1}: (0, 2) goes (target 2 unlinked)
    links = attention_links([W0, W1])
    assert restrict_to_linked(links, GOLD) == [{(1, 0)}, {(0, 0), (1, 1)}]
    # oracle: a sure link per linked target word (else a possible one), a wrong one else
    oracle = oracle_argmax_links(GOLD, [2, 3])
    # (the wrong one goes to the source position after the gold's largest: 1 + 1 = 2)
    assert oracle == [{(1, 0), (2, 1)}, {(0, 0), (1, 1), (2, 2)}]


def _fake_corpus() -> SimpleNamespace:
    """TaskData-like: split(name) -> source, target, alignments; test pairs of lengths
    (S, T) = (3, 2) and (2, 4)."""

    def part(source, target, alignments):
        return SimpleNamespace(source=source, target=target, alignments=alignments)

    words = [f"w{i}" for i in range(6)]
    train_src = [words[k % 6 : k % 6 + 3] or ["w0"] for k in range(30)]
    train = part(train_src, [["x" + w[1:] for w in s] for s in train_src], [None] * len(train_src))
    test = part(
        [["w0", "w1", "w2"], ["w3", "w4"]],
        [["x0", "x1"], ["x3", "x3", "x4", "x4"]],
        [
            Alignment(sure={(0, 0), (2, 1)}),
            Alignment(sure={(0, 0), (1, 3)}, possible_only={(0, 1)}),
        ],
    )
    dev = part([["w5"]], [["x5"]], [Alignment(sure={(0, 0)})])
    parts = {"train": train, "dev": dev, "test": test}
    return SimpleNamespace(split=lambda name: parts[name])


def test_baseline_aers_diagonal_by_hand() -> None:
    out = baseline_aers(_fake_corpus(), "test", eflomal=False)
    assert set(out) == {"diagonal", "argmax oracle"}
    # diagonal: (S, T) = (3, 2) -> {(0, 0), (2, 1)}; (2, 4) -> {(0, 0), (0, 1), (1, 2), (1, 3)}
    # |A| = 6, |S| = 4; A&S = 2 + 2 = 4; A&P = 2 + 3 (pair 1 adds the possible (0, 1)) = 5
    d = out["diagonal"]
    assert (d.predicted, d.sure, d.hits_sure, d.hits_possible) == (6, 4, 4, 5)
    assert d.aer == pytest.approx(1 - 9 / 10)
    # oracle: pair 0 {(0,0),(2,1)}; pair 1 {(0,0),(0,1),(2,2),(1,3)}: A=6, A&S=4, A&P=5
    assert out["argmax oracle"].aer == pytest.approx(1 - 9 / 10)
    linked = baseline_aers(_fake_corpus(), "test", eflomal=False, oracle=False, scope="linked")
    # pair 1: target 2 is unlinked -> (1, 2) dropped: A = 5
    assert linked["diagonal"].predicted == 5
    assert linked["diagonal"].aer == pytest.approx(1 - 9 / 9)
    with pytest.raises(ValueError, match="scope"):
        baseline_aers(_fake_corpus(), "test", eflomal=False, scope="some")
    with pytest.raises(ValueError, match="split"):
        baseline_aers(_fake_corpus(), "valid", eflomal=False)


def test_baseline_aers_eflomal_scores_the_test_pairs() -> None:
    """eflomal runs on all 33 pairs; the links scored must be those of the test pairs (a
    wrong offset would index outside the test sentences)."""
    pytest.importorskip("eflomal", reason="eflomal is not installed (attnlab[eval])")
    corpus = _fake_corpus()
    out = baseline_aers(corpus, "test")
    assert {k for k in out if k.startswith("eflomal")} == {
        "eflomal forward",
        "eflomal reverse",
        "eflomal intersection",
        "eflomal grow-diag-final-and",
    }
    for r in out.values():
        assert r.pairs == 2 and 0.0 <= r.aer <= 1.0
    assert 0 < out["eflomal forward"].predicted <= 6  # at most one link per target word


def test_eflomal_iterations_as_an_int() -> None:
    pytest.importorskip("eflomal", reason="eflomal is not installed (attnlab[eval])")
    from attnlab.evaluation.aligners import eflomal_directions

    fwd, rev = eflomal_directions([["a", "b"]] * 4, [["x", "y"]] * 4, iterations=2)
    assert len(fwd) == len(rev) == 4


def test_bible_baselines_if_installed() -> None:
    from attnlab.data import MissingDataError
    from attnlab.lab.tasks.translation import TranslationTask

    task = TranslationTask(books=["Prov"], max_len=14, min_freq=1)
    try:
        data = task.load_data()
    except MissingDataError as err:
        pytest.skip(str(err))
    out = baseline_aers(data, "test", eflomal=False)
    # the oracle is the floor of every one-link-per-target-word extraction
    assert out["argmax oracle"].aer <= out["diagonal"].aer
    assert 0.0 < out["diagonal"].aer < 1.0
