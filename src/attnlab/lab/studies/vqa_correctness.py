"""``attnlab correctness RUN_DIR``: attention correctness of a VQA run on easy-VQA.

Loads a finished ``vqa`` run, computes the model's region weights and answers on a split
(one forward pass), places each question's gold region (its image's shape) on the model's
``g x g`` grid and hands everything to
:func:`~attnlab.evaluation.vqa_correctness.correctness_summary`: attention mass inside the
shape, mass on the touched cells, Spearman's rho and the pointing game, for the model's
maps and for uniform and random reference maps (the measures and their definitions are in
:mod:`attnlab.evaluation.vqa_correctness`). Results go to ``RUN_DIR/correctness.json``
(NaN as null).

Cost: one forward pass over the split, plus O(R log R) per question for the ranks.

Sources: C. Liu, J. Mao, F. Sha and A. Yuille, "Attention Correctness in Neural Image
Captioning", AAAI 2017; A. Das, H. Agrawal, C. L. Zitnick, D. Parikh and D. Batra, "Human
Attention in Visual Question Answering: Do Humans and Deep Networks Look at the Same
Regions?", EMNLP 2016.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab._checks import check_optional_int, check_path
from attnlab.evaluation.vqa_correctness import (
    MAPS,
    METRICS,
    check_alpha,
    correctness_summary,
    region_fractions,
)
from attnlab.lab.errors import failing_on
from attnlab.lab.files import write_json
from attnlab.lab.training import load_run

__all__ = ["correctness_command", "format_table", "vqa_correctness"]


def _forward_weights(
    task: Any, data: Any, model: torch.nn.Module, split: str, limit: int | None, batch_size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(rows, region_weights [N, R], predictions [N])`` of the split's first ``limit``
    questions (rows = the questions' indices in the split)."""
    device = next(model.parameters()).device
    rows, weights, preds = [], [], []
    seen = 0
    with torch.no_grad():
        for batch in task.batches(data, split, batch_size):
            if limit is not None and seen >= limit:
                break
            keep = (
                len(batch["labels"]) if limit is None else min(len(batch["labels"]), limit - seen)
            )
            out = model(
                batch["images"].to(device),
                batch["tokens"][:keep].to(device),
                batch["lengths"][:keep].to(device),
                image_index=batch["image_index"][:keep].to(device),
            )
            rows.append(batch["index"][:keep].cpu())
            weights.append(out.region_weights.detach().double().cpu())
            preds.append(out.logits.argmax(-1).cpu())
            seen += keep
    if not rows:
        return np.zeros(0, np.int64), np.zeros((0, 0)), np.zeros(0, np.int64)
    return (
        torch.cat(rows).numpy(),
        torch.cat(weights).numpy(),
        torch.cat(preds).numpy(),
    )


def _check_max_questions(max_questions: int | None) -> None:
    check_optional_int(max_questions, "max_questions", error=ValueError)


def _run_label(run_dir: str | Path) -> str | None:
    """The ``label`` of the run's ``run.json`` (None when it cannot be read)."""
    try:
        info = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info.get("label")


def vqa_correctness(
    run_dir: str | Path,
    split: str = "test",
    *,
    max_questions: int | None = None,
    seed: int = 0,
    alpha: float = 1.0,
    batch_size: int = 256,
    device: str = "cpu",
    write: bool = True,
) -> dict[str, Any]:
    """Attention correctness of a finished ``vqa`` run (see the module docstring).

    Args:
        run_dir: a run directory of the ``vqa`` task (:func:`~attnlab.lab.training.train_run`).
        split: ``"test"`` (default), ``"dev"`` or ``"train"``.
        max_questions: only the split's first ``max_questions`` questions (None = all).
        seed: seed of the random Dirichlet reference maps.
        alpha: concentration of the Dirichlet reference (1 = uniform over the simplex).
        batch_size: questions per forward pass.
        device: where the model runs.
        write: write the result to ``RUN_DIR/correctness.json``.

    Returns a dict: ``run_dir``, ``task``, ``label``, ``split``, ``questions``, ``grid``,
    and the figures of :func:`~attnlab.evaluation.vqa_correctness.correctness_summary`
    (``accuracy``, ``accuracy_by_type``, ``model_is_uniform``, ``region``, ``maps``,
    ``spread``, ``lift``, ``reference``). NaN is written as null in the JSON file.
    """
    run_dir = check_path(run_dir, "run_dir")
    _check_max_questions(max_questions)
    check_alpha(alpha)
    task, data, model = load_run(run_dir, device=device)
    if getattr(task, "name", None) not in (None, "vqa"):
        raise ValueError(
            f"run {str(run_dir)!r} is a {task.name!r} run; attention correctness needs a 'vqa' "
            "run (region weights over an image grid)"
        )
    part = data.split(split)
    model.eval()
    rows, weights, preds = _forward_weights(task, data, model, split, max_questions, batch_size)
    n = len(rows)
    if n == 0:
        raise ValueError(f"the {split} split of {str(run_dir)!r} has no questions")
    R = weights.shape[1]
    g = int(getattr(model, "grid", 0)) or math.isqrt(R)
    if g * g != R:
        raise ValueError(f"the model gives {R} region weights, not a square grid")

    index = torch.as_tensor(rows)
    used, inverse = np.unique(part.image_index[index].numpy(), return_inverse=True)
    fractions = region_fractions(part.images[torch.as_tensor(used)], (g, g))[inverse]  # [N, R]
    correct = preds == part.labels[index].numpy()
    types = [part.types[i] for i in rows]
    result = {
        "run_dir": str(run_dir),
        "task": getattr(task, "name", None),
        "label": _run_label(run_dir),
        "split": split,
        "questions": n,
        "grid": [g, g],
        **correctness_summary(weights, fractions, correct, types, seed=seed, alpha=alpha),
    }
    if write:
        write_json(Path(run_dir) / "correctness.json", result)
    return result


def _cell(s: Mapping[str, Any]) -> str:
    if not s["n"]:
        return "     --      "
    return f"{s['mean']:.3f} ± {s['std']:.3f}"


def format_table(result: Mapping[str, Any]) -> str:
    """A short text table of :func:`vqa_correctness`'s result."""
    maps = result["maps"]
    head = f"{'':22s}" + "".join(f"{m:>16s}" for m in METRICS)
    lines = [
        f"{result.get('label') or result['run_dir']}: {result['questions']} {result['split']} "
        f"questions, accuracy {result['accuracy']:.3f}, grid "
        f"{result['grid'][0]}x{result['grid'][1]}, region area "
        f"{result['region']['area']['mean']:.3f} (cells touched "
        f"{result['region']['touched']['mean']:.3f})",
        head,
    ]

    def row(name: str, stats: Mapping[str, Any]) -> str:
        return f"{name:22s}" + "".join(f"{_cell(stats[m]):>16s}" for m in METRICS)

    for m in MAPS:
        lines.append(row(m, maps[m]["overall"]))
    lines.append("model by question type / answer:")
    for t, s in maps["model"]["by_type"].items():
        if s["mass"]["n"]:
            acc = result.get("accuracy_by_type", {}).get(t)
            extra = f"   accuracy {acc:.3f}" if acc is not None and acc == acc else ""
            lines.append(row(f"  {t}", s) + extra)
    for t, s in maps["model"]["by_correct"].items():
        if s["mass"]["n"]:
            lines.append(row(f"  {t}", s))
    sp = result["spread"]
    lines.append(
        "spread (max weight, entropy / log R): "
        + ", ".join(
            f"{m} {sp[m]['max_weight']['mean']:.3f}, {sp[m]['entropy']['mean']:.3f}" for m in MAPS
        )
    )
    lift = result["lift"]
    lines.append(
        f"mass - uniform mass: {lift['mass_minus_uniform']['mean']:+.3f} "
        f"(model above uniform on {100 * lift['share_above_uniform']:.1f}% of questions)"
        + ("; the model's region weights are uniform" if result["model_is_uniform"] else "")
    )
    return "\n".join(lines)


def _correctness_command():
    import click

    @click.command("correctness")
    @click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
    @click.option(
        "--max-questions",
        type=click.IntRange(min=1),
        default=None,
        help="Only the first N questions.",
    )
    @click.option(
        "--split",
        type=click.Choice(["test", "dev", "train"]),
        default="test",
        show_default=True,
    )
    @click.option(
        "--seed",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Seed of the random maps.",
    )
    @click.option("--threads", type=click.IntRange(min=1), default=None, help="torch threads.")
    def correctness_command(
        run_dir: str, max_questions: int | None, split: str, seed: int, threads: int | None
    ) -> None:
        """Attention correctness of a VQA run on easy-VQA: attention mass on the asked-about
        shape and Spearman rho with its region, against uniform and random maps; writes
        RUN_DIR/correctness.json."""
        old = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:  # a run that is not a vqa run, or a missing or damaged file of it: exit 2
            with failing_on(ValueError, FileNotFoundError):
                r = vqa_correctness(run_dir, split, max_questions=max_questions, seed=seed)
        finally:
            torch.set_num_threads(old)
        click.echo(format_table(r))
        click.echo(f"written: {Path(run_dir) / 'correctness.json'}")

    return correctness_command


correctness_command = _correctness_command()
