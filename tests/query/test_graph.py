"""Graph attention (GAT, Velickovic et al. 2018; GATv2, Brody, Alon & Yahav 2022): the
formula written out with loops over the nodes and their neighbours, the additive score it
is composed from, gradients, the adjacency as the mask, half precision, and a node
classification task that needs attention."""

import copy

import pytest
import torch
import torch.nn.functional as F
from attention_harness import (
    Inputs,
    check_all_rows_masked,
    check_dropout_only_in_training,
    check_fully_masked_row,
    check_rebuild_same_output,
    check_wrong_dtype,
    naive_softmax,
    run_attention_test,
)
from torch import nn

import attnlab
from attnlab.general.scoring import AdditiveScore, additive_score
from attnlab.query import GraphAttention, TransformerEncoderLayer

B, N, D = 2, 5, 6


def _x(seed: int, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*(shape or (B, N, D)), generator=g).to(dtype)


def _adjacency(seed: int, *shape: int) -> torch.Tensor:
    """A random directed graph ``[..., N, N]`` (True = edge j -> i) in which node 1 has no
    neighbour (isolated without self-loops)."""
    g = torch.Generator().manual_seed(seed)
    adj = torch.rand(*(shape or (B, N, N)), generator=g) < 0.5
    adj[..., 1, :] = False
    return adj


# ----------------------------------------------------------------------------- the formula


def _lrelu(t: float, slope: float) -> float:
    return t if t >= 0 else slope * t


def _reference(m: GraphAttention, x: torch.Tensor, adj: torch.Tensor | None):
    """The papers' layer with loops over nodes, neighbours and heads, from the module's
    parameters: ``(context [B, N, out], per-head weights [B, K, N, N])``."""
    Bx, n, _ = x.shape
    K, d = m.num_heads, m.head_dim
    slope = m.negative_slope
    ctx = torch.zeros(Bx, n, K, d, dtype=x.dtype)
    weights = torch.zeros(Bx, K, n, n, dtype=x.dtype)
    x = x.detach()
    for b in range(Bx):
        for k, head in enumerate(m.heads):
            a1, a2 = head.score.W1.weight.detach(), head.score.W2.weight.detach()
            if m.version == "v1":  # z = W^k h; e_ij = LeakyReLU(a_1^T z_i + a_2^T z_j)
                W = m.proj.weight.detach()[k * d : (k + 1) * d]
                z = [W @ x[b, j] for j in range(n)]
                msg = z
            else:  # e_ij = a^T LeakyReLU(W_l h_i + W_r h_j); m_j = W_r h_j
                a = head.score.w.detach()
                msg = [a2 @ x[b, j] for j in range(n)]
            for i in range(n):
                scores = {}
                for j in range(n):
                    edge = adj is None or bool(adj[i, j] if adj.dim() == 2 else adj[b, i, j])
                    if not (edge or (m.self_loops and i == j)):
                        continue
                    if m.version == "v1":
                        scores[j] = _lrelu(float(a1[0] @ z[i] + a2[0] @ z[j]), slope)
                    else:
                        u = a1 @ x[b, i] + a2 @ x[b, j]
                        scores[j] = sum(float(a[t]) * _lrelu(float(u[t]), slope) for t in range(d))
                for j, alpha in naive_softmax(scores).items():
                    weights[b, k, i, j] = alpha
                    ctx[b, i, k] += alpha * msg[j]
    out = ctx.flatten(2) if m.concat else ctx.mean(2)
    if m.bias is not None:
        out = out + m.bias.detach()
    return out, weights


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("concat", [True, False], ids=["concat", "mean"])
@pytest.mark.parametrize("self_loops", [True, False], ids=["self-loops", "no-self-loops"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared-NxN", "batched-BxNxN"])
def test_matches_the_formula_written_with_loops(version, concat, self_loops, shared):
    torch.manual_seed(0)
    m = GraphAttention(D, 3, 2, version=version, concat=concat, self_loops=self_loops)
    m = m.double().eval()
    with torch.no_grad():
        m.bias.normal_()
    x = _x(1, dtype=torch.float64)
    adj = _adjacency(2, N, N) if shared else _adjacency(2)
    out = m(x, mask=adj, need_weights=True, average_weights=False)
    ref_ctx, ref_w = _reference(m, x, adj)
    assert out.context.shape == (B, N, 6 if concat else 2)
    torch.testing.assert_close(out.weights, ref_w)
    torch.testing.assert_close(out.context, ref_ctx)
    averaged = m(x, mask=adj, need_weights=True).weights
    torch.testing.assert_close(averaged, ref_w.mean(1))
    if not self_loops:  # node 1 has no neighbour: zero weights, the output is the bias
        assert torch.equal(out.weights[:, :, 1], torch.zeros(B, 3, N, dtype=torch.float64))
        torch.testing.assert_close(out.context[:, 1], m.bias.detach().expand(B, -1))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_no_mask_is_the_complete_graph(version):
    torch.manual_seed(0)
    m = GraphAttention(D, 2, version=version).double().eval()
    x = _x(1, dtype=torch.float64)
    full = torch.ones(N, N, dtype=torch.bool)
    torch.testing.assert_close(m(x).context, m(x, mask=full).context)
    torch.testing.assert_close(m(x).context, _reference(m, x, None)[0])


def test_adjacency_keyword_is_the_mask():
    torch.manual_seed(0)
    m = GraphAttention(D, 2).eval()
    x, adj = _x(1), _adjacency(2)
    torch.testing.assert_close(m(x, adjacency=adj).context, m(x, mask=adj).context)
    with pytest.raises(TypeError, match=r"^GraphAttention.forward\(\) got both mask and adj"):
        m(x, mask=adj, adjacency=adj)


# ----------------------------------------------------------------------------- the additive score


def test_v1_is_the_additive_score_with_one_hidden_unit_and_w_fixed_to_one():
    """v1's score is the registered additive score ``w^T act(W1 q + W2 k)`` with ``d_w =
    1``, ``act`` = LeakyReLU(0.2), no bias, and ``w`` = 1 (a buffer, not a parameter):
    ``W1 = a_1^T``, ``W2 = a_2^T``. A trainable ``w = c > 0`` would only rescale ``a``
    (LeakyReLU is positively homogeneous), which the equality below shows."""
    torch.manual_seed(0)
    m = GraphAttention(D, 2, 3)
    for head in m.heads:
        score = head.score
        assert isinstance(score, AdditiveScore)
        assert score.W1.weight.shape == (1, 3) and score.W2.weight.shape == (1, 3)
        assert score.b is None
        assert torch.equal(score.w, torch.ones(1)) and "w" in dict(score.named_buffers())
        assert "w" not in dict(score.named_parameters())
    z = _x(3, B, N, 3)
    score = m.heads[0].score
    a1, a2 = score.W1.weight.detach(), score.W2.weight.detach()
    e = score(z, z).detach()
    e_formula = F.leaky_relu((z @ a1.T) + (z @ a2.T).transpose(1, 2), 0.2)  # [B, N, N]
    torch.testing.assert_close(e, e_formula)
    for c in (0.5, 3.0):  # w = c > 0: the GAT score of a scaled by c
        w = torch.tensor([c])
        scaled = additive_score(z, z, a1, a2, w, act=score.act)
        torch.testing.assert_close(
            scaled, additive_score(z, z, c * a1, c * a2, torch.ones(1), act=score.act)
        )
        torch.testing.assert_close(scaled, c * e)


def test_v2_is_the_additive_score_with_d_w_the_head_width():
    torch.manual_seed(0)
    m = GraphAttention(D, 2, 3, version="v2")
    assert m.proj is None
    for head in m.heads:
        score = head.score
        assert isinstance(score, AdditiveScore) and score.b is None
        assert score.W1.weight.shape == (3, D) and score.W2.weight.shape == (3, D)
        assert "w" in dict(score.named_parameters()) and score.w.shape == (3,)
    # v2 is not v1: the ranking of the neighbours depends on the attending node
    # (Brody et al.'s "dynamic" attention), which v1's cannot: e_ij = LReLU(s_i + t_j)
    # is monotone in t_j for every i
    x = _x(4, 1, 8, D)
    e = m.heads[0].score(x, x)[0]
    rankings = {tuple(row.argsort().tolist()) for row in e}
    assert len(rankings) > 1
    v1 = GraphAttention(D, 2, 3).heads[0].score
    z = _x(5, 1, 8, 3)
    e1 = v1(z, z)[0]
    assert len({tuple(row.argsort().tolist()) for row in e1}) == 1


# ----------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("concat", [True, False], ids=["concat", "mean"])
def test_gradcheck_inputs_and_parameters(version, concat):
    torch.manual_seed(0)
    m = GraphAttention(3, 2, 2, version=version, concat=concat, self_loops=False).double()
    x = _x(1, 2, 4, 3, dtype=torch.float64).requires_grad_(True)
    adj = _adjacency(2, 2, 4, 4)  # node 1 isolated: its row is zero, gradients too
    names = [n for n, _ in m.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in m.parameters()]

    def f(x, *ps):
        state = dict(zip(names, ps, strict=True))
        return torch.func.functional_call(m, state, (x,), {"mask": adj}).context

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- the adjacency


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_non_neighbour_never_matters(version):
    torch.manual_seed(0)
    m = GraphAttention(D, 2, version=version).eval()
    x, adj = _x(1), _adjacency(2)
    base = m(x, mask=adj).context
    checked = 0
    for b in range(B):
        for i in range(N):
            for j in range(N):
                if adj[b, i, j] or i == j:
                    continue
                y = x.clone()
                y[b, j] = 100 * torch.randn(D)
                out = m(y, mask=adj).context
                torch.testing.assert_close(out[b, i], base[b, i], rtol=0, atol=1e-6)
                # ...while the nodes that do attend to j see the change
                for l in range(N):
                    if adj[b, l, j] or l == j:
                        assert not torch.allclose(out[b, l], base[b, l])
                checked += 1
    assert checked > 10


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("bias", [True, False])
def test_a_node_without_neighbours_gets_zeros_never_nan(version, bias):
    torch.manual_seed(0)
    m = GraphAttention(D, 2, version=version, self_loops=False, bias=bias)
    if bias:
        with torch.no_grad():
            m.bias.normal_()
    x = _x(1).requires_grad_(True)
    expected = m.bias.detach() if bias else torch.zeros(D)
    out = check_fully_masked_row(
        m, Inputs((x,), {"mask": _adjacency(2)}), (0, 1), expected_context=expected
    )
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(out.context).all()
    check_all_rows_masked(
        GraphAttention(D, 2, version=version, self_loops=False, bias=False), x, zero_context=True
    )


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_padding_nodes_holding_nan_do_not_reach_the_others(version):
    """Graphs of different sizes in one batch: the padding nodes have no edge. Whatever
    they hold, the real nodes' outputs and every gradient are those of clean padding."""
    torch.manual_seed(0)
    m = GraphAttention(D, 2, version=version)  # self-loops: a padding node attends itself
    adj = _adjacency(2)
    adj[1, 3:] = False
    adj[1, :, 3:] = False  # graph 1 has 3 nodes
    x = _x(1)
    dirty = x.clone()
    dirty[1, 3] = float("nan")
    dirty[1, 4] = float("inf")
    outs = []
    for inp in (x, dirty):
        m.zero_grad()
        out = m(inp, mask=adj).context
        (out[0].sum() + out[1, :3].sum()).backward()  # the real nodes' outputs
        outs.append((out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    (clean, g_clean), (got, g_got) = outs
    torch.testing.assert_close(got[0], clean[0])
    torch.testing.assert_close(got[1, :3], clean[1, :3])
    for name, grad in g_got.items():
        torch.testing.assert_close(grad, g_clean[name], msg=name)


# ----------------------------------------------------------------------------- half precision


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_bfloat16_against_float32(version):
    """The module in bfloat16 against the same (bf16-rounded) parameters and inputs in
    float32: the projections run in bfloat16 (8 bits of mantissa, relative rounding 2^-8),
    the scores and the softmax in float32. Tolerance 3e-2 absolute and relative, for
    outputs of size about 1."""
    torch.manual_seed(0)
    half = GraphAttention(D, 2, version=version).to(torch.bfloat16)
    full = copy.deepcopy(half).float()
    x, adj = _x(1, dtype=torch.bfloat16), _adjacency(2)
    got = half(x, mask=adj, need_weights=True)
    want = full(x.float(), mask=adj, need_weights=True)
    assert got.context.dtype == torch.bfloat16
    torch.testing.assert_close(got.context.float(), want.context, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(got.weights.float(), want.weights, atol=1e-2, rtol=3e-2)
    got.context.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in half.parameters())


# ----------------------------------------------------------------------------- the convention


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_on_the_harness(version):
    torch.manual_seed(0)
    m = GraphAttention(D, 2, version=version, self_loops=False)
    adj = _adjacency(2)
    run_attention_test(
        m,
        Inputs((_x(1),), {"mask": adj}),
        context_shape=(B, N, D),
        weights_shape=(B, N, N),
        mask=adj,
    )
    check_rebuild_same_output(m, Inputs((_x(1),), {"mask": adj}))
    check_wrong_dtype(m, Inputs((_x(1),), {"mask": adj}), "mask", match="expected torch.bool")


def test_dropout_on_the_coefficients_only_in_training():
    torch.manual_seed(0)
    m = GraphAttention(D, 2, dropout=0.5)
    _, t1, _ = check_dropout_only_in_training(m, Inputs((_x(1),), {"mask": _adjacency(2)}))
    m.train()
    torch.manual_seed(1)
    out = m(_x(1), mask=_adjacency(2), need_weights=True)
    torch.testing.assert_close(out.context, t1.context)
    m.eval()
    torch.testing.assert_close(  # the weights returned are those before dropout
        out.weights, m(_x(1), mask=_adjacency(2), need_weights=True).weights
    )


def test_registry_names_and_config():
    for name in ("graph-attention", "gat", "graph-attention-network"):
        assert attnlab.registry.get("query", name).cls is GraphAttention
    built = attnlab.build({"name": "gat", "d_model": D, "num_heads": 2, "version": "v2"})
    assert isinstance(built, GraphAttention) and built.version == "v2"
    assert attnlab.GraphAttention is GraphAttention
    assert built.out_dim == D and GraphAttention(D, 3, concat=False).out_dim == D
    assert GraphAttention(D, 3, 4).out_dim == 12


def test_in_a_transformer_encoder_layer_the_mask_is_the_graph():
    torch.manual_seed(0)
    layer = TransformerEncoderLayer(D, 2, attention="graph-attention").eval()
    x, adj = _x(1), _adjacency(2)
    out = layer(x, mask=adj, need_weights=True)
    assert out.context.shape == (B, N, D)
    non_edges = ~(adj | torch.eye(N, dtype=torch.bool))
    assert non_edges.any()
    assert torch.equal(out.weights[non_edges], torch.zeros(int(non_edges.sum())))


# ----------------------------------------------------------------------------- errors


def test_bad_calls_are_one_line_errors():
    m = GraphAttention(D, 2)
    x, adj = _x(1), _adjacency(2)
    cases = [
        (
            lambda: m(x, mask=adj.float()),
            TypeError,
            r"^mask has dtype torch.float32, expected torch.bool \(the adjacency",
        ),
        (
            lambda: m(x, mask=adj[:, :4]),
            ValueError,
            r"^mask has shape \(2, 4, 5\), expected the adjacency \[N, N\] = \[5, 5\] "
            r"or \[B, N, N\] = \[2, 5, 5\]$",
        ),
        (lambda: m(x, adjacency=adj[0, :3, :3]), ValueError, r"^adjacency has shape \(3, 3\)"),
        (lambda: m(x, mask=adj[None]), ValueError, r"^mask has shape \(1, 2, 5, 5\)"),
        (lambda: m(x, mask=[[True]]), TypeError, r"^mask must be a torch.Tensor, got list$"),
        (
            lambda: m(x, _x(2)),
            ValueError,
            r"^graph-attention is self-attention only: key must be None",
        ),
        (
            lambda: m(x[:, :, :4]),
            ValueError,
            r"^query has shape \(2, 5, 4\), expected \[B, n_q, d_model\] = \[B, n_q, 6\]$",
        ),
        (lambda: m(x[0]), ValueError, r"^query has shape \(5, 6\)"),
        (
            lambda: m(x.double()),
            TypeError,
            r"^query has dtype torch.float64 but the parameters of GraphAttention",
        ),
        (lambda: m(x, causal=True), ValueError, r"^graph-attention does not support causal=True"),
        (
            lambda: m(x, edges=adj),
            TypeError,
            r"^GraphAttention.forward\(\) got an unexpected keyword argument 'edges'$",
        ),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match) as caught:
            call()
        assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"version": "v3"}, r"^version must be 'v1' or 'v2', got 'v3'$"),
        ({"num_heads": 0}, r"^num_heads must be an int >= 1, got 0$"),
        ({"num_heads": 4}, r"^d_model=6 is not divisible by num_heads=4; pass head_dim"),
        ({"head_dim": 0}, r"^head_dim must be an int >= 1, got 0$"),
        ({"dropout": 1.0}, r"^dropout must be in \[0, 1\), got 1.0$"),
        ({"negative_slope": "0.2"}, r"^negative_slope must be a number, got '0.2'$"),
        ({"negative_slope": float("nan")}, r"^negative_slope must be a finite number, got nan$"),
    ],
)
def test_bad_configurations_are_config_errors(kwargs, match):
    with pytest.raises(attnlab.ConfigError, match=match):
        GraphAttention(D, **kwargs)


@pytest.mark.parametrize("flag", ["concat", "self_loops"])
def test_the_switches_must_be_bools(flag):
    with pytest.raises(TypeError, match=rf"^{flag} must be a bool, got 'no'$"):
        GraphAttention(D, **{flag: "no"})


# ----------------------------------------------------------------------------- learning

C, NOISE = 4, 3  # classes, noise features
STAR = C + 1  # a centre and one leaf per class
D_STAR = 1 + C + NOISE  # marker, one-hot class, noise


def _stars(batch: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Star graphs: the centre (node 0) and ``C`` leaves holding the ``C`` classes once
    each (one-hot, in a random order); one leaf, at random, carries the marker feature;
    every node has noise features. The centre's label is the class of the marked leaf.
    The leaves' classes are the same multiset in every graph, so their mean -- what
    averaging the neighbours sees -- carries no information about the label; only
    attending to the marked leaf does."""
    x = torch.zeros(batch, STAR, D_STAR)
    classes = torch.argsort(torch.rand(batch, C, generator=g), dim=1)
    x[:, 1:, 1 : 1 + C] = F.one_hot(classes, C).float()
    marked = torch.randint(0, C, (batch,), generator=g)
    x[torch.arange(batch), 1 + marked, 0] = 1.0
    x[:, :, 1 + C :] = torch.randn(batch, STAR, NOISE, generator=g)
    return x, classes[torch.arange(batch), marked]


#: the star's edges, both ways (a shared [N, N] adjacency)
STAR_EDGES = torch.zeros(STAR, STAR, dtype=torch.bool)
STAR_EDGES[0, 1:] = STAR_EDGES[1:, 0] = True


class _Classifier(nn.Module):
    """One graph attention layer (2 heads of 8), ELU, a linear read-out of the centre.
    ``uniform=True``: the score parameters are zero and frozen, so every neighbour gets
    the same weight -- mean aggregation (GCN-like, row-normalised), the same model
    otherwise."""

    def __init__(self, version: str, uniform: bool) -> None:
        super().__init__()
        self.gat = GraphAttention(D_STAR, 2, 8, version=version)
        if uniform:
            for head in self.gat.heads:
                for p in head.score.parameters():
                    nn.init.zeros_(p)
                    p.requires_grad_(False)
        self.out = nn.Linear(16, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.elu(self.gat(x, mask=STAR_EDGES).context[:, 0]))


def _accuracy(version: str, uniform: bool, seed: int = 0, steps: int = 150) -> float:
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1000)
    model = _Classifier(version, uniform)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        x, y = _stars(128, g)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    x, y = _stars(1000, g)
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_learns_to_attend_to_the_marked_neighbour_where_averaging_cannot(version):
    """Chance is 1/C = 0.25. (Seeds 0-9 were tried for both versions: attention reached
    0.994-1.0, mean aggregation stayed within 0.216-0.271.)"""
    attention = _accuracy(version, uniform=False)
    averaging = _accuracy(version, uniform=True)
    assert attention > 0.95, attention
    assert averaging < 0.35, averaging
