"""VADER rated sentences (Hutto & Gilbert 2014): archive layouts, sentences, documents."""

from __future__ import annotations

import io
import tarfile

import pytest

from attnlab.data import DataFormatError, MissingDataError, clear_cache, vader
from attnlab.data.vader import find_vader_archive, load_vader_documents, load_vader_sentences

FILES = {
    "movieReviewSnippets_GroundTruth.txt": "1\t2.5\tA fine film.\r\n2\t-1.25\tToo long.\r\n3\t0\tIt exists.\r\n",
    "amazonReviewSnippets_GroundTruth.txt": (
        "1_2\t-2\tIt broke.\r\n1_1\t1.5\tGood at first.\r\n1_3\t-0.5\tMeh.\r\n2_1\t3\tLove it.\r\n"
    ),
    "nytEditorialSnippets_GroundTruth.txt": "7_1\t0.4\tA plan.\r\n7_2\t-0.4\tA doubt.\r\n",
    "tweets_GroundTruth.txt": "1\t2.7\tSo lucky.\r\n2\t-2.1\tDie die die\r\n",
}


def _tar(files: dict[str, bytes], prefix: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _layouts(tmp_path, files=FILES):
    """The same data as a folder, as the data archive, and as the sdist holding it."""
    raw = {k: v.encode("utf-8") for k, v in files.items()}
    folder = tmp_path / "hutto_ICWSM_2014"
    folder.mkdir()
    for name, data in raw.items():
        (folder / name).write_bytes(data)
    archive = tmp_path / "hutto_ICWSM_2014.tar.gz"
    archive.write_bytes(_tar(raw, "hutto_ICWSM_2014/"))
    sdist = tmp_path / "vaderSentiment-3.3.2.tar.gz"
    sdist.write_bytes(
        _tar(
            {"additional_resources/hutto_ICWSM_2014.tar.gz": archive.read_bytes(), "setup.py": b""},
            "vaderSentiment-3.3.2/",
        )
    )
    return folder, archive, sdist


def test_three_layouts_read_the_same(tmp_path, fresh_cache):
    results = []
    for location in _layouts(tmp_path):
        clear_cache()
        ds = load_vader_sentences("all", path=location, labels="ternary")
        results.append(ds.to_json())
    assert results[0] == results[1] == results[2]


def test_sentences(tmp_path, fresh_cache):
    folder, _, _ = _layouts(tmp_path)
    ds = load_vader_sentences("movie", path=folder)
    assert ds.texts == ("A fine film.", "Too long.")  # the 0 rating is dropped in binary mode
    assert ds.labels == (1, 0) and ds.scores == (2.5, -1.25) and ds.ids == ("movie-1", "movie-2")
    tern = load_vader_sentences("movie", path=folder, labels="ternary")
    assert tern.label_names == ("negative", "neutral", "positive") and tern.labels == (2, 0, 1)
    band = load_vader_sentences("movie", path=folder, labels="ternary", threshold=1.5)
    assert band.labels == (2, 1, 1)
    amazon = load_vader_sentences("amazon", path=folder)
    assert amazon.groups == ("amazon-1", "amazon-1", "amazon-1", "amazon-2")
    assert (
        len({s for g, s in zip(amazon.groups, amazon.splits, strict=True) if g == "amazon-1"}) == 1
    )
    assert len(load_vader_sentences("all", path=folder)) == 2 + 4 + 2 + 2


def test_documents_group_and_order_sentences(tmp_path, fresh_cache):
    folder, _, _ = _layouts(tmp_path)
    docs = load_vader_documents("amazon", path=folder)
    assert docs.ids == ("amazon-1", "amazon-2")
    assert docs.documents[0] == ("Good at first.", "It broke.", "Meh.")  # by sentence number
    assert docs.sentence_ids[0] == ("1_1", "1_2", "1_3")
    assert docs.sentence_scores[0] == (1.5, -2.0, -0.5)
    assert docs.scores[0] == pytest.approx(-1 / 3) and docs.labels == (0, 1)
    nyt = load_vader_documents("nyt", path=folder, labels="ternary")
    assert nyt.labels == (1,) and nyt.scores[0] == pytest.approx(0.0)
    assert len(load_vader_documents("nyt", path=folder)) == 0  # a neutral document is dropped
    with pytest.raises(ValueError, match="source must be one of"):
        load_vader_documents("movie", path=folder)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "tweets_GroundTruth.txt",
            "1\t2.7\n",
            r"tweets_GroundTruth\.txt, line 1: 2 tab-separated fields",
        ),
        ("tweets_GroundTruth.txt", "1\t2.7\tx\n1\t1\ty\n", r"line 2: duplicate id '1'"),
        ("tweets_GroundTruth.txt", "1\tfive\tx\n", r"line 1: rating 'five' is not a number"),
        ("tweets_GroundTruth.txt", "1\t4.5\tx\n", r"line 1: rating 4.5 is outside"),
        ("amazonReviewSnippets_GroundTruth.txt", "12\t1\tx\n", r"line 1: bad id '12' for amazon"),
        ("movieReviewSnippets_GroundTruth.txt", "1\t1\t  \n", r"line 1: empty sentence"),
    ],
)
def test_validation(tmp_path, fresh_cache, name, content, message):
    folder, _, _ = _layouts(tmp_path, {**FILES, name: content})
    with pytest.raises(DataFormatError, match=message):
        load_vader_sentences("all", path=folder)


def test_only_newlines_end_a_line(tmp_path, fresh_cache):
    """str.splitlines() split a sentence at U+2028, U+0085, a form feed...; the piece
    after it was refused as a line of one field."""
    movie = "1\t2.5\tA fine\u2028film.\r\n2\t-1.25\tToo\x85long\x0c.\n3\t1\tOk\x1e.\r\n"
    folder, _, _ = _layouts(tmp_path, {**FILES, "movieReviewSnippets_GroundTruth.txt": movie})
    ds = load_vader_sentences("movie", path=folder)
    assert ds.texts == ("A fine film.", "Too long .", "Ok .") and ds.scores == (2.5, -1.25, 1.0)
    bad = "1\t2.5\ta\u2029b\n2\t9\tc\n"  # the line numbers count newlines only
    (tmp_path / "bad").mkdir()
    folder, _, _ = _layouts(tmp_path / "bad", {**FILES, "tweets_GroundTruth.txt": bad})
    with pytest.raises(DataFormatError, match=r"tweets_GroundTruth\.txt, line 2: rating 9"):
        load_vader_sentences("all", path=folder)


def test_incomplete_archive(tmp_path, fresh_cache):
    archive = tmp_path / "other.tar.gz"
    archive.write_bytes(_tar({"README": b"x"}, "x/"))
    with pytest.raises(DataFormatError, match="neither the ground-truth files"):
        load_vader_sentences(path=archive)
    partial = tmp_path / "partial.tar.gz"
    partial.write_bytes(_tar({"tweets_GroundTruth.txt": b"1\t1\tx\n"}, ""))
    with pytest.raises(DataFormatError, match=r"missing \['amazonReviewSnippets_GroundTruth\.txt'"):
        load_vader_sentences(path=partial)


def test_archive_lookup_order(tmp_path, monkeypatch, fresh_cache):
    _, archive, sdist = _layouts(tmp_path)
    monkeypatch.delenv("ATTNLAB_VADER_DATA", raising=False)
    monkeypatch.setenv("ATTNLAB_SOURCES", str(tmp_path))
    assert find_vader_archive() == archive  # the data archive before the sdist
    archive.unlink()
    assert find_vader_archive() == sdist
    monkeypatch.setenv("ATTNLAB_VADER_DATA", str(tmp_path / "hutto_ICWSM_2014"))
    assert find_vader_archive() == tmp_path / "hutto_ICWSM_2014"
    monkeypatch.setenv("ATTNLAB_VADER_DATA", str(tmp_path / "nope"))
    with pytest.raises(MissingDataError, match="does not exist"):
        find_vader_archive()


def test_missing_archive_says_how_to_fetch(tmp_path, monkeypatch, fresh_cache):
    monkeypatch.delenv("ATTNLAB_VADER_DATA", raising=False)
    monkeypatch.setenv("ATTNLAB_SOURCES", str(tmp_path / "sources"))
    monkeypatch.setenv("HOME", str(tmp_path))  # nor in ~/.cache/attnlab/sources
    with pytest.raises(MissingDataError) as info:
        load_vader_sentences()
    message = str(info.value)
    assert "vaderSentiment 3.3.2" in message and "not in its wheel" in message
    fetch = (
        f"pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d {tmp_path / 'sources'}"
    )
    assert fetch in message


def test_parsed_once(tmp_path, monkeypatch, fresh_cache):
    _, archive, _ = _layouts(tmp_path)
    calls = []
    real = vader._parse
    monkeypatch.setattr(vader, "_parse", lambda loc: calls.append(loc) or real(loc))
    load_vader_sentences("movie", path=archive)
    load_vader_documents("amazon", path=archive)
    clear_cache()
    load_vader_sentences("tweets", path=archive)  # from the disk cache
    assert len(calls) == 1


def _real_archive_or_none():
    try:
        return find_vader_archive()
    except MissingDataError:
        return None


needs_vader = pytest.mark.skipif(
    _real_archive_or_none() is None,
    reason="the vaderSentiment 3.3.2 source archive is not in the sources folder; fetch it with "
    + vader.FETCH,
)


@needs_vader
def test_real_sentences():
    counts = {s: len(load_vader_sentences(s, labels="ternary")) for s in vader.SOURCES}
    assert counts == {"movie": 10605, "amazon": 3708, "nyt": 5190, "tweets": 4200}
    movie = load_vader_sentences("movie")
    assert movie.label_counts() == {"negative": 5326, "positive": 5242}
    assert movie.texts[0].startswith("The Rock is destined to be the 21st Century's new")
    assert all(-4 <= s <= 4 for s in movie.scores)


@needs_vader
def test_real_documents():
    amazon = load_vader_documents("amazon", labels="ternary")
    nyt = load_vader_documents("nyt", labels="ternary")
    assert (len(amazon), len(nyt)) == (300, 498)
    assert sum(len(d) for d in amazon.documents) == 3708
    assert sum(len(d) for d in nyt.documents) == 5190
    first = amazon[0]
    assert first.sentence_ids[:3] == ("1_1", "1_2", "1_3")
    assert first.sentences[0].startswith("troubleshooting ad-2500 and ad-2600")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"threshold": float("nan")}, r"threshold must be a number in \[0, 4\), got nan"),
        ({"threshold": float("inf")}, r"threshold must be a number in \[0, 4\), got inf"),
        ({"threshold": -1}, r"threshold must be a number in \[0, 4\), got -1"),
        ({"threshold": 4}, r"threshold must be a number in \[0, 4\), got 4"),
        ({"threshold": "0.5"}, r"threshold must be a number in \[0, 4\), got '0\.5'"),
        ({"threshold": True}, r"threshold must be a number in \[0, 4\), got True"),
        ({"fractions": (float("nan"), 0.5, 0.5)}, r"fractions must be three non-negative"),
        ({"seed": "x"}, r"seed must be an int, got 'x'"),
        ({"seed": 1.5}, r"seed must be an int, got 1\.5"),
        ({"cache": "no"}, r"cache must be a bool, got 'no'"),
    ],
)
@pytest.mark.parametrize("loader", [load_vader_sentences, load_vader_documents])
def test_bad_options_fail_before_reading(tmp_path, loader, option, message):
    """A bad option raises one line naming it before the data is looked for (the path
    does not exist); NaN passed ``threshold < 0`` and gave an empty dataset."""
    with pytest.raises((ValueError, TypeError), match=f"^{message}"):
        loader(path=tmp_path / "missing", **option)


def test_empty_path_is_not_the_working_folder(fresh_cache):
    with pytest.raises(ValueError, match="path must not be empty"):
        load_vader_sentences(path="")
    with pytest.raises(TypeError, match="path must be a path"):
        find_vader_archive(5)
