"""Padding never matters in the query-related mechanisms (issue 11, section 3, item 8).

Every module that takes a mask gets NaN (then inf) in its padded positions -- padded keys
and values, padded query rows, padded inputs of self-attention -- and must give exactly
the outputs (at the real positions) and the gradients (of every input and parameter)
that zeros there give, all finite. The check is the shared ``padding_invariant`` fixture
of ``tests/conftest.py``."""

from __future__ import annotations

import pytest
import torch

from attnlab import masks
from attnlab.query.attention_over_attention import (
    AttentionOverAttention,
    attention_over_attention,
)
from attnlab.query.capsule import CapsuleAttention, CapsuleRouting
from attnlab.query.graph import GraphAttention
from attnlab.query.key_value import ConcatenatedKeyValueAttention, KeyValueAttention
from attnlab.query.linformer import LinformerAttention
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.query.multi_hop import MultiHopAttention, masked_mean_values
from attnlab.query.pointer import PointerNetwork
from attnlab.query.positional import RelativePositionAttention, relative_position_attention
from attnlab.query.reformer import LSHAttention
from attnlab.query.self_attention import (
    ConstantQuerySelfAttention,
    LearnedQuerySelfAttention,
    RelationalSelfAttention,
)
from attnlab.query.synthesizer import SynthesizerAttention
from attnlab.query.transformer import TransformerDecoderLayer, TransformerEncoderLayer
from attnlab.query.transformer_xl import TransformerXLAttention

B, N, D = 2, 6, 8
LENGTHS = torch.tensor([N, 4])
REAL = torch.arange(N)[None, :] < LENGTHS[:, None]  # [B, N]
PAD = ~REAL[..., None]  # [B, N, 1], broadcasts over the features
KEY_MASK = masks.from_lengths(LENGTHS)  # [B, 1, N]


def _x(seed: int, n: int = N, d: int = D) -> torch.Tensor:
    return torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed))


def _real(out: torch.Tensor) -> torch.Tensor:
    """The outputs at the real positions ``[B, N, ...]`` -> ``[n_real, ...]``."""
    return out[REAL]


# --------------------------------------------------------------- self-attention forms


def _check_case(table, case: str, padding_invariant) -> None:
    """Build ``table[case]()`` = ``(module, call, inputs, padding)`` under a fixed seed and
    check that padding never matters, the module in eval mode."""
    torch.manual_seed(0)
    module, call, inputs, padding = table[case]()
    padding_invariant(module.eval(), call, inputs, padding)


def _self_attention(module, **kw):
    return module, lambda m, x: _real(m(x, mask=KEY_MASK, **kw).context), {"x": _x(1)}, {"x": PAD}


SELF = {
    "multi-head": lambda: _self_attention(MultiHeadAttention(D, 2)),
    "multi-head-need-weights": lambda: _self_attention(MultiHeadAttention(D, 2), need_weights=True),
    "multi-head-causal": lambda: _self_attention(MultiHeadAttention(D, 2), causal=True),
    "multi-head-additive": lambda: _self_attention(MultiHeadAttention(D, 2, score="additive")),
    "multi-head-gqa": lambda: _self_attention(MultiHeadAttention(D, 2, num_kv_heads=1)),
    "relational": lambda: _self_attention(RelationalSelfAttention(D)),
    "relational-additive-multi": lambda: _self_attention(
        RelationalSelfAttention(D, score="additive", dim="multi")
    ),
    "linformer": lambda: _self_attention(LinformerAttention(D, 2, max_len=N, proj_len=3)),
    "reformer": lambda: _self_attention(LSHAttention(D, 2, bucket_size=2, seed=0)),
    "transformer-xl": lambda: _self_attention(TransformerXLAttention(D, 2)),
    "synthesizer-dense": lambda: _self_attention(SynthesizerAttention(D, 2, max_len=N)),
    "synthesizer-mix": lambda: _self_attention(
        SynthesizerAttention(D, 2, max_len=N, mode="random", mix_dot=True)
    ),
    "relative-positions": lambda: _self_attention(RelativePositionAttention(D, 2, max_distance=2)),
    "relative-positions-per-head": lambda: _self_attention(
        RelativePositionAttention(D, 2, max_distance=2, share_heads=False)
    ),
    "encoder-layer": lambda: _self_attention(
        TransformerEncoderLayer(D, 2, dim_feedforward=16, dropout=0.0)
    ),
    "encoder-layer-pre-norm": lambda: _self_attention(
        TransformerEncoderLayer(D, 2, dim_feedforward=16, dropout=0.0, norm_first=True)
    ),
    "graph-attention": lambda: _self_attention(GraphAttention(D, 2)),
    "graph-attention-v2-mean": lambda: _self_attention(
        GraphAttention(D, 2, version="v2", concat=False), need_weights=True
    ),
    "graph-attention-no-self-loops": lambda: _self_attention(
        GraphAttention(D, 2, self_loops=False)
    ),
}


@pytest.mark.parametrize("case", sorted(SELF))
def test_self_attention_padding_never_matters(case, padding_invariant):
    _check_case(SELF, case, padding_invariant)


def test_decoder_layer_padding_never_matters(padding_invariant):
    torch.manual_seed(0)
    layer = TransformerDecoderLayer(D, 2, dim_feedforward=16, dropout=0.0).eval()
    mem_lengths = torch.tensor([3, 5])
    mem_pad = ~(torch.arange(5)[None, :] < mem_lengths[:, None])[..., None]

    def call(m, tgt, memory):
        out = m(tgt, memory, tgt_mask=KEY_MASK, memory_mask=masks.from_lengths(mem_lengths))
        return _real(out.context)

    padding_invariant(
        layer, call, {"tgt": _x(1), "memory": _x(2, 5)}, {"tgt": PAD, "memory": mem_pad}
    )


# --------------------------------------------------------------- cross-attention forms


def _cross_mask() -> torch.Tensor:
    """Key padding (``REAL``), plus padded query rows 3.. of batch element 1 (3 queries)."""
    rows = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]
    return KEY_MASK & rows[:, :, None]


Q_REAL = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]  # [B, 5]
Q_PAD = ~Q_REAL[..., None]


def _cross(module, call):
    inputs = {"q": _x(3, 5), "k": _x(4), "v": _x(5)}
    return module, call, inputs, {"q": Q_PAD, "k": PAD, "v": PAD}


CROSS = {
    "multi-head": lambda: _cross(
        MultiHeadAttention(D, 2),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask(), need_weights=True).context[Q_REAL],
    ),
    "multi-head-general": lambda: _cross(
        MultiHeadAttention(D, 2, score="general"),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "relative-positions": lambda: _cross(
        RelativePositionAttention(D, 2, max_distance=2),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "synthesizer": lambda: _cross(
        SynthesizerAttention(D, 2, max_len=N, mode="dense", mix_dot=True),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "key-value": lambda: _cross(
        KeyValueAttention(D, D, D, score="additive"),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "multi-query": lambda: _cross(
        ConcatenatedKeyValueAttention(D, D, D, concat=False),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "multi-hop": lambda: _cross(
        MultiHopAttention(D, D, D, hops=2),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
    "multi-hop-gru-scaled-dot": lambda: _cross(
        MultiHopAttention(D, D, D, hops=2, transform="gru", score="scaled-dot"),
        lambda m, q, k, v: m(q, k, v, mask=_cross_mask()).context[Q_REAL],
    ),
}


@pytest.mark.parametrize("case", sorted(CROSS))
def test_cross_attention_padding_never_matters(case, padding_invariant):
    _check_case(CROSS, case, padding_invariant)


def test_linformer_cross_attention_padding_never_matters(padding_invariant):
    torch.manual_seed(0)
    m = LinformerAttention(D, 2, max_len=N, proj_len=3).eval()
    padding_invariant(
        m,
        lambda m, q, k, v: m(q, k, v, mask=KEY_MASK).context,
        {"q": _x(3, 5), "k": _x(4), "v": _x(5)},
        {"k": PAD, "v": PAD},
    )


# ----------------------------------------------------------- internal-query modules


def _internal_output(out) -> torch.Tensor:
    if hasattr(out, "probs"):  # capsules: every output that depends on the features
        return torch.cat([out.probs.flatten(), out.contexts.flatten(), out.mean_features.flatten()])
    return out.context


def _internal(module):
    return module, lambda m, x: _internal_output(m(x, mask=REAL)), {"x": _x(1)}, {"x": PAD}


INTERNAL = {
    "constant-query": lambda: _internal(ConstantQuerySelfAttention(D)),
    "constant-query-multi": lambda: _internal(ConstantQuerySelfAttention(D, dim="multi")),
    "learned-query": lambda: _internal(LearnedQuerySelfAttention(D, 3, key_dim=5)),
    "learned-query-single": lambda: _internal(
        LearnedQuerySelfAttention(D, key_dim=5, score="additive")
    ),
    "capsule-attention": lambda: _internal(CapsuleAttention(D, 3)),
    "capsule-attention-projected": lambda: _internal(
        CapsuleAttention(D, 3, key_dim=5, value_dim=4)
    ),
}


@pytest.mark.parametrize("case", sorted(INTERNAL))
def test_internal_query_padding_never_matters(case, padding_invariant):
    _check_case(INTERNAL, case, padding_invariant)


def test_capsule_routing_padding_never_matters(padding_invariant):
    torch.manual_seed(0)
    module = CapsuleRouting(D, 3, d_caps=4)

    def call(m, x):
        out = m(x, mask=REAL)
        return torch.cat([out.probs.flatten(), out.capsules.flatten()])

    padding_invariant(module, call, {"x": _x(1)}, {"x": PAD})


def test_pointer_network_padding_never_matters(padding_invariant):
    torch.manual_seed(0)
    net = PointerNetwork(D, 6, eos=True)
    targets = torch.tensor([[2, 0, 5, 6], [1, 3, 6, -1]])  # 6 = n: the end pointer

    def call(m, x):
        out = m(x, targets, lengths=LENGTHS)
        return out.target_log_prob

    padding_invariant(net, call, {"x": _x(1)}, {"x": PAD})


@pytest.mark.parametrize("module", [False, True])
def test_attention_over_attention_padding_never_matters(module, padding_invariant):
    torch.manual_seed(0)
    q_real = torch.arange(5)[None, :] < torch.tensor([5, 3])[:, None]
    aoa = AttentionOverAttention(D, D) if module else torch.nn.Identity()

    def call(m, document, query):
        if module:
            out = m(document, query, mask1=REAL, mask2=q_real)
        else:
            out = attention_over_attention(document, query, REAL, q_real)
        return torch.cat([out.s[REAL], out.context.flatten()])

    padding_invariant(
        aoa, call, {"document": _x(1), "query": _x(2, 5)}, {"document": PAD, "query": Q_PAD}
    )


# ------------------------------------------------------------------ public functions


def test_relative_position_attention_function(padding_invariant):
    rel_k = torch.randn(5, D, generator=torch.Generator().manual_seed(7))
    mask = _cross_mask()

    def call(m, q, k, v):
        z, w = relative_position_attention(q, k, v, rel_k, rel_k, mask=mask)
        return torch.cat([z[Q_REAL].flatten(), w[Q_REAL].flatten()])

    padding_invariant(
        torch.nn.Identity(),
        call,
        {"q": _x(3, 5), "k": _x(4), "v": _x(5)},
        {"q": Q_PAD, "k": PAD, "v": PAD},
    )


def test_masked_mean_values(padding_invariant):
    padding_invariant(
        torch.nn.Identity(),
        lambda m, v: masked_mean_values(v, _cross_mask(), 5)[Q_REAL],
        {"v": _x(5)},
        {"v": PAD},
    )
