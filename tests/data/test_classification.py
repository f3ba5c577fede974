"""CSV / TSV / JSON Lines text classification readers."""

from __future__ import annotations

import bz2
import gzip
import io
import json

import pytest
from datahelpers import SHARED_DATASETS, needs_shared

from attnlab.data import DataFormatError
from attnlab.data.classification import read_csv, read_jsonl, read_text_classification, read_tsv

CSV = 'text,label,split\n"a gem, truly",pos,train\ndull,neg,test\n"two\nlines",pos,validation\n'


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_basic(tmp_path):
    ds = read_csv(_write(tmp_path, "a.csv", CSV), split_column="split")
    assert ds.texts == ("a gem, truly", "dull", "two\nlines")
    assert ds.label_names == ("neg", "pos") and ds.labels == (1, 0, 1)
    assert ds.splits == ("train", "test", "dev")  # validation -> dev
    assert ds.ids == ("2", "3", "4")  # the line each record starts on


def test_format_from_suffix_and_compression(tmp_path):
    plain = read_text_classification(_write(tmp_path, "a.csv", CSV))
    gz = tmp_path / "a.csv.gz"
    gz.write_bytes(gzip.compress(CSV.encode()))
    bz = tmp_path / "a.csv.bz2"
    bz.write_bytes(bz2.compress(CSV.encode()))
    for path in (gz, bz):
        ds = read_text_classification(path)
        assert ds.texts == plain.texts and ds.labels == plain.labels
    with pytest.raises(ValueError, match="cannot tell the format"):
        read_text_classification(_write(tmp_path, "a.txt", CSV))


def test_tsv_keeps_quotes(tmp_path):
    path = _write(tmp_path, "a.tsv", 'sentence\tgold\n"quoted" start\t1\nplain\t0\n')
    ds = read_tsv(path, text_column="sentence", label_column="gold")
    assert ds.texts == ('"quoted" start', "plain")
    assert ds.label_names == ("0", "1") and ds.labels == (1, 0)


def test_jsonl_with_numbers_and_ids(tmp_path):
    lines = [
        {"review": "great", "stars": 5, "uid": "r1"},
        {"review": "awful", "stars": 1, "uid": "r2"},
        {"review": "ok", "stars": 3.0, "uid": "r3"},
    ]
    path = _write(tmp_path, "a.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    ds = read_jsonl(path, text_column="review", label_column="stars", id_column="uid")
    assert ds.label_names == ("1", "3", "5")  # numeric order
    assert ds.labels == (2, 0, 1) and ds.ids == ("r1", "r2", "r3")


def test_numeric_labels_sort_numerically(tmp_path):
    path = _write(tmp_path, "a.csv", "text,label\na,10\nb,9\nc,-1\n")
    assert read_csv(path).label_names == ("-1", "9", "10")


def test_label_list_fixes_order(tmp_path):
    ds = read_csv(_write(tmp_path, "a.csv", CSV), labels=["pos", "neg"])
    assert ds.label_names == ("pos", "neg") and ds.labels == (0, 1, 0)


def test_label_mapping_merges_and_drops(tmp_path):
    text = "text,label\na,0\nb,1\nc,2\nd,3\ne,4\n"
    mapping = {"0": "negative", "1": "negative", "2": None, "3": "positive", "4": "positive"}
    ds = read_csv(_write(tmp_path, "a.csv", text), labels=mapping)
    assert ds.texts == ("a", "b", "d", "e")
    assert ds.label_names == ("negative", "positive") and ds.labels == (0, 0, 1, 1)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_a_byte_order_mark_is_not_part_of_the_first_field(tmp_path, fmt):
    """Excel's "CSV UTF-8" starts with a BOM: the header's first name is still ``text``
    (it was ``\ufefftext``: "no field 'text'"), from a file and from a stream."""
    text = {
        "csv": CSV,
        "tsv": CSV.replace('"a gem, truly"', "a gem")
        .replace('"two\nlines"', "two")
        .replace(",", "\t"),
        "jsonl": '{"text": "a gem", "label": "pos"}\n{"text": "dull", "label": "neg"}\n',
    }[fmt]
    path = tmp_path / f"bom.{fmt}"
    path.write_text(text, encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    plain = read_text_classification(_write(tmp_path, f"plain.{fmt}", text))
    for source in (path, io.StringIO("\ufeff" + text)):
        ds = read_text_classification(source, format=fmt)
        assert ds.texts == plain.texts and ds.labels == plain.labels


def test_stream_input():
    ds = read_text_classification(io.StringIO(CSV), format="csv")
    assert len(ds) == 3 and ds.name == "<stream>"


def test_seeded_split_when_file_has_none(tmp_path):
    text = "text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(100))
    path = _write(tmp_path, "a.csv", text)
    a, b = read_csv(path, seed=3), read_csv(path, seed=3)
    assert a.splits == b.splits
    assert {s: a.splits.count(s) for s in ("train", "dev", "test")} == {
        "train": 80,
        "dev": 10,
        "test": 10,
    }
    assert read_csv(path, seed=4).splits != a.splits


@pytest.mark.parametrize(
    ("name", "content", "options", "message"),
    [
        ("a.csv", "txt,label\nx,1\n", {}, r"a\.csv, line 2: no field 'text'"),
        ("a.csv", "text,label\nx,1\ny,1,extra\n", {}, r"line 3: 3 fields, but the header has 2"),
        ("a.csv", "text,label\nx,1\n  ,0\n", {}, r"line 3: the text \('text'\) is empty"),
        ("a.csv", 'text,label\nx,1\n"y"z,0\n', {}, r"line 3: malformed CSV"),
        (
            "a.csv",
            "text,label\nx,1\ny,2\n",
            {"labels": ["1"]},
            r"line 3: unknown label '2'; expected one of \['1'\]",
        ),
        (
            "a.csv",
            "text,label\nx,1\ny,7\n",
            {"labels": {"1": "a"}},
            r"line 3: label '7' is not in the label mapping",
        ),
        (
            "a.csv",
            "text,label,s\nx,1,train\ny,1,holdout\n",
            {"split_column": "s"},
            r"line 3: unknown split 'holdout'",
        ),
        (
            "a.csv",
            "text,label,id\nx,1,a\ny,1,a\n",
            {"id_column": "id"},
            r"line 3: duplicate id 'a' \(first on line 2\)",
        ),
        ("a.csv", "text,label,text\nx,1,y\n", {}, r"line 1: repeated column names"),
        ("a.csv", "", {}, r"the file is empty"),
        ("a.csv", "text,label\n", {}, r"no records"),
        # an empty label became a class named '' (an empty text was already an error)
        ("a.csv", "text,label\nx,pos\ny,\nz,neg\n", {}, r"line 3: the label \('label'\) is empty$"),
        (
            "a.jsonl",
            '{"text": "x", "stars": "pos"}\n{"text": "y", "stars": "  "}\n',
            {"label_column": "stars"},
            r"a\.jsonl, line 2: the label \('stars'\) is empty$",
        ),
        # a mapping that dropped every record gave an empty dataset
        (
            "a.csv",
            "text,label\nx,2\ny,2\n",
            {"labels": {"0": "neg", "4": "pos", "2": None}},
            r"a\.csv: no records left: the label mapping drops all 2 records",
        ),
        # a repeated key kept its last value silently
        (
            "a.jsonl",
            '{"text": "x", "label": 1}\n{"text": "y", "label": "neg", "label": "pos"}\n',
            {},
            r"a\.jsonl, line 2: repeated key 'label' in a JSON object$",
        ),
        (
            "a.jsonl",
            '{"text": "x", "label": 1}\n{"text": "y", label: 1}\n',
            {},
            r"a\.jsonl, line 2: invalid JSON",
        ),
        (
            "a.jsonl",
            '{"text": "x", "label": 1}\n["y", 1]\n',
            {},
            r"line 2: expected a JSON object per line, got list",
        ),
        (
            "a.jsonl",
            '{"text": "x", "label": null}\n',
            {},
            r"line 1: 'label' must be a string or a number, got null",
        ),
    ],
)
def test_validation_errors_name_the_line(tmp_path, name, content, options, message):
    path = _write(tmp_path, name, content)
    with pytest.raises(DataFormatError, match=message):
        read_text_classification(path, **options)


def test_multiline_record_error_reports_its_first_line(tmp_path):
    path = _write(tmp_path, "a.csv", 'text,label\n"one\ntwo\nthree",1\nx\n')
    with pytest.raises(DataFormatError, match=r"line 5: 1 fields"):
        read_csv(path)


def test_bad_arguments(tmp_path):
    path = _write(tmp_path, "a.csv", CSV)
    with pytest.raises(ValueError, match="format must be"):
        read_text_classification(path, format="xml")
    with pytest.raises(TypeError, match="not a string"):
        read_csv(path, labels="pos")
    with pytest.raises(FileNotFoundError, match="no such data file"):
        read_csv(tmp_path / "missing.csv")


@needs_shared
def test_sst_binary_csv_from_shared_datasets():
    ds = read_csv(
        SHARED_DATASETS / "sst" / "sst_binary.csv", split_column="exp_split", labels=["0", "1"]
    )
    sizes = {s: len(ds.split(s)) for s in ("train", "dev", "test")}
    assert sizes == {
        "train": 6920,
        "dev": 872,
        "test": 1821,
    }  # as documented for Jain & Wallace's SST
    assert set(ds.labels) == {0, 1}
    assert all(t == t.lower() for t in ds.texts[:200])  # lower-cased, tokenised
    assert ds.texts[0].startswith("the rock is destined to be the 21st century")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"format": ""}, ValueError, r"format must be 'csv', 'tsv' or 'jsonl', got ''"),
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1\.5"),
        ({"labels": 5}, TypeError, r"labels must be a sequence of label names or a mapping"),
        ({"labels": {"pos": "p", "neg": 5}}, TypeError, r"labels maps 'neg' to 5; a label name"),
        ({"encoding": "no-such-codec"}, ValueError, r"encoding must be the name of a text enc"),
    ],
)
def test_bad_options_fail_before_the_file_is_read(tmp_path, options, error, message):
    """Each bad option raises one line naming it before the (missing) file is opened: a NaN
    fraction ended in round()'s "cannot convert float NaN", format='' guessed the format,
    a str or float seed and a label mapped to an int were taken, labels=5 and an unknown
    encoding raised from deep inside (after the file was read)."""
    with pytest.raises(error, match=f"^{message}"):
        read_text_classification(tmp_path / "missing.csv", **options)


def test_a_binary_file_is_a_format_error_naming_it(tmp_path):
    path = tmp_path / "a.csv"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    with pytest.raises(DataFormatError, match=r"a\.csv: not utf-8 text \(invalid start byte\)"):
        read_csv(path)
    gz = tmp_path / "b.csv.gz"
    gz.write_bytes(b"not gzip at all")
    with pytest.raises(DataFormatError, match=r"b\.csv\.gz: cannot decompress"):
        read_csv(gz)


@pytest.mark.parametrize(
    ("source", "error", "message"),
    [
        (None, TypeError, r"^source must be a path \(a str or os\.PathLike\), got NoneType$"),
        (5, TypeError, r"^source must be a path \(a str or os\.PathLike\), got int$"),
        ("", ValueError, r"^source must not be empty \(it would be the working folder\)$"),
    ],
)
def test_a_source_that_is_no_path(source, error, message):
    """'' was read as the working folder ("'.' is a folder"), None and 5 failed in pathlib."""
    with pytest.raises(error, match=message):
        read_csv(source)
