"""Tests of attnlab._atomic: atomic writes and the modes of what they make."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from attnlab._atomic import (
    file_mode,
    make_temp_folder,
    process_umask,
    temp_files,
    write_file,
    write_text,
)


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    """Run the test under this umask; the process's own is set back afterwards."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_process_umask_reads_the_umask_and_leaves_it(umask):
    assert process_umask() == umask
    assert os.umask(umask) == umask  # still set: reading it did not change it


def test_process_umask_without_proc(umask, monkeypatch):
    """Where /proc is absent the umask is read by setting it and setting it back."""
    real_open = open

    def no_proc(file, *args, **kwargs):
        if str(file).startswith("/proc/"):
            raise FileNotFoundError(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    assert process_umask() == umask
    monkeypatch.undo()
    assert os.umask(umask) == umask


def test_file_mode_is_the_umask_applied(umask):
    assert file_mode() == 0o666 & ~umask
    assert file_mode(folder=True) == 0o777 & ~umask


def test_a_new_file_gets_the_mode_open_gives(tmp_path, umask):
    ordinary = tmp_path / "ordinary.txt"
    ordinary.write_text("x")  # what any other program's file gets
    target = write_file(tmp_path / "a.txt", lambda tmp: tmp.write_text("hello"))
    assert target == tmp_path / "a.txt" and target.read_text() == "hello"
    assert _mode(target) == _mode(ordinary) == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "ordinary.txt"]


def test_a_replaced_file_keeps_its_mode(tmp_path, umask):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    target.chmod(0o600)  # made private by its owner
    write_file(target, lambda tmp: tmp.write_bytes(b"new"))
    assert target.read_bytes() == b"new"
    assert _mode(target) == 0o600
    target.chmod(0o664)
    write_file(str(target), lambda tmp: tmp.write_bytes(b"newer"))  # a str path too
    assert _mode(target) == 0o664


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, error):
    target = tmp_path / "a.txt"
    target.write_text("old")

    def half(tmp: Path) -> None:
        tmp.write_text("half a fi")
        raise error

    with pytest.raises(type(error)):
        write_file(target, half)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_rename_removes_the_temporary_file(tmp_path, monkeypatch):
    def refused(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PermissionError):
        write_file(tmp_path / "a.txt", lambda tmp: tmp.write_text("x"))
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_raises_and_makes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_file(tmp_path / "nope" / "a.txt", lambda tmp: tmp.write_text("x"))
    assert list(tmp_path.iterdir()) == []


def test_temp_files_are_the_hidden_leftovers_of_one_target(tmp_path):
    target = tmp_path / "m.safetensors"
    seen: list[Path] = []
    write_file(target, lambda tmp: seen.append(tmp) or tmp.write_text("x"))
    (tmp,) = seen
    assert tmp.parent == tmp_path
    assert tmp.name.startswith(".m.safetensors.") and tmp.name.endswith(".tmp")
    assert temp_files(target) == []
    left = [tmp_path / ".m.safetensors.abc.tmp", tmp_path / ".m.safetensors.old"]
    for path in left:
        path.write_text("half")
    for other in (".n.safetensors.abc.tmp", ".m.safetensorsX.tmp", "m.safetensors.abc.tmp"):
        (tmp_path / other).write_text("not a leftover of m.safetensors")
    assert temp_files(target) == sorted(left)


def test_a_hidden_target_gets_no_second_dot(tmp_path):
    target = tmp_path / ".r.resume.safetensors"
    seen: list[Path] = []
    write_file(target, lambda tmp: seen.append(tmp) or tmp.write_text("x"))
    assert seen[0].name.startswith(".r.resume.safetensors.")
    (tmp_path / ".r.resume.safetensors.a1b2").write_text("half")
    assert [p.name for p in temp_files(target)] == [".r.resume.safetensors.a1b2"]


def test_temp_files_with_glob_characters_in_the_name(tmp_path):
    target = tmp_path / "run[1]*.json"
    (tmp_path / ".run[1]*.json.x.tmp").write_text("half")
    (tmp_path / ".run1.json.x.tmp").write_text("another file's")
    assert [p.name for p in temp_files(target)] == [".run[1]*.json.x.tmp"]


def test_make_temp_folder_has_a_new_folders_mode(tmp_path, umask):
    ordinary = tmp_path / "ordinary"
    ordinary.mkdir()
    made = make_temp_folder(".run.tmp-", tmp_path)
    assert made.parent == tmp_path and made.name.startswith(".run.tmp-") and made.is_dir()
    assert _mode(made) == _mode(ordinary) == 0o777 & ~umask
    assert make_temp_folder(".run.tmp-", tmp_path) != made  # a unique name each time


def test_write_text_writes_utf8_atomically(tmp_path, umask):
    target = tmp_path / "a.txt"
    assert write_text(target, "Grüße ||| 世界\n") == target
    assert target.read_bytes() == "Grüße ||| 世界\n".encode()
    assert _mode(target) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_folder_at_the_target_fails_before_anything_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    calls = []
    with pytest.raises(IsADirectoryError, match="is a folder, not a file") as caught:
        write_file(tmp_path / "out", calls.append)
    assert calls == [] and "\n" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert list((tmp_path / "out").iterdir()) == []
