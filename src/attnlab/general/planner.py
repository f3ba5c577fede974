"""The execution planner: one place that decides how an attention call runs.

:class:`~attnlab.Attention`, :func:`attnlab.functional.attend` and
:class:`~attnlab.query.MultiHeadAttention` all ask this module for their path. The
decision reads the *capabilities* of the score, alignment and dimensionality
(:class:`Capabilities`, computed once from the modules or the registered score class) and
the *call*: its device, dtype, shapes, whether weights are requested, dropout and mask.

| path | when |
| --- | --- |
| ``sdpa`` | a dot-product score (dot, scaled-dot, general, biased-general, cosine), soft alignment, single-dimensional: PyTorch's fused kernel on the 4-D layout ``[B, H, n, d]``; ``is_causal=True`` for a causal call without another mask |
| ``lean-multi`` | multi-dimensional additive, soft, no weights requested, no dropout |
| ``triton`` | additive (or multi-dimensional additive), soft, no weights, no dropout, on CUDA with ``triton`` installed, ``max(d_w, d_v)`` at most ``TRITON_MAX_WIDTH`` (1024; multi 128) |
| ``lean-additive`` | additive score, any alignment that is not local |
| ``local-flex`` | local-m (no Gaussian factor) with a dot-product score on CUDA, no weights, no dropout: FlexAttention's sliding-window block mask |
| ``local-triton`` | local-p, or local-m with the Gaussian factor, with a dot-product score on CUDA with ``triton`` installed, no weights, no dropout, ``2D + 1`` at most 256: Triton kernels that read each window in place (:mod:`attnlab.general.local_triton`) |
| ``local-window`` | local-m / local-p otherwise: only the ``2D + 1`` window keys are scored, gathered into window tensors |
| ``explicit`` | everything else |

:func:`plan_attention` returns a :class:`Plan` ``(path, reason)``; every ``explain()``
prints its reason.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnlab._checks import (
    check_choice,
    check_device,
    check_flags,
    check_optional_int,
    is_transformed,
)
from attnlab.general import flash_additive
from attnlab.general.alignment import LocalMAlign
from attnlab.general.flash_additive import TRITON_DTYPES, triton_act_name, triton_fits
from attnlab.general.local_triton import LOCAL_TRITON_MAX_WINDOW
from attnlab.general.scoring import AdditiveScore, Score

__all__ = [
    "Capabilities",
    "Plan",
    "capabilities",
    "check_plan_settings",
    "flex_available",
    "plan_attention",
    "plan_call",
    "plan_heads",
    "score_class_capabilities",
    "sdpa_four_d",
]

#: dtypes the FlexAttention window path runs in on CUDA
FLEX_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: the smallest key / value size FlexAttention's CUDA kernels take
FLEX_MIN_DIM = 16


@dataclass(frozen=True)
class Capabilities:
    """What a score / alignment / dimensionality combination can be fused into."""

    score: str  # names, for the reasons
    align: str
    dot: bool  # the score is ``scale * q'^T k'`` after transforming q (and k)
    additive: bool  # the additive score (lean chunked / Triton kernels)
    queryless: bool
    prev_weights: bool  # location-aware: convolves the previous weights
    soft: bool
    local: bool
    multi: bool
    window: int = 0  # 2D + 1 for local alignments
    triton_act: bool = False  # the additive activation is one the Triton kernels implement
    centres_are_positions: bool = False  # local-m: window centres are the query positions
    gaussian: bool = False  # local: the weights are multiplied by a Gaussian of the offset


@dataclass(frozen=True)
class Plan:
    """The planner's decision: ``path`` and a one-sentence ``reason``.

    ``causal_kernel``: the SDPA call passes ``is_causal=True`` and no mask."""

    path: str
    reason: str
    causal_kernel: bool = False

    def __iter__(self):  # ``path, reason = plan``
        return iter((self.path, self.reason))


def sdpa_four_d(device: torch.device | str, dtype: torch.dtype | None = None) -> bool:
    """Whether a 3-D SDPA call ``[B, n, d]`` runs as ``[B, 1, n, d]``: on CUDA (and any
    accelerator) only the 4-D layout makes the flash / cuDNN / efficient kernels eligible.
    On the CPU the 4-D layout reaches PyTorch's fused CPU kernel and the 3-D call its math
    kernel: in float32 and float64 (``dtype``; ``None``: float32) the call is 4-D, the
    fused kernel being 1.3-2x faster forward + backward and 1.6-2.8x in the forward pass
    alone (``B=1, n=8`` to ``B=32, n=1024``, with and without a mask, torch 2.13, 2 cores;
    docs/benchmarks.md). Its backward recomputes the weights from float32 scores, so at
    scores of order 1e4 and beyond its gradients are less exact than the math kernel's
    (``path="explicit"`` is exact there). In half precision, and under CPU autocast
    (which runs SDPA in half precision), the call stays 3-D, on the math kernel, whose
    half-precision backward accumulates in float32 (the fused CPU kernel's float16
    gradients are measurably less accurate with large scores;
    tests/general/test_robustness_numerics.py). Under
    ``torch.export`` (what ``torch.onnx.export`` and other deployment runtimes trace) the
    call is 4-D on every device: the portable form (ONNX's translation of SDPA takes 4-D
    inputs only)."""
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    if kind != "cpu" or _is_exporting():
        return True
    full = dtype is None or dtype in (torch.float32, torch.float64)
    return full and not torch.is_autocast_enabled("cpu")


#: ``torch.compiler.is_exporting`` (torch >= 2.5; never exporting before it)
_is_exporting: Callable[[], bool] = getattr(torch.compiler, "is_exporting", lambda: False)


#: Looked up once, at import, without importing the module: a plain bool that
#: torch.compile reads as a constant (an import inside a compiled call breaks the graph).
_FLEX_FOUND = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` is there (torch >= 2.5)."""
    return _FLEX_FOUND


_TRITON_FOUND = flash_additive.triton_available()


def triton_available() -> bool:
    """Whether the ``triton`` package is installed: looked up once, at import (the planner
    asks on every CUDA call), and a constant to torch.compile (the look-up itself,
    ``importlib.util.find_spec``, broke the graph on an H200 with torch 2.11). A module
    attribute, so that tests can replace it."""
    return _TRITON_FOUND


def _is_dot(score_cls: type) -> bool:
    return getattr(score_cls, "dot_form", None) is not Score.dot_form


def _has_function_dot_form(score_cls: type) -> bool:
    form = getattr(score_cls, "function_dot_form", None)
    return form is not None and form is not Score.function_dot_form


def score_class_capabilities(score_cls: type, align: str = "soft") -> Capabilities:
    """Capabilities of a registered score class with a named alignment and single
    dimensionality (what :func:`attnlab.functional.attend` runs: soft alignment). The
    score counts as a dot product when its functional twin has a ``function_dot_form``."""
    name = getattr(score_cls, "registry_name", score_cls.__name__)
    return Capabilities(
        score=name,
        align=align,
        dot=_has_function_dot_form(score_cls),
        additive=issubclass(score_cls, AdditiveScore),
        queryless=not getattr(score_cls, "needs_query", True),
        prev_weights=bool(getattr(score_cls, "uses_prev_weights", False)),
        soft=align == "soft",
        local=False,
        multi=False,
    )


def capabilities(score: torch.nn.Module, align: torch.nn.Module, multi: bool) -> Capabilities:
    """Capabilities of built score and alignment modules (read once, at construction)."""
    name_s = getattr(score, "registry_name", type(score).__name__)
    name_a = getattr(align, "registry_name", type(align).__name__)
    additive = isinstance(score, AdditiveScore)
    local = bool(getattr(align, "local", False))
    return Capabilities(
        score=name_s,
        align=name_a,
        dot=_is_dot(type(score)),
        additive=additive,
        queryless=not getattr(score, "needs_query", True),
        prev_weights=bool(getattr(score, "uses_prev_weights", False)),
        soft=name_a == "soft",
        local=local,
        multi=multi,
        window=2 * align.D + 1 if local else 0,  # type: ignore[operator]
        triton_act=additive and triton_act_name(score.act) is not None,  # type: ignore[arg-type]
        centres_are_positions=isinstance(align, LocalMAlign),
        gaussian=local and bool(getattr(align, "gaussian", False)),
    )


_TRITON_REASON = (
    "on CUDA with triton installed: FlashAttention-style Triton kernels (online softmax "
    "over key tiles; nothing n_q x n_k, [B, n_q, n_k, d_w] or [B, n_q, n_k, d_v] in memory)"
)


def _triton_fits(
    caps: Capabilities,
    device: torch.device,
    dtype: torch.dtype | None,
    widths: tuple[int, int] | None,
) -> bool:
    return (
        device.type == "cuda"
        and (dtype is None or dtype in TRITON_DTYPES)
        and caps.triton_act
        and (widths is None or triton_fits(caps.multi, *widths))
        and triton_available()
    )


@dataclass(frozen=True)
class _Call:
    """What the planner reads of one call besides the capabilities."""

    device: torch.device
    dtype: torch.dtype | None
    need_weights: bool
    dropout: bool
    head_dim: int | None
    widths: tuple[int, int] | None

    def fits_triton(self, caps: Capabilities) -> bool:
        return _triton_fits(caps, self.device, self.dtype, self.widths)

    def fits_local_triton(self, window: int) -> bool:
        """The local Triton kernels: CUDA with triton, no weights, no dropout, a dtype and
        a window (``2D + 1``) they take."""
        return (
            self.device.type == "cuda"
            and not self.need_weights
            and not self.dropout
            and (self.dtype is None or self.dtype in TRITON_DTYPES)
            and 1 << max(0, window - 1).bit_length() <= LOCAL_TRITON_MAX_WINDOW
            and triton_available()
        )

    def fits_flex(self) -> bool:
        """FlexAttention's sliding window: CUDA, no weights, no dropout, a dtype and a head
        size its kernels take."""
        return (
            self.device.type == "cuda"
            and not self.need_weights
            and not self.dropout
            and (self.dtype is None or self.dtype in FLEX_DTYPES)
            and (self.head_dim is None or self.head_dim >= FLEX_MIN_DIM)
            and flex_available()
        )


#: The modes of :func:`plan_attention` (``Attention(path=...)``).
_MODES = ("auto", "explicit", "triton")


def plan_attention(
    caps: Capabilities,
    *,
    mode: str = "auto",
    need_weights: bool = False,
    n_k: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    dropout: bool = False,
    head_dim: int | None = None,
    widths: tuple[int, int] | None = None,
) -> Plan:
    """The path of one attention call.

    Args:
        caps: the combination's :class:`Capabilities`.
        mode: ``"auto"``, ``"explicit"`` or ``"triton"`` (``Attention(path=...)``).
        need_weights: the weights are returned.
        n_k: the number of keys (``0``: empty key set), ``None`` if unknown.
        device, dtype: of the call (``None``: CPU, any dtype).
        dropout: attention dropout is active (training with ``dropout > 0``).
        head_dim: the smaller of the key and value sizes of the call (``None``: unknown);
            FlexAttention's CUDA kernels need at least ``FLEX_MIN_DIM``.
        widths: ``(d_w, d_v)`` of an additive score's hidden units and of the values
            (``None``: unknown); the Triton kernels take them up to
            :data:`~attnlab.general.flash_additive.TRITON_MAX_WIDTH`, wider calls take the
            chunked kernels.

    A bad setting raises (:func:`check_plan_settings`) instead of planning a call that
    never happens.
    """
    check_plan_settings(mode, need_weights, dropout, n_k, head_dim)
    if device is not None:
        device = check_device(device)
    return plan_call(caps, mode, need_weights, n_k, device, dtype, dropout, head_dim, widths)


def check_plan_settings(
    mode: str, need_weights: bool, dropout: bool, n_k: int | None, head_dim: int | None
) -> None:
    """The settings of :func:`plan_attention`: ``ConfigError`` for an unknown ``mode``,
    ``TypeError`` for a switch that is no bool, ``ValueError`` for a size that is no int
    ``>= 0`` (``None``: unknown)."""
    if mode not in _MODES:
        check_choice(mode, "mode", _MODES)
    check_flags(need_weights=need_weights, dropout=dropout)
    if not torch.compiler.is_compiling():  # sizes of a traced call may be symbolic
        check_optional_int(n_k, "n_k", minimum=0, error=ValueError)
        check_optional_int(head_dim, "head_dim", minimum=0, error=ValueError)


#: the GPU kernels' paths and the formula a call takes instead under a ``torch.func``
#: transform (``vmap``, ``grad``, ...), for which the Triton kernels' custom operators
#: have no rule (nor, unverified on a GPU, FlexAttention's compiled call): the same result,
#: with the memory of the formula (docs/compile-and-precision.md)
_FORMULA_UNDER_TORCH_FUNC = {
    "triton": "explicit",
    "local-triton": "local-window",
    "local-flex": "local-window",
}


def plan_call(
    caps: Capabilities,
    mode: str,
    need_weights: bool,
    n_k: int | None,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    dropout: bool,
    head_dim: int | None,
    widths: tuple[int, int] | None,
) -> Plan:
    """:func:`plan_attention` without its checks, for the callers whose settings are
    checked already (``Attention.forward``, ``functional.attend``): nothing on the path of
    every call is done twice. Under a ``torch.func`` transform a GPU kernel's path gives
    way to the formula it computes (:data:`_FORMULA_UNDER_TORCH_FUNC`)."""
    plan = _forced_plan(caps, mode, n_k, need_weights)
    if plan is None:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        call = _Call(dev, dtype, need_weights, dropout, head_dim, widths)
        if caps.local:
            plan = _plan_local(caps, call)
        elif caps.multi:
            plan = _plan_multi(caps, call)
        else:
            plan = _plan_single(caps, call)
    formula = _FORMULA_UNDER_TORCH_FUNC.get(plan.path)
    if formula is not None and is_transformed():
        return Plan(
            formula,
            f"{plan.reason}; but under a torch.func transform, which the kernel has no rule "
            f"for, the formula it computes ({formula})",
        )
    return plan


def _forced_plan(caps: Capabilities, mode: str, n_k: int | None, need_weights: bool) -> Plan | None:
    """The plans that the mode, an empty key set or the score decide alone (else ``None``)."""
    if mode == "explicit":
        return Plan("explicit", "path='explicit' was requested")
    if n_k == 0:
        return Plan("explicit", "the key set is empty: the context is zero")
    if caps.prev_weights:
        return Plan("explicit", "the location-aware score convolves the previous weights")
    if mode == "triton":
        extra = (
            "; the weights come from a second pass and carry no gradient" if need_weights else ""
        )
        return Plan(
            "triton",
            "path='triton' was requested: FlashAttention-style Triton kernels (online "
            f"softmax over key tiles, nothing n_q x n_k in memory){extra}",
        )
    return None


def _plan_local(caps: Capabilities, call: _Call) -> Plan:
    """local-m without the Gaussian: FlexAttention's sliding window on CUDA; local-p and
    the Gaussian window with a dot-product score: the local Triton kernels on CUDA; else
    the gathered window.

    Only a plain window softmax goes to FlexAttention: local-p's learned centres and the
    Gaussian factor need a second ``score_mod`` pass there, which was 6.6x slower than the
    window and compiled for two minutes on its first call on an H200 (docs/benchmarks.md).
    """
    a, s = caps.align, caps.score
    if caps.dot and caps.centres_are_positions and not caps.gaussian and call.fits_flex():
        return Plan(
            "local-flex",
            f"{a} with the dot-product score {s!r} on CUDA: FlexAttention with a "
            f"sliding-window block mask over the 2D+1 = {caps.window} keys",
        )
    if caps.dot and call.fits_local_triton(caps.window):
        return Plan(
            "local-triton",
            f"{a} with the dot-product score {s!r} on CUDA with triton installed: Triton "
            f"kernels read the 2D+1 = {caps.window} keys of each window in place",
        )
    return Plan(
        "local-window",
        f"{a} scores only the 2D+1 = {caps.window} keys of each window "
        "(O(n_q D), not O(n_q n_k)) on " + call.device.type,
    )


def _plan_multi(caps: Capabilities, call: _Call) -> Plan:
    """Multi-dimensional attention: the fused kernels for the additive vector score."""
    if not (caps.additive and caps.soft):
        if caps.queryless:
            return Plan(
                "explicit", "a query-less vector score has n_q = 1: [B, 1, n_k, d_v] is small"
            )
        return Plan(
            "explicit",
            f"alignment {caps.align!r} is applied per feature on the materialised scores",
        )
    if call.need_weights:
        return Plan(
            "explicit",
            "need_weights=True materialises the [B, n_q, n_k, d_v] weights, so the "
            "fused multi-dimensional kernel cannot be used",
        )
    if call.dropout:
        return Plan("explicit", "dropout on multi-dimensional weights needs them materialised")
    if call.fits_triton(caps):
        return Plan("triton", f"multi-dimensional additive attention {_TRITON_REASON}")
    return Plan(
        "lean-multi",
        "multi-dimensional additive attention runs in a fused chunked kernel that "
        "never holds [B, n_q, n_k, d_w] or [B, n_q, n_k, d_v]",
    )


def _plan_single(caps: Capabilities, call: _Call) -> Plan:
    """Single-dimensional, not local: SDPA for dot products, the additive kernels."""
    a, s = caps.align, caps.score
    if caps.soft and caps.dot:
        if call.device.type != "cpu":
            layout = "layout [B, H, n, d] (flash / cuDNN / efficient kernels)"
        elif sdpa_four_d(call.device, call.dtype):
            layout = "layout [B, 1, n, d] (the fused CPU kernel)"
        else:
            layout = "layout [B, n, d] (the CPU math kernel, for half precision)"
        return Plan(
            "sdpa",
            f"score {s!r} is a scaled dot product after transforming the query, and the "
            "alignment is soft: PyTorch's fused scaled_dot_product_attention on the " + layout,
        )
    if not caps.additive:
        return Plan("explicit", f"score {s!r} with alignment {a!r} has no fused kernel")
    if caps.soft and not call.need_weights and not call.dropout and call.fits_triton(caps):
        return Plan("triton", f"additive attention with soft alignment {_TRITON_REASON}")
    return Plan(
        "lean-additive",
        "additive scores come from the chunked kernel (memory O(B n_q n_k), never "
        f"[B, n_q, n_k, d_w]); alignment {a!r} and the weighted sum follow",
    )


def plan_heads(
    head: Plan,
    *,
    fusable: bool,
    causal: bool = False,
    has_mask: bool = False,
    n_q: int | None = None,
    n_k: int | None = None,
    need_weights: bool = False,
) -> Plan:
    """The path of a multi-head call, from the plan of its heads.

    ``fusable``: every head plans ``sdpa`` (one SDPA call over all heads). A causal call
    with no other mask, ``n_q == n_k`` (where the causal mask is SDPA's ``is_causal``)
    and no weights requested passes ``is_causal=True`` instead of a materialised mask.
    """
    if fusable and n_k != 0:
        if causal and not has_mask and n_q == n_k and not need_weights:
            return Plan(
                "sdpa",
                "every head is a scaled dot product with soft alignment: one fused SDPA call "
                "with is_causal=True (no materialised mask)",
                causal_kernel=True,
            )
        return Plan(
            "sdpa", "every head is a scaled dot product with soft alignment: one fused SDPA call"
        )
    return Plan(f"per-head:{head.path}", f"each head runs attnlab.Attention ({head.reason})")
