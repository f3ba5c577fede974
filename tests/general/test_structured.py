"""Tests for the structured (linear-chain CRF, segmentation) alignment of Kim et al. 2017:
the marginals against a brute-force sum over every selection z on tiny inputs, the
closed forms (sigmoid without pairwise potentials, a two-key chain by hand), gradients,
masks, half precision, huge scores, and a task where the pairwise potentials must be
learned."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from attnlab import Attention, ConfigError, functional, masks
from attnlab.general import StructuredAlign
from attnlab.general.structured import crf_marginals


def brute_force(e: list[float], allowed: list[bool], theta: list[list[float]]) -> list[float]:
    """p(z_l = 1) by enumerating every z over the allowed keys (the chain joins consecutive
    allowed keys); 0 for a masked key and for a row with no allowed key."""
    keys = [i for i, ok in enumerate(allowed) if ok]
    total, ones = 0.0, [0.0] * len(e)
    for z in itertools.product((0, 1), repeat=len(keys)):
        s = sum(zi * e[i] for zi, i in zip(z, keys, strict=True))
        s += sum(theta[z[t - 1]][z[t]] for t in range(1, len(z)))
        w = math.exp(s)
        total += w
        for zi, i in zip(z, keys, strict=True):
            ones[i] += zi * w
    return [x / total for x in ones] if keys else ones


def _rows(seed: int = 0, n: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    e = torch.randn(2, 4, n, generator=g, dtype=torch.float64) * 2
    theta = torch.randn(2, 2, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 4, n, generator=g) > 0.3
    mask[0, 0] = True  # a full row
    mask[1, 1] = False  # a row with no allowed key
    mask[1, 2] = torch.tensor([True, False, False, True, False, True])[:n]  # holes
    return e, theta, mask


def _expected(e, mask, theta):
    out = torch.zeros_like(e)
    for idx in itertools.product(*(range(s) for s in e.shape[:-1])):
        row = brute_force(e[idx].tolist(), mask[idx].tolist(), theta.tolist())
        out[idx] = torch.tensor(row, dtype=e.dtype)
    return out


# ------------------------------------------------------------------------------ formula


def test_marginals_match_brute_force_enumeration():
    e, theta, mask = _rows()
    got = crf_marginals(e, mask, theta)
    torch.testing.assert_close(got, _expected(e, mask, theta), rtol=1e-10, atol=1e-12)
    # the module gives the same weights with its transitions set to theta
    align = StructuredAlign().double()
    with torch.no_grad():
        align.transitions.copy_(theta)
    torch.testing.assert_close(align(e, mask).weights, got)
    # the functional twin is exported under the function's name
    assert functional.crf_marginals is crf_marginals


def test_a_two_key_chain_by_hand():
    # states (z1, z2): 00 -> 1, 01 -> e^(b + t01), 10 -> e^(a + t10), 11 -> e^(a + b + t11)
    a, b = 0.3, -1.2
    t = [[0.0, 0.5], [-0.7, 1.1]]
    w = {
        (0, 0): 1.0,
        (0, 1): math.exp(b + t[0][1]),
        (1, 0): math.exp(a + t[1][0]),
        (1, 1): math.exp(a + b + t[1][1]),
    }
    z = sum(w.values())
    want = [(w[1, 0] + w[1, 1]) / z, (w[0, 1] + w[1, 1]) / z]
    got = crf_marginals(torch.tensor([a, b], dtype=torch.float64), transitions=torch.tensor(t))
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


def test_without_pairwise_potentials_the_keys_are_independent_sigmoids():
    e, _, mask = _rows(1)
    torch.testing.assert_close(crf_marginals(e), torch.sigmoid(e))
    torch.testing.assert_close(crf_marginals(e, mask), torch.sigmoid(e) * mask)
    align = StructuredAlign(pairwise=False)
    assert align.transitions is None and not list(align.parameters())
    torch.testing.assert_close(align(e.float()).weights, torch.sigmoid(e.float()))


def test_sum_to_one_divides_the_marginals_by_their_sum():
    e, theta, mask = _rows(2)
    raw = _expected(e, mask, theta)
    total = raw.sum(-1, keepdim=True)
    want = torch.where(total > 0, raw / total.clamp_min(1e-300), 0.0)
    torch.testing.assert_close(crf_marginals(e, mask, theta, sum_to_one=True), want)
    align = StructuredAlign(sum_to_one=True).double()
    with torch.no_grad():
        align.transitions.copy_(theta)
    out = align(e, mask)
    torch.testing.assert_close(out.weights, want)
    torch.testing.assert_close(out.extras["marginals"], raw)
    has = mask.any(-1)
    torch.testing.assert_close(out.weights.sum(-1)[has], torch.ones(int(has.sum()), dtype=e.dtype))


def test_in_the_general_module_the_context_is_the_marginal_weighted_sum():
    torch.manual_seed(0)
    attn = Attention("general", "structured", d_q=3, d_k=3)
    with torch.no_grad():
        attn.align.transitions.copy_(torch.tensor([[0.4, -0.2], [0.1, 0.9]]))
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 3, generator=g) for _ in range(3))
    mask = masks.from_lengths(torch.tensor([3, 2]))
    out = attn(q, k, v, mask=mask, need_weights=True)
    e = attn.score(q, k)
    want = _expected(e.double(), torch.broadcast_to(mask, e.shape), attn.align.transitions.double())
    torch.testing.assert_close(out.weights.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.context, out.weights @ v)
    assert out.path == "explicit"


# ---------------------------------------------------------------------------- gradients


def test_gradcheck_scores_and_transitions():
    e, theta, mask = _rows(3, n=5)
    e.requires_grad_()
    theta.requires_grad_()
    assert torch.autograd.gradcheck(lambda e, t: crf_marginals(e, mask, t), (e, theta))
    assert torch.autograd.gradcheck(
        lambda e, t: crf_marginals(e, mask, t, sum_to_one=True), (e, theta)
    )


def test_the_transitions_are_learned_through_the_general_module():
    torch.manual_seed(0)
    attn = Attention("dot", "structured", d_q=4, d_k=4)
    q, k = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    attn(q, k).context.square().sum().backward()
    grad = attn.align.transitions.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


# -------------------------------------------------------------------------------- masks


def test_masked_keys_never_matter_and_leave_the_chain():
    e, theta, _ = _rows(4)
    lengths = torch.tensor([6, 4])
    mask = masks.from_lengths(lengths)  # [B, 1, n_k]: padding
    base = crf_marginals(e, mask, theta)
    # padding equals the same rows cut to their length
    torch.testing.assert_close(base[1, :, :4], crf_marginals(e[1, :, :4], None, theta))
    assert (base[1, :, 4:] == 0).all()
    # whatever a masked score holds (NaN, inf), the weights and the gradients of the
    # other scores are the same, and the masked scores get zero gradient
    bad = e.clone()
    bad[1, :, 4] = float("nan")
    bad[1, :, 5] = float("inf")
    bad.requires_grad_()
    out = crf_marginals(bad, mask, theta)
    torch.testing.assert_close(out, base)
    out.sum().backward()
    assert torch.isfinite(bad.grad).all() and (bad.grad[1, :, 4:] == 0).all()


def test_a_row_without_keys_is_zero_with_zero_gradient():
    e, theta, mask = _rows(5)
    e.requires_grad_()
    out = crf_marginals(e, mask, theta)
    assert (out[1, 1] == 0).all()
    out.sum().backward()
    assert torch.isfinite(e.grad).all() and (e.grad[1, 1] == 0).all()
    empty = crf_marginals(torch.zeros(2, 3, 0))
    assert empty.shape == (2, 3, 0)


def test_bad_inputs_are_one_line_errors():
    e = torch.randn(2, 3)
    with pytest.raises(TypeError, match=r"mask has dtype torch.float32, expected torch.bool"):
        crf_marginals(e, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask has shape \(4,\), expected a shape broadcastable"):
        crf_marginals(e, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"transitions has shape \(3, 3\), expected \[2, 2\]"):
        crf_marginals(e, transitions=torch.zeros(3, 3))
    with pytest.raises(ValueError, match=r"e has shape \(\), expected"):
        crf_marginals(torch.tensor(1.0))
    with pytest.raises(ConfigError, match=r"pairwise must be a bool, got 1"):
        StructuredAlign(pairwise=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sum_to_one must be a bool"):
        Attention("dot", "structured", sum_to_one="yes")


# ----------------------------------------------------------------------------- precision


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_half_precision_matches_float32(dtype, tol):
    e, theta, mask = _rows(6)
    half = e.to(dtype)
    got = crf_marginals(half, mask, theta.float())
    assert got.dtype == dtype
    want = crf_marginals(half.float(), mask, theta.float())  # the same rounded scores
    # the weights lie in [0, 1]: tol is the rounding of the result to the half type
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)


def test_huge_scores_lose_no_precision():
    # scores in the thousands: every message is kept near 0, so the marginals are exact
    # (saturated to 0 or 1) and their gradient vanishes as it does in float64
    e, theta, mask = _rows(7)
    big = (e * 2000).float().requires_grad_()
    out = crf_marginals(big, mask, theta.float())
    want = crf_marginals(big.detach().double(), mask, theta)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-6)
    out.sum().backward()
    assert big.grad.abs().max() < 1e-6


# ------------------------------------------------------------------------------ learning


def _segments(n_batch: int, g: torch.Generator, n: int = 16, sigma: float = 0.8):
    """A run of 3-8 "on" keys; each key shows on/off through heavy noise; the target is
    the sum of the values of the "on" keys."""
    start = torch.randint(0, n - 4, (n_batch,), generator=g)
    length = torch.randint(3, 9, (n_batch,), generator=g)
    pos = torch.arange(n)
    on = ((pos >= start[:, None]) & (pos < (start + length)[:, None])).float()
    k = (on + sigma * torch.randn(n_batch, n, generator=g)).unsqueeze(-1)
    v = torch.randn(n_batch, n, 4, generator=g)
    return k, v, (on.unsqueeze(-1) * v).sum(1), on


def _fit(pairwise: bool, seed: int = 0, steps: int = 300) -> tuple[float, float, Attention]:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(100 + seed)
    attn = Attention("queryless", "structured", d_k=1, d_v=4, d_w=4, pairwise=pairwise)
    opt = torch.optim.Adam(attn.parameters(), lr=0.05)
    for _ in range(steps):
        k, v, y, _ = _segments(64, g)
        loss = (attn(None, k, v).context - y).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    k, v, y, on = _segments(1000, torch.Generator().manual_seed(999))
    with torch.no_grad():
        out = attn(None, k, v, need_weights=True)
    mse = (out.context - y).square().mean().item()
    wrong = ((out.weights.squeeze(1) > 0.5).float() != on).float().mean().item()
    return mse, wrong, attn


def test_the_chain_learns_to_smooth_noisy_segments_where_independent_keys_cannot():
    # each key alone is misread about a quarter of the time; a chain that learns that
    # neighbours share their state reads the run far better (seeds 0-2 all give about
    # 0.16 wrong against 0.24 and an MSE of 1.8 against 2.6)
    mse, wrong, attn = _fit(pairwise=True)
    mse_ind, wrong_ind, _ = _fit(pairwise=False)
    theta = attn.align.transitions.detach()
    stickiness = float(theta[0, 0] + theta[1, 1] - theta[0, 1] - theta[1, 0])
    assert stickiness > 1.0, theta
    assert wrong < wrong_ind - 0.04, (wrong, wrong_ind)
    assert mse < 0.85 * mse_ind, (mse, mse_ind)
    assert wrong_ind > 0.2  # the task needs the chain: the keys alone are too noisy


def test_crf_marginals_sum_to_one_must_be_a_bool() -> None:
    """``sum_to_one="no"`` rescaled the marginals."""
    with pytest.raises(TypeError, match=r"^sum_to_one must be a bool, got 'no'$"):
        crf_marginals(torch.randn(2, 3, 5), sum_to_one="no")
