"""The training options every task inherits for following a paper's code: ``amsgrad``,
``attention_weight_decay`` (the attention's parameters in their own optimizer group,
Jain & Wallace's ``attn_optim``) and ``select_from_epoch`` (their trainer never keeps the
first epoch), and ``patience`` (early stopping, as Lu et al. 2016), each against an
independent computation; their defaults keep the plain Adam, the selection from epoch 1
and every epoch trained."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab._checks import ConfigError
from attnlab.lab.config import check_option_values
from attnlab.lab.training import _Trainer, attention_parameters, parameter_groups, train_run


@pytest.fixture
def toy(toy_task_module):
    return toy_task_module.ToyTask


def _trainer(task) -> _Trainer:
    data = task.load_data()
    torch.manual_seed(0)
    model = task.build_model(data, task.resolve_attention(None))
    return _Trainer(task, model, data, torch.device("cpu"), "fp32", 0, 0, False)


def _ids(params) -> set[int]:
    return {id(p) for p in params}


# ----------------------------------------------------------------------------- optimizer


def test_default_optimizer_is_plain_adam_with_one_weight_decay(toy):
    trainer = _trainer(toy(weight_decay=1e-4))
    groups = trainer.optimizer.param_groups
    assert isinstance(trainer.optimizer, torch.optim.Adam)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 1e-4
    assert groups[0]["amsgrad"] is False
    assert _ids(groups[0]["params"]) == _ids(trainer.model.parameters())


def test_attention_weight_decay_and_amsgrad_as_jain_and_wallace(toy):
    task = toy(weight_decay=1e-5, attention_weight_decay=0.0, amsgrad=True)
    trainer = _trainer(task)
    model = trainer.model
    # the attention's parameters by their names, independently of the model's method
    by_name = {id(p) for n, p in model.named_parameters() if n.startswith("attention.")}
    assert by_name  # the toy model's tanh attention has parameters
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [1e-5, 0.0]
    assert all(g["amsgrad"] is True and g["lr"] == task.options["lr"] for g in groups)
    assert _ids(groups[1]["params"]) == by_name
    assert _ids(groups[0]["params"]) == _ids(model.parameters()) - by_name
    # one step: AMSGrad keeps the running maximum of the second moment
    data = trainer.data
    batch = next(task.batches(data, "train", 8))
    trainer._step(task.loss(model, batch), 1, 1)  # epoch 1, batch 1
    some = groups[0]["params"][0]
    assert "max_exp_avg_sq" in trainer.optimizer.state[some]


def test_the_attention_gets_no_weight_decay_step(toy):
    """With zero gradients, Adam's L2 weight decay alone moves a parameter: the
    attention's stay, the others shrink."""
    trainer = _trainer(toy(weight_decay=0.1, attention_weight_decay=0.0, amsgrad=True))
    model = trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    for n, p in model.named_parameters():
        moved = not torch.equal(p.detach(), before[n])
        nonzero = bool(before[n].abs().sum() > 0)
        assert moved == (nonzero and not n.startswith("attention.")), n


def test_parameter_groups_fall_back_to_the_attention_name():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = nn.Linear(2, 2)
            self.attention_like = nn.Linear(2, 1)  # not a module named "attention"
            self.frozen = nn.Linear(2, 1).requires_grad_(False)

    net = Net()
    assert _ids(attention_parameters(net)) == _ids(net.attention.parameters())
    groups = parameter_groups(net, 0.5, 0.0)
    assert _ids(groups[0]["params"]) == _ids(net.attention_like.parameters())
    assert _ids(groups[1]["params"]) == _ids(net.attention.parameters())
    assert parameter_groups(net, 0.5, None)[0]["weight_decay"] == 0.5
    assert len(parameter_groups(net, 0.5, None)[0]["params"]) == 4  # trainable only


def test_a_model_without_attention_parameters_has_one_group(toy):
    task = toy(attention_weight_decay=0.0)
    data = task.load_data()
    model = task.build_model(data, task.resolve_attention({"name": "mean"}))
    groups = parameter_groups(model, 1e-5, 0.0)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 1e-5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"amsgrad": "yes"}, "option amsgrad must be true or false"),
        ({"attention_weight_decay": -1.0}, "option attention_weight_decay must be >= 0"),
        ({"select_from_epoch": 0}, "option select_from_epoch must be an int >= 1, got 0"),
        ({"select_from_epoch": 4, "epochs": 3}, r"select_from_epoch \(4\) exceeds epochs \(3\)"),
        ({"patience": 0}, "option patience must be an int >= 1, got 0"),
        ({"patience": 2.5}, "option patience must be an int >= 1, got 2.5"),
    ],
)
def test_bad_values_are_one_line_errors(toy, options, message):
    with pytest.raises(ConfigError, match=message):
        check_option_values(toy, options)


def test_select_from_epoch_beyond_the_epochs_fails_before_training(tmp_path, toy):
    with pytest.raises(ConfigError, match="exceeds epochs"):
        train_run(toy(epochs=2, select_from_epoch=3), None, out_dir=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- selection


def _scripted(toy, values, **options):
    """A toy task whose dev accuracy follows ``values``."""

    class Scripted(toy):
        def __init__(self, **opts):
            super().__init__(**opts)
            self.calls = 0

        def evaluate(self, model, data, split):
            real = super().evaluate(model, data, split)
            if split != "dev":
                return real
            self.calls += 1
            return {**real, "accuracy": values[self.calls - 1]}

    return Scripted(epochs=len(values), **options)


def _best_by_hand(values, first):
    """The first epoch >= ``first`` with the largest value (ties: the earliest)."""
    eligible = [(v, -e) for e, v in enumerate(values, 1) if e >= first]
    return -max(eligible)[1]


@pytest.mark.parametrize(
    "values",
    [[0.9, 0.5, 0.7, 0.6], [0.9, 0.5, 0.5, 0.4], [0.1, 0.5, 0.7, 0.6], [0.9, 0.95, 0.7, 0.99]],
)
@pytest.mark.parametrize("first", [1, 2, 3])
def test_select_from_epoch(tmp_path, toy, values, first):
    task = _scripted(toy, values, select_from_epoch=first)
    result = train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)
    best = _best_by_hand(values, first)
    assert result.metrics["best_epoch"] == best
    assert result.metrics["dev"]["accuracy"] == values[best - 1]
    assert len(result.history) == len(values)  # every epoch is still trained and recorded


# ----------------------------------------------------------------------------- early stopping


def _stop_by_hand(values, first, patience):
    """How many epochs a trainer with ``patience`` runs: it stops after the first epoch
    ``e`` that is ``patience`` epochs past the best eligible epoch among ``values[:e]``."""
    for e in range(first, len(values) + 1):
        if e - _best_by_hand(values[:e], first) >= patience:
            return e
    return len(values)


@pytest.mark.parametrize(
    ("values", "first", "patience", "trained"),
    [
        ([0.5, 0.6, 0.6, 0.55, 0.7, 0.8], 1, 2, 4),  # best stays at 2 through epochs 3-4
        ([0.5, 0.6, 0.6, 0.55, 0.7, 0.8], 1, 3, 6),  # epoch 5 improves in time
        ([0.9, 0.5, 0.4, 0.3, 0.2, 0.1], 1, 1, 2),  # the first epoch is the best
        ([0.9, 0.5, 0.4, 0.3, 0.2, 0.1], 2, 1, 3),  # epoch 1 is not eligible: 2 is best
        ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 1, 1, 6),  # always improving: every epoch
    ],
)
def test_patience_stops_early_and_keeps_the_best_epoch(
    tmp_path, toy, values, first, patience, trained
):
    assert _stop_by_hand(values, first, patience) == trained  # the table is the rule
    task = _scripted(toy, values, select_from_epoch=first, patience=patience)
    result = train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)
    assert len(result.history) == trained == task.calls
    assert result.metrics["epochs_trained"] == trained
    best = _best_by_hand(values[:trained], first)
    assert result.metrics["best_epoch"] == best
    assert result.metrics["dev"]["accuracy"] == values[best - 1]


def test_no_patience_trains_every_epoch(tmp_path, toy):
    values = [0.9, 0.1, 0.1, 0.1, 0.1]
    task = _scripted(toy, values)
    assert task.options["patience"] is None
    result = train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)
    assert len(result.history) == result.metrics["epochs_trained"] == 5
