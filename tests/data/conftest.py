"""Fixtures of the data-layer tests.

The tests of tests/data parse into a private cache folder (never the user's
~/.cache/attnlab), one for the session, so each real file is parsed once. The folder where
set-up puts source archives (the VADER sdist) is looked up before that, under the
original environment, and kept.
"""

from __future__ import annotations

import importlib.util
import os

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
