"""Tests of attnlab._deprecation, the one home of the deprecation helpers: the warning
category and message (old name, new name, the release that removes it), the warning
attributed to the caller's line (not to attnlab or torch), the errors of a misused old
form, and the module ``__getattr__`` of deprecated aliases."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn

from attnlab import _deprecation
from attnlab._deprecation import (
    REMOVED_IN,
    deprecated_aliases,
    deprecated_attribute,
    positional_masks,
    renamed_init_arguments,
    renamed_keywords,
    warn_deprecated,
)

REMOVED = re.escape(f"(removed in attnlab {REMOVED_IN})")


def _one(record: pytest.WarningsRecorder) -> warnings.WarningMessage:
    assert len(record) == 1, [str(w.message) for w in record]
    w = record[0]
    assert w.category is DeprecationWarning
    assert w.filename == __file__, w.filename  # the caller's line, not attnlab's
    return w


def test_removed_in_is_the_next_minor_release():
    import attnlab

    major, minor, _ = (int(p) for p in attnlab.__version__.split("."))
    assert REMOVED_IN == f"{major}.{minor + 1}.0"


def test_warn_deprecated_names_the_release_and_points_at_the_caller():
    with pytest.warns(DeprecationWarning, match=r"^old is gone " + REMOVED + "$") as record:
        warn_deprecated("old is gone")
    w = _one(record)
    assert w.lineno == _line_of('warn_deprecated("old is gone")')


def _line_of(text: str) -> int:
    with open(__file__, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


# ----------------------------------------------------------------------------- renamed keywords


def test_renamed_keywords_quoted_style_warns_once_per_old_name():
    with pytest.warns(DeprecationWarning) as record:
        out = renamed_keywords(
            "Thing", {"keys": 1, "values": 2}, {"keys": "key", "values": "value"}, {"key": None}
        )
    assert out == {"key": 1, "value": 2}
    messages = [str(w.message) for w in record]
    assert messages == [
        f"Thing: the argument 'keys' is deprecated; use 'key' (removed in attnlab {REMOVED_IN})",
        f"Thing: the argument 'values' is deprecated; use 'value' (removed in attnlab {REMOVED_IN})",
    ]
    assert all(w.filename == __file__ for w in record)


def test_renamed_keywords_keyword_style_warns_once_per_call():
    renames = {"f1": "query", "f2": "key"}
    with pytest.warns(
        DeprecationWarning, match=r"^Co: f1=, f2= are deprecated; use query=, key= "
    ) as record:
        out = renamed_keywords("Co", {"f1": 1, "f2": 2}, renames, {"mask1": 3}, style="keyword")
    assert out == {"query": 1, "key": 2, "mask1": 3}
    _one(record)
    with pytest.warns(DeprecationWarning, match=r"f1= is deprecated; use query="):
        renamed_keywords("Co", {"f1": 1}, renames, {}, style="keyword")


def test_renamed_keywords_without_old_names_is_silent_and_copies():
    current = {"query": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = renamed_keywords("Co", {}, {"f1": "query"}, current, style="keyword")
        assert renamed_keywords("Kv", {}, {"keys": "key"}, current) == current
    assert out == current and out is not current


@pytest.mark.parametrize(
    ("style", "called", "both"),
    [
        ("quoted", ".forward()", "Kv.forward() got both 'keys' and its new name 'key'"),
        ("keyword", ".forward()", "Kv.forward() got both key= and its deprecated name keys="),
        ("quoted", "()", "Kv() got both 'keys' and its new name 'key'"),
    ],
)
def test_renamed_keywords_errors(style, called, both):
    renames = {"keys": "key"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning before the error
        with pytest.raises(TypeError, match=re.escape(both)):
            renamed_keywords("Kv", {"keys": 1}, renames, {"key": 2}, style=style, called=called)
        with pytest.raises(TypeError, match=r"^Kv.* got an unexpected keyword argument 'kees'$"):
            renamed_keywords("Kv", {"kees": 1}, renames, {}, style=style, called=called)


# ----------------------------------------------------------------------------- positional masks


def test_one_positional_mask():
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.warns(DeprecationWarning) as record:
        out = positional_masks("Han", (m,), ("mask",), {"query": 1}, position=2)
    assert out == {"query": 1, "mask": m}
    assert str(_one(record).message) == (
        "Han: passing masks positionally is deprecated (the mask as the second positional "
        f"argument); use mask= (removed in attnlab {REMOVED_IN})"
    )


def test_several_positional_masks_skip_none():
    m = torch.ones(2, 3, dtype=torch.bool)
    names = ("left_mask", "target_mask", "right_mask")
    with pytest.warns(
        DeprecationWarning,
        match=r"passing masks positionally is deprecated \(left_mask, target_mask, right_mask "
        r"as the fourth, fifth and sixth positional arguments\); use left_mask=, target_mask=, "
        r"right_mask=",
    ) as record:
        out = positional_masks("Rot", (None, m), names, {"left_mask": m}, position=4)
    _one(record)
    assert out == {"left_mask": m, "target_mask": m}


def test_positional_mask_errors():
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match=r"^Co.forward\(\) takes at most 2 masks, got 3 positional"):
        positional_masks("Co", (m, m, m), ("mask1", "mask2"), {}, position=3)
    with pytest.raises(TypeError, match=r"got mask2 both positionally and as mask2="):
        positional_masks("Co", (None, m), ("mask1", "mask2"), {"mask2": m}, position=3)


# ----------------------------------------------------------------------------- constructor, attribute


@renamed_init_arguments({"d_k": "d_features"}, attributes=True)
class _Renamed(nn.Module):
    def __init__(self, d_features: int | None = None, *, scale: float = 1.0) -> None:
        super().__init__()
        self.d_features, self.scale = d_features, scale


@renamed_init_arguments({"size": "d_features"})
class _RenamedArgumentOnly:
    def __init__(self, d_features: int = 1) -> None:
        self.d_features = d_features


def test_renamed_init_argument_without_attribute():
    with pytest.warns(DeprecationWarning, match="'size' is deprecated; use 'd_features'"):
        obj = _RenamedArgumentOnly(size=2)
    assert obj.d_features == 2 and not hasattr(obj, "size")


def test_renamed_init_argument_and_attribute():
    with pytest.warns(
        DeprecationWarning, match=r"^_Renamed: the argument 'd_k' is deprecated; use 'd_features'"
    ) as record:
        m = _Renamed(d_k=4, scale=2.0)
    _one(record)
    assert (m.d_features, m.scale) == (4, 2.0)
    with pytest.warns(
        DeprecationWarning, match=r"^_Renamed\.d_k is deprecated; use \.d_features"
    ) as record:
        assert m.d_k == 4
    _one(record)
    assert isinstance(_Renamed.d_k, deprecated_attribute)  # on the class: the descriptor
    params = _Renamed.__init__.__signature__.parameters  # the old name stays accepted
    assert params["d_k"].kind is params["d_k"].KEYWORD_ONLY and params["d_k"].default is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _Renamed(d_k=None, d_features=3).d_features == 3  # None: not given
        assert _Renamed(3).d_features == 3
    with pytest.raises(TypeError, match=r"^_Renamed got both 'd_k' and its new name 'd_features'$"):
        _Renamed(d_k=4, d_features=4)


def test_warning_through_module_call_points_at_the_caller_line():
    from attnlab.query import KeyValueAttention

    q = torch.randn(2, 3, 4)
    with pytest.warns(DeprecationWarning, match="'keys' is deprecated") as record:
        KeyValueAttention()(q, keys=q)  # through torch's Module.__call__ and attnlab's bases
    assert _one(record).lineno == _line_of("KeyValueAttention()(q, keys=q)")


# ----------------------------------------------------------------------------- module aliases


def test_deprecated_aliases_module_getattr():
    def new_thing() -> int:
        return 1

    getattr_ = deprecated_aliases("pkg.mod", {"old_thing": lambda: new_thing})
    with pytest.warns(
        DeprecationWarning, match=r"^pkg\.mod\.old_thing is deprecated; use new_thing "
    ) as record:
        assert getattr_("old_thing") is new_thing
    _one(record)
    with pytest.raises(AttributeError, match=r"^module 'pkg\.mod' has no attribute 'nothing'$"):
        getattr_("nothing")


@pytest.mark.parametrize("where", ["attnlab", "attnlab.query", "attnlab.query.key_value"])
def test_package_aliases_use_the_shared_getattr(where):
    import importlib

    module = importlib.import_module(where)
    assert module.__getattr__.__module__ == _deprecation.__name__
    with pytest.warns(
        DeprecationWarning, match=rf"^{re.escape(where)}\.MultiQueryAttention is deprecated"
    ) as record:
        module.MultiQueryAttention  # noqa: B018
    _one(record)
    with pytest.raises(AttributeError, match=rf"module {where!r} has no attribute 'Nope'"):
        module.Nope  # noqa: B018
