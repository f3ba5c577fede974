"""attnlab's own Parquet string-column reader, against files written by pyarrow."""

from __future__ import annotations

import sys

import pytest
from datahelpers import FIXTURES

from attnlab.data._parquet import (
    ParquetUnsupported,
    _rle_hybrid,
    read_string_column,
    snappy_decompress,
)

# what pyarrow was given for the fixtures (see fixtures/README.md)
WORDS = ["the", "naïve", None, "café", "the", "", "x" * 70, "zebra", "the", "of"] * 3


@pytest.mark.parametrize(
    "name",
    [
        "strings_dict_snappy_v1.parquet",
        "strings_plain_gzip_v2.parquet",
        "strings_dict_none_v2.parquet",
    ],
)
def test_encodings_codecs_and_page_versions(name):
    assert read_string_column(FIXTURES / name) == WORDS
    assert read_string_column(FIXTURES / name, "other") == [str(i) for i in range(30)]


def test_required_column():
    expected = [w or "-" for w in WORDS]  # pyarrow was given `w or "-"`
    assert read_string_column(FIXTURES / "strings_required_plain_snappy_v1.parquet") == expected


def test_unsupported_features_are_named(tmp_path):
    with pytest.raises(ParquetUnsupported, match="not a string"):
        read_string_column(FIXTURES / "ints.parquet")
    with pytest.raises(ParquetUnsupported, match="no column 'nope'"):
        read_string_column(FIXTURES / "strings_dict_snappy_v1.parquet", "nope")
    bad = tmp_path / "x.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(ParquetUnsupported, match="not a Parquet file"):
        read_string_column(bad)


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="Python 3.14 reads zstd itself")
def test_zstd_needs_newer_python():
    with pytest.raises(ParquetUnsupported, match="ZSTD"):
        read_string_column(FIXTURES / "strings_zstd.parquet")


def test_snappy_literal_and_copies():
    # length 11; literal "abcd" (tag (4-1)<<2), copy-1 of 4 bytes at offset 4
    # (tag ((4-4)<<2)|1, offset byte 4) -> "abcdabcd", copy-2 of 3 bytes at offset 8
    # (tag ((3-1)<<2)|2, offset 8 as two bytes) -> "abc"
    block = bytes([11, 3 << 2, *b"abcd", 0b01, 4, (2 << 2) | 2, 8, 0])
    assert snappy_decompress(block) == b"abcdabcdabc"


def test_snappy_overlapping_copy_repeats():
    # "ab" then a 7-byte copy at offset 2 (copy-1: tag ((7-4)<<2)|1) -> "ababababa"
    block = bytes([9, 1 << 2, *b"ab", (3 << 2) | 1, 2])
    assert snappy_decompress(block) == b"ababababa"


def test_snappy_long_literal():
    data = bytes(range(100))
    # a literal of 100 bytes: tag 60<<2 says "length-1 in the next byte"
    block = bytes([100, 60 << 2, 99, *data])
    assert snappy_decompress(block) == data


def test_snappy_corrupt():
    with pytest.raises(ParquetUnsupported, match="copy before the start"):
        snappy_decompress(bytes([4, 0b01, 9]))
    with pytest.raises(ParquetUnsupported, match="expected 5"):
        snappy_decompress(bytes([5, 0, ord("a")]))


def test_rle_hybrid_by_hand():
    # a run of 5 copies of value 3 at bit width 2: header 5<<1, value byte 3
    assert _rle_hybrid(bytes([10, 3]), 2, 5) == [3, 3, 3, 3, 3]
    # one bit-packed group (header (1<<1)|1) of 8 values at width 3: 0..7
    values = list(range(8))
    packed = sum(v << (3 * i) for i, v in enumerate(values)).to_bytes(3, "little")
    assert _rle_hybrid(bytes([3, *packed]), 3, 8) == values
    # the group is cut to the number of values asked for
    assert _rle_hybrid(bytes([3, *packed]), 3, 6) == values[:6]


def test_read_string_column_takes_paths_only(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="path must be a path"):
        read_string_column(0)  # open(0) would read standard input
    name = "strings_plain_gzip_v2.parquet"
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / name).write_bytes((FIXTURES / name).read_bytes())
    assert read_string_column("~/" + name) == read_string_column(FIXTURES / name)
