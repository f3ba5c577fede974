"""Tests of attnlab.query.positional: sinusoidal, learned, relative (Shaw et al. 2018) and
rotary (Su et al. 2021) positional information."""

from __future__ import annotations

import math

import pytest
import torch
from attention_harness import (
    Inputs,
    check_fully_masked_row,
    check_masked_keys_zero,
    check_need_weights_keeps_context,
    check_output,
    check_rebuild,
    check_wrong_dtype,
    naive_softmax,
)
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import attnlab
from attnlab._checks import ConfigError
from attnlab.query.positional import (
    LearnedPositions,
    RelativePositionAttention,
    RotaryPositions,
    SinusoidalPositions,
    relative_position_attention,
    relative_position_index,
    rotary_embedding,
    sinusoidal_encoding,
    sinusoidal_positions,
)

# ----------------------------------------------------------------------------- sinusoidal


def naive_pe(p: float, d: int, base: float = 10000.0) -> list[float]:
    out = []
    for c in range(d):
        i = c // 2
        angle = p / base ** (2 * i / d)
        out.append(math.sin(angle) if c % 2 == 0 else math.cos(angle))
    return out


def test_sinusoidal_hand_numbers() -> None:
    pe = sinusoidal_positions(3, 4, dtype=torch.float64)
    want = [
        [0.0, 1.0, 0.0, 1.0],
        [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)],
        [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)],
    ]
    torch.testing.assert_close(pe, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("d", [1, 3, 5, 8])
def test_sinusoidal_matches_formula_any_d(d: int) -> None:
    pe = sinusoidal_positions(7, d, offset=3, dtype=torch.float64)
    want = torch.tensor([naive_pe(p, d) for p in range(3, 10)], dtype=torch.float64)
    torch.testing.assert_close(pe, want)
    assert pe.shape == (7, d)


def test_sinusoidal_odd_d_ends_with_a_sine() -> None:
    pe = sinusoidal_positions(2, 3, dtype=torch.float64)
    assert pe[1, 2].item() == pytest.approx(math.sin(1 / 10000 ** (2 / 3)))


def test_sinusoidal_any_length_and_fractional_positions() -> None:
    long = sinusoidal_positions(5000, 6, dtype=torch.float64)
    assert long[4999].tolist() == pytest.approx(naive_pe(4999, 6))
    frac = sinusoidal_encoding(torch.tensor([0.5, 2.25]), 6)
    assert frac[1].tolist() == pytest.approx(naive_pe(2.25, 6))


def test_sinusoidal_module_adds_the_table() -> None:
    m = SinusoidalPositions(5, scale=2.0)
    x = torch.randn(2, 4, 5, dtype=torch.float64)
    want = 2.0 * x + torch.tensor([naive_pe(p, 5) for p in range(4)], dtype=torch.float64)
    torch.testing.assert_close(m(x), want)
    want_off = 2.0 * x + torch.tensor([naive_pe(p, 5) for p in range(10, 14)], dtype=torch.float64)
    torch.testing.assert_close(m(x, offset=10), want_off)
    pos = torch.tensor([[3, 1, 0, 2], [0, 0, 0, 0]])
    got = m(x, positions=pos)
    torch.testing.assert_close(got[0, 1], 2.0 * x[0, 1] + torch.tensor(naive_pe(1, 5)).double())
    # heads: [B, h, n, d]
    xh = torch.zeros(2, 3, 4, 5)
    assert torch.allclose(m(xh)[1, 2], sinusoidal_positions(4, 5))
    with pytest.raises(ValueError, match=r"x has shape \(2, 4, 6\), expected \[..., n, d_model\]"):
        m(torch.zeros(2, 4, 6))
    with pytest.raises(ValueError, match="positions has shape"):
        m(x, positions=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="offset"):
        m(x, offset=-1)
    with pytest.raises(ConfigError, match="base"):
        SinusoidalPositions(4, base=1.0)
    for bad in (float("nan"), "2", True):  # "2" was read as 2.0, NaN made every position NaN
        with pytest.raises(ConfigError, match=r"^scale must be a finite number, got "):
            SinusoidalPositions(4, scale=bad)


def test_sinusoidal_gradcheck() -> None:
    m = SinusoidalPositions(3, scale=1.5)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))


# ----------------------------------------------------------------------------- learned


def test_learned_positions_add_the_table_rows() -> None:
    torch.manual_seed(0)
    m = LearnedPositions(6, 3).double()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    for b in range(2):
        for p in range(4):
            torch.testing.assert_close(m(x)[b, p], x[b, p] + m.weight[p])
            torch.testing.assert_close(m(x, offset=2)[b, p], x[b, p] + m.weight[p + 2])
    pos = torch.tensor([5, 0, 5, 1])
    torch.testing.assert_close(m(x, positions=pos)[1, 2], x[1, 2] + m.weight[5])


@pytest.mark.parametrize(
    "build",
    [lambda: SinusoidalPositions(8), lambda: LearnedPositions(16, 8), lambda: RotaryPositions(8)],
    ids=["sinusoidal", "learned", "rotary"],
)
def test_explicit_positions_trace_under_compile_and_export(build) -> None:
    """``positions=`` (e.g. the positions of a packed or left-padded batch) read no value on
    the host: a fullgraph dynamic compile and ``torch.export`` with dynamic sizes trace the
    call, and the graphs give the eager outputs at another batch and length (the value
    check of the learned table runs in eager calls only)."""
    from torch.export import Dim

    class Placed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.positions = build()

        def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return self.positions(x, positions=positions)

    torch.manual_seed(0)
    module = Placed()
    x, pos = torch.randn(2, 5, 8), torch.arange(5).expand(2, 5) + 2
    axes = {0: Dim.AUTO, 1: Dim.AUTO}
    exported = torch.export.export(module, (x, pos), dynamic_shapes=(axes, axes)).module()
    compiled = torch.compile(module, fullgraph=True, dynamic=True, backend="eager")
    for xs, ps in ((x, pos), (torch.randn(3, 7, 8), torch.randint(0, 16, (3, 7)))):
        want = module(xs, ps)
        torch.testing.assert_close(exported(xs, ps), want, atol=0, rtol=0)
        torch.testing.assert_close(compiled(xs, ps), want, atol=0, rtol=0)


def test_learned_positions_error_past_max_len() -> None:
    m = LearnedPositions(4, 3)
    m(torch.zeros(1, 4, 3))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"5 positions .* max_len=4"):
        m(torch.zeros(1, 5, 3))
    with pytest.raises(ValueError, match=r"offset 1, .* max_len=4"):
        m(torch.zeros(1, 4, 3), offset=1)
    with pytest.raises(ValueError, match=r"positions 0\.\.3"):
        m(torch.zeros(1, 2, 3), positions=torch.tensor([0, 4]))
    with pytest.raises(TypeError, match="integer"):
        m(torch.zeros(1, 2, 3), positions=torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"x has shape \(1, 2, 4\)"):
        m(torch.zeros(1, 2, 4))
    with pytest.raises(ConfigError, match="max_len"):
        LearnedPositions(0, 3)


def test_learned_positions_gradcheck_and_training_signal() -> None:
    m = LearnedPositions(5, 2).double()
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(m, (x,))
    m(x).sum().backward()
    # rows 0..2 were used twice (batch of 2), rows 3..4 not at all
    torch.testing.assert_close(m.weight.grad[:3], torch.full((3, 2), 2.0, dtype=torch.float64))
    assert (m.weight.grad[3:] == 0).all()


# ----------------------------------------------------------------------------- rotary


def naive_rope(x: list[float], m: float, base: float = 10000.0, interleaved=True) -> list[float]:
    d = len(x)
    out = list(x)
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + d // 2)
        c, s = math.cos(m * theta), math.sin(m * theta)
        out[a] = x[a] * c - x[b] * s
        out[b] = x[a] * s + x[b] * c
    return out


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_matches_formula(interleaved: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    got = rotary_embedding(x, interleaved=interleaved, base=100.0)
    for b in range(2):
        for m in range(5):
            want = naive_rope(x[b, m].tolist(), m, base=100.0, interleaved=interleaved)
            assert got[b, m].tolist() == pytest.approx(want, abs=1e-12)
    got = rotary_embedding(x, offset=7, interleaved=interleaved)
    assert got[1, 2].tolist() == pytest.approx(
        naive_rope(x[1, 2].tolist(), 9, interleaved=interleaved)
    )


def test_rotary_hand_numbers() -> None:
    # d = 2: one pair, theta = 1: a plain rotation by m radians
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    got = rotary_embedding(x)
    want = [[1.0, 0.0], [math.cos(1), math.sin(1)], [-math.sin(2), math.cos(2)]]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_relative_property(interleaved: bool) -> None:
    torch.manual_seed(1)
    d = 8
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    rope = RotaryPositions(d, interleaved=interleaved)

    def score(m: int, n: int) -> float:
        qm = rope(q.expand(1, d), positions=torch.tensor([m]))[0]
        kn = rope(k.expand(1, d), positions=torch.tensor([n]))[0]
        return float(qm @ kn)

    for delta in (-5, -1, 0, 2, 7):
        values = [score(m, m + delta) for m in (0, 3, 11, 40)]
        assert values == pytest.approx([values[0]] * 4, abs=1e-10)
        # = q^T R_{delta} k: rotate k alone by the offset
        k_delta = naive_rope(k.tolist(), delta, interleaved=interleaved)
        assert values[0] == pytest.approx(float(q @ torch.tensor(k_delta, dtype=torch.float64)))
    # and it does depend on the offset
    assert abs(score(0, 1) - score(1, 0)) > 1e-3


def test_rotary_module_and_positions_for_heads() -> None:
    rope = RotaryPositions(4)
    q = torch.randn(2, 3, 5, 4)  # [B, h, n, d]
    k = torch.randn(2, 3, 7, 4)
    qr, kr = rope(q, k)
    torch.testing.assert_close(qr, rotary_embedding(q))
    torch.testing.assert_close(kr, rotary_embedding(k))
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # rotations
    pos = torch.tensor([[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]])[:, None, :]  # [B, 1, n]
    got = rope(q, positions=pos)
    torch.testing.assert_close(got[1], rotary_embedding(q[1], offset=10))
    with pytest.raises(ConfigError, match="even"):
        RotaryPositions(5)
    with pytest.raises(ValueError, match="even d"):
        rotary_embedding(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match=r"k has shape \(2, 3, 6\)"):
        rope(torch.zeros(2, 3, 4), torch.zeros(2, 3, 6))


def test_rotary_gradcheck() -> None:
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rotary_embedding(x, interleaved=True), (x,))
    assert torch.autograd.gradcheck(lambda x: rotary_embedding(x, interleaved=False), (x,))


# ----------------------------------------------------------------------------- relative


def test_relative_position_index_by_hand() -> None:
    assert relative_position_index(3, 3, 1).tolist() == [[1, 2, 2], [0, 1, 2], [0, 0, 1]]
    # cross: the 2 queries are the last 2 of 4 key positions
    assert relative_position_index(2, 4, 1).tolist() == [[0, 0, 1, 2], [0, 0, 0, 1]]
    assert relative_position_index(2, 2, 0).tolist() == [[0, 0], [0, 0]]


def naive_relative(q, k, v, rel_k, rel_v, K, mask=None):
    """Shaw et al. 2018 as loops for one head: q [n_q, d], k [n_k, d], v [n_k, d_v]."""
    q, k, v = q.detach(), k.detach(), v.detach()
    rel_k = None if rel_k is None else rel_k.detach()
    rel_v = None if rel_v is None else rel_v.detach()
    n_q, d = q.shape
    n_k = k.shape[0]
    z = torch.zeros(n_q, v.shape[1], dtype=q.dtype)
    w = torch.zeros(n_q, n_k, dtype=q.dtype)
    for i in range(n_q):
        ipos = i + n_k - n_q
        e = {}
        for j in range(n_k):
            if mask is not None and not mask[i][j]:
                continue
            r = max(-K, min(K, j - ipos)) + K
            s = 0.0
            for c in range(d):
                s += float(q[i, c]) * (
                    float(k[j, c]) + (float(rel_k[r, c]) if rel_k is not None else 0.0)
                )
            e[j] = s / math.sqrt(d)
        for j, a in naive_softmax(e).items():
            w[i, j] = a
            r = max(-K, min(K, j - ipos)) + K
            for c in range(v.shape[1]):
                z[i, c] += a * (float(v[j, c]) + (float(rel_v[r, c]) if rel_v is not None else 0.0))
    return z, w


@pytest.mark.parametrize(("n_q", "n_k", "K"), [(4, 4, 1), (3, 5, 2), (4, 4, 0), (2, 2, 5)])
def test_relative_attention_function_matches_loops(n_q: int, n_k: int, K: int) -> None:
    torch.manual_seed(n_q * 10 + n_k + K)
    d, d_v = 3, 2
    q = torch.randn(n_q, d, dtype=torch.float64)
    k = torch.randn(n_k, d, dtype=torch.float64)
    v = torch.randn(n_k, d_v, dtype=torch.float64)
    rel_k = torch.randn(2 * K + 1, d, dtype=torch.float64)
    rel_v = torch.randn(2 * K + 1, d_v, dtype=torch.float64)
    mask = torch.rand(n_q, n_k) > 0.3
    mask[0] = False  # a fully masked row
    for rk, rv in ((rel_k, rel_v), (rel_k, None), (None, rel_v)):
        z, w = relative_position_attention(q, k, v, rk, rv, mask=mask)
        zw, ww = naive_relative(q, k, v, rk, rv, K, mask.tolist())
        torch.testing.assert_close(z, zw)
        torch.testing.assert_close(w, ww)
        assert (z[0] == 0).all() and (w[0] == 0).all()


def test_relative_attention_module_matches_loops() -> None:
    torch.manual_seed(0)
    B, n, d_model, h, K = 2, 5, 6, 2, 2
    m = RelativePositionAttention(d_model, h, max_distance=K).double()
    x = torch.randn(B, n, d_model, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    mask = attnlab.masks.from_lengths(lengths)
    out = m(x, mask=mask, causal=True, need_weights=True, average_weights=False)
    hd = d_model // h
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(B, n, h, hd)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(B, n, h, hd)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(B, n, h, hd)
    ctx = torch.zeros(B, n, h * hd, dtype=torch.float64)
    for b in range(B):
        allowed = [[j <= i and j < int(lengths[b]) for j in range(n)] for i in range(n)]
        for j in range(h):
            z, w = naive_relative(
                q[b, :, j], k[b, :, j], v[b, :, j], m.rel_k[0], m.rel_v[0], K, allowed
            )
            ctx[b, :, j * hd : (j + 1) * hd] = z
            torch.testing.assert_close(out.weights[b, j], w)
    torch.testing.assert_close(out.context, ctx @ m.out_proj.weight.T + m.out_proj.bias)
    # averaged weights
    avg = m(x, mask=mask, causal=True, need_weights=True).weights
    torch.testing.assert_close(avg, out.weights.mean(1))
    # need_weights does not change the output (at the float64 tolerance)
    inputs = Inputs((x,), {"mask": mask, "causal": True, "average_weights": False})
    plain, _ = check_need_weights_keeps_context(m, inputs, atol=1e-7, rtol=1e-7)
    torch.testing.assert_close(plain.context, out.context)


def test_relative_attention_unshared_tables_and_no_value_term() -> None:
    torch.manual_seed(1)
    m = RelativePositionAttention(4, 2, max_distance=1, share_heads=False, values=False).double()
    assert m.rel_k.shape == (2, 3, 2) and m.rel_v is None
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    out = m(x, need_weights=True, average_weights=False)
    q = (x @ m.q_proj.weight.T + m.q_proj.bias).view(1, 3, 2, 2)
    k = (x @ m.k_proj.weight.T + m.k_proj.bias).view(1, 3, 2, 2)
    v = (x @ m.v_proj.weight.T + m.v_proj.bias).view(1, 3, 2, 2)
    for j in range(2):
        _, w = naive_relative(q[0, :, j], k[0, :, j], v[0, :, j], m.rel_k[j], None, 1)
        torch.testing.assert_close(out.weights[0, j], w)


def test_relative_attention_masks() -> None:
    torch.manual_seed(2)
    m = RelativePositionAttention(4, 2, max_distance=2).double()
    x = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    # key padding + a fully masked query row (batch 1, query 0)
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[0, :, 3] = False
    mask[1, 0, :] = False
    inputs = Inputs((x,), {"mask": mask, "average_weights": False})
    check_masked_keys_zero(m, inputs, mask)  # key 3 of example 0 in every head
    # query 0 of example 1 (its weights in every head): a zero context, the output bias
    out = check_fully_masked_row(
        m,
        inputs,
        (1, 0),
        expected_context=m.out_proj.bias,
        weights_of=lambda o: o.weights.transpose(1, 2),  # [B, n_q, h, n_k]
    )
    torch.testing.assert_close(out.weights.sum(-1)[0], torch.ones(2, 4, dtype=torch.float64))
    assert torch.isfinite(x.grad).all()
    # a per-head mask [B, h, n_q, n_k]
    hm = torch.ones(2, 2, 4, 4, dtype=torch.bool)
    hm[:, 1, :, 0] = False
    w = check_masked_keys_zero(m, inputs.with_arg("mask", hm), hm).weights
    assert (w[:, 0, :, 0] > 0).all()
    # causal
    check_masked_keys_zero(m, [x], torch.ones(1, 4, 4, dtype=torch.bool).tril(), causal=True)
    with pytest.raises(ValueError, match="mask has shape"):
        m(x, mask=torch.ones(2, 3, 4, dtype=torch.bool))
    check_wrong_dtype(m, inputs, "mask", match="mask has dtype")


def test_relative_attention_sparse_alignment() -> None:
    torch.manual_seed(3)
    m = RelativePositionAttention(4, 1, max_distance=1, align="sparsemax").double()
    x = torch.randn(1, 6, 4, dtype=torch.float64) * 5
    w = m(x, need_weights=True).weights
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 6, dtype=torch.float64))
    assert (w == 0).any()
    with pytest.raises(ConfigError, match="deterministic"):
        RelativePositionAttention(4, 1, align="hard")


def test_relative_attention_cross_and_empty() -> None:
    m = RelativePositionAttention(4, 2, max_distance=1, d_k=3)
    check_output(
        m,
        [torch.randn(2, 2, 4), torch.randn(2, 5, 3)],
        context_shape=(2, 2, 4),
        weights_shape=(2, 2, 5),
    )
    empty = check_output(
        m,
        [torch.randn(2, 2, 4), torch.randn(2, 0, 3)],
        context_shape=(2, 2, 4),
        weights_shape=(2, 2, 0),
    )
    torch.testing.assert_close(empty.context, m.out_proj.bias.expand(2, 2, 4))
    assert m(torch.randn(2, 0, 4), torch.randn(2, 5, 3)).context.shape == (2, 0, 4)
    with pytest.raises(ValueError, match=r"key has shape \(2, 5, 4\), expected \[B, n_k, d_k\]"):
        m(torch.randn(2, 2, 4), torch.randn(2, 5, 4))
    with pytest.raises(ValueError, match=r"query has shape \(2, 2, 3\)"):
        m(torch.randn(2, 2, 3))
    with pytest.raises(TypeError, match="dtype"):
        m(torch.randn(2, 2, 4, dtype=torch.float64), torch.randn(2, 5, 3, dtype=torch.float64))


def test_relative_attention_gradcheck() -> None:
    torch.manual_seed(4)
    q = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 2, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    rk = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    rv = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True]] * 3)
    assert torch.autograd.gradcheck(
        lambda *a: relative_position_attention(*a, mask=mask)[0], (q, k, v, rk, rv)
    )
    m = RelativePositionAttention(4, 2, max_distance=1).double()
    x = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x, causal=True).context, (x,))


class _LargestTensor(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_relative_attention_never_forms_an_n_n_d_tensor() -> None:
    n, d, K = 64, 32, 4
    m = RelativePositionAttention(d, 1, max_distance=K)
    x = torch.randn(1, n, d, requires_grad=True)
    with _LargestTensor() as probe:
        m(x, causal=True).context.sum().backward()
    # the largest intermediate is the [n, n] score matrix (4096 elements), far below the
    # [n, n, d] = 131072 of the naive form
    assert n * n <= probe.largest < n * n * d // 8, probe.largest


def test_registry_entries() -> None:
    for name, cls in (
        ("sinusoidal-positions", SinusoidalPositions),
        ("learned-positions", LearnedPositions),
        ("relative-positions", RelativePositionAttention),
        ("rotary-positions", RotaryPositions),
    ):
        assert attnlab.registry.get("query", name).cls is cls
    for module in (
        SinusoidalPositions(6, base=100.0),
        LearnedPositions(7, 6),
        RelativePositionAttention(6, 2, max_distance=3, values=False),
        RotaryPositions(6, interleaved=False),
    ):
        check_rebuild(module)  # same class, config and parameter shapes


# ----------------------------------------------------------------------------- learning


N_TOKENS, A, B_TOKEN, N_FILLERS = 8, 0, 1, 4


def order_batch(count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of 8 tokens with one A and one B among fillers; label = A comes before B."""
    tokens = torch.randint(2, 2 + N_FILLERS, (count, N_TOKENS), generator=gen)
    pos = torch.stack([torch.randperm(N_TOKENS, generator=gen)[:2] for _ in range(count)])
    rows = torch.arange(count)
    tokens[rows, pos[:, 0]] = A
    tokens[rows, pos[:, 1]] = B_TOKEN
    return tokens, (pos[:, 0] < pos[:, 1]).long()


def swapped_pairs(count: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A test set of (sequence, the same sequence with A and B swapped): the two have the
    same tokens, opposite labels, so an order-blind model gets exactly half right."""
    tokens, labels = order_batch(count, gen)
    swapped = tokens.clone()
    swapped[tokens == A] = B_TOKEN
    swapped[tokens == B_TOKEN] = A
    return torch.cat([tokens, swapped]), torch.cat([labels, 1 - labels])


class OrderModel(nn.Module):
    """Embedding (+ positions) -> one self-attention layer (residual) -> mean -> MLP."""

    def __init__(self, kind: str, d: int = 16) -> None:
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(2 + N_FILLERS, d)
        self.absolute = {
            "sinusoidal": SinusoidalPositions(d),
            "learned": LearnedPositions(N_TOKENS, d, init_std=0.5),
        }.get(kind)
        if kind == "relative":
            self.relative = RelativePositionAttention(d, 1, max_distance=N_TOKENS)
        else:
            self.qkv = nn.Linear(d, 3 * d)
            self.attend = attnlab.Attention(score="scaled-dot")
            self.rope = RotaryPositions(d) if kind == "rotary" else None
        self.head = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.absolute is not None:
            x = self.absolute(x)
        if self.kind == "relative":
            c = self.relative(x).context
        else:
            q, k, v = self.qkv(x).chunk(3, -1)
            if self.rope is not None:
                q, k = self.rope(q, k)
            c = self.attend(q, k, v).context
        return self.head((x + c).mean(1))


def train_order_model(kind: str, steps: int = 300) -> float:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = OrderModel(kind)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        tokens, labels = order_batch(64, gen)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    tokens, labels = swapped_pairs(500, torch.Generator().manual_seed(1))
    with torch.no_grad():
        return float((model(tokens).argmax(-1) == labels).float().mean())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sinusoidal", "learned", "relative", "rotary"])
def test_positions_solve_an_order_task_that_attention_alone_cannot(kind) -> None:
    accuracy = train_order_model(kind)
    assert accuracy > 0.9, f"{kind}: {accuracy}"


@pytest.mark.slow
def test_without_positions_the_order_task_is_at_chance() -> None:
    # self-attention + mean pooling is permutation-invariant: on the swapped-pair test set
    # it gets exactly half right whatever it learned
    accuracy = train_order_model("none")
    assert 0.4 <= accuracy <= 0.6, accuracy


def test_empty_sequences() -> None:
    assert sinusoidal_positions(0, 4).shape == (0, 4)
    assert SinusoidalPositions(4)(torch.zeros(2, 0, 4)).shape == (2, 0, 4)
    assert LearnedPositions(3, 4)(torch.zeros(2, 0, 4)).shape == (2, 0, 4)
    assert rotary_embedding(torch.zeros(2, 0, 4)).shape == (2, 0, 4)
    check_output(
        RelativePositionAttention(4, 2, max_distance=1),
        [torch.zeros(2, 0, 4)],
        context_shape=(2, 0, 4),
        weights_shape=(2, 0, 0),
    )
