"""The lab's files (attnlab.lab.files): plain JSON values, UTC timestamps and atomic writes."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.lab.files import (
    check_folder,
    jsonable,
    make_folder,
    utc_now,
    write_json,
    write_text,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ((1, 2, (3, 4)), [1, 2, [3, 4]]),
        ({"a": (1.5, None)}, {"a": [1.5, None]}),
        ({1: "x", 2.5: "y"}, {"1": "x", "2.5": "y"}),
        (float("nan"), None),
        (float("inf"), None),
        (-math.inf, None),
        ([1.0, float("nan")], [1.0, None]),
        (True, True),
        (None, None),
        ("text", "text"),
        (np.float32(0.5), 0.5),
        (np.float64("nan"), None),
        (np.int64(7), 7),
        (np.bool_(True), True),
        (torch.tensor(3), 3),
        (torch.tensor(0.25), 0.25),
        (torch.tensor(float("nan")), None),
        (np.array([[1, 2], [3, 4]]), [[1, 2], [3, 4]]),
        (Path("runs") / "a", str(Path("runs") / "a")),
    ],
)
def test_jsonable(value, expected):
    result = jsonable(value)
    assert result == expected
    assert type(result) is type(expected)
    json.dumps(result, allow_nan=False)  # plain JSON


def test_jsonable_scalars_are_python_numbers():
    assert type(jsonable(np.int32(3))) is int
    assert type(jsonable(np.float16(1.0))) is float
    assert type(jsonable(torch.tensor(2.0, dtype=torch.bfloat16))) is float


def test_jsonable_tensors_and_sets_are_lists():
    got = jsonable({"per_class": torch.tensor([[0.5, float("nan")], [1.0, 2.0]])})
    assert got == {"per_class": [[0.5, None], [1.0, 2.0]]}
    assert jsonable(torch.tensor([1, 2], dtype=torch.int64)) == [1, 2]
    assert jsonable(torch.tensor([0.25], requires_grad=True)) == [0.25]
    assert jsonable({"b", "a", "c"}) == ["a", "b", "c"]
    assert jsonable(frozenset({2, "x"})) == [2, "x"]  # mixed types: ordered by their text
    json.dumps(got, allow_nan=False)


def test_jsonable_any_other_object_is_its_text():
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    assert jsonable({"x": Thing()}) == {"x": "a thing"}


def test_utc_now_is_utc_to_the_second():
    text = utc_now()
    assert text.endswith("+00:00")
    stamp = datetime.fromisoformat(text)
    assert stamp.utcoffset() == timedelta(0)
    assert stamp.microsecond == 0
    assert abs(datetime.now(UTC) - stamp) < timedelta(seconds=5)


def test_write_json_writes_indented_plain_json(tmp_path):
    path = tmp_path / "a.json"
    write_json(path, {"b": (1, float("nan")), "a": np.float32(2.0)})
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and "\n  " in text
    assert json.loads(text) == {"b": [1, None], "a": 2.0}
    write_json(path, {"b": 1, "a": 2}, sort_keys=True)
    assert list(json.loads(path.read_text())) == ["a", "b"]


def test_write_json_leaves_no_temporary_file(tmp_path):
    write_json(tmp_path / "a.json", [1, 2])
    write_json(tmp_path / "a.json", [3])  # replaces the file
    assert os.listdir(tmp_path) == ["a.json"]
    assert json.loads((tmp_path / "a.json").read_text()) == [3]


def test_an_error_while_serialising_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    write_json(path, {"old": True})

    def broken(*args, **kwargs):
        raise RuntimeError("serialisation failed")

    monkeypatch.setattr(json, "dumps", broken)
    with pytest.raises(RuntimeError, match="serialisation failed"):
        write_json(path, {"new": True})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": True}
    assert os.listdir(tmp_path) == ["a.json"]


def test_an_error_while_writing_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    write_text(path, "old")

    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_text(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["a.txt"]  # the temporary file is removed


def test_a_failed_write_names_the_file_asked_for(tmp_path):
    target = tmp_path / "missing-folder" / "a.txt"  # the folder does not exist
    with pytest.raises(FileNotFoundError) as caught:
        write_text(target, "x")
    assert caught.value.filename == str(target)
    assert ".tmp" not in str(caught.value)
    assert not (tmp_path / "missing-folder").exists()


def test_make_folder_makes_the_folders_above_too(tmp_path):
    made = make_folder(tmp_path / "a" / "b", "--out a/b")
    assert made == tmp_path / "a" / "b" and made.is_dir()
    assert make_folder(made, "--out a/b") == made  # an existing folder is fine


def test_make_folder_says_what_is_in_the_way(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match=r"^--out f/x: .*f is a file, not a folder$"):
        make_folder(tmp_path / "f" / "x", "--out f/x")


def test_make_folder_accepts_a_folder_another_process_makes_while_it_looks(tmp_path, monkeypatch):
    """N ablations started together on one directory: the folder appears between this
    process's first look (nothing there) and any second look. The old check looked twice
    (is it a folder? then does anything exist?) and called the new folder "not a folder"."""
    target, real_stat, made = tmp_path / "abl", os.stat, []

    def racing_stat(path, *args, **kwargs):
        if Path(path) == target and not made:  # nothing there at the first look ...
            os.mkdir(target)  # ... and another process makes it just after it
            made.append(target)
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", racing_stat)
    assert make_folder(target, "ablation directory abl") == target
    monkeypatch.undo()
    assert target.is_dir()


def test_check_folder_names_a_link_to_nothing_and_other_things_in_the_way(tmp_path):
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"^--out d/x: .*dangling is a link to nothing"):
        check_folder(tmp_path / "dangling" / "x", "--out d/x")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ConfigError, match=r"^--out p: .*pipe is not a folder$"):
        check_folder(tmp_path / "pipe", "--out p")
    (tmp_path / "to-folder").symlink_to(tmp_path, target_is_directory=True)
    check_folder(tmp_path / "to-folder" / "x", "--out t/x")  # a link to a folder is fine
    assert not (tmp_path / "to-folder" / "x").exists()  # nothing is created


def test_make_folder_says_why_it_cannot_create_one(tmp_path, monkeypatch):
    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(ConfigError) as caught:
        make_folder(tmp_path / "x", "--out x")
    assert str(caught.value) == f"--out x: cannot create {tmp_path / 'x'} (Permission denied)"
