"""attnlab benchmarks: speed and peak memory as ratios against direct PyTorch references,
measured side by side in one run.

    make bench                          # = .venv/bin/python benchmarks/run.py
    .venv/bin/python benchmarks/run.py --quick            # fewer repeats (smoke run)
    .venv/bin/python benchmarks/run.py --only additive    # one benchmark (repeatable)
    .venv/bin/python benchmarks/run.py --tiny             # toy sizes: checks the code only
    .venv/bin/python benchmarks/run.py --json out.json    # also save the raw figures

Benchmarks (all forward + backward, float32, default torch thread count):

* ``sdpa``      scaled-dot soft attention via ``attnlab.Attention`` vs
                ``F.scaled_dot_product_attention`` on ``[B, 1, n, d]``, the fused CPU
                kernel's layout (B=32, n=512 and 2048, d=64); target
                attnlab/reference <= 1.10. ``need_weights=True`` overhead is informational.
* ``additive``  additive attention via the lean kernel vs the textbook broadcast form
                (B=8, n=1024, d=d_w=64); targets >= 4x faster and >= 8x lower peak memory.
* ``multidim``  multi-dimensional (DiSAN) attention vs its naive broadcast form (B=8,
                n=512, d=d_w=64); targets >= 4x lower peak memory and not slower.
* ``local``     local-p (D=8) on the window only vs the same weights over the full score
                matrix at n_k=16384 (target >= 10x faster), and the windowed time at
                n_k = 2048 .. 16384 (per-doubling ratio and fitted exponent; ~1 = linear).

Times are medians of repeats after warm-up, both sides interleaved in one process; peak
memory is measured per side in a fresh process (``ru_maxrss`` minus the RSS just before
the work). Before timing, each benchmark asserts that both sides give the same outputs
and gradients. See docs/benchmarks.md for the method and the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _launcher

if __name__ == "__main__" and "--memory-child" not in sys.argv:
    # start the helper that launches the memory measurements while this process is still
    # small: a child inherits its parent's peak RSS (see _launcher)
    _launcher.default()

import _cases as C
import _harness as H
import torch


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _reps(mode: str, key: str) -> tuple[int, int]:
    return C.REPEATS[mode][key]


# --------------------------------------------------------------------------- benchmarks


def bench_sdpa(mode: str) -> list[H.Row]:
    rows = []
    diff_w = C.check_sdpa_weights(mode)
    _log(f"[sdpa] need_weights agreement ok (max |diff|/max|ref| {diff_w:.1e})")
    for pair, step_weights in C.sdpa_pairs(mode):
        n = pair.info["n"]
        diff = pair.check()
        repeats, warmup = _reps(mode, f"sdpa-{n}" if mode != "tiny" else "sdpa-512")
        _log(
            f"[sdpa] n={n}: agreement ok (max |diff|/max|ref| {diff:.1e}); timing {repeats} repeats"
        )
        ta, tr, tw = H.interleaved([pair.step_attn, pair.step_ref, step_weights], repeats, warmup)
        cfg = pair.info["config"]
        details = {"attnlab": H.spread(ta), "reference": H.spread(tr), "max_rel_diff": diff}
        rows.append(
            H.ratio_row(
                "sdpa", cfg, H.median_ms(ta), H.median_ms(tr), "ms",
                kind="a/r<=", bound=1.10, details={**details, "path": pair.info["path"]},
            )
        )  # fmt: skip
        rows.append(
            H.ratio_row(
                "sdpa need_weights", f"{cfg}; ref = attnlab without weights",
                H.median_ms(tw), H.median_ms(ta), "ms", kind="a/r<=", bound=None,
                details={
                    "need_weights": H.spread(tw),
                    "attnlab": H.spread(ta),
                    "vs_sdpa_direct": H.median_ms(tw) / H.median_ms(tr),
                    "max_rel_diff": diff_w,
                },
            )
        )  # fmt: skip
    return rows


def _memory_row(case: str, mode: str, config: str, bound: float) -> H.Row:
    mem = {}
    for side in ("attnlab", "reference"):
        _log(f"[{case}] peak memory of the {side} side in a fresh process")
        mem[side] = H.memory_in_fresh_process(case, side, mode)
    a, r = mem["attnlab"]["increment_mib"], mem["reference"]["increment_mib"]
    row = H.ratio_row(
        f"{case} memory", f"{config}; peak RSS increment", a, r, "MiB",
        kind="r/a>=", bound=bound, details=mem,
    )  # fmt: skip
    return row


def bench_additive(mode: str) -> list[H.Row]:
    pair = C.additive_pair(mode)
    diff = pair.check()
    repeats, warmup = _reps(mode, "additive")
    _log(f"[additive] agreement ok (max |diff|/max|ref| {diff:.1e}); timing {repeats} repeats")
    ta, tr = H.interleaved([pair.step_attn, pair.step_ref], repeats, warmup)
    cfg = pair.info["config"]
    del pair
    rows = [
        H.ratio_row(
            "additive", cfg, H.median_ms(ta), H.median_ms(tr), "ms", kind="r/a>=", bound=4,
            details={"attnlab": H.spread(ta), "reference": H.spread(tr), "max_rel_diff": diff},
        )
    ]  # fmt: skip
    rows.append(_memory_row("additive", mode, cfg, 8))
    return rows


def bench_multidim(mode: str) -> list[H.Row]:
    pair = C.multidim_pair(mode)
    diff = pair.check()
    repeats, warmup = _reps(mode, "multidim")
    _log(f"[multidim] agreement ok (max |diff|/max|ref| {diff:.1e}); timing {repeats} repeats")
    ta, tr = H.interleaved([pair.step_attn, pair.step_ref], repeats, warmup)
    cfg = pair.info["config"]
    del pair
    rows = [
        H.ratio_row(
            "multidim", cfg, H.median_ms(ta), H.median_ms(tr), "ms", kind="a/r<=", bound=1.0,
            details={"attnlab": H.spread(ta), "reference": H.spread(tr), "max_rel_diff": diff},
        )
    ]  # fmt: skip
    rows.append(_memory_row("multidim", mode, cfg, 4))
    return rows


def bench_local(mode: str) -> list[H.Row]:
    sz = C.sizes("local", mode)
    main_n = sz["n"]
    ns = sorted(set(sz["scaling"]) | {main_n})
    rep_s, warm_s = _reps(mode, "local-scaling")
    rep_c, warm_c = _reps(mode, "local")
    pairs = {}
    ref_t: dict[int, list[float]] = {}
    main_row = None
    for n in ns:
        pair = C.local_pair(mode, n)
        diff = pair.check()
        _log(f"[local] n_k={n}: agreement ok (max |diff|/max|ref| {diff:.1e}); timing")
        # the reference at the smaller n only shows its growth: fewer repeats there
        reps = rep_c if n == main_n else min(rep_c, 3)
        ta, tr = H.interleaved([pair.step_attn, pair.step_ref], reps, warm_c)
        ref_t[n] = tr
        if n == main_n:
            main_row = H.ratio_row(
                "local-p", pair.info["config"], H.median_ms(ta), H.median_ms(tr), "ms",
                kind="r/a>=", bound=10,
                details={"attnlab": H.spread(ta), "reference": H.spread(tr),
                         "max_rel_diff": diff, "path": pair.info["path"]},
            )  # fmt: skip
        pairs[n] = pair
    # the windowed path alone at every n, the sizes interleaved round by round so that
    # all of them see the same machine state
    scal = [n for n in ns if n in sz["scaling"]]
    _log(f"[local] scaling: windowed path at n_k = {scal}, {rep_s} interleaved rounds")
    alone = dict(
        zip(scal, H.interleaved([pairs[n].step_attn for n in scal], rep_s, warm_s), strict=True)
    )
    # minor page faults of one step: large fresh allocations are page-faulted in each call
    faults = {n: H.minor_faults(pairs[n].step_attn) for n in scal}
    del pairs
    assert main_row is not None
    rows = [main_row]
    prev = None
    for n in scal:
        t = H.median_ms(alone[n])
        per_doubling = None if prev is None else t / prev
        rows.append(
            H.Row(
                "local-p scaling", f"n_q=n_k={n} (B={sz['B']}); ratio = t(n)/t(n/2)",
                t, H.median_ms(ref_t[n]), "ms", per_doubling, "info: 2 = linear", None,
                details={"attnlab_alone": H.spread(alone[n]), "reference": H.spread(ref_t[n]),
                         "minor_page_faults_per_step": faults[n], "n_k": n},
            )
        )  # fmt: skip
        prev = t
    exp_a = H.fit_exponent(scal, [H.median_ms(alone[n]) for n in scal])
    exp_r = H.fit_exponent(scal, [H.median_ms(ref_t[n]) for n in scal])
    rows.append(
        H.Row(
            "local-p scaling", f"fitted exponent t ~ n_k^x, n_k={scal[0]}..{scal[-1]}",
            exp_a, exp_r, "", exp_a, "x <= 1.2", exp_a <= 1.2,
            details={"attnlab_exponent": exp_a, "reference_exponent": exp_r},
        )
    )  # fmt: skip
    return rows


BENCHMARKS = {
    "sdpa": bench_sdpa,
    "additive": bench_additive,
    "multidim": bench_multidim,
    "local": bench_local,
}


# --------------------------------------------------------------------------- memory child


def memory_child(case: str, side: str, mode: str) -> None:
    """Entry point of the fresh process: build one case, measure one side's peak."""
    if case not in C.MEMORY_CASES:
        raise SystemExit(
            f"no memory measurement for {case!r}; choose from {sorted(C.MEMORY_CASES)}"
        )
    pair = C.MEMORY_CASES[case](mode)
    step = pair.side(side)
    res = H.measure_peak(step)
    res.update({"case": case, "side": side, "mode": mode})
    print(json.dumps(res))


# --------------------------------------------------------------------------- main


def _memory_table(rows: list[H.Row]) -> str:
    lines = [
        "| benchmark | side | RSS before | max RSS after | increment | VmHWM increment |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if not r.bench.endswith("memory"):
            continue
        for side in ("attnlab", "reference"):
            m = r.details[side]
            hwm = m["hwm_increment_mib"]
            floor = " (floor)" if m["floor_hit"] else ""
            lines.append(
                f"| {r.bench} | {side} | {m['rss_before_mib']:.0f} MiB | "
                f"{m['maxrss_after_mib']:.0f} MiB | {m['increment_mib']:.1f} MiB{floor} | "
                f"{'-' if hwm is None else f'{hwm:.1f} MiB'} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def _scaling_table(rows: list[H.Row]) -> str:
    lines = [
        "| n_k | median | min | max | minor page faults |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if r.bench == "local-p scaling" and "attnlab_alone" in r.details:
            t = r.details["attnlab_alone"]
            lines.append(
                f"| {r.details['n_k']} | {t['median_ms']:.1f} ms | {t['min_ms']:.1f} ms | {t['max_ms']:.1f} ms "
                f"| {r.details['minor_page_faults_per_step']} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description="attnlab benchmarks: ratios against direct PyTorch references."
    )
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument(
        "--tiny", action="store_true", help="toy sizes, one repeat: checks the code, not speed"
    )
    ap.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this benchmark (repeatable; comma-separated ok): {', '.join(C.CASES)}",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cpu: the CPU benchmarks above; cuda: the GPU anchors of benchmarks/cuda_bench.py "
        "and the Triton kernels of benchmarks/gpu_kernels.py (bf16 and fp32)",
    )
    ap.add_argument(
        "--cases",
        default="",
        help="with --device cuda: only these GPU cases, comma-separated "
        "(sdpa, mha-causal, mha, local-m, local-p)",
    )
    ap.add_argument(
        "--dtypes", default="bf16,fp32", help="with --device cuda: comma-separated bf16, fp32"
    )
    ap.add_argument("--memory-child", nargs=2, metavar=("CASE", "SIDE"), help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=C.MODES, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def selected(only: list[str] | None) -> list[str]:
    if not only:
        return list(C.CASES)
    names = []
    for item in only:
        for name in item.split(","):
            name = C.ALIASES.get(name.strip(), name.strip())
            if name not in BENCHMARKS:
                raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(C.CASES)}")
            if name not in names:
                names.append(name)
    return names


def main_cuda(args: argparse.Namespace) -> int:
    """``--device cuda``: every GPU anchor, fwd + bwd, bf16 and fp32, ratios in one run.
    Without a CUDA device it says so and returns 0."""
    import cuda_bench
    import gpu_kernels

    for flag, given, known in (
        ("--cases", args.cases, cuda_bench.CASE_NAMES),
        ("--dtypes", args.dtypes, tuple(cuda_bench.DTYPES)),
    ):
        bad = [x for x in given.split(",") if x and x not in known]
        if bad:
            raise SystemExit(f"error: {flag}: unknown {bad}; choose from {', '.join(known)}")
    if not torch.cuda.is_available():
        print("no CUDA device: the GPU benchmarks (--device cuda) need one; nothing measured")
        return 0

    p = torch.cuda.get_device_properties(0)
    print(f"attnlab GPU benchmarks: {p.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    quick = args.quick or args.tiny
    rows: list[cuda_bench.Result] = []

    def shown(r: cuda_bench.Result) -> None:
        # each row printed (and the JSON rewritten) as it is measured: a cut run keeps them
        rows.append(r)
        print(cuda_bench.format_row(r), flush=True)
        if args.json:
            Path(args.json).write_text(
                json.dumps({"device": p.name, "results": [x.__dict__ for x in rows]}, indent=1)
            )

    print(cuda_bench.TABLE_HEAD, flush=True)
    cuda_bench.run(
        "cuda",
        dtypes=tuple(x for x in args.dtypes.split(",") if x),
        only=[x for x in args.cases.split(",") if x] or None,
        tiny=args.tiny,
        repeats=5 if quick else 20,
        warmup=1 if quick else 3,
        on_result=shown,
    )
    print()
    print("Additive / multi-dimensional: Triton kernels vs the textbook form and its compile:")
    kernel_args = ["--tiny"] if args.tiny else []
    if args.json:
        kernel_args += ["--json", str(Path(args.json).with_suffix(".kernels.json"))]
    rc = gpu_kernels.main(kernel_args)
    failed = [f"{r.case} {r.dtype} {r.side}" for r in rows if r.error]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return rc or int(bool(failed))


def main(argv: list[str] | None = None) -> list[H.Row]:
    args = parse_args(argv)
    if args.device == "cuda":
        rc = main_cuda(args)
        if rc:
            raise SystemExit(rc)
        return []
    mode = args.mode or ("tiny" if args.tiny else "quick" if args.quick else "full")
    if mode == "tiny":
        # toy sizes check the code, not the speed: one thread avoids OpenMP barrier stalls
        # when the machine is busy (the timed modes keep torch's default thread count)
        torch.set_num_threads(1)
    if args.memory_child:
        memory_child(*args.memory_child, mode)
        return []
    names = selected(args.only)
    info = H.machine()
    t0 = time.perf_counter()
    _log(f"attnlab benchmarks ({mode}): {', '.join(names)}")
    _log(H.describe_machine(info))
    rows, failed = _run_all(names, mode)
    if mode == "tiny":  # toy sizes say nothing about the targets
        for r in rows:
            r.met = None
    info_end = H.machine()
    elapsed = time.perf_counter() - t0
    _print_report(rows, mode, info, info_end, elapsed)
    if args.json:
        Path(args.json).write_text(
            H.to_json(rows, info, {"mode": mode, "elapsed_s": elapsed, "machine_end": info_end})
        )
    if failed:
        raise SystemExit(f"benchmarks failed: {', '.join(failed)} (see the messages above)")
    return rows


def _run_all(names: list[str], mode: str) -> tuple[list[H.Row], list[str]]:
    """Run the named benchmarks; a failing one is reported as a FAILED row and named in
    the second list, and the others still run."""
    rows: list[H.Row] = []
    failed: list[str] = []
    for name in names:
        t_start = time.perf_counter()
        try:
            got = BENCHMARKS[name](mode)
        except Exception as err:  # report it, run the other benchmarks, exit non-zero
            traceback.print_exc()
            failed.append(name)
            msg = " ".join(f"{type(err).__name__}: {err}".split())
            got = [H.Row(name, f"FAILED: {msg[:300]}", math.nan, None, "", None, "-", False)]
        rows.extend(got)
        _log(f"[{name}] done in {time.perf_counter() - t_start:.0f} s")
    return rows, failed


def _print_report(rows: list[H.Row], mode: str, info: dict, info_end: dict, elapsed: float) -> None:
    """The tables on standard output."""
    print(f"attnlab benchmarks, mode={mode}; forward + backward, float32")
    print(H.describe_machine(info))
    print(
        "ratio: a/r = attnlab / reference, r/a = reference / attnlab; times are medians "
        "of interleaved repeats, memory is the peak-RSS increment in a fresh process"
    )
    print()
    print(H.format_table(rows))
    scaling = _scaling_table(rows)
    if scaling:
        print()
        print("Local-p windowed path, per step (forward + backward):")
        print(scaling)
    mem = _memory_table(rows)
    if mem:
        print()
        print("Peak memory per side (fresh process each):")
        print(mem)
    print()
    print(f"total {elapsed:.0f} s; load average at the end {info_end['loadavg_1m_5m_15m']}")


if __name__ == "__main__":
    main()
