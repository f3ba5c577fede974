"""Smoke test of the GPU benchmarks (benchmarks/run.py --device cuda, issue 12): every
case builds and runs fwd + bwd at toy sizes (on CPU here, without the FlexAttention
anchor, which has no CPU backward); without CUDA the command says so and exits 0.
Timings are never asserted."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import cuda_bench  # noqa: E402
import run as R  # noqa: E402


def test_every_gpu_case_runs_at_toy_size_on_cpu():
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        results = cuda_bench.run("cpu", dtypes=("fp32",), tiny=True, repeats=1, warmup=0)
    finally:
        torch.set_num_threads(n)
    cases = {r.case for r in results}
    assert cases == {"sdpa", "mha-causal", "mha", "local-m", "local-p"}
    for r in results:
        assert math.isfinite(r.ms) and r.ms > 0, r
        assert (r.ratio is None) == (r.side == "attnlab"), r
    table = cuda_bench.format_table(results)
    assert "nn.MultiheadAttention(is_causal=True)" in table and "SDPA [B,1,n,d]" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_device_cuda_without_cuda_says_so_and_exits_0(capsys):
    assert R.main(["--device", "cuda"]) == []
    assert "no CUDA device" in capsys.readouterr().out


def _session_steps() -> list[tuple[str, int]]:
    text = (BENCH / "gpu_session.sh").read_text()
    return [
        (line.split()[1], int(line.split()[2]))
        for line in text.splitlines()
        if line.startswith("step ") and line.split()[2].isdigit()
    ]


def test_gpu_session_script_fits_one_lease_call():
    """benchmarks/gpu_session.sh (one GPU lease, one call): valid bash, its step limits sum
    to well inside the 10-minute limit of one call, and at most 8 files come back."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    syntax = subprocess.run([bash, "-n", str(BENCH / "gpu_session.sh")], capture_output=True)
    assert syntax.returncode == 0, syntax.stderr.decode()
    steps = _session_steps()
    assert [name for name, _ in steps] == [
        "device",
        "cuda-tests",
        "kernel-tests",
        "cuda-bench",
        "gpu-kernels",
        "compile-time",
        "local-kernels",
    ]
    assert sum(limit for _, limit in steps) <= 540
    # one .txt per step but the device's and the compile time's (they go into
    # summary.txt), summary.txt, gpu.json and gpu-kernels.json
    assert len(steps) - 2 + 3 <= 8


def _run_session_script(out, **variables: str) -> None:
    """benchmarks/gpu_session.sh into ``out`` with these environment variables; it must
    exit 0."""
    import os
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash is not installed")
    env = {**os.environ, "PYTHON": sys.executable, **variables}
    done = subprocess.run(
        [bash, str(BENCH / "gpu_session.sh"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_gpu_session_script_without_cuda_skips_every_gpu_step(tmp_path):
    """The whole script on a machine without CUDA (the kernel tests left out: they run in
    tests/general; the CUDA tests of one file, so that collecting the whole suite on a
    loaded machine cannot run into the step's limit): every step exits 0 and says there
    is nothing to measure."""
    _run_session_script(
        tmp_path, KERNEL_TESTS="--co tests/test_output.py", CUDA_TESTS="tests/general/test_cuda.py"
    )
    summary = (tmp_path / "summary.txt").read_text()
    for name, _ in _session_steps():
        assert f"{name} " in summary and "cut at its limit" not in summary
    assert "rc=0" in summary and "rc=1" not in summary
    assert "no CUDA device" in summary and not (tmp_path / "device.txt").exists()
    assert len(list(tmp_path.iterdir())) <= 8
    assert "nothing measured" in (tmp_path / "cuda-bench.txt").read_text()
    assert "nothing measured" in (tmp_path / "gpu-kernels.txt").read_text()
    assert "skipped" in (tmp_path / "cuda-tests.txt").read_text()
    assert "nothing measured" in summary and not (tmp_path / "compile-time.txt").exists()
    assert "nothing measured" in (tmp_path / "local-kernels.txt").read_text()


def test_a_side_that_raises_is_an_error_row_and_the_rest_still_runs(monkeypatch):
    """One lease, one call: a side that fails (a missing kernel, say) is reported in its row
    and the other sides and cases are still timed, each row passed on as it is measured."""

    def boom() -> None:
        raise RuntimeError("no kernel for this\nsecond line")

    def cases(device, dtype, tiny):
        ok = cuda_bench.Side("attnlab", lambda: None)
        return [
            cuda_bench.Case("a", "cfg", 1.0, [ok, cuda_bench.Side("anchor", boom)]),
            cuda_bench.Case("b", "cfg", 1.0, [ok, cuda_bench.Side("anchor", lambda: None)]),
        ]

    monkeypatch.setattr(cuda_bench, "build_cases", cases)
    seen = []
    results = cuda_bench.run("cpu", dtypes=("fp32",), repeats=1, warmup=0, on_result=seen.append)
    assert seen == results and [(r.case, r.side) for r in results] == [
        ("a", "attnlab"),
        ("a", "anchor"),
        ("b", "attnlab"),
        ("b", "anchor"),
    ]
    bad = results[1]
    assert bad.error == "RuntimeError: no kernel for this" and bad.ratio is None
    assert "error: RuntimeError: no kernel for this" in cuda_bench.format_row(bad)
    assert all(not r.error and math.isfinite(r.ms) for r in results[2:])
    assert math.isfinite(results[2 + 1].ratio)


def test_gpu_case_and_dtype_names_are_checked_in_one_line():
    for flag, value in (("--cases", "sdpa,nope"), ("--dtypes", "fp64")):
        with pytest.raises(SystemExit, match=f"error: {flag}: unknown"):
            R.main(["--device", "cuda", flag, value])


def test_the_gpu_case_names_are_the_cases_built():
    built = {c.name for c in cuda_bench.build_cases("cpu", torch.float32, tiny=True)}
    assert built == set(cuda_bench.CASE_NAMES)


def test_the_profile_tool_lists_each_sides_operations_on_cpu(capsys):
    """benchmarks/cuda_profile.py at toy sizes on the CPU: every side of the chosen cases
    gets its host and step times and a table of its operations (numbers not asserted)."""
    import cuda_profile

    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert (
            cuda_profile.main(
                [
                    "--device",
                    "cpu",
                    "--tiny",
                    "--cases",
                    "sdpa",
                    "--dtypes",
                    "fp32",
                    "--repeats",
                    "2",
                    "--top",
                    "3",
                ]
            )
            == 0
        )
    finally:
        torch.set_num_threads(n)
    out = capsys.readouterr().out
    assert "## sdpa fp32" in out
    for side in ("attnlab", "SDPA [B,1,n,d]"):
        assert f"  {side}: host " in out and "error" not in out
    assert out.count("in all (") == 2
    assert "scaled_dot_product" in out  # the anchor's one operation is listed


def test_the_profile_tool_checks_its_names_and_needs_cuda_for_cuda(capsys):
    import cuda_profile

    with pytest.raises(SystemExit):
        cuda_profile.main(["--device", "cpu", "--cases", "sdpaa"])
    assert "unknown 'sdpaa'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cuda_profile.main(["--device", "cuda"]) == 0
        assert "no CUDA device" in capsys.readouterr().out


def test_the_compile_time_benchmark_removes_its_cold_caches(tmp_path):
    """benchmarks/compile_time.py compiles into a fresh temporary folder (cold caches) and
    removes it when it ends: 57 such folders had piled up in /tmp of one machine."""
    import os
    import subprocess

    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(BENCH.parent / "src")}
    argv = [sys.executable, str(BENCH / "compile_time.py"), "--device", "cuda"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    if not torch.cuda.is_available():
        assert "nothing measured" in done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_gpu_session_profile_step_runs_only_when_named(tmp_path):
    """The profile step (benchmarks/cuda_profile.py) is not a default step; named in STEPS
    it appends to cuda-bench.txt (8 files at most come back) and reports in summary.txt."""
    _run_session_script(tmp_path, STEPS="device cuda-bench profile")
    summary = (tmp_path / "summary.txt").read_text()
    assert "profile      rc=0" in summary and "appended to cuda-bench.txt" in summary
    log = (tmp_path / "cuda-bench.txt").read_text()
    assert "nothing measured" in log and "no CUDA device: nothing to profile" in log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cuda-bench.txt", "summary.txt"]
    # not a default step: the default run of the other test has no profile line
    assert "profile" not in (BENCH / "gpu_session.sh").read_text().split("steps=")[1].split("\n")[0]
