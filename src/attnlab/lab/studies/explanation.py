"""``attnlab explain RUN_DIR``: the attention-as-explanation tests on a trained run.

The measures are the pure functions of :mod:`attnlab.evaluation.explanation` and
:mod:`attnlab.evaluation.diagnostics`; this module loads the run, draws its batches, runs
each test in turn and writes the results.

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
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import (
    check_flags,
    check_int,
    check_number,
    check_optional_int,
    check_path,
    check_positive,
    check_seed,
)
from attnlab.evaluation.diagnostics import (
    TrainBatches,
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
from attnlab.lab.batching import noisy_length_batches
from attnlab.lab.progress import ProgressBar
from attnlab.models.sentence import SigmoidOutput

__all__ = [
    "PAPER_FIXED",
    "PROTOCOLS",
    "explain_command",
    "explain_run",
    "format_summary",
    "task_batches",
]

Batch = tuple[Tensor, Tensor, Tensor]
#: The batch size of every split the study reads (Jain & Wallace's and Wiegreffe & Pinter's).
BATCH = 32


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
    "adversarial_weight_decay": 1e-5,  # W&P: as their base model, none on the attention
    "batch_noise": 0.1,  # J&W / W&P training batches: sorted by length +- 10 %, reshuffled
    "adversarial_patience": 10,  # W&P train_adversarial: early stop after 10 epochs
    "adversarial_divergence": "kl",  # W&P: KLDivLoss(log a_base, a_adv)
}


@dataclass
class _Study:
    """What every test of :func:`explain_run` reads: the run, its model and batches, the
    settings (``cfg``) and whether the paper protocol runs."""

    run_dir: Path
    task: Any
    data: Any
    model: Any
    cfg: dict[str, Any]
    paper: bool
    seed: int
    device: torch.device
    test: list[Batch]
    train: list[Batch]
    dev: list[Batch] | None
    progress: bool = False


def _settings(protocol: str, given: dict[str, Any]) -> dict[str, Any]:
    """The protocol's settings with the given values in place of its own (``None`` = not
    given; for ``max_instances`` / ``max_train`` the marker is ``"protocol"``, as ``None``
    means every instance)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    settings = dict(PROTOCOLS[protocol])
    for key, value in given.items():
        unset = "protocol" if key in ("max_instances", "max_train") else None
        if value != unset:
            settings[key] = value
    # every setting before the run is loaded: not after minutes of other tests
    for name in ("permutations", "adversarial_steps", "mlp_epochs", "adversarial_epochs"):
        check_int(settings[name], name, error=ValueError)
    for name in ("max_instances", "max_train"):  # None: every instance
        check_optional_int(settings[name], name, error=ValueError)
    for name in ("epsilon", "mlp_lr", "adversarial_lr"):
        check_positive(settings[name], name, error=ValueError)
    lambdas = settings["lambdas"]
    if isinstance(lambdas, str) or not isinstance(lambdas, Sequence) or not lambdas:
        raise ValueError(f"lambdas must be a non-empty list of numbers >= 0, got {lambdas!r}")
    for value in lambdas:
        check_number(value, "each of lambdas", low=0, error=ValueError)
    return settings


def _open_study(run_dir: Path, cfg: dict[str, Any], paper: bool, seed: int, device: str) -> _Study:
    """Load the run on ``device`` and draw its batches; the model must be a sentence
    classifier with attention weights."""
    from attnlab.lab.training import load_run, resolve_device

    dev = resolve_device(device)
    torch.manual_seed(seed)
    task, data, model = load_run(run_dir, device=str(dev))
    test = task_batches(task, data, "test", BATCH, cfg["max_instances"], seed, dev)
    _check_classifier(model.eval(), run_dir, test[0])
    train = task_batches(task, data, "train", BATCH, cfg["max_train"], seed, dev)
    dev_batches = task_batches(task, data, "dev", BATCH, None, seed, dev) if paper else None
    return _Study(run_dir, task, data, model, cfg, paper, seed, dev, test, train, dev_batches)


def _check_classifier(model: Any, run_dir: str | Path, probe: Batch) -> None:
    """The model of ``run_dir`` is a sentence classifier with attention weights (checked on
    the batch ``probe``); a ValueError naming the run otherwise."""
    for name in ("encode", "classify", "classify_with_weights"):
        if not hasattr(model, name):
            raise ValueError(
                f"the model of {run_dir} ({type(model).__name__}) has no {name}(); the "
                "explanation tests run on sentence classifiers with one attention over tokens"
            )
    try:
        weights, _ = attention_weights(model, probe[0], probe[1])
    except ValueError as error:  # e.g. multi-dimensional weights
        raise ValueError(f"run {run_dir}: {error}") from None
    if weights is None:
        raise ValueError(
            f"the model of {run_dir} has no attention weights (a mean-pooling baseline?)"
        )


def _check_other_runs(
    run_dir: Path, compare: Sequence[str | Path], uniform_run: str | Path | None
) -> None:
    """The runs given beside ``run_dir`` are what the tests need, read from their
    ``run.json`` before anything is loaded, so a wrong one fails at once, not after the
    other tests: runs of its task; ``uniform_run`` one of the ``uniform`` baseline; each
    ``compare`` run one of the same attention and task options with another seed (the
    run itself, or its seed again, would measure no seed variance at all). With a
    ``uniform_run`` the ``metrics.json`` of both runs are read too (a damaged one failed
    only after the other tests, hours in under the paper protocol)."""
    from attnlab.lab.training import read_metrics, read_run

    info = read_run(run_dir)
    task = info.get("task")
    others = [("uniform run", uniform_run)] if uniform_run is not None else []
    others += [("compare run", p) for p in compare]
    found = [read_run(other) for _, other in others]  # each run.json read once
    for (what, other), their in zip(others, found, strict=True):
        if their.get("task") != task:
            raise ValueError(
                f"{what} {str(other)!r} is a run of task {their.get('task')!r}, not {task!r}"
            )
    if uniform_run is not None and not _is_uniform(found[0].get("attention")):
        raise ValueError(
            f"uniform run {str(uniform_run)!r} is not a run of the uniform baseline "
            "(train one with -a uniform)"
        )
    if uniform_run is not None:  # their test metrics are read after the other tests
        read_metrics(uniform_run)
        read_metrics(run_dir)
    seeds, mechanism = {info.get("seed")}, _mechanism(info)
    for other, their in zip(compare, found[len(others) - len(compare) :], strict=True):
        _check_compare_run(run_dir, info, mechanism, Path(other), their, seeds)


def _is_uniform(attention: Any) -> bool:
    """Whether a run's ``attention`` (as given) is the ``uniform`` baseline."""
    return isinstance(attention, dict) and (
        attention.get("name") == "uniform" or attention.get("uniform") is True
    )


def _mechanism(info: dict[str, Any]) -> Any:
    """The attention a run trained, as its task resolves the spec given (``{}`` and the
    default attention written out are the same); the spec as given where the task cannot
    resolve it."""
    from attnlab._checks import ConfigError
    from attnlab.lab.config import resolve_task

    given = info.get("attention") or {}
    try:
        return resolve_task(info.get("task"), info.get("task_options") or {}).resolve_attention(
            given
        )
    except (ConfigError, TypeError, ValueError, KeyError):
        return given


def _check_compare_run(
    run_dir: Path,
    info: dict[str, Any],
    mechanism: Any,
    other: Path,
    found: dict[str, Any],
    seeds: set[Any],
) -> None:
    """A ``--compare`` run: another directory, the same attention (``mechanism``: the run's
    own, :func:`_mechanism`) and task options, a seed not seen yet (``seeds`` grows)."""
    where = f"compare run {str(other)!r}"
    if other.resolve() == Path(run_dir).resolve():
        raise ValueError(f"{where} is the run itself: give runs of other seeds")
    if _mechanism(found) != mechanism:
        raise ValueError(
            f"{where} was trained with attention {found.get('label')!r}, the run with "
            f"{info.get('label')!r}"
        )
    mine, theirs = info.get("task_options") or {}, found.get("task_options") or {}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        raise ValueError(f"{where} was trained with other task options: {', '.join(differ)}")
    if found.get("seed") in seeds:
        raise ValueError(f"{where} has seed {found.get('seed')!r} again: give other seeds")
    seeds.add(found.get("seed"))


def _compare_models(s: _Study, compare: Sequence[str | Path]) -> list[Any]:
    """The models of the ``compare`` runs (other seeds), loaded and checked like the run's
    own before the first test starts."""
    from attnlab.lab.training import load_run

    models = []
    for path in compare:
        model = load_run(Path(path), device=str(s.device))[2].eval()
        _check_classifier(model, path, s.test[0])
        models.append(model)
    return models


def _kendall(s: _Study) -> dict[str, Any]:
    """Jain & Wallace: Kendall tau between attention, gradient and leave-one-out."""
    corr = importance_correlations(
        s.model,
        _iter(s.test),
        gradient_classes=PAPER_FIXED["gradient_classes"] if s.paper else "predicted",
    )
    return {
        k: {"mean": v.mean, "std": v.std, "significant": v.significant, "n": v.n}
        for k, v in corr.items()
    }


def _permutation(s: _Study) -> tuple[dict[str, Any], list[int]]:
    """Jain & Wallace's permutation test (instances of >= 2 tokens), and their labels."""
    gen = torch.Generator().manual_seed(s.seed)
    med, max_w, labels = [], [], []
    for tokens, lengths, y in s.test:
        m, mw = permutation_test(
            s.model, tokens, lengths, permutations=s.cfg["permutations"], generator=gen
        )
        keep = lengths >= 2
        med += m[keep].tolist()
        max_w += mw[keep].tolist()
        labels += y[keep].tolist()
    return {"median_tvd": _stats(med), "per_instance": med, "max_weight": max_w}, labels


def _adversary(s: _Study, tokens: Tensor, lengths: Tensor, generator: torch.Generator) -> Any:
    """Adversarial attention of one batch: J&W's multi-adversary search (paper) or one
    adversary within ``epsilon`` (lab)."""
    if not s.paper:
        return adversarial_attention(
            s.model, tokens, lengths, epsilon=s.cfg["epsilon"], steps=s.cfg["adversarial_steps"]
        )
    return adversarial_attention_multi(
        s.model,
        tokens,
        lengths,
        k=PAPER_FIXED["adversaries"],
        steps=s.cfg["adversarial_steps"],
        lr=PAPER_FIXED["adversary_lr"],
        penalty=PAPER_FIXED["adversary_penalty"],
        epsilon=s.cfg["epsilon"],
        select_epsilon=PAPER_FIXED["adversary_select_epsilon"],
        noise=PAPER_FIXED["adversary_noise"],
        generator=generator,
    )


def _adversarial_attention(s: _Study) -> dict[str, Any]:
    """Jain & Wallace: the largest JSD from the model's weights that keeps the output."""
    adv_jsd, adv_tvd, adv_maxw = [], [], []
    adv_gen = torch.Generator().manual_seed(s.seed)
    for tokens, lengths, _y in s.test:
        r = _adversary(s, tokens, lengths, adv_gen)
        w, _ = attention_weights(s.model, tokens, lengths)
        adv_jsd += r.max_jsd.tolist()
        adv_tvd += r.tvd.tolist()
        adv_maxw += w.max(-1).values.tolist()
    return {
        "epsilon": s.cfg["epsilon"],
        "select_epsilon": PAPER_FIXED["adversary_select_epsilon"] if s.paper else s.cfg["epsilon"],
        "max_jsd": _stats(adv_jsd),
        "jsd_bound": JSD_MAX,
        "fraction_above_half_bound": float(np.mean(np.asarray(adv_jsd) > JSD_MAX / 2)),
        "per_instance": adv_jsd,
        "max_weight": adv_maxw,
    }


def _uniform(s: _Study, uniform_run: str | Path | None) -> dict[str, Any]:
    """Wiegreffe & Pinter: uniform weights at test time, and beside them the test metrics
    of a run trained with uniform weights (``uniform_run``)."""
    from attnlab.lab.training import read_metrics, read_run

    result = uniform_weights_gap(s.model, _iter(s.test))
    if uniform_run is None:
        return result
    info, metrics = read_run(uniform_run), read_metrics(uniform_run)  # its task: checked
    result["trained_uniform"] = {
        "run": str(uniform_run),
        "attention": info.get("attention"),
        "test": metrics.get("test", {}),
    }
    result["learned_test"] = read_metrics(s.run_dir).get("test", {})
    return result


def _adversarial_models(s: _Study) -> tuple[list[dict[str, float]], tuple[float, Any] | None]:
    """Wiegreffe & Pinter: a model trained to keep the outputs with attention far from the
    run's, per ``lambda``; returns the sweep and ``(lambda, model)`` of the largest
    ``lambda`` (its weights feed the frozen-weight MLP)."""

    sweep = []
    adversary = None
    paper: dict[str, Any] = {}
    if s.paper:  # W&P: weight decay but on the attention, class-weighted loss, new batches
        paper = {
            "divergence": PAPER_FIXED["adversarial_divergence"],
            "patience": PAPER_FIXED["adversarial_patience"],
            "amsgrad": True,
            "weight_decay": PAPER_FIXED["adversarial_weight_decay"],
            "instance_weights": getattr(s.task, "class_weights", None),
        }
    for lam in s.cfg["lambdas"]:
        # W&P train the adversary from scratch: a new model of the same build
        fresh = _fresh_model(s) if s.paper else None
        epochs = s.cfg["adversarial_epochs"]
        desc = f"adversarial model lambda={lam}"
        with ProgressBar(s.progress, total=epochs, desc=desc, unit="epoch", leave=False) as bar:
            r = adversarial_model(
                s.model,
                _training_batches(s),
                s.test,
                lam,
                epochs=epochs,
                lr=s.cfg["adversarial_lr"],
                seed=s.seed,
                fresh=fresh,
                on_epoch=lambda epoch, loss, bar=bar: bar.update(1, loss=f"{loss:.4f}"),
                **paper,
            )
        sweep.append(
            {"lambda": lam, "mean_tvd": r.mean_tvd, "mean_jsd": r.mean_jsd, "accuracy": r.accuracy}
        )
        if adversary is None or lam >= adversary[0]:
            adversary = (lam, r.model)
    return sweep, adversary


def _frozen_weights(s: _Study, adversary: tuple[float, Any] | None) -> dict[str, Any]:
    """Wiegreffe & Pinter's frozen-weight MLP with uniform, learned, transferred (the
    run's) and adversarial weights. Under the paper protocol the MLPs start from the
    embeddings a new model of the run starts from (the pretrained ones, as W&P's
    ``pre_embed``), with the run's output layer (one sigmoid logit for ``output=sigmoid``)
    and its task's loss, on batches drawn anew every epoch."""
    model = s.model
    table = _fresh_model(s).embedding if s.paper else model.embedding
    embeddings = table.weight.detach().float()
    num_classes = int(model.output.out_features)

    def transferred(tokens: Tensor, lengths: Tensor) -> Tensor:
        return attention_weights(model, tokens, lengths)[0].float()

    def adversarial(tokens: Tensor, lengths: Tensor) -> Tensor:
        assert adversary is not None
        return attention_weights(adversary[1], tokens, lengths)[0].float()

    mlp_kw: dict[str, Any] = {"epochs": s.cfg["mlp_epochs"], "lr": s.cfg["mlp_lr"], "seed": s.seed}
    if s.paper:
        mlp_kw.update(
            hidden=PAPER_FIXED["mlp_hidden"],
            attention_dim=PAPER_FIXED["mlp_attention_dim"],
            activation=PAPER_FIXED["mlp_activation"],
            freeze_embeddings=False,
            amsgrad=True,
            weight_decay=PAPER_FIXED["mlp_weight_decay"],
            dev=s.dev,
            output=SigmoidOutput if isinstance(model.output, SigmoidOutput) else None,
            loss=_task_loss(s.task),
        )
    train = _training_batches(s)
    return {
        name: frozen_weight_diagnostic(embeddings, num_classes, train, s.test, source, **mlp_kw)
        for name, source in (
            ("uniform", "uniform"),
            ("learned", "learned"),
            ("transferred", transferred),
            *((("adversarial", adversarial),) if adversary is not None else ()),
        )
    }


def _fresh_model(s: _Study) -> nn.Module:
    """A newly initialised model of the run's build (its task, data and attention; seeded
    with the study's seed): its embeddings are those the run started from."""
    from attnlab.lab.training import read_run

    spec = s.task.resolve_attention(read_run(s.run_dir).get("attention") or {})
    torch.manual_seed(s.seed)
    return s.task.build_model(s.data, spec).to(s.device)


def _training_batches(s: _Study) -> TrainBatches:
    """The training batches of the MLPs and adversarial models: the study's fixed ones
    (the lab protocol), or under the paper protocol the same instances in new batches
    every epoch, as Jain & Wallace's and Wiegreffe & Pinter's trainers draw them
    (:func:`~attnlab.lab.batching.noisy_length_batches`; epoch ``e``'s batches are the same
    for every model of the study)."""
    if not s.paper:
        return s.train
    rows = [(x[i, : int(n[i])], int(y[i])) for x, n, y in s.train for i in range(len(y))]
    lengths = [len(tokens) for tokens, _ in rows]

    def epoch(e: int) -> list[Batch]:
        generator = torch.Generator().manual_seed(s.seed * 1_000_003 + e)
        out = []
        for idx in noisy_length_batches(lengths, BATCH, generator, PAPER_FIXED["batch_noise"]):
            tokens = nn.utils.rnn.pad_sequence([rows[i][0] for i in idx], batch_first=True)
            n = torch.tensor([lengths[i] for i in idx], device=tokens.device)
            y = torch.tensor([rows[i][1] for i in idx], device=tokens.device)
            out.append((tokens, n, y))
        return out

    return epoch


def _task_loss(task: Any) -> Callable[[Tensor, Tensor], Tensor] | None:
    """The training loss of the run's task on a batch's logits and labels, when the task
    gives its per-example losses (``example_losses``; reduced by its ``loss_reduction``);
    None (the MLP's own mean cross-entropy) otherwise."""
    per_example = getattr(task, "example_losses", None)
    if per_example is None:
        return None
    summed = task.options.get("loss_reduction") == "sum"

    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        values = per_example(logits, labels)
        return values.sum() if summed else values.mean()

    return loss


def _seed_variance(s: _Study, compare: Sequence[str | Path], others: list[Any]) -> dict[str, Any]:
    """Wiegreffe & Pinter: how far the attention of runs with other seeds (``compare``,
    their models ``others``) is."""
    sv = seed_variance([s.model, *others], s.test)
    keys = (
        "mean_jsd",
        "mean_tvd",
        "mean_instance_median_jsd",
        "jsd",
        "tvd",
        "instance_median_jsd",
        "instance_mean_tvd",
    )
    return {"runs": [str(p) for p in compare], **{k: sv[k] for k in keys}}


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
    cfg = _settings(protocol, given)
    check_seed(seed, error=ValueError)
    check_flags(plots=plots, progress=progress)
    if isinstance(compare, str | os.PathLike):  # one run, not the characters of its path
        compare = [compare]
    compare = [check_path(other, "compare") for other in compare]  # ~ as in run_dir
    if uniform_run is not None:
        uniform_run = check_path(uniform_run, "uniform_run")
    paper = protocol == "paper"
    run_dir = check_path(run_dir, "run_dir")
    _check_other_runs(run_dir, compare, uniform_run)
    s = _open_study(run_dir, cfg, paper, seed, device)
    s.progress = progress
    others = _compare_models(s, compare)
    bar = ProgressBar(progress, total=6 + bool(compare), desc="explanation tests", unit="test")
    result: dict[str, Any] = {
        "run": str(s.run_dir),
        "protocol": protocol,
        "settings": {**cfg, **(PAPER_FIXED if paper else {})},
        "instances": sum(len(b[2]) for b in s.test),
        "test_split_size": _split_size(s.task, s.data, "test"),
    }
    result["kendall"] = bar.step(_kendall(s))
    result["permutation"], labels = bar.step(_permutation(s))
    result["adversarial"] = bar.step(_adversarial_attention(s))
    result["uniform"] = bar.step(_uniform(s, uniform_run))
    result["adversarial_models"], adversary = bar.step(_adversarial_models(s))
    result["frozen_weights"] = bar.step(_frozen_weights(s, adversary))
    if compare:
        result["seed_variance"] = bar.step(_seed_variance(s, compare, others))
    bar.close()
    _write(result, labels, s.run_dir / "explanation", plots)
    return result


def _write(result: dict[str, Any], labels: list[int], out_dir: Path, plots: bool) -> None:
    """``explanation.json`` (atomically) and, with ``plots``, the PNG plots beside it."""
    from attnlab.lab.files import write_text

    out_dir.mkdir(exist_ok=True)
    if plots:
        result["plots"] = _plots(result, labels, out_dir)
    write_text(out_dir / "explanation.json", json.dumps(result, indent=1, default=float))


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


def _explain_command():
    import click

    from attnlab.lab.commands import import_plugins_or_fail, plugin_option

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
        help="Test instances of the per-instance tests [default: the protocol's: 500 / all; "
        "64 with --quick].",
    )
    @click.option(
        "--permutations",
        type=click.IntRange(min=1),
        help="Permutations per instance [default: 100; 20 with --quick].",
    )
    @click.option("--epsilon", type=float, help="Output change allowed (TVD) [default: 0.01].")
    @click.option(
        "--uniform-run",
        type=click.Path(exists=True, file_okay=False),
        help="A run of the same task trained with -a uniform: Wiegreffe & Pinter's uniform "
        "baseline, reported beside the learned weights.",
    )
    @click.option(
        "--quick",
        is_flag=True,
        help="Small settings for a fast look (64 instances, 20 permutations, short searches "
        "and trainings); --max-instances and --permutations given explicitly win.",
    )
    @click.option(
        "--device",
        default="auto",
        show_default=True,
        help="auto (CUDA when available, else cpu), cpu, cuda, cuda:1, ...",
    )
    @click.option("--no-progress", is_flag=True)
    @plugin_option(
        "import MODULE first (a dotted name or a .py file), e.g. the one that "
        "registers the run's task; repeat for several"
    )
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
        plugins: tuple[str, ...],
    ) -> None:
        """Attention-as-explanation tests (Jain & Wallace 2019; Wiegreffe & Pinter 2019) on a
        trained run; writes RUN_DIR/explanation/explanation.json and plots."""
        from attnlab.data._common import MissingDataError
        from attnlab.lab.errors import fail

        import_plugins_or_fail(plugins)  # a run of a plugin's task needs its task registered

        try:  # what was typed: one line, exit 2, before anything is written
            count = _typed(device, protocol, max_instances)
        except ValueError as err:
            fail(str(err))
        kw: dict[str, Any] = {
            "permutations": permutations,
            "epsilon": epsilon,
            "protocol": protocol,
            "uniform_run": uniform_run,
        }
        if count != "protocol":
            kw["max_instances"] = count
        if quick:
            kw.update(_quick(protocol, count, permutations))
        try:
            r = explain_run(run_dir, compare=compare, progress=not no_progress, device=device, **kw)
        except ValueError as err:  # also a missing or damaged file of the run (RunFileError)
            fail(str(err))
        except MissingDataError as err:  # the run's data is not where it was trained from
            fail(str(err), code=1)
        click.echo(format_summary(r))
        click.echo(f"written: {Path(run_dir) / 'explanation' / 'explanation.json'}")

    return explain_command


def _typed(device: str, protocol: str, max_instances: str | None) -> int | str | None:
    """Check ``--device`` and ``--protocol`` (ValueError naming the option); return the
    instance count of ``--max-instances`` (see :func:`_instances`)."""
    from attnlab.lab.training import resolve_device

    resolve_device(device)
    if protocol not in PROTOCOLS:
        raise ValueError(f"--protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    return _instances(max_instances)


def _quick(protocol: str, count: int | str | None, permutations: int | None) -> dict[str, Any]:
    """``--quick``: small settings (64 test instances, or the protocol's count when it is
    smaller, and 20 permutations); an explicit ``--max-instances`` or ``--permutations``
    wins over them."""
    if count == "protocol":
        chosen = PROTOCOLS[protocol]["max_instances"]
        count = 64 if chosen is None else min(chosen, 64)
    return {
        "max_instances": count,
        "permutations": 20 if permutations is None else permutations,
        "adversarial_steps": 40,
        "lambdas": (0.0, 1.0),
        "mlp_epochs": 2,
        "adversarial_epochs": 2,
        "max_train": 256,
    }


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
