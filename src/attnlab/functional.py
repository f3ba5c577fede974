"""The functional layer: attention as pure functions of tensors (like ``torch.nn.functional``).

Score functions return ``e`` ``[B, n_q, n_k]``; alignment functions turn scores into
weights; :func:`attend` runs a whole soft attention with any score, on the fused path
where the score is a scaled dot product and on the memory-lean kernel for the additive
score. The modules in :mod:`attnlab.general` hold parameters and call these functions.

**Derived from the registry.** The score, alignment and dimensionality functions are the
*functional twins* of the registered mechanisms: every registered class that declares a
``function`` (e.g. ``DotScore.function = dot_score``) is exported here under that
function's name -- ``attnlab.functional.dot_score``, ``attnlab.functional.soft_align`` --
including mechanisms registered later, from outside the package. So adding a score is
local: its class declares its twin, and :func:`attend`, ``__all__`` and the
documentation test pick it up. Only the kernels and helpers that are not the twin of one
mechanism (``attend``, the lean kernels, ``masked_softmax``, ...) are named here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor

from attnlab import masks as _masks
from attnlab import registry
from attnlab._checks import batched_query, check_flags, check_keys, check_same, check_values
from attnlab.general.alignment import gumbel_softmax_align as gumbel_softmax_align
from attnlab.general.alignment import masked_softmax as masked_softmax
from attnlab.general.alignment import reinforce_loss as reinforce_loss
from attnlab.general.dimensionality import combine_single
from attnlab.general.dimensionality import multi_dimensional_attend as multi_dimensional_attend
from attnlab.general.fused import additive_score_lean as additive_score_lean
from attnlab.general.fused import multi_dim_attend_lean as multi_dim_attend_lean
from attnlab.general.local import local_window_attend as local_window_attend
from attnlab.general.padding import clear_attention_inputs
from attnlab.general.planner import Capabilities, plan_call, score_class_capabilities
from attnlab.general.scoring import (
    multi_dimensional_additive_score as multi_dimensional_additive_score,
)
from attnlab.general.sdpa import _sdpa_attend
from attnlab.general.sdpa import sdpa_attend as sdpa_attend
from attnlab.output import AttentionOutput

#: The functions of this module that are not the functional twin of one registered
#: mechanism (those come from the registry, see :func:`twins`).
HELPERS = (
    "additive_score_lean",
    "attend",
    "gumbel_softmax_align",
    "local_window_attend",
    "masked_softmax",
    "multi_dim_attend_lean",
    "multi_dimensional_additive_score",
    "multi_dimensional_attend",
    "reinforce_loss",
    "sdpa_attend",
)
#: The registry kinds whose mechanisms may declare a functional twin.
TWIN_KINDS = ("score", "align", "dim")


def twins() -> dict[str, Callable[..., Any]]:
    """``{function name: function}`` for every registered mechanism (of the kinds in
    :data:`TWIN_KINDS`) whose class declares a functional twin ``function``."""
    found: dict[str, Callable[..., Any]] = {}
    for kind in TWIN_KINDS:
        for entry in registry.entries(kind):
            fn = getattr(entry.cls, "function", None)
            if fn is not None:
                found.setdefault(fn.__name__, fn)
    return found


def __getattr__(name: str) -> Any:
    """``__all__`` and the functional twins, looked up in the registry when asked for."""
    if name == "__all__":
        return sorted({*HELPERS, *twins()})
    if not name.startswith("__"):
        fn = twins().get(name)
        if fn is not None:
            return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *twins()})


def _twin(entry: registry.Entry) -> Callable[..., Tensor]:
    fn = getattr(entry.cls, "function", None)
    if fn is None:
        raise TypeError(
            f"score {entry.name!r} ({entry.cls.__name__}) has no functional twin: give the "
            "class a 'function' attribute to use it with attnlab.functional.attend"
        )
    return fn


@functools.cache
def _score_takes(
    fn: Callable[..., Tensor], inputs: int
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The parameter names of a score function after its ``inputs`` tensors, and those of
    them without a default (None: it takes any keyword); read once per function
    (``inspect.signature`` is not free)."""
    signature = list(inspect.signature(fn).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature):
        return None
    named = [p for p in signature[inputs:] if p.kind is not p.VAR_POSITIONAL]
    required = tuple(p.name for p in named if p.default is inspect.Parameter.empty)
    return tuple(p.name for p in named), required


def _check_score_params(entry: registry.Entry, params: dict[str, Any]) -> None:
    """Every keyword of ``attend`` beyond its own must be a parameter of the score's
    functional twin (the tensors it scores excluded), and every parameter of the twin
    without a default must be given: one line naming the keyword, the score and what it
    takes, before anything is computed."""
    found = _score_takes(_twin(entry), 2 if entry.cls.needs_query else 1)  # (q, k) or (k,)
    if found is None:
        return
    takes, required = found
    unknown = [name for name in params if name not in takes]
    if unknown:
        raise TypeError(
            f"unexpected keyword argument {unknown[0]!r}: score {entry.name!r} takes no such "
            f"parameter (its parameters: {', '.join(takes) or 'none'}); attend is soft "
            "attention, for another alignment build attnlab.Attention"
        )
    missing = [name for name in required if name not in params]
    if missing:
        noun, it, kw = (
            ("parameters", "them", "keywords")
            if len(missing) > 1
            else ("parameter", "it", "a keyword")
        )
        raise TypeError(
            f"score {entry.name!r} is missing the {noun} {', '.join(missing)}: pass {it} to "
            f"attend as {kw} (its parameters: {', '.join(takes)}), or use "
            f"attnlab.Attention(score={entry.name!r}), which learns {it}"
        )


def _dot_form(
    entry: registry.Entry, q: Tensor, k: Tensor, params: dict[str, Any]
) -> tuple[Tensor, Tensor, float]:
    if getattr(entry.cls, "same_dims", False) and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"score {entry.name!r} needs d_q == d_k, but q has shape {tuple(q.shape)} and k "
            f"has shape {tuple(k.shape)}"
        )
    # validate the parameters (unknown names, shapes, dtypes) through the score function
    # on empty slices, so the fused path rejects exactly what the explicit one rejects
    _twin(entry)(q[:, :0], k[:, :0], **params)
    return entry.cls.function_dot_form(q, k, **params)


def _batched_inputs(
    name: str, caps: Capabilities, q: Tensor | None, k: Tensor, v: Tensor
) -> tuple[Tensor | None, bool, int]:
    """The checked query as ``[B, n_q, d_q]`` (``None`` for a query-less score), whether
    it was a single query, and ``n_q``."""
    if caps.queryless:
        check_keys(k, k.shape[0] if k.dim() == 3 else -1, "k")
        q3, single, n_q = None, True, 1
    else:
        if q is None:
            raise ValueError(f"score {name!r} needs a query q, got None")
        q3, single = batched_query(q, "q")
        n_q = q3.shape[1]
        check_keys(k, q3.shape[0], "k")
        check_same(q3, "q", k=k)
    check_values(v, k.shape[0], k.shape[1], "v")
    check_same(k, "k", v=v)
    return q3, single, n_q


def _explicit(
    entry: registry.Entry,
    q3: Tensor | None,
    k: Tensor,
    v: Tensor,
    mask3: Tensor | None,
    params: dict[str, Any],
) -> tuple[Tensor, Tensor]:
    """The scores from the functional twin, the masked softmax and the weighted sum."""
    fn = _twin(entry)
    e = fn(q3, k, **params) if entry.cls.needs_query else fn(k, **params)
    # the scores are float32 for half inputs; the weighted sum runs in the values' dtype
    weights = masked_softmax(e, mask3).to(v.dtype)
    return combine_single(weights, v), weights


def attend(
    q: Tensor | None,
    k: Tensor,
    v: Tensor,
    score: str = "scaled_dot",
    mask: Tensor | None = None,
    need_weights: bool = False,
    **score_params: Any,
) -> AttentionOutput:
    """Soft attention ``c = sum_l softmax_l(score(q, k_l)) v_l`` with any score function.

    Args:
        q: ``[B, n_q, d_q]`` or ``[B, d_q]`` (ignored, may be ``None``, for ``queryless``).
        k: ``[B, n_k, d_k]``. v: ``[B, n_k, d_v]``.
        score: the name of any registered score (``dot``, ``scaled_dot``, ``general``,
            ``biased_general``, ``activated_general``, ``cosine``, ``additive``,
            ``queryless``, ... and those registered by the user).
        mask: bool broadcastable to ``[B, n_q, n_k]``, True = may attend.
        need_weights: also return the weights.
        **score_params: the score's parameters, named as in its functional twin (``W``,
            ``b``, ``W1``, ``W2``, ``w``, ``act``). A parameter the score does not take,
            or one it needs that is left out (``additive`` without ``W1``, ``W2``, ``w``),
            is a one-line ``TypeError`` naming it, before anything runs; to learn the
            parameters instead, use ``attnlab.Attention(score=...)``.

    Dot-product scores (dot, scaled-dot, general, biased-general, cosine: those whose
    class gives a ``function_dot_form``) run on PyTorch's fused
    ``scaled_dot_product_attention``; the additive score on the chunked kernel; any other
    score explicitly, through its class's ``function``. Keys and values that no query may
    attend, and query rows that may attend nothing, never matter, whatever they hold (they
    are cleared with ``torch.where`` first). Half precision inputs: the scores and the
    softmax are computed in float32.
    Returns an :class:`AttentionOutput` (``context`` ``[B, n_q, d_v]`` or ``[B, d_v]``).
    Cost: the score's (O(B n_q n_k d) for the dot-product forms) plus O(B n_q n_k d_v) for
    the weighted sum; memory O(B n_q n_k), or O(B n_q d_v) on the fused kernel without
    weights. ``score`` must be a name (``TypeError`` otherwise) and ``need_weights`` a bool
    (``TypeError``: ``"no"`` would switch it on).
    """
    if not isinstance(score, str):
        raise TypeError(f"score must be the name of a registered score, got {type(score).__name__}")
    check_flags(need_weights=need_weights)
    entry = registry.get("score", score)
    _check_score_params(entry, score_params)
    caps = score_class_capabilities(entry.cls)
    q3, single, n_q = _batched_inputs(entry.name, caps, q, k, v)
    B, n_k = k.shape[:2]
    mask3 = _masks.normalize_mask(mask, B, n_q, n_k, device=k.device, single_query=single)
    # padding never matters, whatever it holds: cleared before any product touches it
    q3, k, v = clear_attention_inputs(q3, k, v, mask3, self_attention=q is k)
    # need_weights checked above, n_k a size of k: the planner need not check them again
    plan = plan_call(caps, "auto", need_weights, n_k, k.device, k.dtype, False, None, None)
    if plan.path == "sdpa":
        assert q3 is not None
        q2, k2, scale = _dot_form(entry, q3, k, score_params)
        context, weights = _sdpa_attend(q2, k2, v, scale, mask3, 0.0, need_weights, clear=False)
        path = "sdpa"
    else:
        context, weights = _explicit(entry, q3, k, v, mask3, score_params)
        # the additive score function is the chunked kernel; no other fused path here
        path = "lean-additive" if caps.additive else "explicit"
    if single:
        context = context.squeeze(1)
        weights = weights.squeeze(1) if weights is not None else None
    return AttentionOutput(context, weights if need_weights else None, path=path)
