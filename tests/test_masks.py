"""Tests for attnlab.masks: the one mask convention (bool, True = may attend, broadcastable
to [B, n_q, n_k]) and its converters. Expected masks are written out by hand or built with
plain Python loops."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab
from attnlab import masks
from attnlab.masks import AmbiguousMaskWarning
from attnlab.query.multi_head import MultiHeadAttention

# ----------------------------------------------------------------------------- index_mask


def test_index_mask_is_one_hot_and_false_outside_the_range():
    idx = torch.tensor([[0, 3], [2, -1]])
    want = torch.nn.functional.one_hot(idx.clamp(min=0), 4).bool() & (idx >= 0)[..., None]
    assert torch.equal(masks.index_mask(idx, 4), want)
    assert not masks.index_mask(torch.tensor([4, -1, 7]), 4).any()  # outside [0, 4)
    assert masks.index_mask(torch.zeros(0, dtype=torch.long), 3).shape == (0, 3)


def test_index_mask_runs_under_vmap():
    """F.one_hot checks the indices' range on the host, which vmap cannot do."""
    idx = torch.tensor([[1, 0], [2, 2]])
    torch.testing.assert_close(
        torch.func.vmap(lambda i: masks.index_mask(i, 3))(idx), masks.index_mask(idx, 3)
    )


# ----------------------------------------------------------------------------- from_lengths


def test_from_lengths_hand_computed():
    got = masks.from_lengths(torch.tensor([3, 1, 0]))
    want = torch.tensor([[[True, True, True]], [[True, False, False]], [[False, False, False]]])
    assert got.dtype == torch.bool
    assert got.shape == (3, 1, 3)
    assert torch.equal(got, want)


def test_from_lengths_max_len_and_list_input():
    got = masks.from_lengths([2, 4], max_len=5)
    want = [[[l < n for l in range(5)]] for n in (2, 4)]
    assert torch.equal(got, torch.tensor(want))


def test_from_lengths_empty_batch():
    got = masks.from_lengths(torch.zeros(0, dtype=torch.long))
    assert got.shape == (0, 1, 0)


@pytest.mark.parametrize(
    ("lengths", "kwargs", "error", "text"),
    [
        (torch.tensor([[1, 2]]), {}, ValueError, "expected [B]"),
        (torch.tensor([1.0, 2.0]), {}, TypeError, "integer dtype"),
        (torch.tensor([True, False]), {}, TypeError, "integer dtype"),
        (torch.tensor([2, -1]), {}, ValueError, "non-negative"),
        (torch.tensor([2, 5]), {"max_len": 3}, ValueError, "max_len=3"),
        (torch.tensor([2, 1]), {"max_len": -1}, ValueError, "max_len"),
    ],
)
def test_from_lengths_errors(lengths, kwargs, error, text):
    with pytest.raises(error, match=re.escape(text)):
        masks.from_lengths(lengths, **kwargs)


def test_from_lengths_with_max_len_is_traced_by_compile_and_export():
    """Inside a model's forward, ``from_lengths(lengths, tokens.shape[1])`` reads no value
    on the host: ``torch.compile(fullgraph=True, dynamic=True)`` and ``torch.export``
    with dynamic sizes trace it, and the graphs give the eager masks at other sizes."""
    from torch.export import Dim

    class Masked(torch.nn.Module):
        def forward(self, x, lengths):
            return masks.from_lengths(lengths, x.shape[1])

    def by_hand(lengths, n):
        return torch.tensor([[[l < k for l in range(n)]] for k in lengths])

    x, lengths = torch.randn(3, 5), torch.tensor([5, 2, 0])
    dynamic = ({0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO})
    exported = torch.export.export(Masked(), (x, lengths), dynamic_shapes=dynamic).module()
    compiled = torch.compile(Masked(), fullgraph=True, dynamic=True, backend="eager")
    for n, real in ((5, [5, 2, 0]), (7, [7, 3])):
        x, lengths = torch.randn(len(real), n), torch.tensor(real)
        assert torch.equal(exported(x, lengths), by_hand(real, n))
        assert torch.equal(compiled(x, lengths), by_hand(real, n))


# ------------------------------------------------------------------- from_key_padding_mask


def test_from_key_padding_mask_bool_inverts_and_adds_query_axis():
    kpm = torch.tensor([[False, False, True], [True, False, False]])  # True = ignore
    got = masks.from_key_padding_mask(kpm)
    assert got.shape == (2, 1, 3)
    assert torch.equal(got[:, 0], torch.tensor([[True, True, False], [False, True, True]]))


@pytest.mark.parametrize("drop", [float("-inf"), -1e9, torch.finfo(torch.float32).min])
def test_from_key_padding_mask_float(drop):
    kpm = torch.tensor([[0.0, drop, 0.0], [drop, drop, 0.0]])
    got = masks.from_key_padding_mask(kpm)
    assert torch.equal(got[:, 0], torch.tensor([[True, False, True], [False, False, True]]))


def test_from_key_padding_mask_float_with_bias_is_rejected():
    with pytest.raises(ValueError, match=r"finite non-zero biases"):
        masks.from_key_padding_mask(torch.tensor([[0.0, 0.5, float("-inf")]]))


def test_from_key_padding_mask_errors():
    with pytest.raises(
        ValueError, match=r"key_padding_mask has shape \(2, 1, 3\), expected \[B, n_k\]"
    ):
        masks.from_key_padding_mask(torch.zeros(2, 1, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"key_padding_mask has dtype torch.int64"):
        masks.from_key_padding_mask(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"must be a torch.Tensor"):
        masks.from_key_padding_mask([[True, False]])


# ---------------------------------------------------------------------------- from_additive


def test_from_additive_strict_zero_and_minus_inf():
    m = torch.tensor([[0.0, float("-inf")], [float("-inf"), 0.0]])
    assert torch.equal(masks.from_additive(m), torch.tensor([[True, False], [False, True]]))


def test_from_additive_threshold_is_inclusive():
    m = torch.tensor([0.0, -1e4, -1e4 + 1.0, -2e4])
    # -1e4 + 1 is above the default threshold and non-zero: strict mode rejects it
    with pytest.raises(ValueError, match=r"strict=False"):
        masks.from_additive(m)
    got = masks.from_additive(m, strict=False)
    assert got.tolist() == [True, False, True, False]
    # a higher threshold turns it into a drop, and then strict mode accepts the mask
    assert masks.from_additive(m, threshold=-100.0).tolist() == [True, False, False, False]


def test_from_additive_non_strict_keeps_only_the_drop_pattern():
    m = torch.tensor([[0.3, -0.7, float("-inf")]])  # ALiBi-like biases plus a drop
    with pytest.raises(ValueError, match=r"biases"):
        masks.from_additive(m)
    assert masks.from_additive(m, strict=False).tolist() == [[True, True, False]]


def test_from_additive_nan_and_dtype_errors():
    with pytest.raises(ValueError, match=r"NaN"):
        masks.from_additive(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match=r"NaN"):
        masks.from_additive(torch.tensor([0.0, float("nan")]), strict=False)
    with pytest.raises(TypeError, match=r"expected a float"):
        masks.from_additive(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"must be a torch.Tensor"):
        masks.from_additive([0.0, -math.inf])


# ----------------------------------------------------------------------------------- causal


@pytest.mark.parametrize(("n_q", "n_k"), [(1, 1), (3, 3), (2, 5), (5, 3), (4, 1)])
def test_causal_matches_the_loop_definition(n_q, n_k):
    got = masks.causal(n_q, n_k)
    # the queries are the last n_q positions of the key sequence
    want = [[l <= i + (n_k - n_q) for l in range(n_k)] for i in range(n_q)]
    assert got.dtype == torch.bool
    assert got.shape == (n_q, n_k)
    assert got.tolist() == want


def test_causal_square_default_and_hand_values():
    assert masks.causal(3).tolist() == [
        [True, False, False],
        [True, True, False],
        [True, True, True],
    ]
    # n_q > n_k: the first queries have no key at all (fully masked rows)
    assert masks.causal(3, 2).tolist() == [[False, False], [True, False], [True, True]]


def test_causal_device_and_errors():
    assert masks.causal(2, 3, device=torch.device("cpu")).device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"n_k must be a non-negative int"):
        masks.causal(2, -1)
    with pytest.raises(ValueError, match=r"n_q must be a non-negative int"):
        masks.causal(2.5)
    # a length read from a NumPy array is an int too (it was refused as not an int)
    assert masks.from_lengths(torch.tensor([1, 2]), np.int64(3)).shape == (2, 1, 3)
    assert masks.causal(np.int64(2), np.int32(3)).tolist() == masks.causal(2, 3).tolist()


# ---------------------------------------------------------------------------------- combine


def test_combine_is_a_broadcasting_and_that_skips_none():
    pad = torch.tensor([[[True, True, False]], [[True, False, False]]])  # [2, 1, 3]
    cau = masks.causal(2, 3)  # [2, 3]
    got = masks.combine(None, pad, None, cau)
    want = [
        [[pad[b, 0, l].item() and cau[i, l].item() for l in range(3)] for i in range(2)]
        for b in range(2)
    ]
    assert got.shape == (2, 2, 3)
    assert got.tolist() == want
    assert masks.combine() is None
    assert masks.combine(None, None) is None
    assert masks.combine(pad) is pad


def test_combine_rejects_non_bool():
    with pytest.raises(TypeError, match=r"masks\[1\] is torch.float32"):
        masks.combine(torch.ones(2, dtype=torch.bool), torch.ones(2))


def test_combine_names_masks_that_do_not_broadcast():
    """It was PyTorch's 'The size of tensor a (3) must match the size of tensor b (4)'."""
    a, b = torch.ones(2, 3, dtype=torch.bool), torch.ones(4, dtype=torch.bool)
    with pytest.raises(
        ValueError,
        match=r"^masks\[2\] of shape \(4,\) does not broadcast with the masks before it "
        r"\(combined shape \(2, 3\)\)$",
    ):
        masks.combine(a, None, b)
    # [2, 1, 3] and [1, 4, 1] broadcast together (each way)
    got = masks.combine(
        torch.ones(2, 1, 3, dtype=torch.bool), torch.ones(1, 4, 1, dtype=torch.bool)
    )
    assert got.shape == (2, 4, 3)


def test_fill_value_is_the_finite_minimum():
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        v = masks.fill_value(dtype)
        assert v == torch.finfo(dtype).min
        assert math.isfinite(v)


# --------------------------------------------------------------------------- normalize_mask


def test_normalize_mask_none():
    assert masks.normalize_mask(None, 2, 3, 4) is None


def test_normalize_mask_2d_is_queries_by_keys():
    m = masks.causal(3, 4)
    got = masks.normalize_mask(m, 2, 3, 4)
    assert got.shape == (1, 3, 4)
    assert torch.equal(got[0], m)
    assert got.data_ptr() == m.data_ptr()  # a view, no copy


def test_normalize_mask_1d_is_keys():
    m = torch.tensor([True, False, True, True])
    got = masks.normalize_mask(m, 2, 3, 4)
    assert got.shape == (1, 1, 4)
    assert torch.equal(got[0, 0], m)


def test_normalize_mask_3d_key_padding_kept():
    m = masks.from_lengths(torch.tensor([4, 2]))
    got = masks.normalize_mask(m, 2, 3, 4)
    assert got is m


def test_normalize_mask_single_query_reads_2d_as_batch_by_keys():
    m = torch.tensor([[True, False, True], [False, True, True]])  # [B=2, n_k=3]
    got = masks.normalize_mask(m, 2, 1, 3, single_query=True)
    assert got.shape == (2, 1, 3)
    assert torch.equal(got[:, 0], m)
    # without single_query the same tensor is [n_q, n_k] and n_q = 1 does not fit
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\)"):
        masks.normalize_mask(m, 2, 1, 3)


def test_normalize_mask_single_query_broadcast_batch():
    m = torch.tensor([[True, False, True]])  # [1, n_k]
    got = masks.normalize_mask(m, 4, 1, 3, single_query=True)
    assert got.shape == (1, 1, 3)


def test_normalize_mask_shape_errors_name_argument_and_shapes():
    m = torch.ones(3, 1, 4, dtype=torch.bool)
    with pytest.raises(ValueError) as err:
        masks.normalize_mask(m, 2, 5, 4, name="attn_mask")
    msg = str(err.value)
    assert "attn_mask" in msg
    assert "(3, 1, 4)" in msg
    assert "[2, 5, 4]" in msg
    with pytest.raises(ValueError, match=r"mask has shape \(1, 1, 1, 4\).*\[2, 5, 4\]"):
        masks.normalize_mask(torch.ones(1, 1, 1, 4, dtype=torch.bool), 2, 5, 4)
    with pytest.raises(ValueError, match=r"\(2, 3\).*from_lengths"):
        masks.normalize_mask(torch.ones(2, 3, dtype=torch.bool), 2, 5, 4)


def test_normalize_mask_float_mask_type_error_with_hint():
    with pytest.raises(TypeError) as err:
        masks.normalize_mask(torch.zeros(2, 1, 4), 2, 3, 4, name="mask")
    msg = str(err.value)
    assert "mask has dtype torch.float32, expected torch.bool" in msg
    assert "from_additive" in msg
    assert "from_key_padding_mask" in msg


def test_normalize_mask_other_type_errors():
    with pytest.raises(TypeError, match=r"expected torch.bool$"):
        masks.normalize_mask(torch.ones(2, 1, 4, dtype=torch.long), 2, 3, 4)
    with pytest.raises(TypeError, match=r"must be a torch.Tensor, got list"):
        masks.normalize_mask([[True]], 2, 3, 4)


def test_normalize_mask_device_mismatch():
    m = torch.ones(2, 1, 4, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=r"mask is on meta but the inputs are on cpu"):
        masks.normalize_mask(m, 2, 3, 4, device=torch.device("cpu"))


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3),
    n_q=st.integers(1, 4),
    n_k=st.integers(1, 4),
    keep=st.lists(st.booleans(), min_size=3, max_size=3),
    rank=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_normalize_mask_property_broadcasts_like_torch(B, n_q, n_k, keep, rank, seed):
    """Any mask whose trailing dims are 1 or full is accepted and means what PyTorch's
    broadcasting says it means."""
    full = (B, n_q, n_k)
    shape = tuple(s if k else 1 for s, k in zip(full, keep, strict=True))[3 - rank :]
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g) > 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = masks.normalize_mask(m, B, n_q, n_k)
    assert got.dim() == 3
    assert torch.equal(got.expand(full), m.expand(full))
    ambiguous = m.dim() == 2 and B == n_q == m.shape[0] > 1 and not (m == m[:1]).all()
    assert [w.category for w in caught] == ([AmbiguousMaskWarning] if ambiguous else [])


# ------------------------------------------------------------------ ambiguous 2-D masks

# rows differ: as [n_q, n_k] query 0 sees key 0, query 1 keys 0-1; as a key padding mask
# [B, n_k] example 0 would see key 0 and example 1 keys 0-1
AMBIGUOUS = torch.tensor([[True, False, False], [True, True, False]])


def test_ambiguous_mask_warning_is_a_user_warning_exported_from_masks():
    assert issubclass(AmbiguousMaskWarning, UserWarning)
    assert "AmbiguousMaskWarning" in masks.__all__


def test_2d_mask_with_batch_equal_to_queries_warns_and_is_read_as_queries_by_keys():
    with pytest.warns(AmbiguousMaskWarning) as caught:
        got = masks.normalize_mask(AMBIGUOUS, 2, 2, 3, name="attn_mask")
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "attn_mask of shape (2, 3)" in msg
    assert "[n_q, n_k]" in msg and "[B, n_k]" in msg
    assert "attn_mask[None]" in msg and "attn_mask[:, None, :]" in msg
    assert "from_lengths" in msg and "from_key_padding_mask" in msg
    assert got.shape == (1, 2, 3)
    assert torch.equal(got[0], AMBIGUOUS)  # still PyTorch's reading: [n_q, n_k]


def test_2d_mask_of_one_key_column_with_batch_equal_to_queries_warns():
    with pytest.warns(AmbiguousMaskWarning):
        masks.normalize_mask(torch.tensor([[True], [False]]), 2, 2, 3)


@pytest.mark.parametrize(
    ("mask", "B", "n_q", "single_query"),
    [
        (AMBIGUOUS[None], 2, 2, False),  # [1, n_q, n_k]: shared by the batch
        (AMBIGUOUS[:, None, :], 2, 2, False),  # [B, 1, n_k]: a key mask
        (AMBIGUOUS, 3, 2, False),  # B != n_q: only [n_q, n_k] fits
        (AMBIGUOUS[:1], 2, 2, False),  # [1, n_k]: both readings agree
        (torch.ones(2, 3, dtype=torch.bool), 2, 2, False),  # equal rows: both readings agree
        (masks.causal(1, 3), 1, 1, False),  # B = n_q = 1
        (AMBIGUOUS, 2, 1, True),  # a single query reads [B, n_k] as a key mask
    ],
)
def test_unambiguous_masks_do_not_warn(mask, B, n_q, single_query):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        masks.normalize_mask(mask, B, n_q, 3, single_query=single_query)
        masks.normalize_head_mask(mask if not single_query else None, B, 2, n_q, 3)


def test_ambiguous_mask_warning_points_at_the_callers_line():
    attn = attnlab.Attention(score="dot", d_q=4, d_k=4)
    q, k = torch.randn(2, 2, 4), torch.randn(2, 3, 4)
    with pytest.warns(AmbiguousMaskWarning) as caught:
        attn(q, k, mask=AMBIGUOUS)
    assert caught[0].filename == __file__
    with pytest.warns(AmbiguousMaskWarning) as caught:
        MultiHeadAttention(4, 2)(q, k, mask=AMBIGUOUS)
    assert caught[0].filename == __file__


def test_the_fixes_named_by_the_warning_mean_what_they_say():
    attn = attnlab.Attention(score="dot", d_q=4, d_k=4)
    q, k = torch.randn(2, 2, 4), torch.randn(2, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shared = attn(q, k, mask=AMBIGUOUS[None], need_weights=True).weights
        keys = attn(q, k, mask=AMBIGUOUS[:, None, :], need_weights=True).weights
    # [1, n_q, n_k]: query i of every example sees the keys of row i
    assert torch.equal(shared > 0, AMBIGUOUS[None].expand(2, 2, 3))
    # [B, 1, n_k]: every query of example b sees the keys of row b
    assert torch.equal(keys > 0, AMBIGUOUS[:, None, :].expand(2, 2, 3))
