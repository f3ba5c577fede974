import math

import pytest
import torch
from attention_harness import check_dropout_only_in_training, check_rebuild
from torch import nn

import attnlab
from attnlab import masks
from attnlab.functional import reinforce_loss
from attnlab.query.multi_head import MultiHeadAttention


def _naive_mha(m: MultiHeadAttention, query, key, value, allowed):
    """Multi-head scaled-dot attention written out per head with Python loops."""
    B, n_q, _ = query.shape
    n_k = key.shape[1]
    h, hd, kvh = m.num_heads, m.head_dim, m.num_kv_heads
    Q = m.q_proj(query).detach()
    K = m.k_proj(key).detach()
    V = m.v_proj(value).detach()
    ctx = torch.zeros(B, n_q, h * hd, dtype=query.dtype)
    W = torch.zeros(B, h, n_q, n_k, dtype=query.dtype)
    for b in range(B):
        for j in range(h):
            g = j // (h // kvh)
            for i in range(n_q):
                scores = []
                for l in range(n_k):
                    if allowed is not None and not allowed[b, i, l]:
                        continue
                    s = sum(
                        float(Q[b, i, j * hd + t]) * float(K[b, l, g * hd + t]) for t in range(hd)
                    )
                    scores.append((l, s / math.sqrt(hd)))
                if not scores:
                    continue
                mx = max(s for _, s in scores)
                z = sum(math.exp(s - mx) for _, s in scores)
                for l, s in scores:
                    a = math.exp(s - mx) / z
                    W[b, j, i, l] = a
                    ctx[b, i, j * hd : (j + 1) * hd] += a * V[b, l, g * hd : (g + 1) * hd]
    return m.out_proj(ctx).detach(), W


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_matches_naive_loop_with_gqa_mqa_and_masks(kv_heads):
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 4, num_kv_heads=kv_heads).double().eval()
    B, n_q, n_k = 2, 3, 5
    q = torch.randn(B, n_q, 8, dtype=torch.float64)
    kv = torch.randn(B, n_k, 8, dtype=torch.float64)
    mask = masks.from_lengths(torch.tensor([5, 2]))
    allowed = mask.expand(B, n_q, n_k).clone()
    allowed[0, 1] = False  # a fully masked query row
    out = m(q, kv, mask=allowed, need_weights=True, average_weights=False)
    ref_ctx, ref_w = _naive_mha(m, q, kv, kv, allowed)
    assert out.path == "sdpa"
    torch.testing.assert_close(out.weights, ref_w)
    # a fully masked row has a zero attention context; the output is then out_proj's bias
    torch.testing.assert_close(out.context, ref_ctx)
    assert m.k_proj.weight.shape == (kv_heads * 2, 8)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim", [None, 6])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_same_outputs_and_weights(batch_first, kdim, bias):
    torch.manual_seed(1)
    mha = nn.MultiheadAttention(
        16, 4, batch_first=batch_first, kdim=kdim, vdim=kdim, bias=bias
    ).eval()
    ours = MultiHeadAttention.from_torch(mha).eval()
    B, n_q, n_k = 3, 5, 7
    q = torch.randn(B, n_q, 16)
    k = torch.randn(B, n_k, kdim or 16)
    v = torch.randn(B, n_k, kdim or 16)
    kpm = torch.zeros(B, n_k, dtype=torch.bool)
    kpm[1, 4:] = True
    causal = torch.ones(n_q, n_k, dtype=torch.bool).triu(1)  # torch: True = blocked
    args = (q, k, v) if batch_first else (q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
    ref_out, ref_w = mha(*args, key_padding_mask=kpm, attn_mask=causal, need_weights=True)
    if not batch_first:
        ref_out = ref_out.transpose(0, 1)
    mask = masks.combine(masks.from_key_padding_mask(kpm), ~causal)
    out = ours(q, k, v, mask=mask, need_weights=True)
    torch.testing.assert_close(out.context, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.weights, ref_w, atol=1e-5, rtol=1e-5)


def test_from_torch_rejects_bias_kv():
    mha = nn.MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(mha)
    with pytest.raises(TypeError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))


def test_any_score_per_head_and_own_parameters():
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, score="additive", d_w=5).double().eval()
    assert m.explain()[0] == "per-head:lean-additive"
    w0, w1 = m.heads[0].score.w, m.heads[1].score.w
    assert w0 is not w1 and w0.shape == (5,)
    q = torch.randn(2, 3, 8, dtype=torch.float64)
    out = m(q, causal=True, need_weights=True, average_weights=False)
    # independent computation of head 0 from its own parameters
    Q = m.q_proj(q)[..., :4]
    K = m.k_proj(q)[..., :4]
    sc = m.heads[0].score
    e = (
        torch.tanh((Q @ sc.W1.weight.T + sc.b)[:, :, None, :] + (K @ sc.W2.weight.T)[:, None, :, :])
        @ sc.w
    )
    e = e.masked_fill(~masks.causal(3, 3), float("-inf"))
    a = torch.softmax(e, -1)
    torch.testing.assert_close(out.weights[:, 0], a)
    assert torch.equal(out.weights[:, :, 0, 1:], torch.zeros(2, 2, 2))


def test_hard_heads_return_their_joint_log_prob_for_reinforce():
    """With a stochastic alignment the heads' draws are independent: ``log_prob``
    ``[B, n_q]`` is the sum over the heads of ``log softmax(e_j)`` at the key each head
    drew (computed here from each head's own projections and score, under a key mask),
    and a REINFORCE loss on it trains the query and key projections and every head's
    score (nothing else reaches them: the drawn one-hot weights have no gradient)."""
    torch.manual_seed(0)
    m = MultiHeadAttention(8, 2, score="general", align="hard").double().train()
    q, kv = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 5, 8, dtype=torch.float64)
    mask = masks.from_lengths(torch.tensor([5, 3]))
    out = m(q, kv, kv, mask=mask, need_weights=True, average_weights=False)
    assert out.log_prob is not None and out.log_prob.shape == (2, 3)
    want = torch.zeros(2, 3, dtype=torch.float64)
    for j, head in enumerate(m.heads):
        Q = m.q_proj(q)[..., 4 * j : 4 * j + 4]
        K = m.k_proj(kv)[..., 4 * j : 4 * j + 4]
        e = (Q @ head.score.W.weight.T) @ K.transpose(1, 2)  # general: q^T W k
        logp = torch.log_softmax(e.masked_fill(~mask, float("-inf")), -1)
        drawn = out.weights[:, j].argmax(-1, keepdim=True)
        want = want + logp.gather(-1, drawn)[..., 0]
    torch.testing.assert_close(out.log_prob, want)
    reinforce_loss(out.log_prob, torch.tensor([1.0, -1.0])).backward()
    for name in ("q_proj.weight", "k_proj.weight", "heads.0.score.W.weight"):
        grad = dict(m.named_parameters())[name].grad
        assert grad is not None and bool(grad.abs().sum() > 0), name
    assert MultiHeadAttention(8, 2)(q.float()).log_prob is None  # deterministic: none


def test_general_score_heads_are_fused_and_match_per_head_path():
    torch.manual_seed(0)
    fused = MultiHeadAttention(8, 2, score="general").eval()
    assert fused.explain()[0] == "sdpa"
    q = torch.randn(2, 4, 8)
    out = fused(q, need_weights=True)
    # the same heads through their explicit path
    for h in fused.heads:
        h.path_mode = "explicit"
    fused._fused = False
    ref = fused(q, need_weights=True)
    torch.testing.assert_close(out.context, ref.context, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.weights, ref.weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs", [{}, {"score": "additive", "d_w": 3}, {"num_kv_heads": 1}], ids=str
)
def test_gradcheck_fused_and_per_head(kwargs):
    torch.manual_seed(0)
    m = MultiHeadAttention(4, 2, **kwargs).double()
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    mask = masks.from_lengths(torch.tensor([4, 2]))
    assert torch.autograd.gradcheck(lambda a, b: m(a, b, mask=mask).context, (q, kv))


def test_empty_keys_and_bad_input():
    m = MultiHeadAttention(8, 2)
    out = m(torch.randn(2, 3, 8), torch.randn(2, 0, 8), need_weights=True)
    assert out.weights.shape == (2, 3, 0)
    torch.testing.assert_close(out.context, m.out_proj.bias.expand(2, 3, 8))
    with pytest.raises(ValueError, match=r"query has shape \(2, 3, 7\)"):
        m(torch.randn(2, 3, 7))
    with pytest.raises(ValueError, match=r"key has shape \(3, 4, 8\)"):
        m(torch.randn(2, 3, 8), torch.randn(3, 4, 8))
    with pytest.raises(ValueError, match="mask has shape"):
        m(torch.randn(2, 3, 8), mask=torch.ones(2, 4, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="dtype"):
        m(torch.randn(2, 3, 8), mask=torch.ones(2, 1, 3))
    with pytest.raises(attnlab.ConfigError, match="divisible"):
        MultiHeadAttention(10, 3)
    with pytest.raises(attnlab.ConfigError, match="num_kv_heads"):
        MultiHeadAttention(8, 4, num_kv_heads=3)


def test_dropout_train_vs_eval_and_registry():
    m = MultiHeadAttention(8, 2, dropout=0.5)
    check_dropout_only_in_training(m, [torch.randn(2, 6, 8)])
    cfg = m.get_config()
    assert cfg["name"] == "multi-head" and cfg["kind"] == "query"
    rebuilt = check_rebuild(m, num_heads=2)
    assert isinstance(rebuilt, MultiHeadAttention) and rebuilt.num_heads == 2


@pytest.mark.slow
def test_learns_retrieval_by_content():
    """Each query names a key id; the answer is the value stored under that key.
    Attention solves it; mean pooling over the items (the baseline) cannot."""
    torch.manual_seed(0)
    n_items, n_ids, n_vals, d = 6, 10, 4, 32

    def batch(n):
        ids = torch.stack([torch.randperm(n_ids)[:n_items] for _ in range(n)])
        vals = torch.randint(0, n_vals, (n, n_items))
        pick = torch.randint(0, n_items, (n,))
        return ids, vals, ids[torch.arange(n), pick], vals[torch.arange(n), pick]

    class Model(nn.Module):
        def __init__(self, attend: bool):
            super().__init__()
            self.id_emb = nn.Embedding(n_ids, d)
            self.val_emb = nn.Embedding(n_vals, d)
            self.attend = attend
            self.mha = MultiHeadAttention(d, 4)
            self.out = nn.Linear(d, n_vals)

        def forward(self, ids, vals, query):
            items = self.id_emb(ids) + self.val_emb(vals)
            q = self.id_emb(query)[:, None]
            if self.attend:
                return self.out(self.mha(q, items).context[:, 0])
            return self.out(items.mean(1) + q[:, 0])

    def run(attend):
        torch.manual_seed(0)
        model = Model(attend)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(300):
            ids, vals, query, y = batch(64)
            loss = nn.functional.cross_entropy(model(ids, vals, query), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        ids, vals, query, y = batch(2000)
        with torch.no_grad():
            return (model(ids, vals, query).argmax(-1) == y).float().mean().item()

    acc, base = run(True), run(False)
    # measured: multi-head ~1.0, mean pooling ~0.35 (chance 0.25)
    assert acc > 0.9, acc
    assert base < 0.6, base


# ----------------------------------------------------------------------------- shared projections


def test_the_head_modules_build_their_projections_in_one_place():
    from attnlab.query import (
        LinformerAttention,
        LSHAttention,
        RelativePositionAttention,
        SynthesizerAttention,
        TransformerXLAttention,
    )
    from attnlab.query.multi_head import ProjectedHeadAttention

    modules = {
        "mha": MultiHeadAttention(8, 4, d_k=6, d_v=5, num_kv_heads=2, head_dim=3, out_dim=7),
        "relative": RelativePositionAttention(8, 2, d_k=6, d_v=5, out_dim=7),
        "linformer": LinformerAttention(8, 2, max_len=5, proj_len=3),
        "synthesizer": SynthesizerAttention(8, 2, max_len=5),
        "reformer": LSHAttention(8, 2),
        "transformer-xl": TransformerXLAttention(8, 2, bias=False),
    }
    for name, m in modules.items():
        assert isinstance(m, ProjectedHeadAttention), name
    mha = modules["mha"]  # W_q [d_model -> h d_head], W_k/W_v [d_k, d_v -> h_kv d_head]
    assert (mha.q_proj.in_features, mha.q_proj.out_features) == (8, 4 * 3)
    assert (mha.k_proj.in_features, mha.k_proj.out_features) == (6, 2 * 3)
    assert (mha.v_proj.in_features, mha.v_proj.out_features) == (5, 2 * 3)
    assert (mha.out_proj.in_features, mha.out_proj.out_features) == (4 * 3, 7)
    rel = modules["relative"]
    assert (rel.k_proj.in_features, rel.v_proj.in_features, rel.out_proj.out_features) == (6, 5, 7)
    assert not hasattr(modules["reformer"], "k_proj")  # W_q is shared with the keys
    txl = modules["transformer-xl"]
    assert txl.q_proj.bias is None and txl.out_proj.bias is None and txl.r_proj.bias is None
    with pytest.raises(attnlab.ConfigError, match=r"^num_kv_heads=0 must be >= 1 and divide"):
        MultiHeadAttention(8, 4, num_kv_heads=0)
