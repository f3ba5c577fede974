"""Score functions: ``e_l = score(q, k_l)`` (survey section 3.2.1).

Shapes (batch-first): ``q`` ``[B, n_q, d_q]`` (or a single query ``[B, d_q]``), ``k``
``[B, n_k, d_k]``; a score function returns ``e`` ``[B, n_q, n_k]`` (``[B, n_k]`` for a
single query). Weight matrices have the paper's shapes, which are also
``nn.Linear.weight``'s layout: ``W1`` is ``[d_w, d_q]`` and multiplies ``q``.

Each score comes as a pure function (``additive_score``, ``dot_score``, ...) and as an
``nn.Module`` holding its parameters (``AdditiveScore``, ``DotScore``, ...). The modules
also tell the general attention module how they can be computed fast:

* ``dot_form(q, k)`` returns ``(q', k', scale)`` when the score equals
  ``scale * q'^T k'_l`` -- then attention runs on PyTorch's fused
  ``scaled_dot_product_attention``;
* ``lean_parts(q, k)`` (additive scores) returns the projected query and keys for the
  memory-lean kernels of :mod:`attnlab.general.fused`;
* ``explicit(q, k)`` is the textbook computation, the reference the fast paths are
  tested against.

| name | formula | source |
| --- | --- | --- |
| additive | ``w^T act(W1 q + W2 k_l + b)`` | Bahdanau et al. 2015 |
| dot | ``q^T k_l`` | Luong et al. 2015 |
| scaled-dot | ``q^T k_l / sqrt(d_k)`` | Vaswani et al. 2017 |
| general | ``k_l^T W q`` | Luong et al. 2015 |
| biased-general | ``k_l^T (W q + b)`` | Sordoni et al. 2016 |
| activated-general | ``act(k_l^T W q + b)`` | Ma et al. 2017 |
| cosine | ``q^T k_l / (|q| |k_l|)`` | Graves et al. 2014 |
| queryless | ``w^T act(W k_l + b)`` | Lin et al. 2017; Yang et al. 2016 |

**Half precision.** Given ``float16`` / ``bfloat16`` inputs (and parameters), a score
function computes in float32 -- its inputs and parameters are cast, so gradients still
reach them -- and returns the scores in **float32**, the dtype the alignments compute in.
A float16 dot product of inputs of magnitude 150 in 4 dimensions already exceeds float16's
largest number (65504), and ``W1 q + W2 k`` of large inputs cancels digits that bfloat16
does not have; in float32 neither happens. ``dot_form`` returns its transformed query in
the input dtype, for PyTorch's fused kernel (which accumulates in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module

from attnlab._checks import (
    ConfigError,
    batched_query,
    check_flags,
    check_int,
    check_keys,
    check_module_dtype,
    check_optional_int,
    check_param,
    check_positive,
    check_same,
    check_tensor,
    softmax_dtype,
)
from attnlab.general.activations import Activation, get_activation
from attnlab.registry import Configurable, register

__all__ = [
    "ActivatedGeneralScore",
    "AdditiveScore",
    "BiasedGeneralScore",
    "CosineScore",
    "DotScore",
    "GeneralScore",
    "QuerylessScore",
    "ScaledDotScore",
    "Score",
    "activated_general_score",
    "additive_score",
    "apply_layer",
    "biased_general_score",
    "cosine_score",
    "dot_score",
    "general_score",
    "multi_dimensional_additive_score",
    "queryless_score",
    "scaled_dot_score",
]

COSINE_EPS = 1e-8


def _prepare(q: Tensor, k: Tensor) -> tuple[Tensor, bool]:
    q3, single = batched_query(q, "q")
    check_keys(k, q3.shape[0], "k")
    check_same(q3, "q", k=k)
    return q3, single


def _finish(e: Tensor, single: bool) -> Tensor:
    return e.squeeze(1) if single else e


def _work(x: Tensor) -> Tensor:
    """``x`` in the dtype scores are computed in: float32 for half precision, else its own."""
    return x.to(softmax_dtype(x.dtype))


def _pairwise(q: Tensor, k: Tensor) -> Tensor:
    """``q @ k^T`` in the scores' dtype (no float16 overflow)."""
    return _work(q) @ _work(k).transpose(-1, -2)


def _linear(x: Tensor, W: Tensor, b: Tensor | None = None) -> Tensor:
    """``W x + b`` in the scores' dtype (parameters cast; gradients still reach them)."""
    return F.linear(_work(x), _work(W), None if b is None else _work(b))


def _hooked(layer: nn.Module) -> bool:
    """Whether calling ``layer`` runs hooks (its own or the global module hooks that
    ``torch.nn.modules.module.register_module_forward_hook`` and friends install)."""
    return bool(
        layer._forward_pre_hooks
        or layer._forward_hooks
        or layer._backward_pre_hooks
        or layer._backward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_forward_hooks
        or _module._global_backward_pre_hooks
        or _module._global_backward_hooks
    )


def _plain_linear(layer: nn.Module, x: Tensor, b: Tensor | None) -> Tensor:
    bias = layer.bias if b is None else (b if layer.bias is None else layer.bias + b)
    return _linear(x, layer.weight, bias)


def _plain_conv1d(layer: nn.Module, x: Tensor, b: Tensor | None) -> Tensor:
    if b is not None:
        raise TypeError("apply_layer adds a bias only to a linear layer")
    bias = None if layer.bias is None else _work(layer.bias)
    args = (layer.stride, layer.padding, layer.dilation, layer.groups)
    return F.conv1d(_work(x), _work(layer.weight), bias, *args)


#: the layers whose parameters the scores apply themselves (exactly these classes)
_PLAIN: dict[type[nn.Module], Callable[[nn.Module, Tensor, Tensor | None], Tensor]] = {
    nn.Linear: _plain_linear,
    nn.Conv1d: _plain_conv1d,
}


def apply_layer(layer: nn.Module, x: Tensor, b: Tensor | None = None) -> Tensor:
    """``layer(x) + b`` in the scores' dtype (float32 for half-precision inputs).

    A score's ``nn.Linear`` (or a location-aware score's ``nn.Conv1d``) that is exactly
    that class and runs no hook is applied with its parameters cast to that dtype, as the
    score functions apply explicit weights. Anything else in its place is **called**, so
    that what it adds is honoured: a LoRA adapter or any module put in the layer's place,
    a quantized layer, one reparametrised by ``torch.nn.utils.prune`` or by a forward
    pre-hook, a ``torch.nn.utils.parametrize`` parametrisation, hooks that record or
    count (``register_forward_hook`` on the layer, or the global module hooks). Such a
    layer computes in its own dtype (the input is cast to its first floating parameter's
    dtype) and its output is cast to the scores' dtype."""
    rule = _PLAIN.get(type(layer))
    if rule is not None and not _hooked(layer) and _conv_zero_padded(layer):
        return rule(layer, x, b)
    own = next((p.dtype for p in layer.parameters() if p.is_floating_point()), x.dtype)
    y = _work(layer(x.to(own)))
    return y if b is None else y + _work(b)


def _conv_zero_padded(layer: nn.Module) -> bool:
    return getattr(layer, "padding_mode", "zeros") == "zeros"


def _require_same_dim(q: Tensor, k: Tensor, what: str) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{what} needs d_q == d_k, but q has shape {tuple(q.shape)} and k has shape "
            f"{tuple(k.shape)}"
        )


# ----------------------------------------------------------------------------- functional


def dot_score(q: Tensor, k: Tensor) -> Tensor:
    """Multiplicative score ``e_l = q^T k_l`` (Luong et al. 2015). Needs ``d_q == d_k``. Shapes:
    ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``), ``k`` ``[B, n_k, d_k]`` -> ``e``
    ``[B, n_q, n_k]`` (``[B, n_k]``). Cost: O(B n_q n_k d)."""
    q3, single = _prepare(q, k)
    _require_same_dim(q3, k, "dot_score")
    return _finish(_pairwise(q3, k), single)


def scaled_dot_score(q: Tensor, k: Tensor) -> Tensor:
    """Scaled multiplicative score ``e_l = q^T k_l / sqrt(d_k)`` (Vaswani et al. 2017). Needs
    ``d_q == d_k``. Shapes: ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``), ``k``
    ``[B, n_k, d_k]`` -> ``e`` ``[B, n_q, n_k]`` (``[B, n_k]``). Cost: O(B n_q n_k d)."""
    q3, single = _prepare(q, k)
    _require_same_dim(q3, k, "scaled_dot_score")
    scale = 1.0 / math.sqrt(k.shape[-1]) if k.shape[-1] else 1.0
    return _finish(_pairwise(q3, k) * scale, single)


def general_score(q: Tensor, k: Tensor, W: Tensor) -> Tensor:
    """General (bilinear) score ``e_l = k_l^T W q`` with ``W`` ``[d_k, d_q]`` (Luong et al. 2015).
    Shapes: ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``), ``k`` ``[B, n_k, d_k]`` -> ``e``
    ``[B, n_q, n_k]`` (``[B, n_k]``). Computed as a dot product with the transformed query ``W q``:
    cost O(B n_q d_q d_k + B n_q n_k d_k)."""
    q3, single = _prepare(q, k)
    check_param(W, "W", (k.shape[-1], q3.shape[-1]), "[d_k, d_q]")
    check_same(q3, "q", W=W)
    return _finish(_pairwise(_linear(q3, W), k), single)


def biased_general_score(q: Tensor, k: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """Biased general score ``e_l = k_l^T (W q + b)``, ``W`` ``[d_k, d_q]``, ``b`` ``[d_k]``
    (Sordoni et al. 2016). Shapes: ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``), ``k``
    ``[B, n_k, d_k]`` -> ``e`` ``[B, n_q, n_k]`` (``[B, n_k]``). Cost:
    O(B n_q d_q d_k + B n_q n_k d_k)."""
    q3, single = _prepare(q, k)
    check_param(W, "W", (k.shape[-1], q3.shape[-1]), "[d_k, d_q]")
    check_param(b, "b", (k.shape[-1],), "[d_k]")
    check_same(q3, "q", W=W, b=b)
    return _finish(_pairwise(_linear(q3, W, b), k), single)


def activated_general_score(
    q: Tensor, k: Tensor, W: Tensor, b: Tensor | float, act: str | Activation = "tanh"
) -> Tensor:
    """Activated general score ``e_l = act(k_l^T W q + b)`` with ``W`` ``[d_k, d_q]`` and a scalar
    bias ``b`` (Ma et al. 2017, IAN). Shapes: ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``),
    ``k`` ``[B, n_k, d_k]`` -> ``e`` ``[B, n_q, n_k]`` (``[B, n_k]``). Cost:
    O(B n_q d_q d_k + B n_q n_k d_k)."""
    q3, single = _prepare(q, k)
    check_param(W, "W", (k.shape[-1], q3.shape[-1]), "[d_k, d_q]")
    if isinstance(b, Tensor):
        check_tensor(b, "b")
        if b.numel() != 1 or b.dim() > 1:
            raise ValueError(f"b has shape {tuple(b.shape)}, expected a scalar (shape [] or [1])")
        b = b.reshape(())
    elif isinstance(b, bool) or not isinstance(b, int | float):
        raise TypeError(f"b must be a float or a one-element tensor, got {type(b).__name__}")
    check_same(q3, "q", W=W, b=b if isinstance(b, Tensor) else None)
    return _finish(_activated(_linear(q3, W), k, b, act), single)


def _activated(qw: Tensor, k: Tensor, b: Tensor | float, act: str | Activation) -> Tensor:
    """``act(k_l^T (W q) + b)`` from the transformed query ``qw``."""
    e = _pairwise(qw, k)
    e = e + (_work(b) if isinstance(b, Tensor) else b)
    return get_activation(act)(e)


def cosine_score(q: Tensor, k: Tensor) -> Tensor:
    """Cosine similarity ``e_l = q^T k_l / (max(|q|, eps) max(|k_l|, eps))`` (Graves et al. 2014,
    content addressing of the Neural Turing Machine). Zero vectors score 0. Needs ``d_q == d_k``.
    Shapes: ``q`` ``[B, n_q, d_q]`` (or one query ``[B, d_q]``), ``k`` ``[B, n_k, d_k]`` -> ``e``
    ``[B, n_q, n_k]`` (``[B, n_k]``). Cost: O(B (n_q + n_k) d + B n_q n_k d)."""
    q3, single = _prepare(q, k)
    _require_same_dim(q3, k, "cosine_score")
    qn = F.normalize(_work(q3), dim=-1, eps=COSINE_EPS)
    kn = F.normalize(_work(k), dim=-1, eps=COSINE_EPS)
    return _finish(qn @ kn.transpose(-1, -2), single)


def _additive_checks(q3: Tensor, k: Tensor, W1: Tensor, W2: Tensor, b: Tensor | None) -> None:
    check_tensor(W1, "W1")
    d_w = W1.shape[0] if W1.dim() == 2 else None
    check_param(W1, "W1", (d_w, q3.shape[-1]), "[d_w, d_q]")
    check_param(W2, "W2", (d_w, k.shape[-1]), "[d_w, d_k]")
    if b is not None:
        check_param(b, "b", (d_w,), "[d_w]")
    check_same(q3, "q", W1=W1, W2=W2, b=b)


def additive_score(
    q: Tensor,
    k: Tensor,
    W1: Tensor,
    W2: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    act: str | Activation = "tanh",
    lean: bool = True,
) -> Tensor:
    """Additive (concat) score ``e_l = w^T act(W1 q + W2 k_l + b)`` (Bahdanau et al. 2015).

    ``W1`` ``[d_w, d_q]``, ``W2`` ``[d_w, d_k]``, ``w`` ``[d_w]``, ``b`` ``[d_w]``.
    Cost: time O(B n_q n_k d_w). With ``lean=True`` (default) the scores come from the
    chunked kernel of :mod:`attnlab.general.fused`, which never holds the
    ``[B, n_q, n_k, d_w]`` tensor (memory O(B n_q n_k)); ``lean=False`` is the textbook
    broadcast computation.
    """
    q3, single = _prepare(q, k)
    _additive_checks(q3, k, W1, W2, b)
    check_param(w, "w", (W1.shape[0],), "[d_w]")
    check_same(q3, "q", w=w)
    check_flags(lean=lean)
    return _finish(_additive(_linear(q3, W1, b), _linear(k, W2), w, act, lean), single)


def _additive(q1: Tensor, k2: Tensor, w: Tensor, act: str | Activation, lean: bool) -> Tensor:
    """``w^T act(q1 + k2_l)`` from the projected query ``q1 = W1 q + b`` and keys
    ``k2 = W2 k``: the chunked kernel (``lean``) or the broadcast formula."""
    if lean:
        from attnlab.general.fused import additive_score_lean

        return additive_score_lean(q1, k2, _work(w), act)
    return get_activation(act)(q1[:, :, None, :] + k2[:, None, :, :]) @ _work(w)


def multi_dimensional_additive_score(
    q: Tensor,
    k: Tensor,
    W1: Tensor,
    W2: Tensor,
    W_d: Tensor,
    b: Tensor | None = None,
    b_d: Tensor | None = None,
    act: str | Activation = "tanh",
) -> Tensor:
    """Vector score of multi-dimensional attention (Shen et al. 2018, DiSAN):
    ``e_l = W_d^T act(W1 q + W2 k_l + b) + b_d`` in ``R^{d_v}``, ``W_d`` ``[d_w, d_v]``.

    Returns ``[B, n_q, n_k, d_v]`` (explicitly materialised; memory O(B n_q n_k (d_w +
    d_v))). :class:`attnlab.Attention` with ``dim="multi"`` uses the fused
    :func:`attnlab.general.fused.multi_dim_attend_lean` instead.
    """
    q3, single = _prepare(q, k)
    _additive_checks(q3, k, W1, W2, b)
    check_param(W_d, "W_d", (W1.shape[0], None), "[d_w, d_v]")
    if b_d is not None:
        check_param(b_d, "b_d", (W_d.shape[1],), "[d_v]")
    check_same(q3, "q", W_d=W_d, b_d=b_d)
    e = _multi_dimensional(_linear(q3, W1, b), _linear(k, W2), W_d, b_d, act)
    return e.squeeze(1) if single else e


def _multi_dimensional(
    q1: Tensor, k2: Tensor, W_d: Tensor, b_d: Tensor | None, act: str | Activation
) -> Tensor:
    """``W_d^T act(q1 + k2_l) + b_d`` (``[B, n_q, n_k, d_v]``) from the projections."""
    e = get_activation(act)(q1[:, :, None, :] + k2[:, None, :, :]) @ _work(W_d)
    return e if b_d is None else e + _work(b_d)


def _check_keys_alone(k: Tensor) -> None:
    check_tensor(k, "k")
    if k.dim() != 3:
        raise ValueError(f"k has shape {tuple(k.shape)}, expected [B, n_k, d_k]")


def queryless_score(
    k: Tensor,
    W: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    act: str | Activation = "tanh",
) -> Tensor:
    """Query-less (self-attentive, constant query) score ``e_l = w^T act(W k_l + b)``
    (Lin et al. 2017; Yang et al. 2016). ``W`` ``[d_w, d_k]``, ``w`` ``[d_w]`` (or
    ``[d_w, d_v]`` for a vector score), ``b`` ``[d_w]``. Returns ``[B, 1, n_k]`` (``[B, 1,
    n_k, d_v]`` for a vector score). Cost O(B n_k d_k d_w)."""
    _check_keys_alone(k)
    check_param(W, "W", (None, k.shape[-1]), "[d_w, d_k]")
    if b is not None:
        check_param(b, "b", (W.shape[0],), "[d_w]")
    check_tensor(w, "w")
    if w.dim() == 2:
        check_param(w, "w", (W.shape[0], None), "[d_w, d_v]")
    else:
        check_param(w, "w", (W.shape[0],), "[d_w] (or [d_w, d_v] for a vector score)")
    check_same(k, "k", W=W, w=w, b=b)
    return _queryless(_linear(k, W, b), w, act)


def _queryless(kw: Tensor, w: Tensor, act: str | Activation) -> Tensor:
    """``w^T act(kw_l)`` as ``[B, 1, n_k]`` (``[B, 1, n_k, d_v]``) from ``kw = W k + b``."""
    return (get_activation(act)(kw) @ _work(w)).unsqueeze(1)


# ----------------------------------------------------------------------------- modules


class Score(Configurable):
    """Base class of score modules: ``forward(q, k) -> e``.

    Class attributes describe the score to the general attention module and to
    :mod:`attnlab.functional`:

    * ``needs_query`` (False for query-less scores);
    * ``same_dims`` (True when the score compares ``q`` with ``k_l`` directly, so that it
      needs ``d_q == d_k``);
    * ``function``: the functional twin, ``function(q, k, **params) -> e`` (for a
      query-less score ``function(k, **params)``), with the parameters as explicit
      arguments. It is exported as ``attnlab.functional.<its __name__>`` and is what
      :func:`attnlab.functional.attend` runs; ``None`` for a score without one;
    * ``function_dot_form(q, k, **params)``: the functional twin's ``(q', k', scale)``
      when the score is a scaled dot product (then ``attend`` runs it on the fused SDPA
      kernel), else ``None``.

    ``vector`` is True when the module was built to return vector scores
    ``[B, n_q, n_k, d_v]`` for multi-dimensional attention (set per instance by the scores
    that support it).

    Score has no constructor of its own, so a subclass that inherits its constructor (as
    :class:`DotScore` inherits the one of ``_DotFamily``) records that constructor's
    arguments for :meth:`get_config`.
    """

    needs_query: bool = True
    supports_vector: bool = False
    same_dims: bool = False
    vector: bool = False
    function: ClassVar[Callable[..., Tensor] | None] = None

    @staticmethod
    def function_dot_form(
        q: Tensor, k: Tensor, **params: Tensor
    ) -> tuple[Tensor, Tensor, float] | None:
        """``(q', k', scale)`` of the functional twin with explicit parameters, or ``None``."""
        return None

    def dot_form(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float] | None:
        """``(q', k', scale)`` with ``score(q, k_l) = scale * q'^T k'_l``, or ``None``."""
        return None

    def explicit(self, q: Tensor, k: Tensor) -> Tensor:
        """The textbook computation of the scores (the reference for fast paths)."""
        return self(q, k)


class _DotFamily(Score):
    """Scores that compare ``q`` with ``k_l`` directly (``d_q == d_k``): a dot product of
    the (normalised) vectors times a scale."""

    same_dims = True

    def __init__(self, d_q: int | None = None, d_k: int | None = None) -> None:
        super().__init__()
        _optional_size(d_q, "d_q", type(self).__name__)
        _optional_size(d_k, "d_k", type(self).__name__)
        _check_equal_dims(self, d_q, d_k)

    def dot_form(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        _require_same_dim(q, k, type(self).__name__)
        return self.function_dot_form(q, k)  # type: ignore[return-value]

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        q3, single = _prepare(q, k)
        q2, k2, scale = self.dot_form(q3, k)
        e = _pairwise(q2, k2)
        return _finish(e * scale if scale != 1.0 else e, single)


@register("score", "dot", aliases=("multiplicative",))
class DotScore(_DotFamily):
    """Multiplicative score ``e_l = q^T k_l`` (Luong et al. 2015).

    Shapes: ``q`` ``[B, n_q, d]``, ``k`` ``[B, n_k, d]`` -> ``[B, n_q, n_k]``.
    Cost: O(B n_q n_k d) time; with soft alignment it runs on the fused SDPA kernel.

    :formula: e_l = q^T k_l
    :source: Luong et al. 2015, Effective Approaches to Attention-based NMT
    :cost: O(B n_q n_k d)
    """

    function = staticmethod(dot_score)

    @staticmethod
    def function_dot_form(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        return q, k, 1.0


@register("score", "scaled-dot", aliases=("scaled-multiplicative", "sdp"))
class ScaledDotScore(_DotFamily):
    """Scaled multiplicative score ``e_l = q^T k_l / sqrt(d_k)`` (Vaswani et al. 2017).

    Shapes: ``q`` ``[B, n_q, d]``, ``k`` ``[B, n_k, d]`` -> ``[B, n_q, n_k]``.
    Cost: O(B n_q n_k d); with soft alignment it runs on the fused SDPA kernel.

    :formula: e_l = q^T k_l / sqrt(d_k)
    :source: Vaswani et al. 2017, Attention Is All You Need
    :cost: O(B n_q n_k d)
    """

    function = staticmethod(scaled_dot_score)

    @staticmethod
    def function_dot_form(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        d = k.shape[-1]
        return q, k, 1.0 / math.sqrt(d) if d else 1.0


@register("score", "cosine", aliases=("similarity",))
class CosineScore(_DotFamily):
    """Cosine-similarity score (Graves et al. 2014). Scores lie in ``[-1, 1]``, so a
    ``temperature`` (default 1) divides them before the alignment: ``e_l = cos(q, k_l) /
    temperature`` (NTM's key strength ``beta`` is ``1 / temperature``).

    Shapes: ``q`` ``[B, n_q, d]``, ``k`` ``[B, n_k, d]`` -> ``[B, n_q, n_k]``.
    Cost: O(B (n_q + n_k) d) to normalise, then O(B n_q n_k d); SDPA with soft alignment.

    :formula: e_l = q^T k_l / (|q| |k_l|)
    :source: Graves et al. 2014, Neural Turing Machines
    :cost: O(B n_q n_k d)
    """

    function = staticmethod(cosine_score)

    def __init__(
        self, d_q: int | None = None, d_k: int | None = None, temperature: float = 1.0
    ) -> None:
        super().__init__(d_q, d_k)
        self.temperature = check_positive(temperature, "temperature", error=ValueError)

    def dot_form(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        _require_same_dim(q, k, "CosineScore")
        # normalised in float32 (|q|^2 of a float16 vector can overflow), returned in the
        # input dtype for the fused kernel
        qn = F.normalize(_work(q), dim=-1, eps=COSINE_EPS).to(q.dtype)
        kn = F.normalize(_work(k), dim=-1, eps=COSINE_EPS).to(k.dtype)
        return qn, kn, 1.0 / self.temperature

    @staticmethod
    def function_dot_form(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        return F.normalize(q, dim=-1, eps=COSINE_EPS), F.normalize(k, dim=-1, eps=COSINE_EPS), 1.0


def _check_equal_dims(module: Score, d_q: int | None, d_k: int | None) -> None:
    if d_q is not None and d_k is not None and d_q != d_k:
        raise ConfigError(
            f"{type(module).__name__} compares q and k directly, so it needs d_q == d_k; "
            f"got d_q={d_q}, d_k={d_k} (use 'general' or 'additive', or project the keys)"
        )


def _query_form(
    q: Tensor, k: Tensor, W: Tensor, b: Tensor | None = None
) -> tuple[Tensor, Tensor, float]:
    """The dot form ``(W q + b, k, 1)`` of the (biased) general score's function."""
    return F.linear(q, W, b), k, 1.0


def _need(value: int | None, name: str, module: str) -> int:
    if value is None:
        raise ConfigError(f"{module} needs {name} (the size of its input) to build its weights")
    return check_int(value, name, owner=module, wording="a positive int")


def _optional_size(value: int | None, name: str, module: str) -> int | None:
    """A size a score takes without needing it (``None``: not given), checked when given:
    ``DotScore(d_q=2.5)`` is refused, not ignored."""
    return check_optional_int(value, name, owner=module, wording="a positive int")


@register("score", "general", aliases=("bilinear",))
class GeneralScore(Score):
    """General (bilinear) score ``e_l = k_l^T W q``, ``W`` ``[d_k, d_q]`` (Luong 2015).

    ``W`` is ``self.W.weight``. The query is transformed once (``W q``), so with soft
    alignment the attention runs on the fused SDPA kernel.
    Shapes: ``q`` ``[B, n_q, d_q]``, ``k`` ``[B, n_k, d_k]`` -> ``[B, n_q, n_k]``.

    :formula: e_l = k_l^T W q
    :source: Luong et al. 2015, Effective Approaches to Attention-based NMT
    :cost: O(B n_q d_q d_k + B n_q n_k d_k)
    """

    function = staticmethod(general_score)
    function_dot_form = staticmethod(_query_form)
    _bias = False

    def __init__(self, d_q: int | None = None, d_k: int | None = None) -> None:
        super().__init__()
        name = type(self).__name__
        self.W = nn.Linear(_need(d_q, "d_q", name), _need(d_k, "d_k", name), bias=self._bias)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        q3, single = _prepare(q, k)
        check_module_dtype(self, q3, "q")
        return _finish(_pairwise(apply_layer(self.W, q3), k), single)

    def dot_form(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float]:
        # W q in float32, rounded once to the input dtype for the fused kernel
        return apply_layer(self.W, q).to(q.dtype), k, 1.0


@register("score", "biased-general")
class BiasedGeneralScore(GeneralScore):
    """Biased general score ``e_l = k_l^T (W q + b)``, ``W`` ``[d_k, d_q]``, ``b`` ``[d_k]``
    (Sordoni et al. 2016). Runs on SDPA with soft alignment (transformed query).
    Shapes: ``q`` ``[B, n_q, d_q]``, ``k`` ``[B, n_k, d_k]`` -> ``[B, n_q, n_k]``.

    :formula: e_l = k_l^T (W q + b)
    :source: Sordoni et al. 2016, Iterative Alternating Neural Attention for Machine Reading
    :cost: O(B n_q d_q d_k + B n_q n_k d_k)
    """

    function = staticmethod(biased_general_score)
    _bias = True

    def __init__(self, d_q: int | None = None, d_k: int | None = None) -> None:
        super().__init__(d_q, d_k)  # its own constructor, so get_config() records d_q, d_k


@register("score", "activated-general")
class ActivatedGeneralScore(Score):
    """Activated general score ``e_l = act(k_l^T W q + b)`` with a scalar bias
    (Ma et al. 2017). The activation makes it a non-dot score: explicit path.
    Shapes: ``q`` ``[B, n_q, d_q]``, ``k`` ``[B, n_k, d_k]`` -> ``[B, n_q, n_k]``.

    :formula: e_l = act(k_l^T W q + b)
    :source: Ma et al. 2017, Interactive Attention Networks (IAN)
    :cost: O(B n_q d_q d_k + B n_q n_k d_k)
    """

    function = staticmethod(activated_general_score)

    def __init__(
        self, d_q: int | None = None, d_k: int | None = None, act: str | Activation = "tanh"
    ) -> None:
        super().__init__()
        self.W = nn.Linear(
            _need(d_q, "d_q", "ActivatedGeneralScore"),
            _need(d_k, "d_k", "ActivatedGeneralScore"),
            bias=False,
        )
        self.b = nn.Parameter(torch.zeros(()))
        self.act = act
        get_activation(act)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        q3, single = _prepare(q, k)
        check_module_dtype(self, q3, "q")
        return _finish(_activated(apply_layer(self.W, q3), k, self.b, self.act), single)


def _init_additive(
    module: Score, d_q: int, d_k: int, d_w: int, act: str | Activation, bias: bool
) -> None:
    """The parameters that every score ``w^T act(W1 q + W2 k_l + ... + b)`` has besides
    ``w``: ``module.W1`` ``[d_w, d_q]``, ``module.W2`` ``[d_w, d_k]`` (no bias),
    ``module.b`` ``[d_w]`` (zeros, or ``None`` without ``bias``) and ``module.act`` (a
    name or callable that :func:`get_activation` accepts)."""
    get_activation(act)
    check_flags(bias=bias)
    module.act = act
    module.W1 = nn.Linear(d_q, d_w, bias=False)
    module.W2 = nn.Linear(d_k, d_w, bias=False)
    module.b = nn.Parameter(torch.zeros(d_w)) if bias else None


class _AdditiveBase(Score):
    supports_vector = True

    def _init_vector(self, d_w: int, out_dim: int | None) -> None:
        self.vector = out_dim is not None
        bound = 1.0 / math.sqrt(d_w)
        if out_dim is None:
            self.w = nn.Parameter(torch.empty(d_w).uniform_(-bound, bound))
            self.register_parameter("b_d", None)
        else:
            check_int(out_dim, "out_dim", wording="a positive int")
            self.w = nn.Parameter(torch.empty(d_w, out_dim).uniform_(-bound, bound))
            self.b_d = nn.Parameter(torch.zeros(out_dim))


@register("score", "additive", aliases=("concat", "bahdanau", "mlp"))
class AdditiveScore(_AdditiveBase):
    """Additive (concat) score ``e_l = w^T act(W1 q + W2 k_l + b)`` (Bahdanau et al. 2015).

    Parameters: ``W1`` ``[d_w, d_q]`` (``self.W1.weight``), ``W2`` ``[d_w, d_k]``,
    ``b`` ``[d_w]`` (optional: the survey's form has it, Bahdanau et al.'s score has none,
    so ``bias=False`` is exactly theirs), ``w`` ``[d_w]``. With ``out_dim=d_v`` the score is the
    DiSAN vector score ``e_l = W_d^T act(W1 q + W2 k_l + b) + b_d`` in ``R^{d_v}`` (``w``
    becomes ``W_d`` ``[d_w, d_v]``), used by multi-dimensional attention.

    Shapes: ``q`` ``[B, n_q, d_q]``, ``k`` ``[B, n_k, d_k]`` -> ``[B, n_q, n_k]`` (or
    ``[B, n_q, n_k, d_v]``). Cost: time O(B n_q n_k d_w); the forward pass uses the
    chunked kernel and holds O(B n_q n_k) memory, never the ``[B, n_q, n_k, d_w]`` tensor.

    :formula: e_l = w^T act(W1 q + W2 k_l + b)
    :source: Bahdanau et al. 2015, Neural Machine Translation by Jointly Learning to Align and
        Translate
    :cost: time O(B n_q n_k d_w), memory O(B n_q n_k) (chunked kernel)
    """

    function = staticmethod(additive_score)

    def __init__(
        self,
        d_q: int | None = None,
        d_k: int | None = None,
        d_w: int | None = None,
        act: str | Activation = "tanh",
        bias: bool = True,
        out_dim: int | None = None,
    ) -> None:
        super().__init__()
        d_q = _need(d_q, "d_q", "AdditiveScore")
        d_k = _need(d_k, "d_k", "AdditiveScore")
        d_w = d_k if d_w is None else _need(d_w, "d_w", "AdditiveScore")
        _init_additive(self, d_q, d_k, d_w, act, bias)
        self._init_vector(d_w, out_dim)

    def lean_parts(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``(W1 q + b, W2 k)``, the inputs of the chunked kernels (float32 for
        half-precision inputs, like the scores)."""
        return apply_layer(self.W1, q, self.b), apply_layer(self.W2, k)

    def work_params(self) -> tuple[Tensor, Tensor | None]:
        """``(w, b_d)`` in the dtype :meth:`lean_parts` returns (float32 for half)."""
        b_d = None if self.b_d is None else _work(self.b_d)
        return _work(self.w), b_d

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return self._scores(q, k, lean=True)

    def explicit(self, q: Tensor, k: Tensor) -> Tensor:
        return self._scores(q, k, lean=False)

    def _scores(self, q: Tensor, k: Tensor, lean: bool) -> Tensor:
        q3, single = _prepare(q, k)
        check_module_dtype(self, q3, "q")
        q1, k2 = self.lean_parts(q3, k)
        if self.vector:
            e = _multi_dimensional(q1, k2, self.w, self.b_d, self.act)
            return e.squeeze(1) if single else e
        return _finish(_additive(q1, k2, self.w, self.act, lean), single)


@register("score", "queryless", aliases=("self-attentive", "constant-query", "query-less"))
class QuerylessScore(_AdditiveBase):
    """Query-less score ``e_l = w^T act(W k_l + b)`` (Lin et al. 2017; Yang et al. 2016):
    the query is constant, folded into ``w``. ``forward(q, k)`` ignores ``q`` (it may be
    ``None``) and returns ``[B, 1, n_k]``. With ``out_dim=d_v`` it is DiSAN's
    source2token vector score ``W_d^T act(W k_l + b) + b_d``.

    Parameters: ``W`` ``[d_w, d_k]``, ``b`` ``[d_w]`` (HAN's ``b_w``; Lin et al.'s score has
    no bias: ``bias=False``), ``w`` ``[d_w]``.
    Cost: O(B n_k d_k d_w).

    :formula: e_l = w^T act(W k_l + b)
    :source: Lin et al. 2017, A Structured Self-attentive Sentence Embedding; Yang et al. 2016
        (HAN)
    :cost: O(B n_k d_k d_w)
    """

    needs_query = False
    function = staticmethod(queryless_score)

    def __init__(
        self,
        d_k: int | None = None,
        d_w: int | None = None,
        act: str | Activation = "tanh",
        bias: bool = True,
        out_dim: int | None = None,
        d_q: int | None = None,
    ) -> None:
        super().__init__()
        d_k = _need(d_k, "d_k", "QuerylessScore")
        d_w = d_k if d_w is None else _need(d_w, "d_w", "QuerylessScore")
        _optional_size(d_q, "d_q", "QuerylessScore")  # not used, but never a wrong size
        get_activation(act)
        check_flags(bias=bias)
        self.act = act
        self.W = nn.Linear(d_k, d_w, bias=bias)
        self._init_vector(d_w, out_dim)

    def forward(self, q: Tensor | None, k: Tensor) -> Tensor:
        _check_keys_alone(k)
        check_module_dtype(self, k, "k")
        e = _queryless(apply_layer(self.W, k), self.w, self.act)
        return e + _work(self.b_d) if self.vector else e
