"""Rotatory attention (Zheng & Xia 2018, LCR-Rot) and its multi-hop form (Wallaart &
Frasincar 2019, LCR-Rot-hop).

For target-dependent sentiment a sentence is cut into a left context ``F_l``, the target
phrase ``F_t`` and a right context ``F_r``. Rotatory attention lets the target and the
contexts attend to each other in turn:

    r_t  = mean(F_t)                                  (masked mean of the target)
    r_l  = attend(F_l, query r_t)                     left context, target-aware
    r_r  = attend(F_r, query r_t)                     right context, target-aware
    r_tl = attend(F_t, query r_l)                     target, left-aware
    r_tr = attend(F_t, query r_r)                     target, right-aware
    r    = concat(r_l, r_r, r_tl, r_tr)

The hop variant repeats the rotation with the new target vectors as queries:
``r_l^(s+1) = attend(F_l, query r_tl^(s))``, ``r_r^(s+1) = attend(F_r, query r_tr^(s))``,
then ``r_tl^(s+1) = attend(F_t, query r_l^(s+1))`` and ``r_tr^(s+1) = attend(F_t, query
r_r^(s+1))``; hop 1 is LCR-Rot (``r_tl^(0) = r_tr^(0) = r_t``).

Call (the library's convention, the parts in sentence order): ``module(left, target,
right, *, left_mask=None, target_mask=None, right_mask=None, need_weights=False)`` --
``query`` = left, ``key`` = target, ``value`` = right. Masks given positionally still work
for one release with a ``DeprecationWarning``.

Each ``attend`` is an :class:`attnlab.Attention`; the papers use the activated general
score ``tanh(h^T W q + b)`` with soft alignment, the default here; any score and alignment
can be plugged in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from attnlab._checks import (
    ConfigError,
    check_flags,
    check_int,
    check_module_dtype,
    check_optional_int,
    check_same,
    check_tensor,
)
from attnlab.feature.co_attention import masked_mean  # one masked mean (re-exported here)
from attnlab.general._convention import AttentionCall, ConventionAttention, is_mask, reject
from attnlab.general.attention import Attention
from attnlab.output import AttentionOutput, output_pytree
from attnlab.registry import register

__all__ = ["LCRRotHop", "RotatoryAttention", "RotatoryOutput", "masked_mean"]


@output_pytree("path")
@dataclass(kw_only=True)
class RotatoryOutput(AttentionOutput):
    """Result of rotatory attention: an :class:`~attnlab.output.AttentionOutput` with the
    four context vectors and the weights of every hop.

    Attributes:
        context (also ``output``, its old name): the final representation
            ``concat(r_l, r_r, r_tl, r_tr)`` ``[B, 2 d_c + 2 d_t]`` (after the last hop).
        weights: with ``need_weights=True`` the last hop's weights, ``hops[-1]`` (a dict);
            else ``None``.
        left, right, target_left, target_right: the four context vectors of the last hop.
        hops: one dict per hop with the weights ``"left"`` ``[B, n_l]``, ``"right"``
            ``[B, n_r]``, ``"target_left"`` and ``"target_right"`` ``[B, n_t]`` (always set).
        log_prob: for stochastic alignments (hard, reinforced), the summed log-probability
            ``[B]`` of every attention's sampled choice over all hops, for a REINFORCE
            loss; else ``None``.
    """

    left: Tensor
    right: Tensor
    target_left: Tensor
    target_right: Tensor
    hops: list[dict[str, Tensor]] = field(default_factory=list)

    @property
    def output(self) -> Tensor:
        """``context`` under its old name."""
        return self.context


def _check_part(x: Tensor, mask: Tensor | None, name: str, batch: int | None, d: int) -> None:
    check_tensor(x, name)
    if x.dim() != 3 or (batch is not None and x.shape[0] != batch) or x.shape[2] != d:
        b = batch if batch is not None else "B"
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected [B, n, d] = [{b}, n, {d}]")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"{name}_mask must be a bool tensor [B, n]")
        if mask.shape != x.shape[:2]:
            raise ValueError(
                f"{name}_mask has shape {tuple(mask.shape)}, expected [B, n] = {list(x.shape[:2])}"
            )


class _Rotation(nn.Module):
    """The four attentions of one rotation."""

    def __init__(self, d_c: int, d_t: int, score: str, align: str, options: dict[str, Any]):
        super().__init__()
        self.left = Attention(score, align, d_q=d_t, d_k=d_c, **options)
        self.right = Attention(score, align, d_q=d_t, d_k=d_c, **options)
        self.target_left = Attention(score, align, d_q=d_c, d_k=d_t, **options)
        self.target_right = Attention(score, align, d_q=d_c, d_k=d_t, **options)


@register("feature", "lcr-rot-hop", aliases=("rotatory-hop",))
class LCRRotHop(ConventionAttention):
    """Multi-hop rotatory attention (LCR-Rot-hop, Wallaart & Frasincar 2019).

    Call (the one convention ``forward``, the parts in sentence order): ``module(left,
    target, right, *, left_mask=None, target_mask=None, right_mask=None,
    need_weights=False)`` -- ``query`` = the left context ``F_l`` ``[B, n_l, d_c]`` (named
    ``left`` in messages), ``key`` = the target ``F_t`` ``[B, n_t, d_t]`` (``target``),
    ``value`` = the right context ``F_r`` ``[B, n_r, d_c]`` (``right``); one bool mask per
    part ``[B, n]`` (True = real). The single ``mask`` is not taken. ``need_weights=True``
    fills ``weights`` with the last hop's weights (``hops`` is always set). Deprecated for
    one release (``DeprecationWarning``): ``left=``, ``target=``, ``right=`` and the masks
    given positionally, ``module(l, t, r, ml, mt, mr)``.

    Args:
        d_c: size of the context features (left and right). d_t: size of the target
            features (default ``d_c``).
        hops: number of rotations ``S`` (1 = LCR-Rot).
        share_weights: reuse the same four attentions in every hop (default) or give each
            hop its own.
        score, align, **options: the attention used for each ``attend`` (default the
            papers' activated general score ``tanh(h^T W q + b)`` with soft alignment).

    Shapes: ``left`` ``[B, n_l, d_c]``, ``target`` ``[B, n_t, d_t]``, ``right``
    ``[B, n_r, d_c]``, each with an optional bool mask ``[B, n]`` (True = real token). Any
    part may be empty (``n = 0``, or a row with no real token, e.g. a target at the start
    of a sentence): its context vector is zero. Returns :class:`RotatoryOutput`, ``output``
    ``[B, 2 d_c + 2 d_t]``.

    Cost: O(S B (d_c d_t + (n_l + n_r) d_c + n_t d_t)) time for the activated general
    score (each of the four attentions transforms its one query once, O(d_c d_t), then
    takes one dot product per key).

    :formula: for s = 1..S: r_l = att(F_l, r_tl); r_r = att(F_r, r_tr); r_tl = att(F_t, r_l);
        r_tr = att(F_t, r_r); r = [r_l; r_r; r_tl; r_tr]
    :source: Wallaart & Frasincar 2019, A Hybrid Approach for Aspect-Based Sentiment Analysis
        Using a Lexicalized Domain Ontology and Attentional Neural Models (LCR-Rot-hop)
    :cost: O(S B (d_c d_t + (n_l + n_r) d_c + n_t d_t))
    """

    keywords = ("left_mask", "target_mask", "right_mask")
    positional_masks = (keywords, 4)

    def __init__(
        self,
        d_c: int,
        d_t: int | None = None,
        hops: int = 3,
        share_weights: bool = True,
        score: str = "activated-general",
        align: str = "soft",
        **options: Any,
    ) -> None:
        super().__init__()
        check_int(hops, "hops")
        check_int(d_c, "d_c")
        check_optional_int(d_t, "d_t")
        check_flags(share_weights=share_weights)
        for key in ("value_dim", "out_dim"):
            if options.get(key) is not None:
                raise ConfigError(
                    f"rotatory attention does not take {key}: each context vector is the "
                    "query of the next attention, so it keeps the feature size (d_c or d_t)"
                )
        d_t = d_c if d_t is None else d_t
        self.d_c, self.d_t, self.hops = d_c, d_t, hops
        n_rot = 1 if share_weights else hops
        self.rotations = nn.ModuleList(
            [_Rotation(d_c, d_t, score, align, options) for _ in range(n_rot)]
        )

    @property
    def out_dim(self) -> int:
        return 2 * self.d_c + 2 * self.d_t

    def _inputs(self, call: AttentionCall, extras: dict[str, Any]) -> AttentionCall:
        owner = type(self).__name__
        call = self._renamed(call, extras, {"left": "query", "target": "key", "right": "value"})
        reject(
            owner,
            "mask",
            call.mask,
            "give one mask per part: left_mask=, target_mask=, right_mask=",
        )
        if call.query is None or call.key is None or call.value is None or is_mask(call.value):
            raise TypeError(
                f"{owner}.forward() needs the three parts: query (left), key (target) and "
                "value (right)"
            )
        return call

    def _attend(self, call: AttentionCall, **masks: Tensor | None) -> RotatoryOutput:
        """``masks``: ``left_mask=``, ``target_mask=``, ``right_mask=`` (``keywords``)."""
        parts = (call.query, call.key, call.value)
        out = self._rotate(*parts, *(masks.get(name) for name in self.keywords))
        if call.need_weights:
            out.weights = out.hops[-1]  # type: ignore[assignment]
        return out

    def _rotate(
        self,
        left: Tensor,
        target: Tensor,
        right: Tensor,
        left_mask: Tensor | None,
        target_mask: Tensor | None,
        right_mask: Tensor | None,
    ) -> RotatoryOutput:
        check_tensor(target, "target")
        B = target.shape[0] if target.dim() == 3 else None
        _check_part(target, target_mask, "target", B, self.d_t)
        _check_part(left, left_mask, "left", B, self.d_c)
        _check_part(right, right_mask, "right", B, self.d_c)
        check_same(target, "target", left=left, right=right)
        check_module_dtype(self, left, "left")
        r_tl = r_tr = masked_mean(target, target_mask)
        hops: list[dict[str, Tensor]] = []
        log_prob: Tensor | None = None
        for s in range(self.hops):
            rot = self.rotations[s % len(self.rotations)]
            out_l = rot.left(r_tl, left, mask=left_mask, need_weights=True)
            out_r = rot.right(r_tr, right, mask=right_mask, need_weights=True)
            out_tl = rot.target_left(out_l.context, target, mask=target_mask, need_weights=True)
            out_tr = rot.target_right(out_r.context, target, mask=target_mask, need_weights=True)
            r_l, r_r, r_tl, r_tr = out_l.context, out_r.context, out_tl.context, out_tr.context
            for out in (out_l, out_r, out_tl, out_tr):
                if out.log_prob is not None:
                    lp = out.log_prob.reshape(out.log_prob.shape[0], -1).sum(-1)
                    log_prob = lp if log_prob is None else log_prob + lp
            hops.append(
                {
                    "left": out_l.weights,
                    "right": out_r.weights,
                    "target_left": out_tl.weights,
                    "target_right": out_tr.weights,
                }
            )
        return RotatoryOutput(
            torch.cat([r_l, r_r, r_tl, r_tr], dim=-1),
            log_prob=log_prob,
            left=r_l,
            right=r_r,
            target_left=r_tl,
            target_right=r_tr,
            hops=hops,
        )


@register("feature", "rotatory", aliases=("lcr-rot", "rotatory-attention"))
class RotatoryAttention(LCRRotHop):
    """Rotatory attention (LCR-Rot, Zheng & Xia 2018): one rotation of
    :class:`LCRRotHop`. Same arguments (without ``hops``), shapes and output.

    :formula: r_t = mean(F_t); r_l = att(F_l, r_t); r_r = att(F_r, r_t); r_tl = att(F_t, r_l);
        r_tr = att(F_t, r_r); r = [r_l; r_r; r_tl; r_tr]
    :source: Zheng & Xia 2018, Left-Center-Right Separated Neural Network for Aspect-based
        Sentiment Analysis with Rotatory Attention (LCR-Rot)
    :cost: O(B (d_c d_t + (n_l + n_r) d_c + n_t d_t))
    """

    def __init__(
        self,
        d_c: int,
        d_t: int | None = None,
        score: str = "activated-general",
        align: str = "soft",
        **options: Any,
    ) -> None:
        super().__init__(d_c, d_t, 1, True, score, align, **options)
