"""WER, PER and CER (jiwer) against hand-counted edits."""

from __future__ import annotations

import pytest

from attnlab._optional import install_command

pytest.importorskip("jiwer", reason=install_command("jiwer"))

from attnlab.evaluation.error_rates import (
    character_error_rate,
    phoneme_error_rate,
    word_error_rate,
)


def test_wer_is_corpus_edits_over_reference_words() -> None:
    # utterance 1: cat -> bat (S) and "on" inserted (I); utterance 2: both words deleted (D)
    refs = ["the cat sat", "a b"]
    hyps = ["the bat sat on", ""]
    assert word_error_rate(refs, hyps) == pytest.approx(4 / 5)
    # not the mean of the sentence rates ((2/3 + 1) / 2)
    assert word_error_rate(refs, hyps) != pytest.approx((2 / 3 + 1) / 2)
    assert word_error_rate([["the", "cat"]], [["the", "cat"]]) == 0.0
    # insertions can push it past 1
    assert word_error_rate(["a"], ["x y z"]) == pytest.approx(3.0)


def test_empty_reference_counts_insertions() -> None:
    assert word_error_rate(["", "a b"], ["x", "a b"]) == pytest.approx(1 / 2)


def test_per_over_phoneme_symbols() -> None:
    # multi-character symbols are one unit each: one substitution in four phonemes
    assert phoneme_error_rate([["h", "@", "l", "oU"]], [["h", "E", "l", "oU"]]) == 0.25
    assert phoneme_error_rate(["h @ l oU"], ["h @ l"]) == 0.25
    # as characters, "oU" -> "o" would be one deletion among five characters
    assert character_error_rate(["h@loU"], ["h@lo"]) == pytest.approx(1 / 5)


def test_cer_counts_spaces() -> None:
    assert character_error_rate(["ab c"], ["abc"]) == pytest.approx(1 / 4)


def test_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="one hypothesis per reference"):
        word_error_rate(["a", "b"], ["a"])
    with pytest.raises(TypeError, match=r"wrap it: \[text\]"):
        word_error_rate("a b", "a b")
    with pytest.raises(ValueError, match="undefined"):
        word_error_rate([""], [""])
    with pytest.raises(ValueError, match="whitespace"):
        phoneme_error_rate([["a b"]], [["a"]])
