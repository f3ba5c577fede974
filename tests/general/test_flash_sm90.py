"""The Triton kernels of attnlab.general.flash_additive compile for an H100 (sm_90).

The interpreter tests (test_flash_additive.py) check what the kernels compute; they cannot
check that Triton's compiler accepts them, nor what a launch needs on the device. This
runs ``benchmarks/sm90_kernels.py --quick`` in a subprocess without ``TRITON_INTERPRET``
(the suite sets it when there is no CUDA): every kernel of the launches a CUDA device
would get (forward, both backward kernels, the weights pass; each score, dtype and mode)
is compiled ahead of time for sm_90 with Triton's bundled ``ptxas``, no GPU needed, and
must stay within the H100's per-block limits. The registers and spills it reports are in
docs/kernels.md; they are figures, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sm90_kernels.py"
KERNELS = {"attend_fwd", "attend_bwd_q", "attend_bwd_kv", "attend_weights"}


def _has_nvidia_backend() -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas  # noqa: F401
    except Exception:  # any failure means: no compiler to check with
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvidia_backend(), reason="triton (NVIDIA back end) not installed")
def test_every_gpu_launch_compiles_for_sm90_within_the_h100_limits(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "sm90.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if res.returncode == 3:  # benchmarks/sm90_kernels.py: UNSUPPORTED
        pytest.skip(res.stdout.strip())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    results = json.loads(out.read_text())
    by_case: dict[str, set[str]] = {}
    for r in results:
        by_case.setdefault(r["case"], set()).add(r["kernel"])
        assert not r["problems"], r
        assert 0 < r["registers"] <= 255, r
    # every planned case compiled all four kernels (identical launches are compiled once);
    # a fused-backward case launches no attend_bwd_q, and its attend_bwd_kv is new
    assert len(by_case) >= 8
    plain = {case: k for case, k in by_case.items() if "fused-bwd" not in case}
    fused = {case: k for case, k in by_case.items() if "fused-bwd" in case}
    assert all(kernels == KERNELS for kernels in plain.values()), plain
    assert len(fused) == 4, fused
    assert all("attend_bwd_kv" in k and "attend_bwd_q" not in k for k in fused.values()), fused
    # the half-precision tanh cases are compiled with the GPU's tanh.approx (inline PTX,
    # which the interpreter never sees)
    assert any("bfloat16 tanh" in case for case in by_case)


def test_the_recorder_plans_gpu_launches_on_cpu_tensors():
    """The script's recording step alone (no compiler): a GPU plan records the four
    kernels with the GPU tiles, whatever the interpreter setting."""
    pytest.importorskip("triton")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import sm90_kernels as S
    finally:
        sys.path.remove(str(SCRIPT.parent))
    calls = S.record(S.Case(False, "bfloat16", "tanh", True, True, False, 64, 64))
    assert [name for name, _, _ in calls] == [
        "attend_fwd",
        "attend_bwd_q",
        "attend_bwd_kv",
        "attend_weights",
    ]
    consts = calls[0][2]
    assert consts["FAST"] is True  # tanh.approx in half precision on a GPU
    assert consts["BLOCK_M"] >= 32 and consts["BLOCK_N"] >= 32  # GPU tiles, not the 16s
    multi = S.record(S.Case(True, "float32", "relu", False, False, True, 64, 64))
    assert multi[0][2]["DOT"] == 1 and multi[0][2]["MULTI"] is True  # TF32 when allowed


def test_a_triton_with_another_compile_api_is_reported_not_failed(monkeypatch, capsys):
    """A triton whose ahead-of-time API differs makes the script exit 3 with one line
    (the compile test then skips), instead of failing on the first kernel."""
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import sm90_kernels as S
    finally:
        sys.path.remove(str(SCRIPT.parent))
    monkeypatch.setattr(S, "aot_ptxas", lambda: None)
    assert S.main(["--quick"]) == S.UNSUPPORTED == 3
    assert "does not compile ahead of time the way this script asks" in capsys.readouterr().out
