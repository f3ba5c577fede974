"""Adding a mechanism is local (docs/architecture.md, "Add a score in three places").

A score defined here, outside the package -- one class with ``@register`` and its
functional twin -- runs through :class:`attnlab.Attention` with every alignment, through
:func:`attnlab.functional.attend` (which also exports its twin) and through
:class:`~attnlab.query.multi_head.MultiHeadAttention`, without a line of the library
naming it. And every score of the library has its docs page and its functional twin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import attnlab
import attnlab.functional as AF
from attnlab import registry
from attnlab.general.scoring import Score
from attnlab.query.multi_head import MultiHeadAttention

DOCS = Path(__file__).resolve().parents[2] / "docs"
B, N_Q, N_K, D = 2, 3, 5, 4


def neg_distance_score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``e_l = -|q - k_l|^2``: ``q`` ``[B, n_q, d]`` (or ``[B, d]``), ``k`` ``[B, n_k, d]``."""
    q3 = q if q.dim() == 3 else q.unsqueeze(1)
    e = -((q3[:, :, None, :] - k[:, None, :, :]) ** 2).sum(-1)
    return e if q.dim() == 3 else e.squeeze(1)


class NegDistanceScore(Score):
    """A toy score from outside the package: the negative squared distance."""

    same_dims = True
    function = staticmethod(neg_distance_score)

    def __init__(self, d_q: int | None = None, d_k: int | None = None) -> None:
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return neg_distance_score(q, k)


def halved_dot_score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``e_l = q^T k_l / 2``."""
    return attnlab.functional.dot_score(q, k) / 2


class HalvedDotScore(Score):
    """A toy dot-product score: with its dot forms it runs on the fused SDPA kernel."""

    same_dims = True
    function = staticmethod(halved_dot_score)

    def __init__(self, d_q: int | None = None, d_k: int | None = None) -> None:
        super().__init__()

    @staticmethod
    def function_dot_form(q: torch.Tensor, k: torch.Tensor) -> tuple:
        return q, k, 0.5

    def dot_form(self, q: torch.Tensor, k: torch.Tensor) -> tuple:
        return q, k, 0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return halved_dot_score(q, k)


@pytest.fixture
def toy_scores() -> Iterator[None]:
    """Register the two toy scores for one test, then unregister them."""
    source = "Toy et al. 2024, A Score Defined Outside the Package"
    registry.register(
        "score", "neg-distance", formula="e_l = -|q - k_l|^2", source=source, aliases=("toy",)
    )(NegDistanceScore)
    registry.register("score", "halved-dot", formula="e_l = q^T k_l / 2", source=source)(
        HalvedDotScore
    )
    try:
        yield
    finally:
        registry.unregister("score", "neg-distance")
        registry.unregister("score", "halved-dot")


def _qkv(seed: int = 0, d: int = D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, N_Q, d, generator=g),
        torch.randn(B, N_K, d, generator=g),
        torch.randn(B, N_K, d, generator=g),
    )


def _reference(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.softmax(scores, -1)
    return weights @ v, weights


def test_a_score_registered_outside_runs_in_attention_attend_and_multi_head(toy_scores):
    q, k, v = _qkv()
    want_c, want_w = _reference(neg_distance_score(q, k), v)

    out = attnlab.Attention(score="neg-distance", d_q=D, d_k=D)(q, k, v, need_weights=True)
    assert out.path == "explicit"
    torch.testing.assert_close(out.context, want_c)
    torch.testing.assert_close(out.weights, want_w)

    fun = AF.attend(q, k, v, score="toy", need_weights=True)  # by its alias too
    assert fun.path == "explicit"
    torch.testing.assert_close(fun.context, want_c)
    torch.testing.assert_close(fun.weights, want_w)

    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, score="neg-distance").eval()
    x = torch.randn(B, N_Q, 8)
    got = mha(x)
    assert got.path == "per-head:explicit"
    heads = [p(x).view(B, N_Q, 2, 4).transpose(1, 2) for p in (mha.q_proj, mha.k_proj, mha.v_proj)]
    ctx, _ = _reference(neg_distance_score(heads[0].flatten(0, 1), heads[1].flatten(0, 1)),
                        heads[2].flatten(0, 1))  # fmt: skip
    ctx = ctx.view(B, 2, N_Q, 4).transpose(1, 2).reshape(B, N_Q, 8)
    torch.testing.assert_close(got.context, mha.out_proj(ctx))


def test_a_score_registered_outside_takes_every_alignment(toy_scores):
    q, k, v = _qkv(1)
    library_aligns = [e.name for e in registry.entries("align")]
    for align in library_aligns:
        torch.manual_seed(0)
        attn = attnlab.Attention("neg-distance", align, d_q=D, d_k=D).eval()
        out = attn(q, k, v, need_weights=True)
        assert out.context.shape == (B, N_Q, D), align
        assert torch.isfinite(out.context).all(), align


def test_a_dot_product_score_registered_outside_takes_the_fused_paths(toy_scores):
    q, k, v = _qkv(2)
    want_c, want_w = _reference(q @ k.transpose(1, 2) / 2, v)
    out = attnlab.Attention("halved-dot", d_q=D, d_k=D)(q, k, v, need_weights=True)
    fun = AF.attend(q, k, v, "halved-dot", need_weights=True)
    for got in (out, fun):
        assert got.path == "sdpa"
        torch.testing.assert_close(got.context, want_c)
        torch.testing.assert_close(got.weights, want_w)
    assert MultiHeadAttention(8, 2, score="halved-dot").plan().path == "sdpa"


def test_the_functional_twin_of_a_registered_score_is_exported(toy_scores):
    assert AF.neg_distance_score is neg_distance_score
    assert "neg_distance_score" in AF.__all__ and "halved_dot_score" in dir(AF)
    assert isinstance(attnlab.build({"name": "neg-distance", "kind": "score"}), NegDistanceScore)


def test_unregistering_removes_the_score_everywhere():
    with pytest.raises(KeyError, match="unknown score 'neg-distance'"):
        attnlab.Attention("neg-distance")
    with pytest.raises(KeyError, match="unknown score 'toy'"):
        AF.attend(*_qkv(), score="toy")
    assert "neg_distance_score" not in AF.__all__
    with pytest.raises(AttributeError, match="neg_distance_score"):
        AF.neg_distance_score  # noqa: B018


LIBRARY_SCORES = [e for e in registry.entries("score") if e.cls.__module__.startswith("attnlab.")]


@pytest.mark.parametrize("entry", LIBRARY_SCORES, ids=lambda e: e.name)
def test_every_score_has_a_docs_page_and_a_functional_twin(entry: registry.Entry):
    assert (DOCS / "scores" / f"{entry.name}.md").is_file(), f"no docs/scores/{entry.name}.md"
    twin = entry.cls.function
    assert callable(twin), f"{entry.cls.__name__} declares no functional twin 'function'"
    assert getattr(AF, twin.__name__) is twin
    assert twin.__name__ in AF.__all__
    functional_page = (DOCS / "functional.md").read_text(encoding="utf-8")
    assert f"`{twin.__name__}(" in functional_page, f"docs/functional.md lacks {twin.__name__}"
