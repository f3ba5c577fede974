"""Fixtures of the data-layer tests.

The tests of tests/data parse into a private cache folder (never the user's
~/.cache/attnlab), one for the session, so each real file is parsed once. The folder where
set-up puts source archives (the VADER sdist) is looked up before that, under the
original environment, and kept.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from types import ModuleType

import pytest

from attnlab.data import _cache
from attnlab.data.vader import sources_dir


@pytest.fixture(scope="session")
def private_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("attnlab-cache")


@pytest.fixture(scope="module", autouse=True)
def private_cache(private_cache_dir):
    """Each test module of tests/data runs with ATTNLAB_CACHE in a private folder (one for
    the session); the environment is restored after the module."""
    saved = {k: os.environ.get(k) for k in ("ATTNLAB_CACHE", "ATTNLAB_SOURCES")}
    os.environ["ATTNLAB_SOURCES"] = str(sources_dir())
    os.environ["ATTNLAB_CACHE"] = str(private_cache_dir)
    yield private_cache_dir
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder and an empty in-process cache, for caching tests."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("ATTNLAB_CACHE", str(folder))
    saved = dict(_cache._MEMORY)
    _cache.clear_cache()
    yield folder
    _cache.clear_cache()
    _cache._MEMORY.update(saved)


@pytest.fixture
def hide_package(monkeypatch):
    """``hide_package("scattertext")`` makes the package look uninstalled."""

    real = importlib.util.find_spec

    def hide(*names: str) -> None:
        def fake(name, *args, **kwargs):
            if name.split(".")[0] in names:
                return None
            return real(name, *args, **kwargs)

        monkeypatch.setattr(importlib.util, "find_spec", fake)

    return hide


@pytest.fixture
def package_file_served(tmp_path, monkeypatch, fresh_cache):
    """``write = package_file_served(module, name)`` makes the loader module ``module`` find
    its packaged data file (``module.package_file``) at ``tmp_path / name``, in a fresh
    cache; ``write(data)`` puts the bytes ``data`` there and clears the in-process cache,
    so that the next load parses them."""

    def serve(module: ModuleType, name: str) -> Callable[[bytes], None]:
        path = tmp_path / name

        def write(data: bytes) -> None:
            path.write_bytes(data)
            _cache.clear_cache()

        monkeypatch.setattr(module, "package_file", lambda *a, **k: path)
        return write

    return serve
