"""Tests for attnlab.output.AttentionOutput."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab.output import AttentionOutput


def test_defaults():
    c = torch.zeros(2, 3)
    out = AttentionOutput(c)
    assert out.context is c
    assert out.weights is None
    assert out.log_prob is None
    assert out.path == "explicit"
    assert out.extras == {}
    # the extras dict is not shared between instances
    out.extras["x"] = 1
    assert AttentionOutput(c).extras == {}


def test_unpacking_gives_context_then_weights():
    c, w = torch.randn(2, 3, 4), torch.rand(2, 3, 5)
    out = AttentionOutput(c, w, log_prob=torch.zeros(2, 3), path="sdpa", extras={"a": 1})
    got_c, got_w = out
    assert got_c is c
    assert got_w is w
    assert list(out) == [c, w]


def test_indexing_reads_context_then_weights_as_a_torch_tuple():
    """``mha(x, x, x)[0]`` is how nn.MultiheadAttention's result is read; an
    AttentionOutput was not subscriptable."""
    c, w = torch.randn(2, 3, 4), torch.rand(2, 3, 5)
    out = AttentionOutput(c, w)
    assert out[0] is c and out[1] is w and out[-1] is w and out[-2] is c
    assert AttentionOutput(c)[1] is None
    for bad in (2, -3):
        with pytest.raises(IndexError):
            out[bad]
    for bad in ("context", 0.0, True, slice(0, 1)):
        with pytest.raises(TypeError, match=r"indexed as \(context, weights\) by 0 or 1"):
            out[bad]


def test_unpacking_without_weights():
    c = torch.randn(2, 4)
    got_c, got_w = AttentionOutput(c)
    assert got_c is c
    assert got_w is None


def test_attention_returns_unpackable_output():
    torch.manual_seed(0)
    attn = attnlab.Attention("scaled-dot", d_q=4, d_k=4)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    out = attn(q, k, need_weights=True)
    assert isinstance(out, AttentionOutput)
    c, a = attn(q, k, need_weights=True)
    assert torch.equal(c, out.context)
    assert torch.equal(a, out.weights)
    assert a.shape == (2, 3, 5)
