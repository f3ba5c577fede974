"""Smoke test of the benchmark suite (benchmarks/run.py) at toy sizes.

It keeps the scripts from rotting: every benchmark runs end to end with ``--tiny``, and
its agreement check (attnlab and the reference give the same outputs and gradients) must
pass. Timings and memory figures are never asserted -- toy sizes say nothing about them.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _cases as C  # noqa: E402
import _harness as H  # noqa: E402
import run as R  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    # run.main(--tiny) drops to one thread; restore the caller's setting afterwards
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


EXPECTED_BENCHES = {
    "sdpa": ["sdpa", "sdpa need_weights"] * 2,
    "additive": ["additive", "additive memory"],
    "multidim": ["multidim", "multidim memory"],
    "local": ["local-p"] + ["local-p scaling"] * 4,
}


@pytest.mark.parametrize("name", C.CASES)
def test_each_benchmark_runs_at_tiny_size(name, capsys):
    rows = R.main(["--tiny", "--quick", "--only", name])
    assert [r.bench for r in rows] == EXPECTED_BENCHES[name]
    for r in rows:
        assert _finite(r.attn), r
        if r.unit:  # a time or a memory figure (the fitted exponent has no unit)
            assert r.attn >= 0 and r.ref is not None and r.ref >= 0, r
        assert r.met is None  # tiny mode never claims a target
    out = capsys.readouterr().out
    assert "| benchmark" in out and "mode=tiny" in out
    for r in rows:
        if r.bench.endswith("memory"):
            for side in ("attnlab", "reference"):
                m = r.details[side]
                assert m["case"] == name and m["side"] == side and m["mode"] == "tiny"
                assert m["maxrss_after_mib"] >= m["rss_before_mib"] > 0
        elif r.bench == "local-p scaling" and "n_k" in r.details:
            assert r.details["minor_page_faults_per_step"] >= 0
            assert "| minor page faults |" in out
        elif r.bench != "local-p scaling":
            # the agreement check ran and passed, at float32 rounding level
            assert r.details["max_rel_diff"] < 1e-3


def test_fast_paths_are_the_ones_benchmarked():
    (pair, _), _ = C.sdpa_pairs("tiny")
    assert pair.info["path"] == "sdpa"
    assert C.additive_pair("tiny").info["path"] == "lean-additive"
    assert C.multidim_pair("tiny").info["path"] == "lean-multi"
    assert C.local_pair("tiny").info["path"] == "local-window"


def test_agreement_check_catches_a_wrong_reference():
    pair = C.additive_pair("tiny")
    good_ref = pair.ref
    pair.check()  # the real reference agrees
    pair.ref = lambda: good_ref() * 1.001  # a reference that is off by 0.1 %
    with pytest.raises(AssertionError, match="output differs"):
        pair.check()


def test_agreement_check_catches_a_wrong_gradient():
    pair = C.local_pair("tiny")
    good_ref = pair.ref
    q = pair.leaves[0]
    # same forward values, but an extra gradient flows to q
    pair.ref = lambda: good_ref() + _grad_bump(q)
    with pytest.raises(AssertionError, match="grad q differs"):
        pair.check()


def test_per_leaf_tolerances_reach_the_check():
    pair = C.additive_pair("tiny")
    w = pair.leaves[pair.leaf_names.index("w")]
    good_ref = pair.ref
    pair.step_ref()
    scale = float(w.grad.abs().max())
    # the same output, plus a gradient of 2e-4 * max|grad w| on every element of w
    c = 2e-4 * scale / float(pair.grad_out.sum())
    pair.ref = lambda: good_ref() + c * (w - w.detach()).sum()
    pair.overrides = {}
    with pytest.raises(AssertionError, match="grad w differs"):
        pair.check()
    pair.overrides = {"w": {"srtol": 5e-4}}
    assert 1e-4 < pair.check() < 5e-4


def _grad_bump(q: torch.Tensor) -> torch.Tensor:
    # zero in value, gradient 1 per element of q through the output's first feature
    bump = (q - q.detach()).sum(-1, keepdim=True)
    return torch.cat([bump, torch.zeros_like(q[..., 1:])], dim=-1)


def test_check_close_tolerances():
    a = torch.tensor([1.0, 2.0])
    assert H.check_close("x", [a], [a + 1e-7], ["t"]) < 1e-6
    with pytest.raises(AssertionError, match="t differs"):
        H.check_close("x", [a], [a + 1e-2], ["t"])
    with pytest.raises(AssertionError, match="shape"):
        H.check_close("x", [a], [a[:1]], ["t"])
    # a small element of a large-scale tensor: fails elementwise, passes relative to scale
    big = torch.tensor([100.0, 0.0])
    off = big + torch.tensor([0.0, 0.01])
    with pytest.raises(AssertionError, match="t differs"):
        H.check_close("x", [off], [big], ["t"])
    ok = H.check_close("x", [off], [big], ["t"], overrides={"t": {"srtol": 5e-4}})
    assert ok == pytest.approx(1e-4)
    with pytest.raises(AssertionError, match="not finite"):
        H.check_close("x", [a * math.nan], [a], ["t"])


def test_fit_exponent_and_ratio_rows():
    ns = [1000, 2000, 4000, 8000]
    assert H.fit_exponent(ns, [3.0 * n for n in ns]) == pytest.approx(1.0)
    assert H.fit_exponent(ns, [0.5 * n * n for n in ns]) == pytest.approx(2.0)
    r = H.ratio_row("b", "c", 10.0, 50.0, "ms", kind="r/a>=", bound=4)
    assert r.ratio == pytest.approx(5.0) and r.met is True
    r = H.ratio_row("b", "c", 12.0, 10.0, "ms", kind="a/r<=", bound=1.1)
    assert r.ratio == pytest.approx(1.2) and r.met is False
    table = H.format_table([r])
    assert "a/r <= 1.1" in table and "| NO " in table


def test_interleaved_alternates_and_counts():
    calls: list[str] = []
    ta, tb = H.interleaved([lambda: calls.append("a"), lambda: calls.append("b")], 3, warmup=1)
    assert len(ta) == len(tb) == 3
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]


def test_unknown_benchmark_name_is_rejected():
    with pytest.raises(SystemExit, match="unknown benchmark"):
        R.selected(["nope"])
    assert R.selected(["local-p,multi-dim", "sdpa"]) == ["local", "multidim", "sdpa"]


# ------------------------------------------------- the GPU kernels' benchmark script

import gpu_kernels as G  # noqa: E402


def _on_the_interpreter(monkeypatch) -> None:
    """Run the kernels on Triton's CPU interpreter, or skip with the reason."""
    from attnlab.general.flash_additive import triton_unavailable_reason

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # Triton reads it when first imported
    pytest.importorskip("triton", reason="pip install 'attnlab[triton]'")
    reason = triton_unavailable_reason("cpu")  # e.g. triton was imported without it
    if reason is not None:
        pytest.skip(reason)


def test_gpu_kernel_benchmark_exits_cleanly_without_cuda(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.main([]) == 0
    assert "nothing measured" in capsys.readouterr().out


def test_gpu_kernel_benchmark_runs_tiny_on_the_interpreter(monkeypatch, capsys):
    # the whole script (agreement check, timing, table) at toy sizes on Triton's CPU
    # interpreter; main returns 1 if an agreement check fails
    _on_the_interpreter(monkeypatch)
    sides = "triton,triton-fused,broadcast"
    argv = ["--tiny", "--device", "cpu", "--sides", sides, "--only", "additive-1024"]
    assert G.main(argv) == 0
    out = capsys.readouterr().out
    for side in sides.split(","):
        assert f"| additive-1024 | {side} |" in out, side


def test_gpu_kernel_benchmark_times_in_bfloat16_on_the_interpreter(monkeypatch, capsys):
    # --dtype bf16: the timed inputs and weights in bfloat16 (issue 13's target dtype), the
    # agreement check still in float32; the dtype is in each row's config
    _on_the_interpreter(monkeypatch)
    seen = []
    real = G._inputs
    monkeypatch.setattr(G, "_inputs", lambda *a, **k: seen.append(k.get("dtype")) or real(*a, **k))
    # every Triton side: the ones that call the kernels directly (triton-fused, a tile) cast
    # the values to the kernels' float32 parts as the path does (an H200 run caught them
    # passing bfloat16 values beside float32 queries); triton-half hands the kernels
    # bfloat16 parts (their half-precision mode)
    import attnlab.general.flash_additive as fa

    parts = []
    real_multi = fa.flash_multi_dim_attention

    def spy(q1, *args, **kwargs):
        parts.append(q1.dtype)
        return real_multi(q1, *args, **kwargs)

    monkeypatch.setattr(fa, "flash_multi_dim_attention", spy)
    sides = "triton,triton-fused,triton-half,broadcast"
    argv = ["--tiny", "--device", "cpu", "--sides", sides, "--only", "multidim-512"]
    assert G.main([*argv, "--dtype", "bf16", "--tiles", "multi:16x4"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| multidim-512 |")]
    assert len(rows) == 5 and all(" bf16 |" in row for row in rows), rows
    assert not [row for row in rows if "error" in row], rows
    assert set(parts) == {torch.float32, torch.bfloat16}, set(parts)
    assert "; bf16; " in out
    assert torch.bfloat16 in seen and torch.float32 in seen and None not in seen
    with pytest.raises(SystemExit):
        G.main([*argv, "--dtype", "fp64"])


def test_gpu_kernel_benchmark_times_other_tiles_on_the_interpreter(monkeypatch, capsys):
    # --tiles adds a side triton@BMxBN per case of its kind, after the others; it is
    # checked against the broadcast form like every side
    _on_the_interpreter(monkeypatch)
    argv = [
        "--tiny",
        "--device",
        "cpu",
        "--sides",
        "broadcast",
        "--tiles",
        "multi:16x4,additive:32x16",
    ]
    assert G.main(argv) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    sides = [(row.split(" | ")[0][2:], row.split(" | ")[1]) for row in rows[2:]]
    assert sides == [
        ("additive-1024", "broadcast"),
        ("multidim-512", "broadcast"),
        ("multidim-512", "triton@16x4"),
        ("additive-1024", "triton@32x16"),
    ]
    with pytest.raises(SystemExit):
        G.main(["--tiny", "--device", "cpu", "--tiles", "multi16x4"])


def test_gpu_kernel_timing_caps_the_repeats_of_slow_steps(monkeypatch):
    # a side whose step takes seconds (n = 32768) gets fewer repeats, never under 3; a fake
    # clock stands in for the step times (no wall-clock timing in a test)
    class Clock:
        now = 0.0

        def perf_counter(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(G, "time", clock)
    calls = []

    def step(seconds: float):
        def f() -> None:
            calls.append(1)
            clock.now += seconds

        return f

    assert len(G._timed(step(4.0), "cpu", repeats=10, warmup=2)) == 3  # 8 s budget
    assert len(G._timed(step(0.5), "cpu", repeats=10, warmup=2)) == 10
    assert len(G._timed(step(1.0), "cpu", repeats=10, warmup=2)) == 8
    assert len(calls) == 2 + 3 + 2 + 10 + 2 + 8


def test_the_default_launcher_ends_with_the_interpreter():
    """The memory benchmarks' helper process is closed at exit: before, it outlived the
    interpreter's shutdown (ResourceWarning: subprocess ... is still running, two pipes
    unclosed), at the end of every test suite that ran a memory benchmark."""
    import os
    import subprocess

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _launcher\n"
        "r = _launcher.default().run([sys.executable, '-c', 'print(6 * 7)'])\n"
        "assert r.returncode == 0 and r.stdout == '42\\n', r\n"
        "print(_launcher.default()._proc.pid)"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always::ResourceWarning", "-c", code, str(BENCH)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "ResourceWarning" not in done.stderr, done.stderr
    pid = int(done.stdout.split()[-1])
    with pytest.raises(ProcessLookupError):  # the helper was waited for, not orphaned
        os.kill(pid, 0)
