"""The paper protocol of the explanation tests (``explain_run(protocol="paper")``) end to
end at toy size (the whole test split) and on the command line; its measures are tested
in tests/evaluation/test_explain_protocol.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import toy_task  # noqa: F401  (registers the "toy" task)

from attnlab.lab.studies.explanation import PAPER_FIXED, PROTOCOLS, explain_command, explain_run
from attnlab.lab.training import train_run

# ----------------------------------------------------------------------------- end to end

TOY = {"epochs": 2, "n_train": 64, "n_eval": 24, "encoder": "bilstm"}
SMALL = dict(
    permutations=5,
    adversarial_steps=5,
    lambdas=(1.0,),
    mlp_epochs=2,
    adversarial_epochs=3,
    max_train=64,
    progress=False,
    plots=False,
)


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("protocol")
    run = train_run("toy", "tanh", options=TOY, out_dir=root / "tanh", progress=False)
    other = train_run("toy", "tanh", seed=1, options=TOY, out_dir=root / "s1", progress=False)
    uniform = train_run("toy", "uniform", options=TOY, out_dir=root / "u", progress=False)
    return run.run_dir, other.run_dir, uniform.run_dir


def test_paper_protocol_end_to_end_on_the_whole_test_split(toy_runs):
    run, other, uniform = toy_runs
    r = explain_run(run, compare=[other], protocol="paper", uniform_run=uniform, **SMALL)
    assert r["protocol"] == "paper"
    assert r["instances"] == r["test_split_size"] == 24  # no sample: every test sentence
    assert r["settings"]["gradient_classes"] == "all"
    assert r["settings"]["max_instances"] is None and r["settings"]["max_train"] == 64
    assert r["adversarial"]["select_epsilon"] == PAPER_FIXED["adversary_select_epsilon"]
    assert all(1 <= v["epoch"] <= 2 for v in r["frozen_weights"].values())
    trained = r["uniform"]["trained_uniform"]
    assert trained["attention"] == {"name": "uniform"} and "accuracy" in trained["test"]
    assert "accuracy" in r["uniform"]["learned_test"]
    assert "mean_instance_median_jsd" in r["seed_variance"]
    saved = json.loads((Path(run) / "explanation" / "explanation.json").read_text())
    assert saved["protocol"] == "paper" and saved["instances"] == 24


def test_lab_protocol_keeps_its_sample_and_settings(toy_runs):
    run, _, _ = toy_runs
    r = explain_run(run, max_instances=16, **SMALL)
    assert r["protocol"] == "lab" and r["instances"] == 16
    assert r["settings"]["mlp_lr"] == PROTOCOLS["lab"]["mlp_lr"]
    assert "gradient_classes" not in r["settings"]
    assert "epoch" in r["frozen_weights"]["uniform"]


def test_uniform_run_of_another_task_is_refused(toy_runs, tmp_path):
    run, _, _ = toy_runs
    info = json.loads((Path(run) / "run.json").read_text())
    fake = tmp_path / "other"
    fake.mkdir()
    (fake / "run.json").write_text(json.dumps({**info, "task": "sentiment"}))
    (fake / "metrics.json").write_text((Path(run) / "metrics.json").read_text())
    with pytest.raises(ValueError, match="is a run of task 'sentiment', not 'toy'"):
        explain_run(run, protocol="paper", uniform_run=fake, **SMALL)


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--protocol", "jain"], "--protocol must be one of lab, paper, got 'jain'"),
        (["--max-instances", "0"], "--max-instances must be a positive integer or 'all'"),
        (["--max-instances", "many"], "got 'many'"),
    ],
)
def test_cli_bad_protocol_values(toy_runs, extra, text):
    run, _, _ = toy_runs
    before = sorted(p.name for p in Path(run).iterdir())
    result = CliRunner().invoke(explain_command, [str(run), "--quick", *extra])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {text}"] or text in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert sorted(p.name for p in Path(run).iterdir()) == before


@pytest.mark.parametrize("value", ["-3", "0"])
def test_cli_permutations_below_one_are_refused(toy_runs, value):
    run, _, _ = toy_runs
    before = sorted(p.name for p in Path(run).iterdir())
    for quick in ([], ["--quick"]):  # --quick used to take 0 for its default (20)
        result = CliRunner().invoke(explain_command, [str(run), *quick, "--permutations", value])
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit), repr(result.exception)
        assert f"Invalid value for '--permutations': {value} is not in the range x>=1" in (
            result.output
        )
    assert sorted(p.name for p in Path(run).iterdir()) == before


def test_permutations_below_one_are_refused_before_anything_runs(toy_runs):
    run, _, _ = toy_runs
    with pytest.raises(ValueError, match="permutations must be an int >= 1, got 0"):
        explain_run(run, **{**SMALL, "permutations": 0})


def test_quick_settings_yield_to_explicit_counts():
    """--quick defaults to 20 permutations and 64 instances (the protocol's count when
    smaller); an explicit --permutations or --max-instances (all included) wins."""
    from attnlab.lab.studies.explanation import PROTOCOLS, _quick

    assert _quick("lab", "protocol", None)["permutations"] == 20
    assert _quick("lab", "protocol", 5)["permutations"] == 5
    assert _quick("lab", "protocol", 50)["permutations"] == 50
    lab = PROTOCOLS["lab"]["max_instances"]
    assert _quick("lab", "protocol", None)["max_instances"] == min(lab, 64)
    assert _quick("paper", "protocol", None)["max_instances"] == 64  # the paper's: all
    assert _quick("lab", 200, None)["max_instances"] == 200
    assert _quick("lab", None, None)["max_instances"] is None  # --max-instances all


def test_cli_paper_protocol_quick(toy_runs):
    run, _, _ = toy_runs
    result = CliRunner().invoke(
        explain_command, [str(run), "--protocol", "paper", "--quick", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "protocol: paper" in result.output
    assert "instances: 24 of the test split's 24" in result.output


def test_cli_missing_data_of_the_run_is_one_line_exit_1(toy_runs, monkeypatch):
    """A run whose data is no longer where it was trained from (a relative path= from
    another folder): the loader's MissingDataError is the one error line, exit 1."""
    from attnlab.data._common import MissingDataError
    from attnlab.lab.studies import explanation

    def missing(*_args, **_kw):
        raise MissingDataError("data=csv: no file at mine.csv")

    monkeypatch.setattr(explanation, "explain_run", missing)
    run, _, _ = toy_runs
    result = CliRunner().invoke(explain_command, [str(run), "--quick", "--no-progress"])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == "error: data=csv: no file at mine.csv"


# ----------------------------------------------------------------------------- W&P's training


def _study(run, protocol: str):
    from attnlab.lab.studies.explanation import _open_study, _settings

    cfg = _settings(protocol, {"max_train": 40})
    return _open_study(Path(run), cfg, protocol == "paper", 0, "cpu")


def test_paper_training_batches_are_drawn_anew_every_epoch(toy_runs):
    """Under the paper protocol the MLPs and adversaries see the study's training
    instances, each once an epoch, in batches of 32 of similar length drawn anew every
    epoch (the same for every model); the lab protocol keeps its fixed batches."""
    from attnlab.lab.studies.explanation import _training_batches

    run, _, _ = toy_runs
    lab = _study(run, "lab")
    assert _training_batches(lab) is lab.train
    s = _study(run, "paper")
    epochs = _training_batches(s)

    def instances(batches) -> list[tuple[tuple[int, ...], int]]:
        return sorted(
            (tuple(x[i, : int(n[i])].tolist()), int(y[i]))
            for x, n, y in batches
            for i in range(len(y))
        )

    given = instances(s.train)
    assert len(given) == 40
    first, second = epochs(1), epochs(2)
    assert instances(first) == given and instances(second) == given
    assert [len(b[2]) for b in first] != [] and max(len(b[2]) for b in first) == 32
    assert [b[0].tolist() for b in first] != [b[0].tolist() for b in second]
    assert all(b[0].shape[1] == int(b[1].max()) for b in first)  # padded to its longest
    assert [b[0].tolist() for b in epochs(1)] == [b[0].tolist() for b in first]


def test_paper_mlps_start_from_a_new_models_embeddings_with_the_tasks_loss(toy_runs, monkeypatch):
    """The paper protocol's frozen-weight MLPs get the embeddings a new model of the run
    starts from (not the run's trained ones), and the task's loss where it has one."""
    from attnlab.lab.studies import explanation

    run, _, _ = toy_runs
    s = _study(run, "paper")
    got: list[dict] = []

    def record(embeddings, num_classes, train, test, source, **kw):
        got.append({"embeddings": embeddings, "train": train, **kw})
        return {"accuracy": 0.5}

    monkeypatch.setattr(explanation, "frozen_weight_diagnostic", record)
    explanation._frozen_weights(s, None)
    fresh = explanation._fresh_model(s).embedding.weight
    assert len(got) == 3 and all(torch.equal(g["embeddings"], fresh) for g in got)
    assert not torch.equal(fresh, s.model.embedding.weight)
    assert all(callable(g["train"]) and g["loss"] is None for g in got)  # toy: no own loss
    got.clear()
    explanation._frozen_weights(_study(run, "lab"), None)
    assert all(torch.equal(g["embeddings"], s.model.embedding.weight) for g in got)
    assert all("loss" not in g for g in got)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_task_loss_reduces_its_per_example_losses(reduction):
    from attnlab.lab.studies.explanation import _task_loss

    class Task:
        def __init__(self) -> None:
            self.options = {"loss_reduction": reduction}

        def example_losses(self, logits, labels):
            return (logits[:, 1] - labels) ** 2

    logits, labels = torch.tensor([[0.0, 1.0], [0.0, 3.0]]), torch.tensor([0.0, 1.0])
    loss = _task_loss(Task())
    assert float(loss(logits, labels)) == (5.0 if reduction == "sum" else 2.5)
    assert _task_loss(object()) is None
