import math

import pytest
import torch
from attention_harness import (
    Inputs,
    check_all_rows_masked,
    check_learns_against_no_attention,
    check_output,
    check_rebuild,
    naive_softmax,
)
from torch import nn

import attnlab
from attnlab import masks
from attnlab.query.synthesizer import MODES, SynthesizerAttention, default_factors


def _relu(v: float) -> float:
    return v if v > 0 else 0.0


def _logit(m: SynthesizerAttention, x, b: int, h: int, i: int, j: int) -> float:
    """The synthetic logit S_h[i, j] from the paper's formulas, scalar by scalar."""
    d = x.shape[-1]
    if m.mode == "random":
        return float(m.R[h, i, j])
    if m.mode == "factorized-random":
        return sum(float(m.R1[h, i, t] * m.R2[h, j, t]) for t in range(m.rank))
    E = m.hidden
    W1, b1 = m.w1.weight.detach(), m.w1.bias.detach()
    hid = [
        _relu(sum(float(W1[h * E + e, t] * x[b, i, t]) for t in range(d)) + float(b1[h * E + e]))
        for e in range(E)
    ]
    if m.mode == "dense":
        return sum(float(m.w2[h, j, e]) * hid[e] for e in range(E)) + float(m.b2[h, j])
    _, bb = m.factors
    p, r = divmod(j, bb)  # column j of the outer product A (x) B
    A = sum(float(m.wa[h, p, e]) * hid[e] for e in range(E)) + float(m.ba[h, p])
    Bv = sum(float(m.wb[h, r, e]) * hid[e] for e in range(E)) + float(m.bb[h, r])
    return A * Bv


@torch.no_grad()
def _naive(m: SynthesizerAttention, q_in, kv_in, allowed):
    B, n_q, _ = q_in.shape
    n_k = kv_in.shape[1]
    H, hd = m.num_heads, m.head_dim
    V = m.v_proj(kv_in).detach()
    if m.mix_dot:
        Q, K = m.q_proj(q_in).detach(), m.k_proj(kv_in).detach()
    ctx = torch.zeros(B, n_q, H * hd, dtype=q_in.dtype)
    W = torch.zeros(B, H, n_q, n_k, dtype=q_in.dtype)
    for b in range(B):
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            for i in range(n_q):
                sc = {}
                for j in range(n_k):
                    if not allowed[b, i, j]:
                        continue
                    s = _logit(m, q_in, b, h, i, j)
                    if m.mix_dot:
                        a0, a1 = torch.softmax(m.mix[h].detach(), 0).tolist()
                        s = a0 * s + a1 * float(Q[b, i, sl] @ K[b, j, sl]) / math.sqrt(hd)
                    sc[j] = s
                for j, w in naive_softmax(sc).items():  # a fully masked row: none
                    W[b, h, i, j] = w
                    ctx[b, i, sl] += w * V[b, j, sl]
    return m.out_proj(ctx).detach(), W


CASES = [{"mode": mode} for mode in MODES] + [
    {"mode": "dense", "mix_dot": True},
    {"mode": "random", "trainable_random": False},
    {"mode": "factorized-dense", "factors": (2, 4)},
]


@pytest.mark.parametrize("kwargs", CASES, ids=str)
def test_matches_the_formulas_in_loops_with_masks(kwargs):
    torch.manual_seed(0)
    m = SynthesizerAttention(8, 2, max_len=8, rank=3, hidden=5, **kwargs).double().eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    allowed = masks.from_lengths(torch.tensor([5, 3])).expand(2, 5, 5) & masks.causal(5)
    allowed = allowed.clone()
    allowed[0, 2] = False  # a fully masked query row
    out = m(
        x, mask=allowed | ~masks.causal(5), causal=True, need_weights=True, average_weights=False
    )
    ref_ctx, ref_w = _naive(m, x, x, allowed)
    torch.testing.assert_close(out.weights, ref_w)
    torch.testing.assert_close(out.context, ref_ctx)
    assert torch.equal(out.weights[0, :, 2], torch.zeros(2, 5))


def test_cross_attention_addresses_the_key_positions():
    torch.manual_seed(0)
    m = SynthesizerAttention(8, 2, max_len=8, mode="dense", hidden=4).double().eval()
    q = torch.randn(2, 3, 8, dtype=torch.float64)
    kv = torch.randn(2, 6, 8, dtype=torch.float64)
    out = m(q, kv, need_weights=True, average_weights=False)
    ref_ctx, ref_w = _naive(m, q, kv, torch.ones(2, 3, 6, dtype=torch.bool))
    torch.testing.assert_close(out.context, ref_ctx)
    torch.testing.assert_close(out.weights, ref_w)


def test_random_matrices_trainable_or_fixed():
    t = SynthesizerAttention(8, 2, max_len=6, mode="random")
    f = SynthesizerAttention(8, 2, max_len=6, mode="random", trainable_random=False)
    assert isinstance(t.R, nn.Parameter) and t.R.shape == (2, 6, 6)
    assert not isinstance(f.R, nn.Parameter) and "R" in dict(f.named_buffers())
    fr = SynthesizerAttention(8, 2, max_len=6, mode="factorized-random", rank=2)
    assert fr.R1.shape == (2, 6, 2) and fr.R2.shape == (2, 6, 2)
    fd = SynthesizerAttention(8, 2, max_len=12, mode="factorized-dense")
    assert fd.factors == (3, 4) and default_factors(7) == (1, 7)


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_float64(mode):
    torch.manual_seed(0)
    m = SynthesizerAttention(4, 2, max_len=4, mode=mode, rank=2, hidden=3, mix_dot=True).double()
    x = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    mask = masks.from_lengths(torch.tensor([4, 2]))
    assert torch.autograd.gradcheck(lambda a: m(a, mask=mask, causal=True).context, (x,))


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_rows_and_empty_inputs(mode):
    m = SynthesizerAttention(8, 2, max_len=6, mode=mode, bias=False)
    # zero [2, 4, 4] weights, an exactly zero context (no biases), finite gradients
    check_all_rows_masked(m, torch.randn(2, 4, 8), zero_context=True)
    empty = Inputs((torch.randn(2, 0, 8),))
    check_output(m, empty, context_shape=(2, 0, 8), weights_shape=(2, 0, 0))
    out = m(torch.randn(2, 3, 8), torch.randn(2, 0, 8))
    assert torch.equal(out.context, torch.zeros(2, 3, 8))


def test_bad_input_names_the_argument():
    m = SynthesizerAttention(8, 2, max_len=6, mode="random")
    with pytest.raises(ValueError, match=r"key has shape \(2, 7, 8\).*max_len=6"):
        m(torch.randn(2, 3, 8), torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"query has shape \(2, 7, 8\).*max_len=6"):
        m(torch.randn(2, 7, 8), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"query has shape \(2, 3, 4\)"):
        m(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="mask has shape"):
        m(torch.randn(2, 3, 8), mask=torch.ones(2, 3, 2, dtype=torch.bool))
    with pytest.raises(attnlab.ConfigError, match="mode"):
        SynthesizerAttention(8, 2, max_len=6, mode="sparse")
    with pytest.raises(attnlab.ConfigError, match="a \\* b must equal max_len=6"):
        SynthesizerAttention(8, 2, max_len=6, mode="factorized-dense", factors=(2, 2))
    with pytest.raises(attnlab.ConfigError, match="max_len"):
        SynthesizerAttention(8, 2, max_len=0)


def test_registry_round_trip_per_mode():
    for mode in MODES:
        m = SynthesizerAttention(8, 2, max_len=6, mode=mode)
        cfg = m.get_config()
        assert cfg["name"] == "synthesizer" and cfg["mode"] == mode
        check_rebuild(m, mode=mode)  # attnlab.build(cfg): a SynthesizerAttention


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_learns_copy_at_distance_against_no_attention(mode, one_thread):
    """copy-first (benchmarks/variants.py): the first of 32 tokens, asked at the last
    position -- a fixed positional pattern, which every synthesizer learns (the dense
    ones from the query token's logits, the random ones as a learned matrix). No
    attention cannot (chance 1/8)."""
    spec = {"name": "synthesizer", "mode": mode, "max_len": 32}
    # measured: every mode 1.0, no attention ~0.13 (the baseline is trained once)
    check_learns_against_no_attention(spec, "copy-first", n=32, steps=250)
