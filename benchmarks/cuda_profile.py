"""Where the time of a GPU case goes: the kernels each side launches and its host time.

For every side of the chosen cases of :mod:`cuda_bench` (forward + backward, as timed
there) it prints

* ``host ms``: the time a step takes to return without synchronising (the Python and
  dispatch work; when it nears the synchronised step time, the side is host-bound and
  the GPU waits for it);
* ``step ms``: the synchronised step, as the benchmark times it;
* the kernels of three profiled steps, by device time (``torch.profiler``), with their
  count per step;
* with ``--python N``: the Python functions of ``N`` steps by their own time
  (``cProfile``), which says where a host-bound side spends its host time.

Timings are never asserted: this is a tool for a lease, to be read beside the table of
``cuda_bench.py``.

    python benchmarks/cuda_profile.py --cases sdpa,local-p --dtypes bf16
    python benchmarks/cuda_profile.py --device cpu --tiny      # checks the code only
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import cuda_bench
import torch
from torch.profiler import ProfilerActivity, profile

STEPS = 3  # profiled steps per side


def host_and_step_ms(step: Callable[[], None], device: str, repeats: int) -> tuple[float, float]:
    """``(median host ms, median synchronised step ms)`` of ``repeats`` steps each."""
    host, full = [], []
    for _ in range(repeats):
        cuda_bench._sync(device)
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        cuda_bench._sync(device)
        host.append(t1 - t0)
        full.append(time.perf_counter() - t0)
    return statistics.median(host) * 1e3, statistics.median(full) * 1e3


def kernel_table(step: Callable[[], None], device: str, top: int) -> str:
    """The ``top`` operations of ``STEPS`` profiled steps by device time (CPU time on a
    CPU), one line each: total ms per step, calls per step, name."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(STEPS):
            step()
        cuda_bench._sync(device)
    rows = []
    for e in prof.key_averages():
        us = (e.device_time_total if device == "cuda" else e.self_cpu_time_total) or 0.0
        if device == "cuda" and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if us > 0:
            rows.append((us, e.count, e.key))
    rows.sort(reverse=True)
    lines = [
        f"    {us / 1e3 / STEPS:8.3f} ms  x{count / STEPS:<5g} {name[:110]}"
        for us, count, name in rows[:top]
    ]
    total = sum(r[0] for r in rows) / 1e3 / STEPS
    return "\n".join([*lines, f"    {total:8.3f} ms  in all ({len(rows)} kinds)"])


def python_table(step: Callable[[], None], device: str, steps: int, top: int) -> str:
    """The ``top`` Python functions of ``steps`` steps by their own time, in us per step."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    cuda_bench._sync(device)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    rows = sorted(
        (
            (tt, nc, f"{Path(file).name}:{line}({fn})")
            for (file, line, fn), (_, nc, tt, _, _) in stats.items()
        ),
        reverse=True,
    )
    lines = [
        f"    {tt / steps * 1e6:8.1f} us  x{nc / steps:<5g} {name}" for tt, nc, name in rows[:top]
    ]
    total = sum(r[0] for r in rows) / steps * 1e6
    return "\n".join([*lines, f"    {total:8.1f} us  in all ({len(rows)} functions)"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--cases", default="sdpa,local-p", help="of: " + ",".join(cuda_bench.CASE_NAMES))
    p.add_argument("--dtypes", default="bf16", help="of: " + ",".join(cuda_bench.DTYPES))
    p.add_argument("--tiny", action="store_true", help="toy sizes (checks the code only)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--top", type=int, default=12)
    p.add_argument(
        "--python",
        type=int,
        default=0,
        metavar="N",
        help="also profile the Python of N steps per side (cProfile)",
    )
    a = p.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    dtypes = [d for d in a.dtypes.split(",") if d]
    for name, known in ((cases, cuda_bench.CASE_NAMES), (dtypes, tuple(cuda_bench.DTYPES))):
        bad = [x for x in name if x not in known]
        if bad:
            p.error(f"unknown {bad[0]!r}; choose from {', '.join(known)}")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to profile (use --device cpu --tiny to check the code)")
        return 0
    for dt in dtypes:
        for case in cuda_bench.build_cases(a.device, cuda_bench.DTYPES[dt], a.tiny):
            if case.name not in cases:
                continue
            print(f"## {case.name} {dt} ({case.config})", flush=True)
            for side in case.sides:
                try:
                    for _ in range(3):  # warm up (compiles, autotunes)
                        side.step()
                    host, full = host_and_step_ms(side.step, a.device, a.repeats)
                    print(f"  {side.name}: host {host:.3f} ms, step {full:.3f} ms")
                    print(kernel_table(side.step, a.device, a.top), flush=True)
                    if a.python > 0:
                        print(python_table(side.step, a.device, a.python, a.top), flush=True)
                except Exception as err:  # the other sides still run
                    print(f"  {side.name}: error: {type(err).__name__}: {err}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
