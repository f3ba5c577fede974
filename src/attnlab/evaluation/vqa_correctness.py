"""``attnlab correctness RUN_DIR``: attention correctness of a VQA run on easy-VQA.

easy-VQA images hold one shape on a plain background and every question asks about that
shape, so the gold region of a question is the shape itself
(:func:`~attnlab.data.easy_vqa.shape_region`). Pooled onto the model's ``g x g`` attention
grid (:func:`~attnlab.evaluation.correctness.region_to_grid`) it becomes ``r_k``, the
fraction of cell ``k``'s pixels inside the shape. For the region weights ``a`` (``[R]``,
``R = g^2``, summing to 1) of every question :func:`vqa_correctness` computes

* ``mass``: the attention mass inside the region, ``sum_k a_k r_k`` (Liu et al. 2017's
  attention correctness with cell fractions);
* ``mass_touch``: ``sum_{k: r_k > 0} a_k``, the mass on the cells that touch the shape;
* ``spearman``: Spearman's rho between ``a`` and ``r`` (Das et al. 2016's rank correlation;
  ties get their mean rank; NaN when ``a`` or ``r`` is constant);
* ``pointing``: 1 when the cell of largest weight touches the shape, else 0 (the
  "pointing game"; ties share the hit: the fraction of the tied cells that touch it);

and aggregates them (mean, std, count of defined values) over all questions, by question
type (shape / color / yes/no) and by whether the model's answer is right. The same numbers
are computed for two reference maps on the same questions, so a reader sees whether the
model beats chance:

* ``uniform``: ``a_k = 1/R``: its mass is the area fraction of the region
  ``mean_k r_k``; its Spearman is undefined (constant map: NaN, reported with ``n = 0``);
* ``random``: one ``Dirichlet(1, ..., 1)`` map per question (seeded): a random
  attention map whose expected mass is also the area fraction and expected rho 0.

The paired ``lift`` (model mass minus uniform mass, and the share of questions where the
model puts more mass on the shape than uniform attention) is reported too. Results go to
``RUN_DIR/correctness.json``.

Cost: one forward pass over the split, plus O(R log R) per question for the ranks.

Sources: C. Liu, J. Mao, F. Sha and A. Yuille, "Attention Correctness in Neural Image
Captioning", AAAI 2017; A. Das, H. Agrawal, C. L. Zitnick, D. Parikh and D. Batra, "Human
Attention in Visual Question Answering: Do Humans and Deep Networks Look at the Same
Regions?", EMNLP 2016.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.data.easy_vqa import shape_region
from attnlab.evaluation.correctness import attention_mass, rank_correlation, region_to_grid
from attnlab.lab.training import load_run

__all__ = [
    "MAPS",
    "METRICS",
    "QUESTION_TYPES",
    "format_table",
    "question_scores",
    "region_fractions",
    "vqa_correctness",
]

#: the per-question scores, in the order the table prints them
METRICS = ("mass", "mass_touch", "spearman", "pointing")
#: the attention maps compared: the model's and the two references
MAPS = ("model", "uniform", "random")
#: easy-VQA question types (see :func:`attnlab.data.easy_vqa.question_type`)
QUESTION_TYPES = ("shape", "color", "yes/no")


def region_fractions(images: Any, grid: tuple[int, int]) -> np.ndarray:
    """The gold region of every image on the attention grid: ``[M, h * w]`` float, the
    fraction of each cell's pixels inside the image's shape (row-major cells, as the VQA
    model's region weights)."""
    imgs = np.asarray(images.cpu() if isinstance(images, torch.Tensor) else images)
    if imgs.ndim != 4 or imgs.shape[-1] != 3:
        raise ValueError(f"images has shape {imgs.shape}, expected [M, H, W, 3]")
    h, w = grid
    out = np.zeros((imgs.shape[0], h * w), dtype=np.float64)
    for i, image in enumerate(imgs):
        out[i] = region_to_grid(shape_region(image), (h, w)).ravel()
    return out


def _pointing(weights: np.ndarray, touch: np.ndarray) -> float:
    top = weights >= weights.max() - 1e-12 * max(1.0, abs(float(weights.max())))
    return float(touch[top].mean())


def question_scores(weights: Any, fractions: Any) -> dict[str, float]:
    """The four scores of one attention map ``weights`` ``[R]`` against the region
    fractions ``fractions`` ``[R]`` (see the module docstring)."""
    a = torch.as_tensor(np.asarray(weights, dtype=np.float64))
    r = np.asarray(fractions, dtype=np.float64)
    if a.shape != r.shape or a.dim() != 1:
        raise ValueError(
            f"weights {tuple(a.shape)} and fractions {r.shape} must be equal 1-d maps [R]"
        )
    touch = r > 0
    return {
        "mass": float(attention_mass(a, torch.as_tensor(r))),
        "mass_touch": float(attention_mass(a, torch.as_tensor(touch))),
        "spearman": rank_correlation(a, r),
        "pointing": _pointing(a.numpy(), touch),
    }


def _stats(values: Sequence[float]) -> dict[str, float | int]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=np.float64)
    if not v.size:
        return {"mean": math.nan, "std": math.nan, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std()), "n": int(v.size)}


def _summary(rows: list[dict[str, float]], groups: Mapping[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, idx in groups.items():
        out[name] = {m: _stats([rows[i][m] for i in idx]) for m in METRICS}
    return out


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
    ``accuracy``, ``accuracy_by_type``, ``model_is_uniform`` (True when every region map
    is ``1/R``, as for the mean baseline), ``region`` (``area``: statistics of
    ``mean_k r_k``; ``touched``: of the fraction of cells touching the shape), ``maps`` (``model`` / ``uniform`` / ``random``,
    each ``{"overall": {metric: stats}, "by_type": {type: {...}}, "by_correct":
    {"correct" | "wrong": {...}}}`` with stats ``{"mean", "std", "n"}``), ``spread``
    (per map: ``max_weight`` and ``entropy`` = ``H(a) / log R``, 1 for uniform), ``lift``
    (``mass_minus_uniform`` stats and ``share_above_uniform``), ``reference``
    (``seed``, ``alpha``). NaN is written as null in the JSON file.
    """
    if max_questions is not None and (
        isinstance(max_questions, bool) or not isinstance(max_questions, int) or max_questions < 1
    ):
        raise ValueError(f"max_questions must be an int >= 1 or None, got {max_questions!r}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
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

    image_of = part.image_index[torch.as_tensor(rows)].numpy()
    used, inverse = np.unique(image_of, return_inverse=True)
    fractions = region_fractions(part.images[torch.as_tensor(used)], (g, g))[inverse]  # [N, R]
    labels = part.labels[torch.as_tensor(rows)].numpy()
    types = [part.types[i] for i in rows]
    correct = preds == labels

    rng = np.random.default_rng(seed)
    random_maps = rng.dirichlet(np.full(R, float(alpha)), size=n)
    uniform = np.full(R, 1.0 / R)
    per_map: dict[str, list[dict[str, float]]] = {m: [] for m in MAPS}
    for i in range(n):
        per_map["model"].append(question_scores(weights[i], fractions[i]))
        per_map["uniform"].append(question_scores(uniform, fractions[i]))
        per_map["random"].append(question_scores(random_maps[i], fractions[i]))

    everything = {"overall": np.arange(n)}
    kinds = list(QUESTION_TYPES) + sorted(set(types) - set(QUESTION_TYPES))
    by_type = {t: np.flatnonzero([x == t for x in types]) for t in kinds}
    by_correct = {"correct": np.flatnonzero(correct), "wrong": np.flatnonzero(~correct)}
    maps = {}
    for m in MAPS:
        maps[m] = {
            "overall": _summary(per_map[m], everything)["overall"],
            "by_type": _summary(per_map[m], by_type),
            "by_correct": _summary(per_map[m], by_correct),
        }
    spread = {
        name: {
            "max_weight": _stats(a.max(1).tolist()),
            "entropy": _stats((_entropy(a) / math.log(R) if R > 1 else np.ones(n)).tolist()),
        }
        for name, a in (
            ("model", weights),
            ("uniform", np.tile(uniform, (n, 1))),
            ("random", random_maps),
        )
    }
    diff = [
        a["mass"] - b["mass"] for a, b in zip(per_map["model"], per_map["uniform"], strict=True)
    ]
    info_label = None
    try:
        info_label = json.loads((Path(run_dir) / "run.json").read_text(encoding="utf-8")).get(
            "label"
        )
    except (OSError, ValueError):
        pass
    result = {
        "run_dir": str(run_dir),
        "task": getattr(task, "name", None),
        "label": info_label,
        "split": split,
        "questions": n,
        "grid": [g, g],
        "accuracy": float(correct.mean()),
        "accuracy_by_type": {
            t: float(correct[idx].mean()) if len(idx) else math.nan for t, idx in by_type.items()
        },
        "model_is_uniform": bool(np.allclose(weights, 1.0 / R, atol=1e-6)),
        "region": {
            "area": _stats(fractions.mean(1).tolist()),
            "touched": _stats((fractions > 0).mean(1).tolist()),
        },
        "maps": maps,
        "spread": spread,
        "lift": {
            "mass_minus_uniform": _stats(diff),
            "share_above_uniform": float(np.mean(np.asarray(diff) > 1e-9)),
        },
        "reference": {"seed": seed, "alpha": float(alpha)},
    }
    if write:
        text = json.dumps(_jsonable(result), indent=2, allow_nan=False)
        (Path(run_dir) / "correctness.json").write_text(text + "\n", encoding="utf-8")
    return result


def _entropy(maps: np.ndarray) -> np.ndarray:
    p = np.clip(maps, 0.0, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return value


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
    @click.option("--max-questions", type=int, default=None, help="Only the first N questions.")
    @click.option(
        "--split",
        type=click.Choice(["test", "dev", "train"]),
        default="test",
        show_default=True,
    )
    @click.option("--seed", default=0, show_default=True, help="Seed of the random maps.")
    @click.option("--threads", type=int, default=None, help="torch threads.")
    def correctness_command(
        run_dir: str, max_questions: int | None, split: str, seed: int, threads: int | None
    ) -> None:
        """Attention correctness of a VQA run on easy-VQA: attention mass on the asked-about
        shape and Spearman rho with its region, against uniform and random maps; writes
        RUN_DIR/correctness.json."""
        old = torch.get_num_threads()
        if threads is not None:
            if threads < 1:
                raise click.BadParameter("must be >= 1", param_hint="--threads")
            torch.set_num_threads(threads)
        try:
            r = vqa_correctness(run_dir, split, max_questions=max_questions, seed=seed)
        except (ValueError, FileNotFoundError) as err:
            raise click.ClickException(str(err)) from None
        finally:
            torch.set_num_threads(old)
        click.echo(format_table(r))
        click.echo(f"written: {Path(run_dir) / 'correctness.json'}")

    return correctness_command


correctness_command = _correctness_command()
