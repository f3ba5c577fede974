"""The Transformer variants against full multi-head attention, in one run: cost and quality.

    .venv/bin/python benchmarks/variants.py                 # cost + quality
    .venv/bin/python benchmarks/variants.py --quick         # smaller sizes, fewer steps
    .venv/bin/python benchmarks/variants.py --only cost     # or: --only quality
    .venv/bin/python benchmarks/variants.py --lengths 512 1024 --json out.json
    .venv/bin/python benchmarks/variants.py --report out.json   # re-print saved tables

Everything is reported, nothing is asserted. Torch runs one thread (``--threads``).

**Cost.** For every mechanism (``mechanisms()``) and sequence length ``n`` (default 512,
1024, 2048, 4096; ``--quick``: 256, 512, 1024), one self-attention forward + backward at
B=2, d_model=64, 4 heads, float32 runs in a *fresh process*: first once for the peak
memory (the RSS high-water mark, reset just before the step, minus the RSS before it;
``_harness.measure_peak``), then for the time (median of 3 repeats, ``--quick`` 2, after a
warm-up). Two tables (time, memory) give each ``n``, the fitted log-log slope against
``n`` (2 = quadratic, 1 = linear) and the ratio of the last doubling (4 = quadratic, 2 =
linear): the check of each module's cost claim. "full (sdpa)" is multi-head attention on
PyTorch's fused kernel, "full (explicit)" the same attention with the score matrix
materialised (``path="explicit"``).

**Quality.** A 1-layer pre-norm encoder (:class:`attnlab.query.transformer.
TransformerEncoderLayer`, d_model=32, 2 heads, the attention swapped by config) is trained
with Adam (lr 3e-3, 64 sequences a step; 300 steps at n=64, ``--quick`` 200 at n=32) on
two generated long-range tasks and evaluated on 2,000 fresh sequences; "none" (an
attention that mixes nothing: the feed-forward block only) is the chance baseline:

* ``copy-first``: ``n - 1`` random tokens (vocabulary 8) then a query token; answer: the
  *first* token, ``n - 1`` positions back (retrieval by position).
* ``flag-recall``: the same, with one random position flagged (a flag embedding is
  added); answer: the flagged token (retrieval by content).

Reformer uses ``bucket_size = n / 4`` and Linformer ``k = n / 4`` there. The same
functions drive the learning tests of ``tests/query/test_*.py`` (at n = 32).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as H  # noqa: E402

from attnlab.output import AttentionOutput  # noqa: E402
from attnlab.query.transformer import TransformerEncoderLayer  # noqa: E402

# --------------------------------------------------------------------------- mechanisms

D_MODEL, HEADS, BATCH = 64, 4, 2


def mechanisms(n: int, *, bucket_size: int = 64, proj_len: int = 128) -> dict[str, dict]:
    """label -> attention config for sequences of length ``n``."""
    return {
        "full (sdpa)": {"name": "multi-head"},
        "full (explicit)": {"name": "multi-head", "path": "explicit"},
        "transformer-xl": {"name": "transformer-xl"},
        "reformer": {"name": "reformer", "bucket_size": bucket_size, "n_hashes": 2},
        "linformer": {"name": "linformer", "max_len": n, "proj_len": proj_len},
        "synth-dense": {"name": "synthesizer", "mode": "dense", "max_len": n},
        "synth-random": {"name": "synthesizer", "mode": "random", "max_len": n},
        "synth-fact-dense": {"name": "synthesizer", "mode": "factorized-dense", "max_len": n},
        "synth-fact-random": {"name": "synthesizer", "mode": "factorized-random", "max_len": n},
    }


class NoAttention(nn.Module):
    """The baseline: an 'attention' that mixes nothing (a zero context), so a layer is
    its feed-forward block only."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model

    def forward(
        self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None, **_: Any
    ) -> AttentionOutput:
        return AttentionOutput(torch.zeros_like(query), path="none")


# --------------------------------------------------------------------------- tasks

TASKS = ("copy-first", "flag-recall")


def make_batch(
    task: str, batch: int, n: int, vocab: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """``(tokens [B, n], flags [B, n], labels [B])``: ``n - 1`` random tokens in
    ``[0, vocab)`` then the query token ``vocab``; ``flags`` marks one random position
    (all zero for ``copy-first``); the label is the first token (``copy-first``) or the
    flagged one (``flag-recall``)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    tokens = torch.randint(0, vocab, (batch, n), generator=generator)
    tokens[:, -1] = vocab
    flags = torch.zeros(batch, n, dtype=torch.long)
    rows = torch.arange(batch)
    if task == "copy-first":
        labels = tokens[:, 0].clone()
    else:
        where = torch.randint(0, n - 1, (batch,), generator=generator)
        flags[rows, where] = 1
        labels = tokens[rows, where]
    return tokens, flags, labels


class TinyModel(nn.Module):
    """Embeddings (token + flag + learned absolute position unless the attention brings
    its own relative positions), ``layers`` pre-norm encoder layers, a classifier read at
    the last (query) position."""

    def __init__(
        self,
        attention: str | dict | None,
        n: int,
        vocab: int,
        *,
        d_model: int = 32,
        heads: int = 2,
        layers: int = 1,
    ) -> None:
        super().__init__()
        name = attention.get("name") if isinstance(attention, dict) else attention
        self.tok = nn.Embedding(vocab + 1, d_model)
        self.flag = nn.Embedding(2, d_model)
        self.pos = None if name == "transformer-xl" else nn.Embedding(n, d_model)
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(
                d_model,
                heads,
                attention=NoAttention(d_model) if attention is None else attention,
                dim_feedforward=2 * d_model,
                dropout=0.0,
                norm_first=True,
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: Tensor, flags: Tensor) -> Tensor:
        x = self.tok(tokens) + self.flag(flags)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x).context
        return self.head(self.norm(x[:, -1]))


def train_and_eval(
    attention: str | dict | None,
    task: str,
    *,
    n: int = 32,
    vocab: int = 8,
    steps: int = 300,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    d_model: int = 32,
    heads: int = 2,
    layers: int = 1,
    eval_size: int = 2000,
) -> float:
    """Train a :class:`TinyModel` with ``attention`` (``None``: no attention) on ``task``
    and return its accuracy on ``eval_size`` fresh sequences (chance: ``1 / vocab``)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = TinyModel(attention, n, vocab, d_model=d_model, heads=heads, layers=layers)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        tokens, flags, labels = make_batch(task, batch, n, vocab, gen)
        loss = nn.functional.cross_entropy(model(tokens, flags), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    eval_gen = torch.Generator().manual_seed(10_000 + seed)
    tokens, flags, labels = make_batch(task, eval_size, n, vocab, eval_gen)
    with torch.no_grad():
        return (model(tokens, flags).argmax(-1) == labels).float().mean().item()


# --------------------------------------------------------------------------- cost


def _build(label: str, n: int) -> nn.Module:
    import attnlab

    cfg = {"kind": "query", "d_model": D_MODEL, "num_heads": HEADS, **mechanisms(n)[label]}
    return attnlab.build(cfg)


def cost_child(label: str, n: int, repeats: int, threads: int) -> dict:
    """Runs in a fresh process: peak memory of one forward + backward, then its time."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    module = _build(label, n)
    x = torch.randn(BATCH, n, D_MODEL, requires_grad=True)

    def step() -> None:
        module(x).context.sum().backward()
        x.grad = None
        module.zero_grad(set_to_none=True)

    mem = H.measure_peak(step)
    times = H.time_alone(step, repeats, warmup=1)
    return {"label": label, "n": n, "time_ms": H.median_ms(times), "times": H.spread(times), **mem}


def run_cost(lengths: list[int], repeats: int, threads: int, labels: list[str]) -> list[dict]:
    results = []
    for n in lengths:
        for label in labels:
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--cost-child",
                label,
                str(n),
                "--repeats",
                str(repeats),
                "--threads",
                str(threads),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                print(f"[cost] {label} n={n} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                results.append({"label": label, "n": n, "error": proc.stderr[-300:]})
                continue
            r = json.loads(lines[-1])
            results.append(r)
            print(
                f"[cost] {label:18s} n={n:5d}  {r['time_ms']:9.1f} ms  "
                f"{r['increment_mib']:8.1f} MiB",
                file=sys.stderr,
                flush=True,
            )
    return results


def _slope(points: list[tuple[int, float]]) -> float | None:
    pts = [(n, v) for n, v in points if v and v > 0]
    if len(pts) < 2:
        return None
    return H.fit_exponent([p[0] for p in pts], [p[1] for p in pts])


def _memory_mib(r: dict) -> float:
    # VmHWM reset just before the step has no floor from the imports; ru_maxrss otherwise
    hwm = r.get("hwm_increment_mib")
    return r["increment_mib"] if hwm is None else hwm


def cost_tables(results: list[dict], lengths: list[int], labels: list[str]) -> str:
    """Two tables (time, memory): one column per ``n``, the fitted log-log slope over all
    points (2 = quadratic, 1 = linear) and the ratio of the last doubling of ``n``
    (4 = quadratic, 2 = linear)."""
    by = {(r["label"], r["n"]): r for r in results}
    out = []
    for what, unit, get in (
        ("time", "ms", lambda r: r["time_ms"]),
        ("peak memory increment", "MiB", _memory_mib),
    ):
        head = ["mechanism"] + [f"n={n}" for n in lengths] + ["slope", "last x2"]
        rows = []
        for label in labels:
            cells, pts = [label], []
            for n in lengths:
                r = by.get((label, n))
                if r is None or "error" in r:
                    cells.append("failed")
                    continue
                v = get(r)
                cells.append(f"{v:.0f} {unit}" if v >= 10 else f"{v:.1f} {unit}")
                pts.append((n, v))
            slope = _slope(pts)
            last = (
                pts[-1][1] / pts[-2][1]
                if len(pts) >= 2 and pts[-2][1] > 0 and pts[-1][0] == 2 * pts[-2][0]
                else None
            )
            cells += [
                "-" if slope is None else f"{slope:.2f}",
                "-" if last is None else f"{last:.1f}",
            ]
            rows.append(cells)
        out.append(f"{what}:\n\n" + _table(head, rows))
    return "\n\n".join(out)


# --------------------------------------------------------------------------- quality


def quality_settings(quick: bool) -> dict:
    if quick:
        return {"n": 32, "steps": 200, "vocab": 8, "d_model": 32, "heads": 2}
    return {"n": 64, "steps": 300, "vocab": 8, "d_model": 32, "heads": 2}


def quality_mechanisms(n: int) -> dict[str, dict | None]:
    m = mechanisms(n, bucket_size=n // 4, proj_len=n // 4)
    m.pop("full (explicit)")  # the same numbers as "full (sdpa)"
    return {"none (baseline)": None, **m}


def run_quality(quick: bool, labels: list[str] | None = None) -> list[dict]:
    s = quality_settings(quick)
    mechs = quality_mechanisms(s["n"])
    out = []
    for task in TASKS:
        for label, cfg in mechs.items():
            if labels and label not in labels:
                continue
            t0 = time.perf_counter()
            acc = train_and_eval(
                cfg,
                task,
                n=s["n"],
                steps=s["steps"],
                vocab=s["vocab"],
                d_model=s["d_model"],
                heads=s["heads"],
            )
            dt = time.perf_counter() - t0
            out.append({"task": task, "label": label, "accuracy": acc, "seconds": dt})
            print(
                f"[quality] {task:11s} {label:18s} acc {acc:.3f}  ({dt:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return out


def quality_table(results: list[dict]) -> str:
    labels = list(dict.fromkeys(r["label"] for r in results))
    by = {(r["task"], r["label"]): r for r in results}
    head = ["mechanism"] + [f"{t} acc" for t in TASKS] + ["train s"]
    rows = []
    for label in labels:
        cells = [label]
        secs = 0.0
        for t in TASKS:
            r = by.get((t, label))
            cells.append("-" if r is None else f"{r['accuracy']:.3f}")
            secs += 0 if r is None else r["seconds"]
        cells.append(f"{secs:.0f}")
        rows.append(cells)
    return _table(head, rows)


# --------------------------------------------------------------------------- output


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in rows)]
    )


def print_report(report: dict) -> None:
    """Print the tables of a report (a fresh run, or one loaded with ``--report``)."""
    info = report["machine"]
    print(f"# Transformer variants vs full attention ({report.get('mode', 'full')} run)")
    print(H.describe_machine(info))
    if "cost" in report:
        results = report["cost"]
        lengths = sorted({r["n"] for r in results})
        labels = list(dict.fromkeys(r["label"] for r in results))
        print(
            f"\n## Cost: forward + backward, B={BATCH}, d_model={D_MODEL}, heads={HEADS}, "
            f"float32, {info['torch_threads']} thread(s); time: median of "
            f"{report.get('repeats', 3)} after a warm-up; memory: peak RSS increment of one "
            "step in a fresh process\n"
        )
        print(cost_tables(results, lengths, labels))
    if "quality" in report:
        s = report.get("quality_settings", quality_settings(report.get("mode") == "quick"))
        print(
            f"\n## Quality: 1-layer pre-norm encoder, d_model={s['d_model']}, heads={s['heads']}, "
            f"n={s['n']}, vocab={s['vocab']} (chance {1 / s['vocab']:.3f}), {s['steps']} Adam "
            "steps of 64 sequences, accuracy on 2,000 fresh sequences\n"
        )
        print(quality_table(report["quality"]))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer steps")
    ap.add_argument("--only", choices=("cost", "quality"), help="run one part")
    ap.add_argument("--lengths", type=int, nargs="+", help="sequence lengths of the cost part")
    ap.add_argument("--mechanisms", nargs="+", help="labels to run (default: all)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per point")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    ap.add_argument("--report", type=Path, nargs="+", help="print the tables of saved JSON files")
    ap.add_argument("--cost-child", nargs=2, metavar=("LABEL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.cost_child:
        label, n = args.cost_child[0], int(args.cost_child[1])
        print(json.dumps(cost_child(label, n, args.repeats or 3, args.threads)), flush=True)
        return {}
    if args.report:
        report: dict[str, Any] = {}
        for path in args.report:  # later files add their parts (e.g. cost, then quality)
            report.update(json.loads(path.read_text()))
        print_report(report)
        return report

    torch.set_num_threads(args.threads)
    lengths = args.lengths or ([256, 512, 1024] if args.quick else [512, 1024, 2048, 4096])
    repeats = args.repeats or (2 if args.quick else 3)
    labels = args.mechanisms or list(mechanisms(8))
    report = {
        "machine": H.machine(),
        "argv": sys.argv[1:] if argv is None else argv,
        "mode": "quick" if args.quick else "full",
        "repeats": repeats,
    }
    if args.only in (None, "cost"):
        report["cost"] = run_cost(lengths, repeats, args.threads, labels)
    if args.only in (None, "quality"):
        report["quality_settings"] = quality_settings(args.quick)
        qlabels = None if args.mechanisms is None else ["none (baseline)", *args.mechanisms]
        report["quality"] = run_quality(args.quick, qlabels)
    report["machine_after"] = H.machine()  # the load average at the end
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
