import math

import pytest
import torch
from attention_harness import check_learns_against_no_attention, check_rebuild

import attnlab
from attnlab import masks
from attnlab.query.linformer import LinformerAttention


def _naive(m: LinformerAttention, q_in, kv_in, key_ok):
    """Per head h, projected slot s and query i, in loops:
    K'_s = sum_l E[s, l] k_l over allowed keys, V'_s likewise with F,
    a_is = softmax_s(q_i . K'_s / sqrt(d)), c_i = sum_s a_is V'_s."""
    B, n_q, _ = q_in.shape
    n_k = kv_in.shape[1]
    H, hd, k = m.num_heads, m.head_dim, m.proj_len
    Q = m.q_proj(q_in).detach()
    K = m.k_proj(kv_in).detach()
    V = m.v_proj(kv_in).detach()
    E = m.E.detach()
    Fm = (m.E if m.F is None else m.F).detach()
    ctx = torch.zeros(B, n_q, H * hd, dtype=q_in.dtype)
    W = torch.zeros(B, H, n_q, k, dtype=q_in.dtype)
    for b in range(B):
        if not any(key_ok[b, l] for l in range(n_k)):
            continue
        for h in range(H):
            sl = slice(h * hd, (h + 1) * hd)
            Eh = E[h] if E.dim() == 3 else E
            Fh = Fm[h] if Fm.dim() == 3 else Fm
            Kp = [sum(Eh[s, l] * K[b, l, sl] for l in range(n_k) if key_ok[b, l]) for s in range(k)]
            Vp = [sum(Fh[s, l] * V[b, l, sl] for l in range(n_k) if key_ok[b, l]) for s in range(k)]
            for i in range(n_q):
                sc = [float(Q[b, i, sl] @ Kp[s]) / math.sqrt(hd) for s in range(k)]
                mx = max(sc)
                z = sum(math.exp(v - mx) for v in sc)
                for s in range(k):
                    a = math.exp(sc[s] - mx) / z
                    W[b, h, i, s] = a
                    ctx[b, i, sl] += a * Vp[s]
    return m.out_proj(ctx).detach(), W


@pytest.mark.parametrize("share", ["none", "headwise", "key-value"])
def test_matches_naive_loop_with_padding(share):
    torch.manual_seed(0)
    m = LinformerAttention(8, 2, max_len=7, proj_len=3, share=share).double().eval()
    q = torch.randn(2, 4, 8, dtype=torch.float64)
    kv = torch.randn(2, 6, 8, dtype=torch.float64)
    key_ok = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 1, 0, 0]], dtype=torch.bool)
    out = m(q, kv, mask=key_ok[:, None, :], need_weights=True, average_weights=False)
    ref_ctx, ref_w = _naive(m, q, kv, key_ok)
    torch.testing.assert_close(out.context, ref_ctx)
    torch.testing.assert_close(out.weights, ref_w)
    assert out.weights.shape == (2, 2, 4, 3)
    if share == "none":
        assert m.E.shape == (2, 3, 7) and m.F.shape == (2, 3, 7)
    elif share == "headwise":
        assert m.E.shape == (3, 7) and m.F.shape == (3, 7)
    else:
        assert m.E.shape == (3, 7) and m.F is None


def test_padding_equals_the_unpadded_sequence():
    # masked keys are zeroed BEFORE the projection: a padded sequence gives what the
    # shorter sequence gives on its own
    torch.manual_seed(0)
    m = LinformerAttention(8, 2, max_len=10, proj_len=4).eval()
    x = torch.randn(2, 9, 8)
    x[1, 6:] = 100.0  # junk in the padding must not matter
    out = m(x, mask=masks.from_lengths(torch.tensor([9, 6])))
    short = m(x[1:, :6])
    torch.testing.assert_close(out.context[1:, :6], short.context, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.context[:1], m(x[:1]).context)


def test_equal_rows_mask_is_accepted_and_query_dependent_mask_is_refused():
    m = LinformerAttention(8, 2, max_len=6, proj_len=2)
    x = torch.randn(2, 5, 8)
    key = masks.from_lengths(torch.tensor([5, 3]))
    a = m(x, mask=key).context
    b = m(x, mask=key.expand(2, 5, 5)).context
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"differs between queries.*\[B, 1, n_k\]"):
        m(x, mask=masks.causal(5)[None].expand(2, 5, 5))


def test_causal_is_refused():
    m = LinformerAttention(8, 2, max_len=6)
    with pytest.raises(ValueError, match="does not support causal=True"):
        m(torch.randn(2, 5, 8), causal=True)


def test_fully_masked_batch_element_gives_zero_context_not_nan():
    m = LinformerAttention(8, 2, max_len=6, proj_len=3)
    x = torch.randn(2, 5, 8, requires_grad=True)
    mask = torch.tensor([[True] * 5, [False] * 5])[:, None, :]
    out = m(x, mask=mask, need_weights=True)
    assert torch.equal(out.weights[1], torch.zeros(5, 3))
    torch.testing.assert_close(out.context[1], m.out_proj.bias.expand(5, 8))
    out.context.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_empty_inputs():
    m = LinformerAttention(8, 2, max_len=6, proj_len=3)
    out = m(torch.randn(2, 3, 8), torch.randn(2, 0, 8), need_weights=True)
    torch.testing.assert_close(out.context, m.out_proj.bias.expand(2, 3, 8))
    assert torch.equal(out.weights, torch.zeros(2, 3, 3))
    out = m(torch.randn(2, 0, 8), torch.randn(2, 4, 8))
    assert out.context.shape == (2, 0, 8)


def test_gradcheck_float64():
    torch.manual_seed(0)
    m = LinformerAttention(4, 2, max_len=5, proj_len=2, share="none").double()
    x = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    mask = masks.from_lengths(torch.tensor([5, 2]))
    assert torch.autograd.gradcheck(lambda a, b: m(a, b, mask=mask).context, (x, kv))


def test_bad_input_names_the_argument():
    m = LinformerAttention(8, 2, max_len=6)
    x = torch.randn(2, 5, 8)
    # self-attention: the keys are the query, and the message says so
    with pytest.raises(
        ValueError, match=r"query \(the keys of self-attention\) has shape \(2, 7, 8\).*max_len=6"
    ):
        m(torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"^key has shape \(2, 7, 8\).*max_len=6"):
        m(x, torch.randn(2, 7, 8))
    with pytest.raises(ValueError, match=r"value has shape \(2, 4, 8\)"):
        m(x, x, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"key has shape \(3, 5, 8\)"):
        m(x, torch.randn(3, 5, 8))
    with pytest.raises(ValueError, match="mask has shape"):
        m(x, mask=torch.ones(2, 1, 4, dtype=torch.bool))
    with pytest.raises(attnlab.ConfigError, match="share"):
        LinformerAttention(8, 2, max_len=6, share="layerwise")
    with pytest.raises(attnlab.ConfigError, match="proj_len"):
        LinformerAttention(8, 2, max_len=6, proj_len=0)


def test_registry_round_trip():
    m = LinformerAttention(8, 2, max_len=6, proj_len=3, share="key-value")
    cfg = m.get_config()
    assert cfg["name"] == "linformer" and cfg["share"] == "key-value"
    rebuilt = check_rebuild(m)
    assert isinstance(rebuilt, LinformerAttention) and rebuilt.F is None


@pytest.mark.slow
def test_learns_copy_at_distance_against_no_attention(one_thread):
    """copy-first (benchmarks/variants.py): the first of 32 tokens, asked at the last
    position. Linformer with k = 8 projected positions solves it (a projection row can
    keep position 0); no attention cannot (chance 1/8)."""
    spec = {"name": "linformer", "max_len": 32, "proj_len": 8}
    # measured: linformer 1.0, no attention ~0.13
    check_learns_against_no_attention(spec, "copy-first", n=32, steps=250)
