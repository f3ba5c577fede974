"""Parallel text: the ||| layout and the two-file layout."""

from __future__ import annotations

import io
import os
import re

import pytest
from datahelpers import SHARED_DATASETS, needs_shared

from attnlab.data import DataFormatError
from attnlab.data.parallel import read_parallel, read_parallel_files, write_parallel


def test_read_separator_layout():
    corpus = read_parallel(
        io.StringIO("the house ||| la maison\nIt is . ||| C' est .\n"), split="train"
    )
    assert corpus.source == (("the", "house"), ("It", "is", "."))
    assert corpus.target == (("la", "maison"), ("C'", "est", "."))
    assert corpus.ids == ("1", "2") and corpus.splits == ("train", "train")
    assert corpus.lengths == [(2, 2), (3, 3)]
    assert corpus[1].source == ("It", "is", ".")


def test_lower_and_empty_sides():
    corpus = read_parallel(io.StringIO("A B ||| C\n ||| D\n"), lower=True, allow_empty=True)
    assert corpus.source == (("a", "b"), ())
    with pytest.raises(DataFormatError, match=r"line 2: the source side is empty"):
        read_parallel(io.StringIO("A ||| C\n ||| D\n"))
    with pytest.raises(DataFormatError, match=r"line 1: the target side is empty"):
        read_parallel(io.StringIO("A |||\n"))


@pytest.mark.parametrize(("line", "found"), [("a b c", 0), ("a ||| b ||| c", 2)])
def test_separator_count(line, found):
    with pytest.raises(
        DataFormatError,
        match=rf"line 2: expected one '\|\|\|' between source and target, found {found}",
    ):
        read_parallel(io.StringIO("x ||| y\n" + line + "\n"))


def test_custom_separator_and_write(tmp_path):
    corpus = read_parallel(io.StringIO("a b\tc\n"), separator="\t")
    out = tmp_path / "out.txt"
    write_parallel(corpus, out)
    assert out.read_text() == "a b ||| c\n"
    assert read_parallel(out).source == corpus.source


def test_an_interrupted_write_keeps_the_old_file(tmp_path, monkeypatch):
    corpus = read_parallel(io.StringIO("a b ||| c\n"))
    out = tmp_path / "out.txt"
    out.write_text("the old corpus\n")

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_parallel(corpus, out)
    assert out.read_text() == "the old corpus\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_two_files(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.fr"
    src.write_text("the house\ngood day\n")
    tgt.write_text("la maison\nbonjour\n")
    corpus = read_parallel_files(src, tgt)
    assert corpus.target == (("la", "maison"), ("bonjour",))
    assert set(corpus.splits) <= {"train", "dev", "test"}
    tgt.write_text("la maison\n")
    with pytest.raises(DataFormatError, match=r"a\.fr ends after 1 lines but .*a\.en goes on"):
        read_parallel_files(src, tgt)
    tgt.write_text("la maison\n\n")
    with pytest.raises(DataFormatError, match=r"a\.fr, line 2: empty line"):
        read_parallel_files(src, tgt)


def test_no_pairs_and_bad_split():
    with pytest.raises(DataFormatError, match="no sentence pairs"):
        read_parallel(io.StringIO(""))
    with pytest.raises(ValueError, match="split must be"):
        read_parallel(io.StringIO("a ||| b\n"), split="holdout")
    with pytest.raises(TypeError, match="no labels"):
        read_parallel(io.StringIO("a ||| b\n")).label_counts()


@needs_shared
def test_wpt2003_enfr():
    corpus = read_parallel(SHARED_DATASETS / "alignment" / "enfr.src-tgt")
    assert len(corpus) == 447
    assert all(corpus.source) and all(corpus.target)
    assert corpus.split("train").ids == tuple(
        i for i, s in zip(corpus.ids, corpus.splits, strict=True) if s == "train"
    )


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"separator": None}, ValueError, r"separator must be a non-empty string, got None"),
        ({"separator": ""}, ValueError, r"separator must be a non-empty string, got ''"),
        ({"split": "valid"}, ValueError, r"split must be one of 'train', 'dev', 'test' or None"),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"lower": "no"}, TypeError, r"lower must be a bool, got 'no'"),
        ({"allow_empty": 1}, TypeError, r"allow_empty must be a bool, got 1"),
    ],
)
def test_bad_options_fail_before_the_file_is_read(tmp_path, options, error, message):
    """separator=None split on white space ("expected one None ..."), '' raised str.split's
    "empty separator", a bad split was found only after reading, a str seed and a
    truthy string flag were taken."""
    with pytest.raises(error, match=f"^{message}"):
        read_parallel(tmp_path / "missing.txt", **options)
    if "separator" not in options:
        with pytest.raises(error, match=f"^{message}"):
            read_parallel_files(tmp_path / "a.en", tmp_path / "a.fr", **options)


def test_write_parallel_checks_the_separator():
    corpus = read_parallel(io.StringIO("a ||| b\n"))
    with pytest.raises(ValueError, match=r"^separator must be a non-empty string, got 5$"):
        write_parallel(corpus, io.StringIO(), separator=5)


@pytest.mark.parametrize(
    ("side", "token", "problem"),
    [
        ("source", "x|||y", r"holds the separator '\|\|\|'"),
        ("target", "new\nline", "holds whitespace or a line break"),
        ("source", "two words", "holds whitespace or a line break"),
        ("target", "a\u2028b", "holds whitespace or a line break"),
        ("source", "", "is empty"),
    ],
)
def test_write_parallel_refuses_tokens_it_could_not_read_back(tmp_path, side, token, problem):
    """Such tokens were written as they are; read_parallel then refused the file or split
    the token. Nothing is written: an old file stays, a stream gets nothing."""
    from attnlab.data.parallel import ParallelCorpus

    corpus = ParallelCorpus(
        source=(("a", "b"), ("d", token) if side == "source" else ("d",)),
        target=(("c",), ("e", token) if side == "target" else ("e",)),
        ids=("1", "7"),
        splits=("train", "train"),
    )
    message = rf"^cannot write pair 2 \(id '7'\): {side} token 2 {re.escape(repr(token))} {problem}"
    out = tmp_path / "out.txt"
    out.write_text("the old corpus\n")
    stream = io.StringIO()
    for target in (out, stream):
        with pytest.raises(ValueError, match=message):
            write_parallel(corpus, target)
    assert out.read_text() == "the old corpus\n" and stream.getvalue() == ""


def test_write_parallel_refuses_a_separator_it_could_not_read_back():
    corpus = read_parallel(io.StringIO("a b ||| c\n"))
    with pytest.raises(ValueError, match=r"^cannot write pair 1 \(id '1'\) with the separator ' '"):
        write_parallel(corpus, io.StringIO(), separator=" ")
    out = io.StringIO()
    write_parallel(corpus, out, separator="\t")
    assert read_parallel(io.StringIO(out.getvalue()), separator="\t").source == (("a", "b"),)


def test_the_corpus_checks_its_columns_and_split_names():
    """The containers' one check: columns of one length per id and split names from
    train / dev / test (``splits=("bogus",)`` was accepted)."""
    from attnlab.data.parallel import ParallelCorpus

    one = {"source": (("a",),), "target": (("b",),), "ids": ("1",)}
    assert len(ParallelCorpus(**one, splits=("dev",))) == 1
    with pytest.raises(ValueError, match="splits must hold 'train', 'dev', 'test', found 'bogus'"):
        ParallelCorpus(**one, splits=("bogus",))
    with pytest.raises(ValueError, match=r"target has 0 entries, expected one per item \(1"):
        ParallelCorpus(**{**one, "target": ()}, splits=("train",))
