"""Compile the Triton kernels of ``attnlab.general.flash_additive`` for an H100 (sm_90)
on a machine without a GPU, and report what each launch would use.

    python benchmarks/sm90_kernels.py                 # every variant, a markdown table
    python benchmarks/sm90_kernels.py --quick         # one variant per code path
    python benchmarks/sm90_kernels.py --widths        # the widest sizes the kernels take
    python benchmarks/sm90_kernels.py --json out.json # also the figures as JSON

Triton's interpreter (``TRITON_INTERPRET=1``, what the suite runs without CUDA) checks
what the kernels compute, but not that they compile: it accepts tile shapes, dtypes and
inline PTX that the compiler would refuse. This script plans the launches a CUDA device
would get (``_plan(..., on_gpu=True)``: the GPU tiles, ``tanh.approx`` in half precision,
the tensor-core and TF32 modes), records the kernel calls of the forward pass, the
backward pass and the weights pass on small CPU tensors, and compiles each distinct call
ahead of time for ``GPUTarget("cuda", 90, 32)`` (Triton's LLVM back end and its bundled
``ptxas``; no driver). For each it reports the registers per thread and the spilled bytes
(``ptxas -v``) and the shared memory per block (Triton's allocation), and checks them
against the H100's limits: 255 registers per thread, 64 K registers per block, 227 KiB of
shared memory per block.

It must run without ``TRITON_INTERPRET`` (the kernels are then built for the compiler);
``tests/general/test_flash_sm90.py`` runs it in a subprocess with ``--quick --json``.
Without triton it prints why and exits 0; with a triton whose ahead-of-time API differs,
it says so and exits 3 (the test skips).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

#: H100 (sm_90) per-block limits.
MAX_REGS_PER_THREAD = 255
MAX_REGS_PER_BLOCK = 65536
MAX_SHARED_BYTES = 227 * 1024

_POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.bfloat16: "*bf16",
    torch.float16: "*fp16",
    torch.uint8: "*u8",
}


@dataclass(frozen=True)
class Case:
    """One planned launch set: the score, the dtype of the inputs, the activation, a mask,
    causal, TF32, and the sizes ``d_w``, ``d_v`` (they set the tiles)."""

    multi: bool
    dtype: str
    act: str
    mask: bool
    causal: bool
    tf32: bool
    d_w: int
    d_v: int
    fused: bool = False  # the fused backward (FlashOptions.fused_backward)

    def label(self) -> str:
        parts = [
            "multi" if self.multi else "additive",
            self.dtype,
            self.act,
            "mask" if self.mask else "",
            "causal" if self.causal else "",
            "tf32" if self.tf32 else "",
            f"d_w={self.d_w}",
            f"d_v={self.d_v}",
            "fused-bwd" if self.fused else "",
        ]
        return " ".join(p for p in parts if p)


#: The score/dtype modes: (multi, dtype, TF32): exact float32, TF32, bfloat16 (float16
#: compiles like bfloat16).
MODES = [
    (m, dt, tf)
    for m in (False, True)
    for dt, tf in (("float32", False), ("float32", True), ("bfloat16", False))
]


def width_cases() -> list[Case]:
    """The widest sizes the kernels take (``TRITON_MAX_WIDTH``) and the steps to them, in
    every mode: additive ``d_w = d_v`` from 128 to 1024 and the lopsided 1024 x 64,
    64 x 1024; multi-dimensional 32 and 128."""
    out = []
    for multi, dtype, tf32 in MODES:
        if multi:
            sizes = [(32, 32), (128, 128)]
        else:
            sizes = [(w, w) for w in (128, 256, 512, 1024)] + [(1024, 64), (64, 1024)]
        out += [Case(multi, dtype, "tanh", True, True, tf32, dw, dv) for dw, dv in sizes]
    return out


def cases(quick: bool) -> list[Case]:
    """``quick``: each score in every dtype (with the GPU's ``tanh.approx`` in half
    precision and TF32 in float32), masked and causal, one unmasked; sigmoid and relu; and
    the widest sizes in one mode each. Otherwise every activation x mask x causal in every
    dtype at d = 64, and :func:`width_cases`."""
    if quick:
        out = [
            Case(multi, dtype, "tanh", True, True, dtype == "float32", 64, 64)
            for multi in (False, True)
            for dtype in ("float32", "bfloat16", "float16")
        ]
        out += [
            Case(False, "bfloat16", "sigmoid", False, False, False, 64, 64),
            Case(True, "float32", "relu", False, False, False, 64, 64),
            Case(False, "bfloat16", "tanh", True, True, False, 1024, 1024),
            Case(True, "float32", "tanh", True, True, False, 128, 128),
        ]
        # the fused backward at d = 64 in float32 and bfloat16, each score
        out += [
            Case(multi, dtype, "tanh", True, True, False, 64, 64, fused=True)
            for multi in (False, True)
            for dtype in ("float32", "bfloat16")
        ]
        return out
    grid = itertools.product(
        (False, True),
        ("float32", "bfloat16", "float16"),
        ("tanh", "sigmoid", "relu", "identity"),
        (False, True),
        (False, True),
    )
    out = [Case(m, dt, a, mk, c, dt == "float32", 64, 64) for m, dt, a, mk, c in grid]
    fused = [
        Case(m, dt, "tanh", True, True, dt == "float32", 64, 64, fused=True) for m, dt, _ in MODES
    ]
    return out + fused + width_cases()


class _Recorder:
    """Stands in for the kernel module: ``K.attend_fwd[grid](*args, **kwargs)`` records
    the call instead of launching it."""

    def __init__(self, kernels: Any) -> None:
        self.INTERPRETED = False
        self.ACT_CODES = kernels.ACT_CODES
        self._kernels = kernels
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Any:
        recorder = self

        class _Launch:
            def __getitem__(self, grid: tuple) -> Any:
                def call(*args: Any, **kwargs: Any) -> None:
                    recorder.calls.append((name, args, kwargs))

                return call

        return _Launch()


def record(case: Case) -> list[tuple[str, tuple, dict]]:
    """The kernel calls of a forward, a backward and a weights pass planned for a GPU."""
    from attnlab import _flash_kernels
    from attnlab.general import flash_additive as FA

    rec = _Recorder(_flash_kernels)
    dtype = getattr(torch, case.dtype)
    B, n_q, n_k = 2, 48, 80
    g = torch.Generator().manual_seed(0)
    q1 = torch.randn(B, n_q, case.d_w, generator=g).to(dtype)
    k2 = torch.randn(B, n_k, case.d_w, generator=g).to(dtype)
    v = torch.randn(B, n_k, case.d_v, generator=g).to(dtype)
    w = torch.randn(case.d_w, case.d_v) if case.multi else torch.randn(case.d_w)
    mask = torch.rand(B, n_q, n_k, generator=g) > 0.2 if case.mask else None
    sizes = (case.d_w, case.d_v, n_k)
    plan = FA._plan(
        rec, case.multi, q1, mask, case.act, sizes, case.causal, None, case.tf32, None, None,
        on_gpu=True, fused_backward=case.fused,
    )  # fmt: skip
    out, lse = FA._forward(rec, q1, k2, w, v, plan)
    FA._backward(rec, q1, k2, w, v, out, lse, torch.randn_like(out), plan)
    FA._weights(rec, q1, k2, w, lse, dtype, plan)
    return rec.calls


def _signature(kernel: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, int]:
    """Triton types of the runtime arguments, the compile-time constants, num_warps."""
    kwargs = dict(kwargs)
    warps = kwargs.pop("num_warps", 4)
    names = kernel.arg_names
    sig: dict[str, str] = {}
    for name, value in zip(names, args, strict=False):
        if isinstance(value, torch.Tensor):
            sig[name] = _POINTER_TYPES[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        else:
            sig[name] = "i32" if -(2**31) <= int(value) < 2**31 else "i64"
    for name in names[len(args) :]:
        sig[name] = "constexpr"
    consts = {(names.index(k),): v for k, v in kwargs.items()}
    return sig, consts, warps


@dataclass
class Compiled:
    kernel: str
    case: str
    warps: int
    registers: int
    spill_bytes: int
    shared_bytes: int
    seconds: float
    problems: list[str]


def _ptxas_usage(ptx: str, ptxas: str) -> tuple[int, int]:
    """``(registers per thread, spill store + load bytes)`` from ``ptxas -v``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "k.ptx")
        src.write_text(ptx)
        res = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", str(src), "-o", str(Path(tmp, "k.cubin"))],
            capture_output=True,
            text=True,
            check=True,
        )
    text = res.stdout + res.stderr
    regs = max((int(r) for r in re.findall(r"Used (\d+) registers", text)), default=0)
    spills = sum(int(b) for b in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return regs, spills


#: Exit status when this triton's ahead-of-time API is not the one the script drives
#: (Triton 3.9: ``ASTSource(fn, signature, constexprs=...)``, ``get_ptxas(arch)``).
UNSUPPORTED = 3


def aot_ptxas() -> str | None:
    """The path of triton's ``ptxas`` if this triton compiles the way :func:`compile_all`
    asks it to (checked on a one-line kernel), else ``None``: an API that differs raises
    ``TypeError`` / ``AttributeError`` / ``ImportError`` here, before any real kernel."""
    try:
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.backends.nvidia.compiler import get_ptxas
        from triton.compiler import ASTSource

        @triton.jit
        def probe(X, N: tl.constexpr):
            tl.store(X + tl.arange(0, N), 1.0)

        src = ASTSource(probe, {"X": "*fp32", "N": "constexpr"}, constexprs={(1,): 16})
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
        return get_ptxas(90).path
    except (TypeError, AttributeError, ImportError):
        return None


def compile_all(selected: list[Case], ptxas: str) -> list[Compiled]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from attnlab import _flash_kernels as K

    if K.INTERPRETED:
        raise SystemExit("run without TRITON_INTERPRET: the kernels must be built for the compiler")
    target = GPUTarget("cuda", 90, 32)
    seen: set[str] = set()
    results = []
    for case in selected:
        for name, args, kwargs in record(case):
            kernel = getattr(K, name)
            sig, consts, warps = _signature(kernel, args, kwargs)
            key = json.dumps([name, sig, sorted((k[0], v) for k, v in consts.items()), warps])
            if key in seen:
                continue
            seen.add(key)
            start = time.perf_counter()
            src = ASTSource(kernel, sig, constexprs=consts)
            compiled = triton.compile(src, target=target, options={"num_warps": warps})
            seconds = time.perf_counter() - start
            regs, spills = _ptxas_usage(compiled.asm["ptx"], ptxas)
            shared = int(compiled.metadata.shared)
            problems = []
            if regs > MAX_REGS_PER_THREAD:
                problems.append(f"{regs} registers per thread > {MAX_REGS_PER_THREAD}")
            if regs * warps * 32 > MAX_REGS_PER_BLOCK:
                problems.append(f"{regs} x {warps * 32} threads > {MAX_REGS_PER_BLOCK} registers")
            if shared > MAX_SHARED_BYTES:
                problems.append(f"{shared} B shared memory > {MAX_SHARED_BYTES}")
            results.append(
                Compiled(name, case.label(), warps, regs, spills, shared, seconds, problems)
            )
            print(
                f"  {name:<15} {case.label():<48} {regs:>4} regs  {spills:>5} B spilled  "
                f"{shared / 1024:>6.1f} KiB shared  {seconds:5.1f} s",
                file=sys.stderr,
                flush=True,
            )
    return results


def table(results: list[Compiled]) -> str:
    lines = [
        "| kernel | case | warps | registers / thread | spilled bytes | shared memory |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| `{r.kernel}` | {r.case} | {r.warps} | {r.registers} | {r.spill_bytes} | "
            f"{r.shared_bytes / 1024:.1f} KiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one variant per code path")
    parser.add_argument("--widths", action="store_true", help="only the widest sizes")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        import triton
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except ImportError as exc:
        print(f"sm90_kernels: triton with its NVIDIA back end is not installed ({exc})")
        return 0
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("sm90_kernels: unset TRITON_INTERPRET (the kernels must be built for the compiler)")
        return 2
    ptxas = aot_ptxas()
    if ptxas is None:
        print(
            f"sm90_kernels: triton {triton.__version__} does not compile ahead of time the way "
            "this script asks (written for Triton 3.9)"
        )
        return UNSUPPORTED
    results = compile_all(width_cases() if args.widths else cases(args.quick), ptxas)
    print(table(results))
    bad = [f"{r.kernel} ({r.case}): {'; '.join(r.problems)}" for r in results if r.problems]
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    for line in bad:
        print(f"over an H100 limit: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
