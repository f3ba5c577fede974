"""Cold compile time of ``torch.compile(Attention(score="additive"), fullgraph=True)``
(issue 12's target: under 30 s on a GPU).

    python benchmarks/compile_time.py                 # CUDA when available, else CPU
    python benchmarks/compile_time.py --device cpu --dim multi

Every cache starts empty: ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` point into
a fresh temporary folder (removed when the process ends) and inductor's FX-graph and
autograd caches are off, all set before torch is imported. Printed: the first forward
call, the first backward call, their sum, the same calls once more (warm), dynamo's graph
and break counts, and the largest difference from the eager module on the same inputs
(forward and the input gradients).
Exits 1 when the module does not compile with ``fullgraph=True`` or disagrees with eager.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time

_CACHE = tempfile.mkdtemp(prefix="attnlab-compile-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)  # the caches go with the process
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_CACHE, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_CACHE, "triton")
os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"

import torch  # noqa: E402  (the cache variables must be set first)

from attnlab import Attention  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--dim", choices=["single", "multi"], default="single")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--n", type=int, default=5, help="keys per row (queries: n - 2)")
    ap.add_argument("--d", type=int, default=4, help="feature size of q, k and v")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing measured")
        return 0
    g = torch.Generator().manual_seed(0)
    B, n, d = args.batch, args.n, args.d
    attn = Attention("additive", dim=args.dim, d_q=d, d_k=d).to(device)
    shapes = [(B, max(n - 2, 1), d), (B, n, d), (B, n, d)]
    q, k, v = (torch.randn(s, generator=g).to(device).requires_grad_() for s in shapes)
    print(f"torch {torch.__version__} on {device}; Attention('additive', dim={args.dim!r})")
    path, reason = attn.explain(n_k=n, device=device)
    print(f"path: {path} ({reason})")

    explained = torch._dynamo.explain(attn)(q, k, v)
    print(f"dynamo: {explained.graph_count} graph(s), {explained.graph_break_count} break(s)")
    torch._dynamo.reset()

    compiled = torch.compile(attn, fullgraph=True)
    times = []
    for _ in range(2):  # cold, then warm
        t0 = time.perf_counter()
        out = compiled(q, k, v).context
        _sync(device)
        t1 = time.perf_counter()
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        _sync(device)
        times.append((t1 - t0, time.perf_counter() - t1))
    (fwd, bwd), (wfwd, wbwd) = times
    print(f"first forward {fwd:.1f} s, first backward {bwd:.1f} s: {fwd + bwd:.1f} s cold")
    print(f"warm: forward {wfwd * 1e3:.1f} ms, backward {wbwd * 1e3:.1f} ms")

    ref = attn(q, k, v).context
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip((out, *grads), (ref, *ref_grads), strict=True)
    )
    print(f"max |compiled - eager| over the output and input gradients: {diff:.1e}")
    ok = explained.graph_break_count == 0 and diff <= 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
