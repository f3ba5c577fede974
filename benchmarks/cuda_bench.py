"""GPU benchmarks of issue 12: attnlab's paths against the CUDA anchors, side by side in
one process (``benchmarks/run.py --device cuda`` runs this, then
``benchmarks/gpu_kernels.py`` for the additive / multi-dimensional cases).

Cases (forward + backward, bf16 and fp32; median of CUDA-synchronised repeats; peak CUDA
memory of one step above the inputs, ``torch.cuda.max_memory_allocated``):

* ``sdpa``: ``Attention(score="scaled-dot")``, B=16, n=4096, d=64, vs
  ``F.scaled_dot_product_attention`` on ``[B, 1, n, d]``; target <= 1.05x.
* ``mha-causal``: ``MultiHeadAttention(causal=True)``, B=4, n=8192, d=1024, h=16, vs
  ``nn.MultiheadAttention`` with ``is_causal=True`` (same weights); target <= 1.05x.
* ``mha``: the same without the causal mask; target <= 1.0x.
* ``local-m`` / ``local-p``: B=4, n=16384, D=8, d=64, vs FlexAttention's sliding window
  over the same 17 keys (compiled); target <= 1.0x. Also informational: full SDPA over
  all keys.

``--tiny`` runs toy sizes (checks the code only; on CPU the FlexAttention anchor, which
has no CPU backward, is left out).
"""

from __future__ import annotations

import math
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from _harness import error_line
from torch import Tensor, nn

from attnlab import Attention
from attnlab.query.multi_head import MultiHeadAttention

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CASE_NAMES = ("sdpa", "mha-causal", "mha", "local-m", "local-p")


@dataclass
class Side:
    name: str
    step: Callable[[], None]


@dataclass
class Case:
    name: str
    config: str
    target: float | None  # attnlab / anchor at most this (None: informational)
    sides: list[Side] = field(default_factory=list)


@dataclass
class Result:
    case: str
    dtype: str
    side: str
    config: str
    ms: float
    peak_mib: float | None
    ratio: float | None  # attnlab / this side
    target: float | None
    error: str = ""  # the side raised: its exception, and no timing
    first_ms: float | None = None  # the first call (compiling included), not in ``ms``


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step(fn: Callable[[], Tensor], leaves: list[Tensor]) -> Callable[[], None]:
    def step() -> None:
        for t in leaves:
            t.grad = None
        fn().float().sum().backward()

    return step


def _leaf(shape: tuple[int, ...], dtype: torch.dtype, device: str, g: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=g, device=device).to(dtype).requires_grad_()


def _params(m: nn.Module) -> list[Tensor]:
    return list(m.parameters())


def build_cases(device: str, dtype: torch.dtype, tiny: bool) -> list[Case]:
    g = torch.Generator(device=device).manual_seed(0)
    cases = []
    # ---- scaled-dot vs SDPA on the 4-D layout
    B, n, d = (2, 64, 16) if tiny else (16, 4096, 64)
    q, k, v = (_leaf((B, n, d), dtype, device, g) for _ in range(3))
    attn = Attention("scaled-dot").to(device)
    case = Case("sdpa", f"B={B} n={n} d={d}", 1.05)
    case.sides.append(Side("attnlab", _step(lambda: attn(q, k, v).context, [q, k, v])))
    case.sides.append(
        Side(
            "SDPA [B,1,n,d]",
            _step(
                lambda: F.scaled_dot_product_attention(
                    q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
                ).squeeze(1),
                [q, k, v],
            ),
        )
    )
    cases.append(case)
    # ---- multi-head, causal and not, vs nn.MultiheadAttention
    B, n, E, h = (2, 32, 32, 4) if tiny else (4, 8192, 1024, 16)
    cmask = nn.Transformer.generate_square_subsequent_mask(n, device=device, dtype=dtype)
    for causal in (True, False):
        ref = nn.MultiheadAttention(E, h, batch_first=True).to(device=device, dtype=dtype)
        ours = MultiHeadAttention.from_torch(ref)
        x = _leaf((B, n, E), dtype, device, g)

        def mine(causal: bool = causal, ours: nn.Module = ours, x: Tensor = x) -> Tensor:
            return ours(x, causal=causal).context

        def theirs(causal: bool = causal, ref: nn.Module = ref, x: Tensor = x) -> Tensor:
            if causal:
                return ref(x, x, x, attn_mask=cmask, is_causal=True, need_weights=False)[0]
            return ref(x, x, x, need_weights=False)[0]

        name = "mha-causal" if causal else "mha"
        case = Case(name, f"B={B} n={n} d={E} h={h}", 1.05 if causal else 1.0)
        anchor = "nn.MultiheadAttention" + ("(is_causal=True)" if causal else "")
        case.sides.append(Side("attnlab", _step(mine, [x, *_params(ours)])))
        case.sides.append(Side(anchor, _step(theirs, [x, *_params(ref)])))
        cases.append(case)
    # ---- local-m / local-p vs FlexAttention's sliding window over the same keys
    B, n, d, D = (1, 64, 16, 2) if tiny else (4, 16384, 64, 8)
    q, k, v = (_leaf((B, n, d), dtype, device, g) for _ in range(3))
    flex_side = None
    if device == "cuda":
        flex_name = f"FlexAttention window ({2 * D + 1} keys)"
        try:
            flex_fn = _flex_window(q, k, v, D)
            flex_side = Side(flex_name, _step(flex_fn, [q, k, v]))
        except Exception as err:  # the row shows it; the other sides still run
            flex_side = Side(flex_name, _raiser(err))
    for align, score in (("local-m", "scaled-dot"), ("local-p", "general")):
        kw = {"d_q": d, "d_k": d} if score == "general" else {"d_q": d}
        mod = Attention(score, align, D=D, **kw).to(device=device, dtype=dtype)
        case = Case(align, f"B={B} n={n} D={D} d={d} ({score})", 1.0)
        case.sides.append(
            Side("attnlab", _step(lambda m=mod: m(q, k, v).context, [q, k, v, *_params(mod)]))
        )
        if flex_side is not None:
            case.sides.append(flex_side)
        case.sides.append(
            Side(
                "SDPA over all keys (informational)",
                _step(
                    lambda: F.scaled_dot_product_attention(
                        q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
                    ).squeeze(1),
                    [q, k, v],
                ),
            )
        )
        cases.append(case)
    return cases


def _flex_window(q: Tensor, k: Tensor, v: Tensor, D: int) -> Callable[[], Tensor]:
    """FlexAttention (compiled) over the keys within ``D`` positions of each query."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n = q.shape[1]
    flex = torch.compile(flex_attention, dynamic=False)
    block = create_block_mask(
        lambda b, hh, qi, ki: (qi - ki).abs() <= D, None, None, n, n, device=q.device
    )

    def flex_fn() -> Tensor:
        return flex(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), block_mask=block).squeeze(1)

    return flex_fn


def _raiser(err: Exception) -> Callable[[], None]:
    def step() -> None:
        raise err

    return step


def _time(step: Callable[[], None], device: str, repeats: int, warmup: int) -> tuple[float, float]:
    """``(median ms, ms of the first call)``: the first call holds any compiling."""
    _sync(device)
    t0 = time.perf_counter()
    step()
    _sync(device)
    first = (time.perf_counter() - t0) * 1e3
    for _ in range(warmup - 1):
        step()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, first


def _peak(step: Callable[[], None], device: str) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def run(
    device: str = "cuda",
    dtypes: tuple[str, ...] = ("bf16", "fp32"),
    tiny: bool = False,
    repeats: int = 20,
    warmup: int = 3,
    only: list[str] | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Every case in every dtype; the sides of a case are timed in turn in this process.

    ``on_result`` sees each row as soon as its case is measured (a run cut by a time limit
    keeps what it measured). A side that raises is a row with ``error`` set, and the other
    sides and cases still run."""
    results = []
    for dt in dtypes:
        for case in build_cases(device, DTYPES[dt], tiny):
            if only and case.name not in only:
                continue
            ms: dict[str, float] = {}
            first: dict[str, float] = {}
            errors: dict[str, str] = {}
            for side in case.sides:
                try:
                    ms[side.name], first[side.name] = _time(
                        side.step, device, repeats, max(warmup, 1)
                    )
                except Exception as err:  # reported in the row
                    traceback.print_exc()
                    errors[side.name] = error_line(err)
            mine = ms.get("attnlab", math.nan)
            for side in case.sides:
                ok = side.name in ms
                r = Result(
                    case.name,
                    dt,
                    side.name,
                    case.config,
                    ms.get(side.name, math.nan),
                    _peak(side.step, device) if ok else None,
                    None if side.name == "attnlab" or not ok else mine / ms[side.name],
                    None if side.name == "attnlab" else case.target,
                    errors.get(side.name, ""),
                    first.get(side.name),
                )
                results.append(r)
                if on_result is not None:
                    on_result(r)
    return results


TABLE_HEAD = (
    "| case | dtype | side | config | fwd+bwd ms | peak MiB | attnlab / side | target "
    "| first call s |\n|" + " --- |" * 9
)


def format_row(r: Result) -> str:
    """One table row; a side that raised shows its error in place of the timing."""
    peak = "" if r.peak_mib is None else f"{r.peak_mib:.0f}"
    ratio = "" if r.ratio is None or not math.isfinite(r.ratio) else f"{r.ratio:.2f}x"
    target = "" if r.target is None or "informational" in r.side else f"<= {r.target}x"
    ms = f"error: {r.error}" if r.error else f"{r.ms:.2f}"
    first = "" if r.first_ms is None else f"{r.first_ms / 1e3:.2f}"
    return (
        f"| {r.case} | {r.dtype} | {r.side} | {r.config} | {ms} | {peak} | {ratio} | {target} "
        f"| {first} |"
    )


def format_table(results: list[Result]) -> str:
    return "\n".join([TABLE_HEAD, *(format_row(r) for r in results)])
