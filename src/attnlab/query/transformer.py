"""Transformer encoder and decoder layers that take any attention of the registry
(Vaswani et al. 2017), so that an ablation can swap the mechanism inside a Transformer.

Encoder layer (``sa`` = self-attention, ``ff(x) = W_2 drop(act(W_1 x + b_1)) + b_2``)::

    post-norm (norm_first=False):  x = LN_1(x + drop(sa(x)));     x = LN_2(x + drop(ff(x)))
    pre-norm  (norm_first=True):   x = x + drop(sa(LN_1(x)));     x = x + drop(ff(LN_2(x)))

Decoder layer: causal self-attention, cross-attention over the encoder output ``memory``
(``ca``), then the feed-forward block, each with its residual and norm in the same two
layouts. With ``attention="multi-head"`` (scaled dot, soft) the layers compute exactly
what ``torch.nn.TransformerEncoderLayer`` / ``TransformerDecoderLayer`` compute (tested
to 1e-5 with the same weights; :meth:`TransformerEncoderLayer.from_torch` copies them).

**The attention** is given as

* a name of the ``"query"`` registry (``"multi-head"``, ``"transformer-xl"``,
  ``"reformer"``, ``"linformer"``, ``"synthesizer"``, ...) plus ``attention_options``
  (e.g. ``{"score": "additive"}`` for multi-head attention with an additive score,
  ``{"max_len": 128, "proj_len": 32}`` for Linformer); ``d_model``, ``num_heads`` and
  ``dropout`` are filled in when the mechanism takes them and the options do not set
  them;
* a config dict (``{"name": "synthesizer", "mode": "random", "max_len": 64}``), completed
  the same way and built with :func:`attnlab.build`;
* a built module following the call convention of
  :class:`~attnlab.query.multi_head.MultiHeadAttention` (``forward(query, key=None,
  value=None, *, mask=None, causal=False, need_weights=False, ...) -> AttentionOutput``).

The decoder's ``cross_attention`` defaults to the self-attention's spec when that
mechanism can attend over another sequence (``supports_cross``); Transformer-XL and the
Reformer cannot, and then ``cross_attention`` must be given. A mechanism without a causal
mode (Linformer) cannot be the decoder's self-attention. Both are
:class:`~attnlab.ConfigError` at construction.

Both layers return an :class:`~attnlab.AttentionOutput` whose ``context`` is the layer
output ``[B, n, d_model]``, ``weights`` the self-attention weights (with
``need_weights``), and ``extras`` the self-attention's extras (e.g. Transformer-XL's
``"memory"``); the decoder adds ``extras["cross_weights"]`` and ``extras["cross_extras"]``.

Cost: that of the attention plus O(B n d_model dim_feedforward) for the feed-forward
block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError, check_flags, check_int, check_module_dtype, check_tensor
from attnlab.general.padding import attended_keys, clear_nonfinite_rows
from attnlab.output import AttentionOutput
from attnlab.query.efficient import check_dropout
from attnlab.query.multi_head import MultiHeadAttention
from attnlab.registry import Configurable, build, get, register

__all__ = ["TransformerDecoderLayer", "TransformerEncoderLayer", "build_attention"]

AttentionSpec = str | dict | nn.Module
#: the attention of a layer when none is given
DEFAULT_ATTENTION = "multi-head"
_LAYER_NAMES = ("transformer-encoder-layer", "transformer-decoder-layer")
_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu}


def _activation(act: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if callable(act):
        return act
    if act not in _ACTIVATIONS:
        raise ConfigError(f"activation must be one of {sorted(_ACTIVATIONS)} or a callable")
    return _ACTIVATIONS[act]


def _capability(spec: AttentionSpec, name: str) -> bool:
    """Whether the mechanism of ``spec`` has capability ``name`` (default True)."""
    if isinstance(spec, nn.Module):
        return bool(getattr(spec, name, True))
    mech = spec if isinstance(spec, str) else spec.get("name", DEFAULT_ATTENTION)
    cls = get("query", mech).cls
    return bool(getattr(cls, name, True))


def build_attention(
    spec: AttentionSpec,
    d_model: int,
    num_heads: int | None,
    dropout: float = 0.0,
    options: dict[str, Any] | None = None,
) -> nn.Module:
    """An attention module from a registry name (+ ``options``), a config dict or a
    built module; ``d_model``, ``num_heads`` and ``dropout`` are filled in where the
    mechanism takes them and they are not set (see the module docstring)."""
    if isinstance(spec, nn.Module):
        if options:
            raise ConfigError("attention options were given with a built attention module")
        d = getattr(spec, "d_model", d_model)
        if d != d_model:
            raise ConfigError(f"the attention module has d_model={d}, the layer {d_model}")
        return spec
    if isinstance(spec, str):
        cfg: dict[str, Any] = {"name": spec, **(options or {})}
    elif isinstance(spec, dict):
        if options:
            raise ConfigError("give the options inside the attention config dict, not both")
        cfg = dict(spec)
        cfg.setdefault("name", DEFAULT_ATTENTION)
    else:
        raise ConfigError(
            f"attention must be a registry name, a config dict or an nn.Module, got "
            f"{type(spec).__name__}"
        )
    kind = cfg.pop("kind", "query")
    if kind != "query":
        raise ConfigError(
            f"the attention of a Transformer layer is a 'query' mechanism, got {kind!r}"
        )
    entry = get("query", cfg["name"])
    if entry.name in _LAYER_NAMES:
        raise ConfigError(f"{entry.name!r} is a layer, not an attention mechanism")
    params = inspect.signature(entry.cls).parameters
    defaults = {"d_model": d_model, "num_heads": num_heads, "dropout": dropout}
    for name, value in defaults.items():
        if name in params and name not in cfg and value is not None:
            cfg[name] = value
    module = build({"kind": "query", **cfg})
    d = getattr(module, "d_model", d_model)
    if d != d_model:
        raise ConfigError(f"the attention was built with d_model={d}, the layer has {d_model}")
    return module


class _Layer(Configurable):
    """Shared parts: the constructor (the self-attention, the feed-forward block, the
    ``n_norms`` norms and residual dropouts), the residual/norm wiring and the input
    checks. The options are documented on :class:`TransformerEncoderLayer`."""

    #: residual blocks (set by each layer), each with its LayerNorm ``norm<i>`` and
    #: dropout ``dropout<i>``
    n_norms: int

    def __init__(
        self,
        d_model: int,
        num_heads: int | None = None,
        *,
        attention: AttentionSpec = DEFAULT_ATTENTION,
        attention_options: dict[str, Any] | None = None,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model")
        check_int(dim_feedforward, "dim_feedforward")
        check_flags(norm_first=norm_first)
        self.norm_first = norm_first
        self.activation = _activation(activation)
        self.linear1 = nn.Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = nn.Dropout(check_dropout(dropout))
        self.linear2 = nn.Linear(dim_feedforward, d_model, bias=bias)
        for i in range(1, self.n_norms + 1):
            setattr(self, f"norm{i}", nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
            setattr(self, f"dropout{i}", nn.Dropout(dropout))
        self.self_attn = build_attention(attention, d_model, num_heads, dropout, attention_options)

    def _ff(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def _check(self, x: Tensor, name: str) -> None:
        check_tensor(x, name)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} has shape {tuple(x.shape)}, expected [B, n, d_model] = "
                f"[B, n, {self.d_model}]"
            )
        check_module_dtype(self, x, name)

    @staticmethod
    def _clear(x: Tensor, mask: object) -> Tensor:
        """``x`` with the NaN / inf entries of its padded positions (no query may attend
        them) set to zero (``where``): their outputs stay those of finite padding, and a
        non-finite one cannot reach the gradients through the residuals and the
        feed-forward block. A mask the attention will reject is left to it."""
        if isinstance(mask, Tensor) and mask.dtype == torch.bool and 2 <= mask.dim() <= 4:
            keep = attended_keys(mask)
            if keep.shape[-1] == x.shape[1] and keep.shape[0] in (1, x.shape[0]):
                return clear_nonfinite_rows(x, keep)
        return x

    def _block(
        self,
        x: Tensor,
        sub: Callable[[Tensor], Tensor],
        norm: nn.Module,
        drop: nn.Module,
    ) -> Tensor:
        if self.norm_first:
            return x + drop(sub(norm(x)))
        return norm(x + drop(sub(x)))


@register(
    "query",
    "transformer-encoder-layer",
    aliases=("encoder-layer",),
)
class TransformerEncoderLayer(_Layer):
    """A Transformer encoder layer around any attention mechanism.

    Args:
        d_model: model size.
        num_heads: heads, passed to the attention when it takes ``num_heads``.
        attention: the self-attention: a registry name, a config dict or a module (see
            the module docstring); default ``"multi-head"``.
        attention_options: options for a named attention.
        dim_feedforward: hidden size of the feed-forward block.
        dropout: dropout on the residual branches, inside the feed-forward block and
            (when the attention takes ``dropout`` and it is not set) on the attention
            weights -- as in ``torch.nn.TransformerEncoderLayer``.
        activation: ``"relu"``, ``"gelu"`` or a callable.
        norm_first: pre-norm (True) or post-norm (False, the original).
        layer_norm_eps, bias: as in PyTorch.

    Forward: ``forward(src [B, n, d_model], *, mask=None, causal=False,
    need_weights=False, **attention_kwargs) -> AttentionOutput``; ``mask`` (bool, True =
    may attend, broadcastable to ``[B, n, n]``) and ``causal`` go to the self-attention,
    as do the ``attention_kwargs`` (e.g. ``memory=`` for Transformer-XL).

    Source: Vaswani et al. 2017, Attention Is All You Need.

    :formula: x = Norm(x + SelfAttention(x)); x = Norm(x + FF(x)) (post-norm) or pre-norm
    :source: Vaswani et al. 2017, Attention Is All You Need
    :cost: the attention's cost + O(B n d_model dim_feedforward)
    """

    supports_cross = False
    supports_causal = True
    n_norms = 2

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> TransformerEncoderLayer:
        """The equivalent layer (batch-first, same weights) of a
        ``torch.nn.TransformerEncoderLayer`` with a ReLU or GELU activation."""
        return _from_torch(
            cls,
            layer,
            nn.TransformerEncoderLayer,
            2,
            lambda t: {"attention": MultiHeadAttention.from_torch(t.self_attn)},
        )

    def forward(
        self,
        src: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        **attention_kwargs: Any,
    ) -> AttentionOutput:
        self._check(src, "src")
        src = self._clear(src, mask)
        found: dict[str, AttentionOutput] = {}

        def sa(x: Tensor) -> Tensor:
            found["sa"] = self.self_attn(
                x, mask=mask, causal=causal, need_weights=need_weights, **attention_kwargs
            )
            return found["sa"].context

        x = self._block(src, sa, self.norm1, self.dropout1)
        x = self._block(x, self._ff, self.norm2, self.dropout2)
        out = found["sa"]
        return AttentionOutput(x, out.weights, path=f"encoder:{out.path}", extras=dict(out.extras))


@register(
    "query",
    "transformer-decoder-layer",
    aliases=("decoder-layer",),
)
class TransformerDecoderLayer(_Layer):
    """A Transformer decoder layer: causal self-attention, cross-attention, feed-forward.

    Args: as :class:`TransformerEncoderLayer`, plus ``cross_attention`` /
    ``cross_attention_options`` for the attention over the encoder output (default: the
    self-attention's spec, when that mechanism supports cross-attention).

    Forward: ``forward(tgt [B, n, d_model], memory [B, m, d_model], *, tgt_mask=None,
    memory_mask=None, causal=True, need_weights=False, self_attention_kwargs=None,
    cross_attention_kwargs=None) -> AttentionOutput``. ``tgt_mask`` (broadcastable to
    ``[B, n, n]``) and ``causal`` go to the self-attention, ``memory_mask``
    (broadcastable to ``[B, n, m]``) to the cross-attention. The extra keyword arguments
    of each attention travel in their own dict (a Transformer-XL ``memory=`` would clash
    with the encoder output ``memory``).

    Source: Vaswani et al. 2017, Attention Is All You Need.

    :formula: x = Norm(x + CausalSelfAttention(x)); x = Norm(x + CrossAttention(x, memory)); x =
        Norm(x + FF(x)) (post-norm) or pre-norm
    :source: Vaswani et al. 2017, Attention Is All You Need
    :cost: the two attentions' costs + O(B n d_model dim_feedforward)
    """

    supports_cross = False
    supports_causal = True
    n_norms = 3

    def __init__(
        self,
        d_model: int,
        num_heads: int | None = None,
        *,
        cross_attention: AttentionSpec | None = None,
        cross_attention_options: dict[str, Any] | None = None,
        **layer_options: Any,
    ) -> None:
        """``layer_options``: the options of :class:`TransformerEncoderLayer`
        (``attention``, ``attention_options``, ``dim_feedforward``, ``dropout``,
        ``activation``, ``norm_first``, ``layer_norm_eps``, ``bias``)."""
        attention = layer_options.get("attention", DEFAULT_ATTENTION)
        attention_options = layer_options.get("attention_options")
        if not _capability(attention, "supports_causal"):
            raise ConfigError(
                f"{_spec_name(attention)} has no causal mode, so it cannot be the decoder's "
                "self-attention"
            )
        if cross_attention is None:
            if isinstance(attention, nn.Module) or not _capability(attention, "supports_cross"):
                raise ConfigError(
                    f"{_spec_name(attention)} cannot be reused for the cross-attention "
                    "(a built module, or a self-attention-only mechanism); pass "
                    "cross_attention= (e.g. 'multi-head')"
                )
            cross_attention = attention
            if cross_attention_options is None:
                cross_attention_options = attention_options
        elif not _capability(cross_attention, "supports_cross"):
            raise ConfigError(
                f"{_spec_name(cross_attention)} is self-attention only; it cannot attend over "
                "the encoder output"
            )
        super().__init__(d_model, num_heads, **layer_options)
        self.multihead_attn = build_attention(
            cross_attention, d_model, num_heads, self.dropout.p, cross_attention_options
        )

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> TransformerDecoderLayer:
        """The equivalent layer (batch-first, same weights) of a
        ``torch.nn.TransformerDecoderLayer``."""
        return _from_torch(
            cls,
            layer,
            nn.TransformerDecoderLayer,
            3,
            lambda t: {
                "attention": MultiHeadAttention.from_torch(t.self_attn),
                "cross_attention": MultiHeadAttention.from_torch(t.multihead_attn),
            },
        )

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        causal: bool = True,
        need_weights: bool = False,
        self_attention_kwargs: dict[str, Any] | None = None,
        cross_attention_kwargs: dict[str, Any] | None = None,
    ) -> AttentionOutput:
        self._check(tgt, "tgt")
        self._check(memory, "memory")
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"memory has shape {tuple(memory.shape)}, expected [B, m, d_model] = "
                f"[{tgt.shape[0]}, m, {self.d_model}]"
            )
        tgt = self._clear(tgt, tgt_mask)
        found: dict[str, AttentionOutput] = {}

        def sa(x: Tensor) -> Tensor:
            found["sa"] = self.self_attn(
                x,
                mask=tgt_mask,
                causal=causal,
                need_weights=need_weights,
                **(self_attention_kwargs or {}),
            )
            return found["sa"].context

        def ca(x: Tensor) -> Tensor:
            found["ca"] = self.multihead_attn(
                x,
                memory,
                mask=memory_mask,
                need_weights=need_weights,
                **(cross_attention_kwargs or {}),
            )
            return found["ca"].context

        x = self._block(tgt, sa, self.norm1, self.dropout1)
        x = self._block(x, ca, self.norm2, self.dropout2)
        x = self._block(x, self._ff, self.norm3, self.dropout3)
        extras = dict(found["sa"].extras)
        extras["cross_weights"] = found["ca"].weights
        extras["cross_extras"] = found["ca"].extras
        return AttentionOutput(
            x, found["sa"].weights, path=f"decoder:{found['sa'].path}", extras=extras
        )


def _spec_name(spec: AttentionSpec) -> str:
    if isinstance(spec, nn.Module):
        return type(spec).__name__
    if isinstance(spec, dict):
        return repr(spec.get("name", DEFAULT_ATTENTION))
    return repr(spec)


def _torch_activation(act: object) -> str | Callable[[Tensor], Tensor]:
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if callable(act):
        return act  # type: ignore[return-value]
    raise TypeError(f"unsupported activation {act!r}")


def _torch_layer_options(layer: nn.Module) -> dict[str, Any]:
    """The constructor options a PyTorch Transformer layer shares with ours."""
    return {
        "dim_feedforward": layer.linear1.out_features,
        "dropout": layer.dropout.p,
        "activation": _torch_activation(layer.activation),
        "norm_first": layer.norm_first,
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
    }


def _copy_common(ours: _Layer, theirs: nn.Module, n_norms: int) -> None:
    ref = theirs.linear1.weight
    ours.to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        names = ["linear1", "linear2"] + [f"norm{i}" for i in range(1, n_norms + 1)]
        for name in names:
            src, dst = getattr(theirs, name), getattr(ours, name)
            dst.weight.copy_(src.weight)
            if src.bias is not None:
                dst.bias.copy_(src.bias)


_L = TypeVar("_L", bound=_Layer)


def _from_torch(
    cls: type[_L],
    layer: nn.Module,
    expected: type[nn.Module],
    norms: int,
    attentions: Callable[[Any], dict[str, nn.Module]],
) -> _L:
    """The layer ``cls`` equivalent to the PyTorch layer ``layer`` (of type ``expected``,
    with ``norms`` LayerNorms): same options, same weights, batch-first."""
    if not isinstance(layer, expected):
        raise TypeError(f"layer must be a torch.nn.{expected.__name__}, got {type(layer).__name__}")
    out = cls(layer.linear1.in_features, **attentions(layer), **_torch_layer_options(layer))
    _copy_common(out, layer, norms)
    out.train(layer.training)
    return out
