import math

import pytest
import torch
from attention_harness import (
    Inputs,
    check_all_rows_masked,
    check_dropout_only_in_training,
    check_learns_against_no_attention,
    check_masked_keys_zero,
    check_output,
    check_rebuild,
    check_wrong_dtype,
    naive_softmax,
)
from torch import nn

import attnlab
from attnlab import masks
from attnlab.query.transformer import TransformerEncoderLayer
from attnlab.query.transformer_xl import TransformerXLAttention, rel_shift, sinusoid_encoding


def _sinusoid(t: int, d: int) -> list[float]:
    """R_t written out: sin over the first half, cos over the second."""
    half = (d + 1) // 2
    freqs = [10000.0 ** (-2.0 * k / d) for k in range(half)]
    return ([math.sin(t * f) for f in freqs] + [math.cos(t * f) for f in freqs])[:d]


def _naive(m: TransformerXLAttention, x, memory, allowed):
    """The paper's four terms (a) + (b) + (c) + (d) per head, query and key, in loops."""
    B, n, d = x.shape
    h_ = x if memory is None else torch.cat([memory, x], 1)
    M = h_.shape[1] - n
    H, hd = m.num_heads, m.head_dim
    Q = m.q_proj(x).detach()
    K = m.k_proj(h_).detach()
    V = m.v_proj(h_).detach()
    Wr = m.r_proj.weight.detach()  # [H*hd, d]
    u = m.content_bias.detach()
    v = m.position_bias.detach()
    W = torch.zeros(B, H, n, M + n, dtype=x.dtype)
    ctx = torch.zeros(B, n, H * hd, dtype=x.dtype)
    for b in range(B):
        for j in range(H):
            sl = slice(j * hd, (j + 1) * hd)
            for i in range(n):
                scores = {}
                for key in range(M + n):
                    if not allowed[b, i, key]:
                        continue
                    R = torch.tensor(_sinusoid(M + i - key, d), dtype=x.dtype)
                    r = Wr[sl] @ R  # W_{k,R} R_{i-j}
                    q, k = Q[b, i, sl], K[b, key, sl]
                    a = float(q @ k)  # (a) content-content
                    bb = float(q @ r)  # (b) content-position
                    c = float(u[j] @ k)  # (c) global content bias
                    dd = float(v[j] @ r)  # (d) global position bias
                    scores[key] = (a + bb + c + dd) / math.sqrt(hd)
                for key, w in naive_softmax(scores).items():  # a fully masked row: none
                    W[b, j, i, key] = w
                    ctx[b, i, sl] += w * V[b, key, sl]
    return m.out_proj(ctx).detach(), W


def test_sinusoid_encoding_formula():
    t = torch.tensor([0, 3, -2])
    enc = sinusoid_encoding(t, 6)
    want = torch.tensor([_sinusoid(int(s), 6) for s in t], dtype=torch.float64)
    torch.testing.assert_close(enc, want)
    assert sinusoid_encoding(t, 5).shape == (3, 5)


@pytest.mark.parametrize("n,n_k,L", [(3, 3, 5), (3, 5, 7), (4, 6, 6), (1, 4, 4), (2, 2, 3)])
def test_rel_shift_matches_index_loop(n, n_k, L):
    torch.manual_seed(0)
    x = torch.randn(2, 3, n, L)
    out = rel_shift(x, n_k)
    assert out.shape == (2, 3, n, n_k)
    for i in range(n):
        for j in range(n_k):
            t = n - 1 - i + j  # distance (n_k - n + i) - j sits at column n_k - 1 - distance
            if 0 <= t < L:
                assert torch.equal(out[..., i, j], x[..., i, t]), (i, j)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_memory", [False, True])
def test_matches_the_four_term_formula_in_loops(causal, with_memory):
    torch.manual_seed(0)
    m = TransformerXLAttention(6, 2, mem_len=3).double().eval()
    B, n = 2, 4
    x = torch.randn(B, n, 6, dtype=torch.float64)
    mem = torch.randn(B, 3, 6, dtype=torch.float64) if with_memory else None
    M = 3 if with_memory else 0
    allowed = torch.ones(B, n, M + n, dtype=torch.bool)
    allowed[1, :, M + 2 :] = False  # padding of batch element 1
    allowed[0, 2] = False  # a fully masked query row
    if causal:
        allowed &= masks.causal(n, M + n)
    user_mask = allowed if not causal else allowed | ~masks.causal(n, M + n)
    out = m(x, mask=user_mask, causal=causal, need_weights=True, average_weights=False, memory=mem)
    ref_ctx, ref_w = _naive(m, x, mem, allowed)
    torch.testing.assert_close(out.weights, ref_w)
    torch.testing.assert_close(out.context, ref_ctx)
    assert torch.equal(out.weights[0, :, 2], torch.zeros(2, M + n))


def test_segment_with_memory_equals_the_last_rows_of_the_whole_sequence():
    # relative positions make the second segment's attention over [memory; segment] the
    # same computation as its rows of attention over the concatenated sequence
    torch.manual_seed(1)
    m = TransformerXLAttention(8, 2, mem_len=5).eval()
    x1, x2 = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    for causal in (True, False):
        first = m(x1, causal=causal)
        assert first.extras["memory"].shape == (2, 5, 8)
        second = m(x2, memory=first.extras["memory"], causal=causal)
        whole = m(torch.cat([x1, x2], 1), causal=causal)
        # (bidirectionally the rows of x1 in `whole` also see x2; the rows of x2 are equal)
        torch.testing.assert_close(second.context, whole.context[:, 5:], atol=1e-5, rtol=1e-5)


def test_memory_is_detached_truncated_and_optional():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, requires_grad=True)
    m = TransformerXLAttention(8, 2, mem_len=6)
    out = m(x)
    assert out.extras["memory"].shape == (2, 4, 8) and not out.extras["memory"].requires_grad
    torch.testing.assert_close(out.extras["memory"], x.detach())
    mem = torch.randn(2, 5, 8, requires_grad=True)
    out = m(x, memory=mem)
    torch.testing.assert_close(out.extras["memory"], torch.cat([mem[:, 3:], x], 1).detach())
    out.context.sum().backward()
    assert mem.grad is None  # stop-gradient on the memory
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert TransformerXLAttention(8, 2)(x).extras["memory"] is None  # mem_len = 0


def test_segment_mask_is_extended_over_the_memory():
    torch.manual_seed(0)
    m = TransformerXLAttention(8, 2).eval()
    x, mem = torch.randn(2, 3, 8), torch.randn(2, 2, 8)
    seg = masks.from_lengths(torch.tensor([3, 2]))  # [B, 1, n]: the segment only
    full = torch.cat([torch.ones(2, 1, 2, dtype=torch.bool), seg], -1)
    segment_only = Inputs((x,), {"memory": mem, "mask": seg})
    a = check_output(m, segment_only, context_shape=(2, 3, 8), weights_shape=(2, 3, 5))
    check_masked_keys_zero(m, segment_only, full)  # e.g. a.weights[1, :, 4] (padding) is 0
    b = m(x, memory=mem, mask=full, need_weights=True)
    torch.testing.assert_close(a.context, b.context)


@pytest.mark.parametrize("n", [1, 4])
def test_masks_that_broadcast_over_the_keys_with_memory(n):
    """With a memory, a mask whose key axis is 1 (per query row ``[B, n, 1]``, the scalar
    ``True``, ``[B, 1, 1]``) broadcasts over all ``M + n`` keys: all-True changes nothing,
    and a row masked out is a zero row (it once cleared the query with a ``[B, 0]`` key
    slice: an error for ``n > 1``, an empty output for ``n == 1``)."""
    torch.manual_seed(0)
    m = TransformerXLAttention(8, 2).eval()
    x, mem = torch.randn(2, n, 8), torch.randn(2, 3, 8)
    want = m(x, memory=mem, need_weights=True)
    for mask in (torch.ones(2, n, 1, dtype=torch.bool), torch.tensor(True),
                 torch.ones(2, 1, 1, dtype=torch.bool)):  # fmt: skip
        got = m(x, memory=mem, mask=mask, need_weights=True)
        assert got.context.shape == (2, n, 8)
        torch.testing.assert_close(got.context, want.context)
        torch.testing.assert_close(got.weights, want.weights)
    rows = torch.ones(2, n, 1, dtype=torch.bool)
    rows[1, -1] = False  # the last query of the second sequence attends nothing
    got = m(x, memory=mem, mask=rows, need_weights=True)
    assert (got.weights[1, -1] == 0).all() and (got.context[1, -1] == 0).all()
    torch.testing.assert_close(got.context[0], want.context[0])
    torch.testing.assert_close(got.context[1, :-1], want.context[1, :-1])


def test_gradcheck_with_memory_mask_and_causal():
    torch.manual_seed(0)
    m = TransformerXLAttention(4, 2, mem_len=2).double()
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    mem = torch.randn(2, 2, 4, dtype=torch.float64)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[1, 0] = False  # a fully masked row: zero, finite gradients
    assert torch.autograd.gradcheck(
        lambda a: m(a, memory=mem, mask=mask, causal=True).context, (x,)
    )
    assert torch.autograd.gradcheck(lambda a: m(a).context, (x,))


def test_fully_masked_rows_are_zero_not_nan():
    m = TransformerXLAttention(8, 2)
    # zero [2, 3, 3] weights, finite gradients and an exactly zero context: no biases in
    # the paper's projections
    check_all_rows_masked(m, torch.randn(2, 3, 8), zero_context=True)


def test_empty_segment_and_memory_update():
    m = TransformerXLAttention(8, 2, mem_len=3)
    empty = Inputs((torch.randn(2, 0, 8),))
    check_output(m, empty, context_shape=(2, 0, 8), weights_shape=(2, 0, 0))
    mem = torch.randn(2, 4, 8)
    out = m(torch.randn(2, 0, 8), memory=mem)
    assert out.context.shape == (2, 0, 8)
    torch.testing.assert_close(out.extras["memory"], mem[:, 1:])


def test_bad_input_names_the_argument():
    m = TransformerXLAttention(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match=r"query has shape \(2, 3, 7\)"):
        m(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match="self-attention only: key"):
        m(x, torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match=r"memory has shape \(3, 2, 8\)"):
        m(x, memory=torch.randn(3, 2, 8))
    with pytest.raises(ValueError, match="mask has shape"):
        m(x, mask=torch.ones(2, 3, 4, dtype=torch.bool))
    key_mask = torch.ones(2, 1, 3, dtype=torch.bool)
    check_wrong_dtype(m, Inputs((x,), {"mask": key_mask}), "mask", match="mask has dtype")
    check_wrong_dtype(m, Inputs((x,)), "query", match=r"query has dtype torch\.float64")
    with pytest.raises(attnlab.ConfigError, match="mem_len"):
        TransformerXLAttention(8, 2, mem_len=-1)
    with pytest.raises(attnlab.ConfigError, match="divisible"):
        TransformerXLAttention(10, 3)


def test_registry_and_config_round_trip():
    m = TransformerXLAttention(8, 2, mem_len=4, dropout=0.1)
    cfg = m.get_config()
    assert cfg["name"] == "transformer-xl" and cfg["kind"] == "query" and cfg["mem_len"] == 4
    check_rebuild(m, mem_len=4)  # attnlab.build(cfg): a TransformerXLAttention
    assert attnlab.registry.get("query", "txl").cls is TransformerXLAttention


def test_dropout_only_in_training():
    m = TransformerXLAttention(8, 2, dropout=0.5)
    check_dropout_only_in_training(m, [torch.randn(2, 6, 8)])


class _SegmentModel(nn.Module):
    """Embedding + one pre-norm encoder layer with Transformer-XL attention + classifier
    read at the last position; the layer's memory carries the previous segment."""

    def __init__(self, vocab: int, d: int, mem_len: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab + 1, d)
        self.layer = TransformerEncoderLayer(
            d,
            2,
            attention="transformer-xl",
            attention_options={"mem_len": mem_len},
            dim_feedforward=2 * d,
            dropout=0.0,
            norm_first=True,
        )
        self.head = nn.Linear(d, vocab)

    def forward(self, seg1, seg2, use_memory: bool):
        mem = self.layer(self.emb(seg1), causal=True).extras["memory"]
        out = self.layer(self.emb(seg2), causal=True, memory=mem if use_memory else None)
        return self.head(out.context[:, -1])


@pytest.mark.slow
def test_learns_to_recall_a_token_from_the_previous_segment(one_thread):
    """Two segments of 12 tokens; the answer is the first token of the FIRST segment,
    asked at the end of the second. With the segment memory (mem_len = 12) Transformer-XL
    sees it; without the memory (the baseline) the answer is out of reach (chance 1/8)."""
    vocab, n = 8, 12

    def batch(size, gen):
        seg1 = torch.randint(0, vocab, (size, n), generator=gen)
        seg2 = torch.randint(0, vocab, (size, n), generator=gen)
        seg2[:, -1] = vocab  # the query token
        return seg1, seg2, seg1[:, 0].clone()

    def run(use_memory: bool) -> float:
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        model = _SegmentModel(vocab, 32, mem_len=n)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(250):
            s1, s2, y = batch(64, gen)
            loss = nn.functional.cross_entropy(model(s1, s2, use_memory), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        s1, s2, y = batch(2000, torch.Generator().manual_seed(1))
        with torch.no_grad():
            return (model(s1, s2, use_memory).argmax(-1) == y).float().mean().item()

    acc, base = run(True), run(False)
    # measured: with memory ~1.0, without ~0.13 (chance 0.125)
    assert acc > 0.9, acc
    assert base < 0.3, base


@pytest.mark.slow
def test_learns_copy_at_distance_against_no_attention(one_thread):
    """copy-first (benchmarks/variants.py): answer the first of 32 tokens at the last
    position. Transformer-XL (relative positions only) solves it; no attention cannot."""
    # measured: transformer-xl 1.0, no attention ~0.13 (chance 0.125)
    check_learns_against_no_attention("transformer-xl", "copy-first", n=32, steps=250)
