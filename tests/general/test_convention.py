"""The one ``forward`` of the call convention (``attnlab/general/_convention.py``): the
mechanism's keywords reach ``_attend``, an unknown keyword is a one-line ``TypeError``
naming the module, the deprecated names and positional masks are mapped with a
``DeprecationWarning``, and a module that takes no positional masks refuses them as
Python would."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from attnlab.general._convention import AttentionCall, ConventionAttention, TwoInputAttention


class _Echo(ConventionAttention):
    """Returns what ``_attend`` received."""

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        return self._renamed(call, extras, {"x": "query", "side_mask": "side"})

    def _attend(self, call: AttentionCall, *, side: Tensor | None = None) -> dict[str, Any]:
        return {"call": call, "side": side}


class _Declared(_Echo):
    keywords = ("a", "b")
    positional_masks = (("a", "b"), 4)

    def _attend(self, call: AttentionCall, **named: Tensor | None) -> dict[str, Any]:
        return {"call": call, **named}


class _Pair(TwoInputAttention):
    input_names = ("A", "B")

    def _attend(
        self, call: AttentionCall, *, mask1: Tensor | None = None, mask2: Tensor | None = None
    ) -> tuple[Tensor | None, Tensor | None]:
        return mask1, mask2


X = torch.randn(2, 3, 4)
M = torch.ones(2, 3, dtype=torch.bool)


def test_keywords_reach_attend_and_need_weights_takes_the_default():
    out = _Echo()(X, side=M)
    assert out["side"] is M and out["call"].query is X and out["call"].key is None
    assert out["call"].need_weights is False
    assert _Echo()(X, need_weights=True)["call"].need_weights is True


def test_unknown_keyword_is_a_one_line_type_error_naming_the_module():
    for module in (_Echo(), _Declared(), _Pair()):
        with pytest.raises(TypeError) as err:
            module(X, X, bogus=1)
        name = type(module).__name__
        assert str(err.value) == f"{name}.forward() got an unexpected keyword argument 'bogus'"


def test_declared_keywords_and_positional_masks():
    out = _Declared()(X, X, X, b=M)
    assert out["b"] is M and "a" not in out
    with pytest.warns(DeprecationWarning, match=r"a, b as the fourth and fifth positional"):
        out = _Declared()(X, X, X, M, M)
    assert out["a"] is M and out["b"] is M and out["call"].value is X


def test_no_positional_masks_without_the_class_attribute():
    with pytest.raises(TypeError, match=r"^_Echo.forward\(\) takes from 1 to 4 positional"):
        _Echo()(X, None, None, M)


def test_deprecated_names_map_onto_inputs_and_keywords():
    with pytest.warns(DeprecationWarning, match=r"x=, side_mask= are deprecated"):
        out = _Echo()(x=X, side_mask=M)
    assert out["call"].query is X and out["side"] is M
    with pytest.raises(TypeError, match=r"got both query= and its deprecated name x="):
        _Echo()(X, x=X)


def test_two_input_convention():
    pair = _Pair()
    assert pair(X, X, mask2=M) == (None, M)
    with pytest.warns(DeprecationWarning, match="mask1, mask2 as the third and fourth"):
        assert pair(X, X, None, M) == (None, M)
    with pytest.raises(TypeError, match=r"takes no value: .*give B as key"):
        pair(X, X, X)
    with pytest.raises(TypeError, match=r"takes no mask: give one mask per input"):
        pair(X, X, mask=M)
    with pytest.raises(TypeError, match=r"needs both inputs: query \(A\) and key \(B\)"):
        pair(X)
    with pytest.raises(TypeError, match="at most 2 masks"):
        pair(X, X, M, M, M)
