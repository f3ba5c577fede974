"""Tests of attnlab.data._io.open_text: what a path to read may be."""

from __future__ import annotations

import gzip
import os

import pytest

from attnlab.data import DataFormatError
from attnlab.data._io import json_objects, open_text


def test_a_file_a_compressed_file_and_a_stream(tmp_path):
    (tmp_path / "a.txt").write_text("plain\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("packed\n")
    with open_text(tmp_path / "a.txt") as f:
        assert f.read() == "plain\n"
    with open_text(str(tmp_path / "b.txt.gz")) as f:
        assert f.read() == "packed\n"
    with open(tmp_path / "a.txt") as stream, open_text(stream) as f:
        assert f is stream


def test_a_utf8_byte_order_mark_is_not_text(tmp_path):
    """Every reader opens files here: a BOM (Notepad's and Excel's UTF-8) does not reach
    the first token (parallel text kept it, SST trees failed "expected '('"); the same text
    without one, or in another encoding, is read as before."""
    from attnlab.data.parallel import read_parallel
    from attnlab.data.sst import read_sst_trees

    (tmp_path / "bom.txt").write_text("the house ||| la maison\n", encoding="utf-8-sig")
    (tmp_path / "bom.txt.gz").write_bytes(gzip.compress("x\n".encode("utf-8-sig")))
    (tmp_path / "latin.txt").write_bytes(b"\xef\xbb\xbf\xe9\n")  # latin-1: not a BOM
    with open_text(tmp_path / "bom.txt") as f:
        assert f.read() == "the house ||| la maison\n"
    with open_text(tmp_path / "bom.txt.gz") as f:
        assert f.read() == "x\n"
    with open_text(tmp_path / "latin.txt", encoding="latin-1") as f:
        assert f.read() == "ï»¿é\n"  # another encoding reads those bytes as text
    assert read_parallel(tmp_path / "bom.txt")[0].source == ("the", "house")
    (tmp_path / "train.txt").write_text("(3 (2 a) (3 b))\n", encoding="utf-8-sig")
    assert read_sst_trees(tmp_path / "train.txt").tokens[0] == ("a", "b")


def test_a_missing_path_and_a_folder_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^no such data file: .*nope\.txt$"):
        with open_text(tmp_path / "nope.txt"):
            pass
    with pytest.raises(IsADirectoryError, match=r"is a folder, not a data file$"):
        with open_text(tmp_path):
            pass


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_read(tmp_path):
    """``attnlab aer gold.txt <(command)`` hands over a pipe, not a regular file."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # the writer
        try:
            with open(fifo, "w") as w:
                w.write("0-0 1-1\n")
        finally:
            os._exit(0)
    try:
        with open_text(fifo) as f:
            assert f.read() == "0-0 1-1\n"
    finally:
        os.waitpid(pid, 0)


def test_json_objects_refuse_a_repeated_key():
    """Plain json.loads keeps the last of two values of one key without a word."""
    lines = ['{"a": 1, "b": {"c": 2}}\n', "\n", '{"a": 1, "b": 2, "a": 3}\n']
    with pytest.raises(
        DataFormatError, match=r"^f\.jsonl, line 3: repeated key 'a' in a JSON object$"
    ):
        list(json_objects(lines, "f.jsonl"))
    with pytest.raises(DataFormatError, match=r"^f\.jsonl, line 1: repeated key 'c'"):
        list(json_objects(['{"b": {"c": 1, "c": 1}}'], "f.jsonl"))  # nested, even equal values
    assert list(json_objects(lines[:2], "f.jsonl")) == [(1, {"a": 1, "b": {"c": 2}})]
