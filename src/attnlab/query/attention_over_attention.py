"""Attention-over-attention (Cui et al. 2017, the AoA reader; survey section 3.3.1,
TAXONOMY section 3.1: a *specialised query* produced by another attention).

For a document ``D`` ``[B, n_d, d]`` and a query ``Q`` ``[B, n_q, d]`` (contextual word
vectors of both):

    M        = D Q^T                                  pairwise matching  [B, n_d, n_q]
    alpha(t) = softmax_i M[:, i, t]                   column-wise: document-level
                                                      attention of each query word t
    beta(i)  = softmax_t M[:, i, t]                   row-wise: query-level attention
                                                      of each document word i
    beta_bar = (1 / n_d) sum_i beta(i)                averaged query-level attention [B, n_q]
    s        = alpha beta_bar                         document-level attention  [B, n_d]

``s`` is a distribution over the document positions (it sums to 1): a weighted vote of the
per-query-word attentions ``alpha(t)``, the weights ``beta_bar`` being themselves an
attention — "attention over attention". The AoA reader answers a cloze query with the
candidate word of largest ``P(w | D, Q) = sum_{i: D_i = w} s_i`` (:func:`aoa_answer_scores`).

The matching score is pluggable (default ``dot``, the paper's ``M = D Q^T``; any score
``M[i, t] = score(q_t, d_i)``), and so is the normalisation (``soft`` by default;
``sparsemax`` / ``entmax15`` also normalise along an axis).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from attnlab._checks import ConfigError, check_module_dtype, check_same, check_tensor
from attnlab.general._convention import AttentionCall, TwoInputAttention
from attnlab.general.alignment import Alignment, masked_softmax
from attnlab.general.padding import clear_nonfinite_rows
from attnlab.general.scoring import Score, dot_score
from attnlab.output import output_pytree
from attnlab.registry import get, register

__all__ = [
    "AoAOutput",
    "AttentionOverAttention",
    "aoa_answer_scores",
    "attention_over_attention",
]


@output_pytree()
@dataclass
class AoAOutput:
    """Result of attention-over-attention.

    Attributes:
        s: the document-level attention ``alpha beta_bar`` ``[B, n_d]`` (sums to 1 over the
            real document positions; zeros when there is no real document or query word).
        alpha: column-wise softmax of ``M`` (over the document, one column per query
            word) ``[B, n_d, n_q]``.
        beta: row-wise softmax of ``M`` (over the query, one row per document word)
            ``[B, n_d, n_q]``.
        beta_bar: ``beta`` averaged over the real document positions ``[B, n_q]``.
        matching: the pairwise matching matrix ``M`` ``[B, n_d, n_q]``.
        context: the attended document ``sum_i s_i D_i`` ``[B, d]``.
        weights: ``s`` (a read-only alias): the module's attention weights, as
            :func:`attnlab.capture_weights` and every other attention output name them.

    All in the document's dtype (for half-precision inputs the matching and the
    normalisations are computed in float32, then rounded once).
    """

    s: Tensor
    alpha: Tensor
    beta: Tensor
    beta_bar: Tensor
    matching: Tensor
    context: Tensor

    @property
    def weights(self) -> Tensor:
        """The document-level attention ``s`` ``[B, n_d]``."""
        return self.s


def _check_inputs(
    document: Tensor,
    query: Tensor,
    document_mask: Tensor | None,
    query_mask: Tensor | None,
    d_doc: int | None = None,
    d_query: int | None = None,
    matching: str | None = None,
) -> None:
    """Check the inputs; ``matching``: the name of a matching score that compares the words
    directly, so that document and query words need the same size."""
    check_tensor(document, "document")
    if document.dim() != 3 or (d_doc is not None and document.shape[2] != d_doc):
        want = d_doc if d_doc is not None else "d"
        raise ValueError(
            f"document has shape {tuple(document.shape)}, expected [B, n_d, d] = [B, n_d, {want}]"
        )
    B, n_d = document.shape[:2]
    check_tensor(query, "query")
    if (
        query.dim() != 3
        or query.shape[0] != B
        or (d_query is not None and query.shape[2] != d_query)
    ):
        want = d_query if d_query is not None else "d"
        raise ValueError(
            f"query has shape {tuple(query.shape)}, expected [B, n_q, d] = [{B}, n_q, {want}]"
        )
    check_same(document, "document", query=query)
    if matching is not None and document.shape[2] != query.shape[2]:
        raise ValueError(
            f"the {matching} matching M = D Q^T needs the same size: document has shape "
            f"{tuple(document.shape)}, query has shape {tuple(query.shape)}"
        )
    n_q = query.shape[1]
    for name, m, n in (("document_mask", document_mask, n_d), ("query_mask", query_mask, n_q)):
        if m is None:
            continue
        if not isinstance(m, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(m).__name__}")
        if m.dtype != torch.bool:
            raise TypeError(f"{name} has dtype {m.dtype}, expected torch.bool (True = real word)")
        if m.dim() != 2 or m.shape[1] != n or m.shape[0] not in (1, B):
            raise ValueError(f"{name} has shape {tuple(m.shape)}, expected [B, n] = [{B}, {n}]")
        if m.device != document.device:
            raise ValueError(f"{name} is on {m.device} but document is on {document.device}")


def _clear_padding(
    document: Tensor, query: Tensor, document_mask: Tensor | None, query_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """The NaN / inf entries of padded document and query words set to zero with
    ``where`` (not a product: 0 * NaN = NaN), so that padding never matters, in the
    outputs or the gradients; finite padding is kept (``matching`` still shows it)."""
    return clear_nonfinite_rows(document, document_mask), clear_nonfinite_rows(query, query_mask)


def _aoa(
    matching: Tensor,
    document: Tensor,
    document_mask: Tensor | None,
    query_mask: Tensor | None,
    normalize: Any,
) -> AoAOutput:
    B, n_d, n_q = matching.shape
    if document_mask is None and query_mask is None:
        pair = None
    else:
        dm = (
            document_mask
            if document_mask is not None
            else torch.ones(1, n_d, dtype=torch.bool, device=matching.device)
        )
        qm = (
            query_mask
            if query_mask is not None
            else torch.ones(1, n_q, dtype=torch.bool, device=matching.device)
        )
        pair = dm[:, :, None] & qm[:, None, :]  # [B, n_d, n_q]
        pair = pair.expand(B, n_d, n_q)
    alpha = normalize(matching, pair, 1)  # over document positions
    beta = normalize(matching, pair, 2)  # over query words
    if document_mask is None:
        count = matching.new_full((B, 1), float(n_d))
    else:
        count = document_mask.to(matching.dtype).sum(1, keepdim=True).expand(B, 1)
    beta_bar = beta.sum(1) / count.clamp(min=1)  # masked rows of beta are zero
    s = (alpha @ beta_bar.unsqueeze(-1)).squeeze(-1)
    # the scores are float32 for half-precision inputs; everything returned is in the
    # document's dtype, as Attention returns its weights in the values' dtype
    out = [t.to(document.dtype) for t in (s, alpha, beta, beta_bar, matching)]
    context = (out[0].unsqueeze(1) @ document).squeeze(1)
    return AoAOutput(*out, context)


def attention_over_attention(
    document: Tensor,
    query: Tensor,
    document_mask: Tensor | None = None,
    query_mask: Tensor | None = None,
) -> AoAOutput:
    """Attention-over-attention with the paper's dot matching ``M = D Q^T`` (Cui et al.
    2017).

    Args:
        document: ``[B, n_d, d]``; query: ``[B, n_q, d]``.
        document_mask: bool ``[B, n_d]``, True = real word; query_mask: bool ``[B, n_q]``.
            Padding is masked both ways: a padded document row gets zero ``alpha`` and
            ``beta`` and ``s = 0``; a padded query column gets zero ``alpha`` and ``beta`` and
            ``beta_bar = 0``. No real document or query word: all zeros, never NaN.

    Returns :class:`AoAOutput`. Cost O(B n_d n_q d) time, O(B n_d n_q) memory.
    """
    _check_inputs(document, query, document_mask, query_mask, matching="dot")
    document, query = _clear_padding(document, query, document_mask, query_mask)
    matching = dot_score(query, document).transpose(1, 2)  # [B, n_d, n_q]
    return _aoa(matching, document, document_mask, query_mask, masked_softmax)


def aoa_answer_scores(
    s: Tensor,
    document_tokens: Tensor,
    candidates: Tensor,
    document_mask: Tensor | None = None,
) -> Tensor:
    """The AoA reader's answer scores ``P(w | D, Q) = sum_{i: D_i = w} s_i`` (pointer-sum
    over the positions holding each candidate word).

    Args:
        s: the document-level attention ``[B, n_d]``.
        document_tokens: word ids of the document ``[B, n_d]`` (integer).
        candidates: candidate word ids ``[B, n_c]`` (integer).
        document_mask: bool ``[B, n_d]``; padded positions never count.

    Returns ``[B, n_c]``. Cost O(B n_d n_c).
    """
    check_tensor(s, "s")
    if s.dim() != 2:
        raise ValueError(f"s has shape {tuple(s.shape)}, expected [B, n_d]")
    for name, t in (("document_tokens", document_tokens), ("candidates", candidates)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise TypeError(f"{name} has dtype {t.dtype}, expected integer word ids")
    if tuple(document_tokens.shape) != tuple(s.shape):
        raise ValueError(
            f"document_tokens has shape {tuple(document_tokens.shape)}, expected [B, n_d] = "
            f"{list(s.shape)}"
        )
    if candidates.dim() != 2 or candidates.shape[0] != s.shape[0]:
        raise ValueError(
            f"candidates has shape {tuple(candidates.shape)}, expected [B, n_c] = "
            f"[{s.shape[0]}, n_c]"
        )
    hit = (document_tokens.unsqueeze(2) == candidates.unsqueeze(1)).to(s.dtype)  # [B, n_d, n_c]
    if document_mask is not None:
        if document_mask.dtype != torch.bool or tuple(document_mask.shape) != tuple(s.shape):
            raise ValueError(
                f"document_mask must be bool [B, n_d] = {list(s.shape)}, got "
                f"{document_mask.dtype} {tuple(document_mask.shape)}"
            )
        hit = hit * document_mask.unsqueeze(2).to(s.dtype)
    return (s.unsqueeze(1) @ hit).squeeze(1)


@register("query", "attention-over-attention", aliases=("aoa", "aoa-reader"))
class AttentionOverAttention(TwoInputAttention):
    """Attention-over-attention (Cui et al. 2017) with a pluggable matching score.

    Args:
        d_q: query word size; d_k: document word size (needed by scores with weights,
            e.g. ``general`` ``M[i, t] = d_i^T W q_t``; checked at the call when given).
        score: the matching score (default ``dot``: ``M = D Q^T``, the paper's).
        align: the normalisation applied column- and row-wise (default ``soft``; also
            ``sparsemax``, ``entmax15``).
        **options: passed to the score (``d_w``, ``act``, ...).

    Call (the two-input convention, :class:`~attnlab.general._convention.TwoInputAttention`,
    see ``docs/call-convention.md``): ``forward(query, key, *, mask1=None, mask2=None)``
    with input 1 ``query`` = the document ``[B, n_d, d_k]``, input 2 ``key`` = the
    question ``[B, n_q, d_q]`` (the paper's order), ``mask1`` bool ``[B, n_d]``, ``mask2``
    bool ``[B, n_q]`` (True = real word). Messages name the inputs ``document`` and
    ``query`` (the paper's names). Every attention (``alpha``, ``beta``, ``s``) is part of
    the :class:`AoAOutput`, so ``need_weights`` changes nothing. Deprecated for one release
    (``DeprecationWarning``): ``document=``, ``document_mask=``, ``query_mask=`` and the
    masks given positionally, ``module(D, Q, document_mask, query_mask)``.
    Returns :class:`AoAOutput` (``s`` ``[B, n_d]``, ``alpha``, ``beta`` ``[B, n_d, n_q]``,
    ``beta_bar`` ``[B, n_q]``). Cost O(B n_d n_q d) time, O(B n_d n_q) memory.

    :formula: M = D Q^T; alpha = softmax over document positions (per query word); beta =
        softmax over query words (per document word); beta_bar = mean_i beta(i); s = alpha
        beta_bar
    :source: Cui et al. 2017, Attention-over-Attention Neural Networks for Reading Comprehension
    :cost: O(B n_d n_q d) time, O(B n_d n_q) memory
    """

    input_names = ("D", "Q")
    renames = MappingProxyType(
        {"document": "query", "document_mask": "mask1", "query_mask": "mask2"}
    )
    rename_style = "quoted"

    def __init__(
        self,
        d_q: int | None = None,
        d_k: int | None = None,
        *,
        score: str | Score = "dot",
        align: str | Alignment = "soft",
        **options: Any,
    ) -> None:
        super().__init__()
        self.d_q, self.d_k = d_q, d_k
        if isinstance(score, Score):
            if options:
                raise TypeError(f"options {sorted(options)} need a score name, not a module")
            self.score = score
        else:
            cls = get("score", score).cls
            kw = dict(options)
            takes = set(inspect.signature(cls).parameters)
            unknown = [o for o in kw if o not in takes]
            if unknown:
                raise TypeError(
                    f"AttentionOverAttention got unknown options {unknown} for score {score!r}"
                )
            if "d_q" in takes:
                kw.setdefault("d_q", d_q)
            if "d_k" in takes:
                kw.setdefault("d_k", d_k)
            self.score = cls(**kw)
        if not self.score.needs_query or getattr(self.score, "vector", False):
            raise ConfigError(
                "attention-over-attention needs a pairwise score that takes the query and "
                "returns one number per pair"
            )
        self.align = get("align", align).cls() if isinstance(align, str) else align
        if not isinstance(self.align, Alignment) or not self.align.supports_multi:
            name = getattr(self.align, "registry_name", type(self.align).__name__)
            raise ConfigError(
                f"alignment {name!r} cannot normalise along a chosen axis (column- and "
                "row-wise); use soft, sparsemax or entmax15"
            )

    def matching(self, document: Tensor, query: Tensor) -> Tensor:
        """``M[b, i, t] = score(q_t, d_i)`` ``[B, n_d, n_q]``."""
        return self.score(query, document).transpose(1, 2)

    def _attend(
        self, call: AttentionCall, *, mask1: Tensor | None = None, mask2: Tensor | None = None
    ) -> AoAOutput:
        """AoA of the document ``call.query`` and the question ``call.key`` with their
        masks ``mask1`` / ``mask2`` (bool ``[B, n_d]`` / ``[B, n_q]``, True = real word)."""
        document, question = call.query, call.key
        same = getattr(self.score, "same_dims", False)
        name = getattr(self.score, "registry_name", type(self.score).__name__) if same else None
        _check_inputs(document, question, mask1, mask2, self.d_k, self.d_q, matching=name)
        check_module_dtype(self, document, "document")
        document, question = _clear_padding(document, question, mask1, mask2)
        matching = self.matching(document, question)
        return _aoa(matching, document, mask1, mask2, self.align.normalize)
