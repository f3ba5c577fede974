"""Tune the tile budget of the memory-lean fused kernels (attnlab.general.fused).

Times forward + backward of :func:`additive_score_lean` and :func:`multi_dim_attend_lean`
for a few ``chunk_elems`` budgets and prints a small table, so that
``DEFAULT_CHUNK_ELEMS`` can be re-checked on new hardware. With ``--compare`` it instead
measures whole attention steps against the textbook broadcast forms, each side in a fresh
process (speed: median time; memory: peak RSS). For maintainers, not CI.

    python benchmarks/tune_fused_chunks.py                        # both kernels, 2^16..2^22
    python benchmarks/tune_fused_chunks.py --kernel additive --chunks 18 20 22 --repeats 7
    python benchmarks/tune_fused_chunks.py --threads 1 --B 4 --n 512
    python benchmarks/tune_fused_chunks.py --compare --repeats 5  # lean vs broadcast form

Budgets are given as powers of two. The sizes default to the benchmark targets
(additive: B=8, n_q=n_k=1024, d_w=64; multi-dimensional: B=8, n=512, d_w=d_v=64). The
compared steps are: additive -- ``e`` (lean kernel, or ``tanh(q1[:, :, None] + k2[:, None])
@ w``), masked softmax over keys, ``bmm`` with the values; multi-dimensional -- the lean kernel,
or ``tanh(...) @ W_d + b_d``, masked softmax over dim 2, ``(a * v[:, None]).sum(2)``.
Timings on a shared machine are noisy: look at the median and the spread, and repeat.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from attnlab.general.fused import DEFAULT_CHUNK_ELEMS, additive_score_lean, multi_dim_attend_lean
from attnlab.masks import fill_value

Step = Callable[[int | None], None]


def _additive_step(B: int, n: int, d_w: int, act: str, side: str = "kernel") -> Step:
    """``side``: "kernel" (the lean scores alone), "lean" or "naive" (a whole attention
    step: scores, masked softmax, weighted sum of the values)."""
    g = torch.Generator().manual_seed(0)
    q1 = torch.randn(B, n, d_w, generator=g).requires_grad_()
    k2 = torch.randn(B, n, d_w, generator=g).requires_grad_()
    w = (torch.randn(d_w, generator=g) / d_w**0.5).requires_grad_()
    v = torch.randn(B, n, d_w, generator=g).requires_grad_()
    keep = torch.rand(B, 1, n, generator=g) > 0.1
    leaves = (q1, k2, w, v)

    def step(chunk: int | None) -> None:
        if side == "naive":
            e = torch.tanh(q1[:, :, None, :] + k2[:, None, :, :]) @ w
        else:
            e = additive_score_lean(q1, k2, w, act=act, chunk_elems=chunk)
        if side == "kernel":
            torch.autograd.grad(e, leaves[:3], torch.ones_like(e))
            return
        a = torch.softmax(e.masked_fill(~keep, fill_value(e.dtype)), dim=-1)
        c = torch.bmm(a, v)
        torch.autograd.grad(c, leaves, torch.ones_like(c))

    return step


def _multidim_step(B: int, n: int, d_w: int, act: str, side: str = "kernel") -> Step:
    g = torch.Generator().manual_seed(0)
    q1 = torch.randn(B, n, d_w, generator=g).requires_grad_()
    k2 = torch.randn(B, n, d_w, generator=g).requires_grad_()
    W_d = (torch.randn(d_w, d_w, generator=g) / d_w**0.5).requires_grad_()
    b_d = torch.zeros(d_w).requires_grad_()
    v = torch.randn(B, n, d_w, generator=g).requires_grad_()
    keep = torch.rand(B, 1, n, generator=g) > 0.1
    leaves = (q1, k2, W_d, b_d, v)

    def step(chunk: int | None) -> None:
        if side == "naive":
            e = torch.tanh(q1[:, :, None, :] + k2[:, None, :, :]) @ W_d + b_d
            e = e.masked_fill(~keep[..., None], fill_value(e.dtype))
            c = (torch.softmax(e, dim=2) * v[:, None, :, :]).sum(2)
        else:
            c = multi_dim_attend_lean(q1, k2, W_d, b_d, v, keep, act=act, chunk_elems=chunk)
        torch.autograd.grad(c, leaves, torch.ones_like(c))

    return step


def _time(step: Step, chunk: int | None, repeats: int) -> list[float]:
    step(chunk)  # warm-up: workspaces, thread pool, kernels, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step(chunk)
        times.append(time.perf_counter() - t0)
    return times


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _child(args: argparse.Namespace) -> int:
    """One side of --compare in this (fresh) process; prints a JSON line."""
    kernel, side = args.child
    n = args.n or (1024 if kernel == "additive" else 512)
    make = _additive_step if kernel == "additive" else _multidim_step
    step = make(args.B, n, args.d, args.act, side)
    rss_before = _status_mib("VmRSS")
    times = _time(step, None, args.repeats)
    out = {
        "times": times,
        "rss_before_mib": rss_before,
        "vm_hwm_mib": _status_mib("VmHWM"),  # this process's peak RSS
        "ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(json.dumps(out))
    return 0


def _compare(args: argparse.Namespace, kernels: list[str]) -> None:
    base = [sys.executable, __file__, "--repeats", str(args.repeats), "--B", str(args.B)]
    base += ["--d", str(args.d), "--act", args.act]
    if args.n:
        base += ["--n", str(args.n)]
    if args.threads:
        base += ["--threads", str(args.threads)]
    print("| kernel | side | median s | min s | max s | peak RSS MiB | increment MiB |")
    print("|--------|------|---------:|------:|------:|-------------:|--------------:|")
    for kernel in kernels:
        res = {}
        for side in ("naive", "lean"):
            proc = subprocess.run(
                [*base, "--child", kernel, side], capture_output=True, text=True, check=True
            )
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r["median"] = statistics.median(r["times"])
            r["increment"] = r["vm_hwm_mib"] - r["rss_before_mib"]
            res[side] = r
            print(
                f"| {kernel} | {side} | {r['median']:.3f} | {min(r['times']):.3f} | "
                f"{max(r['times']):.3f} | {r['vm_hwm_mib']:.0f} | {r['increment']:.0f} |"
            )
        nv, ln = res["naive"], res["lean"]
        print(
            f"| {kernel} | naive/lean | {nv['median'] / ln['median']:.2f}x | | | "
            f"{nv['vm_hwm_mib'] / ln['vm_hwm_mib']:.2f}x | "
            f"{nv['increment'] / max(ln['increment'], 1e-9):.2f}x |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kernel", choices=["additive", "multidim", "both"], default="both")
    p.add_argument(
        "--chunks",
        type=int,
        nargs="+",
        default=[16, 17, 18, 19, 20, 21, 22],
        help="log2 of the chunk budgets to try",
    )
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--n", type=int, default=None, help="n_q = n_k (1024 additive, 512 multidim)")
    p.add_argument("--d", type=int, default=64, help="d_w (= d_v for multidim)")
    p.add_argument("--act", default="tanh")
    p.add_argument(
        "--compare",
        action="store_true",
        help="lean vs broadcast form, whole attention step, each side in a fresh process",
    )
    p.add_argument("--child", nargs=2, metavar=("KERNEL", "SIDE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.child:
        return _child(args)
    kernels = ["additive", "multidim"] if args.kernel == "both" else [args.kernel]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"default chunk 2^{DEFAULT_CHUNK_ELEMS.bit_length() - 1}"
    )
    if args.compare:
        _compare(args, kernels)
        return 0
    for kernel in kernels:
        n = args.n or (1024 if kernel == "additive" else 512)
        make = _additive_step if kernel == "additive" else _multidim_step
        step = make(args.B, n, args.d, args.act)
        print(
            f"\n{kernel}: B={args.B} n_q=n_k={n} d={args.d} act={args.act}, "
            f"forward+backward, {args.repeats} repeats"
        )
        print("| chunk | MiB/buffer (fp32) | median ms | min ms | max ms | vs best |")
        print("|------:|------------------:|----------:|-------:|-------:|--------:|")
        rows = []
        for log2 in args.chunks:
            chunk = 2**log2
            times = _time(step, chunk, args.repeats)
            rows.append((log2, chunk, statistics.median(times), min(times), max(times)))
        best = min(r[2] for r in rows)
        for log2, chunk, med, lo, hi in rows:
            print(
                f"| 2^{log2:<3} | {chunk * 4 / 2**20:17.2f} | {med * 1e3:9.0f} | "
                f"{lo * 1e3:6.0f} | {hi * 1e3:6.0f} | {med / best:7.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
