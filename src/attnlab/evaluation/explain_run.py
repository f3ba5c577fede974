"""``attnlab explain RUN_DIR``: the attention-as-explanation tests on a trained run.

Loads a run of a task whose model follows the pooling-classifier protocol
(:class:`~attnlab.models.SentenceClassifier`: ``encode`` / ``classify`` /
``classify_with_weights``), and runs on its test split

* Jain & Wallace (2019): Kendall tau between attention, gradient and leave-one-out
  importance; the permutation test; adversarial attention within ``epsilon``;
* Wiegreffe & Pinter (2019): uniform weights at test time; the frozen-weight MLP with
  uniform, learned and transferred weights; adversarial model training over a sweep of
  ``lambda``; the seed variance when other runs of the same configuration are given.

Results go to ``RUN_DIR/explanation/explanation.json`` with PNG plots beside it (the report
shows them). Cost: a few forward passes per test instance plus short trainings of the
frozen-weight MLPs and adversarial models (``--quick`` shrinks everything).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.evaluation.diagnostics import (
    adversarial_model,
    frozen_weight_diagnostic,
    seed_variance,
    uniform_weights_gap,
)
from attnlab.evaluation.divergences import JSD_MAX
from attnlab.evaluation.explanation import (
    adversarial_attention,
    attention_weights,
    importance_correlations,
    permutation_test,
)

__all__ = ["explain_run", "task_batches"]

Batch = tuple[Tensor, Tensor, Tensor]


def task_batches(
    task: Any,
    data: Any,
    split: str,
    batch_size: int,
    limit: int | None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> list[Batch]:
    """``(tokens, lengths, labels)`` batches of a sentence task's split on ``device``: at
    most ``limit`` instances drawn in a seeded random order (data files are often sorted by
    label, so the first ``limit`` rows would be a biased sample)."""
    out: list[Batch] = []
    seen = 0
    generator = torch.Generator().manual_seed(seed)
    for batch in task.batches(data, split, batch_size, shuffle=True, generator=generator):
        for key in ("tokens", "lengths", "labels"):
            if key not in batch:
                raise ValueError(
                    f"task {task.name!r} batches have no {key!r}; the explanation tests need a "
                    "sentence classification task (tokens, lengths, labels)"
                )
        x, n, y = batch["tokens"], batch["lengths"], batch["labels"]
        if limit is not None and seen + len(y) > limit:
            keep = limit - seen
            x, n, y = x[:keep], n[:keep], y[:keep]
        if len(y):
            width = max(int(n.max()), 1)
            out.append((x[:, :width].to(device), n.to(device), y.to(device)))
        seen += len(y)
        if limit is not None and seen >= limit:
            break
    return out


def _stats(values: Sequence[float]) -> dict[str, float]:
    v = np.asarray([x for x in values if not math.isnan(x)], dtype=float)
    if not v.size:
        return {"mean": math.nan, "std": math.nan, "median": math.nan, "n": 0}
    return {
        "mean": float(v.mean()),
        "std": float(v.std()),
        "median": float(np.median(v)),
        "n": int(v.size),
    }


def _iter(batches: Sequence[Batch]) -> Iterator[Batch]:
    yield from batches


def explain_run(
    run_dir: str | Path,
    *,
    compare: Sequence[str | Path] = (),
    max_instances: int = 500,
    permutations: int = 100,
    epsilon: float = 0.01,
    adversarial_steps: int = 100,
    lambdas: Sequence[float] = (0.0, 0.5, 1.0),
    mlp_epochs: int = 5,
    mlp_lr: float = 5e-3,
    adversarial_epochs: int = 3,
    adversarial_lr: float = 5e-3,
    max_train: int = 2000,
    seed: int = 0,
    plots: bool = True,
    progress: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Run the explanation tests on ``run_dir`` and write ``explanation/explanation.json``.

    Args:
        compare: other run directories of the same task and attention trained with other
            seeds (for the seed-variance diagnostic).
        max_instances: test instances used by the per-instance tests (a seeded random
            sample of the test split).
        max_train: training instances used by the frozen-weight MLPs and adversarial models
            (a seeded random sample).
        device: where the model and the batches go (``"auto"``: CUDA when available).
    Returns the dict written to the JSON file.
    """
    from attnlab.lab.training import load_run, resolve_device

    run_dir = Path(run_dir)
    dev = resolve_device(device)
    torch.manual_seed(seed)
    task, data, model = load_run(run_dir, device=str(dev))
    model.eval()
    for name in ("encode", "classify", "classify_with_weights"):
        if not hasattr(model, name):
            raise ValueError(
                f"the model of {run_dir} ({type(model).__name__}) has no {name}(); the "
                "explanation tests run on sentence classifiers with one attention over tokens"
            )
    test = task_batches(task, data, "test", 32, max_instances, seed, dev)
    train = task_batches(task, data, "train", 32, max_train, seed, dev)
    probe = test[0]
    weights, _ = attention_weights(model, probe[0], probe[1])
    if weights is None:
        raise ValueError("the run's model has no attention weights (a mean-pooling baseline?)")
    steps = ["correlations", "permutation", "adversarial", "uniform", "frozen", "adv-models"]
    bar = _bar(progress, len(steps) + bool(compare))
    result: dict[str, Any] = {"run": str(run_dir), "instances": sum(len(b[2]) for b in test)}

    corr = importance_correlations(model, _iter(test))
    result["kendall"] = {
        k: {"mean": v.mean, "std": v.std, "significant": v.significant, "n": v.n}
        for k, v in corr.items()
    }
    bar.update()

    gen = torch.Generator().manual_seed(seed)
    med, max_w, labels = [], [], []
    for tokens, lengths, y in test:
        m, mw = permutation_test(model, tokens, lengths, permutations=permutations, generator=gen)
        keep = lengths >= 2
        med += m[keep].tolist()
        max_w += mw[keep].tolist()
        labels += y[keep].tolist()
    result["permutation"] = {"median_tvd": _stats(med), "per_instance": med, "max_weight": max_w}
    bar.update()

    adv_jsd, adv_tvd, adv_maxw = [], [], []
    for tokens, lengths, _y in test:
        r = adversarial_attention(model, tokens, lengths, epsilon=epsilon, steps=adversarial_steps)
        w, _ = attention_weights(model, tokens, lengths)
        adv_jsd += r.max_jsd.tolist()
        adv_tvd += r.tvd.tolist()
        adv_maxw += w.max(-1).values.tolist()
    result["adversarial"] = {
        "epsilon": epsilon,
        "max_jsd": _stats(adv_jsd),
        "jsd_bound": JSD_MAX,
        "fraction_above_half_bound": float(np.mean(np.asarray(adv_jsd) > JSD_MAX / 2)),
        "per_instance": adv_jsd,
        "max_weight": adv_maxw,
    }
    bar.update()

    result["uniform"] = uniform_weights_gap(model, _iter(test))
    bar.update()

    embeddings = model.embedding.weight.detach().float()
    num_classes = int(model.output.out_features)

    def transferred(tokens: Tensor, lengths: Tensor) -> Tensor:
        return attention_weights(model, tokens, lengths)[0].float()

    sweep = []
    adversary = None  # the model of the largest lambda: its weights feed the frozen-weight MLP
    for lam in lambdas:
        r = adversarial_model(
            model, train, test, lam, epochs=adversarial_epochs, lr=adversarial_lr, seed=seed
        )
        sweep.append(
            {"lambda": lam, "mean_tvd": r.mean_tvd, "mean_jsd": r.mean_jsd, "accuracy": r.accuracy}
        )
        if adversary is None or lam >= adversary[0]:
            adversary = (lam, r.model)
    result["adversarial_models"] = sweep
    bar.update()

    def adversarial(tokens: Tensor, lengths: Tensor) -> Tensor:
        assert adversary is not None
        return attention_weights(adversary[1], tokens, lengths)[0].float()

    result["frozen_weights"] = {
        name: frozen_weight_diagnostic(
            embeddings, num_classes, train, test, source, epochs=mlp_epochs, lr=mlp_lr, seed=seed
        )
        for name, source in (
            ("uniform", "uniform"),
            ("learned", "learned"),
            ("transferred", transferred),
            *((("adversarial", adversarial),) if adversary is not None else ()),
        )
    }
    bar.update()

    if compare:
        models = [model] + [load_run(Path(p), device=str(dev))[2].eval() for p in compare]
        sv = seed_variance(models, test)
        result["seed_variance"] = {
            "runs": [str(p) for p in compare],
            "mean_jsd": sv["mean_jsd"],
            "mean_tvd": sv["mean_tvd"],
            "jsd": sv["jsd"],
            "tvd": sv["tvd"],
        }
        bar.update()
    bar.close()

    out_dir = run_dir / "explanation"
    out_dir.mkdir(exist_ok=True)
    if plots:
        result["plots"] = _plots(result, labels, out_dir)
    tmp = out_dir / "explanation.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, default=float), encoding="utf-8")
    tmp.replace(out_dir / "explanation.json")
    return result


def _plots(result: dict[str, Any], labels: list[int], out_dir: Path) -> list[str]:
    try:
        from attnlab.viz import plot_scatter

        names = []
        perm = result["permutation"]
        plot_scatter(
            perm["max_weight"],
            perm["per_instance"],
            xlabel="max attention weight",
            ylabel="median output TVD under permutation",
            groups=labels,
            title="Permutation test (Jain & Wallace 2019)",
            path=out_dir / "permutation.png",
        )
        names.append("permutation.png")
        adv = result["adversarial"]
        plot_scatter(
            adv["max_weight"],
            adv["per_instance"],
            xlabel="max attention weight",
            ylabel=f"max JSD within TVD <= {adv['epsilon']}",
            title="Adversarial attention (Jain & Wallace 2019)",
            path=out_dir / "adversarial.png",
        )
        names.append("adversarial.png")
        sweep = result["adversarial_models"]
        plot_scatter(
            [s["mean_jsd"] for s in sweep],
            [s["mean_tvd"] for s in sweep],
            xlabel="mean JSD of attention",
            ylabel="mean TVD of outputs",
            groups=[f"lambda={s['lambda']}" for s in sweep],
            title="Adversarial models (Wiegreffe & Pinter 2019)",
            path=out_dir / "adversarial_models.png",
        )
        names.append("adversarial_models.png")
        return names
    except ModuleNotFoundError:  # matplotlib absent: the JSON holds everything
        return []


class _bar:
    def __init__(self, enabled: bool, total: int) -> None:
        self._tqdm = None
        if enabled:
            from tqdm.auto import tqdm

            self._tqdm = tqdm(total=total, desc="explanation tests", unit="test")

    def update(self) -> None:
        if self._tqdm is not None:
            self._tqdm.update(1)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def _explain_command():
    import click

    @click.command("explain")
    @click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
    @click.option(
        "--compare",
        multiple=True,
        type=click.Path(exists=True, file_okay=False),
        help="Another run of the same configuration (other seed); repeatable.",
    )
    @click.option("--max-instances", default=500, show_default=True)
    @click.option("--permutations", default=100, show_default=True)
    @click.option("--epsilon", default=0.01, show_default=True)
    @click.option("--quick", is_flag=True, help="Small settings for a fast look.")
    @click.option(
        "--device",
        default="auto",
        show_default=True,
        help="auto (CUDA when available, else cpu), cpu, cuda, cuda:1, ...",
    )
    @click.option("--no-progress", is_flag=True)
    def explain_command(
        run_dir: str,
        compare: tuple[str, ...],
        max_instances: int,
        permutations: int,
        epsilon: float,
        quick: bool,
        device: str,
        no_progress: bool,
    ) -> None:
        """Attention-as-explanation tests (Jain & Wallace 2019; Wiegreffe & Pinter 2019) on a
        trained run; writes RUN_DIR/explanation/explanation.json and plots."""
        from attnlab.cli import _fail
        from attnlab.lab.training import resolve_device

        try:
            resolve_device(device)
        except ValueError as err:  # ConfigError: one line, exit 2, before anything is written
            _fail(str(err))
        kw: dict[str, Any] = {}
        if quick:
            kw = dict(
                max_instances=min(max_instances, 64),
                permutations=min(permutations, 20),
                adversarial_steps=40,
                lambdas=(0.0, 1.0),
                mlp_epochs=2,
                adversarial_epochs=2,
                max_train=256,
            )
        else:
            kw = dict(max_instances=max_instances, permutations=permutations)
        try:
            r = explain_run(
                run_dir,
                compare=compare,
                epsilon=epsilon,
                progress=not no_progress,
                device=device,
                **kw,
            )
        except ValueError as err:  # also a missing or damaged file of the run (RunFileError)
            _fail(str(err))
        click.echo(format_summary(r))
        click.echo(f"written: {Path(run_dir) / 'explanation' / 'explanation.json'}")

    return explain_command


def format_summary(r: dict[str, Any]) -> str:
    """A short text summary of :func:`explain_run`'s result."""
    lines = [f"instances: {r['instances']}", "Kendall tau (mean +- std, fraction p<=0.05):"]
    for k, v in r["kendall"].items():
        lines.append(f"  {k:20s} {v['mean']:+.3f} +- {v['std']:.3f}  {v['significant']:.2f}")
    p = r["permutation"]["median_tvd"]
    lines.append(f"permutation: median output TVD {p['median']:.3f} (mean {p['mean']:.3f})")
    a = r["adversarial"]
    lines.append(
        f"adversarial attention (TVD <= {a['epsilon']}): max JSD mean {a['max_jsd']['mean']:.3f}"
        f" of bound {a['jsd_bound']:.3f}"
    )
    u = r["uniform"]
    lines.append(
        f"uniform weights at test: accuracy {u['uniform_accuracy']:.3f} vs learned "
        f"{u['learned_accuracy']:.3f}"
    )
    fw = r["frozen_weights"]
    lines.append("frozen-weight MLP F1: " + ", ".join(f"{k} {v['f1']:.3f}" for k, v in fw.items()))
    for s in r["adversarial_models"]:
        lines.append(
            f"adversarial model lambda={s['lambda']}: TVD {s['mean_tvd']:.3f}, JSD "
            f"{s['mean_jsd']:.3f}, accuracy {s['accuracy']:.3f}"
        )
    if "seed_variance" in r:
        sv = r["seed_variance"]
        lines.append(f"seed variance: mean JSD {sv['mean_jsd']:.3f}, mean TVD {sv['mean_tvd']:.3f}")
    return "\n".join(lines)


explain_command = _explain_command()
