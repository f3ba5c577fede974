"""A shared harness for the tests of attention modules (in the spirit of Keras'
``run_layer_test``): the checks that every module test used to write again, each a small
function a test calls when it applies.

Usage (``tests/`` is on ``sys.path`` because ``tests/conftest.py`` lives there)::

    from attention_harness import Inputs, run_attention_test

    m = MultiHeadAttention(8, 2)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    mask = masks.from_lengths(torch.tensor([5, 2]))
    run_attention_test(
        m,
        Inputs((q, kv), {"mask": mask}, names=("query", "key")),
        context_shape=(2, 3, 8),
        weights_shape=(2, 3, 5),
        mask=mask,
    )

or one check at a time (``check_output``, ``check_need_weights_keeps_context``,
``check_weights_none_unless_asked``, ``check_masked_keys_zero``,
``check_fully_masked_row``, ``check_all_rows_masked``, ``check_gradients``,
``check_wrong_dtype``, ``check_rebuild``, ``check_rebuild_same_output``,
``check_dropout_only_in_training``); for the reference loops, ``naive_softmax``; for
the learning tests, ``check_learns_against_no_attention`` on the tasks of
``benchmarks/variants.py`` (``benchmark_variants`` loads that module).

Every check calls the module as ``module(*inputs.args, **inputs.kwargs, **extra)``: the
call convention ``forward(query, key=None, value=None, *, mask=None, need_weights=False,
...)``. A module can also be given as a registry spec: ``module_from_spec("multi-head",
d_model=8, num_heads=2)``. Each check returns what a test may want to look at further
(the output, the rebuilt module, ...), so a test keeps its own specific assertions next to
the shared ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

import attnlab
from attnlab.output import AttentionOutput

__all__ = [
    "Inputs",
    "benchmark_variants",
    "call",
    "check_all_rows_masked",
    "check_dropout_only_in_training",
    "check_fully_masked_row",
    "check_gradients",
    "check_learns_against_no_attention",
    "check_masked_keys_zero",
    "check_need_weights_keeps_context",
    "check_output",
    "check_rebuild",
    "check_rebuild_same_output",
    "check_weights_none_unless_asked",
    "check_wrong_dtype",
    "module_from_spec",
    "naive_softmax",
    "run_attention_test",
]


@dataclass
class Inputs:
    """The inputs of one call: positional tensors ``args`` (query, key, value, ...) and
    keyword inputs ``kwargs`` (``mask``, ``causal``, ...). ``names`` are the names of the
    positional arguments in the module's signature (used by :func:`check_wrong_dtype`)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] = ("query", "key", "value")

    def with_arg(self, which: int | str, value: Any) -> Inputs:
        """A copy with the positional argument ``which`` (index or name) or the keyword
        input ``which`` replaced by ``value``."""
        if isinstance(which, str) and which in self.names[: len(self.args)]:
            which = self.names.index(which)
        if isinstance(which, int):
            args = list(self.args)
            args[which] = value
            return replace(self, args=tuple(args))
        return replace(self, kwargs={**self.kwargs, which: value})

    def get(self, which: int | str) -> Any:
        if isinstance(which, str) and which in self.names[: len(self.args)]:
            which = self.names.index(which)
        return self.args[which] if isinstance(which, int) else self.kwargs[which]

    def tensors(self) -> Iterator[tuple[str, Tensor]]:
        """``(name, tensor)`` of every floating-point input."""
        for i, a in enumerate(self.args):
            if isinstance(a, Tensor) and a.is_floating_point():
                yield (self.names[i] if i < len(self.names) else f"arg{i}"), a
        for k, a in self.kwargs.items():
            if isinstance(a, Tensor) and a.is_floating_point():
                yield k, a


def _as_inputs(inputs: Inputs | Sequence[Any]) -> Inputs:
    return inputs if isinstance(inputs, Inputs) else Inputs(tuple(inputs))


def module_from_spec(name: str, kind: str | None = None, **kwargs: Any) -> nn.Module:
    """Build a module by its registry name (``attnlab.build``)."""
    cfg: dict[str, Any] = {"name": name, **kwargs}
    if kind is not None:
        cfg["kind"] = kind
    return attnlab.build(cfg)


@contextlib.contextmanager
def _eval(module: nn.Module) -> Iterator[None]:
    was = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was)


def call(module: nn.Module, inputs: Inputs | Sequence[Any], **extra: Any) -> Any:
    """``module(*inputs.args, **inputs.kwargs, **extra)``."""
    inputs = _as_inputs(inputs)
    return module(*inputs.args, **{**inputs.kwargs, **extra})


def check_output(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    *,
    context_shape: tuple[int, ...],
    weights_shape: tuple[int, ...] | None = None,
    output_type: type = AttentionOutput,
    context_of: Callable[[Any], Tensor] | None = None,
    **extra: Any,
) -> Any:
    """With ``need_weights=True`` the module returns ``output_type`` (an
    :class:`AttentionOutput` or the module's documented output) whose ``context`` (or
    ``context_of(out)`` for an output record without one) and (when ``weights_shape`` is
    given) ``weights`` have the documented shapes; the context is finite. Returns the
    output."""
    out = call(module, inputs, need_weights=True, **extra)
    assert isinstance(out, output_type), f"{type(out).__name__} is not a {output_type.__name__}"
    context = out.context if context_of is None else context_of(out)
    assert tuple(context.shape) == tuple(context_shape), (
        f"context {tuple(context.shape)} != {tuple(context_shape)}"
    )
    assert torch.isfinite(context).all()
    if weights_shape is not None:
        assert out.weights is not None
        assert tuple(out.weights.shape) == tuple(weights_shape), (
            f"weights {tuple(out.weights.shape)} != {tuple(weights_shape)}"
        )
    return out


def check_need_weights_keeps_context(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    *,
    atol: float = 1e-6,
    rtol: float = 1e-5,
    **extra: Any,
) -> tuple[Any, Any]:
    """In eval mode, asking for the weights does not change the context (an SDPA path
    without weights and an explicit path with them agree). Returns both outputs."""
    with _eval(module), torch.no_grad():
        plain = call(module, inputs, need_weights=False, **extra)
        full = call(module, inputs, need_weights=True, **extra)
    torch.testing.assert_close(plain.context, full.context, atol=atol, rtol=rtol)
    return plain, full


def check_weights_none_unless_asked(
    module: nn.Module, inputs: Inputs | Sequence[Any], **extra: Any
) -> Any:
    """Without ``need_weights`` the output's ``weights`` are ``None``; with it they are a
    tensor. Returns the output of the call without weights."""
    with _eval(module), torch.no_grad():
        out = call(module, inputs, **extra)
        assert out.weights is None, "weights returned although need_weights=False"
        assert call(module, inputs, need_weights=True, **extra).weights is not None
    return out


def _key_mask_for(weights: Tensor, mask: Tensor) -> Tensor:
    """``mask`` (True = may attend) broadcast to the shape of ``weights``: a ``[B, n_k]``
    key mask gets its query axes, a trailing feature axis of multi-dimensional weights is
    added."""
    m = mask
    if m.dim() < weights.dim() and m.shape[-1] == weights.shape[-1]:
        while m.dim() < weights.dim():
            m = m.unsqueeze(1)
    elif m.dim() < weights.dim():  # [B, n_q, n_k] against [B, n_q, n_k, d]
        while m.dim() < weights.dim():
            m = m.unsqueeze(-1)
    return m.expand_as(weights)


def check_masked_keys_zero(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    mask: Tensor,
    *,
    weights_of: Callable[[Any], Tensor] | None = None,
    **extra: Any,
) -> Any:
    """Keys the mask forbids (False) get exactly zero weight, and the weights are finite.
    ``mask`` is the key mask as seen by the weights (``[B, n_k]``, ``[B, 1, n_k]`` or
    ``[B, n_q, n_k]``); it is NOT passed to the call (put it into ``inputs``).
    ``weights_of(out)`` picks the weights to check (default ``out.weights``)."""
    with _eval(module), torch.no_grad():
        out = call(module, inputs, need_weights=True, **extra)
    w = out.weights if weights_of is None else weights_of(out)
    assert torch.isfinite(w).all()
    m = _key_mask_for(w, mask.to(w.device))
    assert torch.equal(w[~m], torch.zeros_like(w[~m])), "a masked key got non-zero weight"
    return out


def check_fully_masked_row(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    row: tuple[Any, ...],
    *,
    expected_context: Tensor | None = None,
    weights_of: Callable[[Any], Tensor] | None = None,
    backward: bool = True,
    **extra: Any,
) -> Any:
    """The library's documented result for a query row that may attend to nothing
    (``docs/masks.md``): its weights are all zero (not NaN), its context is finite and
    equals ``expected_context`` when given (zeros for :class:`attnlab.Attention`; the
    output bias for modules with an output projection), and the backward pass gives
    finite gradients. ``row`` indexes the row in the weights and in the context (e.g.
    ``(0, 1)`` = example 0, query 1; ``(1,)`` = example 1 of a pooled output)."""
    grads = [t for _, t in _as_inputs(inputs).tensors() if t.requires_grad]
    out = call(module, inputs, need_weights=True, **extra)
    w = out.weights if weights_of is None else weights_of(out)
    assert torch.equal(w[row], torch.zeros_like(w[row])), "a fully masked row has weights"
    assert torch.isfinite(out.context).all()
    if expected_context is not None:
        torch.testing.assert_close(out.context[row], expected_context)
    if backward and (grads or any(p.requires_grad for p in module.parameters())):
        out.context.sum().backward()
        for t in grads:
            assert t.grad is None or torch.isfinite(t.grad).all()
        for name, p in module.named_parameters():
            assert p.grad is None or torch.isfinite(p.grad).all(), f"{name} grad not finite"
    return out


def check_gradients(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    *,
    skip_params: Sequence[str] = (),
    skip_inputs: Sequence[str] = (),
    output_of: Callable[[Any], Tensor] | None = None,
    **extra: Any,
) -> Any:
    """Gradients reach every floating-point input and every trainable parameter (except
    those named in ``skip_params`` / ``skip_inputs``, e.g. a parameter a stochastic path
    does not use), and they are finite. The inputs are cloned with ``requires_grad``;
    the loss is ``output_of(out).sum()`` (default: the context). Returns the output."""
    inputs = _as_inputs(inputs)
    leaves: dict[str, Tensor] = {}
    args = list(inputs.args)
    kwargs = dict(inputs.kwargs)
    for i, a in enumerate(args):
        if isinstance(a, Tensor) and a.is_floating_point():
            name = inputs.names[i] if i < len(inputs.names) else f"arg{i}"
            args[i] = leaves[name] = a.detach().clone().requires_grad_(True)
    for k, a in kwargs.items():
        if isinstance(a, Tensor) and a.is_floating_point():
            kwargs[k] = leaves[k] = a.detach().clone().requires_grad_(True)
    inputs = replace(inputs, args=tuple(args), kwargs=kwargs)
    module.zero_grad(set_to_none=True)
    out = call(module, inputs, **extra)
    y = out.context if output_of is None else output_of(out)
    (y * torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    for name, leaf in leaves.items():
        if name in skip_inputs:
            continue
        assert leaf.grad is not None, f"no gradient reaches the input {name!r}"
        assert torch.isfinite(leaf.grad).all(), f"the gradient of {name!r} is not finite"
    for name, p in module.named_parameters():
        if not p.requires_grad or any(name.startswith(s) for s in skip_params):
            continue
        assert p.grad is not None, f"no gradient reaches the parameter {name!r}"
        assert torch.isfinite(p.grad).all(), f"the gradient of {name!r} is not finite"
    return out


def check_wrong_dtype(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    which: int | str,
    *,
    name: str | None = None,
    dtype: torch.dtype | None = None,
    match: str | None = None,
    **extra: Any,
) -> pytest.ExceptionInfo:
    """An input of the wrong dtype (default: float64 for a floating-point input, float32
    for a bool mask) raises a one-line ``TypeError`` that names the argument (``name``,
    default the input's name) and matches ``match`` when given."""
    inputs = _as_inputs(inputs)
    x = inputs.get(which)
    if dtype is None:
        dtype = torch.float32 if x.dtype == torch.bool else torch.float64
        if x.dtype == dtype:
            dtype = torch.float32 if dtype == torch.float64 else torch.float64
    if name is None:
        name = which if isinstance(which, str) else inputs.names[which]
    with pytest.raises(TypeError, match=match) as info:
        call(module, inputs.with_arg(which, x.to(dtype)), **extra)
    msg = str(info.value)
    assert "\n" not in msg.strip(), f"not one line: {msg!r}"
    assert name in msg, f"{msg!r} does not name {name!r}"
    return info


def check_rebuild(module: nn.Module, **expected_attrs: Any) -> nn.Module:
    """``attnlab.build(module.get_config())`` rebuilds a module of the same class with the
    same config and parameter shapes; ``expected_attrs`` are attributes it must have."""
    cfg = module.get_config()
    rebuilt = attnlab.build(dict(cfg))
    assert type(rebuilt) is type(module), f"{type(rebuilt).__name__} != {type(module).__name__}"
    assert rebuilt.get_config() == cfg
    shapes = {n: tuple(p.shape) for n, p in module.named_parameters()}
    assert {n: tuple(p.shape) for n, p in rebuilt.named_parameters()} == shapes
    for attr, value in expected_attrs.items():
        assert getattr(rebuilt, attr) == value, f"{attr}: {getattr(rebuilt, attr)!r} != {value!r}"
    return rebuilt


def run_attention_test(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    *,
    context_shape: tuple[int, ...],
    weights_shape: tuple[int, ...] | None = None,
    output_type: type = AttentionOutput,
    mask: Tensor | None = None,
    weights_none_unless_asked: bool = True,
    dtype_arg: int | str | None = 0,
    rebuild: bool = True,
    gradients: bool = True,
    skip_params: Sequence[str] = (),
    atol: float = 1e-6,
    **extra: Any,
) -> Any:
    """Every generic check at once: output type and shapes, need_weights keeps the
    context, weights None unless asked, masked keys zero (when ``mask`` is given, the
    mask as the weights see it), gradients, a wrong dtype of ``dtype_arg`` (``None``: skip)
    and the rebuild from the config. Returns the output of :func:`check_output`."""
    out = check_output(
        module,
        inputs,
        context_shape=context_shape,
        weights_shape=weights_shape,
        output_type=output_type,
        **extra,
    )
    check_need_weights_keeps_context(module, inputs, atol=atol, **extra)
    if weights_none_unless_asked:
        check_weights_none_unless_asked(module, inputs, **extra)
    if mask is not None:
        check_masked_keys_zero(module, inputs, mask, **extra)
    if gradients:
        check_gradients(module, inputs, skip_params=skip_params, **extra)
    if dtype_arg is not None:
        check_wrong_dtype(module, inputs, dtype_arg, **extra)
    if rebuild:
        check_rebuild(module)
    return out


# ----------------------------------------------------------------------------- learning checks

#: the script whose tasks and tiny model the learning tests of the query modules share
BENCHMARK_VARIANTS = Path(__file__).resolve().parents[1] / "benchmarks" / "variants.py"


def benchmark_variants() -> Any:
    """``benchmarks/variants.py`` loaded as a fresh module: its tasks (``make_batch``),
    the 1-layer encoder it trains (``train_and_eval``) and its cost tables."""
    spec = importlib.util.spec_from_file_location("attnlab_bench_variants", BENCHMARK_VARIANTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: (task, n, steps) -> accuracy of the model without attention (trained once a session)
_NO_ATTENTION_ACCURACY: dict[tuple[str, int, int], float] = {}


def check_learns_against_no_attention(
    attention: str | dict[str, Any],
    task: str,
    *,
    n: int = 32,
    steps: int = 250,
    above: float = 0.9,
    baseline_below: float = 0.3,
) -> tuple[float, float]:
    """A 1-layer encoder with ``attention`` (a registry name or config) learns ``task``
    of ``benchmarks/variants.py`` (``copy-first``: retrieval by position,
    ``flag-recall``: by content; vocabulary 8, sequences of ``n``, ``steps`` Adam steps)
    to an accuracy above ``above``, while the same model with no attention (the
    feed-forward block alone) stays below ``baseline_below`` (chance 1/8).
    ``train_and_eval`` seeds itself, so the baseline of one ``(task, n, steps)`` is
    trained once and reused. Returns ``(accuracy, baseline accuracy)``."""
    bench = benchmark_variants()
    acc = bench.train_and_eval(attention, task, n=n, steps=steps)
    key = (task, n, steps)
    if key not in _NO_ATTENTION_ACCURACY:
        _NO_ATTENTION_ACCURACY[key] = bench.train_and_eval(None, task, n=n, steps=steps)
    base = _NO_ATTENTION_ACCURACY[key]
    assert acc > above, f"{attention!r} on {task}: accuracy {acc} <= {above}"
    assert base < baseline_below, f"no attention on {task}: accuracy {base} >= {baseline_below}"
    return acc, base


def naive_softmax(scores: dict[Any, float]) -> dict[Any, float]:
    """The reference softmax of the loop implementations that tests compare a module
    against: ``{index: score}`` of the positions a row may attend (the masked ones left
    out) to ``{index: weight}``, ``exp(s - max) / sum exp(s - max)`` in Python floats; a
    row with no position gives ``{}`` (the library's all-zero weights)."""
    if not scores:
        return {}
    mx = max(scores.values())
    z = sum(math.exp(s - mx) for s in scores.values())
    return {i: math.exp(s - mx) / z for i, s in scores.items()}


def check_all_rows_masked(
    module: nn.Module,
    query: Tensor,
    *,
    zero_context: bool = False,
    **extra: Any,
) -> Any:
    """Self-attention over ``query`` ``[B, n, d]`` with a ``[B, n, n]`` mask that forbids
    every key: :func:`check_fully_masked_row` on all rows at once (zero weights, a finite
    context, finite gradients of the parameters), and the weights are ``[B, n, n]``, the
    context ``[B, n, d]`` (exactly zero when ``zero_context``: a module without biases)
    and a finite gradient reaches ``query``. Returns the output."""
    B, n, d = query.shape
    x = query.detach().clone().requires_grad_(True)
    none = torch.zeros(B, n, n, dtype=torch.bool, device=query.device)
    out = check_fully_masked_row(module, Inputs((x,), {"mask": none}), (...,), **extra)
    assert tuple(out.weights.shape) == (B, n, n), f"weights {tuple(out.weights.shape)}"
    assert tuple(out.context.shape) == (B, n, d), f"context {tuple(out.context.shape)}"
    if zero_context:
        assert torch.equal(out.context, torch.zeros_like(out.context)), "the context is not 0"
    assert x.grad is not None, "no gradient reaches the query"
    assert torch.isfinite(x.grad).all(), "the gradient of the query is not finite"
    return out


def check_dropout_only_in_training(
    module: nn.Module, inputs: Inputs | Sequence[Any], **extra: Any
) -> tuple[Any, Any, Any]:
    """A module with dropout: in evaluation mode two calls give the same context; in
    training mode two calls under different seeds (1 and 2) give different contexts, each
    different from the evaluation context. The module's mode is restored. Returns the
    outputs ``(evaluation, training seed 1, training seed 2)``, so that a test can check
    more of them (e.g. that the returned weights are those before dropout)."""
    was = module.training
    try:
        module.eval()
        e1, e2 = call(module, inputs, **extra), call(module, inputs, **extra)
        assert torch.equal(e1.context, e2.context), "evaluation is not deterministic"
        module.train()
        torch.manual_seed(1)
        t1 = call(module, inputs, **extra)
        torch.manual_seed(2)
        t2 = call(module, inputs, **extra)
    finally:
        module.train(was)
    assert not torch.allclose(t1.context, e1.context), "training equals evaluation"
    assert not torch.allclose(t1.context, t2.context), "two training calls are equal"
    return e1, t1, t2


def check_rebuild_same_output(
    module: nn.Module,
    inputs: Inputs | Sequence[Any],
    *,
    output: str = "context",
    **expected_attrs: Any,
) -> nn.Module:
    """:func:`check_rebuild`, then the rebuilt module, given ``module``'s parameters
    (``load_state_dict``) and put in the same training or evaluation mode, computes the
    same ``output`` (an attribute of the result, the context by default) on ``inputs`` as
    ``module``. Returns the rebuilt module."""
    rebuilt = check_rebuild(module, **expected_attrs)
    rebuilt.load_state_dict(module.state_dict())
    rebuilt.train(module.training)
    with torch.no_grad():
        want = getattr(call(module, inputs), output)
        got = getattr(call(rebuilt, inputs), output)
    torch.testing.assert_close(got, want, msg=lambda m: f"rebuilt {output}: {m}")
    return rebuilt
