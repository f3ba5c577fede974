"""Co-attention: attention between two feature sets (survey section 3.1.1, Brauwers &
Frasincar 2023).

Two inputs ``F1`` ``[B, n1, d1]`` and ``F2`` ``[B, n2, d2]`` (a question and an image, a
question and a passage, a sentence and an aspect), each with its own key mask ``[B, n1]`` /
``[B, n2]`` (bool, True = real token, or ``None``). Every module here attends over *both*
inputs, each guided by the other, and returns a :class:`CoAttentionOutput` with both
context vectors ``c1`` ``[B, d1]`` and ``c2`` ``[B, d2]``, both weight sets ``a1``
``[B, n1]`` and ``a2`` ``[B, n2]``, and ``output``, the concatenation that the paper feeds
to its output model. The features are the keys and the values (``c1 = sum_i a1_i f1_i``);
project them beforehand if a model needs ``W_K F`` / ``W_V F``.

Call (the library's convention): ``module(query, key, *, mask1=None, mask2=None,
need_weights=False)`` with ``query`` = ``F1`` and ``key`` = ``F2`` (called ``f1``/``f2`` in
error messages); ``value`` and the single ``mask`` are not taken. The old form
``module(f1, f2, mask1, mask2)`` still works for one release with a ``DeprecationWarning``.

| name | what guides the attention over one input | source |
| --- | --- | --- |
| ``alternating-co-attention`` (coarse) | query-less over F1 -> c0; F2 with query c0 -> c2; F1 with query c2 -> c1 | Lu et al. 2016 (HieCoAtt) |
| ``interactive-co-attention`` (coarse) | the other input's masked mean key, both attentions in parallel | Ma et al. 2017 (IAN) |
| ``parallel-co-attention`` (fine) | an affinity matrix A [B, n1, n2] between all pairs of keys | Lu et al. 2016; Seo et al. 2017 (BiDAF) |
| ``multi-grained-co-attention`` | coarse (interactive) and fine (max-pooled affinity) together, four contexts | Fan et al. 2018 (MGAN) |

The coarse mechanisms are compositions of :class:`attnlab.Attention` (any registered score
and alignment). The fine ones compute the affinity with :func:`bilinear_affinity` or
:func:`trilinear_affinity` -- the latter (BiDAF) never holds the ``[B, n1, n2, 3d]``
concatenation: ``w_A`` is split into its three parts -- and normalise the resulting scores
with any alignment module.

Masks: a padded position gets weight 0, never wins a max and never contributes to an
affinity sum; an input with no real position (``n = 0`` or a fully padded row) gets zero
weights and a zero context, never NaN (forward and backward).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_choice,
    check_int,
    check_module_dtype,
    check_same,
    check_tensor,
    is_traced,
)
from attnlab.general._convention import AttentionCall, TwoInputAttention
from attnlab.general.activations import Activation, get_activation
from attnlab.general.alignment import Aligned, Alignment
from attnlab.general.attention import Attention
from attnlab.general.dimensionality import combine_single
from attnlab.general.padding import clear_nonfinite_rows, masked_mean
from attnlab.masks import check_bool_mask, fill_value
from attnlab.output import AttentionOutput, output_pytree
from attnlab.registry import get, register

__all__ = [
    "AlternatingCoAttention",
    "CoAttentionAffinity",
    "CoAttentionOutput",
    "InteractiveCoAttention",
    "MultiGrainedCoAttention",
    "ParallelCoAttention",
    "bilinear_affinity",
    "masked_mean",
    "max_pooled_scores",
    "trilinear_affinity",
]


# ----------------------------------------------------------------------------- output


@output_pytree("path")
@dataclass(kw_only=True)
class CoAttentionOutput(AttentionOutput):
    """Result of a co-attention call: an :class:`~attnlab.output.AttentionOutput` whose
    ``context`` is the concatenation the paper feeds to its output model, with both
    inputs' contexts and weights as fields of their own.

    Attributes:
        context (also ``output``, its old name): ``concat(c1, c2)`` ``[B, d1 + d2]``
            (multi-grained: ``concat(c1, c2, c1_fine, c2_fine)`` ``[B, 2 (d1 + d2)]``).
        weights: with ``need_weights=True`` the weights in the same order,
            ``concat(a1, a2)`` ``[B, n1 + n2]`` (multi-grained: ``concat(a1, a2, a1_fine,
            a2_fine)`` ``[B, 2 (n1 + n2)]``); else ``None``.
        c1, c2: the context vectors of the two inputs, ``[B, d1]`` and ``[B, d2]``
            (multi-grained: the coarse ones).
        a1, a2: their attention weights, ``[B, n1]`` and ``[B, n2]`` (always set).
        c1_fine, c2_fine, a1_fine, a2_fine: the fine-grained contexts and weights of
            multi-grained co-attention (``None`` for the other mechanisms).
        extras: intermediate results, e.g. ``"c0"``/``"a0"`` (alternating),
            ``"query1"``/``"query2"`` (interactive), ``"affinity"`` ``[B, n1, n2]`` and the
            scores ``"e1"``/``"e2"`` (parallel), ``"log_prob1"``/``"log_prob2"`` for a
            stochastic alignment.
    """

    c1: Tensor
    c2: Tensor
    a1: Tensor
    a2: Tensor
    c1_fine: Tensor | None = None
    c2_fine: Tensor | None = None
    a1_fine: Tensor | None = None
    a2_fine: Tensor | None = None

    @property
    def output(self) -> Tensor:
        """``context`` under its old name."""
        return self.context


# ----------------------------------------------------------------------------- helpers


def _check_input(x: object, name: str, batch: int | None, d: int) -> Tensor:
    check_tensor(x, name)
    assert isinstance(x, Tensor)
    if x.dim() != 3 or (batch is not None and x.shape[0] != batch) or x.shape[2] != d:
        b = "B" if batch is None else batch
        n = "n1" if name == "f1" else "n2"
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}, expected [B, {n}, d{name[-1]}] = [{b}, {n}, {d}]"
        )
    return x


def _check_mask(mask: object, name: str, x: Tensor) -> Tensor | None:
    if mask is None:
        return None
    note = " (True = real token; for lengths use attnlab.masks.from_lengths(lengths)[:, 0])"
    mask = check_bool_mask(mask, name, note)
    n = "n1" if name == "mask1" else "n2"
    if mask.shape != x.shape[:2]:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}, expected [B, {n}] = {list(x.shape[:2])}"
        )
    if mask.device != x.device:
        raise ValueError(f"{name} is on {mask.device} but the features are on {x.device}")
    return mask


def _check_pair(
    module: nn.Module, f1: object, f2: object, mask1: object, mask2: object, d1: int, d2: int
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    x1 = _check_input(f1, "f1", None, d1)
    x2 = _check_input(f2, "f2", x1.shape[0], d2)
    check_same(x1, "f1", f2=x2)
    check_module_dtype(module, x1, "f1")
    return x1, x2, _check_mask(mask1, "mask1", x1), _check_mask(mask2, "mask2", x2)


def _clear_padding(
    f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Padding never matters: the NaN / inf entries of padded positions are set to zero
    with ``where`` before anything is computed from them (their finite values are kept, so
    the per-position extras such as the scores of padded positions are unchanged)."""
    return clear_nonfinite_rows(f1, mask1), clear_nonfinite_rows(f2, mask2)


def _takes(kind: str, name: object) -> set[str]:
    if not isinstance(name, str):
        return set()
    return {p for p in inspect.signature(get(kind, name).cls).parameters if p != "self"}


def _route(
    owner: str, options: dict[str, Any], *pairs: tuple[object, object]
) -> list[dict[str, Any]]:
    """Split ``options`` among several ``Attention(score, align)`` modules: each gets the
    options its score or alignment takes; an option that none takes is an error."""
    fixed = {"d_q", "d_k", "out_dim"}
    takes = [(_takes("score", s) | _takes("align", a)) - fixed for s, a in pairs]
    unknown = [o for o in options if not any(o in t for t in takes)]
    if unknown:
        described = "; ".join(
            f"{s!r} + {a!r} take {sorted(t)}" for (s, a), t in zip(pairs, takes, strict=True)
        )
        raise TypeError(f"{owner} got unknown options {unknown}: {described}")
    return [{o: v for o, v in options.items() if o in t} for t in takes]


def _make_align(align: str | Alignment, d_k: int, owner: str, options: dict[str, Any]) -> Alignment:
    if isinstance(align, Alignment):
        if options:
            raise TypeError(
                f"{owner}: alignment options {sorted(options)} apply only to an alignment "
                "given by name"
            )
        module = align
    elif isinstance(align, str):
        cls = get("align", align).cls
        takes = {p for p in inspect.signature(cls).parameters if p != "self"}
        unknown = [o for o in options if o not in takes]
        if unknown:
            raise TypeError(
                f"{owner} got unknown options {unknown}: alignment {align!r} takes "
                f"{sorted(takes - {'d_q', 'd_k'})}"
            )
        kw = dict(options)
        if "d_k" in takes:
            kw.setdefault("d_k", d_k)
        module = cls(**kw)
    else:
        raise ConfigError(
            f"align must be a name or an Alignment module, got {type(align).__name__}"
        )
    if module.local:
        raise ConfigError(
            f"{owner}: local alignment {getattr(module, 'registry_name', align)!r} centres a "
            "window on a query position, but co-attention scores come from the other input "
            "as a whole (use soft, sparsemax, entmax15, hard or reinforced)"
        )
    return module


def _align_vector(
    align: Alignment, e: Tensor, mask: Tensor | None, keys: Tensor
) -> tuple[Tensor, Aligned]:
    """Normalise one score vector ``e`` ``[B, n]`` (mask ``[B, n]``) into weights
    ``[B, n]`` with ``align``; a ``[B, 1, n]`` score row is what the modules expect."""
    aligned = align(e.unsqueeze(1), None if mask is None else mask.unsqueeze(1), keys=keys)
    return aligned.weights.squeeze(1), aligned


# ----------------------------------------------------------------------------- affinity


def bilinear_affinity(
    k1: Tensor, k2: Tensor, W_A: Tensor, act: str | Activation = "tanh"
) -> Tensor:
    """Bilinear affinity ``A = act(K1^T W_A K2)`` (Lu et al. 2016), batch-first:
    ``A[b, i, j] = act(k1_i^T W_A k2_j)``.

    Shapes: ``k1`` ``[B, n1, d1]``, ``k2`` ``[B, n2, d2]``, ``W_A`` ``[d1, d2]`` ->
    ``[B, n1, n2]``. Cost: O(B n1 d1 d2 + B n1 n2 d2) time, O(B n1 (n2 + d2)) memory.
    """
    if W_A.dim() != 2 or W_A.shape != (k1.shape[-1], k2.shape[-1]):
        raise ValueError(
            f"W_A has shape {tuple(W_A.shape)}, expected [d1, d2] = "
            f"[{k1.shape[-1]}, {k2.shape[-1]}]"
        )
    return get_activation(act)((k1 @ W_A) @ k2.transpose(-1, -2))


def trilinear_affinity(
    k1: Tensor, k2: Tensor, w_A: Tensor, act: str | Activation = "identity"
) -> Tensor:
    """Trilinear (concat) affinity ``A_ij = act(w_A^T [k1_i; k2_j; k1_i * k2_j])``
    (Seo et al. 2017, BiDAF), computed without the ``[B, n1, n2, 3d]`` concatenation.

    ``w_A`` ``[3d]`` is split into ``w_a, w_b, w_c`` ``[d]`` each, and
    ``A = (K1 w_a) 1^T + 1 (K2 w_b)^T + (K1 * w_c) K2^T``.

    Shapes: ``k1`` ``[B, n1, d]``, ``k2`` ``[B, n2, d]`` -> ``[B, n1, n2]``.
    Cost: O(B n1 n2 d) time, O(B n1 n2 + B n1 d) memory.
    """
    d = k1.shape[-1]
    if k2.shape[-1] != d:
        raise ValueError(
            f"the trilinear affinity multiplies k1_i * k2_j elementwise, so it needs d1 == d2; "
            f"got k1 {tuple(k1.shape)} and k2 {tuple(k2.shape)}"
        )
    if w_A.dim() != 1 or w_A.shape[0] != 3 * d:
        raise ValueError(f"w_A has shape {tuple(w_A.shape)}, expected [3 d] = [{3 * d}]")
    w_a, w_b, w_c = w_A[:d], w_A[d : 2 * d], w_A[2 * d :]
    A = torch.baddbmm(
        (k1 @ w_a).unsqueeze(-1) + (k2 @ w_b).unsqueeze(-2),
        k1 * w_c,
        k2.transpose(-1, -2),
    )
    return get_activation(act)(A)


def max_pooled_scores(
    A: Tensor, mask1: Tensor | None = None, mask2: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """Scores from the affinity by max-pooling: ``e1_i = max_j A_ij``, ``e2_j = max_i A_ij``,
    the maxima taken over real positions only (a padded position never wins).

    Returns ``(e1 [B, n1], e2 [B, n2], ok1, ok2)``: ``ok1`` ``[B, n1]`` says where ``e1`` is
    defined (a real ``i`` with at least one real ``j``; ``None`` when everything is), and
    likewise ``ok2``. Undefined scores are 0 and must be masked out of the alignment.
    Cost O(B n1 n2).
    """
    B, n1, n2 = A.shape
    m1 = torch.ones(B, n1, dtype=torch.bool, device=A.device) if mask1 is None else mask1
    m2 = torch.ones(B, n2, dtype=torch.bool, device=A.device) if mask2 is None else mask2
    any1, any2 = m1.any(1, keepdim=True), m2.any(1, keepdim=True)  # [B, 1]
    ok1, ok2 = m1 & any2, m2 & any1
    if n1 == 0 or n2 == 0:
        e1, e2 = A.new_zeros(B, n1), A.new_zeros(B, n2)
    else:
        pair = m1.unsqueeze(2) & m2.unsqueeze(1)
        if is_traced():  # no host synchronisation under torch.compile / torch.func
            filled = A.masked_fill(~pair, fill_value(A.dtype))
        else:
            filled = A if bool(pair.all()) else A.masked_fill(~pair, fill_value(A.dtype))
        e1 = torch.where(ok1, filled.amax(2), A.new_zeros(()))
        e2 = torch.where(ok2, filled.amax(1), A.new_zeros(()))
    if mask1 is None and mask2 is None and n1 > 0 and n2 > 0:
        return e1, e2, None, None
    return e1, e2, ok1, ok2


class CoAttentionAffinity(nn.Module):
    """The affinity matrix of fine-grained co-attention.

    ``form="bilinear"`` (Lu et al. 2016): ``A = act(K1 W_A K2^T)``, ``W_A`` ``[d1, d2]``,
    ``act`` default ``tanh``. ``form="concat"`` (Seo et al. 2017, BiDAF's trilinear
    function): ``A_ij = act(w_A^T [k1_i; k2_j; k1_i * k2_j])``, ``w_A`` ``[3 d]`` (needs
    ``d1 == d2``), ``act`` default identity; computed from the three parts of ``w_A``
    without a ``[B, n1, n2, 3d]`` tensor (:func:`trilinear_affinity`).

    Shapes: ``k1`` ``[B, n1, d1]``, ``k2`` ``[B, n2, d2]`` -> ``[B, n1, n2]``.
    Cost: O(B n1 n2 d) time and O(B n1 n2) memory.
    """

    def __init__(self, d1: int, d2: int, form: str = "bilinear", act: str | None = None) -> None:
        super().__init__()
        d1 = check_int(d1, "d1", owner="CoAttentionAffinity", wording="a positive int")
        d2 = check_int(d2, "d2", owner="CoAttentionAffinity", wording="a positive int")
        check_choice(form, "affinity", ("bilinear", "concat"))
        self.form = form
        self.act = act if act is not None else ("tanh" if form == "bilinear" else "identity")
        get_activation(self.act)
        if form == "bilinear":
            bound = 1.0 / math.sqrt(d1)
            self.W_A = nn.Parameter(torch.empty(d1, d2).uniform_(-bound, bound))
        else:
            if d1 != d2:
                raise ConfigError(
                    f"the concat (trilinear) affinity multiplies k1_i * k2_j elementwise, so it "
                    f"needs d1 == d2; got d1={d1}, d2={d2} (use affinity='bilinear')"
                )
            bound = 1.0 / math.sqrt(3 * d1)
            self.w_A = nn.Parameter(torch.empty(3 * d1).uniform_(-bound, bound))

    def forward(self, k1: Tensor, k2: Tensor) -> Tensor:
        if self.form == "bilinear":
            return bilinear_affinity(k1, k2, self.W_A, self.act)
        return trilinear_affinity(k1, k2, self.w_A, self.act)


# ----------------------------------------------------------------------------- the call


def _pair_output(
    c1: Tensor, c2: Tensor, a1: Tensor, a2: Tensor, extras: dict[str, Any]
) -> CoAttentionOutput:
    return CoAttentionOutput(torch.cat([c1, c2], dim=-1), c1=c1, c2=c2, a1=a1, a2=a2, extras=extras)


def _log_probs(extras: dict[str, Any], outs: dict[str, AttentionOutput]) -> dict[str, Any]:
    """``extras`` with ``"log_prob<side>"`` for every attention that sampled."""
    for side, out in outs.items():
        if out.log_prob is not None:
            extras["log_prob" + side] = out.log_prob
    return extras


class _CoAttention(TwoInputAttention):
    """The call every co-attention module shares, the two-input convention
    (:class:`~attnlab.general._convention.TwoInputAttention`): ``module(query, key, *,
    mask1=None, mask2=None, need_weights=False)``. Co-attend ``query`` (``F1`` ``[B, n1,
    d1]``, named ``f1`` in messages) and ``key`` (``F2`` ``[B, n2, d2]``, ``f2``), with the
    key masks ``mask1=`` ``[B, n1]`` and ``mask2=`` ``[B, n2]`` (bool, True = real). The
    features are their own values, so ``value`` and the single ``mask`` are not taken.
    ``need_weights=True`` fills ``weights`` (``a1``, ``a2`` are always set).

    Deprecated for one release (``DeprecationWarning``): ``f1=``/``f2=`` and the masks
    given positionally, ``module(f1, f2, mask1, mask2)``. Subclasses define
    :meth:`attend` on checked inputs whose padding is cleared."""

    renames = MappingProxyType({"f1": "query", "f2": "key"})

    def __init__(self, d1: int, d2: int) -> None:
        super().__init__()
        self.d1 = check_int(d1, "d1", owner=type(self).__name__, wording="a positive int")
        self.d2 = check_int(d2, "d2", owner=type(self).__name__, wording="a positive int")

    @property
    def out_dim(self) -> int:
        return self.d1 + self.d2

    def _attend(
        self, call: AttentionCall, *, mask1: Tensor | None = None, mask2: Tensor | None = None
    ) -> CoAttentionOutput:
        f1, f2, m1, m2 = _check_pair(self, call.query, call.key, mask1, mask2, self.d1, self.d2)
        f1, f2 = _clear_padding(f1, f2, m1, m2)
        out = self.attend(f1, f2, m1, m2)
        if call.need_weights:
            parts = [out.a1, out.a2, out.a1_fine, out.a2_fine]
            out.weights = torch.cat([a for a in parts if a is not None], dim=-1)
        return out

    def attend(
        self, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> CoAttentionOutput:
        raise NotImplementedError


# ----------------------------------------------------------------------------- coarse


@register("feature", "alternating-co-attention", aliases=("alternating", "hiecoatt-alternating"))
class AlternatingCoAttention(_CoAttention):
    """Alternating co-attention (Lu et al. 2016, HieCoAtt), coarse-grained.

    ::

        e0_i = w^T act(W k1_i + b)          (query-less score)      a0 = align(e0), c0 = sum_i a0_i f1_i
        e2_j = score(c0, k2_j)                                       a2 = align(e2), c2 = sum_j a2_j f2_j
        e1_i = score(c2, k1_i)                                       a1 = align(e1), c1 = sum_i a1_i f1_i
        output = concat(c1, c2)

    The three steps are sequential by nature (each needs the previous context). The order
    is not symmetric: as in HieCoAtt, ``F1`` is the input summarised first, without a
    query (the question), and ``F2`` the one attended with that summary (the image).

    Args:
        d1, d2: feature sizes of ``F1`` and ``F2``.
        score: the score of steps 2 and 3 (default ``"additive"``,
            ``w^T tanh(W1 q + W2 k + b)``; HieCoAtt's ``H = tanh(W_x X + (W_g g) 1^T)``
            has no ``b``: pass ``bias=False`` for exactly theirs, in all three steps);
            any registered score name.
        first_score: the query-less score of step 1 (default ``"queryless"``).
        align: alignment name (default ``"soft"``) or module, used by all three steps.
        **options: score / alignment options (``d_w``, ``act``, ``bias``, ...), each
            passed to the steps whose score or alignment takes it.

    Shapes: ``f1`` ``[B, n1, d1]``, ``f2`` ``[B, n2, d2]``, ``mask1`` ``[B, n1]``,
    ``mask2`` ``[B, n2]`` (bool, True = real). Returns :class:`CoAttentionOutput` with
    ``c1`` ``[B, d1]``, ``c2`` ``[B, d2]``, ``a1`` ``[B, n1]``, ``a2`` ``[B, n2]``,
    ``output`` ``[B, d1 + d2]`` and ``extras["c0"]``, ``extras["a0"]``.

    Cost (additive score, ``d_w`` hidden units): O(B (2 n1 + n2) d_w (d1 + d2)) time,
    O(B (n1 + n2) d_w) memory; three dependent steps.

    Source: J. Lu, J. Yang, D. Batra, D. Parikh, "Hierarchical Question-Image Co-Attention
    for Visual Question Answering", NeurIPS 2016.

    :formula: c0 = att(F1, query-less); c2 = att(F2, query c0); c1 = att(F1, query c2); output =
        [c1; c2]
    :source: Lu, Yang, Batra & Parikh 2016, Hierarchical Question-Image Co-Attention for Visual
        Question Answering (HieCoAtt), NeurIPS
    :cost: three sequential attentions: O(B (2 n1 + n2) d_w (d1 + d2)) time for the additive
        score
    """

    def __init__(
        self,
        d1: int,
        d2: int,
        score: str = "additive",
        first_score: str = "queryless",
        align: str | Alignment = "soft",
        **options: Any,
    ) -> None:
        super().__init__(d1, d2)
        for name, value in (("score", score), ("first_score", first_score)):
            if not isinstance(value, str):
                raise ConfigError(
                    f"AlternatingCoAttention: {name} must be a registered score name, got "
                    f"{type(value).__name__} (each step builds its own score of its own sizes)"
                )
        if get("score", first_score).cls.needs_query:
            raise ConfigError(
                f"first_score {first_score!r} needs a query, but step 1 of alternating "
                "co-attention has none; use a query-less score such as 'queryless'"
            )
        o0, o2, o1 = _route(
            "AlternatingCoAttention",
            options,
            (first_score, align),
            (score, align),
            (score, align),
        )
        self.attend0 = Attention(first_score, align, d_k=d1, **o0)
        self.attend2 = Attention(score, align, d_q=d1, d_k=d2, **o2)
        self.attend1 = Attention(score, align, d_q=d2, d_k=d1, **o1)

    def attend(
        self, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> CoAttentionOutput:
        out0 = self.attend0(None, f1, mask=mask1, need_weights=True)
        out2 = self.attend2(out0.context, f2, mask=mask2, need_weights=True)
        out1 = self.attend1(out2.context, f1, mask=mask1, need_weights=True)
        extras = _log_probs(
            {"c0": out0.context, "a0": out0.weights}, {"0": out0, "2": out2, "1": out1}
        )
        return _pair_output(out1.context, out2.context, out1.weights, out2.weights, extras)


@register("feature", "interactive-co-attention", aliases=("interactive", "ian"))
class InteractiveCoAttention(_CoAttention):
    """Interactive co-attention (Ma et al. 2017, IAN), coarse-grained.

    ::

        kbar1 = (1 / |real 1|) sum_{real i} k1_i        kbar2 likewise (masked means)
        e1_i = score(kbar2, k1_i),  a1 = align(e1),  c1 = sum_i a1_i f1_i
        e2_j = score(kbar1, k2_j),  a2 = align(e2),  c2 = sum_j a2_j f2_j
        output = concat(c1, c2)

    The two attentions are independent (parallel). IAN's score is the activated general
    score ``tanh(k^T W q + b)`` (``score="activated-general"``, the default); any
    registered score and alignment can be plugged in. An input with no real token has a
    zero mean key, and its own context is zero.

    Args:
        d1, d2: feature sizes. score: score name (default ``"activated-general"``).
        align: alignment name or module (default ``"soft"``). **options: score / alignment
        options (``act``, ``d_w``, ...).

    Shapes: as :class:`AlternatingCoAttention`; ``extras["query1"]`` ``[B, d2]`` (the
    query of the attention over F1, i.e. ``kbar2``) and ``extras["query2"]`` ``[B, d1]``.

    Cost (activated general): O(B (d1 d2 + n1 d1 + n2 d2)) time -- each side transforms
    its one query once (``W kbar``, O(d1 d2)), then takes one dot product per key -- and
    O(B (n1 + n2)) memory beyond the inputs.

    Source: D. Ma, S. Li, X. Zhang, H. Wang, "Interactive Attention Networks for
    Aspect-Level Sentiment Classification", IJCAI 2017.

    :formula: kbar_i = mean_l k(i)_l; e(1)_l = score(kbar_2, k(1)_l); e(2)_l = score(kbar_1,
        k(2)_l); output = [c1; c2]
    :source: Ma, Li, Zhang & Wang 2017, Interactive Attention Networks for Aspect-Level
        Sentiment Classification (IAN), IJCAI
    :cost: two parallel attentions: O(B (d1 d2 + n1 d1 + n2 d2)) time for the activated general
        score
    """

    def __init__(
        self,
        d1: int,
        d2: int,
        score: str = "activated-general",
        align: str | Alignment = "soft",
        **options: Any,
    ) -> None:
        super().__init__(d1, d2)
        if not isinstance(score, str):
            raise ConfigError(
                "InteractiveCoAttention: score must be a registered score name, got "
                f"{type(score).__name__} (each side builds its own score of its own sizes)"
            )
        o1, o2 = _route("InteractiveCoAttention", options, (score, align), (score, align))
        self.attend1 = Attention(score, align, d_q=d2, d_k=d1, **o1)
        self.attend2 = Attention(score, align, d_q=d1, d_k=d2, **o2)

    def attend(
        self, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> CoAttentionOutput:
        kbar1, kbar2 = masked_mean(f1, mask1), masked_mean(f2, mask2)
        out1 = self.attend1(kbar2, f1, mask=mask1, need_weights=True)
        out2 = self.attend2(kbar1, f2, mask=mask2, need_weights=True)
        extras = _log_probs({"query1": kbar2, "query2": kbar1}, {"1": out1, "2": out2})
        return _pair_output(out1.context, out2.context, out1.weights, out2.weights, extras)


# ----------------------------------------------------------------------------- fine


@register("feature", "parallel-co-attention", aliases=("parallel", "hiecoatt-parallel"))
class ParallelCoAttention(_CoAttention):
    """Parallel co-attention (Lu et al. 2016; Seo et al. 2017), fine-grained.

    Affinity ``A`` ``[B, n1, n2]`` between every pair of keys (:class:`CoAttentionAffinity`):

    * ``affinity="bilinear"`` (HieCoAtt): ``A = act(K1 W_A K2^T)`` (``act`` default tanh);
    * ``affinity="concat"`` (BiDAF): ``A_ij = w_A^T [k1_i; k2_j; k1_i * k2_j]``, computed
      from the three parts of ``w_A`` (never a ``[B, n1, n2, 3d]`` tensor; needs
      ``d1 == d2``).

    Scores:

    * ``scores="projected"`` (HieCoAtt)::

          e1_i = w1^T act(sum_j A_ij W2 k2_j + W1 k1_i)      (e1 = w1^T act(W2 K2 A^T + W1 K1))
          e2_j = w2^T act(sum_i A_ij W1 k1_i + W2 k2_j)      (e2 = w2^T act(W1 K1 A + W2 K2))

      ``W1`` ``[d_w, d1]``, ``W2`` ``[d_w, d2]`` (shared by both), ``w1``, ``w2``
      ``[d_w]``; padded positions contribute nothing to the sums;
    * ``scores="max"`` (max-pooled affinity): ``e1_i = max_j A_ij``, ``e2_j = max_i A_ij``
      over real positions only. An input whose partner has no real position has no
      defined score: its weights and context are zero.

    Then ``a1 = align(e1)``, ``a2 = align(e2)`` (any non-local alignment, default soft)
    and ``c1 = sum_i a1_i f1_i``, ``c2 = sum_j a2_j f2_j``, ``output = concat(c1, c2)``.

    Args:
        d1, d2: feature sizes. affinity: ``"bilinear"`` or ``"concat"``.
        affinity_act: activation of the affinity (default tanh for bilinear, identity for
            concat). scores: ``"projected"`` or ``"max"``. d_w: hidden size of the
            projected scores (default ``max(d1, d2)``). act: their activation (tanh).
        align: alignment name or module (default ``"soft"``); **options: alignment options.

    Shapes: as :class:`AlternatingCoAttention`; ``extras["affinity"]`` ``[B, n1, n2]``
    (masked pairs zeroed), ``extras["e1"]``, ``extras["e2"]``.

    Cost: affinity O(B n1 n2 d) (+ O(B n1 d1 d2) bilinear); projected scores
    O(B n1 n2 d_w + B (n1 d1 + n2 d2) d_w); max scores O(B n1 n2). Memory
    O(B n1 n2 + B (n1 + n2) d_w).

    Sources: J. Lu, J. Yang, D. Batra, D. Parikh, "Hierarchical Question-Image
    Co-Attention for Visual Question Answering", NeurIPS 2016; M. Seo, A. Kembhavi,
    A. Farhadi, H. Hajishirzi, "Bidirectional Attention Flow for Machine Comprehension",
    ICLR 2017.

    :formula: A = act(K1^T W_A K2) or A_ij = w_A^T [k1_i; k2_j; k1_i * k2_j]; e1 = w1^T act(W2
        K2 A^T + W1 K1), e2 = w2^T act(W1 K1 A + W2 K2) or e1_i = max_j A_ij, e2_j = max_i A_ij;
        a = align(e); c = sum a k
    :source: Lu, Yang, Batra & Parikh 2016, Hierarchical Question-Image Co-Attention for VQA
        (HieCoAtt); Seo, Kembhavi, Farhadi & Hajishirzi 2017, Bidirectional Attention Flow for
        Machine Comprehension (BiDAF)
    :cost: O(B n1 n2 (d + d_w)) time, O(B n1 n2 + B (n1 + n2) d_w) memory; never [B, n1, n2, 3d]
    """

    def __init__(
        self,
        d1: int,
        d2: int,
        affinity: str = "bilinear",
        affinity_act: str | None = None,
        scores: str = "projected",
        d_w: int | None = None,
        act: str = "tanh",
        align: str | Alignment = "soft",
        **options: Any,
    ) -> None:
        super().__init__(d1, d2)
        check_choice(scores, "scores", ("projected", "max"))
        self.scores = scores
        if affinity_act is not None:  # named as the caller gave it, not as the affinity's act
            get_activation(affinity_act, "affinity_act")
        self.affinity = CoAttentionAffinity(d1, d2, affinity, affinity_act)
        if scores == "projected":
            if d_w is None:
                d_w = max(d1, d2)
            check_int(d_w, "d_w", owner="ParallelCoAttention", wording="a positive int")
            get_activation(act)
            self.act = act
            self.W1 = nn.Linear(d1, d_w, bias=False)
            self.W2 = nn.Linear(d2, d_w, bias=False)
            bound = 1.0 / math.sqrt(d_w)
            self.w1 = nn.Parameter(torch.empty(d_w).uniform_(-bound, bound))
            self.w2 = nn.Parameter(torch.empty(d_w).uniform_(-bound, bound))
        elif d_w is not None:
            raise ConfigError("d_w sizes the projected scores; scores='max' has no projection")
        self.align1 = _make_align(align, d1, "ParallelCoAttention", options)
        self.align2 = (
            align
            if isinstance(align, Alignment)
            else _make_align(align, d2, "ParallelCoAttention", options)
        )

    def scores_from_affinity(
        self, A: Tensor, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """``(e1, e2, ok1, ok2)`` from a (masked-to-zero) affinity; ``ok`` masks say where
        a score is defined (``None`` = everywhere the input mask allows)."""
        if self.scores == "max":
            return max_pooled_scores(A, mask1, mask2)
        p1, p2 = self.W1(f1), self.W2(f2)  # [B, n1, d_w], [B, n2, d_w]
        h1 = get_activation(self.act)(A @ p2 + p1)
        h2 = get_activation(self.act)(A.transpose(1, 2) @ p1 + p2)
        return h1 @ self.w1, h2 @ self.w2, mask1, mask2

    def attend(
        self, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> CoAttentionOutput:
        A = _masked_affinity(self.affinity(f1, f2), mask1, mask2)
        e1, e2, ok1, ok2 = self.scores_from_affinity(A, f1, f2, mask1, mask2)
        a1, al1 = _align_vector(self.align1, e1, ok1, f1)
        a2, al2 = _align_vector(self.align2, e2, ok2, f2)
        c1 = combine_single(a1.unsqueeze(1), f1).squeeze(1)
        c2 = combine_single(a2.unsqueeze(1), f2).squeeze(1)
        extras: dict[str, Any] = {"affinity": A, "e1": e1, "e2": e2}
        _stochastic_extras(extras, al1, "1")
        _stochastic_extras(extras, al2, "2")
        return _pair_output(c1, c2, a1, a2, extras)


def _masked_affinity(A: Tensor, mask1: Tensor | None, mask2: Tensor | None) -> Tensor:
    """Zero the affinity of every pair with a padded side (so padded positions never
    contribute to an affinity sum)."""
    if mask1 is not None:
        A = torch.where(mask1.unsqueeze(2), A, A.new_zeros(()))
    if mask2 is not None:
        A = torch.where(mask2.unsqueeze(1), A, A.new_zeros(()))
    return A


def _stochastic_extras(extras: dict[str, Any], aligned: Aligned, side: str) -> None:
    if aligned.log_prob is not None:
        lp = aligned.log_prob
        extras["log_prob" + side] = lp.squeeze(1) if lp.dim() == 2 else lp
    for key, value in aligned.extras.items():
        extras[f"{key}{side}"] = value


# ----------------------------------------------------------------------------- multi-grained


@register("feature", "multi-grained-co-attention", aliases=("multi-grained", "mgan"))
class MultiGrainedCoAttention(_CoAttention):
    """Multi-grained co-attention (Fan et al. 2018, MGAN): coarse and fine co-attention
    together, four context vectors.

    ``F1`` is MGAN's context (sentence), ``F2`` its aspect.

    * coarse (IAN-style, :class:`InteractiveCoAttention`): ``c1 = att(F1, query mean K2)``
      ("C-Aspect2Context"), ``c2 = att(F2, query mean K1)`` ("C-Context2Aspect"); MGAN's
      score is bilinear, ``k^T W q`` (``coarse_score="general"``, the default);
    * fine (:class:`ParallelCoAttention` with max-pooled scores): the alignment matrix
      ``A_ij = w_A^T [k1_i; k2_j; k1_i * k2_j]`` (``affinity="concat"``, the default; or
      ``"bilinear"``), then

        - F-Aspect2Context: ``e1_i = max_j A_ij``, ``a1f = align(e1)``,
          ``c1f = sum_i a1f_i f1_i``;
        - F-Context2Aspect with ``fine2="max"`` (default, the max-pooled alignment matrix):
          ``e2_j = max_i A_ij``, ``a2f = align(e2)``, ``c2f = sum_j a2f_j f2_j``; with
          ``fine2="row-mean"``: every context word attends over the aspect,
          ``P_i = align_j(A_ij)``, and the results are averaged over the real context
          words, ``c2f = mean_i sum_j P_ij f2_j = sum_j a2f_j f2_j`` with
          ``a2f_j = mean_i P_ij`` (``extras["fine_rows"]`` holds ``P`` ``[B, n1, n2]``).
          ``"row-mean"`` is F-Context2Aspect as Fan et al. publish it (a softmax over the
          aspect words for every context word, the attended aspect vectors then pooled
          over the context words; averaged here); the default ``"max"`` is the survey's
          max-pooled fine-grained form, the mirror image of F-Aspect2Context.

    ``output = concat(c1, c2, c1f, c2f)`` ``[B, 2 (d1 + d2)]``. MGAN's aspect alignment
    loss (between aspects of one sentence) is a training objective, not part of the
    module.

    Args:
        d1, d2: feature sizes (``d1 == d2`` for the concat affinity).
        coarse_score: score of the coarse attentions (default ``"general"``).
        affinity, affinity_act: the fine affinity (see :class:`ParallelCoAttention`).
        fine2: ``"max"`` or ``"row-mean"`` (see above).
        align: alignment name or module for all four attentions (default ``"soft"``).
        **options: options of the coarse score and of the alignment.

    Returns :class:`CoAttentionOutput` with ``c1``, ``c2``, ``a1``, ``a2`` (coarse) and
    ``c1_fine`` ``[B, d1]``, ``c2_fine`` ``[B, d2]``, ``a1_fine`` ``[B, n1]``, ``a2_fine``
    ``[B, n2]``; ``extras["affinity"]`` ``[B, n1, n2]``.

    Cost: coarse O(B (d1 d2 + n1 d1 + n2 d2)) plus fine O(B n1 n2 d) time; memory
    O(B n1 n2).

    Source: F. Fan, Y. Feng, D. Zhao, "Multi-grained Attention Network for Aspect-Level
    Sentiment Classification", EMNLP 2018.

    :formula: coarse: c1 = att(F1, mean K2), c2 = att(F2, mean K1); fine: A = affinity(K1, K2),
        c1f = sum_i align(max_j A_ij) k1_i, c2f = sum_j align(max_i A_ij) k2_j; output = [c1;
        c2; c1f; c2f]
    :source: Fan, Feng & Zhao 2018, Multi-grained Attention Network for Aspect-Level Sentiment
        Classification (MGAN), EMNLP
    :cost: O(B (d1 d2 + n1 d1 + n2 d2) + B n1 n2 d) time, O(B n1 n2) memory; never [B, n1, n2,
        3d]
    """

    def __init__(
        self,
        d1: int,
        d2: int,
        coarse_score: str = "general",
        affinity: str = "concat",
        affinity_act: str | None = None,
        fine2: str = "max",
        align: str | Alignment = "soft",
        **options: Any,
    ) -> None:
        super().__init__(d1, d2)
        check_choice(fine2, "fine2", ("max", "row-mean"))
        self.fine2 = fine2
        (coarse_opts,) = _route("MultiGrainedCoAttention", options, (coarse_score, align))
        align_opts = {o: v for o, v in options.items() if o in _takes("align", align)}
        self.coarse = InteractiveCoAttention(d1, d2, coarse_score, align, **coarse_opts)
        self.fine = ParallelCoAttention(
            d1, d2, affinity, affinity_act, scores="max", align=align, **align_opts
        )

    @property
    def out_dim(self) -> int:
        return 2 * (self.d1 + self.d2)

    def attend(
        self, f1: Tensor, f2: Tensor, mask1: Tensor | None, mask2: Tensor | None
    ) -> CoAttentionOutput:
        coarse = self.coarse.attend(f1, f2, mask1, mask2)
        extras: dict[str, Any] = {
            "coarse_" + k: v for k, v in coarse.extras.items() if k.startswith("query")
        }
        if self.fine2 == "max":
            fine = self.fine.attend(f1, f2, mask1, mask2)
            extras.update(fine.extras)
            c1f, c2f, a1f, a2f = fine.c1, fine.c2, fine.a1, fine.a2
        else:
            c1f, c2f, a1f, a2f = self._row_mean(f1, f2, mask1, mask2, extras)
        for key in ("log_prob1", "log_prob2"):
            if key in coarse.extras:
                extras["coarse_" + key] = coarse.extras[key]
        return replace(
            coarse,
            context=torch.cat([coarse.c1, coarse.c2, c1f, c2f], dim=-1),
            c1_fine=c1f,
            c2_fine=c2f,
            a1_fine=a1f,
            a2_fine=a2f,
            extras=extras,
        )

    def _row_mean(
        self,
        f1: Tensor,
        f2: Tensor,
        mask1: Tensor | None,
        mask2: Tensor | None,
        extras: dict[str, Any],
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The fine half with ``fine2="row-mean"``: ``(c1f, c2f, a1f, a2f)``; its
        intermediate results go into ``extras``."""
        A = _masked_affinity(self.fine.affinity(f1, f2), mask1, mask2)
        e1, _, ok1, _ = max_pooled_scores(A, mask1, mask2)
        a1f, al1 = _align_vector(self.fine.align1, e1, ok1, f1)
        rows: Aligned = self.fine.align2(A, None if mask2 is None else mask2.unsqueeze(1), keys=f2)
        P = rows.weights  # [B, n1, n2]
        if mask1 is not None:
            P = torch.where(mask1.unsqueeze(2), P, P.new_zeros(()))
        n_real = (
            P.new_full((P.shape[0], 1), float(P.shape[1]))
            if mask1 is None
            else mask1.sum(1, keepdim=True).to(P.dtype)
        )
        a2f = P.sum(1) / n_real.clamp(min=1)
        c1f = combine_single(a1f.unsqueeze(1), f1).squeeze(1)
        c2f = combine_single(a2f.unsqueeze(1), f2).squeeze(1)
        extras.update({"affinity": A, "e1": e1, "fine_rows": P})
        _stochastic_extras(extras, al1, "1")
        return c1f, c2f, a1f, a2f
