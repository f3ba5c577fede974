"""SST PTB trees: parsing, spans, label schemes, binarisation, errors."""

from __future__ import annotations

import io
import json
import sys

import pytest

from attnlab.data import DataFormatError
from attnlab.data.sst import FINE_LABELS, Tree, TreeDataset, parse_tree, read_sst_trees

SENTENCE = "(3 (2 It) (4 (4 (2 's) (4 (3 (2 a) (4 (3 lovely) (2 film))) (3 (2 with) (4 (3 lovely) (2 performances))))) (2 .)))"
TREES = "\n".join(
    [
        SENTENCE,
        "(1 (2 The) (1 (1 dull) (2 -LRB-plot-RRB-)))",
        "(2 (2 Just) (2 okay))",
        "",
        "(0 (0 Awful) (2 .))",
    ]
)


def test_parse_leaves_and_root():
    tree = parse_tree(SENTENCE)
    assert tree.label == 3
    assert tree.leaves() == [
        "It",
        "'s",
        "a",
        "lovely",
        "film",
        "with",
        "lovely",
        "performances",
        ".",
    ]
    assert str(tree) == SENTENCE


def test_spans_by_hand():
    tree = parse_tree("(3 (2 a) (4 (3 b) (2 c)))")
    # pre-order: root a..c, leaf a, node b..c, leaf b, leaf c
    assert tree.spans() == [(0, 3, 3), (0, 1, 2), (1, 3, 4), (1, 2, 3), (2, 3, 2)]


def test_unescape_brackets():
    assert parse_tree("(2 (2 -LRB-) (2 -RRB-))").leaves() == ["(", ")"]
    assert parse_tree("(2 (2 -LRB-) (2 -RRB-))", unescape=False).leaves() == ["-LRB-", "-RRB-"]


def test_binarized_right_factors_nary_nodes():
    tree = parse_tree("(1 (2 a) (3 b) (4 c) (0 d))")
    bin_tree = tree.binarized()
    assert str(bin_tree) == "(1 (2 a) (1 (3 b) (1 (4 c) (0 d))))"
    assert bin_tree.leaves() == tree.leaves()
    already = parse_tree(SENTENCE)
    assert already.binarized() == already


def test_tree_nodes():
    leaf = Tree(2, word="x")
    assert leaf.is_leaf and leaf.leaves() == ["x"] and leaf.spans() == [(0, 1, 2)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty tree"),
        ("(3 (2 a) (2 b)", r"missing '\)'"),
        ("(3 (2 a)) (2 b)", "text after the end of the tree at character 11"),
        ("(x (2 a))", "label 'x' is not an integer at character 2"),
        ("(3 (2 a b))", "a leaf holds exactly one word"),
        ("(3 ())", "expected a label after"),
        ("(3)", "a node without a word or children"),
        ("2 a", r"expected '\('"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_tree(text)


def test_read_fine(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(TREES, encoding="utf-8")
    ds = read_sst_trees(path)
    assert len(ds) == 4 and ds.label_names == FINE_LABELS
    assert ds.labels == (3, 1, 2, 0)
    assert ds.splits == ("train",) * 4  # from the file name
    assert ds.ids == ("train-1", "train-2", "train-3", "train-5")
    assert ds.tokens[1] == ("The", "dull", "-LRB-plot-RRB-")  # only whole -LRB- tokens unescape
    assert ds.phrases[3] == ((0, 2, 0), (0, 1, 0), (1, 2, 2))
    text = ds.to_text_dataset()
    assert text.texts[2] == "Just okay" and text.labels == ds.labels


def test_read_binary_drops_neutral(tmp_path):
    ds = read_sst_trees(io.StringIO(TREES), labels="binary", lower=True, split="dev")
    assert ds.label_names == ("negative", "positive")
    assert ds.labels == (1, 0, 0)  # 3 -> positive, 1 -> negative, (2 dropped), 0 -> negative
    assert ds.tokens[2] == ("awful", ".")
    assert ds.phrases[2] == ((0, 2, 0), (0, 1, 0))  # the neutral "." is left out
    assert ds.splits == ("dev",) * 3


def test_json_round_trip():
    ds = read_sst_trees(io.StringIO(TREES + "\n(2 (2 -LRB-) (2 x))"))
    payload = json.loads(json.dumps(ds.to_json()))
    back = TreeDataset.from_json(payload)
    assert back.trees == ds.trees and back.phrases == ds.phrases and back.tokens == ds.tokens
    assert back.trees[-1].leaves() == ["(", "x"]


def test_seeded_split_for_other_names():
    ds = read_sst_trees(io.StringIO(TREES))
    assert set(ds.splits) <= {"train", "dev", "test"}
    assert ds.splits == read_sst_trees(io.StringIO(TREES)).splits


def test_binarize_option(tmp_path):
    ds = read_sst_trees(io.StringIO("(1 (2 a) (3 b) (4 c))"), binarize=True)
    assert str(ds.trees[0]) == "(1 (2 a) (1 (3 b) (4 c)))"


def test_file_errors_name_the_line(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text("(2 (2 a))\n(3 (2 a)\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"dev\.txt, line 2: unbalanced"):
        read_sst_trees(path)
    with pytest.raises(
        DataFormatError, match=r"line 1: sentiment label 7 of the phrase at tokens 0:1"
    ):
        read_sst_trees(io.StringIO("(2 (7 a))\n"))
    with pytest.raises(DataFormatError, match="no trees"):
        read_sst_trees(io.StringIO("\n\n"))
    with pytest.raises(ValueError, match="labels must be"):
        read_sst_trees(io.StringIO(TREES), labels="ternary")


def test_too_deep_a_tree_is_a_format_error():
    """A line nested deeper than the recursion limit ended in a raw RecursionError."""
    depth = sys.getrecursionlimit() + 100
    deep = "(2 " * depth + "(2 a)" + ")" * (depth - 1)  # also one ')' short
    with pytest.raises(DataFormatError, match=r"^tree nested too deeply at character \d+$"):
        parse_tree(deep)
    with pytest.raises(
        DataFormatError, match=r"^<stream>, line 2: tree nested too deeply at character \d+$"
    ):
        read_sst_trees(io.StringIO("(2 (2 a))\n" + deep + "\n"))
    assert parse_tree("(2 " * 100 + "(2 a)" + ")" * 100).leaves() == ["a"]


def test_parse_tree_bad_arguments():
    """None failed inside the tokenising regex; unescape='no' was truthy."""
    with pytest.raises(TypeError, match=r"^text must be a str holding one tree, got NoneType$"):
        parse_tree(None)
    with pytest.raises(TypeError, match=r"^unescape must be a bool, got 'no'$"):
        parse_tree("(3 (2 a) (3 b))", unescape="no")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"binarize": "no"}, TypeError, r"binarize must be a bool, got 'no'"),
        ({"lower": "yes"}, TypeError, r"lower must be a bool, got 'yes'"),
    ],
)
def test_bad_options_fail_before_the_file_is_read(tmp_path, options, error, message):
    with pytest.raises(error, match=f"^{message}"):
        read_sst_trees(tmp_path / "missing.txt", **options)
