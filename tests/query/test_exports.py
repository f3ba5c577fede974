"""Every mechanism is importable as ``attnlab.<Name>`` and from its section package, the
section packages' ``__all__`` are complete, and the renamed names still work for one
release with a ``DeprecationWarning``."""

import importlib
import pkgutil
import warnings

import pytest

import attnlab
from attnlab import registry

SECTION = {
    "attention": "attnlab.general",
    "score": "attnlab.general",
    "align": "attnlab.general",
    "dim": "attnlab.general",
    "feature": "attnlab.feature",
    "query": "attnlab.query",
}


def _entries():
    return [e for kind in SECTION for e in registry.entries(kind)]


@pytest.mark.parametrize("entry", _entries(), ids=lambda e: f"{e.kind}/{e.name}")
def test_every_registered_mechanism_is_exported(entry):
    name = entry.cls.__name__
    section = importlib.import_module(SECTION[entry.kind])
    assert getattr(attnlab, name, None) is entry.cls, f"attnlab.{name}"
    assert getattr(section, name, None) is entry.cls, f"{section.__name__}.{name}"
    assert name in attnlab.__all__
    assert name in section.__all__


@pytest.mark.parametrize("package", ["attnlab.feature", "attnlab.query"])
def test_section_all_lists_every_public_name_of_its_modules(package):
    """(Module constants such as ``MODES`` stay in their module.)"""
    pkg = importlib.import_module(package)
    exported = set(pkg.__all__)
    for info in pkgutil.iter_modules(pkg.__path__, package + "."):
        if info.name.rsplit(".", 1)[1].startswith("_") or info.name.endswith(".efficient"):
            continue  # private modules; efficient.py holds the variants' shared helpers
        module = importlib.import_module(info.name)
        public = {n for n in getattr(module, "__all__", ()) if not n.isupper()}
        missing = public - exported
        assert not missing, f"{info.name}: {sorted(missing)} not in {package}.__all__"
    for name in pkg.__all__:
        assert hasattr(pkg, name), f"{package}.{name}"
        assert getattr(attnlab, name) is getattr(pkg, name)


def test_from_attnlab_query_import():
    from attnlab.query import MultiHeadAttention
    from attnlab.query.multi_head import MultiHeadAttention as Direct

    assert MultiHeadAttention is Direct is attnlab.MultiHeadAttention


@pytest.mark.parametrize(
    "where",
    ["attnlab", "attnlab.query", "attnlab.query.key_value"],
)
def test_renamed_multi_query_attention_is_a_deprecated_alias(where):
    module = importlib.import_module(where)
    with pytest.warns(DeprecationWarning, match="MultiQueryAttention is deprecated"):
        old = module.MultiQueryAttention
    assert old is attnlab.ConcatenatedKeyValueAttention
    with pytest.warns(DeprecationWarning, match="multi_query_attention is deprecated"):
        assert module.multi_query_attention is attnlab.concatenated_key_value_attention
    with pytest.raises(AttributeError):
        module.NoSuchAttention  # noqa: B018


def test_new_names_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attnlab.ConcatenatedKeyValueAttention(num_queries=2)
        attnlab.build({"name": "concatenated-key-value"})
        attnlab.build({"name": "multi-query"})  # the old registry name stays an alias
