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


def test_output_is_a_pytree_node_that_keeps_path_and_extras():
    """Every tensor of the output is a leaf (``tree_map`` reaches it), the path is the
    node's context, and unflattening gives back an equal output of the same type."""
    from torch.utils import _pytree as pytree

    out = AttentionOutput(
        torch.ones(2, 3), torch.zeros(2, 4), path="sdpa", extras={"centers": torch.full((2,), 5.0)}
    )
    leaves, spec = pytree.tree_flatten(out)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    assert [id(x) for x in tensors] == [id(out.context), id(out.weights), id(out.extras["centers"])]
    doubled = pytree.tree_map(lambda x: None if x is None else x * 2, out)
    assert type(doubled) is AttentionOutput and doubled.path == "sdpa"
    assert torch.equal(doubled.extras["centers"], torch.full((2,), 10.0))
    assert torch.equal(doubled.context, torch.full((2, 3), 2.0)) and doubled.log_prob is None
    back = pytree.tree_unflatten(leaves, spec)
    assert back.path == "sdpa" and torch.equal(back.weights, out.weights)


def test_a_module_returning_it_exports():
    """``torch.export.export`` of a module that returns an AttentionOutput (or a subclass
    with fields of its own) gives a program returning the same type and values."""
    from attnlab import RotatoryAttention

    attn = attnlab.Attention("additive", d_q=4, d_k=4).eval()
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    program = torch.export.export(attn, (q, k), {"need_weights": True}, strict=False)
    got, want = program.module()(q, k, need_weights=True), attn(q, k, need_weights=True)
    assert type(got) is AttentionOutput and got.path == want.path == "lean-additive"
    torch.testing.assert_close(got.context, want.context)
    torch.testing.assert_close(got.weights, want.weights)
    rot = RotatoryAttention(4).eval()
    parts = (torch.randn(2, 3, 4), torch.randn(2, 2, 4), torch.randn(2, 4, 4))
    program = torch.export.export(rot, parts, strict=False)
    got, want = program.module()(*parts), rot(*parts)
    assert type(got) is type(want)
    torch.testing.assert_close(got.target_left, want.target_left)
