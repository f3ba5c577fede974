"""The optional-dependency helper: a missing library names its install command."""

from __future__ import annotations

import pytest

from attnlab._optional import MissingDependencyError, install_command, require


def test_missing_module_names_the_install_command() -> None:
    with pytest.raises(MissingDependencyError, match="pip install attnlab_no_such_module"):
        require("attnlab_no_such_module")
    assert "attnlab[eval]" in install_command("jiwer")
    assert "wordnet-base" in install_command("wordnet")


def test_a_missing_dependency_of_an_installed_library_is_not_hidden(tmp_path, monkeypatch):
    # the library is there but imports something that is not: the real error propagates
    (tmp_path / "attnlab_fake_lib.py").write_text("import attnlab_fake_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as info:
        require("attnlab_fake_lib")
    assert not isinstance(info.value, MissingDependencyError)
    assert info.value.name == "attnlab_fake_dependency"


def test_installed_module_is_returned() -> None:
    assert require("math").sqrt(4.0) == 2.0
