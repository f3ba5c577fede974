"""Task ``pointer``: every preset and baseline on tiny generated sorting and hull data, the
metrics, the examples, and an end-to-end train_run per problem."""

from __future__ import annotations

import pytest
import torch
from task_harness import check_deterministic, check_metrics, check_train_run, run_spec, spec_id

from attnlab._checks import ConfigError
from attnlab.lab.tasks.pointer import PointerTask
from attnlab.models.pointer import PointerNetworkModel

SPECS = [{}, *({"name": p} for p in PointerTask.presets), {"name": "mean"}, {"name": "uniform"}]
SPECS.append({"score": "additive", "d_w": 4})
TINY = {"train_size": 16, "dev_size": 6, "test_size": 5, "hidden_size": 6, "batch_size": 8}


@pytest.mark.parametrize("problem", ["sort", "hull"])
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline(problem, spec):
    task = PointerTask(problem=problem, n=6, min_points=4, **TINY)
    data = task.load_data()
    _, metrics, examples = run_spec(
        task, data, spec, 8, model_type=PointerNetworkModel, generator_seed=None, n=3
    )
    assert tuple(m for m in metrics if m in task.metrics) == task.metrics
    check_metrics(metrics, task.metrics, exact=False)
    assert len(examples) == 3
    for b, ex in enumerate(examples):
        assert ex.kind == "matrix"
        m = int(data.test.lengths[b])
        assert len(ex.cols) == m + (problem == "hull")
        assert len(ex.rows) == len(ex.prediction.split())
        for row in ex.weights:
            assert sum(row) == pytest.approx(1.0, abs=1e-4) and min(row) >= 0


@pytest.mark.parametrize("problem", ["sort", "hull"])
def test_one_seed_one_model(problem):
    task = PointerTask(problem=problem, n=6, min_points=4, **TINY)
    check_deterministic(task, task.load_data(), {"name": "additive"}, 8)


def test_metrics_per_problem():
    assert PointerTask().metrics == ("sequence_accuracy", "token_accuracy")
    hull = PointerTask(problem="hull")
    assert hull.metrics == ("sequence_accuracy", "token_accuracy", "area_coverage")


def test_evaluate_perfect_and_identity_by_hand():
    """A model that decodes the targets scores 1; the uniform baseline (input order) scores
    exactly what copying the input order scores."""
    task = PointerTask(n=4, **TINY)
    data = task.load_data()

    class Oracle(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def greedy(self, x, lengths=None, max_steps=None):
            # look the instance up by its numbers
            rows = [int((data.test.x[:, :, 0] == xi[:, 0]).all(1).nonzero()[0]) for xi in x]
            return type("D", (), {"indices": data.test.targets[rows]})()

    assert task.evaluate(Oracle(), data, "test") == {
        "sequence_accuracy": 1.0,
        "token_accuracy": 1.0,
    }
    model = task.build_model(data, {"name": "uniform"}).eval()
    got = task.evaluate(model, data, "test")
    targets = data.test.targets
    identity = torch.arange(4).expand_as(targets)
    assert got["token_accuracy"] == pytest.approx((identity == targets).float().mean().item())
    assert got["sequence_accuracy"] == pytest.approx(
        (identity == targets).all(1).float().mean().item()
    )


def test_data_is_seeded_and_independent_of_torch_seed():
    a = PointerTask(**TINY).load_data()
    torch.manual_seed(123)
    b = PointerTask(**TINY).load_data()
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.targets, b.test.targets)
    assert not torch.equal(a.train.x[:5], a.dev.x[:5])
    c = PointerTask(data_seed=1, **TINY).load_data()
    assert not torch.equal(a.train.x, c.train.x)


def test_options():
    with pytest.raises(ConfigError, match="problem"):
        PointerTask(problem="tsp")
    with pytest.raises(ConfigError, match="min_points"):
        PointerTask(problem="hull", n=5, min_points=6)
    for problem in (
        "sort",
        "hull",
    ):  # sorting ignores min_points: a bad one is refused all the same
        with pytest.raises(ConfigError, match=r"^option min_points must be an int >= 3, got -1$"):
            PointerTask(problem=problem, min_points=-1)
    with pytest.raises(ConfigError, match="no option"):
        PointerTask(bogus=1)
    with pytest.raises(ConfigError, match="preset"):
        PointerTask().resolve_attention({"name": "bogus"})


@pytest.mark.parametrize("problem", ["sort", "hull"])
def test_train_run_end_to_end(problem, tmp_path):
    pytest.importorskip("attnlab.lab.training")
    task = PointerTask(problem=problem, n=6, epochs=2, **TINY)
    for spec in ({"name": "additive"}, {"name": "mean"}):
        check_train_run(
            task, spec, tmp_path / spec["name"], num_threads=1, task_name="pointer",
            primary="sequence_accuracy", metric_names=task.metrics, epochs=2,
            example_kind="matrix",
        )  # fmt: skip
