"""Measurement helpers for ``benchmarks/run.py``: interleaved timing, fresh-process peak
memory, agreement checks, machine description and the result table.

Nothing here knows about attention; the cases live in ``benchmarks/_cases.py``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import _launcher
import torch

HERE = Path(__file__).resolve().parent
MIB = 1024.0 * 1024.0

# --------------------------------------------------------------------------- results


@dataclass
class Row:
    """One line of the result table.

    ``attn`` and ``ref`` are the attnlab and reference figures in ``unit`` (medians for
    times, increments for memory); ``ratio`` is the quantity the ``target`` talks about
    (``a/r`` = attnlab over reference, ``r/a`` = reference over attnlab); ``met`` is
    ``None`` for informational rows."""

    bench: str
    config: str
    attn: float
    ref: float | None
    unit: str
    ratio: float | None
    target: str
    met: bool | None
    details: dict = field(default_factory=dict)


def ratio_row(
    bench: str,
    config: str,
    attn: float,
    ref: float,
    unit: str,
    *,
    kind: str,
    bound: float | None,
    details: dict | None = None,
) -> Row:
    """A row whose ratio is ``attn / ref`` (``kind="a/r<="``: attnlab may be at most
    ``bound`` times the reference) or ``ref / attn`` (``kind="r/a>="``: attnlab must be at
    least ``bound`` times better). ``bound=None`` makes the row informational."""
    if kind == "a/r<=":
        ratio = attn / ref if ref > 0 else math.inf
        target = "info (a/r)" if bound is None else f"a/r <= {bound:g}"
        met = None if bound is None else ratio <= bound
    elif kind == "r/a>=":
        ratio = ref / attn if attn > 0 else math.inf
        target = "info (r/a)" if bound is None else f"r/a >= {bound:g}"
        met = None if bound is None else ratio >= bound
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown ratio kind {kind!r}")
    return Row(bench, config, attn, ref, unit, ratio, target, met, details or {})


def _fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    if unit == "ms":
        return f"{x:.2f} ms" if x < 100 else f"{x:.0f} ms"
    if unit == "MiB":
        return f"{x:.0f} MiB" if x >= 10 else f"{x:.1f} MiB"
    if unit:
        return f"{x:.3g} {unit}"
    return f"{x:.2f}" if abs(x) < 100 else f"{x:.0f}"


def format_table(rows: Sequence[Row]) -> str:
    """The result table as aligned plain text (also valid-looking Markdown)."""
    head = ["benchmark", "config", "attnlab", "reference", "ratio", "target", "met?"]
    body = []
    for r in rows:
        met = "-" if r.met is None else ("yes" if r.met else "NO")
        body.append(
            [
                r.bench,
                r.config,
                _fmt(r.attn, r.unit),
                _fmt(r.ref, r.unit),
                _fmt(r.ratio),
                r.target,
                met,
            ]
        )
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(b) for b in body)])


# --------------------------------------------------------------------------- timing


def interleaved(
    fns: Sequence[Callable[[], object]], repeats: int, warmup: int = 1
) -> list[list[float]]:
    """Time the functions ``fns`` in turn (A B A B ... or A B C A B C ...) after ``warmup``
    calls of each.

    Returns the per-call wall times in seconds of each function. Alternating the sides in
    one process exposes all of them to the same machine state (other load, frequency,
    allocator), so their ratios are more stable than the absolute times. The order of a
    round is rotated every round so that no side always runs right after the same one."""
    for _ in range(warmup):
        for f in fns:
            f()
    out: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for i in range(repeats):
        for j in range(n):
            idx = (i + j) % n
            t0 = time.perf_counter()
            fns[idx]()
            out[idx].append(time.perf_counter() - t0)
    return out


def time_alone(f: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Per-call wall times in seconds of ``f`` after ``warmup`` calls."""
    for _ in range(warmup):
        f()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return out


def minor_faults(f: Callable[[], object]) -> int:
    """Minor page faults of this process during one call of ``f``: memory that the
    allocator maps fresh (glibc ``mmap``s blocks above its threshold, at most 32 MiB) and
    the kernel zero-fills page by page on first touch."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def median_ms(times: Sequence[float]) -> float:
    return 1e3 * statistics.median(times)


def spread(times: Sequence[float]) -> dict:
    """Min / median / max in ms and the number of repeats, for the details."""
    return {
        "n": len(times),
        "min_ms": round(1e3 * min(times), 3),
        "median_ms": round(median_ms(times), 3),
        "max_ms": round(1e3 * max(times), 3),
    }


def fit_exponent(ns: Sequence[float], ts: Sequence[float]) -> float:
    """Least-squares slope of ``log t`` against ``log n`` (1 = linear, 2 = quadratic)."""
    xs = [math.log(n) for n in ns]
    ys = [math.log(t) for t in ts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return sxy / sxx


# --------------------------------------------------------------------------- agreement


def check_close(
    what: str,
    got: Sequence[torch.Tensor | None],
    want: Sequence[torch.Tensor | None],
    names: Sequence[str],
    rtol: float = 1e-4,
    atol: float = 1e-5,
    srtol: float = 1e-5,
    overrides: dict[str, dict[str, float]] | None = None,
) -> float:
    """Assert that attnlab's tensors ``got`` equal the reference's ``want`` elementwise,
    naming the first tensor that differs.

    The tolerance of an element is ``atol + rtol * |want| + srtol * max|want|``;
    ``overrides[name]`` may set ``rtol``, ``atol`` and ``srtol`` for one tensor. The
    ``srtol`` term (relative to the tensor's largest entry) lets small entries of a
    large-scale tensor carry the rounding of the large ones; it is raised for gradients of
    parameters that sum millions of products, where in float32 both sides carry rounding
    errors of about ``1e-4 * max|want|`` against a float64 computation.

    Returns the largest ``max|got - want| / max|want|`` over the tensors with
    ``max|want| > atol``, for the record."""
    if not (len(got) == len(want) == len(names)):
        raise AssertionError(f"{what}: {len(got)} vs {len(want)} tensors to compare")
    overrides = overrides or {}
    worst = 0.0
    for g, w, name in zip(got, want, names, strict=True):
        if g is None or w is None:
            raise AssertionError(
                f"{what}: {name} is missing (attnlab {g is None}, ref {w is None})"
            )
        if g.shape != w.shape:
            raise AssertionError(f"{what}: {name} has shape {tuple(g.shape)} vs {tuple(w.shape)}")
        if not torch.isfinite(g).all() or not torch.isfinite(w).all():
            raise AssertionError(f"{what}: {name} is not finite")
        o = overrides.get(name, {})
        rt, at, st = o.get("rtol", rtol), o.get("atol", atol), o.get("srtol", srtol)
        gd, wd = g.detach().double(), w.detach().double()
        diff = (gd - wd).abs()
        scale = float(wd.abs().max()) if wd.numel() else 0.0
        bad = diff > at + rt * wd.abs() + st * scale
        if bool(bad.any()):
            raise AssertionError(
                f"{what}: {name} differs: max |diff| = {float(diff.max()):.3e} "
                f"(max |ref| = {scale:.3e}), {int(bad.sum())} of {bad.numel()} elements beyond "
                f"atol={at:g}, rtol={rt:g}, srtol={st:g}"
            )
        if scale > at:  # a tensor that is zero up to rounding has no scale to speak of
            worst = max(worst, float(diff.max()) / scale)
    return worst


# --------------------------------------------------------------------------- memory


def rss_kib() -> int:
    """Current resident set size of this process in KiB (``VmRSS``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS not found in /proc/self/status")


def hwm_kib() -> int:
    """Peak resident set size (``VmHWM``) in KiB, resettable through ``clear_refs``."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("VmHWM not found in /proc/self/status")


def reset_hwm() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux: write 5 to ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def maxrss_kib() -> int:
    """``getrusage(RUSAGE_SELF).ru_maxrss``: the process's peak RSS in KiB (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure_peak(work: Callable[[], object]) -> dict:
    """Run ``work`` once in this (fresh) process and report its peak memory.

    ``rss_before`` is the RSS just before the work (after imports and input creation);
    ``maxrss_after`` is ``ru_maxrss`` after it; ``increment = maxrss_after - rss_before``.
    ``ru_maxrss`` never decreases, so if importing torch peaked higher than the work the
    increment is an over-estimate (``floor_hit``); ``hwm_increment`` is the same figure from
    ``VmHWM`` reset just before the work, which has no such floor. All values in MiB."""
    import gc

    gc.collect()
    rss_before = rss_kib()
    maxrss_before = maxrss_kib()
    hwm_ok = reset_hwm()
    work()
    maxrss_after = maxrss_kib()
    hwm_after = hwm_kib()
    return {
        "rss_before_mib": rss_before / 1024,
        "maxrss_before_mib": maxrss_before / 1024,
        "maxrss_after_mib": maxrss_after / 1024,
        "increment_mib": (maxrss_after - rss_before) / 1024,
        "floor_hit": maxrss_after <= maxrss_before,
        "hwm_increment_mib": (hwm_after - rss_before) / 1024 if hwm_ok else None,
    }


def memory_in_fresh_process(case: str, side: str, mode: str, timeout: float = 600) -> dict:
    """Run ``benchmarks/run.py --memory-child CASE SIDE --mode MODE`` in a new Python
    process and return the JSON dict it prints (see :func:`measure_peak`).

    The process is started through :mod:`_launcher`, so that its ``ru_maxrss`` does not
    inherit this process's peak."""
    cmd = [sys.executable, str(HERE / "run.py"), "--memory-child", case, side, "--mode", mode]
    proc = _launcher.default().run(cmd, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"memory child {case}/{side} failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not last:
        raise RuntimeError(f"memory child {case}/{side} printed no result:\n{proc.stdout[-2000:]}")
    return json.loads(last[-1])


# --------------------------------------------------------------------------- machine


def machine() -> dict:
    """What the figures were measured on."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (math.nan, math.nan, math.nan)
    return {
        "cpu": model,
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m_5m_15m": [round(x, 2) for x in load],
    }


def describe_machine(info: dict) -> str:
    return (
        f"CPU: {info['cpu']} ({info['logical_cpus']} logical CPUs); torch {info['torch']}, "
        f"{info['torch_threads']} threads; Python {info['python']}; "
        f"load average {info['loadavg_1m_5m_15m']}"
    )


def to_json(rows: Sequence[Row], info: dict, extra: dict | None = None) -> str:
    return json.dumps(
        {"machine": info, "rows": [asdict(r) for r in rows], **(extra or {})}, indent=2
    )


def error_line(err: BaseException) -> str:
    """``Type: first line of the message`` (at most 100 characters of it): how a benchmark
    row reports a side that raised."""
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}"
