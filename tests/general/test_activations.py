"""Tests of attnlab.general.activations: the named activations of the scores and what a
bad ``act`` says."""

from __future__ import annotations

import pytest
import torch

from attnlab.feature.co_attention import MultiGrainedCoAttention, ParallelCoAttention
from attnlab.general.activations import ACTIVATIONS, activation_name, get_activation
from attnlab.query.self_attention import LearnedQuerySelfAttention


def test_a_name_gives_its_function_and_a_callable_is_itself():
    x = torch.linspace(-2, 2, 9)
    assert torch.equal(get_activation("tanh")(x), torch.tanh(x))
    assert torch.equal(get_activation("identity")(x), x)

    def mine(t):
        return t * 2

    assert get_activation(mine) is mine
    assert activation_name("relu") == "relu" and activation_name(ACTIVATIONS["gelu"]) == "gelu"
    assert activation_name(mine) is None


@pytest.mark.parametrize("act", [5, None, 1.5, ["tanh"]])
def test_something_that_is_neither_a_name_nor_callable_is_a_type_error(act):
    with pytest.raises(TypeError, match=r"^act must be an activation name or a callable, got "):
        get_activation(act)


def test_an_unknown_name_is_a_value_error_that_lists_the_names():
    with pytest.raises(ValueError, match=r"^act='tanhh' is not a known activation; .*'tanh'"):
        get_activation("tanhh")


def test_the_error_names_the_argument_the_user_gave():
    """The co-attention's ``affinity_act`` and the self-attention's ``key_act`` were
    reported as ``act=...``."""
    with pytest.raises(ValueError, match=r"^affinity_act='bogus' is not a known activation"):
        ParallelCoAttention(4, 4, affinity_act="bogus")
    with pytest.raises(TypeError, match=r"^affinity_act must be an activation name"):
        MultiGrainedCoAttention(4, 4, affinity_act=5)
    with pytest.raises(ValueError, match=r"^key_act='bogus' is not a known activation"):
        LearnedQuerySelfAttention(4, key_dim=3, key_act="bogus")
