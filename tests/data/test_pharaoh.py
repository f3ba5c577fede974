"""Pharaoh word alignments: parsing, indexing, writing, validation, the WPT 2003 files."""

from __future__ import annotations

import io

import numpy as np
import pytest
from datahelpers import SHARED_DATASETS, needs_shared

from attnlab.data import DataFormatError
from attnlab.data.parallel import read_parallel
from attnlab.data.pharaoh import Alignment, as_links, parse_pharaoh, read_pharaoh, write_pharaoh


def test_parse_sure_and_possible():
    a = parse_pharaoh("0-0 1-2 2p1 3-3 1-2\n")
    assert a.sure == {(0, 0), (1, 2), (3, 3)}
    assert a.possible_only == {(2, 1)}
    assert a.possible == {(0, 0), (1, 2), (3, 3), (2, 1)}
    assert len(a) == 4 and a.max_indices() == (3, 3)


def test_one_indexed_shifts_to_zero():
    assert parse_pharaoh("1-1 2p3", one_indexed=True) == Alignment({(0, 0)}, {(1, 2)})


def test_sure_wins_over_possible():
    a = parse_pharaoh("0p1 0-1")
    assert a.sure == {(0, 1)} and a.possible_only == frozenset()


def test_empty_line_is_a_pair_without_links():
    assert parse_pharaoh("") == Alignment()
    assert Alignment().max_indices() == (-1, -1)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0-1 2_3", r"bad link '2_3'"),
        ("0-1 a-2", r"bad link 'a-2'"),
        ("0--1", r"bad link '0--1'"),
        ("-1-2", r"bad link '-1-2'"),
    ],
)
def test_bad_links(line, message):
    with pytest.raises(ValueError, match=message):
        parse_pharaoh(line)


def test_zero_in_one_indexed_file():
    with pytest.raises(ValueError, match="has index 0, but the file is read as 1-indexed"):
        parse_pharaoh("0-1", one_indexed=True)


def test_alignment_rejects_negative_links():
    with pytest.raises(ValueError, match="non-negative ints"):
        Alignment({(-1, 0)})


def test_read_write_round_trip(tmp_path):
    text = "0-0 1p2\n\n2-1 0-0\n"
    alignments = read_pharaoh(io.StringIO(text))
    assert len(alignments) == 3 and alignments[1] == Alignment()
    path = tmp_path / "out.align"
    write_pharaoh(alignments, path)
    assert path.read_text() == "0-0 1p2\n\n0-0 2-1\n"  # links sorted
    write_pharaoh(alignments, path, one_indexed=True)
    assert path.read_text() == "1-1 2p3\n\n1-1 3-2\n"
    assert read_pharaoh(path, one_indexed=True) == alignments
    assert [p.name for p in tmp_path.iterdir()] == ["out.align"]  # no temporary file left
    buf = io.StringIO()
    write_pharaoh(alignments, buf)
    assert buf.getvalue().startswith("0-0 1p2\n")


def test_read_errors_name_file_and_line(tmp_path):
    path = tmp_path / "gold.align"
    path.write_text("1-1\n2-2 3x3\n")
    with pytest.raises(DataFormatError, match=r"gold\.align, line 2: bad link '3x3'"):
        read_pharaoh(path, one_indexed=True)


def test_lengths_check():
    lengths = [(2, 3), (1, 1)]
    assert len(read_pharaoh(io.StringIO("0-2 1-0\n0-0\n"), lengths=lengths)) == 2
    with pytest.raises(
        DataFormatError, match=r"line 2: a link reaches source word 1 / target word 0"
    ):
        read_pharaoh(io.StringIO("0-0\n1-0\n"), lengths=lengths)
    with pytest.raises(
        DataFormatError, match=r"line 1: a link reaches source word 1 / target word 4 \(1-indexed\)"
    ):
        read_pharaoh(io.StringIO("1-4\n"), one_indexed=True, lengths=lengths)
    with pytest.raises(DataFormatError, match="1 alignment lines for 2 sentence pairs"):
        read_pharaoh(io.StringIO("0-0\n"), lengths=lengths)


@needs_shared
def test_wpt2003_gold_and_awesome_align_output():
    folder = SHARED_DATASETS / "alignment"
    corpus = read_parallel(folder / "enfr.src-tgt")
    gold = read_pharaoh(folder / "enfr.gold", one_indexed=True, lengths=corpus.lengths)
    pred = read_pharaoh(folder / "enfr.awesome-align.out", lengths=corpus.lengths)
    assert len(gold) == len(pred) == len(corpus) == 447
    assert sum(len(p.possible_only) for p in pred) == 0  # the aligner writes sure links only
    assert sum(len(g.possible_only) for g in gold) > 0  # the gold set marks possible links
    # the published corpus-level figures of awesome-align on this set (shared/datasets/README.md):
    # 6,038 predicted links, precision 96.3%, recall 95.4%, AER 4.1%; computed here by hand
    a_total = s_total = a_and_s = a_and_p = 0
    for p, g in zip(pred, gold, strict=True):
        for link in p.sure:
            a_total += 1
            a_and_s += link in g.sure
            a_and_p += link in g.sure or link in g.possible_only
        s_total += len(g.sure)
    assert a_total == 6038
    assert round(100 * a_and_p / a_total, 1) == 96.3
    assert round(100 * a_and_s / s_total, 1) == 95.4
    aer = 1 - (a_and_s + a_and_p) / (a_total + s_total)
    assert round(100 * aer, 1) == 4.1


@needs_shared
def test_wpt2003_read_zero_indexed_by_mistake_is_caught():
    folder = SHARED_DATASETS / "alignment"
    corpus = read_parallel(folder / "enfr.src-tgt")
    # reading the 1-indexed gold file as 0-indexed runs past sentence ends somewhere
    with pytest.raises(DataFormatError, match="a link reaches"):
        read_pharaoh(folder / "enfr.gold", lengths=corpus.lengths)


def test_parse_pharaoh_bad_arguments():
    """None raised AttributeError ('NoneType' has no attribute 'split'); one_indexed='no'
    was truthy and read the line 1-indexed."""
    with pytest.raises(TypeError, match=r"^line must be a str of links, got NoneType$"):
        parse_pharaoh(None)
    with pytest.raises(TypeError, match=r"^one_indexed must be a bool, got 'no'$"):
        parse_pharaoh("1-1", one_indexed="no")


def test_read_pharaoh_bad_lengths():
    with pytest.raises(TypeError, match=r"^lengths must be a sequence of \(source length"):
        read_pharaoh(io.StringIO("0-0\n"), lengths=5)  # 'int' has no len()
    with pytest.raises(TypeError, match=r"^lengths\[0\] must be a \(source length, target len"):
        read_pharaoh(io.StringIO("0-0\n"), lengths=[(1,)])  # "not enough values to unpack"
    assert read_pharaoh(io.StringIO("0-0\n"), lengths=[[1, 1]]) == [Alignment({(0, 0)})]


@pytest.mark.parametrize("link", [(True, 2), (1, 2, 3), ("a",)])
def test_alignment_refuses_links_that_are_not_index_pairs(link):
    """(True, 2) was taken as (1, 2); (1, 2, 3) and ('a',) failed to unpack."""
    with pytest.raises(ValueError, match=r"^alignment links must be pairs of non-negative ints"):
        Alignment(sure={link})


def test_as_links_takes_pairs_of_non_negative_ints_only():
    assert as_links([(0, 1), [2, np.int32(3)], (0, 1)], "x") == {(0, 1), (2, 3)}
    assert as_links(frozenset(), "x") == frozenset()
    for bad in ("0-1", b"0-1", 3, None):
        with pytest.raises(TypeError, match=r"^x must be \(source, target\) links"):
            as_links(bad, "x")
    for link in ((0,), (0, 1, 2), (-1, 0), (False, 1), (0.0, 1), "01", 5):
        with pytest.raises(TypeError, match=r"^x must be .*, got "):
            as_links([link], "x")


def test_as_links_takes_the_rows_of_an_integer_array_or_tensor():
    """``np.argwhere(matrix)`` gives the links of a 0/1 alignment matrix as an ``[n, 2]``
    array; its rows were refused (only tuples and lists were pairs)."""
    import torch

    matrix = np.array([[1, 0, 0], [0, 0, 1]])
    assert as_links(np.argwhere(matrix), "x") == {(0, 0), (1, 2)}
    assert as_links(torch.tensor([[0, 1], [2, 2]]), "x") == {(0, 1), (2, 2)}
    assert as_links(np.zeros((0, 2), dtype=np.int64), "x") == frozenset()
    for bad in (np.array([[0.5, 1.0]]), torch.tensor([[True, False]]), np.array([[0, 1, 2]])):
        with pytest.raises(TypeError, match=r"x must be \(source, target\) links"):
            as_links(bad, "x")
