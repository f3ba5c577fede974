#!/usr/bin/env bash
# Everything a GPU lease has to do, in one call that ends inside 10 minutes:
#
#   1. the device, torch, CUDA and triton versions (into summary.txt);
#   2. the CUDA tests (`pytest -m cuda`) and the Triton kernel tests on the device
#      (with pytest-xdist's workers where it is installed: Triton compiles on the CPU);
#   3. the GPU anchors of benchmarks/cuda_bench.py (--quick: 5 repeats);
#   4. the Triton kernels against the textbook form (benchmarks/gpu_kernels.py), their
#      half-precision mode among the sides (not the chunked kernels, timed in three
#      leases: KERNEL_SIDES adds them), then other tiles (TILES: none by default, the
#      defaults beat the tiles they were chosen over in two leases);
#   5. the cold compile time of torch.compile(Attention("additive")) (compile_time.py);
#   6. the local-attention Triton kernels against the gathered window (local_kernels.py);
#   7. only when STEPS names it (`profile`): where the time of some anchor cases goes
#      (benchmarks/cuda_profile.py: host time, kernels, Python), appended to cuda-bench.txt.
#
# Each step runs under its own time limit (a step that runs over is cut and the next one
# starts), writes its whole output to OUTDIR/<step>.txt and one line to
# OUTDIR/summary.txt. The tables end up in OUTDIR/cuda-bench.txt and gpu-kernels.txt,
# and the raw figures in gpu.json and gpu-kernels.json.
#
#   bash benchmarks/gpu_session.sh [OUTDIR]     # default: $OUT if set, else ./gpu-out
#   STEPS="device cuda-tests" bash benchmarks/gpu_session.sh   # some steps only
#   LIMITS="cuda-tests=60 gpu-kernels=200" ...                  # other time limits
#   CUDA_TESTS="tests/general/test_cuda.py::test_x" ...        # some CUDA tests only
#   CUDA_CASES=local-p CUDA_DTYPES=bf16 ...   # some cases of step 3 (run.py --cases, --dtypes)
#   KERNEL_SIDES=triton,compiled ...          # some sides of step 4 (gpu_kernels.py --sides)
#   KERNEL_DTYPE=fp32 ...                     # step 4's dtype (default bf16, issue 13's target)
#   STEPS="cuda-bench profile" PROFILE_CASES=local-p PROFILE_DTYPES=bf16 ...  # step 7's cases
#
# Without a GPU every step says so and exits 0 (the CUDA tests skip). At most 8 files
# come back from a lease's $OUT: these are the 8.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-gpu-out}}"
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py="${PYTHON:-python3}"
# the Triton kernel tests (a smoke test of this script points it at a cheaper target)
kernel_tests="${KERNEL_TESTS:-tests/general/test_flash_additive.py tests/general/test_local_triton.py}"

# the steps to run (all by default), the CUDA tests, and the extra tiles of step 4
steps=" ${STEPS:-device cuda-tests kernel-tests cuda-bench gpu-kernels compile-time local-kernels} "
cuda_tests="${CUDA_TESTS:-tests}"
tiles="${TILES-}"  # e.g. TILES=multi:16x4,additive:64x64
workers=""
if "$py" -c "import xdist" 2>/dev/null; then  # a worker per core, at most 8
    cores=$(nproc 2>/dev/null || echo 8)
    workers="-n $((cores < 8 ? cores : 8))"
fi

step() {  # step NAME LIMIT_SECONDS COMMAND...   (LIMITS="NAME=SECONDS ..." overrides)
    local name=$1 limit=$2 start=$SECONDS rc item
    shift 2
    [[ "$steps" == *" $name "* ]] || return 0
    for item in ${LIMITS:-}; do
        [ "${item%%=*}" = "$name" ] && limit=${item#*=}
    done
    timeout "$limit" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    local why=""
    [ "$rc" -eq 124 ] && why=" (cut at its limit)"
    printf '%-12s rc=%-3s %4s s of %s s%s\n' "$name" "$rc" "$((SECONDS - start))" "$limit" "$why" |
        tee -a "$out/summary.txt"
}

: >"$out/summary.txt"
step device 20 "$py" -c "
import torch
print('torch', torch.__version__, '| CUDA', torch.version.cuda)
try:
    import triton
    print('triton', triton.__version__)
except ImportError:
    print('triton: not installed')
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(p.name, '|', round(p.total_memory / 2**30), 'GiB |', p.multi_processor_count, 'SMs')
else:
    print('no CUDA device')
"
if [ -f "$out/device.txt" ]; then  # into the summary: 8 files at most come back
    cat "$out/device.txt" >>"$out/summary.txt" && rm "$out/device.txt"
fi
pytest_args="-q -p no:cacheprovider -rfEs --tb=short --durations=10"
step cuda-tests 90 "$py" -m pytest -m cuda $pytest_args $workers $cuda_tests
step kernel-tests 80 "$py" -m pytest $pytest_args $workers $kernel_tests
step cuda-bench 100 "$py" -c "
import sys
sys.argv = ['run.py', '--device', 'cuda', '--quick', '--json', '$out/gpu.json',
            '--cases', '${CUDA_CASES:-}', '--dtypes', '${CUDA_DTYPES:-bf16,fp32}']
sys.path.insert(0, 'benchmarks')
import run, gpu_kernels
gpu_kernels.main = lambda argv: 0  # the kernels are the next step, under their own limit
run.main()
"
# the sides at the default tiles, then any TILES (docs/kernels.md): rows are printed as
# they are measured, so a cut keeps what was measured
step gpu-kernels 150 "$py" benchmarks/gpu_kernels.py --json "$out/gpu-kernels.json" \
    --dtype "${KERNEL_DTYPE:-bf16}" \
    --sides "${KERNEL_SIDES:-triton,triton-half,triton-fused,broadcast,compiled}" --tiles "$tiles"
step compile-time 40 "$py" benchmarks/compile_time.py --device cuda
if [ -f "$out/compile-time.txt" ]; then  # a few lines: into the summary (8 files at most)
    cat "$out/compile-time.txt" >>"$out/summary.txt" && rm "$out/compile-time.txt"
fi
step local-kernels 60 "$py" benchmarks/local_kernels.py
# step 7 (not a default step): appended to the anchors' log (8 files at most come back)
if [[ "$steps" == *" profile "* ]]; then
    start=$SECONDS
    timeout "${PROFILE_LIMIT:-90}" "$py" benchmarks/cuda_profile.py \
        --cases "${PROFILE_CASES:-sdpa,local-m,local-p}" --dtypes "${PROFILE_DTYPES:-bf16}" \
        --python 50 >>"$out/cuda-bench.txt" 2>&1
    printf '%-12s rc=%-3s %4s s of %s s (appended to cuda-bench.txt)\n' profile "$?" \
        "$((SECONDS - start))" "${PROFILE_LIMIT:-90}" | tee -a "$out/summary.txt"
fi
echo "done: $out/summary.txt" | tee -a "$out/summary.txt"
