"""The general attention module (survey section 3.2, Fig. 3 of Brauwers & Frasincar).

``Attention`` composes the three parts of the general attention model:

    K = W_K F, V = W_V F          (learned projections -- nn.Linear, so with a bias -- or
                                  the identity)
    e_l = score(q, k_l)           (any score function)
    a = align(e)                  (any alignment function)
    c = sum_l a_l v_l             (single-dimensional) or c_i = sum_l a_{l,i} v_{l,i} (multi)

and runs each combination on the fastest correct implementation:

| path | when | cost |
| --- | --- | --- |
| ``sdpa`` | the score reduces to a scaled dot product (dot, scaled-dot, general, biased-general, cosine), soft alignment, single-dimensional | PyTorch's fused kernel |
| ``lean-additive`` | additive score, soft alignment, single-dimensional | scores from a chunked kernel: memory O(B n_q n_k), never ``[B, n_q, n_k, d_w]`` |
| ``lean-multi`` | multi-dimensional additive (DiSAN), soft alignment, no weights requested | fused chunked kernel: memory O(B n_q d_v + chunk) |
| ``triton`` | additive or multi-dimensional additive, soft alignment, no weights requested, no dropout, on CUDA with ``triton`` installed, ``max(d_w, d_v)`` at most 1024 (multi 128) (or ``path="triton"``) | FlashAttention-style Triton kernels (:mod:`attnlab.general.flash_additive`): nothing ``n_q x n_k`` in memory |
| ``local-flex`` | local-m without the Gaussian factor, a dot-product score, on CUDA, no weights requested, no dropout | FlexAttention's sliding-window block mask (:mod:`attnlab.general.local_flex`) |
| ``local-triton`` | local-p, or local-m with the Gaussian factor, a dot-product score, on CUDA with ``triton`` installed, no weights requested, no dropout, ``2D + 1`` at most 256 | Triton kernels that read each window's keys and values in place (:mod:`attnlab.general.local_triton`): O(B n_q D) |
| ``local-window`` | local-m / local-p otherwise | only the ``2D + 1`` keys of each window are scored, gathered into window tensors: O(B n_q D) |
| ``explicit`` | everything else (and ``path="explicit"``) | the textbook computation |

The path is decided by :mod:`attnlab.general.planner` from the combination's capabilities
and the call's device, dtype and shapes. ``Attention.explain()`` says which path a call
takes and why; every output records it in
``AttentionOutput.path``. The fast paths agree with ``path="explicit"`` to 1e-5 in float32.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab import masks as _masks
from attnlab._checks import (
    ConfigError,
    batched_query,
    check_device,
    check_dropout,
    check_flags,
    check_module_dtype,
    check_optional_int,
    check_same,
    check_tensor,
    is_traced,
    softmax_dtype,
)
from attnlab._deprecation import renamed_keywords, warn_deprecated
from attnlab.general.alignment import Aligned, Alignment, ReinforcedAlign
from attnlab.general.dimensionality import combine_multi, combine_single
from attnlab.general.flash_additive import (
    flash_additive_attention,
    flash_multi_dim_attention,
    triton_act_name,
)
from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean
from attnlab.general.local import local_window_attend, window_dot_score
from attnlab.general.local_flex import local_flex_attend
from attnlab.general.local_triton import local_triton_attend
from attnlab.general.location import location_inputs
from attnlab.general.padding import clear_attention_inputs
from attnlab.general.planner import Plan, capabilities, check_plan_settings, plan_call
from attnlab.general.scoring import AdditiveScore, Score
from attnlab.general.sdpa import _sdpa_attend
from attnlab.output import AttentionOutput
from attnlab.registry import Configurable, get, register

__all__ = ["Attention"]

_DIMS = {"single": False, "single-dimensional": False, "multi": True, "multi-dimensional": True}


def _params(cls: type) -> set[str]:
    return {p for p in inspect.signature(cls).parameters if p != "self"}


def _bad_rows(e: Tensor, mask: Tensor | None, dim: int) -> tuple[Tensor, Tensor | None]:
    """Rows of ``e`` (along ``dim``) whose allowed scores have no finite maximum -- a NaN
    or ``+inf`` score at an allowed key, or only ``-inf`` ones -- and ``e`` with those rows
    set to 0 so that every alignment can run on it (``None``: no such row). The
    alignment's result for those rows is then overwritten with NaN (see the class
    docstring, "NaN inputs"). A ``-inf`` score in a row with a finite maximum stays: it
    gets weight 0. Under :func:`torch.compile` the rows are always computed and filled
    (no host synchronisation, hence no graph break), and so under ``torch.func``
    transforms (:func:`attnlab._checks.is_traced`)."""
    if is_traced():
        return _bad_rows_traceable(e, mask, dim)
    if bool(torch.isfinite(e.detach().sum())):  # cheap screen: NaN or inf make it non-finite
        return e, None
    bad = _bad_row_mask(e, mask, dim)
    if not bool(bad.any()):
        return e, None
    return e.masked_fill(bad, 0.0), bad


def _bad_rows_traceable(e: Tensor, mask: Tensor | None, dim: int) -> tuple[Tensor, Tensor]:
    """:func:`_bad_rows` without a data-dependent branch (for :func:`torch.compile`)."""
    bad = _bad_row_mask(e, mask, dim)
    return e.masked_fill(bad, 0.0), bad


def _bad_row_mask(e: Tensor, mask: Tensor | None, dim: int) -> Tensor:
    x = e.detach()
    if mask is not None:
        x = x.masked_fill(~mask, float("-inf"))
    bad = ~torch.isfinite(x.amax(dim, keepdim=True))  # amax propagates NaN
    if mask is not None:
        bad = bad & mask.any(dim, keepdim=True)  # a fully masked row is not bad: zeros
    return bad


def _nan_or_none(centers: Tensor) -> Tensor | None:
    nan = torch.isnan(centers)
    if is_traced():  # no host synchronisation: fill (with nothing) anyway
        return nan[..., None]
    return nan[..., None] if bool(nan.any()) else None


def _fill_nan(x: Tensor, bad: Tensor | None) -> Tensor:
    return x if bad is None else x.masked_fill(bad, float("nan"))


#: the keywords of ``Attention.forward`` before the call convention (until attnlab 0.2.0)
_RENAMED_INPUTS = {"q": "query", "k": "key", "v": "value"}


def _renamed_inputs(
    legacy: dict[str, Tensor | None],
    query: Tensor | None,
    key: Tensor | None,
    value: Tensor | None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """``(query, key, value)`` with the old keywords ``q=``, ``k=``, ``v=`` of ``legacy``
    in their places, each with a ``DeprecationWarning`` at the caller's line; an old
    keyword given with its new name (or an unknown keyword) is a ``TypeError``."""
    given = {"query": query, "key": key, "value": value}
    inputs = renamed_keywords("Attention", legacy, _RENAMED_INPUTS, given)
    return inputs["query"], inputs["key"], inputs["value"]


class _Call(NamedTuple):
    """One call of :class:`Attention` after validation, clearing and the projections."""

    q: Tensor | None  # [B, n_q, d_q]; None for a query-less score
    keys: Tensor  # [B, n_k, d_k']
    values: Tensor  # [B, n_k, d_v']
    mask: Tensor | None  # [B or 1, n_q or 1, n_k]
    need_weights: bool
    dropout_p: float  # 0 outside training
    positions: Tensor | None
    score_kw: dict[str, Any]  # extra score inputs (the previous weights)


#: what a path returns: ``(context, weights, log_prob, extras)``
_Result = tuple[Tensor, Tensor | None, Tensor | None, dict[str, Any]]

#: The method of :class:`Attention` that runs each fast path (the table above); the
#: explicit and lean-additive paths share ``_run_explicit``.
_RUNNERS: dict[str, str] = {
    "sdpa": "_run_sdpa",
    "lean-multi": "_run_lean_multi",
    "triton": "_run_triton",
    "local-flex": "_run_local_flex",
    "local-window": "_run_local_window",
    "local-triton": "_run_local_triton",
}


def _dropout(a: Tensor, p: float) -> Tensor:
    return F.dropout(a, p, True) if p > 0 else a


def _output(
    context: Tensor,
    weights: Tensor | None,
    log_prob: Tensor | None,
    path: str,
    extras: dict[str, Any],
    single: bool,
) -> AttentionOutput:
    """The output, without the query axis for a single query."""
    if single:
        context = context.squeeze(1)
        weights = weights.squeeze(1) if weights is not None else None
        if log_prob is not None and log_prob.dim() == 2:
            log_prob = log_prob.squeeze(1)
        if "centers" in extras:
            extras["centers"] = extras["centers"].squeeze(1)
    return AttentionOutput(context, weights, log_prob, path, extras)


def _check_settings(dim: str, path: str, dropout: float, sizes: dict[str, int | None]) -> None:
    for name, size in sizes.items():
        check_optional_int(size, name, owner="Attention", wording="a positive int")
    if dim not in _DIMS:
        raise ConfigError(f"dim must be 'single' or 'multi', got {dim!r}")
    if path not in ("auto", "explicit", "triton"):
        raise ConfigError(
            f"path must be 'auto' or 'explicit' (or 'triton' for the Triton kernels), got {path!r}"
        )
    check_dropout(dropout)


@dataclass(frozen=True)
class _Parts:
    """The score and alignment an :class:`Attention` is asked for, the registered classes
    of those given by name, and the options routed to them by constructor signature."""

    score: str | Score
    align: str | Alignment
    score_cls: type | None
    align_cls: type | None
    score_takes: set[str]
    align_takes: set[str]
    options: dict[str, Any]

    @classmethod
    def of(cls, score: str | Score, align: str | Alignment, options: dict[str, Any]) -> _Parts:
        score_cls = get("score", score).cls if isinstance(score, str) else None
        align_cls = get("align", align).cls if isinstance(align, str) else None
        score_takes = _params(score_cls) if score_cls else set()
        align_takes = _params(align_cls) if align_cls else set()
        parts = cls(score, align, score_cls, align_cls, score_takes, align_takes, options)
        unknown = [o for o in options if o not in parts.score_takes | parts.align_takes]
        if unknown:
            raise TypeError(
                f"Attention got unknown options {unknown}: the score "
                f"{score!r} takes {sorted(parts.score_takes - {'d_q', 'd_k', 'out_dim'})}, the "
                f"alignment {align!r} takes {sorted(parts.align_takes - {'d_q', 'd_k'})}"
            )
        return parts

    def kwargs(self, takes: set[str], d_q: int | None, d_k: int | None) -> dict[str, Any]:
        """The options a constructor taking ``takes`` accepts, with ``d_q`` and ``d_k``
        (the key size) where it takes them and they were not given as options."""
        kw = {o: v for o, v in self.options.items() if o in takes}
        for name, size in (("d_q", d_q), ("d_k", d_k)):
            if name in takes:
                kw.setdefault(name, size)
        return kw


@register("attention", "general", aliases=("attention",))
class Attention(Configurable):
    """The general attention model: any score x any alignment x any dimensionality.

    Args:
        score: a score name (see ``attnlab.registry.names("score")``) or a
            :class:`~attnlab.general.scoring.Score` module.
        align: an alignment name (``soft``, ``hard``, ``local-m``, ``local-p``,
            ``reinforced``, ``sparsemax``, ``entmax15``) or an
            :class:`~attnlab.general.alignment.Alignment` module.
        dim: ``"single"`` or ``"multi"`` (multi-dimensional, DiSAN: needs the
            ``additive`` or ``queryless`` score, which then returns vector scores).
        d_q: query size. d_k: feature/key input size. d_v: value input size (default
            ``d_k``). Each size (these and ``key_dim``, ``value_dim``) is a positive int
            or ``None``.
        key_dim: if given, keys are ``W_K F`` with ``W_K`` ``[key_dim, d_k]``;
            otherwise keys are the features themselves.
        value_dim: likewise for the values (``W_V`` ``[value_dim, d_v]``).
        dropout: dropout on the attention weights during training.
        path: ``"auto"`` (fastest correct path), ``"explicit"`` (the textbook
            computation, for reference and debugging) or ``"triton"`` (the Triton kernels
            of the additive score with soft alignment, also on CPU tensors under
            ``TRITON_INTERPRET=1``; with ``need_weights=True`` the weights come from a
            second pass and carry no gradient).
        **options: passed to the score and alignment constructors by name, e.g.
            ``d_w``, ``act``, ``bias`` (additive), ``D`` (local window), ``estimator``,
            ``eval_mode``, ``tau`` (hard). An option neither takes is an error.

    Call: ``forward(query=None, key=None, value=None, *, mask=None, need_weights=False,
    positions=None, prev_weights=None)``, the call convention of every attention module
    (``docs/call-convention.md``); ``key`` is required, ``query`` is ``None`` for a
    query-less score. The old keywords ``q=``, ``k=``, ``v=`` still work until attnlab
    0.2.0, with a ``DeprecationWarning``.

    Shapes: ``query`` ``[B, n_q, d_q]`` or ``[B, d_q]``; ``key`` (the features)
    ``[B, n_k, d_k]``; ``value`` ``[B, n_k, d_v]`` (default: the features); ``mask`` bool
    broadcastable to ``[B, n_q, n_k]`` (True = may attend). Returns
    :class:`~attnlab.output.AttentionOutput` with ``context`` ``[B, n_q, d_v']``
    (``[B, d_v']`` for a single query or a query-less score).

    An impossible combination raises :class:`~attnlab._checks.ConfigError` (a
    ``ValueError``) at construction, naming the conflict.

    Bad input raises at the call: a wrong shape or batch size (of ``query``, ``key``,
    ``value`` or ``mask``) ``ValueError``, a dtype mismatch (between ``query``, ``key`` and
    ``value``, or with the module's parameters) or a non-bool mask ``TypeError``, a device
    mismatch ``ValueError``; the message names the argument, its shape and the expected
    shape.

    Special inputs (defined behaviour, tested):

    * **Fully masked query row**: zero weights and a zero context, with zero (finite)
      gradients, on every path.
    * **Empty key set** (``n_k = 0``): a zero context ``[B, n_q, d_v']``, weights of shape
      ``[B, n_q, 0]``, zero ``log_prob`` for stochastic alignments; ``backward()`` works
      (the gradients are zero). The path is ``"explicit"``.
    * **Padding never matters**: a key (and its value) that no query of ``b`` may attend
      and a query row that may attend nothing are cleared with ``torch.where`` before
      anything is computed from them, on every path. Whatever they hold -- NaN and inf
      included -- the outputs and the gradients are those of zeros there.
    * **NaN inputs** are not an error and are not hidden. A NaN in the query ``query[b, i]``
      makes the weights and context of query row ``(b, i)`` NaN; a NaN in the features
      ``key[b, l]`` of an allowed key makes NaN every query row of batch element ``b`` that
      may attend to ``l`` (for local attention: whose window holds ``l``); a NaN in
      ``value[b, l]`` of a key that some query of ``b`` may attend makes NaN the context
      features of ``b`` that sum over key ``l``. More generally, a row whose allowed
      scores have no finite maximum (a NaN or ``+inf`` score, or only ``-inf`` ones) gets
      NaN weights and context, and a ``-inf`` score gets weight 0. This holds for every
      alignment (hard and reinforced attention return NaN weights for such rows instead
      of a choice) and other batch elements are never affected.
    * **Half precision**: convert the module with ``.to(torch.bfloat16)`` (or
      ``torch.float16``) and pass inputs of that dtype. The projections run in that dtype;
      the scores, the alignment and the lean kernels compute in float32 (so ``|q^T k|``
      beyond float16's 65504 does not overflow) and the weights are cast back before the
      weighted sum. The SDPA path runs PyTorch's kernel, which accumulates in float32.

    Example::

        attn = Attention(score="additive", align="soft", d_q=16, d_k=32, d_w=64)
        out = attn(q, features, mask=attnlab.masks.from_lengths(lengths), need_weights=True)
        out.context, out.weights, out.path

    :formula: K = W_K F, V = W_V F; e_l = score(q, k_l); a = align(e); c = sum_l a_l v_l
    :source: Brauwers & Frasincar 2023, A General Survey on Attention Mechanisms in Deep
        Learning
    :cost: that of the chosen score, alignment and dimensionality
    """

    def __init__(
        self,
        score: str | Score = "scaled-dot",
        align: str | Alignment = "soft",
        dim: str = "single",
        *,
        d_q: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        key_dim: int | None = None,
        value_dim: int | None = None,
        dropout: float = 0.0,
        path: str = "auto",
        **options: Any,
    ) -> None:
        super().__init__()
        sizes = {"d_q": d_q, "d_k": d_k, "d_v": d_v, "key_dim": key_dim, "value_dim": value_dim}
        _check_settings(dim, path, dropout, sizes)
        self.multi = _DIMS[dim]
        self.path_mode = path
        self.dropout = float(dropout)
        self.d_q = d_q
        self.d_k = d_k
        self.d_v = d_v if d_v is not None else d_k
        key_size, value_size = self._build_projections(key_dim, value_dim)
        parts = _Parts.of(score, align, options)
        self.score = self._build_score(parts, d_q, key_size, value_size)
        self._check_vector()
        self.align = self._build_align(parts, d_q, key_size)
        self._score_name = getattr(self.score, "registry_name", type(self.score).__name__)
        self._align_name = getattr(self.align, "registry_name", type(self.align).__name__)
        self._check_combination()
        self._caps = capabilities(self.score, self.align, self.multi)
        if path == "triton":
            self._check_triton_config()

    def _build_projections(
        self, key_dim: int | None, value_dim: int | None
    ) -> tuple[int | None, int | None]:
        """The optional ``W_K``, ``W_V``; returns the key and value sizes after them."""
        if key_dim is not None and self.d_k is None:
            raise ConfigError("key_dim needs d_k to build W_K")
        if value_dim is not None and self.d_v is None:
            raise ConfigError("value_dim needs d_v (or d_k) to build W_V")
        self.key_proj = nn.Linear(self.d_k, key_dim) if key_dim is not None else None
        self.value_proj = nn.Linear(self.d_v, value_dim) if value_dim is not None else None
        key_size = key_dim if key_dim is not None else self.d_k
        return key_size, value_dim if value_dim is not None else self.d_v

    def _build_score(
        self, parts: _Parts, d_q: int | None, key_size: int | None, value_size: int | None
    ) -> Score:
        """The score module: built by name (with its options, and ``out_dim = d_v`` for a
        vector score), or the module given."""
        if parts.score_cls is None:
            if not isinstance(parts.score, Score):
                raise ConfigError(
                    f"score must be a name or a Score module, got {type(parts.score).__name__}"
                )
            return parts.score
        kw = parts.kwargs(parts.score_takes, d_q, key_size)
        if self.multi:
            if "out_dim" not in parts.score_takes:
                raise ConfigError(
                    f"multi-dimensional attention needs a vector score; score {parts.score!r} "
                    "gives one number per key (use 'additive' or 'queryless')"
                )
            if value_size is None:
                raise ConfigError(
                    "multi-dimensional attention needs d_v (or d_k) for its vector score"
                )
            kw["out_dim"] = value_size
        return parts.score_cls(**kw)

    def _build_align(self, parts: _Parts, d_q: int | None, key_size: int | None) -> Alignment:
        """The alignment module: built by name (with its options), or the module given."""
        if parts.align_cls is None:
            if not isinstance(parts.align, Alignment):
                raise ConfigError(
                    f"align must be a name or an Alignment module, got {type(parts.align).__name__}"
                )
            return parts.align
        return parts.align_cls(**parts.kwargs(parts.align_takes, d_q, key_size))

    def _check_vector(self) -> None:
        """A vector score (one score per value feature) exactly with ``dim="multi"``."""
        vector = getattr(self.score, "vector", False)
        if self.multi and not vector:
            raise ConfigError(
                "multi-dimensional attention needs a vector score (a Score module built with "
                f"out_dim=d_v); {type(self.score).__name__} returns one number per key"
            )
        if not self.multi and vector:
            raise ConfigError("a vector score needs dim='multi'")

    def _check_combination(self) -> None:
        """Refuse, at construction, an alignment that does not fit the score or the
        dimensionality."""
        if self.multi and not self.align.supports_multi:
            raise ConfigError(
                f"alignment {self._align_name!r} cannot be applied per feature, so it does not "
                "combine with dim='multi' (use soft, sparsemax or entmax15)"
            )
        if self.align.local and not self.score.needs_query:
            raise ConfigError(
                f"local alignment {self._align_name!r} places a window per query, but score "
                f"{self._score_name!r} is query-less (one constant query); use a score that "
                "takes the query"
            )

    def _check_triton_config(self) -> None:
        """``path="triton"``: refuse, at construction, what the kernels cannot compute."""
        what = f"score {self._score_name!r} with alignment {self._align_name!r}"
        if not isinstance(self.score, AdditiveScore) or self._align_name != "soft":
            raise ConfigError(
                f"path='triton' runs the additive score with soft alignment only, not {what}; "
                "use path='auto'"
            )
        if triton_act_name(self.score.act) is None:
            raise ConfigError(
                f"path='triton' implements act tanh, sigmoid, relu or identity, not "
                f"{self.score.act!r}; use path='auto'"
            )
        if self.dropout > 0:
            raise ConfigError(
                "path='triton' never materialises the weights, so it has no attention "
                f"dropout (dropout={self.dropout}); use dropout=0 or path='auto'"
            )

    # ------------------------------------------------------------------ planning

    def plan(
        self,
        need_weights: bool = False,
        n_k: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        head_dim: int | None = None,
        value_dim: int | None = None,
    ) -> Plan:
        """The :class:`~attnlab.general.planner.Plan` of a call with these settings on
        ``device`` / ``dtype`` (default: those of the parameters; CPU without any) with
        keys and values of at least ``head_dim`` features and values of ``value_dim``
        (``None``: unknown); the settings are checked (:func:`check_plan_settings`)."""
        check_plan_settings(self.path_mode, need_weights, False, n_k, head_dim)
        if device is not None:
            device = check_device(device)
        if device is None or dtype is None:
            param = next(self.parameters(), None)
            if device is None:
                device = param.device if param is not None else torch.device("cpu")
            if dtype is None and param is not None:
                dtype = param.dtype
        return self._plan(need_weights, n_k, device, dtype, head_dim, value_dim)

    def _plan(
        self,
        need_weights: bool,
        n_k: int | None,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
        head_dim: int | None,
        value_dim: int | None,
    ) -> Plan:
        """:meth:`plan` for ``forward``, which checked its settings and passes the device and
        dtype of the call: no check and no walk over the parameters per call."""
        dropout = self.dropout > 0 and self.training
        widths = self._additive_widths(value_dim)
        return plan_call(
            self._caps, self.path_mode, need_weights, n_k, device, dtype, dropout, head_dim, widths
        )

    def _additive_widths(self, value_dim: int | None) -> tuple[int, int] | None:
        """``(d_w, d_v)`` of an additive score (what the Triton kernels' tiles hold): the
        hidden units, and the values (multi-dimensional: ``W_d``'s columns)."""
        if not isinstance(self.score, AdditiveScore):
            return None
        d_v = self.score.w.shape[-1] if self.multi else value_dim
        return self.score.w.shape[0], d_v or 1

    def explain(
        self,
        need_weights: bool = False,
        n_k: int | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[str, str]:
        """``(path, reason)``: the implementation a call with these settings takes (on
        ``device``; default: that of the parameters). Decided by
        :func:`attnlab.general.planner.plan_attention`."""
        plan = self.plan(need_weights, n_k, device)
        return plan.path, plan.reason

    # ------------------------------------------------------------------ forward

    def _check_key(self, key: Tensor) -> None:
        check_tensor(key, "key")
        if key.dim() != 3:
            raise ValueError(f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k]")
        B, n_k, d_k = key.shape
        if self.d_k is not None and d_k != self.d_k:
            raise ValueError(
                f"key has shape {tuple(key.shape)}, expected [B, n_k, d_k] = "
                f"[{B}, {n_k}, {self.d_k}]"
            )

    def _check_query(self, query: Tensor | None, key: Tensor) -> tuple[Tensor | None, bool]:
        """``query`` as ``[B, n_q, d_q]`` (``None`` for a query-less score) and whether it
        was a single query ``[B, d_q]``."""
        if not self.score.needs_query:
            if query is not None:
                warn_deprecated(
                    f"score {self._score_name!r} is query-less (its query is learned): the "
                    "query passed is ignored and the context is [B, d_v]; call attn(None, key)"
                )
            return None, True
        if query is None:
            raise ValueError(f"score {self._score_name!r} needs a query, got query=None")
        q3, single = batched_query(query, "query")
        B = key.shape[0]
        d_q = self.d_q if self.d_q is not None else "d_q"
        layout, n_q = ("[B, d_q]", "") if single else ("[B, n_q, d_q]", "n_q, ")
        if q3.shape[0] != B:
            raise ValueError(
                f"query has shape {tuple(query.shape)} and key {tuple(key.shape)}: their batch "
                f"sizes differ ({q3.shape[0]} != {B}); expected query {layout} = "
                f"[{B}, {n_q}{d_q}]"
            )
        if self.d_q is not None and q3.shape[-1] != self.d_q:
            raise ValueError(
                f"query has shape {tuple(query.shape)}, expected {layout} = [{B}, {n_q}{d_q}]"
            )
        check_same(key, "key", query=q3)
        return q3, single

    def _check_value(self, value: Tensor | None, key: Tensor) -> Tensor:
        """``value``, or the features ``key`` when it is ``None``."""
        B, n_k, d_k = key.shape
        if value is None:
            if self.d_v is not None and self.d_v != d_k:
                raise ValueError(
                    f"value is None, so the values are the features key {tuple(key.shape)}, "
                    f"but this Attention was built with d_v={self.d_v}; pass value "
                    f"[B, n_k, d_v] = [{B}, {n_k}, {self.d_v}]"
                )
            return key
        check_tensor(value, "value")
        d_v = self.d_v if self.d_v is not None else "d_v"
        if (
            value.dim() != 3
            or value.shape[:2] != (B, n_k)
            or (self.d_v is not None and value.shape[2] != self.d_v)
        ):
            raise ValueError(
                f"value has shape {tuple(value.shape)}, expected [B, n_k, d_v] = "
                f"[{B}, {n_k}, {d_v}]"
            )
        check_same(key, "key", value=value)
        return value

    def _check_inputs(
        self, query: Tensor | None, key: Tensor, value: Tensor | None
    ) -> tuple[Tensor | None, bool, Tensor]:
        """``(query [B, n_q, d_q] or None, single query?, value)`` after the checks."""
        self._check_key(key)
        q3, single = self._check_query(query, key)
        check_module_dtype(self, key, "key")  # exempt under torch.autocast, as torch.nn layers
        return q3, single, self._check_value(value, key)

    def forward(
        self,
        query: Tensor | None = None,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        need_weights: bool = False,
        positions: Tensor | None = None,
        prev_weights: Tensor | None = None,
        **legacy: Tensor | None,
    ) -> AttentionOutput:
        """Attend from the queries ``query`` over the features ``key`` (values ``value``,
        default ``key``). ``positions`` (``[B, n_q]`` or ``[n_q]``, finite) overrides
        local-m's window centres (another alignment refuses them: ``ValueError``);
        ``prev_weights`` (``[B, n_q, n_k]``, or ``[B, n_k]`` for a single query) are the
        previous step's weights for a location-aware score. See the class docstring for
        shapes.

        ``legacy``: the old keywords ``q=``, ``k=``, ``v=``, accepted until attnlab 0.2.0
        with a ``DeprecationWarning`` (the call convention, ``docs/call-convention.md``).
        """
        if legacy:  # an empty dict in the normal call: no graph break under torch.compile
            query, key, value = _renamed_inputs(legacy, query, key, value)
        if key is None:
            raise ValueError("key (the features / keys) is required")
        check_flags(need_weights=need_weights)
        if positions is not None and not getattr(self.align, "reads_positions", False):
            raise ValueError(
                f"positions is only read by the local-m alignment (its window centres), but "
                f"the alignment is {type(self.align).__name__}; build the Attention with "
                "align='local-m' or drop positions"
            )
        q3, single, value = self._check_inputs(query, key, value)
        B, n_k = key.shape[:2]
        n_q = q3.shape[1] if q3 is not None else 1
        mask3 = _masks.normalize_mask(mask, B, n_q, n_k, device=key.device, single_query=single)
        score_kw = location_inputs(self.score, prev_weights, B, n_q, n_k, mask3, single)
        # padding never matters: cleared before the projections (whose weight gradients
        # would otherwise multiply a zero by it)
        q3, k, v = clear_attention_inputs(q3, key, value, mask3, self_attention=query is key)
        keys = self.key_proj(k) if self.key_proj is not None else k
        values = self.value_proj(v) if self.value_proj is not None else v
        head_dim = min(keys.shape[-1], values.shape[-1])
        path = self._plan(need_weights, n_k, k.device, k.dtype, head_dim, values.shape[-1]).path
        call = _Call(
            q3,
            keys,
            values,
            mask3,
            need_weights,
            self.dropout if self.training else 0.0,
            positions,
            score_kw,
        )
        context, weights, log_prob, extras = self._run(path, call)
        return _output(context, weights if need_weights else None, log_prob, path, extras, single)

    def _run(self, path: str, call: _Call) -> _Result:
        """``(context, weights, log_prob, extras)`` of the call on ``path``."""
        runner = _RUNNERS.get(path)
        if runner is None:  # "explicit" and "lean-additive" share the general path
            return self._run_explicit(call, lean=path == "lean-additive")
        return getattr(self, runner)(call)

    def _run_sdpa(self, call: _Call) -> _Result:
        assert call.q is not None
        q2, k2, scale = self.score.dot_form(call.q, call.keys)  # type: ignore[misc]
        context, weights = _sdpa_attend(  # inputs cleared in forward
            q2, k2, call.values, scale, call.mask, call.dropout_p, call.need_weights, clear=False
        )
        return context, weights, None, {}

    def _lean_inputs(self, call: _Call) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
        """``(W1 q + b, W2 k, w or W_d, b_d, values)`` for the lean and Triton kernels,
        float32 for half inputs."""
        assert call.q is not None and isinstance(self.score, AdditiveScore)
        q1, k2 = self.score.lean_parts(call.q, call.keys)
        w, b_d = self.score.work_params()
        return q1, k2, w, b_d, call.values.to(q1.dtype)

    def _run_lean_multi(self, call: _Call) -> _Result:
        q1, k2, W_d, b_d, vals = self._lean_inputs(call)
        act = self.score.act  # type: ignore[union-attr]
        context = multi_dim_attend_lean(q1, k2, W_d, b_d, vals, call.mask, act)
        return context.to(call.values.dtype), None, None, {}

    def _run_triton(self, call: _Call) -> _Result:
        q1, k2, w, b_d, vals = self._lean_inputs(call)
        act, need = self.score.act, call.need_weights  # type: ignore[union-attr]
        if self.multi:
            context, weights = flash_multi_dim_attention(
                q1, k2, w, b_d, vals, call.mask, act, need_weights=need
            )
        else:
            context, weights = flash_additive_attention(
                q1, k2, w, vals, call.mask, act, need_weights=need
            )
        dtype = call.values.dtype
        return context.to(dtype), None if weights is None else weights.to(dtype), None, {}

    def _centers(self, call: _Call, query: Tensor | None = None) -> Tensor:
        """The window centres ``[B, n_q]`` of a local alignment, predicted from ``query``
        (default: the call's queries; the runners pass the queries they cast to the
        scores' dtype, so that a half-precision query is cast once, not twice)."""
        B, n_q, _ = call.q.shape  # type: ignore[union-attr]
        return self.align.centers(  # type: ignore[operator]
            query=call.q if query is None else query,
            batch=B,
            n_q=n_q,
            n_k=call.keys.shape[1],
            mask=call.mask,
            positions=call.positions,
            like=call.keys,
        )

    def _run_local_flex(self, call: _Call) -> _Result:
        centers = self._centers(call)
        q2, k2, scale = self.score.dot_form(call.q, call.keys)  # type: ignore[misc,arg-type]
        # local-m without positions: the window is |i - l| <= D, the same every call
        static = call.positions is None and self._caps.centres_are_positions
        context = local_flex_attend(
            q2,
            k2,
            call.values,
            scale,
            centers,
            self.align.D,
            call.mask,  # type: ignore[arg-type]
            static_window=static,  # type: ignore[arg-type]
        )
        return context, None, None, {"centers": centers}

    def _run_local_triton(self, call: _Call) -> _Result:
        assert call.q is not None
        # the score's dot form in float32 for half inputs, as on the gathered path
        work = softmax_dtype(call.q.dtype)
        q_work = call.q.to(work)
        centers = self._centers(call, q_work)
        q2, k2, scale = self.score.dot_form(q_work, call.keys.to(work))  # type: ignore[misc]
        context = local_triton_attend(
            q2, k2, call.values, centers, self.align.D, scale, call.mask, self.align.gaussian
        )
        return context, None, None, {"centers": centers}

    def _run_local_window(self, call: _Call) -> _Result:
        assert call.q is not None
        centers = self._centers(call)
        score_fn, q_in, k_in = self.score, call.q, call.keys
        if isinstance(self.score, AdditiveScore) and not self.score.vector:
            # project every key once (W2 k), not once per window slot
            q_in, k_in = self.score.lean_parts(call.q, call.keys)
            (w, _), act = self.score.work_params(), self.score.act
            score_fn = lambda qq, kk: additive_score_lean(qq, kk, w, act)  # noqa: E731
        elif self._caps.dot:
            # score = scale q'^T k': transform the queries (normalise the keys) once, then
            # score each window slot by a product summed over the features; in the scores'
            # dtype, as the score itself computes them (no half-precision rounding of W q)
            work = softmax_dtype(call.q.dtype)
            q_in, k_in, scale = self.score.dot_form(  # type: ignore[misc]
                call.q.to(work), call.keys.to(work)
            )
            score_fn = lambda qq, kk: window_dot_score(qq, kk, scale)  # noqa: E731
        context, weights, _ = local_window_attend(
            score_fn,
            q_in,
            k_in,
            call.values,
            centers,
            self.align.D,
            call.mask,  # type: ignore[arg-type]
            self.align.gaussian,
            call.need_weights,
            dropout_p=call.dropout_p,  # type: ignore[arg-type]
        )
        if weights is not None:
            # a NaN centre (e.g. from a NaN query) has no window: its whole row is NaN,
            # as on the explicit path
            weights = _fill_nan(weights, _nan_or_none(centers))
        return context, weights, None, {"centers": centers}

    def _run_explicit(self, call: _Call, lean: bool) -> _Result:
        """The scores (from the chunked kernel for ``lean``), the alignment and the
        weighted sum, each step materialised."""
        if lean:
            e = self.score(call.q, call.keys)
        else:
            e = self.score.explicit(call.q, call.keys, **call.score_kw)
        if call.keys.shape[1] == 0:
            return self._nothing_to_attend(call, e)
        if self.multi:
            return self._align_per_feature(call, e)
        return self._align(call, e)

    def _nothing_to_attend(self, call: _Call, e: Tensor) -> _Result:
        """``n_k = 0``: zero weights ``[B, n_q, 0(, d_v)]`` and a zero context, still
        connected to the inputs so that ``backward()`` works."""
        weights = (e * 0).to(call.values.dtype)
        combine = combine_multi if self.multi else combine_single
        log_prob = None
        if self.align.stochastic:
            B, n_q = e.shape[:2]
            lp_shape = (B,) if isinstance(self.align, ReinforcedAlign) else (B, n_q)
            log_prob = call.values.new_zeros(lp_shape)
        return combine(weights, call.values), weights, log_prob, {}

    def _align_per_feature(self, call: _Call, e: Tensor) -> _Result:
        """Multi-dimensional: the alignment normalises every feature's scores over the keys."""
        m4 = call.mask.unsqueeze(-1) if call.mask is not None else None
        e, bad = _bad_rows(e, m4, dim=2)
        # the scores and the alignment are in float32 for half inputs; the weighted sum runs
        # in the values' dtype
        a = _fill_nan(self.align.normalize(e, m4, dim=2), bad).to(call.values.dtype)
        context = combine_multi(_dropout(a, call.dropout_p), call.values)
        return context, a, None, {}

    def _align(self, call: _Call, e: Tensor) -> _Result:
        """Single-dimensional: the alignment module on the scores, then the weighted sum."""
        # local alignments mask everything outside the window, NaN included
        e, bad = (e, None) if self.align.local else _bad_rows(e, call.mask, dim=-1)
        # the alignment sees finite keys (reinforced attention samples from them); the rows
        # without a finite score maximum are set to NaN below
        keys = call.keys if bad is None else torch.nan_to_num(call.keys, 0.0, 0.0, 0.0)
        aligned: Aligned = self.align(
            e, call.mask, query=call.q, keys=keys, positions=call.positions
        )
        # the scores and the alignment are in float32 for half inputs; the weighted sum (and
        # what is returned) is in the values' dtype
        dtype = call.values.dtype
        a = _fill_nan(aligned.weights, bad).to(dtype)
        log_prob = aligned.log_prob.to(dtype) if aligned.log_prob is not None else None
        extras = dict(aligned.extras)
        if isinstance(extras.get("probs"), Tensor):
            extras["probs"] = _fill_nan(extras["probs"].to(dtype), bad)
        if bad is not None and log_prob is not None and log_prob.shape == bad.shape[:-1]:
            log_prob = _fill_nan(log_prob, bad.squeeze(-1))
        context = combine_single(_dropout(a, call.dropout_p), call.values)
        return context, a, log_prob, extras
