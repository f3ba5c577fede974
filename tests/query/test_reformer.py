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

import attnlab
from attnlab import masks
from attnlab.query.reformer import LSHAttention, lsh_buckets


def _heads(m: LSHAttention, x):
    B, n, _ = x.shape
    H, hd = m.num_heads, m.head_dim
    Q = m.q_proj(x).detach().view(B, n, H, hd)
    V = m.v_proj(x).detach().view(B, n, H, hd)
    return Q, V


def _finish(m: LSHAttention, ctx):
    """out_proj of the per-head contexts [B, n, H, hd]."""
    B, n = ctx.shape[:2]
    return m.out_proj(ctx.reshape(B, n, -1)).detach()


def _naive_full_without_self(m: LSHAttention, x, allowed):
    """Full shared-QK attention: k_j = q_j / |q_j|, s_ij = q_i . k_j / sqrt(d), j != i,
    falling back to j = i only when nothing else is allowed."""
    B, n, _ = x.shape
    Q, V = _heads(m, x)
    ctx = torch.zeros(B, n, m.num_heads, m.head_dim, dtype=x.dtype)
    for b in range(B):
        for h in range(m.num_heads):
            for i in range(n):
                others = [j for j in range(n) if j != i and allowed[b, i, j]]
                keys = others or ([i] if allowed[b, i, i] else [])  # may be none
                s = {
                    j: float(Q[b, i, h] @ (Q[b, j, h] / Q[b, j, h].norm())) / math.sqrt(m.head_dim)
                    for j in keys
                }
                for j, w in naive_softmax(s).items():
                    ctx[b, i, h] += w * V[b, j, h]
    return _finish(m, ctx)


def _naive_lsh(m: LSHAttention, x, buckets, nb, allowed, causal):
    """Per round, in loops: sort by (bucket, position) -- padding (a position no query may
    attend) sorted as if in the extra last bucket ``nb`` --, chunks of bucket_size, window =
    own chunk + previous chunk, same bucket, not masked, causal; s_ii = -1e5; rounds
    combined with exp(lse_r - logsumexp_r lse_r). Returns (output, weights [B,H,n,n])."""
    B, n, _ = x.shape
    H, hd, c, R = m.num_heads, m.head_dim, m.bucket_size, m.n_hashes
    Q, V = _heads(m, x)
    n_pad = math.ceil(n / c) * c
    ctx = torch.zeros(B, n, H, hd, dtype=x.dtype)
    W = torch.zeros(B, H, n, n, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            per_round = []  # (lse [n], weights {i: {j: w}})
            for r in range(R):
                bk = [int(buckets[b, h, r, i]) for i in range(n)] + [nb] * (n_pad - n)
                sort_bk = [bk[p] if p >= n or allowed[b, :, p].any() else nb for p in range(n_pad)]
                order = sorted(range(n_pad), key=lambda p, sb=sort_bk: (sb[p], p))
                lse, wts = [-math.inf] * n, {}
                for s, i in enumerate(order):
                    if i >= n:
                        continue
                    t = s // c
                    slots = list(range(max(t - 1, 0) * c, (t + 1) * c))
                    keys = []
                    for s2 in slots:
                        j = order[s2]
                        if j >= n or not allowed[b, i, j] or (causal and j > i):
                            continue
                        if m.restrict_to_bucket and bk[j] != bk[i]:
                            continue
                        kj = Q[b, j, h] / Q[b, j, h].norm()
                        sc = -1e5 if j == i else float(Q[b, i, h] @ kj) / math.sqrt(hd)
                        keys.append((j, sc))
                    if not keys:
                        continue
                    mx = max(v for _, v in keys)
                    z = sum(math.exp(v - mx) for _, v in keys)
                    lse[i] = mx + math.log(z)
                    wts[i] = {j: math.exp(v - mx) / z for j, v in keys}
                per_round.append((lse, wts))
            for i in range(n):
                finite = [lse[i] for lse, _ in per_round if lse[i] > -math.inf]
                if not finite:
                    continue
                mx = max(finite)
                total = mx + math.log(sum(math.exp(v - mx) for v in finite))
                for lse, wts in per_round:
                    if lse[i] == -math.inf:
                        continue
                    rw = math.exp(lse[i] - total)
                    for j, w in wts[i].items():
                        W[b, h, i, j] += rw * w
                        ctx[b, i, h] += rw * w * V[b, j, h]
    return _finish(m, ctx), W


def test_buckets_are_argmax_of_the_rotations_in_loops():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4)  # [B, h, n, d]
    rot = torch.randn(3, 4, 2, 3)  # [h, d, rounds, n_buckets/2]
    got = lsh_buckets(x, rot)
    assert got.shape == (2, 3, 2, 5)
    for b in range(2):
        for h in range(3):
            for r in range(2):
                for i in range(5):
                    proj = [float(x[b, h, i] @ rot[h, :, r, k]) for k in range(3)]
                    both = proj + [-p for p in proj]
                    assert int(got[b, h, r, i]) == max(range(6), key=both.__getitem__)


@pytest.mark.parametrize("causal", [False, True])
def test_one_bucket_equals_full_shared_qk_attention_without_self(causal):
    torch.manual_seed(0)
    m = LSHAttention(8, 2, bucket_size=8, n_hashes=3, num_buckets=1).double().eval()
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    allowed = masks.from_lengths(torch.tensor([7, 5])).expand(2, 7, 7).clone()
    allowed[0, 3] = False  # a fully masked query row
    out = m(x, mask=allowed, causal=causal)
    ref = _naive_full_without_self(m, x, allowed & masks.causal(7) if causal else allowed)
    torch.testing.assert_close(out.context, ref)


@pytest.mark.parametrize(
    "n,bucket_size,causal,mask_kind,restrict",
    [
        (12, 4, False, None, True),
        (10, 4, True, "key", True),  # n not a multiple of the chunk: padding
        (11, 3, False, "full", True),
        (9, 4, True, "full", False),
    ],
)
def test_matches_naive_per_round_implementation(n, bucket_size, causal, mask_kind, restrict):
    torch.manual_seed(n)
    m = (
        LSHAttention(
            8,
            2,
            bucket_size=bucket_size,
            n_hashes=3,
            num_buckets=4,
            seed=5,
            restrict_to_bucket=restrict,
        )
        .double()
        .eval()
    )
    x = torch.randn(2, n, 8, dtype=torch.float64)
    if mask_kind is None:
        mask, allowed = None, torch.ones(2, n, n, dtype=torch.bool)
    elif mask_kind == "key":
        mask = masks.from_lengths(torch.tensor([n, n - 3]))
        allowed = mask.expand(2, n, n)
    else:
        mask = torch.rand(2, n, n) > 0.3
        mask[1, 2] = False  # a fully masked row
        allowed = mask
    out = m(x, mask=mask, causal=causal, need_weights=True, average_weights=False)
    ref_out, ref_w = _naive_lsh(m, x, out.extras["buckets"], 4, allowed, causal)
    torch.testing.assert_close(out.context, ref_out)
    torch.testing.assert_close(out.weights, ref_w)
    # the buckets came from the recorded rotations
    Q = m.q_proj(x).detach().view(2, n, 2, 4).transpose(1, 2)
    assert torch.equal(out.extras["buckets"], lsh_buckets(Q, out.extras["rotations"]))


def test_weights_reproduce_the_context():
    torch.manual_seed(0)
    m = LSHAttention(8, 2, bucket_size=4, n_hashes=2, seed=0).double().eval()
    x = torch.randn(2, 13, 8, dtype=torch.float64)
    out = m(x, causal=True, need_weights=True, average_weights=False)
    assert out.extras["num_buckets"] == 4  # ceil(13 / 4) = 4 chunks -> 4 buckets
    V = m.v_proj(x).view(2, 13, 2, 4).transpose(1, 2)
    ctx = (out.weights @ V).transpose(1, 2).reshape(2, 13, 8)
    torch.testing.assert_close(out.context, m.out_proj(ctx))
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2, 2, 13, dtype=torch.float64))
    assert torch.equal(out.weights.triu(1), torch.zeros_like(out.weights))  # causal


@pytest.mark.parametrize("num_buckets", [None, 4])
def test_finite_values_in_the_padding_never_matter(num_buckets):
    """Padded positions are sorted after every real one, so whatever finite values they
    hold (hashed to any bucket) they take no real position's place in a chunk: the real
    outputs are those with zeros there. (Found by tests/test_invariances.py: the padding
    used to be sorted among the real positions and moved real keys out of their chunks.)"""
    torch.manual_seed(0)
    m = LSHAttention(8, 2, bucket_size=2, n_hashes=2, num_buckets=num_buckets).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 8, 8, generator=g)
    mask = masks.from_lengths(torch.tensor([8, 5, 3]))
    real = mask[:, 0, :]

    def run(fill: torch.Tensor) -> torch.Tensor:
        xx = torch.where(real[..., None], x, fill)
        return m(xx, mask=mask, generator=torch.Generator().manual_seed(0)).context[real]

    want = run(torch.zeros(()))
    for scale in (1.0, 1e3):
        torch.testing.assert_close(run(scale * torch.randn(x.shape, generator=g)), want)


def test_with_fixed_num_buckets_appended_padding_changes_nothing():
    """With ``num_buckets`` fixed, the real outputs and weights of a sequence padded with
    masked positions (holding anything) are those of the sequence alone."""
    torch.manual_seed(0)
    m = LSHAttention(8, 2, bucket_size=2, n_hashes=2, num_buckets=4).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 8, generator=g)
    padded = torch.cat([x, 1e3 * torch.randn(2, 3, 8, generator=g)], 1)
    mask = masks.from_lengths(torch.tensor([5, 5]), max_len=8)
    a = m(x, need_weights=True, generator=torch.Generator().manual_seed(0))
    b = m(padded, mask=mask, need_weights=True, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(b.context[:, :5], a.context)
    torch.testing.assert_close(b.weights[:, :5, :5], a.weights)
    assert torch.equal(b.weights[:, :5, 5:], torch.zeros(2, 5, 3))


def test_deterministic_with_seed_or_generator():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 8)
    fixed = LSHAttention(8, 2, bucket_size=4, seed=3).eval()
    a, b = fixed(x), fixed(x)
    assert torch.equal(a.context, b.context) and torch.equal(
        a.extras["buckets"], b.extras["buckets"]
    )
    free = LSHAttention(8, 2, bucket_size=4).eval()
    g1 = free(x, generator=torch.Generator().manual_seed(7))
    g2 = free(x, generator=torch.Generator().manual_seed(7))
    g3 = free(x, generator=torch.Generator().manual_seed(8))
    assert torch.equal(g1.context, g2.context)
    assert not torch.equal(g1.extras["rotations"], g3.extras["rotations"])
    torch.manual_seed(1)
    r1 = free(x).extras["rotations"]
    torch.manual_seed(1)
    assert torch.equal(r1, free(x).extras["rotations"])


def test_seeded_rotations_are_the_seeds_cpu_draw_made_once():
    """A seeded module uses the CPU generator's draw for its seed on every device (so CPU
    and CUDA hash alike), made once per shape, seed, device and dtype: a caller changing
    the rotations it got back, or a new seed, never leaves stale rotations behind."""
    m = LSHAttention(8, 2, bucket_size=4, n_hashes=2, seed=3).eval()
    x = torch.randn(2, 16, 8)
    shape = (m.num_heads, m.head_dim, m.n_hashes, m.buckets_for(16) // 2)
    want = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    first = m(x).extras["rotations"]
    assert torch.equal(first, want)
    first.zero_()  # the caller's copy, not the module's
    assert torch.equal(m(x).extras["rotations"], want)
    assert torch.equal(m.double()(x.double()).extras["rotations"], want.double())
    m.seed = 4
    again = torch.randn(shape, generator=torch.Generator().manual_seed(4)).double()
    assert torch.equal(m(x.double()).extras["rotations"], again)
    assert "_seeded" not in m.state_dict()


def test_seeded_rotations_with_fixed_buckets_are_a_buffer():
    """With ``seed`` and ``num_buckets`` the rotations are the buffer ``rotations``: the
    seed's CPU draw, moved and converted with the module, saved in its checkpoint (one
    saved without it loads the seed's draw), drawn again by ``reset_parameters`` after the
    meta device, and handed to the caller as a copy. A seed changed afterwards is used."""
    m = LSHAttention(8, 2, bucket_size=4, n_hashes=2, num_buckets=4, seed=3).eval()
    want = torch.randn(2, 4, 2, 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(m.rotations, want)
    x = torch.randn(2, 16, 8)
    got = m(x).extras["rotations"]
    assert torch.equal(got, want)
    got.zero_()  # the caller's copy, not the buffer
    assert torch.equal(m.rotations, want)
    assert torch.equal(m.state_dict()["rotations"], want)
    old = {k: v for k, v in m.state_dict().items() if k != "rotations"}
    other = LSHAttention(8, 2, bucket_size=4, n_hashes=2, num_buckets=4, seed=3)
    other.rotations.zero_()
    other.load_state_dict(old)  # strict: the missing buffer is the seed's draw
    assert torch.equal(other.rotations, want)
    wide = m.double()
    assert wide.rotations.dtype == torch.float64
    assert torch.equal(wide(x.double()).extras["rotations"], want.double())
    with torch.device("meta"):
        meta = LSHAttention(8, 2, bucket_size=4, n_hashes=2, num_buckets=4, seed=3)
    assert meta.rotations.is_meta
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    assert torch.equal(meta.rotations, want)
    m.seed = 4
    again = torch.randn(2, 4, 2, 2, generator=torch.Generator().manual_seed(4)).double()
    assert torch.equal(m(x.double()).extras["rotations"], again)
    assert LSHAttention(8, 2, seed=3).rotations is None  # num_buckets follows n: drawn per n


@pytest.mark.parametrize("traced", [6, 5])
def test_seeded_onnx_export_serves_every_length(traced):
    """Exported to ONNX (``dynamo=True``, dynamic batch and length) at an even or odd
    length, a seeded LSH attention with fixed buckets gives the eager outputs at lengths
    of either parity (whole chunks or a padded last chunk), under a key padding mask.
    Needs the ``onnx`` extra."""
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript")
    pytest.importorskip("onnxruntime", reason="the graph runs in onnxruntime")
    from attention_harness import onnx_session
    from torch.export import Dim

    class Call(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lsh = LSHAttention(8, 2, bucket_size=2, num_buckets=4, seed=3)

        def forward(self, x, mask):
            return self.lsh(x, mask=mask).context

    torch.manual_seed(0)
    module = Call().eval()
    x, mask = torch.randn(3, traced, 8), masks.from_lengths(torch.tensor([traced, 4, 2]))
    dynamic = ({0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO, 2: Dim.AUTO})
    session = onnx_session(module, (x, mask), {}, dynamic_shapes=dynamic)
    names = [i.name for i in session.get_inputs()]
    for n in (traced, 9, 8, 3):
        x, mask = torch.randn(2, n, 8), masks.from_lengths(torch.tensor([n, n - 1]))
        (got,) = session.run(None, dict(zip(names, (x.numpy(), mask.numpy()), strict=True)))
        with torch.no_grad():
            want = module(x, mask)
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-5, rtol=1e-5)


def test_gradcheck_float64():
    torch.manual_seed(0)
    m = LSHAttention(4, 2, bucket_size=3, n_hashes=2, num_buckets=2, seed=1).double()
    x = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    mask = masks.from_lengths(torch.tensor([7, 4]))
    assert torch.autograd.gradcheck(lambda a: m(a, mask=mask).context, (x,))
    assert torch.autograd.gradcheck(lambda a: m(a, causal=True).context, (x,))


def test_fully_masked_rows_are_zero_not_nan():
    m = LSHAttention(8, 2, bucket_size=4, bias=False)
    # zero [2, 8, 8] weights, an exactly zero context (no biases), finite gradients
    check_all_rows_masked(m, torch.randn(2, 8, 8), zero_context=True)


def test_self_only_when_nothing_else():
    # with a mask allowing only the diagonal, every query attends to itself (weight 1)
    m = LSHAttention(8, 2, bucket_size=4, seed=0).eval()
    x = torch.randn(1, 8, 8)
    out = m(x, mask=torch.eye(8, dtype=torch.bool)[None], need_weights=True)
    torch.testing.assert_close(out.weights, torch.eye(8)[None])


def test_empty_sequence():
    m = LSHAttention(8, 2, bucket_size=4)
    check_output(
        m, Inputs((torch.randn(2, 0, 8),)), context_shape=(2, 0, 8), weights_shape=(2, 0, 0)
    )


def test_bad_input_names_the_argument():
    m = LSHAttention(8, 2, bucket_size=4)
    x = torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"query has shape \(2, 6\)"):
        m(torch.randn(2, 6))
    with pytest.raises(ValueError, match=r"self-attention only: key .* \(2, 6, 8\)"):
        m(x, x.clone())
    with pytest.raises(ValueError, match="mask has shape"):
        m(x, mask=torch.ones(2, 6, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="generator"):
        m(x, generator=3)
    with pytest.raises(attnlab.ConfigError, match="num_buckets must be 1 or even"):
        LSHAttention(8, 2, num_buckets=3)
    with pytest.raises(attnlab.ConfigError, match="bucket_size"):
        LSHAttention(8, 2, bucket_size=0)


def test_registry_round_trip():
    m = LSHAttention(8, 2, bucket_size=4, n_hashes=3, seed=2)
    cfg = m.get_config()
    assert cfg["name"] == "reformer" and cfg["n_hashes"] == 3
    check_rebuild(m, seed=2)  # attnlab.build(cfg): an LSHAttention with seed 2
    assert attnlab.registry.get("query", "lsh").cls is LSHAttention


@pytest.mark.slow
def test_learns_flag_recall_against_no_attention(one_thread):
    """flag-recall (benchmarks/variants.py): 31 random tokens, one flagged, then a query
    token; the answer is the flagged token -- retrieval by content, which LSH attention
    does by hashing the query next to the flagged key. No attention cannot (chance 1/8)."""
    spec = {"name": "reformer", "bucket_size": 8, "n_hashes": 2}
    # measured: reformer ~1.0, no attention ~0.12
    check_learns_against_no_attention(spec, "flag-recall", n=32, steps=300)
