"""GPU benchmarks of the Triton kernels of additive and multi-dimensional attention
(``attnlab.general.flash_additive``), standalone.

    python benchmarks/gpu_kernels.py                  # every case, on the CUDA device
    python benchmarks/gpu_kernels.py --only additive-1024 --no-compile
    python benchmarks/gpu_kernels.py --json out.json  # also save the raw figures
    python benchmarks/gpu_kernels.py --dtype bf16     # time in bfloat16 (issue 13's target)
    python benchmarks/gpu_kernels.py --tiles multi:16x4,additive:64x64
                                                      # also the kernels at other tiles
    TRITON_INTERPRET=1 python benchmarks/gpu_kernels.py --tiny --device cpu
                                                      # toy sizes on the interpreter:
                                                      # checks the code, measures nothing

Without a CUDA device (or without triton) it prints why and exits 0.

Cases (forward + backward, tanh, self-attention shapes ``n_q = n_k = n``,
``d = d_w = d_v = 64``; inputs and parameters in ``--dtype``, float32 by default, or
bfloat16 / float16):

* ``additive-1024``, ``additive-4096``, ``additive-32768``: additive attention, B=8;
* ``multidim-512``: multi-dimensional (DiSAN) attention, B=8.

Sides: ``triton`` (``attnlab.Attention``, which takes the ``triton`` path on CUDA),
``triton-fused`` (the kernels with ``fused_backward=True``: one backward launch, ``dq1``
by atomics), ``triton-half`` (the kernels in their half-precision mode: ``W1 q + b``,
``W2 k`` and the score weights rounded to the inputs' dtype, so on a GPU ``p @ v`` runs on
tensor cores and tanh is one ``tanh.approx.f32``; ``attnlab.Attention`` hands the kernels
float32 parts for half inputs, so this side differs from ``triton`` only under ``--dtype
bf16`` / ``fp16``), ``chunked`` (the chunked ``attnlab.general.fused`` kernels that were the CUDA path
before), ``broadcast`` (the textbook formula in eager PyTorch) and ``compiled``
(``torch.compile`` of the same formula). A side whose estimated memory exceeds the free
device memory is skipped with the estimate (the broadcast form holds several
``[B, n, n, d_w]`` tensors: 34 GB each at n=4096). Before timing, every side that runs is
checked against ``broadcast`` on a small version of the case (B=2, n<=256), in float32
whatever ``--dtype`` is (the check is of the code; half precision only changes the
rounding).

Columns: the median time of a forward + backward step and of a forward step, the peak
CUDA memory of a step above the inputs (``torch.cuda.max_memory_allocated``), and the
fraction of the **tanh limit**: an H100 SXM evaluates about ``TANH_PER_S = 4e12`` tanh per
second (132 SMs x 16 special-function operations per clock x ~1.9 GHz, one
``tanh.approx.f32`` each), and the score needs ``B n_q n_k d_w`` of them per forward pass;
a training step is counted as forward + one recompute in the backward pass,
``2 B n_q n_k d_w``. The figure says how close a side gets to that bound (the kernels
evaluate tanh 5 times per training step for additive attention -- see docs/kernels.md --
and the default accurate float32 tanh costs about two special-function operations, so
the kernels themselves cannot reach 1.0 in float32).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from _harness import error_line
from torch import Tensor

TANH_PER_S = 4.0e12
F32 = 4


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "additive" or "multi"
    B: int
    n: int
    d: int = 64  # input size = d_w = d_v


CASES = {
    "additive-1024": Case("additive-1024", "additive", 8, 1024),
    "additive-4096": Case("additive-4096", "additive", 8, 4096),
    "additive-32768": Case("additive-32768", "additive", 8, 32768),
    "multidim-512": Case("multidim-512", "multi", 8, 512),
}
TINY = {
    "additive-1024": Case("additive-1024", "additive", 2, 20, 8),
    "multidim-512": Case("multidim-512", "multi", 2, 18, 8),
}
SIDES = ("triton", "triton-fused", "triton-half", "chunked", "broadcast", "compiled")
#: the chunked kernels grow as n^2 in time: 1.15 s per step at n = 4096 on an H200
#: (float32), so about 74 s at n = 32768 -- longer than a lease's benchmark step
CHUNKED_MAX_N = 4096


@dataclass
class Result:
    case: str
    side: str
    config: str
    step_ms: float | None = None
    fwd_ms: float | None = None
    peak_mib: float | None = None
    tanh_fraction: float | None = None
    max_rel_diff: float | None = None
    note: str = ""
    details: dict = field(default_factory=dict)


# ----------------------------------------------------------------------- the sides


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(
    case: Case,
    device: str,
    B: int | None = None,
    n: int | None = None,
    dtype: torch.dtype = torch.float32,
):
    import attnlab

    B = case.B if B is None else B
    n = case.n if n is None else n
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, n, case.d, generator=g).to(device, dtype) for _ in range(3))
    torch.manual_seed(0)
    dim = "multi" if case.kind == "multi" else "single"
    attn = attnlab.Attention("additive", "soft", dim, d_q=case.d, d_k=case.d, d_w=case.d)
    with torch.no_grad():  # non-zero biases, so that every term is exercised
        attn.score.b.normal_(0.0, 0.1)
        if attn.score.b_d is not None:
            attn.score.b_d.normal_(0.0, 0.1)
    attn = attn.to(device, dtype)
    return q, k, v, attn


def _broadcast(kind: str) -> Callable[..., Tensor]:
    """The textbook formula: ``[B, n, n, d_w]`` hidden activations."""

    def additive(q, k, v, W1, W2, b, w, b_d):
        e = torch.tanh(F.linear(q, W1, b)[:, :, None] + F.linear(k, W2)[:, None]) @ w
        return torch.softmax(e, dim=-1) @ v

    def multi(q, k, v, W1, W2, b, W_d, b_d):
        e = torch.tanh(F.linear(q, W1, b)[:, :, None] + F.linear(k, W2)[:, None]) @ W_d + b_d
        return (torch.softmax(e, dim=2) * v[:, None]).sum(2)

    return additive if kind == "additive" else multi


def _chunked(kind: str) -> Callable[..., Tensor]:
    """The chunked kernels of ``attnlab.general.fused`` (the CUDA path before the Triton
    kernels): additive scores ``[B, n, n]`` in memory, multi-dimensional fused."""
    from attnlab.general.fused import additive_score_lean, multi_dim_attend_lean

    def additive(q, k, v, W1, W2, b, w, b_d):
        e = additive_score_lean(F.linear(q, W1, b), F.linear(k, W2), w, "tanh")
        return torch.softmax(e, dim=-1) @ v

    def multi(q, k, v, W1, W2, b, W_d, b_d):
        return multi_dim_attend_lean(F.linear(q, W1, b), F.linear(k, W2), W_d, b_d, v)

    return additive if kind == "additive" else multi


def _tile_side(side: str) -> tuple[int, int] | None:
    """``(BLOCK_M, BLOCK_N)`` of a side ``triton@BMxBN`` (the kernels at other tiles than
    the defaults), else ``None``."""
    if not side.startswith("triton@"):
        return None
    bm, bn = side.removeprefix("triton@").split("x")
    return int(bm), int(bn)


def _direct(case: Case, q, k, v, attn, half: bool = False, **options: Any) -> Callable[[], Tensor]:
    """The Triton kernels called directly with ``options`` (``block_m`` / ``block_n``,
    ``fused_backward``): the same arithmetic as the ``triton`` path of
    ``attnlab.Attention``; with ``half``, the parts rounded to the inputs' dtype instead
    (the kernels' half-precision mode for half inputs)."""
    from attnlab.general.flash_additive import flash_additive_attention, flash_multi_dim_attention

    s = attn.score

    def run() -> Tensor:
        # as the path does: the kernels take float32 parts for half inputs (lean_parts),
        # so the values follow them and the context goes back to the inputs' dtype
        parts = (*s.lean_parts(q, k), *s.work_params())
        if half:
            parts = tuple(None if x is None else x.to(v.dtype) for x in parts)
        q1, k2, w, b_d = parts
        vals = v.to(q1.dtype)
        if case.kind == "multi":
            out = flash_multi_dim_attention(q1, k2, w, b_d, vals, **options)[0]
        else:
            out = flash_additive_attention(q1, k2, w, vals, **options)[0]
        return out.to(v.dtype)

    return run


def _side_fn(side: str, case: Case, q, k, v, attn) -> Callable[[], Tensor]:
    s = attn.score
    params = (s.W1.weight, s.W2.weight, s.b, s.w, s.b_d)
    tiles = _tile_side(side)
    if tiles is not None:
        return _direct(case, q, k, v, attn, block_m=tiles[0], block_n=tiles[1])
    if side == "triton-fused":
        return _direct(case, q, k, v, attn, fused_backward=True)
    if side == "triton-half":
        return _direct(case, q, k, v, attn, half=True)
    if side == "triton":
        if q.device.type == "cuda":  # the automatic choice on CUDA
            want = attn.explain(device=q.device)[0]
            if want != "triton":
                raise RuntimeError(f"attnlab.Attention takes path {want!r} here, not 'triton'")
            return lambda: attn(q, k, v).context
        # the CPU (interpreter) only runs the kernels when asked: same score module
        import attnlab

        forced = attnlab.Attention(attn.score, "soft", attn_dim(attn), path="triton")
        return lambda: forced(q, k, v).context
    if side == "chunked":
        fn = _chunked(case.kind)
    elif side == "broadcast":
        fn = _broadcast(case.kind)
    else:
        fn = torch.compile(_broadcast(case.kind), dynamic=False)
    return lambda: fn(q, k, v, *params)


def attn_dim(attn) -> str:
    return "multi" if attn.multi else "single"


def _estimate_bytes(side: str, case: Case, B: int, n: int, size: int = F32) -> int:
    """A rough lower bound of a side's peak memory (what autograd keeps); ``size``: bytes
    per element of the inputs' dtype (the chunked kernels compute in float32)."""
    pairs = B * n * n
    if side.startswith("triton"):
        return 0
    if side == "chunked":
        return 3 * pairs * F32 if case.kind == "additive" else 0
    hidden = pairs * case.d * size  # one [B, n, n, d_w] (or [B, n, n, d_v]) tensor
    return (4 if side == "broadcast" else 1) * hidden


# ------------------------------------------------------------------- measurement


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


#: the time one side's repeats may take: slow steps (seconds each at n = 32768) get fewer
#: repeats, never fewer than MIN_REPEATS, so that a lease's step measures every side
BUDGET_MS = 8000.0
MIN_REPEATS = 3


def _timed(f: Callable[[], object], device: str, repeats: int, warmup: int) -> list[float]:
    """Times of ``repeats`` calls after ``warmup`` (at most :data:`BUDGET_MS` in all,
    judged from the last warm-up call; at least :data:`MIN_REPEATS`)."""
    last = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        f()
        _sync(device)
        last = (time.perf_counter() - t0) * 1e3
    if last > 0:
        repeats = max(min(repeats, MIN_REPEATS), min(repeats, int(BUDGET_MS / last)))
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            f()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _step_fn(fn: Callable[[], Tensor], leaves: list[Tensor], grad: Tensor) -> Callable[[], None]:
    def step() -> None:
        for x in leaves:
            x.grad = None
        fn().backward(grad)

    return step


def _peak_mib(step: Callable[[], None], device: str) -> float | None:
    if device != "cuda":
        return None
    _sync(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    _sync(device)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _leaves(q, k, v, attn) -> list[Tensor]:
    return [q, k, v, *attn.parameters()]


def _agreement(side: str, case: Case, device: str, small_n: int) -> float:
    """Max |side - broadcast| / max |broadcast| over the output and every gradient, on a
    small version of the case. ``b_d``'s gradient is zero in exact arithmetic (it cancels
    in the softmax): the kernels return exactly 0, the broadcast form rounding noise, so it
    is left out."""
    q, k, v, attn = _inputs(case, device, B=2, n=small_n, dtype=torch.float32)
    names = ["q", "k", "v", *(n for n, _ in attn.named_parameters())]
    leaves = _leaves(q, k, v, attn)
    for x in leaves:
        x.requires_grad_(True)
    grad = torch.randn(2, small_n, case.d, generator=torch.Generator().manual_seed(1)).to(device)
    results = []
    for name in (side, "broadcast"):
        out = _side_fn(name, case, q, k, v, attn)()
        results.append([out, *torch.autograd.grad(out, leaves, grad)])
    worst = 0.0
    for name, a, b in zip(["out", *names], *results, strict=True):
        if name.endswith("b_d"):
            continue
        scale = float(b.detach().abs().max()) or 1.0
        worst = max(worst, float((a - b).detach().abs().max()) / scale)
    return worst


def run_case(
    case: Case,
    side: str,
    device: str,
    repeats: int,
    warmup: int,
    small_n: int,
    dtype: torch.dtype = torch.float32,
) -> Result:
    name = next(k for k, v in DTYPES.items() if v == dtype)
    config = f"B={case.B} n={case.n} d=d_w=d_v={case.d}" + ("" if name == "fp32" else f" {name}")
    r = Result(case.name, side, config)
    if side == "chunked" and case.n > CHUNKED_MAX_N:
        r.note = f"skipped: the chunked kernels take minutes per step past n={CHUNKED_MAX_N}"
        return r
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        need = _estimate_bytes(side, case, case.B, case.n, dtype.itemsize)
        if need > 0.9 * free:
            r.note = f"skipped: needs >= {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
            return r
    try:
        if side == "broadcast":
            r.note = "the reference of the agreement checks"
        else:
            r.max_rel_diff = _agreement(side, case, device, small_n)
        q, k, v, attn = _inputs(case, device, dtype=dtype)
        leaves = _leaves(q, k, v, attn)
        for x in leaves:
            x.requires_grad_(True)
        fn = _side_fn(side, case, q, k, v, attn)
        grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        step = _step_fn(fn, leaves, grad)
        step_times = _timed(step, device, repeats, warmup)
        with torch.no_grad():
            fwd_times = _timed(fn, device, repeats, warmup)
        r.peak_mib = _peak_mib(step, device)
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        r.note = f"out of memory: {str(err).splitlines()[0][:80]}"
        return r
    except Exception as err:  # one side failing must not cost the other rows of a lease
        traceback.print_exc()
        r.note = f"error: {error_line(err)}"
        return r
    r.step_ms = statistics.median(step_times)
    r.fwd_ms = statistics.median(fwd_times)
    tanh = case.B * case.n * case.n * case.d
    r.tanh_fraction = 2 * tanh / (r.step_ms * 1e-3) / TANH_PER_S
    r.details = {
        "step_ms": step_times,
        "fwd_ms": fwd_times,
        "fwd_tanh_fraction": tanh / (r.fwd_ms * 1e-3) / TANH_PER_S,
    }
    return r


# --------------------------------------------------------------------------- output


def _f(x: float | None, fmt: str) -> str:
    return "" if x is None or not math.isfinite(x) else format(x, fmt)


TABLE_HEAD = (
    "| case | side | config | fwd+bwd ms | fwd ms | peak MiB | tanh limit (fwd+bwd) "
    "| fwd tanh limit | max rel diff | note |\n|" + " --- |" * 10
)


def format_row(r: Result) -> str:
    fwd_frac = r.details.get("fwd_tanh_fraction")
    return (
        f"| {r.case} | {r.side} | {r.config} | {_f(r.step_ms, '.2f')} | "
        f"{_f(r.fwd_ms, '.2f')} | {_f(r.peak_mib, '.1f')} | {_f(r.tanh_fraction, '.3f')} | "
        f"{_f(fwd_frac, '.3f')} | {_f(r.max_rel_diff, '.1e')} | {r.note} |"
    )


def format_table(results: list[Result]) -> str:
    return "\n".join([TABLE_HEAD, *(format_row(r) for r in results)])


def _device_line(device: str) -> str:
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}"
    return f"CPU (Triton interpreter), torch {torch.__version__}"


def _parse_tiles(ap: argparse.ArgumentParser, spec: str) -> list[tuple[str, str]]:
    """``[(kind, "BMxBN"), ...]`` from ``--tiles``; a malformed entry is a usage error."""
    out = []
    for item in (x for x in spec.split(",") if x):
        kind, _, tile = item.partition(":")
        bm, _, bn = tile.partition("x")
        if kind not in ("additive", "multi") or not (bm.isdigit() and bn.isdigit()):
            ap.error(f"--tiles entry {item!r}: expected KIND:BMxBN with KIND additive or multi")
        out.append((kind, f"{int(bm)}x{int(bn)}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], help=f"cases: {sorted(CASES)}")
    ap.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile side")
    ap.add_argument("--tiny", action="store_true", help="toy sizes: checks the code only")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument(
        "--dtype", default="fp32", choices=sorted(DTYPES), help="of the timed inputs and weights"
    )
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    ap.add_argument(
        "--tiles",
        default="",
        help="extra Triton sides at other tiles, timed after the others: comma-separated "
        "KIND:BMxBN, e.g. multi:16x4,additive:64x64 (side triton@BMxBN on KIND's cases)",
    )
    args = ap.parse_args(argv)

    from attnlab.general.flash_additive import TRITON_INSTALL, triton_available

    if not triton_available():
        print(f"triton is not installed ({TRITON_INSTALL}): nothing measured")
        return 0
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: the GPU kernel benchmarks need one (nothing measured)")
        return 0
    if device == "cpu":
        if not args.tiny:
            ap.error("--device cpu runs Triton's interpreter: only with --tiny")
        os.environ.setdefault("TRITON_INTERPRET", "1")
    table = TINY if args.tiny else CASES
    names = [n for spec in args.only for n in spec.split(",")] or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown case {unknown}; choose from {sorted(table)}")
    sides = [s for s in args.sides.split(",") if s]
    if args.no_compile or (args.tiny and device == "cpu"):  # inductor's CPU build is slow
        sides = [s for s in sides if s != "compiled"]
    bad = [s for s in sides if s not in SIDES]
    if bad:
        ap.error(f"unknown side {bad}; choose from {list(SIDES)}")
    extra = _parse_tiles(ap, args.tiles)
    repeats = args.repeats or (1 if args.tiny else 10)
    warmup = 0 if args.tiny else 2
    small_n = 17 if args.tiny else 256

    # side by side over the cases, the compiled side (minutes of compiling) after the others
    runs = [(name, side) for side in sides for name in names]
    runs += [(n, f"triton@{t}") for kind, t in extra for n in names if table[n].kind == kind]
    # each row is printed (and the JSON rewritten) as soon as it is measured: a run cut by
    # a time limit keeps what it measured
    print(f"device: {_device_line(device)}; {args.dtype}; tanh limit {TANH_PER_S:.0e}/s")
    print(TABLE_HEAD, flush=True)
    results = []
    for name, side in runs:
        print(f"[{name}] {side} ...", file=sys.stderr, flush=True)
        results.append(
            run_case(table[name], side, device, repeats, warmup, small_n, DTYPES[args.dtype])
        )
        print(format_row(results[-1]), flush=True)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(
                    {
                        "device": _device_line(device),
                        "dtype": args.dtype,
                        "results": [asdict(r) for r in results],
                    },
                    fh,
                    indent=1,
                )
    worst = max((r.max_rel_diff or 0.0) for r in results)
    if worst > 1e-3:
        print(f"agreement check failed: max rel diff {worst:.1e} > 1e-3", file=sys.stderr)
        return 1
    failed = [f"{r.case} {r.side}" for r in results if r.note.startswith("error:")]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
