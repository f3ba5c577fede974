"""The parsed-data cache: memory, disk, keys, damage, switches."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from attnlab.data import _cache


def _counting(value):
    calls = []

    def build():
        calls.append(1)
        return value

    return build, calls


def test_second_call_does_not_rebuild(fresh_cache):
    build, calls = _counting([1, 2])
    a = _cache.cached("t", (1,), build, to_json=list, from_json=list)
    b = _cache.cached("t", (1,), build, to_json=list, from_json=list)
    assert a == b == [1, 2] and len(calls) == 1


def test_disk_cache_survives_a_new_process(fresh_cache):
    build, calls = _counting(["x", "y"])
    _cache.cached("t", (1,), build, to_json=list, from_json=tuple)
    files = list((fresh_cache / "parsed").glob("t-*.json.gz"))
    assert len(files) == 1
    with gzip.open(files[0], "rt", encoding="utf-8") as f:
        assert json.load(f) == ["x", "y"]
    _cache.clear_cache()  # as if in a new process
    out = _cache.cached("t", (1,), build, to_json=list, from_json=tuple)
    assert out == ("x", "y") and len(calls) == 1


def test_other_key_rebuilds(fresh_cache):
    build, calls = _counting([0])
    _cache.cached("t", ("v1", "file:10:123"), build, to_json=list, from_json=list)
    _cache.cached("t", ("v1", "file:10:456"), build, to_json=list, from_json=list)
    _cache.cached("u", ("v1", "file:10:123"), build, to_json=list, from_json=list)
    assert len(calls) == 3


def test_damaged_cache_file_is_rebuilt(fresh_cache):
    build, calls = _counting([5])
    _cache.cached("t", (), build, to_json=list, from_json=list)
    (file,) = (fresh_cache / "parsed").glob("*.json.gz")
    file.write_bytes(b"not gzip")
    _cache.clear_cache()
    assert _cache.cached("t", (), build, to_json=list, from_json=list) == [5]
    assert len(calls) == 2
    with gzip.open(file, "rt") as f:  # and replaced by a good one
        assert json.load(f) == [5]


def test_disk_off(fresh_cache, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", "off")
    assert _cache.cache_dir() is None
    build, calls = _counting([1])
    _cache.cached("t", (), build, to_json=list, from_json=list)
    _cache.clear_cache()
    _cache.cached("t", (), build, to_json=list, from_json=list)
    assert len(calls) == 2
    assert not fresh_cache.exists()


def test_disk_false_keeps_memory_only(fresh_cache):
    build, calls = _counting({"a": 1})
    _cache.cached("t", (), build, disk=False)
    _cache.cached("t", (), build, disk=False)
    assert len(calls) == 1
    assert not (fresh_cache / "parsed").exists()
    with pytest.raises(ValueError, match="to_json"):
        _cache.cached("t2", (), build)


def test_unwritable_cache_warns_and_still_returns(fresh_cache, monkeypatch):
    blocker = fresh_cache.parent / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ATTNLAB_CACHE", str(blocker))  # a file, so no folder can be made in it
    build, _ = _counting([3])
    with pytest.warns(RuntimeWarning, match="could not write its data cache"):
        assert _cache.cached("t", (), build, to_json=list, from_json=list) == [3]


def test_a_cache_file_gets_the_mode_of_a_new_file(fresh_cache):
    old = os.umask(0o002)
    try:
        _cache.cached("t", (), _counting([1])[0], to_json=list, from_json=list)
    finally:
        os.umask(old)
    (file,) = (fresh_cache / "parsed").iterdir()
    assert file.stat().st_mode & 0o777 == 0o664  # not mkstemp's 0600


def test_clear_disk(fresh_cache):
    build, calls = _counting([1])
    _cache.cached("t", (), build, to_json=list, from_json=list)
    _cache.clear_cache(disk=True)
    assert not list((fresh_cache / "parsed").glob("*"))
    _cache.cached("t", (), build, to_json=list, from_json=list)
    assert len(calls) == 2


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNLAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _cache.cache_dir() == tmp_path / "attnlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert _cache.cache_dir() == tmp_path / ".cache" / "attnlab"
