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
