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
import copy
import importlib.util
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
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
    "check_layer_replacements",
    "check_learns_against_no_attention",
    "check_masked_keys_zero",
    "check_need_weights_keeps_context",
    "check_onnx_export",
    "check_output",
    "check_rebuild",
    "check_rebuild_same_output",
    "check_weights_none_unless_asked",
    "check_wrong_dtype",
    "module_from_spec",
    "naive_softmax",
    "onnx_session",
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


# ------------------------------------------------------------------------ invariance checks
# The checks of tests/test_invariances.py, one property each, on a :class:`Mechanism`: a
# description of how one mechanism is built and called, so that the same four checks run
# over every registered mechanism whatever its call form.


def _context_and_weights(out: Any) -> dict[str, Tensor | None]:
    return {"context": out.context, "weights": out.weights}


@dataclass(frozen=True)
class Mechanism:
    """How to build and call one mechanism for the invariance checks.

    ``shapes`` maps an input's name to its shape without the batch axis; a ``str`` in a
    shape names a *sequence* (its length is chosen by the check; inputs that name the same
    sequence are permuted or padded together, e.g. the keys and values). ``call(module,
    x, masks, need_weights)`` calls the module on the inputs ``x`` (a dict, the ``fixed``
    ones included) with ``masks`` (sequence name -> bool ``[B, n]``, True = real position;
    only sequences in ``masked`` ever get one, and a missing entry means no mask).
    ``fixed(batch, lengths)`` gives the non-random inputs (indices, offsets) with the batch
    axis first. ``outputs(out)`` names the output tensors compared (``None`` ones are
    skipped) and ``axes[name]`` lists ``(axis, sequence)``: the axes of that output that
    run along a sequence (an output not listed runs along none)."""

    build: Callable[[], nn.Module]
    shapes: dict[str, tuple[int | str, ...]]
    call: Callable[[nn.Module, dict[str, Tensor], dict[str, Tensor], bool], Any]
    masked: tuple[str, ...] = ()
    fixed: Callable[[int, dict[str, int]], dict[str, Tensor]] | None = None
    outputs: Callable[[Any], dict[str, Tensor | None]] = _context_and_weights
    axes: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)

    def sequences(self) -> list[str]:
        """The sequence names of ``shapes``, in order of appearance."""
        seen: list[str] = []
        for shape in self.shapes.values():
            seen += [s for s in shape if isinstance(s, str) and s not in seen]
        return seen

    def draw(self, batch: int, lengths: dict[str, int], seed: int = 0) -> dict[str, Tensor]:
        """Standard normal inputs (a fixed generator) and the ``fixed`` ones."""
        g = torch.Generator().manual_seed(seed)
        x = {
            name: torch.randn(
                batch, *(lengths[s] if isinstance(s, str) else s for s in shape), generator=g
            )
            for name, shape in self.shapes.items()
        }
        if self.fixed is not None:
            x.update(self.fixed(batch, lengths))
        return x

    def run(
        self,
        module: nn.Module,
        x: dict[str, Tensor],
        masks: dict[str, Tensor],
        need_weights: bool = True,
    ) -> dict[str, Tensor]:
        """The named outputs of one call in evaluation mode without gradients (``None``
        ones dropped)."""
        with _eval(module), torch.no_grad():
            out = self.outputs(self.call(module, x, masks, need_weights))
        return {k: v for k, v in out.items() if v is not None}


#: the tolerance of the invariance checks (fp32, tiny sizes)
INVARIANCE_TOL = {"atol": 1e-5, "rtol": 1e-5}


def _ragged_masks(mech: Mechanism, batch: int, n: int) -> dict[str, Tensor]:
    """``[B, n]`` masks of every masked sequence: sample ``b`` keeps the first
    ``n - (0, 2, 1)[b % 3]`` positions."""
    short = torch.tensor([(0, 2, 1)[b % 3] for b in range(batch)])
    keep = torch.arange(n)[None, :] < (n - short)[:, None]
    return {s: keep.clone() for s in mech.masked}


def _assert_outputs_close(
    got: dict[str, Tensor], want: dict[str, Tensor], what: str, **tol: Any
) -> None:
    assert got.keys() == want.keys(), f"{what}: outputs {sorted(got)} != {sorted(want)}"
    for k in want:
        torch.testing.assert_close(
            got[k], want[k], **(tol or INVARIANCE_TOL), msg=lambda m, k=k: f"{what}, {k}: {m}"
        )


def _cut(mech: Mechanism, out: dict[str, Tensor], n: int) -> dict[str, Tensor]:
    """``out`` cut to the first ``n`` positions along the axes of the masked sequences."""
    cut = {}
    for k, v in out.items():
        for axis, s in mech.axes.get(k, ()):
            if s in mech.masked:
                v = v.narrow(axis, 0, n)
        cut[k] = v
    return cut


def _take(mech: Mechanism, x: dict[str, Tensor], b: int, n: int | None = None) -> dict:
    """Sample ``b`` of the inputs ``x`` (a batch of 1); with ``n``, only the first ``n``
    positions of every masked sequence (the ``fixed`` inputs drawn again for them)."""
    one = {k: v[b : b + 1] for k, v in x.items()}
    if n is None:
        return one
    lengths = {s: n if s in mech.masked else None for s in mech.sequences()}
    for name, shape in mech.shapes.items():
        for i, s in enumerate(shape):
            if s in mech.masked:
                one[name] = one[name].narrow(i + 1, 0, n)
    if mech.fixed is not None:
        full = {s: x_len for s, x_len in lengths.items() if x_len is not None}
        for name, shape in mech.shapes.items():  # the lengths of the unmasked sequences
            for i, s in enumerate(shape):
                if isinstance(s, str) and s not in full:
                    full[s] = x[name].shape[i + 1]
        one.update(mech.fixed(1, full))
    return one


def check_batch_independence(
    mech: Mechanism,
    *,
    n: int = 5,
    batch: int = 3,
    trimmed: bool = True,
    empty_sample: bool = True,
) -> None:
    """In evaluation mode the outputs of sample ``b`` do not depend on the other samples:
    a batch of ``batch`` and each sample alone (a batch of 1) agree, with and without the
    weights, without masks and (for a mechanism with masks) with masks of different lengths
    per sample -- so no statistic is shared across the batch and no mask is broadcast
    over it. With ``trimmed`` (a mechanism whose padding never matters) each sample of the
    ragged batch also equals the sample alone cut to its real positions, without a mask:
    what dynamic batching relies on. Two batches that take the data-dependent branches
    (``bool(tensor.any())`` on the whole batch) check that no branch leaks across samples:
    sample 1 with NaN in every floating input's first entry (its own outputs may be NaN:
    compared with ``equal_nan``), and, with ``empty_sample`` and masks, sample 1 with
    every position masked."""
    torch.manual_seed(0)
    module = mech.build()
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    nan = {k: v.clone() for k, v in x.items()}
    for v in nan.values():
        if v.is_floating_point():
            v[1].view(-1)[0] = float("nan")
    cases: list[tuple[str, dict[str, Tensor], dict[str, Tensor]]] = [("no masks", x, {})]
    if mech.masked:
        ragged = _ragged_masks(mech, batch, n)
        cases.append(("ragged masks", x, ragged))
        if empty_sample:
            empty = {k: v.clone() for k, v in ragged.items()}
            for v in empty.values():
                v[1] = False
            cases.append(("sample 1 fully masked", x, empty))
    cases.append(("NaN in sample 1", nan, {}))
    for case, inputs, masks in cases:
        for nw in (True, False):
            whole = mech.run(module, inputs, masks, nw)
            for b in range(batch):
                mine = {k: v[b : b + 1] for k, v in whole.items()}
                what = f"sample {b} alone vs in the batch ({case}, need_weights={nw})"
                one_masks = {k: v[b : b + 1] for k, v in masks.items()}
                one = mech.run(module, _take(mech, inputs, b), one_masks, nw)
                _assert_outputs_close(one, mine, what, **INVARIANCE_TOL, equal_nan=True)
                if case == "ragged masks" and trimmed:
                    real = int(next(iter(masks.values()))[b].sum())
                    alone = mech.run(module, _take(mech, inputs, b, real), {}, nw)
                    _assert_outputs_close(alone, _cut(mech, mine, real), f"{what}, trimmed")


def check_key_padding_invariance(
    mech: Mechanism, *, n: int = 3, extra: int = 2, batch: int = 3, huge: float = 1e4
) -> None:
    """Appending ``extra`` masked positions to every masked sequence (filled with huge
    values, ``huge * N(0, 1)``) changes nothing at the real positions: the outputs, cut
    back to the ``n`` real positions along the sequence axes, equal those of the call on
    the ``n`` real positions without a mask (with and without the weights)."""
    torch.manual_seed(0)
    module = mech.build()
    seqs = mech.sequences()
    x = mech.draw(batch, dict.fromkeys(seqs, n))
    padded_lengths = {s: n + (extra if s in mech.masked else 0) for s in seqs}
    g = torch.Generator().manual_seed(1)
    xp = dict(x)
    for name, shape in mech.shapes.items():
        for i, s in enumerate(shape):
            if s in mech.masked:
                t = xp[name]
                size = list(t.shape)
                size[i + 1] = extra
                xp[name] = torch.cat([t, huge * torch.randn(*size, generator=g)], i + 1)
    if mech.fixed is not None:
        xp.update(mech.fixed(batch, padded_lengths))
    keep = torch.arange(n + extra)[None, :].expand(batch, -1) < n
    for nw in (True, False):
        want = mech.run(module, x, {}, nw)
        got = _cut(mech, mech.run(module, xp, {s: keep for s in mech.masked}, nw), n)
        _assert_outputs_close(got, want, f"{extra} masked positions appended (need_weights={nw})")


def check_key_permutation_equivariance(
    mech: Mechanism, *, n: int = 5, batch: int = 3, sequences: Sequence[str] | None = None
) -> None:
    """Permuting the positions of each sequence in ``sequences`` (default: all) -- the
    inputs along it jointly, keys with their values and masks -- permutes the outputs the
    same way along the axes that run along it and leaves everything else unchanged (with
    masks of different lengths per sample where the mechanism takes masks; with and
    without the weights)."""
    torch.manual_seed(0)
    module = mech.build()
    seqs = mech.sequences() if sequences is None else list(sequences)
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    g = torch.Generator().manual_seed(2)
    perms = {s: torch.randperm(n, generator=g) for s in seqs}
    xp = dict(x)
    for name, shape in mech.shapes.items():
        for i, s in enumerate(shape):
            if s in perms:
                xp[name] = xp[name].index_select(i + 1, perms[s])
    mp = {s: (m.index_select(1, perms[s]) if s in perms else m) for s, m in masks.items()}
    for nw in (True, False):
        want = mech.run(module, x, masks, nw)
        got = mech.run(module, xp, mp, nw)
        moved = {}
        for k, v in want.items():
            for axis, s in mech.axes.get(k, ()):
                if s in perms:
                    v = v.index_select(axis, perms[s])
            moved[k] = v
        _assert_outputs_close(got, moved, f"sequences {seqs} permuted (need_weights={nw})")


def _strided(t: Tensor) -> Tensor:
    """A non-contiguous copy of ``t`` (every other element of a buffer twice as long)."""
    out = torch.zeros(*t.shape, 2, dtype=t.dtype).select(-1, 0)
    out.copy_(t)
    if t.numel() > 1:
        assert not out.is_contiguous()
    return out


def _transposed(t: Tensor) -> Tensor:
    """A non-contiguous copy of ``t`` laid out batch-last (a transposed view)."""
    if t.dim() < 2:
        return t
    out = t.transpose(0, -1).contiguous().transpose(0, -1)
    if t.shape[0] > 1 and t.shape[-1] > 1:
        assert not out.is_contiguous()
    return out


def check_module_hygiene(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """What a user does with a module besides calling it: ``print`` it, ``copy.deepcopy`` and a
    ``pickle`` round trip give a module with the same outputs; its ``state_dict()``, saved
    with ``torch.save`` and loaded with ``torch.load(weights_only=True)`` into a module
    built with another seed (every floating parameter and buffer moved away from its
    initial value first), gives the same outputs; ``.double()`` gives float64 outputs that
    match float32 to ``1e-5``; non-contiguous inputs and masks (strided in the last axis,
    or laid out batch-last like a transposed view) give the outputs of contiguous ones.
    All in evaluation mode, with masks of different lengths where it takes masks, after a
    first call (so that any cache a call fills is copied, pickled and converted too)."""
    import io
    import pickle

    torch.manual_seed(0)
    module = mech.build()
    assert repr(module).startswith(type(module).__name__ + "(")  # print(model) works
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    want = mech.run(module, x, masks)
    exact = {"atol": 0.0, "rtol": 0.0}
    _assert_outputs_close(mech.run(copy.deepcopy(module), x, masks), want, "deepcopy", **exact)
    again = pickle.loads(pickle.dumps(module))
    _assert_outputs_close(mech.run(again, x, masks), want, "pickle round trip", **exact)
    torch.manual_seed(1)
    fresh = mech.build()
    with torch.no_grad():  # other values everywhere, so that the loaded state must matter
        for t in [*fresh.parameters(), *fresh.buffers()]:
            if t.is_floating_point():
                t.add_(torch.rand_like(t) + 0.5)
    buffer = io.BytesIO()  # through a file, as a user saves it (tensors only)
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, weights_only=True))
    _assert_outputs_close(mech.run(fresh, x, masks), want, "state_dict loaded", **exact)
    wide = copy.deepcopy(module).double()
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}
    got64 = mech.run(wide, x64, masks)
    for k, v in got64.items():
        if want[k].is_floating_point():
            assert v.dtype == torch.float64, f".double(): output {k} is {v.dtype}"
    _assert_outputs_close(
        {k: v.to(want[k].dtype) for k, v in got64.items()}, want, ".double() vs float32"
    )
    for layout in (_strided, _transposed):
        got = mech.run(
            module,
            {k: layout(v) for k, v in x.items()},
            {k: layout(v) for k, v in masks.items()},
        )
        what = f"non-contiguous inputs ({layout.__name__})"
        _assert_outputs_close(got, want, what, atol=1e-6, rtol=1e-6)


#: the stated tolerance of :func:`check_half_precision`, relative to the largest float32
#: output (at least 1): bfloat16 keeps 8 bits of mantissa, float16 11
HALF_TOL = {torch.bfloat16: 0.05, torch.float16: 0.01}


def check_half_precision(
    mech: Mechanism,
    dtype: torch.dtype,
    *,
    n: int = 5,
    batch: int = 3,
    float32_outputs: tuple[str, ...] = (),
) -> None:
    """The module converted with ``.to(dtype)`` (bfloat16 or float16) runs on inputs of
    that dtype (masks of different lengths where it takes masks): every floating output
    is in ``dtype`` (those named in ``float32_outputs`` in float32, by design), finite
    exactly where the float32 output is, and within :data:`HALF_TOL` of it (relative to
    the largest float32 output, at least 1). Evaluation mode, no gradients."""
    torch.manual_seed(0)
    module = mech.build()
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    want = mech.run(module, x, masks)
    half = {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}
    got = mech.run(module.to(dtype), half, masks)
    assert got.keys() == want.keys(), f"{dtype}: outputs {sorted(got)} != {sorted(want)}"
    for k, w in want.items():
        v = got[k]
        if not w.is_floating_point():
            torch.testing.assert_close(v, w, atol=0, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
            continue
        expected = torch.float32 if k in float32_outputs else dtype
        assert v.dtype == expected, f"{dtype}: output {k} is {v.dtype}, expected {expected}"
        finite = torch.isfinite(w)
        assert torch.equal(torch.isfinite(v), finite), f"{dtype}: {k} finite elsewhere"
        scale = max(1.0, w[finite].abs().max().item()) if finite.any() else 1.0
        err = (v.float()[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
        assert err <= HALF_TOL[dtype] * scale, f"{dtype}: {k} is {err:.3g} off (scale {scale:.3g})"


def check_empty_batch(mech: Mechanism, *, n: int = 5) -> None:
    """A batch of 0 samples (a data-parallel shard or a filtered batch can be empty) gives
    outputs with 0 samples, as ``torch.nn`` layers do, with and without the weights and
    masks, and a backward pass through them."""
    torch.manual_seed(0)
    module = mech.build()
    x = mech.draw(0, dict.fromkeys(mech.sequences(), n))
    x = {k: v.requires_grad_(True) if v.is_floating_point() else v for k, v in x.items()}
    for masks in ({}, {k: v[:0] for k, v in _ragged_masks(mech, 1, n).items()}):
        for nw in (True, False):
            out = mech.outputs(mech.call(module, x, masks, nw))
            for k, v in out.items():
                if v is not None:
                    assert v.shape[:1] == (0,), f"B=0: output {k} has shape {tuple(v.shape)}"
    loss = sum(v.float().sum() for v in out.values() if v is not None and v.requires_grad)
    if isinstance(loss, Tensor):
        loss.backward()


def check_inference_mode_then_training(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """A module first called under ``torch.inference_mode()`` (an evaluation before
    training) then trains: no tensor made in inference mode is kept and later saved for
    backward (PyTorch: "Inference tensors cannot be saved for backward"), and the outputs
    in training mode (the same random state) equal those of a module never called that way."""
    torch.manual_seed(0)
    module = mech.build()
    fresh = copy.deepcopy(module)
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    with _eval(module), torch.inference_mode():
        mech.outputs(mech.call(module, x, masks, True))
    outs = []
    for m in (module, fresh):
        m.train()
        torch.manual_seed(1)  # the same dropout masks (and random draws) in both calls
        xs = {
            k: v.clone().requires_grad_(True) if v.is_floating_point() else v for k, v in x.items()
        }
        out = mech.outputs(mech.call(m, xs, masks, True))
        loss = sum(v.float().sum() for v in out.values() if v is not None and v.requires_grad)
        if isinstance(loss, Tensor):
            loss.backward()
        outs.append({k: v.detach() for k, v in out.items() if v is not None})
    _assert_outputs_close(outs[0], outs[1], "after inference_mode vs never", atol=0, rtol=0)


def check_second_derivatives(mech: Mechanism, *, n: int = 3, batch: int = 2) -> None:
    """``torch.autograd.gradgradcheck`` (float64, the numerical Jacobian of the gradients)
    of the module's floating outputs with respect to its floating inputs passes: second
    derivatives (gradient penalties, Hessian-vector products) are exact. Evaluation mode,
    no masks; the caller picks the PyTorch SDPA backend (its CPU flash kernel has no
    double backward)."""
    torch.manual_seed(0)
    module = mech.build().double()
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    names = [k for k, v in x.items() if v.is_floating_point()]
    x = {k: v.double().requires_grad_(True) if k in names else v for k, v in x.items()}

    def outputs(*args: Tensor) -> tuple[Tensor, ...]:
        out = mech.outputs(
            mech.call(module, {**x, **dict(zip(names, args, strict=True))}, {}, False)
        )
        return tuple(v for v in out.values() if v is not None and v.requires_grad)

    with _eval(module):
        # fast mode: a random projection of the Jacobians (as exact a test, far fewer calls)
        assert torch.autograd.gradgradcheck(outputs, tuple(x[k] for k in names), fast_mode=True)


def check_backward_without_anomaly(
    mech: Mechanism, *, n: int = 5, batch: int = 3, empty_sample: bool = True
) -> None:
    """A training step's backward pass under ``torch.autograd.detect_anomaly()`` (a user
    hunting their own NaN) meets no NaN in any backward function, with masks of different
    lengths and (with ``empty_sample``) sample 1 fully masked, and the input gradients are
    finite: padding never makes an intermediate NaN that is only masked later."""
    torch.manual_seed(0)
    module = mech.build().train()
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    if empty_sample:
        for m in masks.values():
            m[1] = False
    x = {k: v.requires_grad_(True) if v.is_floating_point() else v for k, v in x.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Anomaly Detection has been enabled")
        anomaly = torch.autograd.detect_anomaly(check_nan=True)
    with anomaly:
        out = mech.outputs(mech.call(module, x, masks, True))
        loss = sum(v.float().sum() for v in out.values() if v is not None and v.requires_grad)
        assert isinstance(loss, Tensor), "no output depends on the inputs"
        loss.backward()
    for k, v in x.items():
        if v.grad is not None:
            assert torch.isfinite(v.grad).all(), f"the gradient of {k} is not finite"


def _training_step(
    called: nn.Module,
    step: Callable[[dict[str, Tensor], dict[str, Tensor]], dict[str, Tensor]],
    x: dict[str, Tensor],
    masks: dict[str, Tensor],
) -> tuple[dict[str, Tensor], dict[tuple[str, str], Tensor]]:
    """One call ``step(x, masks)`` (``called``, a :class:`_Called`, or a wrapper of it) on
    fresh leaf copies of the floating inputs with the global seed at 7, then the backward
    pass of a weighted sum of the outputs (weights from 0.5 to 1.5, so that weights summing
    to one still pass a gradient): the detached outputs, and the gradient of every
    parameter (``("param", name)``) and input (``("input", name)``) that gets one."""
    xs = {k: v.detach().clone().requires_grad_(v.is_floating_point()) for k, v in x.items()}
    called.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    out = step(xs, masks)
    loss = sum(
        ((v.float() * torch.linspace(0.5, 1.5, v.numel()).view_as(v)).sum() for v in out.values()),
        torch.zeros(()),
    )
    if loss.requires_grad:
        loss.backward()
    grads = {("param", k): p.grad for k, p in called.named_parameters() if p.grad is not None}
    grads.update({("input", k): v.grad for k, v in xs.items() if v.grad is not None})
    return {k: v.detach() for k, v in out.items()}, grads


def _assert_same_step(
    got: tuple[dict[str, Tensor], dict[tuple[str, str], Tensor]],
    want: tuple[dict[str, Tensor], dict[tuple[str, str], Tensor]],
    what: str,
) -> None:
    _assert_outputs_close(got[0], want[0], what)
    assert got[1].keys() == want[1].keys(), (
        f"{what}: gradients of {sorted(got[1])}, eager: {sorted(want[1])}"
    )
    for k, g in want[1].items():
        torch.testing.assert_close(
            got[1][k], g, **INVARIANCE_TOL, msg=lambda m, k=k: f"{what}, gradient of {k}: {m}"
        )


def check_activation_checkpointing(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """Activation checkpointing (``torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False)``, which frees the activations and runs the forward again in the
    backward pass) gives the outputs and gradients of the plain call, in training mode
    (dropout and sampling included: the checkpoint replays the random state) and in
    evaluation mode, with masks of different lengths. A forward with a side effect (a
    counter, a cache, state it updates) fails it."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    called = _Called(mech, mech.build())
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)

    def checkpointed(xs: dict[str, Tensor], ms: dict[str, Tensor]) -> dict[str, Tensor]:
        return checkpoint(called, xs, ms, use_reentrant=False)

    for training in (True, False):
        called.train(training)
        _assert_same_step(
            _training_step(called, checkpointed, x, masks),
            _training_step(called, called, x, masks),
            f"checkpointed ({'training' if training else 'evaluation'} mode)",
        )


def check_compiled_forward_and_backward(
    mech: Mechanism,
    *,
    n: int = 5,
    batch: int = 3,
    backend: str = "aot_eager",
    fullgraph: bool = True,
) -> None:
    """``torch.compile(fullgraph=fullgraph)`` with an AOTAutograd backend (``"aot_eager"``:
    the joint forward and backward graph, functionalised, run by eager kernels; the
    ``"inductor"`` default goes the same way and generates code) gives the eager outputs
    and the eager gradients of every parameter and input, in evaluation mode with masks of
    different lengths. (The tracing-only tests of ``tests/general/test_compile.py`` never
    trace a backward pass: a custom ``autograd.Function`` whose backward AOTAutograd cannot
    trace, or a mutation functionalisation gets wrong, shows here.)"""
    torch.manual_seed(0)
    called = _Called(mech, mech.build().eval())
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    want = _training_step(called, called, x, masks)
    torch._dynamo.reset()
    compiled = torch.compile(called, backend=backend, fullgraph=fullgraph)
    _assert_same_step(_training_step(called, compiled, x, masks), want, f"compiled ({backend})")


def check_export(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """``torch.export.export`` (non-strict, how a model is handed to a deployment
    runtime) traces a call with masks of different lengths, and the exported program gives
    the eager outputs: no data-dependent host read stands in the traced path (the value
    checks are skipped there, as under ``torch.compile``)."""
    torch.manual_seed(0)
    module = mech.build().eval()
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)

    class Call(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, x: dict[str, Tensor], masks: dict[str, Tensor]) -> Any:
            return mech.call(self.inner, x, masks, True)  # the module's own output type

    call = Call()
    program = torch.export.export(call, (x, masks), strict=False)
    with torch.no_grad():
        got, want = program.module()(x, masks), call(x, masks)
    assert type(got) is type(want), f"exported: {type(got).__name__}, eager: {type(want).__name__}"
    pick = mech.outputs
    _assert_outputs_close(
        {k: v for k, v in pick(got).items() if v is not None},
        {k: v for k, v in pick(want).items() if v is not None},
        "exported vs eager",
    )


def onnx_session(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], **options: Any
) -> Any:
    """``module`` exported with ``torch.onnx.export(module, args, kwargs=kwargs,
    dynamo=True, **options)`` (its progress lines and warnings silenced) as an
    ``onnxruntime.InferenceSession``. Needs ``onnxscript`` and ``onnxruntime``."""
    import logging

    import onnxruntime as ort

    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module, args, kwargs=kwargs, dynamo=True, verbose=False, **options
            )
    finally:
        quiet.setLevel(level)
    return ort.InferenceSession(program.model_proto.SerializeToString())


def check_onnx_export(
    mech: Mechanism, *, n: int = 5, batch: int = 3, dynamic_lengths: bool = True
) -> None:
    """``torch.onnx.export(..., dynamo=True)`` with dynamic shapes (``torch.export.Dim.AUTO``
    on every axis of every input: the batch and the sequences vary, the sizes the weights
    fix stay static), run in ONNX Runtime at the traced sizes and at others (a batch of 2,
    sequences of ``n - 2``), with masks of different lengths: the outputs equal the eager
    ones (fp32, ``atol = rtol = 1e-4``). A batch or sequence size the code specialised on
    would make the second run fail. With ``dynamic_lengths=False`` (a mechanism that loops
    over the positions of a sequence in Python, unrolled at the traced length) only the
    batch varies. Needs ``onnxscript`` and ``onnxruntime`` (the ``onnx`` extra); the
    caller skips without them."""
    from torch.export import Dim

    torch.manual_seed(0)
    module = _Called(mech, mech.build()).eval()

    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    # every axis may vary (AUTO keeps a size the code needs fixed, the features, static),
    # or only the batch
    dynamic = {
        group: {
            k: dict.fromkeys(range(v.dim() if dynamic_lengths else 1), Dim.AUTO)
            for k, v in inputs.items()
        }
        for group, inputs in (("x", x), ("masks", masks))
    }
    session = onnx_session(module, (x,), {"masks": masks}, dynamic_shapes=dynamic)
    for b, length, seed in ((batch, n, 0), (2, n - 2 if dynamic_lengths else n, 1)):
        x = mech.draw(b, dict.fromkeys(mech.sequences(), length), seed=seed)
        masks = _ragged_masks(mech, b, length)
        with torch.no_grad():
            want = module(x, masks)
        feeds = [*x.values(), *masks.values()]
        names = [i.name for i in session.get_inputs()]
        assert len(names) == len(feeds), f"the ONNX graph takes {names}"
        got = session.run(None, {k: v.numpy() for k, v in zip(names, feeds, strict=True)})
        assert len(got) == len(want), f"{len(got)} ONNX outputs for {sorted(want)}"
        _assert_outputs_close(
            {k: torch.from_numpy(v) for k, v in zip(want, got, strict=True)},
            want,
            f"ONNX Runtime vs eager at batch {b}, length {length}",
            atol=1e-4,
            rtol=1e-4,
        )


def check_meta_device_init(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """The meta-device pattern of large models: built under ``torch.device("meta")`` (no
    memory), moved with ``to_empty`` and initialised with ``reset_parameters()``, the
    module has exactly the parameters, buffers and outputs of one built directly under the
    same seed (every floating tensor compared bit for bit)."""
    from attnlab.registry import Configurable

    with torch.device("meta"):
        module = mech.build()
    assert isinstance(module, Configurable), f"{type(module).__name__} has no reset_parameters"
    assert all(t.is_meta for t in [*module.parameters(), *module.buffers()])
    module.to_empty(device="cpu")
    torch.manual_seed(5)
    module.reset_parameters()
    torch.manual_seed(5)
    direct = mech.build()
    got, want = module.state_dict(), direct.state_dict()
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert torch.equal(got[k], v), f"{k} differs from the directly built module's"
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    exact = {"atol": 0.0, "rtol": 0.0}
    _assert_outputs_close(mech.run(module, x, masks), mech.run(direct, x, masks), "meta", **exact)


class LoRALinear(nn.Module):
    """A low-rank adapter put in place of an ``nn.Linear`` as PEFT's LoRA layers are:
    ``forward(x) = base(x) + B A x`` while ``weight`` and ``bias`` still name the base
    layer's, so a module that reads ``weight`` instead of calling the layer silently drops
    the adapter. ``merged()`` is the ``nn.Linear`` of weight ``W + B A`` it equals."""

    def __init__(self, base: nn.Linear, rank: int = 2, seed: int = 1) -> None:
        super().__init__()
        self.base = base
        g = torch.Generator().manual_seed(seed)
        self.A = nn.Parameter(torch.randn(rank, base.in_features, generator=g) * 0.3)
        self.B = nn.Parameter(torch.randn(base.out_features, rank, generator=g) * 0.3)

    @property
    def weight(self) -> Tensor:
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (x @ self.A.T) @ self.B.T

    def merged(self) -> nn.Linear:
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight += self.B @ self.A
        return out


def _linears(module: nn.Module) -> list[str]:
    """The names of the ``nn.Linear`` / ``nn.Conv1d`` submodules of ``module``."""
    kinds = (nn.Linear, nn.Conv1d)
    return [name for name, m in module.named_modules() if type(m) in kinds]


def _swap(module: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, leaf, new)


def check_layer_replacements(mech: Mechanism, *, n: int = 5, batch: int = 3) -> int:
    """Every ``nn.Linear`` and ``nn.Conv1d`` inside the module is used as a layer, never
    only through its ``weight``, so the standard ways of changing a layer are honoured
    (returns how many layers were checked):

    1. **adapters**: each ``nn.Linear`` replaced by a :class:`LoRALinear` (whose ``weight``
       is still the base weight) gives the outputs of the module whose layers hold the
       merged weights ``W + B A`` (fp32, ``INVARIANCE_TOL``), masks of different lengths;
    2. **pruning** (``torch.nn.utils.prune``, a forward pre-hook that recomputes
       ``weight = weight_orig * mask`` at every call): with half of every layer's weights
       pruned, the outputs equal those of the module holding the masked weights; two
       training steps (backward where an output has a gradient, SGD, and ``weight_orig``
       moved) work, and after each the outputs equal those of a module holding the new
       ``weight_orig * mask`` (a module that read ``weight`` would compute with the weights
       of the pruning time, and its second backward would fail)."""
    from torch.nn.utils import prune

    torch.manual_seed(0)
    module = mech.build().eval()
    names = _linears(module)
    if not names:
        return 0
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)

    adapted, merged = copy.deepcopy(module), copy.deepcopy(module)
    for i, name in enumerate(names):
        layer = adapted.get_submodule(name)
        if type(layer) is nn.Linear:
            lora = LoRALinear(layer, seed=i + 1)
            _swap(adapted, name, lora)
            _swap(merged, name, lora.merged())
    _assert_outputs_close(
        mech.run(adapted, x, masks), mech.run(merged, x, masks), "LoRA adapters vs merged"
    )

    pruned = copy.deepcopy(module)
    for i, name in enumerate(names):
        torch.manual_seed(100 + i)
        prune.random_unstructured(pruned.get_submodule(name), "weight", amount=0.5)

    def masked() -> nn.Module:
        """A copy of ``pruned`` whose layers hold ``weight_orig * mask`` as plain weights."""
        ref = copy.deepcopy(pruned)
        for name in names:
            prune.remove(ref.get_submodule(name), "weight")
        return ref

    _assert_outputs_close(mech.run(pruned, x, masks), mech.run(masked(), x, masks), "pruned")
    for step in (1, 2):
        with _eval(pruned):
            out = mech.outputs(mech.call(pruned, x, masks, True))
            loss = sum(v.float().square().sum() for v in out.values() if v is not None)
            if isinstance(loss, Tensor) and loss.requires_grad:  # hard attention: none
                loss.backward()
        with torch.no_grad():
            for p in pruned.parameters():
                if p.grad is not None:
                    p -= 0.5 * p.grad
                    p.grad = None
            for name in names:
                pruned.get_submodule(name).weight_orig.add_(0.1)
        _assert_outputs_close(
            mech.run(pruned, x, masks), mech.run(masked(), x, masks), f"pruned, step {step}"
        )
    return len(names)


class _Called(nn.Module):
    """``mech.call`` of ``module`` as a module of its own (what ``torch.export`` and
    ``torch.func.functional_call`` take): ``forward(x, masks)`` returns the floating
    outputs, sorted by name."""

    def __init__(self, mech: Mechanism, module: nn.Module) -> None:
        super().__init__()
        self.mech, self.inner = mech, module

    def forward(self, x: dict[str, Tensor], masks: dict[str, Tensor]) -> dict[str, Tensor]:
        out = self.mech.outputs(self.mech.call(self.inner, x, masks, True))
        floating = [k for k in sorted(out) if out[k] is not None and out[k].is_floating_point()]
        return {k: out[k] for k in floating}


def check_torch_func(mech: Mechanism, *, n: int = 5, batch: int = 3) -> None:
    """The ``torch.func`` transforms a researcher applies to a module, with masks of
    different lengths, in evaluation mode:

    1. ``vmap`` over the samples of a one-sample call gives the batched call's outputs;
    2. per-sample gradients (``vmap(grad(loss))`` over ``functional_call``, as in DP-SGD
       or influence studies) give, for every parameter, the gradient of one backward pass
       per sample (mechanisms whose outputs depend on no parameter skip this part);
    3. forward mode: ``torch.func.jvp`` in float64 gives the central finite difference
       (``h = 1e-6``, ``atol = rtol = 1e-4``) along a random tangent of every floating
       input, and the dual numbers of ``torch.autograd.forward_ad`` give the same
       tangents. (Run it under PyTorch's math SDPA backend: its CPU flash kernel has no
       forward-mode formula, as it has no double backward.)
    4. ensembles: ``vmap`` over the stacked parameters of two modules built with other
       seeds (``torch.func.stack_module_state``) gives each module's own outputs.

    A mechanism that draws random numbers in evaluation mode (LSH attention's rotations
    without a ``seed``) draws them once per call, for the whole batch: ``vmap`` runs with
    ``randomness="same"`` and the global seed is reset before every call compared."""
    torch.manual_seed(0)
    module = mech.build().eval()
    called = _Called(mech, module)
    x = mech.draw(batch, dict.fromkeys(mech.sequences(), n))
    masks = _ragged_masks(mech, batch, n)
    state = {k: v.detach() for k, v in [*called.named_parameters(), *called.named_buffers()]}

    def one(params: dict[str, Tensor], xs: dict[str, Tensor], ms: dict[str, Tensor]) -> Any:
        xb = {k: v.unsqueeze(0) for k, v in xs.items()}
        mb = {k: v.unsqueeze(0) for k, v in ms.items()}
        return torch.func.functional_call(called, params, (xb, mb))

    with torch.no_grad():
        torch.manual_seed(2)
        want = called(x, masks)
        torch.manual_seed(2)
        got = torch.func.vmap(one, in_dims=(None, 0, 0), randomness="same")(state, x, masks)
    got = {k: v.squeeze(1) for k, v in got.items()}  # the one-sample batch axis
    _assert_outputs_close(got, want, "vmap over the samples")

    def loss(params: dict[str, Tensor], xs: dict[str, Tensor], ms: dict[str, Tensor]) -> Tensor:
        return sum((v.sum() for v in one(params, xs, ms).values()), torch.zeros(()))

    names = [k for k, v in called.named_parameters() if v.requires_grad]
    looped: list[dict[str, Tensor]] = []
    for b in range(batch):
        called.zero_grad(set_to_none=True)
        torch.manual_seed(2)
        lb = loss(dict(called.named_parameters()), {k: v[b] for k, v in x.items()},
                  {k: v[b] for k, v in masks.items()})  # fmt: skip
        if not lb.requires_grad:
            break
        lb.backward()
        looped.append({k: p.grad.clone() for k, p in called.named_parameters()
                       if p.grad is not None})  # fmt: skip
    if looped and looped[0]:
        frozen = {k: v for k, v in state.items() if k not in names}
        torch.manual_seed(2)
        grads = torch.func.vmap(
            lambda xs, ms: torch.func.grad(lambda p: loss({**frozen, **p}, xs, ms))(
                {k: state[k] for k in names}
            ),
            randomness="same",
        )(x, masks)
        for b, per in enumerate(looped):
            for k, g in per.items():
                torch.testing.assert_close(
                    grads[k][b], g, atol=1e-5, rtol=1e-4,
                    msg=lambda m, k=k, b=b: f"per-sample gradient of {k}, sample {b}: {m}",
                )  # fmt: skip

    if state:
        torch.manual_seed(1)
        other = _Called(mech, mech.build().eval())
        params, buffers = torch.func.stack_module_state([called, other])
        skeleton = copy.deepcopy(called).to("meta")
        with torch.no_grad():
            torch.manual_seed(2)
            both = torch.func.vmap(
                lambda p, b: torch.func.functional_call(skeleton, (p, b), (x, masks)),
                randomness="same",
            )(params, buffers)
            for i, member in enumerate((called, other)):
                torch.manual_seed(2)
                alone = member(x, masks)
                _assert_outputs_close({k: v[i] for k, v in both.items()}, alone, f"ensemble {i}")

    wide = copy.deepcopy(called).double()
    floats = [k for k, v in x.items() if v.is_floating_point()]
    x64 = {k: v.double() if v.is_floating_point() else v for k, v in x.items()}

    def f(*vals: Tensor) -> dict[str, Tensor]:
        torch.manual_seed(2)
        return wide({**x64, **dict(zip(floats, vals, strict=True))}, masks)

    primals = tuple(x64[k] for k in floats)
    g = torch.Generator().manual_seed(1)
    tangents = tuple(torch.randn(p.shape, generator=g, dtype=p.dtype) for p in primals)
    h = 1e-6
    with torch.no_grad():
        value, jv = torch.func.jvp(f, primals, tangents)
        plus = f(*(p + h * t for p, t in zip(primals, tangents, strict=True)))
        minus = f(*(p - h * t for p, t in zip(primals, tangents, strict=True)))
    # where an output is not finite (a log-probability of 0 is -inf) it has no derivative
    finite = {k: torch.isfinite(v) for k, v in value.items()}
    diff = {k: ((plus[k] - minus[k]) / (2 * h))[finite[k]] for k in plus}
    with torch.no_grad(), fwAD.dual_level():
        duals = [fwAD.make_dual(p, t) for p, t in zip(primals, tangents, strict=True)]
        dual = {k: fwAD.unpack_dual(v) for k, v in f(*duals).items()}
        # an output that does not depend on the inputs (hard weights) carries no tangent
        dual = {k: torch.zeros_like(p) if t is None else t for k, (p, t) in dual.items()}
    _assert_outputs_close(dual, jv, "forward_ad dual numbers vs torch.func.jvp")
    jv = {k: v[finite[k]] for k, v in jv.items()}
    _assert_outputs_close(jv, diff, "forward mode (jvp) vs finite difference", atol=1e-4, rtol=1e-4)


__all__ += [
    "HALF_TOL",
    "INVARIANCE_TOL",
    "Mechanism",
    "check_backward_without_anomaly",
    "check_batch_independence",
    "check_empty_batch",
    "check_export",
    "check_half_precision",
    "check_inference_mode_then_training",
    "check_key_padding_invariance",
    "check_key_permutation_equivariance",
    "check_meta_device_init",
    "check_module_hygiene",
    "check_second_derivatives",
    "check_torch_func",
]
