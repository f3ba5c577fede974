"""Padding never matters in the feature-related mechanisms (issue 11, section 3, item 8).

Co-attention (alternating, interactive, parallel, multi-grained), rotatory attention,
hierarchical attention, attention-via-attention and the meta-embeddings get NaN (then inf)
in their padded positions and must give exactly the outputs and gradients that zeros
there give, all finite (the shared ``padding_invariant`` fixture of ``tests/conftest.py``).
"""

from __future__ import annotations

import pytest
import torch

from attnlab.feature.co_attention import (
    AlternatingCoAttention,
    InteractiveCoAttention,
    MultiGrainedCoAttention,
    ParallelCoAttention,
    masked_mean,
)
from attnlab.feature.meta_embedding import CDME, DME
from attnlab.feature.multilevel import AttentionViaAttention, HierarchicalAttention, MaskedRNN
from attnlab.feature.rotatory import LCRRotHop, RotatoryAttention

B = 2


def _x(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(B, *shape, generator=torch.Generator().manual_seed(seed))


def _real(lengths: list[int], n: int) -> torch.Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


M1, M2 = _real([5, 3], 5), _real([4, 2], 4)


def _co_call(m, f1, f2):
    out = m(f1, f2, mask1=M1, mask2=M2)
    parts = [out.output, out.a1[M1], out.a2[M2]]
    if out.a1_fine is not None:
        parts += [out.a1_fine[M1], out.a2_fine[M2]]
    return torch.cat([p.flatten() for p in parts])


CO = {
    "alternating": lambda: AlternatingCoAttention(6, 4, d_w=5),
    "alternating-sparsemax": lambda: AlternatingCoAttention(6, 4, d_w=5, align="sparsemax"),
    "interactive": lambda: InteractiveCoAttention(6, 4),
    "parallel-bilinear": lambda: ParallelCoAttention(6, 4, d_w=5),
    "parallel-concat-max": lambda: ParallelCoAttention(
        5, 5, affinity="concat", scores="max", align="entmax15"
    ),
    "multi-grained": lambda: MultiGrainedCoAttention(5, 5),
    "multi-grained-mean": lambda: MultiGrainedCoAttention(5, 5, fine2="row-mean"),
}


@pytest.mark.parametrize("case", sorted(CO))
def test_co_attention_padding_never_matters(case, padding_invariant):
    torch.manual_seed(0)
    m = CO[case]().eval()
    d1 = 6 if case.startswith(("alternating", "interactive", "parallel-bilinear")) else 5
    d2 = 4 if d1 == 6 else 5
    padding_invariant(
        m,
        _co_call,
        {"f1": _x(1, 5, d1), "f2": _x(2, 4, d2)},
        {"f1": ~M1[..., None], "f2": ~M2[..., None]},
    )


def test_masked_mean(padding_invariant):
    padding_invariant(
        torch.nn.Identity(),
        lambda m, x: masked_mean(x, M1),
        {"x": _x(1, 5, 3)},
        {"x": ~M1[..., None]},
    )


@pytest.mark.parametrize("cls", [LCRRotHop, RotatoryAttention])
def test_rotatory_padding_never_matters(cls, padding_invariant):
    torch.manual_seed(0)
    m = cls(4, 3).eval()
    ml, mt, mr = _real([5, 2], 5), _real([3, 1], 3), _real([4, 0], 4)

    def call(m, left, target, right):
        return m(left, target, right, left_mask=ml, target_mask=mt, right_mask=mr).output

    padding_invariant(
        m,
        call,
        {"left": _x(1, 5, 4), "target": _x(2, 3, 3), "right": _x(3, 4, 4)},
        {"left": ~ml[..., None], "target": ~mt[..., None], "right": ~mr[..., None]},
    )


@pytest.mark.parametrize("encoder", [None, "bigru"])
@pytest.mark.parametrize("score", ["queryless", "additive"])
def test_hierarchical_padding_never_matters(encoder, score, padding_invariant):
    torch.manual_seed(0)
    m = HierarchicalAttention(4, 2, score=score, encoder=encoder, d_w=3).eval()
    mask = torch.tensor(
        [
            [[1, 1, 1], [1, 1, 0], [1, 0, 0]],
            [[1, 1, 0], [0, 0, 0], [0, 0, 0]],  # empty sentences
        ],
        dtype=torch.bool,
    )
    padding_invariant(
        m,
        lambda m, x: m(x, mask=mask, need_weights=True).context,
        {"x": _x(1, 3, 3, 4)},
        {"x": ~mask[..., None]},
    )


def test_masked_rnn_padding_never_matters(padding_invariant):
    torch.manual_seed(0)
    rnn = MaskedRNN(3, 2, cell="lstm")
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)  # holes, empty row
    padding_invariant(rnn, lambda m, x: m(x, mask), {"x": _x(1, 4, 3)}, {"x": ~mask[..., None]})


@pytest.mark.parametrize("via", ["mixture", "query"])
@pytest.mark.parametrize("words", [False, True])
def test_attention_via_attention_padding_never_matters(via, words, padding_invariant):
    torch.manual_seed(0)
    m = AttentionViaAttention(3, 4, d_word=4, via=via, d_w=3).eval()
    char_mask = _real([7, 4], 7)
    word_mask = _real([3, 2], 3)
    offsets = torch.tensor([[0, 3, 5], [0, 2, 0]])
    inputs = {"q": _x(1, 3), "chars": _x(2, 7, 4)}
    padding = {"chars": ~char_mask[..., None]}
    if words:
        inputs["words"] = _x(3, 3, 4)
        padding["words"] = ~word_mask[..., None]

    def call(m, q, chars, words=None):
        out = m(
            q,
            chars,
            words,
            mask=char_mask,
            word_mask=word_mask,
            word_offsets=offsets,
            need_weights=True,
        )
        return torch.cat([out.context.flatten(), out.weights[char_mask]])

    padding_invariant(m, call, inputs, padding)


@pytest.mark.parametrize("cls", [DME, CDME])
def test_meta_embedding_padding_never_matters(cls, padding_invariant):
    torch.manual_seed(0)
    m = cls([(10, 3), (10, 5)], 4).eval()
    token_mask = _real([5, 3], 5)
    avail = torch.ones(B, 5, dtype=torch.bool)
    avail[0, 1] = False  # embedding 0 unavailable for a real token

    def call(m, e0, e1):
        out = m([e0, e1], masks=[avail, None], mask=token_mask, need_weights=True)
        return torch.cat([out.context[token_mask].flatten(), out.weights[token_mask].flatten()])

    padding_invariant(
        m,
        call,
        {"e0": _x(1, 5, 3), "e1": _x(2, 5, 5)},
        {"e0": ~(token_mask & avail)[..., None], "e1": ~token_mask[..., None]},
    )
