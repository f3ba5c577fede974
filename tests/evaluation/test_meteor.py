"""METEOR (NLTK) with WordNet from Debian's wordnet-base, against hand-computed scores.

The hand values use alpha = 0.9, beta = 3, gamma = 0.5: with ``m`` matches, ``P = m/|h|``,
``R = m/|r|``, ``Fmean = P R / (0.9 P + 0.1 R)``, ``penalty = 0.5 (chunks / m)^3``.
"""

from __future__ import annotations

import math

import pytest

from attnlab._optional import install_command
from attnlab.data._common import MissingDataError

pytest.importorskip("nltk", reason=install_command("nltk"))

from attnlab.evaluation.meteor import (
    LEXNAMES,
    corpus_meteor,
    load_wordnet,
    sentence_meteor,
    wordnet_dir,
)


@pytest.fixture(scope="module")
def wordnet():
    try:
        wordnet_dir()
    except MissingDataError:
        pytest.skip(f"WordNet is not installed ({install_command('wordnet')})")
    return load_wordnet()


def test_exact_and_stem_stages_by_hand() -> None:
    # "a fast" matched (1 chunk), "car"/"auto" not: P = R = 2/3, penalty 0.5 (1/2)^3
    assert sentence_meteor(["a fast car"], "a fast auto", synonyms=False) == pytest.approx(
        2 / 3 * (1 - 0.5 / 8)
    )
    # the stem stage matches cats/cat: 3 matches, 1 chunk
    assert sentence_meteor(["the cats sat"], "the cat sat", synonyms=False) == pytest.approx(
        1 - 0.5 / 27
    )
    # word order: 3 matches in 3 chunks -> penalty 0.5
    assert sentence_meteor(["a b c"], "c b a", synonyms=False) == pytest.approx(0.5)
    # recall-weighted: hypothesis "a b" vs reference "a b c d" (P = 1, R = 1/2)
    fmean = 0.5 / (0.9 + 0.1 * 0.5)
    assert sentence_meteor(["a b c d"], "a b", synonyms=False) == pytest.approx(
        fmean * (1 - 0.5 / 8)
    )
    assert sentence_meteor(["a b"], "", synonyms=False) == 0.0
    # an empty reference scores 0 itself: the other reference is the best
    assert sentence_meteor(["a b", ""], "a b", synonyms=False) == pytest.approx(1 - 0.5 / 8)
    assert sentence_meteor(["", ""], "a b", synonyms=False) == 0.0


def test_synonym_stage_uses_debian_wordnet(wordnet) -> None:
    assert wordnet.get_version() == "3.0"
    assert len(LEXNAMES) == 45 and wordnet.synsets("dog")[0].lexname() == "noun.animal"
    # car ~ auto through WordNet: 3 matches, 1 chunk
    assert sentence_meteor(["a fast car"], "a fast auto") == pytest.approx(1 - 0.5 / 27)


def test_best_reference_and_corpus_mean(wordnet) -> None:
    refs = ["x y z", "a b c"]
    assert sentence_meteor(refs, "a b c") == pytest.approx(sentence_meteor(["a b c"], "a b c"))
    assert corpus_meteor([["a b c"], ["a b c"]], ["a b c", "c b a"]) == pytest.approx(
        ((1 - 0.5 / 27) + 0.5) / 2
    )


def test_nltk_alignment_departures_stated_in_the_module_docstring(wordnet) -> None:
    """The two departures from the paper that the module docstring states, as NLTK
    computes them (a change in NLTK that fixes them should update the docstring)."""
    # greedy alignment: 6 chunks of 6 matches, penalty 0.5, where the paper's has 3
    reordered = sentence_meteor(["the cat sat on the mat"], "on the mat sat the cat")
    assert reordered == pytest.approx(1 - 0.5 * (6 / 6) ** 3)
    # the synonym stage on Porter stems: big ~ large is not matched (3 of 4 words)
    fmean = 0.75 * 0.75 / (0.9 * 0.75 + 0.1 * 0.75)  # P = R = 3/4
    assert sentence_meteor(["the dog is big"], "the dog is large") == pytest.approx(
        fmean * (1 - 0.5 * (1 / 3) ** 3)
    )


def test_missing_wordnet_names_the_install(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ATTNLAB_WORDNET", str(tmp_path))
    with pytest.raises(MissingDataError, match="apt-get install wordnet-base"):
        wordnet_dir()


def test_errors() -> None:
    with pytest.raises(TypeError, match="wrap"):
        sentence_meteor("a b", "a b", synonyms=False)
    with pytest.raises(ValueError, match="one list of references per hypothesis"):
        corpus_meteor([["a"]], ["a", "b"], synonyms=False)


def test_other_languages_use_snowball_stems_without_synonyms() -> None:
    # Spanish Snowball stems hablaba/hablamos alike ("habl"): 3 matches in one chunk
    assert sentence_meteor(
        ["ellos hablamos hoy"], "ellos hablaba hoy", synonyms=False, language="spanish"
    ) == pytest.approx(1 - 0.5 / 27)
    # the English Porter stemmer does not: 2 matches in 2 chunks, P = R = 2/3
    assert sentence_meteor(
        ["ellos hablamos hoy"], "ellos hablaba hoy", synonyms=False
    ) == pytest.approx(2 / 3 * (1 - 0.5))
    with pytest.raises(ValueError, match="synonyms=False"):
        sentence_meteor(["a"], "a", language="spanish")
    with pytest.raises(ValueError, match="Snowball"):
        sentence_meteor(["a"], "a", synonyms=False, language="klingon")


def test_meteor_or_nan_is_nan_with_a_warning_without_nltk(monkeypatch) -> None:
    import attnlab.evaluation.meteor as meteor
    from attnlab._optional import MissingDependencyError

    assert meteor.meteor_or_nan([["a", "b"]], [["a", "b"]], language="spanish") == 1 - 0.5 / 8

    def missing(name: str):
        raise MissingDependencyError(f"{name} is not installed: {install_command(name)}")

    monkeypatch.setattr(meteor, "require", missing)
    with pytest.warns(RuntimeWarning, match="pip install nltk"):
        assert math.isnan(meteor.meteor_or_nan([["a"]], [["a"]]))
