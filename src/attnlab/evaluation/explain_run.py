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
    adversarial_attention_multi,
    attention_weights,
    importance_correlations,
    permutation_test,
)

__all__ = ["PAPER_FIXED", "PROTOCOLS", "explain_run", "task_batches"]

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


#: The settings of the two protocols (``explain_run(protocol=...)``): ``lab`` -- a quick
#: look (a sample of the test split, short searches and trainings); ``paper`` -- the
#: counts of Jain & Wallace's and Wiegreffe & Pinter's code (every test instance, 500
#: adversary steps, 8 MLP epochs, adversarial models up to 80 epochs with patience 10,
#: every training instance). ``None`` = all instances.
PROTOCOLS: dict[str, dict[str, Any]] = {
    "lab": {
        "max_instances": 500,
        "permutations": 100,
        "epsilon": 0.01,
        "adversarial_steps": 100,
        "lambdas": (0.0, 0.5, 1.0),
        "mlp_epochs": 5,
        "mlp_lr": 5e-3,
        "adversarial_epochs": 3,
        "adversarial_lr": 5e-3,
        "max_train": 2000,
    },
    "paper": {
        "max_instances": None,
        "permutations": 100,
        "epsilon": 0.01,
        "adversarial_steps": 500,
        "lambdas": (0.0, 0.5, 1.0),
        "mlp_epochs": 8,
        "mlp_lr": 1e-3,
        "adversarial_epochs": 80,
        "adversarial_lr": 1e-3,
        "max_train": None,
    },
}
#: The paper protocol's settings that no argument changes (what each follows).
PAPER_FIXED: dict[str, Any] = {
    "gradient_classes": "all",  # J&W: |grad . x| summed over the outputs
    "adversaries": 5,  # J&W AdversaryMulti.K
    "adversary_lr": 0.01,  # Adam with AMSGrad
    "adversary_noise": 3.0,  # uniform logits + 3 N(0, 1)
    "adversary_penalty": 500.0,
    "adversary_select_epsilon": 0.05,  # J&W plot_multi_adversarial: delta_y > 5e-2 dropped
    "mlp_hidden": 128,  # W&P --hidden_size default, the average encoder's projection
    "mlp_attention_dim": 64,  # J&W TanhAttention: hidden_size // 2
    "mlp_activation": "tanh",  # W&P configurations: average encoder, activation tanh
    "mlp_weight_decay": 1e-5,  # J&W / W&P: 1e-5, none on the attention
    "adversarial_patience": 10,  # W&P train_adversarial: early stop after 10 epochs
    "adversarial_divergence": "kl",  # W&P: KLDivLoss(log a_base, a_adv)
}


def explain_run(
    run_dir: str | Path,
    *,
    compare: Sequence[str | Path] = (),
    protocol: str = "lab",
    max_instances: int | str | None = "protocol",
    permutations: int | None = None,
    epsilon: float | None = None,
    adversarial_steps: int | None = None,
    lambdas: Sequence[float] | None = None,
    mlp_epochs: int | None = None,
    mlp_lr: float | None = None,
    adversarial_epochs: int | None = None,
    adversarial_lr: float | None = None,
    max_train: int | str | None = "protocol",
    uniform_run: str | Path | None = None,
    seed: int = 0,
    plots: bool = True,
    progress: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Run the explanation tests on ``run_dir`` and write ``explanation/explanation.json``.

    Args:
        compare: other run directories of the same task and attention trained with other
            seeds (for the seed-variance diagnostic).
        protocol: ``"lab"`` (a quick look) or ``"paper"`` (Jain & Wallace's and Wiegreffe
            & Pinter's procedures and counts: :data:`PROTOCOLS`, :data:`PAPER_FIXED`, and
            docs/explanation.md for what differs still). The other arguments, when given,
            replace the protocol's value.
        max_instances: test instances used by the per-instance tests (a seeded random
            sample of the test split; None = all of it).
        max_train: training instances used by the frozen-weight MLPs and adversarial models
            (a seeded random sample; None = all).
        uniform_run: a run of the same task trained with the ``uniform`` baseline (frozen
            weights ``1/n``): its test metrics go beside the learned model's, Wiegreffe &
            Pinter's uniform baseline.
        device: where the model and the batches go (``"auto"``: CUDA when available).
    Returns the dict written to the JSON file.
    """
    from attnlab.lab.training import load_run, read_metrics, read_run, resolve_device

    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    given = {
        "max_instances": max_instances,
        "permutations": permutations,
        "epsilon": epsilon,
        "adversarial_steps": adversarial_steps,
        "lambdas": lambdas,
        "mlp_epochs": mlp_epochs,
        "mlp_lr": mlp_lr,
        "adversarial_epochs": adversarial_epochs,
        "adversarial_lr": adversarial_lr,
        "max_train": max_train,
    }
    settings = dict(PROTOCOLS[protocol])
    for key, value in given.items():
        if key in ("max_instances", "max_train"):
            if value != "protocol":
                settings[key] = value
        elif value is not None:
            settings[key] = value
    paper = protocol == "paper"
    cfg = settings
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
    test = task_batches(task, data, "test", 32, cfg["max_instances"], seed, dev)
    train = task_batches(task, data, "train", 32, cfg["max_train"], seed, dev)
    dev_batches = task_batches(task, data, "dev", 32, None, seed, dev) if paper else None
    probe = test[0]
    weights, _ = attention_weights(model, probe[0], probe[1])
    if weights is None:
        raise ValueError("the run's model has no attention weights (a mean-pooling baseline?)")
    steps = ["correlations", "permutation", "adversarial", "uniform", "frozen", "adv-models"]
    bar = _bar(progress, len(steps) + bool(compare))
    result: dict[str, Any] = {
        "run": str(run_dir),
        "protocol": protocol,
        "settings": {**cfg, **(PAPER_FIXED if paper else {})},
        "instances": sum(len(b[2]) for b in test),
        "test_split_size": _split_size(task, data, "test"),
    }

    corr = importance_correlations(
        model,
        _iter(test),
        gradient_classes=PAPER_FIXED["gradient_classes"] if paper else "predicted",
    )
    result["kendall"] = {
        k: {"mean": v.mean, "std": v.std, "significant": v.significant, "n": v.n}
        for k, v in corr.items()
    }
    bar.update()

    gen = torch.Generator().manual_seed(seed)
    med, max_w, labels = [], [], []
    for tokens, lengths, y in test:
        m, mw = permutation_test(
            model, tokens, lengths, permutations=cfg["permutations"], generator=gen
        )
        keep = lengths >= 2
        med += m[keep].tolist()
        max_w += mw[keep].tolist()
        labels += y[keep].tolist()
    result["permutation"] = {"median_tvd": _stats(med), "per_instance": med, "max_weight": max_w}
    bar.update()

    adv_jsd, adv_tvd, adv_maxw = [], [], []
    adv_gen = torch.Generator().manual_seed(seed)
    for tokens, lengths, _y in test:
        if paper:
            r = adversarial_attention_multi(
                model,
                tokens,
                lengths,
                k=PAPER_FIXED["adversaries"],
                steps=cfg["adversarial_steps"],
                lr=PAPER_FIXED["adversary_lr"],
                penalty=PAPER_FIXED["adversary_penalty"],
                epsilon=cfg["epsilon"],
                select_epsilon=PAPER_FIXED["adversary_select_epsilon"],
                noise=PAPER_FIXED["adversary_noise"],
                generator=adv_gen,
            )
        else:
            r = adversarial_attention(
                model, tokens, lengths, epsilon=cfg["epsilon"], steps=cfg["adversarial_steps"]
            )
        w, _ = attention_weights(model, tokens, lengths)
        adv_jsd += r.max_jsd.tolist()
        adv_tvd += r.tvd.tolist()
        adv_maxw += w.max(-1).values.tolist()
    result["adversarial"] = {
        "epsilon": cfg["epsilon"],
        "select_epsilon": PAPER_FIXED["adversary_select_epsilon"] if paper else cfg["epsilon"],
        "max_jsd": _stats(adv_jsd),
        "jsd_bound": JSD_MAX,
        "fraction_above_half_bound": float(np.mean(np.asarray(adv_jsd) > JSD_MAX / 2)),
        "per_instance": adv_jsd,
        "max_weight": adv_maxw,
    }
    bar.update()

    result["uniform"] = uniform_weights_gap(model, _iter(test))
    if uniform_run is not None:
        info, metrics = read_run(uniform_run), read_metrics(uniform_run)
        if info.get("task") != task.name:
            raise ValueError(
                f"uniform_run {str(uniform_run)!r} is a run of task {info.get('task')!r}, "
                f"not {task.name!r}"
            )
        result["uniform"]["trained_uniform"] = {
            "run": str(uniform_run),
            "attention": info.get("attention"),
            "test": metrics.get("test", {}),
        }
        result["uniform"]["learned_test"] = read_metrics(run_dir).get("test", {})
    bar.update()

    embeddings = model.embedding.weight.detach().float()
    num_classes = int(model.output.out_features)

    def transferred(tokens: Tensor, lengths: Tensor) -> Tensor:
        return attention_weights(model, tokens, lengths)[0].float()

    sweep = []
    adversary = None  # the model of the largest lambda: its weights feed the frozen-weight MLP
    for lam in cfg["lambdas"]:
        fresh = None
        if paper:  # W&P train the adversary from scratch: a new model of the same build
            spec = task.resolve_attention(read_run(run_dir).get("attention") or {})
            torch.manual_seed(seed)
            fresh = task.build_model(data, spec).to(dev)
        r = adversarial_model(
            model,
            train,
            test,
            lam,
            epochs=cfg["adversarial_epochs"],
            lr=cfg["adversarial_lr"],
            seed=seed,
            fresh=fresh,
            divergence=PAPER_FIXED["adversarial_divergence"] if paper else "jsd",
            patience=PAPER_FIXED["adversarial_patience"] if paper else None,
            amsgrad=paper,
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

    mlp_kw: dict[str, Any] = {"epochs": cfg["mlp_epochs"], "lr": cfg["mlp_lr"], "seed": seed}
    if paper:
        mlp_kw.update(
            hidden=PAPER_FIXED["mlp_hidden"],
            attention_dim=PAPER_FIXED["mlp_attention_dim"],
            activation=PAPER_FIXED["mlp_activation"],
            freeze_embeddings=False,
            amsgrad=True,
            weight_decay=PAPER_FIXED["mlp_weight_decay"],
            dev=dev_batches,
        )
    result["frozen_weights"] = {
        name: frozen_weight_diagnostic(embeddings, num_classes, train, test, source, **mlp_kw)
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
            "mean_instance_median_jsd": sv["mean_instance_median_jsd"],
            "jsd": sv["jsd"],
            "tvd": sv["tvd"],
            "instance_median_jsd": sv["instance_median_jsd"],
            "instance_mean_tvd": sv["instance_mean_tvd"],
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


def _split_size(task: Any, data: Any, split: str) -> int:
    """The number of instances of a split (counted over the task's batches)."""
    from attnlab.lab.training import batch_examples

    return sum(batch_examples(b) for b in task.batches(data, split, 256))


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
    @click.option(
        "--protocol",
        default="lab",
        show_default=True,
        help="lab: a quick look (500 test sentences, short searches); paper: Jain & Wallace's "
        "and Wiegreffe & Pinter's procedures and counts on the whole test split "
        "(docs/explanation.md).",
    )
    @click.option(
        "--max-instances",
        metavar="N|all",
        help="Test instances of the per-instance tests [default: the protocol's: 500 / all].",
    )
    @click.option("--permutations", type=int, help="Permutations per instance [default: 100].")
    @click.option("--epsilon", type=float, help="Output change allowed (TVD) [default: 0.01].")
    @click.option(
        "--uniform-run",
        type=click.Path(exists=True, file_okay=False),
        help="A run of the same task trained with -a uniform: Wiegreffe & Pinter's uniform "
        "baseline, reported beside the learned weights.",
    )
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
        protocol: str,
        max_instances: str | None,
        permutations: int | None,
        epsilon: float | None,
        uniform_run: str | None,
        quick: bool,
        device: str,
        no_progress: bool,
    ) -> None:
        """Attention-as-explanation tests (Jain & Wallace 2019; Wiegreffe & Pinter 2019) on a
        trained run; writes RUN_DIR/explanation/explanation.json and plots."""
        from attnlab.cli import _fail
        from attnlab.lab.training import resolve_device

        try:  # what was typed: one line, exit 2, before anything is written
            resolve_device(device)
            if protocol not in PROTOCOLS:
                raise ValueError(
                    f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
                )
            count = _instances(max_instances)
        except ValueError as err:
            _fail(str(err))
        kw: dict[str, Any] = {
            "permutations": permutations,
            "epsilon": epsilon,
            "protocol": protocol,
            "uniform_run": uniform_run,
        }
        if count != "protocol":
            kw["max_instances"] = count
        if quick:
            chosen = PROTOCOLS[protocol]["max_instances"] if count == "protocol" else count
            kw.update(
                max_instances=64 if chosen is None else min(chosen, 64),
                permutations=min(permutations or 100, 20),
                adversarial_steps=40,
                lambdas=(0.0, 1.0),
                mlp_epochs=2,
                adversarial_epochs=2,
                max_train=256,
            )
        try:
            r = explain_run(run_dir, compare=compare, progress=not no_progress, device=device, **kw)
        except ValueError as err:  # also a missing or damaged file of the run (RunFileError)
            _fail(str(err))
        click.echo(format_summary(r))
        click.echo(f"written: {Path(run_dir) / 'explanation' / 'explanation.json'}")

    return explain_command


def _instances(text: str | None) -> int | str | None:
    """``--max-instances``: None (not given) -> "protocol", ``all`` -> None, else an int
    >= 1 (ValueError naming the option)."""
    if text is None:
        return "protocol"
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"--max-instances must be a positive integer or 'all', got {text!r}")
    return value


def format_summary(r: dict[str, Any]) -> str:
    """A short text summary of :func:`explain_run`'s result."""
    size = r.get("test_split_size")
    lines = [
        f"protocol: {r.get('protocol', 'lab')}",
        f"instances: {r['instances']}" + (f" of the test split's {size}" if size else ""),
        "Kendall tau (mean +- std, fraction p<=0.05):",
    ]
    for k, v in r["kendall"].items():
        lines.append(f"  {k:20s} {v['mean']:+.3f} +- {v['std']:.3f}  {v['significant']:.2f}")
    p = r["permutation"]["median_tvd"]
    lines.append(f"permutation: median output TVD {p['median']:.3f} (mean {p['mean']:.3f})")
    a = r["adversarial"]
    within = a.get("select_epsilon", a["epsilon"])
    lines.append(
        f"adversarial attention (TVD <= {within}): max JSD mean {a['max_jsd']['mean']:.3f}"
        f" of bound {a['jsd_bound']:.3f}"
    )
    u = r["uniform"]
    lines.append(
        f"uniform weights at test: accuracy {u['uniform_accuracy']:.3f} vs learned "
        f"{u['learned_accuracy']:.3f}"
    )
    if "trained_uniform" in u:
        t, learned = u["trained_uniform"]["test"], u.get("learned_test", {})
        lines.append(
            "trained with uniform weights (Wiegreffe & Pinter): "
            + ", ".join(
                f"{m} {t[m]:.3f} vs {learned.get(m, float('nan')):.3f}"
                for m in ("accuracy", "f1")
                if isinstance(t.get(m), int | float)
            )
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
        lines.append(
            f"seed variance: mean JSD {sv['mean_jsd']:.3f}, mean TVD {sv['mean_tvd']:.3f}, "
            f"mean over instances of the median JSD {sv['mean_instance_median_jsd']:.3f}"
        )
    return "\n".join(lines)


explain_command = _explain_command()
