"""Input validation shared by the functional layer and the modules.

Every check raises ``TypeError`` (dtype / type problems) or ``ValueError`` (shape, device
and value problems) with a message that names the argument, its shape and the shape that
was expected.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.nn.functional as F
from torch import Tensor, nn


class ConfigError(ValueError):
    """An impossible combination of components, raised at construction."""


def check_int(
    value: object,
    name: str,
    minimum: int = 1,
    *,
    error: type[Exception] = ConfigError,
    owner: str | None = None,
    wording: str | None = None,
) -> int:
    """``value`` as an int ``>= minimum``; otherwise ``error`` (a ``ConfigError`` unless
    told) with one line naming the argument (prefixed by ``owner`` where given), the bound
    and the value: ``"num_heads must be an int >= 1, got 0"``. ``bool`` is not an int here.

    ``wording`` replaces ``"an int >= MINIMUM"`` in the message where a module has always
    said it otherwise (``wording="a positive int"``: ``"d1 must be a positive int, got
    0"``); the check is the same. A ``torch.SymInt`` (a size read from a tensor's shape
    while ``torch.export`` traces dynamic shapes) is an int here, and so is a NumPy integer
    (a size read from an array), returned as a Python ``int``.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool | int):
        value = int(value)  # np.int64(8) -> 8, as check_seed takes it
    if isinstance(value, bool) or not isinstance(value, int | torch.SymInt) or value < minimum:
        prefix = f"{owner}: " if owner else ""
        what = f"an int >= {minimum}" if wording is None else wording
        raise error(f"{prefix}{name} must be {what}, got {value!r}")
    return value


def check_optional_int(value: object, name: str, minimum: int = 1, **options: Any) -> int | None:
    """``None`` (an optional size left out), or ``value`` checked by :func:`check_int` with
    the same arguments (``error``, ``owner``, ``wording``): ``d_v=None`` is fine,
    ``d_v=2.5`` is refused, not ignored. The message says so: ``"max_len must be an int
    >= 1 or None, got 0"`` (unless ``wording`` says it otherwise)."""
    if value is None:
        return None
    options.setdefault("wording", f"an int >= {minimum} or None")
    return check_int(value, name, minimum, **options)


def check_positive(value: object, name: str, *, error: type[Exception] = ConfigError) -> float:
    """``value`` as a float, when it is a finite real number ``> 0`` (a temperature, a
    concentration, a data range, a tolerance); otherwise ``error`` (a ``ConfigError``
    unless told) with one line: ``"tau must be a finite number > 0, got inf"``. NaN and
    infinity are refused (they passed the plain ``> 0`` tests this replaces), and so are
    bools and text."""
    if not finite_real(value) or not value > 0:  # type: ignore[operator]
        raise error(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def finite_real(value: object) -> bool:
    """A real number (not a bool, not text) that is a finite float: NaN, infinity and an
    int too large for a float (``math.isfinite`` raises ``OverflowError`` on it) are not."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def check_number(
    value: object,
    name: str,
    *,
    low: float | None = None,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    error: type[Exception] = ConfigError,
) -> float:
    """``value`` as a float, when it is a finite real number (not a bool, not text) in the
    range ``low .. high`` (a bound left out: unbounded; ``open_low`` / ``open_high``: the
    bound itself is excluded); otherwise ``error`` (a ``ConfigError`` unless told) with one
    line: ``"threshold must be a number in [0, 4), got nan"``, ``"scale must be a number
    >= 0, got -1.0"``, ``"snr_db must be a finite number, got inf"``. NaN and infinity
    never pass (they slip through plain ``<`` tests)."""
    fine = (
        finite_real(value)
        and (low is None or value > low or (value == low and not open_low))
        and (high is None or value < high or (value == high and not open_high))
    )
    if fine:
        return float(value)  # type: ignore[arg-type]
    if low is not None and high is not None:
        lo, hi = ("(" if open_low else "[") + f"{low:g}", f"{high:g}" + (")" if open_high else "]")
        wanted = f"a number in {lo}, {hi}"
    elif low is not None:
        wanted = f"a number {'>' if open_low else '>='} {low:g}"
    elif high is not None:
        wanted = f"a number {'<' if open_high else '<='} {high:g}"
    else:
        wanted = "a finite number"
    raise error(f"{name} must be {wanted}, got {value!r}")


def check_seed(
    seed: object,
    name: str = "seed",
    *,
    minimum: int | None = None,
    error: type[Exception] = TypeError,
) -> int:
    """``seed`` as an int (a Python or numpy integer, not a bool: ``1.5`` or ``True`` would
    quietly become seed 1), at least ``minimum`` where given (numpy's generators take no
    negative seed). Not an int: ``error`` (a ``TypeError`` unless told), ``"seed must be
    an int, got 'x'"``; below ``minimum``: a ``ValueError`` (``error`` where that is one,
    e.g. :class:`ConfigError`), ``"seed must be an int >= 0, got -1"``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise error(f"{name} must be an int, got {seed!r}")
    if minimum is not None and seed < minimum:
        below = error if issubclass(error, ValueError) else ValueError
        raise below(f"{name} must be an int >= {minimum}, got {seed!r}")
    return int(seed)


def check_device(value: object, name: str = "device") -> torch.device:
    """``value`` (a :class:`torch.device` or its name, ``"cpu"``, ``"cuda:1"``) as a
    :class:`torch.device`, whether or not this machine has one (what a plan is made for).
    A name torch does not know is a one-line ``ValueError`` (torch's own lists two dozen
    backends); anything else a ``TypeError``."""
    if isinstance(value, torch.device):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a torch.device or its name, got {type(value).__name__}")
    try:
        return torch.device(value)
    except RuntimeError:
        raise ValueError(
            f"{name} {value!r} is not a device name (try 'cpu', 'cuda' or 'cuda:0')"
        ) from None


def check_path(value: object, name: str = "path") -> Path:
    """``value`` (text or ``os.PathLike``) as a :class:`~pathlib.Path`, ``~`` expanded.
    Anything else is a ``TypeError`` (``"out_dir must be a path (a str or os.PathLike),
    got int"``); empty text a :class:`ConfigError` (``"out_dir must not be empty (it
    would be the working folder)"``): an unset shell variable gives it, and
    ``Path("")`` is the working folder."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a path (a str or os.PathLike), got {type(value).__name__}")
    if not str(value).strip():
        raise ConfigError(f"{name} must not be empty (it would be the working folder)")
    return Path(value).expanduser()


def check_dropout(p: object, name: str = "dropout") -> float:
    """``p`` as a float probability in ``[0, 1)`` (the dropout of every module and model);
    otherwise a ``ConfigError``: ``"dropout must be in [0, 1), got 1.0"``."""
    number = isinstance(p, numbers.Real) and not isinstance(p, bool)
    if not number or not 0.0 <= p < 1.0:  # type: ignore[operator]
        raise ConfigError(f"{name} must be in [0, 1), got {p!r}")
    return float(p)  # type: ignore[arg-type]


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    """``value`` when it is one of ``choices``, else a ``ConfigError`` that names them all:
    ``"affinity must be 'bilinear' or 'concat', got 'x'"``, ``"encoder must be one of
    'lstm', 'gru', 'cnn', got 'x'"``."""
    options = tuple(choices)
    if value not in options:
        names = [repr(c) for c in options]
        which = " or ".join(names) if len(names) == 2 else "one of " + ", ".join(names)
        raise ConfigError(f"{name} must be {which}, got {value!r}")
    return value


def check_flags(**flags: object) -> None:
    """Each keyword is a call's switch (``need_weights``, ``causal``, ...) and must be a
    bool: a truthy string such as ``"no"`` would otherwise switch it on."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")


def check_callable(value: object, name: str) -> None:
    """``value`` must be callable (a hook, a callback): ``"before_publish must be
    callable, got int"`` (a ``TypeError``) before any work, not when it is first called."""
    if not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")


def check_tensor(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} has dtype {x.dtype}, expected a floating-point dtype")
    return x


def check_rank(x: Tensor, name: str, ranks: tuple[int, ...], layout: str) -> None:
    if x.dim() not in ranks:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {layout}")


def batched_query(q: Tensor, name: str = "q") -> tuple[Tensor, bool]:
    """``q`` as ``[B, n_q, d_q]`` and whether it was a single query ``[B, d_q]``."""
    check_tensor(q, name)
    check_rank(q, name, (2, 3), "[B, n_q, d_q] or [B, d_q]")
    if q.dim() == 2:
        return q.unsqueeze(1), True
    return q, False


def check_keys(k: Tensor, batch: int, name: str = "k", dim: int | None = None) -> None:
    check_tensor(k, name)
    d = "d_k" if dim is None else str(dim)
    if k.dim() != 3 or k.shape[0] != batch or (dim is not None and k.shape[2] != dim):
        raise ValueError(
            f"{name} has shape {tuple(k.shape)}, expected [B, n_k, d_k] = [{batch}, n_k, {d}]"
        )


def check_same(ref: Tensor, ref_name: str, **others: Tensor | None) -> None:
    """dtype and device agreement of several tensors (the dtypes are not compared under
    :func:`torch.autocast`, where reduced-precision activations meet float32 ones by
    design)."""
    for name, t in others.items():
        if t is None:
            continue
        if t.dtype != ref.dtype and not torch.is_autocast_enabled(ref.device.type):
            raise TypeError(
                f"{name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}; "
                "cast them to one dtype"
            )
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device} but {ref_name} is on {ref.device}")


#: Under ``torch.compile`` the loops unrolled over a sequence (the recurrences, the CRF's
#: forward-backward, the teacher-forced decoders) run its length rounded up to a power of
#: two, at least this many steps (see :func:`compiled_steps`, :func:`rounds_unrolled_loops`).
MIN_COMPILED_STEPS = 8


def compiled_steps(n: int) -> int:
    """The steps a loop over a sequence padded to ``n`` positions runs under
    ``torch.compile``: ``n`` rounded up to a power of two, at least
    :data:`MIN_COMPILED_STEPS`.

    PyTorch's decompositions of ``torch.lstm`` / ``torch.gru`` unroll the time steps, as
    do the package's own loops over a sequence (``attnlab._recurrent.stepped_rnn``, the
    structured alignment's forward-backward, the decoders' teacher forcing), so a compiled
    graph holds a fixed number of steps and a batch of another padded length compiled a
    new graph: a task whose batches are padded to their longest sequence compiled once
    per length (about 30 graphs, 400 s of the first epoch on the 2-core CPU for the lab's
    toy BiLSTM), and Dynamo gives up compiling after 8
    (``torch._dynamo.config.recompile_limit``). Rounded, the lengths 8, 16, ..., 512 need
    7 graphs. The extra steps are padding that the real positions never see (a
    recurrence's reverse direction reads each row within its length, the CRF leaves
    masked keys out of its chain, a decoder's later words never reach its earlier ones),
    so the outputs are those of the unrounded run. Cost: up to twice the loop's steps on
    a batch just over a power of two. ``n`` may be a symbolic size: the comparisons guard
    on its range (``16 < n <= 32``), not on its value."""
    steps = MIN_COMPILED_STEPS
    while steps < n:
        steps *= 2
    return steps


def pad_to_compiled_steps(x: Tensor, dim: int, value: float = 0) -> Tensor:
    """``x`` padded with ``value`` along ``dim`` from ``n`` to :func:`compiled_steps`
    ``(n)`` positions where the call rounds its loops over a sequence
    (:func:`rounds_unrolled_loops`), else ``x`` itself: what a loop over that axis pads
    before it runs and cuts from its results after."""
    if not rounds_unrolled_loops():
        return x
    dim = dim % x.dim()
    n = x.shape[dim]
    return F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, compiled_steps(n) - n], value=value)


def rounds_unrolled_loops() -> bool:
    """Whether this call runs its loops over a sequence of ``n`` positions for
    :func:`compiled_steps` ``(n)`` steps: under ``torch.compile`` (Dynamo), not in eager
    mode nor under ``torch.export`` (whose graph keeps the traced sizes). The steps past
    ``n`` must not reach the first ``n`` positions' results (a recurrence's padding, a
    decoder's later words). Ask this rather than compare the rounded length with ``n``,
    which would guard on ``n``'s value."""
    return torch.compiler.is_dynamo_compiling() and not torch.compiler.is_exporting()


def is_traced() -> bool:
    """Whether this call is traced or transformed, so that it may not read tensor values
    on the host nor branch on them: ``torch.compile`` and ``torch.export`` (one graph, no
    synchronisation) and the ``torch.func`` transforms (``vmap``, ``grad``, ``jacrev``,
    ``jvp``, ...: under ``vmap`` a value read raises, and a hand-written
    ``autograd.Function`` has no rule for them). Every data-dependent shortcut of the
    package (a value check, a "nothing is masked" fast path, packing the real steps of a
    recurrence, a lean kernel) asks this first and takes the branch-free formula instead.
    Cost: two C calls (about 0.1 us)."""
    return torch.compiler.is_compiling() or is_transformed()


def is_transformed() -> bool:
    """Whether a ``torch.func`` transform (``vmap``, ``grad``, ``jacrev``, ``jvp``, ...)
    runs this call, or forward-mode AD is on (``torch.autograd.forward_ad.dual_level``):
    the part of :func:`is_traced` under which a hand-written ``autograd.Function`` or
    custom operator (the lean and Triton kernels) cannot run, so the callers take the
    formula those kernels compute."""
    return torch._C._are_functorch_transforms_active() or _forward_ad._current_level >= 0


def found_on_host(bad: Tensor) -> bool:
    """Whether a check of tensor values finds a bad entry in the bool tensor ``bad``.
    Reading the values needs the host, so where the call is traced or transformed
    (:func:`is_traced`: ``torch.compile``, ``torch.export``, ``torch.func``) the check is
    skipped and this returns False; run a call in eager mode for the one-line errors."""
    return not is_traced() and bool(bad.any())


def _first_float_parameter(module: nn.Module) -> Tensor | None:
    """``next(p for p in module.parameters() if p.is_floating_point())``, the same
    parameter in the same (pre-order) walk, without ``named_modules``' bookkeeping: this
    runs on every call of every module, and took 3-6 us the other way on the 2-core CPU."""
    for p in module._parameters.values():
        if p is not None and p.is_floating_point():
            return p
    for child in module._modules.values():
        if child is not None:
            found = _first_float_parameter(child)
            if found is not None:
                return found
    return None


def check_module_dtype(module: nn.Module, x: Tensor, name: str = "query") -> None:
    """Check that the input ``x`` (called ``name`` in the caller's signature) has the dtype
    and device of ``module``'s floating-point parameters.

    Without it, a float64 input to a float32 module fails deep inside PyTorch with
    ``mat1 and mat2 must have the same dtype``; this raises one line that names the
    argument, both dtypes and the two fixes. A module without floating-point parameters
    accepts any dtype, and under :func:`torch.autocast` mixed dtypes are expected, so the
    dtype is not checked there. Under ``torch.compile`` nothing is checked: the walk over the
    parameters would be traced into the graph, and dynamo refuses to trace an ``nn.GRU`` /
    ``nn.LSTM`` submodule; check the call in eager mode first.
    """
    if torch.compiler.is_compiling():
        return
    param = _first_float_parameter(module)
    if param is None:
        return
    owner = type(module).__name__
    if param.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the parameters of {owner} have dtype "
            f"{param.dtype}; cast the input ({name}.to({param.dtype})) or convert the module "
            f"(module.to({x.dtype}))"
        )
    if param.device != x.device:
        raise ValueError(
            f"{name} is on {x.device} but the parameters of {owner} are on {param.device}; "
            f"move the input ({name}.to({str(param.device)!r})) or the module "
            f"(module.to({str(x.device)!r}))"
        )


def check_param(x: Tensor, name: str, shape: tuple[int | None, ...], layout: str) -> None:
    check_tensor(x, name)
    ok = x.dim() == len(shape) and all(
        s is None or s == g for s, g in zip(shape, x.shape, strict=True)
    )
    if not ok:
        want = ", ".join("*" if s is None else str(s) for s in shape)
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {layout} = [{want}]")


def check_values(v: Tensor, batch: int, n_k: int, name: str = "v") -> None:
    check_tensor(v, name)
    if v.dim() != 3 or v.shape[0] != batch or v.shape[1] != n_k:
        raise ValueError(
            f"{name} has shape {tuple(v.shape)}, expected [B, n_k, d_v] = [{batch}, {n_k}, d_v]"
        )


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision softmaxes run in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def broadcasts_to(
    shape: tuple[int, ...] | torch.Size, target: tuple[int, ...] | torch.Size
) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` (pure Python: cheaper than
    ``torch.broadcast_shapes``, which is slow on its first call)."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target), strict=False))


def broadcasts_together(a: tuple[int, ...] | torch.Size, b: tuple[int, ...] | torch.Size) -> bool:
    """Whether tensors of shapes ``a`` and ``b`` broadcast with each other (pure Python,
    as :func:`broadcasts_to`)."""
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b), strict=False))
