"""Tests of attnlab.general.alignment: soft, local, hard, Gumbel, local-m, local-p,
reinforced alignment and the REINFORCE loss.

Every numerical check compares against a naive Python loop (``math.exp`` over index
lists) or hand-computed numbers, never against the function under test.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attnlab
from attnlab import ConfigError
from attnlab.general.alignment import (
    HardAlign,
    LocalMAlign,
    LocalPAlign,
    ReinforcedAlign,
    SoftAlign,
    gumbel_softmax_align,
    hard_align,
    local_align,
    local_window,
    masked_softmax,
    refuse_local_m,
    reinforce_loss,
    soft_align,
)

# ----------------------------------------------------------------------------- naive refs


def naive_softmax(values: list[float], allowed: list[bool]) -> list[float]:
    """Softmax over the allowed entries (zero elsewhere, all zero when none is allowed)."""
    idx = [i for i, ok in enumerate(allowed) if ok]
    out = [0.0] * len(values)
    if not idx:
        return out
    m = max(values[i] for i in idx)
    z = sum(math.exp(values[i] - m) for i in idx)
    for i in idx:
        out[i] = math.exp(values[i] - m) / z
    return out


def full_mask(mask: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    return torch.broadcast_to(mask, shape)


def naive_soft(e: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    m = full_mask(mask, tuple(e.shape))
    out = torch.zeros(e.shape, dtype=torch.float64)
    flat_e, flat_m, flat_o = (
        e.reshape(-1, e.shape[-1]),
        m.reshape(-1, e.shape[-1]),
        out.view(-1, e.shape[-1]),
    )
    for r in range(flat_e.shape[0]):
        row = naive_softmax(flat_e[r].tolist(), flat_m[r].tolist())
        flat_o[r] = torch.tensor(row, dtype=torch.float64)
    return out


def naive_local(
    e: torch.Tensor,
    center: torch.Tensor,
    D: int,
    mask: torch.Tensor | None,
    gaussian: bool,
) -> torch.Tensor:
    """The spec, literally: window = {l : |l - p| <= D, 0 <= l < n_k, mask allows l};
    softmax over the window; times exp(-(l - p)^2 / (2 sigma^2)), sigma = D / 2."""
    B, n_q, n_k = e.shape
    m = full_mask(mask, (B, n_q, n_k))
    out = torch.zeros(B, n_q, n_k, dtype=torch.float64)
    sigma = D / 2
    for b in range(B):
        for i in range(n_q):
            p = float(center[b, i])
            window = [l for l in range(n_k) if abs(l - p) <= D and bool(m[b, i, l])]
            if not window:
                continue
            mx = max(float(e[b, i, l]) for l in window)
            z = sum(math.exp(float(e[b, i, l]) - mx) for l in window)
            for l in window:
                a = math.exp(float(e[b, i, l]) - mx) / z
                if gaussian:
                    a *= math.exp(-((l - p) ** 2) / (2 * sigma**2))
                out[b, i, l] = a
    return out


def chi_square(counts: list[int], probs: list[float]) -> float:
    n = sum(counts)
    return sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, probs, strict=True) if p > 0)


# chi-square critical values at p = 0.001
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}


# ----------------------------------------------------------------------------- soft


def test_soft_align_hand_numbers():
    e = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]], dtype=torch.float64)
    torch.testing.assert_close(
        soft_align(e), torch.tensor([[1 / 6, 2 / 6, 3 / 6]], dtype=torch.float64)
    )
    mask = torch.tensor([[True, False, True]])
    torch.testing.assert_close(
        soft_align(e, mask), torch.tensor([[1 / 4, 0.0, 3 / 4]], dtype=torch.float64)
    )


@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "full", "two_d", "fully_masked_row"])
def test_soft_align_matches_naive_loop(mask_kind):
    g = torch.Generator().manual_seed(1)
    B, n_q, n_k = 3, 4, 6
    e = torch.randn(B, n_q, n_k, generator=g, dtype=torch.float64) * 3
    mask = {
        "none": None,
        "key_padding": attnlab.masks.from_lengths(torch.tensor([6, 3, 1])),
        "full": torch.rand(B, n_q, n_k, generator=g) > 0.4,
        "two_d": attnlab.masks.causal(n_q, n_k),
        "fully_masked_row": torch.rand(B, n_q, n_k, generator=g) > 0.4,
    }[mask_kind]
    if mask_kind == "fully_masked_row":
        mask[1, 2] = False
    a = soft_align(e, mask)
    torch.testing.assert_close(a, naive_soft(e, mask), rtol=0, atol=1e-12)


def test_masked_softmax_other_dim():
    g = torch.Generator().manual_seed(2)
    e = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 5, 3, generator=g) > 0.3
    a = masked_softmax(e, mask, dim=1)
    ref = naive_soft(e.transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
    torch.testing.assert_close(a, ref, rtol=0, atol=1e-12)


def test_soft_align_gradcheck_with_masked_rows():
    g = torch.Generator().manual_seed(3)
    e = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 3, 5, generator=g) > 0.3
    mask[0, 1] = False
    assert torch.autograd.gradcheck(lambda x: soft_align(x, mask), (e,))
    assert torch.autograd.gradgradcheck(lambda x: soft_align(x, mask), (e,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_soft_align_fully_masked_rows_are_zero_with_zero_grads(dtype):
    e = torch.randn(2, 3, 4).to(dtype).requires_grad_()
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, 0] = False
    mask[1, :, :] = False
    a = soft_align(e, mask)
    assert not torch.isnan(a).any()
    assert (a[0, 0] == 0).all() and (a[1] == 0).all()
    (a.float() * torch.randn(2, 3, 4)).sum().backward()
    assert torch.isfinite(e.grad.float()).all()
    assert (e.grad[0, 0] == 0).all() and (e.grad[1] == 0).all()
    assert (e.grad[0, 1:] != 0).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_soft_align_half_precision_close_to_float32(dtype):
    g = torch.Generator().manual_seed(4)
    e = torch.randn(2, 3, 9, generator=g) * 4
    mask = torch.rand(2, 3, 9, generator=g) > 0.3
    mask[1, 0] = False
    a_half = soft_align(e.to(dtype), mask)
    assert a_half.dtype == dtype
    torch.testing.assert_close(a_half.float(), soft_align(e, mask), rtol=0, atol=2e-2)
    assert (a_half[1, 0] == 0).all()


def test_soft_align_bad_masks():
    e = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match="mask"):
        soft_align(e, torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match="mask"):
        soft_align(e, torch.ones(2, 3, 5, dtype=torch.bool))
    # a mask that broadcasts *with* e but is larger than e is an error too
    with pytest.raises(ValueError, match="mask"):
        soft_align(torch.randn(3, 4), torch.ones(2, 3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="e"):
        soft_align(torch.ones(2, 3, 4, dtype=torch.long))


def test_soft_align_module():
    e = torch.randn(2, 3, 4, dtype=torch.float64)
    mask = torch.rand(2, 3, 4) > 0.3
    out = SoftAlign()(e, mask)
    torch.testing.assert_close(out.weights, naive_soft(e, mask), rtol=0, atol=1e-12)
    assert out.log_prob is None


# ----------------------------------------------------------------------------- local


def test_local_align_hand_numbers():
    e = torch.zeros(1, 1, 5, dtype=torch.float64)
    c = torch.tensor([[2.0]], dtype=torch.float64)
    third = 1 / 3
    torch.testing.assert_close(
        local_align(e, c, 1, gaussian=False),
        torch.tensor([[[0, third, third, third, 0]]], dtype=torch.float64),
    )
    # sigma = 1/2: exp(-1 / (2 * 1/4)) = exp(-2) at distance 1, no renormalisation
    g1 = math.exp(-2) / 3
    torch.testing.assert_close(
        local_align(e, c, 1), torch.tensor([[[0, g1, third, g1, 0]]], dtype=torch.float64)
    )
    # fractional centre 2.5 with D = 1: window {2, 3}; factor exp(-0.25 / 0.5)
    c = torch.tensor([[2.5]], dtype=torch.float64)
    h = 0.5 * math.exp(-0.5)
    torch.testing.assert_close(
        local_align(e, c, 1), torch.tensor([[[0, 0, h, h, 0]]], dtype=torch.float64)
    )


LOCAL_CENTERS = [-2.5, -1.5, -0.3, 0.0, 2.7, 4.0, 5.4, 6.0, 6.8, 9.5]


@pytest.mark.parametrize("D", [1, 2, 3])
@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "full", "two_d"])
def test_local_align_matches_naive_loop(D, gaussian, mask_kind):
    g = torch.Generator().manual_seed(10 * D + gaussian)
    B, n_k = 2, 7
    n_q = len(LOCAL_CENTERS)
    e = torch.randn(B, n_q, n_k, generator=g, dtype=torch.float64) * 2
    center = torch.tensor([LOCAL_CENTERS, [c + 0.45 for c in LOCAL_CENTERS]], dtype=torch.float64)
    mask = {
        "none": None,
        "key_padding": attnlab.masks.from_lengths(torch.tensor([7, 4])),
        "full": torch.rand(B, n_q, n_k, generator=g) > 0.4,
        "two_d": torch.rand(n_q, n_k, generator=g) > 0.3,
    }[mask_kind]
    a = local_align(e, center, D, mask, gaussian)
    torch.testing.assert_close(a, naive_local(e, center, D, mask, gaussian), rtol=0, atol=1e-12)


def test_local_align_single_query():
    g = torch.Generator().manual_seed(11)
    e = torch.randn(3, 6, generator=g, dtype=torch.float64)
    center = torch.tensor([0.5, 2.0, 7.1], dtype=torch.float64)
    mask = torch.tensor([[True] * 6, [True, False, True, False, True, True], [True] * 6])
    a = local_align(e, center, 2, mask)
    ref = naive_local(e[:, None], center[:, None], 2, mask[:, None], True)[:, 0]
    torch.testing.assert_close(a, ref, rtol=0, atol=1e-12)


def test_local_align_empty_windows_are_zero_with_finite_grads():
    e = torch.randn(1, 3, 6, dtype=torch.float64, requires_grad=True)
    center = torch.tensor([[-10.0, 20.0, 2.3]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 3, 6, dtype=torch.bool)
    mask[0, 2, 0:5] = False  # the window of the third query, {1, 2, 3, 4}, is fully masked
    a = local_align(e, center, 2, mask)
    assert (a == 0).all()
    (a * torch.randn(1, 3, 6, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(e.grad).all() and (e.grad == 0).all()
    assert torch.isfinite(center.grad).all() and (center.grad == 0).all()


def test_local_align_gradcheck_scores_and_centers():
    g = torch.Generator().manual_seed(12)
    e = torch.randn(2, 5, 6, generator=g, dtype=torch.float64, requires_grad=True)
    # fractional parts away from the window boundaries (integers for an integer D)
    center = torch.tensor(
        [[0.3, 2.6, 4.45, 6.8, -1.2], [5.3, 1.7, 3.5, 0.6, 7.4]],
        dtype=torch.float64,
        requires_grad=True,
    )
    mask = torch.rand(2, 5, 6, generator=g) > 0.25
    assert torch.autograd.gradcheck(lambda x, c: local_align(x, c, 2, mask), (e, center))
    assert torch.autograd.gradcheck(
        lambda x: local_align(x, center.detach(), 2, mask, gaussian=False), (e,)
    )


def test_local_align_gradient_reaches_center_only_through_gaussian():
    e = torch.randn(1, 2, 8, dtype=torch.float64)
    center = torch.tensor([[2.3, 5.6]], dtype=torch.float64, requires_grad=True)
    local_align(e, center, 2).sum().backward()
    assert (center.grad != 0).all()
    # d/dp sum_l a_l g_l with the window fixed: sum_l a_l g_l (l - p) / sigma^2
    ref = []
    for i, p in enumerate([2.3, 5.6]):
        window = [l for l in range(8) if abs(l - p) <= 2]
        soft = naive_softmax([float(e[0, i, l]) for l in window], [True] * len(window))
        ref.append(
            sum(
                s * math.exp(-((l - p) ** 2) / 2) * (l - p)
                for s, l in zip(soft, window, strict=True)
            )
        )
    torch.testing.assert_close(center.grad[0], torch.tensor(ref, dtype=torch.float64))


@pytest.mark.parametrize("D", [0, -1, 1.5, 2.0, True, "2", None])
def test_local_align_rejects_bad_window(D):
    with pytest.raises(ValueError, match="D"):
        local_align(torch.randn(1, 2, 5), torch.zeros(1, 2), D)


def test_refuse_local_m_refuses_local_m_only():
    """One helper refuses local-m wherever the queries are no key positions: local-p, soft
    and hard alignments pass, local-m raises one line naming the module, the reason and the
    alternative."""
    for align in (LocalPAlign(d_q=4), SoftAlign(), HardAlign()):
        refuse_local_m(align, "the state is no position", "the state", who="m: ")
    with pytest.raises(
        ConfigError,
        match=r"^m: align='local-m' .*but the state is no "
        r"position; use align='local-p', .* from the state$",
    ):
        refuse_local_m(LocalMAlign(), "the state is no position", "the state", who="m: ")


def test_local_align_bad_center():
    with pytest.raises(ValueError, match="center"):
        local_align(torch.randn(1, 2, 5), torch.zeros(1, 3), 2)
    with pytest.raises(TypeError, match="center"):
        local_align(torch.randn(1, 2, 5), torch.zeros(1, 2, dtype=torch.long), 2)


def test_local_align_bfloat16_keeps_the_centre_precise():
    # bf16 has spacing 1.0 between 128 and 256: a centre cast to bf16 would move 200.2
    # to 200 and shift the window to include 198
    g = torch.Generator().manual_seed(13)
    e = torch.randn(1, 1, 256, generator=g)
    center = torch.tensor([[200.2]])
    a32 = local_align(e, center, 2)
    a16 = local_align(e.bfloat16(), center, 2)
    assert a16.dtype == torch.bfloat16
    assert torch.equal(a16 != 0, a32 != 0)
    assert a16[0, 0, 198] == 0
    torch.testing.assert_close(a16.float(), a32, rtol=0, atol=1e-2)


@st.composite
def scores_and_mask(draw, max_b=3, max_q=3, max_k=7):
    B = draw(st.integers(1, max_b))
    n_q = draw(st.integers(1, max_q))
    n_k = draw(st.integers(1, max_k))
    n = B * n_q * n_k
    vals = draw(st.lists(st.floats(-30, 30, allow_nan=False), min_size=n, max_size=n))
    bits = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    e = torch.tensor(vals, dtype=torch.float64).reshape(B, n_q, n_k)
    mask = torch.tensor(bits).reshape(B, n_q, n_k)
    return e, mask


@settings(max_examples=60, deadline=None)
@given(scores_and_mask())
def test_property_soft_weights_sum_to_one_over_allowed_keys(data):
    e, mask = data
    a = soft_align(e, mask)
    assert (a[~mask] == 0).all()
    sums = a.sum(-1)
    has = mask.any(-1)
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))
    assert (sums[~has] == 0).all()
    assert (a >= 0).all()


@settings(max_examples=60, deadline=None)
@given(
    scores_and_mask(),
    st.integers(1, 3),
    st.lists(st.floats(-4, 10, allow_nan=False), min_size=9, max_size=9),
)
def test_property_local_weights_sum_to_one_over_the_window(data, D, centres):
    e, mask = data
    B, n_q, n_k = e.shape
    center = torch.tensor(centres[: B * n_q], dtype=torch.float64).reshape(B, n_q)
    a = local_align(e, center, D, mask, gaussian=False)
    pos = torch.arange(n_k, dtype=torch.float64)
    window = ((pos - center[..., None]).abs() <= D) & mask
    assert (a[~window] == 0).all()
    sums = a.sum(-1)
    has = window.any(-1)
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]))
    assert (sums[~has] == 0).all()
    # the Gaussian factor is in (0, 1]: it never raises a weight, never zeroes one
    a_g = local_align(e, center, D, mask, gaussian=True)
    assert (a_g <= a + 1e-15).all()
    assert torch.equal(a_g > 0, a > 0)


# ----------------------------------------------------------------------------- hard


def _check_one_hot_on_allowed(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row with an allowed key is one-hot on an allowed key; others are zero.
    Returns the chosen index per row (-1 for empty rows)."""
    w2 = w.reshape(-1, w.shape[-1])
    m2 = torch.broadcast_to(mask, w.shape).reshape(-1, w.shape[-1])
    chosen = []
    for r in range(w2.shape[0]):
        row = w2[r].tolist()
        if not bool(m2[r].any()):
            assert all(x == 0 for x in row)
            chosen.append(-1)
            continue
        ones = [j for j, x in enumerate(row) if x == 1]
        assert len(ones) == 1 and all(x in (0, 1) for x in row), row
        assert bool(m2[r, ones[0]])
        chosen.append(ones[0])
    return torch.tensor(chosen).reshape(w.shape[:-1])


@settings(max_examples=60, deadline=None)
@given(scores_and_mask(), st.booleans(), st.integers(0, 2**31 - 1))
def test_property_hard_weights_are_one_hot_on_allowed_keys(data, sample, seed):
    e, mask = data
    gen = torch.Generator().manual_seed(seed)
    w, log_prob, probs = hard_align(e, mask, sample=sample, generator=gen)
    chosen = _check_one_hot_on_allowed(w, mask)
    B, n_q, n_k = e.shape
    for b in range(B):
        for i in range(n_q):
            c = int(chosen[b, i])
            if c < 0:
                assert log_prob[b, i] == 0
                continue
            allowed = mask[b, i].tolist()
            ref = naive_softmax(e[b, i].tolist(), allowed)
            assert ref[c] > 0
            # log_prob = log softmax(e)[chosen], computed as e_c - logsumexp over allowed
            vals = [float(e[b, i, l]) for l in range(n_k) if allowed[l]]
            mx = max(vals)
            lse = mx + math.log(sum(math.exp(v - mx) for v in vals))
            assert math.isclose(float(log_prob[b, i]), float(e[b, i, c]) - lse, abs_tol=1e-9)
            if not sample:
                assert float(e[b, i, c]) == mx
    torch.testing.assert_close(probs, naive_soft(e, mask), rtol=0, atol=1e-12)


def test_hard_align_sampling_frequencies_match_softmax():
    e = torch.tensor([0.5, -1.0, 1.2, 3.0, -0.3, 0.1])
    mask = torch.tensor([True, True, True, False, True, True])
    N = 20000
    gen = torch.Generator().manual_seed(0)
    w, _, _ = hard_align(e.expand(N, 6), mask, generator=gen)
    counts = w.sum(0).round().long().tolist()
    assert counts[3] == 0 and sum(counts) == N
    probs = naive_softmax(e.tolist(), mask.tolist())
    assert chi_square(counts, probs) < CHI2_CRIT[4]
    # and the distribution is really non-uniform (a uniform sampler would fail)
    assert chi_square(counts, [0.2, 0.2, 0.2, 0.0, 0.2, 0.2]) > 100


def test_hard_align_is_reproducible_with_a_generator():
    e = torch.randn(4, 5, 8)
    w1, _, _ = hard_align(e, generator=torch.Generator().manual_seed(7))
    w2, _, _ = hard_align(e, generator=torch.Generator().manual_seed(7))
    assert torch.equal(w1, w2)


def test_hard_align_log_prob_gradient_is_onehot_minus_probs():
    e = torch.tensor([[0.3, -0.2, 1.0, 0.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True]])
    w, log_prob, _ = hard_align(e, mask, sample=False)
    assert not w.requires_grad
    log_prob.sum().backward()
    p = naive_softmax(e[0].tolist(), mask[0].tolist())
    c = 3  # the argmax among the allowed keys 0, 1, 3
    ref = [(1.0 if j == c else 0.0) - p[j] for j in range(4)]
    torch.testing.assert_close(e.grad[0], torch.tensor(ref, dtype=torch.float64))


def test_hard_align_fully_masked_rows_and_empty_key_set():
    e = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[1, 1] = False
    w, log_prob, probs = hard_align(e, mask)
    assert (w[1, 1] == 0).all() and log_prob[1, 1] == 0 and (probs[1, 1] == 0).all()
    log_prob.sum().backward()
    assert torch.isfinite(e.grad).all() and (e.grad[1, 1] == 0).all()
    # no keys at all: zero weights and log-probabilities, no error
    w0, lp0, _ = hard_align(torch.randn(2, 3, 0))
    assert w0.shape == (2, 3, 0) and lp0.shape == (2, 3) and (lp0 == 0).all()


def test_hard_align_argmax_resolves_close_float64_scores():
    # the float32 probabilities of these scores are equal; the argmax must still be key 1
    e = torch.tensor([[0.0, 1e-10, -5.0]], dtype=torch.float64)
    w, _, _ = hard_align(e, sample=False)
    assert w.tolist() == [[0.0, 1.0, 0.0]]
    w, _, _ = hard_align(e, torch.tensor([True, False, True]), sample=False)
    assert w.tolist() == [[1.0, 0.0, 0.0]]


def test_hard_align_bfloat16():
    e = torch.randn(3, 2, 5, generator=torch.Generator().manual_seed(6)).bfloat16()
    w, log_prob, _ = hard_align(e, sample=False)
    assert w.dtype == torch.bfloat16 and log_prob.dtype == torch.bfloat16
    assert torch.equal(w.float().argmax(-1), e.float().argmax(-1))
    assert (w.float().sum(-1) == 1).all()


def test_gumbel_hard_forward_is_exactly_one_hot_with_straight_through_grads():
    g = torch.Generator().manual_seed(5)
    e = torch.randn(3, 4, 6, generator=g, requires_grad=True)
    mask = torch.rand(3, 4, 6, generator=g) > 0.4
    mask[0, 0] = False
    mask[0, 1] = torch.tensor([False, False, True, False, False, False])
    w = gumbel_softmax_align(e, mask, tau=0.7, generator=torch.Generator().manual_seed(1))
    _check_one_hot_on_allowed(w, mask)
    c = torch.randn(3, 4, 6, generator=g)
    (w * c).sum().backward()
    grad = e.grad
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all()
    assert (grad[0, 0] == 0).all()
    # straight-through: the gradient is that of the soft sample drawn with the same noise
    e2 = e.detach().clone().requires_grad_()
    y = gumbel_softmax_align(
        e2, mask, tau=0.7, hard=False, generator=torch.Generator().manual_seed(1)
    )
    (y * c).sum().backward()
    torch.testing.assert_close(grad, e2.grad)
    # every row with two or more allowed keys gets a gradient
    several = mask.sum(-1) >= 2
    assert several.sum() >= 6
    assert (grad.abs().sum(-1)[several] > 0).all()
    # the hard sample is the argmax of the soft one
    has = mask.any(-1)
    assert torch.equal(w.argmax(-1)[has], y.argmax(-1)[has])


def test_gumbel_soft_sample_is_a_distribution_over_allowed_keys():
    e = torch.randn(4, 3, 5)
    mask = torch.rand(4, 3, 5) > 0.3
    mask[2, 2] = False
    y = gumbel_softmax_align(e, mask, tau=2.0, hard=False)
    assert (y[~mask] == 0).all()
    has = mask.any(-1)
    torch.testing.assert_close(y.sum(-1)[has], torch.ones(int(has.sum())))
    assert (y.sum(-1)[~has] == 0).all()


def test_gumbel_max_frequencies_match_softmax():
    # argmax(e + Gumbel noise) is distributed as softmax(e), whatever tau
    e = torch.tensor([0.2, 1.5, -0.7, 0.9, 0.0])
    mask = torch.tensor([True, True, True, True, False])
    N = 20000
    w = gumbel_softmax_align(
        e.expand(N, 5), mask, tau=0.5, generator=torch.Generator().manual_seed(3)
    )
    counts = w.sum(0).round().long().tolist()
    assert counts[4] == 0 and sum(counts) == N
    assert chi_square(counts, naive_softmax(e.tolist(), mask.tolist())) < CHI2_CRIT[3]


def test_gumbel_bad_tau():
    with pytest.raises(ValueError, match="tau"):
        gumbel_softmax_align(torch.randn(2, 3), tau=0.0)


def test_hard_align_module_training_samples_eval_argmax_or_sample():
    torch.manual_seed(0)
    e = torch.randn(64, 2, 8) * 0.3
    mask = torch.rand(64, 2, 8) > 0.2
    mask[0, 0] = False
    m = HardAlign()
    m.train()
    out1, out2 = m(e, mask), m(e, mask)
    _check_one_hot_on_allowed(out1.weights, mask)
    assert not torch.equal(out1.weights, out2.weights)  # sampled
    assert out1.log_prob.shape == (64, 2)
    torch.testing.assert_close(out1.extras["probs"], naive_soft(e, mask).float())
    m.eval()
    out3, out4 = m(e, mask), m(e, mask)
    assert torch.equal(out3.weights, out4.weights)
    masked_e = torch.where(mask, e, torch.tensor(-1e9))
    has = mask.any(-1)
    assert torch.equal(out3.weights.argmax(-1)[has], masked_e.argmax(-1)[has])
    assert (out3.weights[0, 0] == 0).all() and out3.log_prob[0, 0] == 0
    sampler = HardAlign(eval_mode="sample").eval()
    assert not torch.equal(sampler(e, mask).weights, sampler(e, mask).weights)


def test_hard_align_module_gumbel_estimator():
    torch.manual_seed(1)
    e = torch.randn(5, 3, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(5, 3, 6) > 0.3
    mask[1, 2] = False
    m = HardAlign(estimator="gumbel", tau=0.5).train()
    out = m(e, mask)
    chosen = _check_one_hot_on_allowed(out.weights, mask)
    for b in range(5):
        for i in range(3):
            c = int(chosen[b, i])
            if c < 0:
                assert out.log_prob[b, i] == 0
                continue
            p = naive_softmax(e[b, i].tolist(), mask[b, i].tolist())
            assert math.isclose(float(out.log_prob[b, i].detach()), math.log(p[c]), abs_tol=1e-9)
    (out.weights * torch.randn(5, 3, 6, dtype=torch.float64)).sum().backward()
    assert e.grad.abs().sum() > 0 and torch.isfinite(e.grad).all()
    # evaluation falls back to the deterministic argmax
    m.eval()
    w = m(e.detach(), mask).weights
    assert torch.equal(w, m(e.detach(), mask).weights)


def test_hard_align_module_rejects_bad_options():
    with pytest.raises(ConfigError, match="estimator"):
        HardAlign(estimator="bogus")
    with pytest.raises(ConfigError, match="eval_mode"):
        HardAlign(eval_mode="bogus")
    with pytest.raises(ConfigError, match="tau"):
        HardAlign(tau=0)


def test_hard_attention_context_is_the_chosen_value():
    torch.manual_seed(2)
    attn = attnlab.Attention(score="dot", align="hard", d_q=4, d_k=4, d_v=6).eval()
    q, k = torch.randn(3, 2, 4), torch.randn(3, 5, 4)
    v = torch.randn(3, 5, 6)
    out = attn(q, k, v, need_weights=True)
    idx = (q @ k.transpose(1, 2)).argmax(-1)
    ref = torch.stack([v[b, idx[b]] for b in range(3)])
    torch.testing.assert_close(out.context, ref)
    assert out.log_prob.shape == (3, 2)


# ----------------------------------------------------------------------------- local-m / local-p


@pytest.mark.parametrize("gaussian", [False, True])
def test_local_m_default_positions_are_the_output_positions(gaussian):
    g = torch.Generator().manual_seed(20)
    e = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    mask = attnlab.masks.from_lengths(torch.tensor([7, 3]))
    out = LocalMAlign(D=1, gaussian=gaussian)(e, mask)
    center = torch.arange(5, dtype=torch.float64).expand(2, 5)
    torch.testing.assert_close(
        out.weights, naive_local(e, center, 1, mask, gaussian), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(out.extras["centers"], center)
    assert out.log_prob is None


def test_local_m_custom_positions():
    g = torch.Generator().manual_seed(21)
    e = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    m = LocalMAlign(D=2)
    pos = torch.tensor([8.0, 0.5, 4.0])
    out = m(e, positions=pos)
    torch.testing.assert_close(
        out.weights, naive_local(e, pos.expand(2, 3), 2, None, False), rtol=0, atol=1e-12
    )
    pos2 = torch.tensor([[1.0, 2.0, 3.0], [6.0, 7.0, 9.5]])
    out2 = m(e, positions=pos2)
    torch.testing.assert_close(
        out2.weights, naive_local(e, pos2, 2, None, False), rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match="positions"):
        m(e, positions=torch.zeros(4))
    # single query [B, n_k]: the window sits at position 0
    out3 = m(e[:, 0])
    ref = naive_local(e[:, :1], torch.zeros(2, 1), 2, None, False)[:, 0]
    torch.testing.assert_close(out3.weights, ref, rtol=0, atol=1e-12)


def test_local_modules_reject_bad_window():
    for D in (0, 1.5, -2):
        with pytest.raises(ValueError, match="D"):
            LocalMAlign(D=D)
        with pytest.raises(ValueError, match="D"):
            LocalPAlign(d_q=3, D=D)


def naive_local_p_centers(
    m: LocalPAlign, q: torch.Tensor, S: list[list[float]], s0: list[list[float]] | None = None
) -> torch.Tensor:
    """p = s0 + S * sigmoid(w_p^T tanh(W_p q)) with explicit loops over the parameters
    (``s0`` 0 where not given)."""
    Wp = m.W_p.weight.detach().double().tolist()
    wp = m.w_p.detach().double().tolist()
    B, n_q, d_q = q.shape
    out = torch.zeros(B, n_q, dtype=torch.float64)
    for b in range(B):
        for i in range(n_q):
            h = [
                math.tanh(sum(Wp[j][c] * float(q[b, i, c]) for c in range(d_q)))
                for j in range(len(wp))
            ]
            s = sum(wp[j] * h[j] for j in range(len(wp)))
            out[b, i] = (s0[b][i] if s0 else 0.0) + S[b][i] / (1 + math.exp(-s))
    return out


def test_local_p_centres_and_weights():
    torch.manual_seed(22)
    m = LocalPAlign(d_q=3, D=2, d_p=5).double()
    g = torch.Generator().manual_seed(22)
    B, n_q, n_k = 3, 4, 10
    q = torch.randn(B, n_q, 3, generator=g, dtype=torch.float64) * 2
    e = torch.randn(B, n_q, n_k, generator=g, dtype=torch.float64)
    # without a mask S = n_k - 1
    out = m(e, query=q)
    p = naive_local_p_centers(m, q, [[n_k - 1.0] * n_q] * B)
    torch.testing.assert_close(out.extras["centers"], p)
    torch.testing.assert_close(out.weights, naive_local(e, p, 2, None, True), rtol=0, atol=1e-12)
    # with a mask the centre spans the row's allowed keys: s0 = the first allowed
    # position, S = the last minus the first (both 0 for a row that allows nothing)
    mask = torch.rand(B, n_q, n_k, generator=g) > 0.4
    mask[2, 3] = False
    mask[1, 0] = False
    mask[1, 0, 6] = True
    first = [[next((l for l in range(n_k) if mask[b, i, l]), 0) * 1.0 for i in range(n_q)]
             for b in range(B)]  # fmt: skip
    last = [[max((l for l in range(n_k) if mask[b, i, l]), default=0) * 1.0 for i in range(n_q)]
            for b in range(B)]  # fmt: skip
    S = [[last[b][i] - first[b][i] for i in range(n_q)] for b in range(B)]
    out = m(e, mask, query=q)
    p = naive_local_p_centers(m, q, S, first)
    torch.testing.assert_close(out.extras["centers"], p)
    torch.testing.assert_close(out.weights, naive_local(e, p, 2, mask, True), rtol=0, atol=1e-12)
    assert (out.weights[2, 3] == 0).all()
    # the one allowed key of row (1, 0) is the window's centre: it takes the whole weight
    assert out.extras["centers"][1, 0] == 6.0
    assert out.weights[1, 0, 6] == 1.0 and out.weights[1, 0].sum() == 1.0
    # key padding mask [B, 1, n_k]: S = length - 1
    kp = attnlab.masks.from_lengths(torch.tensor([10, 4, 1]))
    out = m(e, kp, query=q)
    torch.testing.assert_close(
        out.extras["centers"], naive_local_p_centers(m, q, [[9.0] * n_q, [3.0] * n_q, [0.0] * n_q])
    )
    # left padding [B, 1, n_k]: the same sentences at the end of the row give the same
    # centres, shifted by the padding, and the same weights on the real keys
    lengths = torch.tensor([10, 4, 1])
    left = kp.flip(-1)
    shifted = torch.stack([e[b].roll(int(n_k - lengths[b]), -1) for b in range(B)])
    out_left = m(shifted, left, query=q)
    torch.testing.assert_close(
        out_left.extras["centers"], out.extras["centers"] + (n_k - lengths)[:, None].double()
    )
    for b in range(B):
        real = out.weights[b, :, : int(lengths[b])]
        torch.testing.assert_close(out_left.weights[b, :, n_k - int(lengths[b]) :], real)
    # every window meets its sentence (a count-based S = length - 1 would put the windows of
    # the length-4 row on the padding, zero weights)
    assert (out_left.weights.sum(-1) > 0).all()


def test_local_p_span_of_the_allowed_keys():
    """``_allowed_span``: the first and the last allowed position per row; 0 and 0 for a
    row that allows nothing and for no keys at all."""
    from attnlab.general.alignment import _allowed_span

    mask = torch.tensor([[True, True, False, False], [False, True, False, True],
                         [False, False, False, False], [False, False, True, False]])  # fmt: skip
    first, last = _allowed_span(mask)
    assert first.tolist() == [0, 1, 0, 2] and last.tolist() == [1, 3, 0, 2]
    first, last = _allowed_span(torch.zeros(2, 3, 0, dtype=torch.bool))
    assert first.shape == last.shape == (2, 3) and not first.any() and not last.any()


def test_local_p_centre_stays_in_zero_to_S():
    torch.manual_seed(23)
    m = LocalPAlign(d_q=4, D=3)
    with torch.no_grad():
        m.w_p.mul_(100)  # saturate the sigmoid both ways
    q = torch.randn(64, 5, 4) * 50
    e = torch.randn(64, 5, 12)
    p = m(e, query=q).extras["centers"]
    assert (p >= 0).all() and (p <= 11).all()
    assert p.min() < 0.5 and p.max() > 10.5


def test_local_p_gradient_reaches_the_position_predictor():
    torch.manual_seed(24)
    m = LocalPAlign(d_q=3, D=2)
    q = torch.randn(2, 3, 3)
    out = m(torch.randn(2, 3, 9), query=q)
    (out.weights * torch.randn(2, 3, 9)).sum().backward()
    assert m.W_p.weight.grad.abs().sum() > 0 and m.w_p.grad.abs().sum() > 0


def test_local_p_single_query_and_errors():
    torch.manual_seed(25)
    m = LocalPAlign(d_q=3, D=1).double()
    q = torch.randn(2, 3, dtype=torch.float64)
    e = torch.randn(2, 6, dtype=torch.float64)
    out = m(e, query=q)
    p = naive_local_p_centers(m, q[:, None], [[5.0], [5.0]])
    torch.testing.assert_close(out.extras["centers"], p[:, 0])
    torch.testing.assert_close(
        out.weights, naive_local(e[:, None], p, 1, None, True)[:, 0], rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match="query"):
        m(e)
    with pytest.raises(ValueError, match="query"):
        m(
            torch.randn(2, 4, 6, dtype=torch.float64),
            query=torch.randn(2, 3, 3, dtype=torch.float64),
        )
    with pytest.raises(ConfigError, match="d_q"):
        LocalPAlign()


# ----------------------------------------------------------------------------- reinforced


def naive_keep_prob(m: ReinforcedAlign, keys: torch.Tensor, key_ok: torch.Tensor) -> torch.Tensor:
    """pi_l = sigmoid(w^T tanh(W [k_l; kbar; k_l * kbar] + b) + b0), kbar the mean allowed key."""
    W = m.policy[0].weight.detach().double().tolist()
    bW = m.policy[0].bias.detach().double().tolist()
    w = m.policy[2].weight.detach().double()[0].tolist()
    b0 = float(m.policy[2].bias.detach())
    B, n_k, d = keys.shape
    out = torch.zeros(B, n_k, dtype=torch.float64)
    for b in range(B):
        ok = [l for l in range(n_k) if bool(key_ok[b, l])]
        kbar = [sum(float(keys[b, l, c]) for l in ok) / max(len(ok), 1) for c in range(d)]
        for l in range(n_k):
            k = [float(keys[b, l, c]) for c in range(d)]
            feat = k + kbar + [k[c] * kbar[c] for c in range(d)]
            h = [
                math.tanh(sum(W[j][c] * feat[c] for c in range(3 * d)) + bW[j])
                for j in range(len(w))
            ]
            s = sum(w[j] * h[j] for j in range(len(w))) + b0
            out[b, l] = 1 / (1 + math.exp(-s))
    return out


def test_reinforced_selection_weights_and_log_prob():
    torch.manual_seed(30)
    m = ReinforcedAlign(d_k=3, d_h=4, init_keep=0.6).double().train()
    g = torch.Generator().manual_seed(30)
    B, n_q, n_k = 3, 4, 7
    keys = torch.randn(B, n_k, 3, generator=g, dtype=torch.float64)
    e = torch.randn(B, n_q, n_k, generator=g, dtype=torch.float64)
    mask = attnlab.masks.from_lengths(torch.tensor([7, 5, 2]))
    out = m(e, mask, keys=keys)
    sel = out.extras["selection"]
    key_ok = torch.broadcast_to(mask, (B, n_q, n_k)).any(1)
    assert sel.dtype == torch.bool and sel.shape == (B, n_k)
    assert not (sel & ~key_ok).any()  # only allowed keys are ever selected
    pi = naive_keep_prob(m, keys, key_ok)
    torch.testing.assert_close(out.extras["keep_prob"], pi)
    for b in range(B):
        ref_lp = 0.0
        for l in range(n_k):
            if bool(key_ok[b, l]):
                ref_lp += math.log(pi[b, l]) if bool(sel[b, l]) else math.log(1 - pi[b, l])
        assert math.isclose(float(out.log_prob[b].detach()), ref_lp, abs_tol=1e-9)
        n_sel = int(sel[b].sum())
        assert math.isclose(float(out.extras["selection_ratio"][b]), n_sel / int(key_ok[b].sum()))
        for i in range(n_q):
            allowed = [bool(sel[b, l]) and bool(mask[b, 0, l]) for l in range(n_k)]
            ref = naive_softmax(e[b, i].tolist(), allowed)
            torch.testing.assert_close(
                out.weights[b, i], torch.tensor(ref, dtype=torch.float64), rtol=0, atol=1e-12
            )
    assert out.log_prob.shape == (B,)


def _feature_gated_policy(m: ReinforcedAlign) -> None:
    """Keep key l iff keys[l, 0] > 0 (the policy reads the first feature)."""
    with torch.no_grad():
        m.policy[0].weight.zero_()
        m.policy[0].bias.zero_()
        m.policy[0].weight[0, 0] = 5.0
        m.policy[2].weight.zero_()
        m.policy[2].weight[0, 0] = 20.0
        m.policy[2].bias.zero_()


def test_reinforced_eval_threshold_is_deterministic_and_empty_rows_are_zero():
    m = ReinforcedAlign(d_k=2).eval()
    _feature_gated_policy(m)
    keys = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [2.0, 0.0], [-2.0, 0.0]]])
    e = torch.randn(1, 3, 4, requires_grad=True)
    mask = torch.tensor(
        [[[True, True, True, True], [False, True, False, True], [True, False, False, False]]]
    )
    out1, out2 = m(e, mask, keys=keys), m(e, mask, keys=keys)
    assert torch.equal(out1.extras["selection"], torch.tensor([[True, False, True, False]]))
    assert torch.equal(out1.weights, out2.weights)
    # query 1 may only see keys 1 and 3, neither is selected: zero weights, finite grads
    assert (out1.weights[0, 1] == 0).all()
    ref0 = naive_softmax(e[0, 0].tolist(), [True, False, True, False])
    torch.testing.assert_close(out1.weights[0, 0], torch.tensor(ref0))
    assert out1.weights[0, 2].tolist() == [1.0, 0.0, 0.0, 0.0]
    (out1.weights * torch.randn(1, 3, 4)).sum().backward()
    assert torch.isfinite(e.grad).all() and (e.grad[0, 1] == 0).all()
    # nothing selected at all
    none = ReinforcedAlign(d_k=2, init_keep=1e-6).eval()
    out = none(torch.randn(2, 3, 4), keys=torch.randn(2, 4, 2))
    assert not out.extras["selection"].any() and (out.weights == 0).all()
    assert torch.isfinite(out.log_prob).all()


def test_reinforced_eval_modes():
    torch.manual_seed(32)
    m = ReinforcedAlign(d_k=3, d_h=6, init_keep=0.5).double()
    with torch.no_grad():
        m.policy[2].weight.mul_(5)  # keep probabilities spread over (0, 1)
    keys = torch.randn(8, 12, 3, dtype=torch.float64)
    e = torch.randn(8, 2, 12, dtype=torch.float64)
    pi = naive_keep_prob(m, keys, torch.ones(8, 12, dtype=torch.bool))
    assert ((pi > 0.2) & (pi < 0.8)).sum() >= 10
    m.eval()
    sel = m(e, keys=keys).extras["selection"]
    assert torch.equal(sel, pi > 0.5)
    assert torch.equal(m(e, keys=keys).extras["selection"], sel)
    sampler = ReinforcedAlign(d_k=3, d_h=6, eval_mode="sample").double().eval()
    sampler.load_state_dict(m.state_dict())
    assert not torch.equal(sampler(e, keys=keys).extras["selection"], sel)


def test_reinforced_gradcheck_with_the_selection_held_fixed():
    """The gradients themselves, not only that they exist: float64 gradcheck of
    ``log_prob`` with respect to the keys and every policy parameter, and of the weights
    (the softmax over the selected keys) with respect to the scores. Evaluation mode keeps
    the selection a fixed function of the keys (``pi_l > 0.5``); the keys are drawn so that
    no ``pi_l`` lies within 0.05 of 0.5, where gradcheck's small steps could flip it."""
    torch.manual_seed(33)
    m = ReinforcedAlign(d_k=3, d_h=4, init_keep=0.5).double().eval()
    with torch.no_grad():
        m.policy[2].weight.mul_(4)
    mask = attnlab.masks.from_lengths(torch.tensor([6, 4]))
    g = torch.Generator().manual_seed(34)
    for _ in range(100):
        keys = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
        pi = naive_keep_prob(m, keys, mask[:, 0])
        if ((pi - 0.5).abs() > 0.05).all() and (pi > 0.5).any() and (pi < 0.5).any():
            break
    else:
        raise AssertionError("no keys with every keep probability away from 0.5")
    e = torch.randn(2, 3, 6, generator=g, dtype=torch.float64)
    names = [n for n, _ in m.named_parameters()]

    def log_prob(keys, *params):
        values = dict(zip(names, params, strict=True))
        return torch.func.functional_call(m, values, (e, mask), {"keys": keys}).log_prob

    params = [p.detach().clone().requires_grad_() for p in m.parameters()]
    assert torch.autograd.gradcheck(log_prob, (keys.clone().requires_grad_(), *params))
    assert torch.autograd.gradcheck(
        lambda e: m(e, mask, keys=keys).weights, (e.clone().requires_grad_(),)
    )


def test_reinforced_training_samples_and_log_prob_has_gradient():
    torch.manual_seed(31)
    m = ReinforcedAlign(d_k=3, init_keep=0.5).train()
    keys = torch.randn(16, 10, 3)
    e = torch.randn(16, 2, 10)
    out1, out2 = m(e, keys=keys), m(e, keys=keys)
    assert not torch.equal(out1.extras["selection"], out2.extras["selection"])
    out1.log_prob.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.policy.parameters())


def test_reinforced_single_query_and_errors():
    m = ReinforcedAlign(d_k=2).eval()
    out = m(torch.randn(3, 5), keys=torch.randn(3, 5, 2))
    assert out.weights.shape == (3, 5)
    with pytest.raises(ValueError, match="keys"):
        m(torch.randn(3, 5))
    with pytest.raises(ValueError, match="keys"):
        m(torch.randn(3, 5), keys=torch.randn(3, 4, 2))
    with pytest.raises(ConfigError, match="d_k"):
        ReinforcedAlign()
    with pytest.raises(ConfigError, match="eval_mode"):
        ReinforcedAlign(d_k=2, eval_mode="argmax")
    with pytest.raises(ConfigError, match="init_keep"):
        ReinforcedAlign(d_k=2, init_keep=1.0)


# ----------------------------------------------------------------------------- REINFORCE loss


def test_reinforce_loss_hand_numbers_and_gradient():
    log_prob = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], requires_grad=True)
    reward = torch.tensor([[1.0], [0.0]], requires_grad=True)
    loss = reinforce_loss(log_prob, reward, baseline=0.25)
    # -(0.75 * (-0.5 - 1.0) + (-0.25) * (-2.0 - 0.1)) / 4
    assert math.isclose(loss.item(), -(0.75 * -1.5 + -0.25 * -2.1) / 4, rel_tol=1e-6)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.75, -0.75], [0.25, 0.25]]) / 4)
    assert reward.grad is None  # the reward is treated as a constant
    # no baseline; a tensor baseline is detached too
    assert math.isclose(
        float(reinforce_loss(torch.tensor([-1.0, -3.0]), torch.tensor([2.0, 1.0]))), 2.5
    )
    base = torch.tensor(0.5, requires_grad=True)
    reinforce_loss(torch.tensor([-1.0], requires_grad=True), torch.tensor([1.0]), base).backward()
    assert base.grad is None


def test_reinforce_loss_per_example_reward_lines_up_with_examples():
    # B == n_q: right-aligned broadcasting would pair reward[j] with query j
    log_prob = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    reward = torch.tensor([1.0, 0.0])
    assert math.isclose(float(reinforce_loss(log_prob, reward)), -(-1.0 - 2.0) / 4)
    baseline = torch.tensor([0.0, 1.0])
    assert math.isclose(
        float(reinforce_loss(log_prob, reward, baseline)), -(-1.0 - 2.0 + 3.0 + 4.0) / 4
    )
    with pytest.raises(ValueError, match="reward"):
        reinforce_loss(log_prob, torch.ones(3))
    with pytest.raises(ValueError, match="reward"):
        reinforce_loss(log_prob[0], torch.ones(2, 2))
    with pytest.raises(TypeError, match="log_prob"):
        reinforce_loss(None, reward)


def test_reinforce_loss_refuses_a_reward_along_the_queries():
    """A reward [n_q] against log_prob [B, n_q] with B != n_q was broadcast right-aligned,
    pairing reward[j] with query j of every example; the docstring says a lower-rank
    reward lines up with the examples only."""
    log_prob = torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"^reward has shape \(3,\).*log_prob \(2, 3\)"):
        reinforce_loss(log_prob, torch.tensor([1.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match=r"^baseline has shape \(3,\).*log_prob \(2, 3\)"):
        reinforce_loss(log_prob, torch.ones(2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"^reward has shape \(3, 4\).*log_prob \(2, 3, 4\)"):
        reinforce_loss(torch.randn(2, 3, 4), torch.ones(3, 4))
    # what the docstring allows: [B], [B, 1], [1], a scalar, the full shape
    for reward in (torch.ones(2), torch.ones(2, 1), torch.ones(1), torch.tensor(1.0)):
        torch.testing.assert_close(reinforce_loss(log_prob, reward), -log_prob.mean())
    torch.testing.assert_close(reinforce_loss(log_prob, torch.ones(2, 3)), -log_prob.mean())
    torch.testing.assert_close(
        reinforce_loss(torch.randn(2, 3, 4).fill_(-1.0), torch.tensor([1.0, 3.0])),
        torch.tensor(2.0),
    )


def test_reinforce_loss_lowers_the_probability_of_bad_choices():
    e = torch.zeros(1, 4, requires_grad=True)
    opt = torch.optim.SGD([e], lr=1.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        w, log_prob, _ = hard_align(e.expand(64, 4), generator=gen)
        reward = (w.argmax(-1) == 2).float()  # only key 2 is rewarded
        loss = reinforce_loss(log_prob, reward, reward.mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
    probs = naive_softmax(e[0].tolist(), [True] * 4)
    assert probs[2] > 0.9


# ----------------------------------------------------------------------------- learning

N_ITEMS = 8


def flagged_items_task(n: int, gen: torch.Generator):
    """n_k = 8 items; one carries flag 1 (feature 0). Each item has a value x in {-1, 1}^2;
    the label is XOR(x_0 > 0, x_1 > 0) of the flagged item. The values handed to the
    attention exclude the flag, so the classifier sees only the chosen item's value.
    Mean pooling of the values carries (almost) nothing about the label."""
    x = torch.randint(0, 2, (n, N_ITEMS, 2), generator=gen).float() * 2 - 1
    marked = torch.randint(0, N_ITEMS, (n,), generator=gen)
    flag = F.one_hot(marked, N_ITEMS).float()
    keys = torch.cat([flag[..., None], x], -1)
    xm = x[torch.arange(n), marked]
    y = (xm[:, 0] * xm[:, 1] > 0).long()
    return keys, x, y, marked


def _classifier() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))


def _train_mean_pooling_baseline(seed: int, steps: int) -> float:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    clf = _classifier()
    opt = torch.optim.Adam(clf.parameters(), lr=1e-2)
    for _ in range(steps):
        _, x, y, _ = flagged_items_task(128, gen)
        loss = F.cross_entropy(clf(x.mean(1)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    _, x, y, _ = flagged_items_task(2000, gen)
    with torch.no_grad():
        return (clf(x.mean(1)).argmax(-1) == y).float().mean().item()


def _train_on_flagged_items(
    attn: nn.Module,
    q: torch.Tensor,
    gen: torch.Generator,
    steps: int,
    *,
    reinforce: bool,
    sparsity: float = 0.0,
) -> nn.Module:
    """Train ``attn`` (queries ``q``, keys and values of ``flagged_items_task``, batches of
    128) and a new ``_classifier()`` on its context together, ``steps`` Adam steps (lr
    1e-2): the mean cross-entropy, plus with ``reinforce`` the REINFORCE loss of the reward
    ``-cross-entropy - sparsity * selection ratio`` against a running-mean baseline.
    Returns the classifier; ``attn`` is left in evaluation mode."""
    clf = _classifier()
    opt = torch.optim.Adam([*attn.parameters(), *clf.parameters()], lr=1e-2)
    baseline = 0.0
    for _ in range(steps):
        keys, x, y, _ = flagged_items_task(128, gen)
        out = attn(q, keys, x)
        ce = F.cross_entropy(clf(out.context), y, reduction="none")
        loss = ce.mean()
        if reinforce:
            reward = -ce.detach()
            if sparsity:
                reward = reward - sparsity * out.extras["selection_ratio"]
            loss = loss + reinforce_loss(out.log_prob, reward, baseline)
            baseline = 0.9 * baseline + 0.1 * reward.mean().item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    attn.eval()
    return clf


def _train_hard(estimator: str, seed: int, steps: int) -> tuple[float, float]:
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    attn = attnlab.Attention(
        score="general", align="hard", d_q=1, d_k=3, d_v=2, estimator=estimator
    )
    q = torch.ones(128, 1)  # one constant query: the score is a learned function of the key
    clf = _train_on_flagged_items(attn, q, gen, steps, reinforce=estimator == "reinforce")
    keys, x, y, marked = flagged_items_task(2000, gen)
    with torch.no_grad():
        out = attn(torch.ones(2000, 1), keys, x, need_weights=True)
        acc = (clf(out.context).argmax(-1) == y).float().mean().item()
        picked = (out.weights.argmax(-1) == marked).float().mean().item()
    return acc, picked


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["reinforce", "gumbel"])
def test_hard_attention_learns_to_pick_the_informative_key(estimator):
    """Mechanism: hard attention (REINFORCE with a running-mean baseline, or the
    straight-through Gumbel-softmax estimator) picks the flagged item in > 95% of test
    examples (argmax at evaluation) and reaches > 95% accuracy.
    Baseline: mean pooling of the values with the same classifier stays below 65%
    (chance is 50%)."""
    acc, picked = _train_hard(estimator, seed=0, steps=300)
    base = _train_mean_pooling_baseline(seed=0, steps=300)
    assert picked > 0.95, picked
    assert acc > 0.95, acc
    assert base < 0.65, base


@pytest.mark.slow
def test_reinforced_attention_learns_to_select_the_informative_key():
    """ReSAN-style selection with a constant (zero) score: soft attention over the selected
    keys is uniform, so the task is solved only if the policy keeps the flagged item and
    drops the others. Reward = -cross-entropy - 0.1 * selection ratio (sparsity).
    Mechanism: at evaluation (threshold) the flagged item is kept in > 95% of examples,
    fewer than 30% of the keys are kept, accuracy > 95%.
    Baseline: mean pooling (= keeping every key) stays below 65% (chance 50%)."""
    seed, steps = 0, 300
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    attn = attnlab.Attention(score="dot", align="reinforced", d_q=3, d_k=3, d_v=2)
    q = torch.zeros(128, 3)
    clf = _train_on_flagged_items(attn, q, gen, steps, reinforce=True, sparsity=0.1)
    keys, x, y, marked = flagged_items_task(2000, gen)
    with torch.no_grad():
        out = attn(torch.zeros(2000, 3), keys, x)
        sel = out.extras["selection"]
        kept = sel[torch.arange(2000), marked].float().mean().item()
        ratio = out.extras["selection_ratio"].mean().item()
        acc = (clf(out.context).argmax(-1) == y).float().mean().item()
    base = _train_mean_pooling_baseline(seed, steps)
    assert kept > 0.95, kept
    assert ratio < 0.3, ratio
    assert acc > 0.95, acc
    assert base < 0.65, base


@pytest.mark.parametrize("gaussian", ["no", 1, None])
def test_local_alignments_gaussian_must_be_a_bool(gaussian: object) -> None:
    """``gaussian="no"`` switched the Gaussian factor on."""
    with pytest.raises(TypeError, match=r"^gaussian must be a bool, got"):
        LocalMAlign(gaussian=gaussian)
    with pytest.raises(TypeError, match=r"^gaussian must be a bool, got"):
        LocalPAlign(d_q=4, gaussian=gaussian)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: LocalPAlign(d_q=True), "d_q"),
        (lambda: LocalPAlign(d_q=2.5), "d_q"),
        (lambda: LocalPAlign(d_q=4, d_p=0), "d_p"),
        (lambda: LocalPAlign(d_q=4, d_p="3"), "d_p"),
        (lambda: ReinforcedAlign(d_k=0), "d_k"),
        (lambda: ReinforcedAlign(d_k=2.5), "d_k"),
        (lambda: ReinforcedAlign(d_k=4, d_h=True), "d_h"),
        (lambda: ReinforcedAlign(d_k=4, d_h=0), "d_h"),
    ],
)
def test_alignment_sizes_are_positive_ints(build, name: str) -> None:
    """Sizes reached ``nn.Linear`` unchecked: a deep torch error, a ZeroDivisionError, or
    (``d_k=0``, ``True``) a silently degenerate policy."""
    with pytest.raises(ConfigError, match=rf": {name} must be a positive int, got"):
        build()


@pytest.mark.parametrize("init_keep", ["0.1", True, float("nan"), float("inf")])
def test_reinforced_init_keep_must_be_a_number_in_the_open_unit_interval(init_keep) -> None:
    """``"0.1"`` raised a bare ``'<' not supported`` TypeError that named nothing."""
    with pytest.raises(ConfigError, match=r"^init_keep must be a number in \(0, 1\), got"):
        ReinforcedAlign(d_k=3, init_keep=init_keep)


def test_alignment_functions_switches_must_be_bools() -> None:
    """A truthy string switched the option on instead of raising."""
    e = torch.randn(2, 3, 5)
    with pytest.raises(TypeError, match=r"^gaussian must be a bool, got 'no'$"):
        local_align(e, torch.zeros(2, 3), 2, gaussian="no")
    with pytest.raises(TypeError, match=r"^sample must be a bool, got 'no'$"):
        hard_align(e, sample="no")
    with pytest.raises(TypeError, match=r"^hard must be a bool, got None$"):
        gumbel_softmax_align(e, hard=None)


@pytest.mark.parametrize(("D", "n_k"), [(2.5, 5), (True, 5), (0, 5), (2, -1), (2, 2.5)])
def test_local_window_checks_its_sizes(D: object, n_k: object) -> None:
    """``D=2.5`` and ``True`` gave windows that no alignment uses, ``n_k=2.5`` a
    fractional arange, ``n_k=-1`` a deep RuntimeError."""
    with pytest.raises(ValueError, match=r"(D \(the half window width\)|n_k) must be an int"):
        local_window(torch.zeros(2, 3), D, n_k)


@pytest.mark.parametrize("baseline", [float("nan"), float("inf"), "0.1", True])
def test_reinforce_loss_number_baseline_must_be_finite(baseline: object) -> None:
    """A NaN baseline made the loss NaN silently; text and True raised deep errors."""
    with pytest.raises(ValueError, match=r"^baseline must be a finite number, got"):
        reinforce_loss(torch.randn(2, 3), torch.ones(2), baseline)
