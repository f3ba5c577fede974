"""Tests of attnlab.data._io.open_text: what a path to read may be."""

from __future__ import annotations

import gzip
import os

import pytest

from attnlab.data._io import open_text


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
