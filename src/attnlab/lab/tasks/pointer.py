"""Task ``pointer``: pointer networks (Vinyals et al. 2015) on generated sorting and planar
convex-hull instances.

The task model is :class:`attnlab.models.pointer.PointerNetworkModel`: an LSTM encoder over
the inputs, an LSTM decoder whose output at each step is its attention distribution over
the inputs (``p(C_i = j) = softmax_j score(d_i, e_j)``, the already chosen inputs masked),
trained with the negative log-likelihood of the target pointers (teacher forcing) and
decoded greedily.

Data (:mod:`attnlab.data.pointer_tasks`, generated from ``data_seed``; nothing to install):

* ``problem="sort"``: ``n`` numbers uniform in [0, 1); the target is their indices in
  ascending order of value;
* ``problem="hull"``: ``min_points..n`` points in the unit square (padded to ``n``); the
  target is the convex hull's vertices counter-clockwise from the lowest index, then the
  end pointer.

Attention presets: ``additive`` (default, the paper's ``v^T tanh(W1 e_j + W2 d_i)``),
``general``, ``dot``, ``scaled-dot``, ``cosine``, and the baselines ``mean`` (a position
classifier over the decoder state and the mean of the remaining inputs' states) and
``uniform`` (every allowed input equally likely). Metrics: ``sequence_accuracy``
(selection; the fraction of instances decoded exactly), ``token_accuracy`` (the fraction
of target steps decoded right) and, for hulls, ``area_coverage`` (mean area of the decoded
polygon / area of the true hull, 0 for a non-simple polygon).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data.pointer_tasks import (
    IGNORE_INDEX,
    hull_metrics,
    make_pointer_data,
    sequence_metrics,
)
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.models.pointer import PointerNetworkModel
from attnlab.query.pointer import pointer_loss

__all__ = ["PointerData", "PointerTask"]


@dataclass(frozen=True)
class PointerData:
    """One split: ``x`` ``[N, n, d]``, ``targets`` ``[N, T]`` (``-1`` after the end),
    ``lengths`` ``[N]``."""

    x: Tensor
    targets: Tensor
    lengths: Tensor

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def as_dict(self) -> dict[str, Tensor]:
        return {"x": self.x, "targets": self.targets, "lengths": self.lengths}


@register_task("pointer")
class PointerTask(Task):
    """Sorting / convex hull with :class:`~attnlab.models.pointer.PointerNetworkModel`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        problem: ``"sort"`` or ``"hull"``.
        n: numbers to sort, or the most points of a hull (default 8).
        min_points: the fewest points of a hull (default 5; ignored for sorting).
        train_size, dev_size, test_size: generated instances per split.
        data_seed: seed of the generated data (train, dev and test use data_seed,
            data_seed + 1, data_seed + 2); the data do not depend on the run's seed.
        hidden_size: LSTM size.

    Option presets (``-o preset=NAME``): ``cpu`` (the defaults) and ``paper``: Vinyals et
    al.'s (2015, NIPS, section 4) convex-hull set-up -- hulls of 5 to 50 points, one
    million generated training instances, one LSTM layer of 512 units (their models have
    256 or 512), mini-batches of 128, gradient norm clipped at 2. Not reproduced: SGD with
    learning rate 1 and the uniform [-0.08, 0.08] initialisation (Adam 1e-3 and PyTorch's
    initialisation here); beam search over unconstrained outputs (greedy decoding that
    never points twice at a point here); their tests on more points than in training
    (n up to 500; here the same 5-50 mix). The paper gives no training length (the
    default 10 epochs is kept).

    ``metrics`` depends on the problem: ``("sequence_accuracy", "token_accuracy")`` for
    sorting, plus ``"area_coverage"`` for hulls.

    :formula: e = LSTM_enc(W x); d_i = LSTM_dec(W x_(C_(i-1))); p(C_i = j | C_<i, P) = softmax_j
        score(d_i, e_j) over the not yet chosen inputs
    :source: Vinyals, Fortunato & Jaitly 2015, Pointer Networks (NeurIPS)
    :cost: LSTMs O((n + T) h^2) + pointer O(T n d_w) per instance
    """

    metrics: ClassVar[tuple[str, ...]] = ("sequence_accuracy", "token_accuracy")
    higher_is_better: ClassVar[bool] = True
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "problem": "hull",
            "n": 50,
            "min_points": 5,
            "train_size": 1_000_000,
            "hidden_size": 512,
            "batch_size": 128,
            "grad_clip": 2.0,
            "lr": 1e-3,
        },
    }
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 10,
        "batch_size": 64,
        "lr": 2e-3,
        "grad_clip": 2.0,
        "problem": "sort",
        "n": 8,
        "min_points": 5,
        "train_size": 20000,
        "dev_size": 1000,
        "test_size": 1000,
        "data_seed": 0,
        "hidden_size": 64,
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "additive"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        score: {"score": score} for score in ("additive", "general", "dot", "scaled-dot", "cosine")
    }
    data_source: ClassVar[str] = "generated sorting / planar convex-hull instances (no package)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_option_choice("problem", ("sort", "hull"))
        self.check_int_options("n", minimum=1 if o["problem"] == "sort" else 3)
        n = o["n"]
        self.check_int_options("min_points", minimum=3)  # also for sorting, which ignores it
        if o["problem"] == "hull":
            if o["min_points"] > n:
                raise ConfigError(f"option min_points={o['min_points']} must be <= n={n}")
        self.check_int_options("train_size", "dev_size", "test_size", "hidden_size")
        self.metrics = (
            ("sequence_accuracy", "token_accuracy", "area_coverage")
            if o["problem"] == "hull"
            else ("sequence_accuracy", "token_accuracy")
        )

    # ------------------------------------------------------------------ data

    def load_data(self) -> TaskData:
        o = self.options
        problem, n, seed = o["problem"], int(o["n"]), int(o["data_seed"])

        def make(count: int, offset: int) -> PointerData:
            d = make_pointer_data(problem, count, n, seed + offset, min_points=o["min_points"])
            return PointerData(d["x"], d["targets"], d["lengths"])

        info = {
            "problem": problem,
            "n": n,
            "d_in": 1 if problem == "sort" else 2,
            "eos": problem == "hull",
        }
        return self.generated_data(make, info)

    def make_batch(self, data: TaskData, part: PointerData, idx: list[int]) -> dict[str, Tensor]:
        index = torch.tensor(idx, dtype=torch.long)
        targets = part.targets[index]
        width = int((targets != IGNORE_INDEX).sum(1).max()) if len(idx) else 0
        return {
            "x": part.x[index],
            "targets": targets[:, :width],
            "lengths": part.lengths[index],
            "index": index,
        }

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        spec = dict(attention)
        name = spec.pop("name", None)
        if name in ("mean", "uniform"):
            if spec:
                raise ConfigError(f"the {name!r} baseline takes no attention options, got {spec}")
            att: Any = name
        elif name is not None:
            raise ConfigError(f"unknown attention preset {name!r}")
        else:
            att = spec or dict(self.default_attention)
        return PointerNetworkModel(
            data.info["d_in"],
            int(self.options["hidden_size"]),
            attention=att,
            max_inputs=data.info["n"],
            mask_chosen=True,
            eos=data.info["eos"],
        )

    # ------------------------------------------------------------------ training

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["x"], batch["targets"], lengths=batch["lengths"])
        return pointer_loss(out.log_probs, batch["targets"])

    def decode(self, model: nn.Module, data: TaskData, split: str) -> Tensor:
        """Greedy pointer sequences ``[N, T]`` of one split (``-1`` after the end)."""
        part: PointerData = data.split(split)
        device = next(model.parameters()).device
        T = part.targets.shape[1]
        preds = []
        for batch in self.batches(data, split, 500):
            dec = model.greedy(
                batch["x"].to(device), lengths=batch["lengths"].to(device), max_steps=T
            )
            idx = dec.indices.cpu()
            pad = torch.full((idx.shape[0], T), IGNORE_INDEX, dtype=torch.long)
            pad[:, : idx.shape[1]] = idx[:, :T]
            preds.append(pad)
        if not preds:
            return torch.zeros(0, T, dtype=torch.long)
        return torch.cat(preds)

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        part: PointerData = data.split(split)
        pred = self.decode(model, data, split)
        seq = sequence_metrics(pred, part.targets)
        out = {
            "sequence_accuracy": seq["sequence_accuracy"],
            "token_accuracy": seq["position_accuracy"],
        }
        if data.info["problem"] == "hull":
            hull = hull_metrics(pred, part.as_dict(), data.info["n"])
            out["area_coverage"] = hull["area_coverage"]
            out["invalid_rate"] = hull["invalid_rate"]
        return out

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The pointer distributions of greedy decoding on the first ``n`` test instances:
        rows = output steps, columns = input positions (and the end pointer)."""
        part: PointerData = data.test
        k = min(n, len(part))
        if k <= 0:
            return []
        device = next(model.parameters()).device
        x, lengths = part.x[:k].to(device), part.lengths[:k].to(device)
        dec = model.greedy(x, lengths=lengths, max_steps=part.targets.shape[1])
        out = model(x, dec.indices, lengths=lengths)
        probs = out.probs.cpu()
        eos = data.info["eos"]
        examples = []
        for b in range(k):
            m = int(part.lengths[b])
            steps = int((dec.indices[b] != IGNORE_INDEX).sum())
            cols = [_label(part.x[b, j]) for j in range(m)] + (["<end>"] if eos else [])
            keep = list(range(m)) + ([probs.shape[2] - 1] if eos else [])
            pred = [int(i) for i in dec.indices[b, :steps]]
            gold = [int(i) for i in part.targets[b] if int(i) != IGNORE_INDEX]
            examples.append(
                AttentionExample(
                    title=f"test #{b}",
                    rows=[f"step {t + 1}" for t in range(steps)],
                    cols=cols,
                    weights=[[float(probs[b, t, j]) for j in keep] for t in range(steps)],
                    label=" ".join(map(str, gold)),
                    prediction=" ".join(map(str, pred)),
                    kind="matrix",
                    extra={"problem": data.info["problem"], "inputs": part.x[b, :m].tolist()},
                )
            )
        return examples


def _label(point: Tensor) -> str:
    values = [f"{float(v):.2f}" for v in point]
    return values[0] if len(values) == 1 else "(" + ",".join(values) + ")"
