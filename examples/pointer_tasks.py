"""Train a pointer network (Vinyals et al. 2015) on generated sorting or planar convex-hull
instances on the CPU, then report held-out accuracy with greedy and beam decoding.

Tasks (all data generated from ``--seed``):

* ``sort``: ``--n`` (default 10) numbers uniform in [0, 1); the target is the sequence of
  their indices in ascending order of value (a permutation, no end pointer).
* ``hull``: ``m`` points uniform in the unit square with ``m`` uniform in
  ``[--min-points, --n]`` (default 5..20), padded to ``--n`` points (the padding is masked).
  The target is the vertices of the convex hull (strict vertices: points inside an edge are
  not vertices) in counter-clockwise order, starting with the vertex of lowest index, then
  the end pointer, whose index is ``--n`` (the padded input width). The hull is computed
  exactly by :func:`attnlab.data.pointer_tasks.convex_hull` (Andrew's monotone chain);
the generators and metrics live in :mod:`attnlab.data.pointer_tasks`.

Metrics on ``--eval-size`` held-out instances (from a separate seed stream):

* ``position_accuracy``: the fraction of target steps ``t`` (the end pointer included) at
  which the decoded pointer equals the target pointer (a decoded sequence shorter than the
  target is wrong at the missing steps);
* ``sequence_accuracy``: the fraction of instances decoded exactly (same pointers, same
  length);
* hull only: ``area_coverage`` -- the mean over instances of area(decoded polygon) /
  area(true hull), where the decoded polygon takes the decoded points in decoded order and
  counts 0 when it is not a simple polygon with at least 3 vertices; ``invalid_rate`` --
  the fraction of such failures.

Training: teacher forcing with :func:`attnlab.query.pointer.pointer_loss`, Adam
(``--lr``), gradient-norm clipping, minibatches from a fixed training set of
``--train-size`` instances; it stops at ``--steps``, ``--epochs`` or ``--time-limit``
seconds, whichever comes first, and the learning rate decays along a cosine to 0 over that
budget (``--schedule cosine``).

Each metric is reported for greedy decoding and for beam search (``--beam-width``). A
baseline is reported too: for ``sort`` the input-order copy (``0, 1, ..., n-1``), for
``hull`` the untrained network (same seed, no training step).

Example::

    python examples/pointer_tasks.py --task sort --seed 0 --time-limit 240 --out sort.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

# the generators, the exact hull and the metrics live in the library; imported here so that
# `python examples/pointer_tasks.py` and the tests find them under this module's names too
from attnlab.data.pointer_tasks import (  # noqa: F401
    convex_hull,
    hull_metrics,
    is_simple_polygon,
    make_hull,
    make_pointer_data,
    make_sort,
    polygon_area,
    sequence_metrics,
)
from attnlab.query.pointer import IGNORE_INDEX, PointerNetwork, pointer_loss

# ----------------------------------------------------------------------------- data


def make_data(
    task: str, count: int, args: argparse.Namespace, seed: int
) -> dict[str, torch.Tensor]:
    return make_pointer_data(task, count, args.n, seed, min_points=args.min_points)


@torch.no_grad()
def evaluate(
    model: PointerNetwork,
    data: dict[str, torch.Tensor],
    task: str,
    n: int,
    beam_width: int,
    batch_size: int = 500,
) -> dict[str, dict[str, float]]:
    model.eval()
    greedy, beam = [], []
    for i in range(0, data["x"].shape[0], batch_size):
        x = data["x"][i : i + batch_size]
        lengths = data["lengths"][i : i + batch_size]
        g = model.greedy(x, lengths=lengths, max_steps=data["targets"].shape[1])
        bs = model.beam_search(x, beam_width, lengths=lengths, max_steps=data["targets"].shape[1])
        greedy.append(_pad(g.indices, data["targets"].shape[1]))
        beam.append(_pad(bs.indices[:, 0], data["targets"].shape[1]))
    model.train()
    out = {}
    for name, parts in (("greedy", greedy), (f"beam{beam_width}", beam)):
        pred = torch.cat(parts)
        metrics = sequence_metrics(pred, data["targets"])
        if task == "hull":
            metrics.update(hull_metrics(pred, data, n))
        out[name] = metrics
    return out


def _pad(idx: torch.Tensor, width: int) -> torch.Tensor:
    out = torch.full((idx.shape[0], max(width, idx.shape[1])), IGNORE_INDEX, dtype=torch.long)
    out[:, : idx.shape[1]] = idx
    return out


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=("sort", "hull"), required=True)
    p.add_argument("--n", type=int, default=None, help="numbers to sort (10) / max points (20)")
    p.add_argument("--min-points", type=int, default=5, help="hull: fewest points (5)")
    p.add_argument("--hidden", type=int, default=128, help="LSTM hidden size")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--clip", type=float, default=2.0, help="gradient-norm clipping")
    p.add_argument(
        "--schedule",
        choices=("cosine", "constant"),
        default="cosine",
        help="learning rate: cosine decay to 0 over the budget (the binding one of "
        "--time-limit and --steps/--epochs), or constant",
    )
    p.add_argument("--train-size", type=int, default=100_000, help="training instances")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training set")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps (upper bound)")
    p.add_argument("--time-limit", type=float, default=300.0, help="training seconds (bound)")
    p.add_argument("--eval-size", type=int, default=1000)
    p.add_argument("--beam-width", type=int, default=5)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest for this small model)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=500)
    p.add_argument("--out", type=str, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.n is None:
        args.n = 10 if args.task == "sort" else 20
    if args.task == "hull" and not 3 <= args.min_points <= args.n:
        p.error(f"--min-points must lie in [3, --n={args.n}]")
    if args.n < 1 or args.train_size < 1 or args.eval_size < 1 or args.batch_size < 1:
        p.error("--n, --train-size, --eval-size and --batch-size must be positive")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = time.perf_counter()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train = make_data(args.task, args.train_size, args, seed=args.seed)
    test = make_data(args.task, args.eval_size, args, seed=args.seed + 1_000_003)
    t_data = time.perf_counter() - t_start

    model = PointerNetwork(
        d_in=1 if args.task == "sort" else 2, d_hidden=args.hidden, eos=args.task == "hull"
    )
    results: dict[str, Any] = {"task": args.task, "config": vars(args)}
    if args.task == "sort":
        identity = torch.arange(args.n).expand(args.eval_size, args.n)
        results["baseline"] = {
            "name": "input-order copy",
            **sequence_metrics(identity, test["targets"]),
        }
    else:
        results["baseline"] = {
            "name": "untrained network (greedy)",
            **evaluate(model, test, args.task, args.n, 1)["greedy"],
        }

    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    max_steps = args.steps if args.steps is not None else math.inf
    if args.epochs is not None:
        max_steps = min(max_steps, math.ceil(args.epochs * args.train_size / args.batch_size))
    step, seen, loss_avg = 0, 0, None
    perm = torch.randperm(args.train_size, generator=gen)
    cursor = 0
    t0 = time.perf_counter()
    while step < max_steps and time.perf_counter() - t0 < args.time_limit:
        if cursor + args.batch_size > args.train_size:
            perm, cursor = torch.randperm(args.train_size, generator=gen), 0
        idx = perm[cursor : cursor + args.batch_size]
        cursor += args.batch_size
        if args.schedule == "cosine":
            done = max((time.perf_counter() - t0) / args.time_limit, step / max_steps)
            for group in opt.param_groups:
                group["lr"] = args.lr * 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
        x, tgt, lengths = train["x"][idx], train["targets"][idx], train["lengths"][idx]
        width = int((tgt != IGNORE_INDEX).sum(1).max())
        tgt = tgt[:, :width]
        out = model(x, tgt, lengths=lengths)
        loss = pointer_loss(out.log_probs, tgt)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        seen += len(idx)
        value = float(loss.detach())
        loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
        if args.log_every and step % args.log_every == 0:
            print(
                f"step {step:6d}  loss {loss_avg:.4f}  {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
    t_train = time.perf_counter() - t0

    t1 = time.perf_counter()
    metrics = evaluate(model, test, args.task, args.n, args.beam_width)
    t_eval = time.perf_counter() - t1
    results.update(
        {
            "train": {
                "steps": step,
                "examples_seen": seen,
                "epochs": seen / args.train_size,
                "final_loss_ema": loss_avg,
            },
            "eval": metrics,
            "wall_seconds": {
                "data": round(t_data, 2),
                "train": round(t_train, 2),
                "eval": round(t_eval, 2),
                "total": round(time.perf_counter() - t_start, 2),
            },
            "environment": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "command": " ".join(["python", *sys.argv]) if argv is None else None,
            },
        }
    )
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n", encoding="utf-8")
    return results


if __name__ == "__main__":
    main()
