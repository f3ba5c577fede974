"""The local-attention Triton kernels (``local-triton``) against the gathered window
(``local-window``) on a GPU, forward and forward + backward, at the tiles the default was
chosen over, and with the deterministic key-side backward (no atomics).

    python benchmarks/local_kernels.py                  # B=4, n=16384, D=8, d=64; bf16, fp32
    python benchmarks/local_kernels.py --tiny           # toy sizes (a smoke test)
    python benchmarks/local_kernels.py --slots 256,512,1024 --warps 4,8

Both sides take the same queries (already in the score's dot form), keys, values and
window centres (random in ``[0, n - 1]``, with gradients: local-p's predicted centres), the
Gaussian factor on. Each row: the median of ``--repeats`` CUDA-synchronised calls after
one warm-up (which compiles the kernels), peak memory above the inputs, and the largest
difference of the context from the gathered window's. Without a CUDA device it prints
that it needs one and exits 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import cuda_bench
import torch
from torch import Tensor

from attnlab.general import local_triton
from attnlab.general.local import local_window_attend, window_dot_score


def _timed(fn: Callable[[], object], repeats: int) -> float:
    """The median ms of ``repeats`` calls after one warm-up call (which compiles)."""
    return cuda_bench._time(fn, "cuda", repeats, warmup=1)[0]  # type: ignore[arg-type]


def _sides(
    q: Tensor, k: Tensor, v: Tensor, c: Tensor, D: int, slots: list[int], warps: list[int]
) -> dict[str, Callable[[], Tensor]]:
    scale = q.shape[-1] ** -0.5
    sides: dict[str, Callable[[], Tensor]] = {
        "gathered window": lambda: local_window_attend(
            lambda a, b: window_dot_score(a, b, scale), q, k, v, c, D
        )[0]
    }
    default = local_triton._launch(D, scale, True, q.shape[-1], v.shape[-1], True)
    sides[
        f"triton default: {default.block_m}x{default.w_pad} slots, "
        f"{default.num_warps} / {default.bwd_warps} warps (fwd / bwd)"
    ] = lambda: local_triton.local_triton_attend(q, k, v, c, D, scale, deterministic=False)
    sides["triton default, deterministic (key-side backward, no atomics)"] = lambda: (
        local_triton.local_triton_attend(q, k, v, c, D, scale, deterministic=True)
    )
    for s in slots:
        for w in warps:
            block_m = max(1, s // default.w_pad)

            def run(block_m: int = block_m, w: int = w) -> Tensor:
                real = local_triton._launch
                local_triton._launch = lambda *a: _with(real(*a), block_m, w)  # type: ignore[assignment]
                try:
                    return local_triton.local_triton_attend(
                        q, k, v, c, D, scale, deterministic=False
                    )
                finally:
                    local_triton._launch = real  # type: ignore[assignment]

            sides[f"triton {block_m}x{default.w_pad} slots, {w} warps"] = run
    return sides


def _with(plan: local_triton._Launch, block_m: int, warps: int) -> local_triton._Launch:
    plan.block_m, plan.num_warps, plan.bwd_warps = block_m, warps, warps
    return plan


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--slots", default="256,512,1024")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("local_kernels.py needs a CUDA device: nothing measured")
        return 0
    B, n, d, D = (1, 64, 16, 2) if args.tiny else (4, 16384, 64, 8)
    slots = [int(s) for s in args.slots.split(",")]
    warps = [int(w) for w in args.warps.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; B={B} n={n} D={D} d={d}")
    print("| dtype | side | fwd ms | fwd+bwd ms | peak MiB (fwd+bwd) | max diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    g = torch.Generator(device="cuda").manual_seed(0)
    for name in args.dtypes.split(","):
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[name]
        q, k, v = (torch.randn(B, n, d, device="cuda", generator=g, dtype=dtype) for _ in "qkv")
        c = torch.rand(B, n, device="cuda", generator=g) * (n - 1)
        leaves = [x.requires_grad_() for x in (q, k, v, c)]
        sides = _sides(*leaves, D, slots, warps)
        ref = None
        for side, fn in sides.items():
            try:

                def step(fn: Callable[[], Tensor] = fn, leaves: list[Tensor] = leaves) -> None:
                    fn().float().sum().backward()
                    for x in leaves:
                        x.grad = None

                with torch.no_grad():
                    out = fn().float()
                    fwd = _timed(fn, args.repeats)
                ref = out if ref is None else ref
                diff = (out - ref).abs().max().item()
                both = _timed(step, args.repeats)
                peak = cuda_bench._peak(step, "cuda")
                print(
                    f"| {name} | {side} | {fwd:.3f} | {both:.3f} | {peak or 0:.0f} | {diff:.1e} |"
                )
            except Exception as err:  # the row shows it; the other sides still run
                print(f"| {name} | {side} | | | | {type(err).__name__}: {err} |".replace("\n", " "))
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
