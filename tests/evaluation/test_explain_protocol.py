"""The paper protocol of the explanation tests (``explain_run(protocol="paper")``): Jain &
Wallace's gradient over every output and their multi-adversary search, Wiegreffe &
Pinter's frozen-weight MLP (tanh, fine-tuned embeddings, best dev epoch), adversarial
model from scratch with KL and early stopping, and per-instance seed medians; end to end
at toy size (the whole test split) and on the command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from signal_task import make_signal_data

from attnlab.evaluation.diagnostics import (
    FrozenWeightMLP,
    adversarial_model,
    as_batches,
    frozen_weight_diagnostic,
    seed_variance,
)
from attnlab.evaluation.divergences import JSD_MAX, jsd
from attnlab.evaluation.explain_run import PAPER_FIXED, PROTOCOLS, explain_command, explain_run
from attnlab.evaluation.explanation import (
    adversarial_attention_multi,
    attention_weights,
    gradient_importance,
)
from attnlab.models.sentence import SentenceClassifier

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))
import toy_task  # noqa: F401  (registers the "toy" task)

from attnlab.lab.training import train_run


def _model(classes: int, seed: int = 0) -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(12, classes, embed_dim=5, encoder="bilstm", hidden_size=4).eval()


TOKENS = torch.tensor([[3, 5, 7, 2, 8], [4, 9, 6, 0, 0]])
LENGTHS = torch.tensor([5, 3])


# ----------------------------------------------------------------------------- gradient


def _per_class(model, k: int) -> torch.Tensor:
    """|grad_x p_k . x| per token by hand: the attention detached, one class."""
    m = torch.arange(5)[None] < LENGTHS[:, None]
    weights, _ = attention_weights(model, TOKENS, LENGTHS)
    x = model.embedding(TOKENS).detach().requires_grad_(True)
    handle = model.embedding.register_forward_hook(lambda *_: x)
    try:
        probs = model.classify_with_weights(model.encode(TOKENS, m), weights).softmax(-1)
        (grad,) = torch.autograd.grad(probs[:, k].sum(), x)
    finally:
        handle.remove()
    return (grad * x).sum(-1).abs() * m


def test_gradient_over_every_class_is_the_sum_over_classes():
    model = _model(3)
    expected = sum(_per_class(model, k) for k in range(3))
    got = gradient_importance(model, TOKENS, LENGTHS, classes="all")
    assert torch.allclose(got, expected, atol=1e-6)
    assert (got[1, 3:] == 0).all()


def test_for_two_classes_every_class_ranks_as_the_predicted_one():
    model = _model(2)
    every = gradient_importance(model, TOKENS, LENGTHS, classes="all")
    predicted = gradient_importance(model, TOKENS, LENGTHS, classes="predicted")
    assert torch.allclose(every, 2 * predicted, atol=1e-6)  # |d p_0| = |d p_1|
    with pytest.raises(ValueError, match="classes must be 'predicted' or 'all'"):
        gradient_importance(model, TOKENS, LENGTHS, classes="true")


# ----------------------------------------------------------------------------- adversary


def test_multi_adversary_respects_the_selection_and_the_support():
    model = _model(2)
    gen = torch.Generator().manual_seed(0)
    r = adversarial_attention_multi(model, TOKENS, LENGTHS, steps=30, generator=gen)
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    assert ((r.max_jsd >= 0) & (r.max_jsd <= JSD_MAX + 1e-6)).all()
    assert (r.tvd <= 0.05 + 1e-6).all()
    assert torch.allclose(r.weights.sum(-1), torch.ones(2), atol=1e-5)
    assert (r.weights[1, 3:] == 0).all()
    assert torch.allclose(jsd(r.weights, w), r.max_jsd, atol=1e-5)


def test_the_model_weights_win_when_no_candidate_keeps_the_output():
    model = _model(2)
    w, _ = attention_weights(model, TOKENS, LENGTHS)
    r = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=2, select_epsilon=1e-12, generator=torch.Generator()
    )
    assert (r.max_jsd == 0).all() and torch.equal(r.weights, w)


def test_more_search_finds_farther_weights_on_average():
    """J&W's search is an optimisation: 60 steps find weights at least as far as 0."""
    model = _model(2)
    far = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=60, generator=torch.Generator().manual_seed(1)
    )
    none = adversarial_attention_multi(
        model, TOKENS, LENGTHS, steps=0, generator=torch.Generator().manual_seed(1)
    )
    assert far.max_jsd.mean() >= none.max_jsd.mean() - 1e-6


# ----------------------------------------------------------------------------- W&P


@pytest.fixture(scope="module")
def splits():
    train = as_batches(*make_signal_data(96, seed=31), batch_size=32)
    dev = as_batches(*make_signal_data(64, seed=32), batch_size=32)
    test = as_batches(*make_signal_data(64, seed=33), batch_size=32)
    return train, dev, test


WP = dict(hidden=16, activation="tanh", freeze_embeddings=False, attention_dim=8, amsgrad=True)


def test_wp_mlp_is_tanh_with_fine_tuned_embeddings():
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    mlp = FrozenWeightMLP(emb, 2, 16, learned=True, activation="tanh", freeze_embeddings=False)
    assert mlp.embedding.weight.requires_grad and mlp.activation is torch.tanh
    assert not FrozenWeightMLP(emb, 2).embedding.weight.requires_grad
    with pytest.raises(ValueError, match="activation must be 'relu' or 'tanh'"):
        FrozenWeightMLP(emb, 2, activation="gelu")


def test_fine_tuning_leaves_the_callers_embeddings_alone(splits):
    """The MLP fine-tunes a copy: the tensor it was given (in explain_run, the trained
    model's own embedding weights) is unchanged, so a second diagnostic starts alike."""
    train, _, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    before = emb.clone()
    first = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=2, lr=0.01, **WP)
    assert torch.equal(emb, before)
    second = frozen_weight_diagnostic(emb, 2, train, test, "learned", epochs=2, lr=0.01, **WP)
    assert first == second


def test_the_kept_epoch_is_the_best_dev_epoch(splits):
    """With ``dev`` the epoch with the best dev ROC-AUC is kept: training that many epochs
    without ``dev`` gives the same test result (training is seeded)."""
    train, dev, test = splits
    emb = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    picked = frozen_weight_diagnostic(
        emb, 2, train, test, "learned", epochs=4, lr=0.01, dev=dev, **WP
    )
    assert 1 <= picked["epoch"] <= 4
    again = frozen_weight_diagnostic(
        emb, 2, train, test, "learned", epochs=picked["epoch"], lr=0.01, **WP
    )
    assert again["epoch"] == picked["epoch"]
    assert again["accuracy"] == picked["accuracy"] and again["f1"] == picked["f1"]
    assert 0 <= picked["f1_positive"] <= 1


def test_adversarial_model_from_scratch_with_kl_and_patience(signal_model, splits):
    train, _, test = splits
    torch.manual_seed(5)
    fresh = SentenceClassifier(30, 2, embed_dim=16, encoder="bilstm", hidden_size=16)
    r = adversarial_model(
        signal_model,
        train,
        test,
        lam=1.0,
        epochs=30,
        lr=0.01,
        fresh=fresh,
        divergence="kl",
        patience=2,
        amsgrad=True,
    )
    assert r.model is fresh
    assert 1 <= r.kept_epoch <= r.epochs_run <= 30
    if r.epochs_run < 30:  # stopped early: 2 epochs without a lower loss after the best
        assert r.epochs_run == r.kept_epoch + 2
    assert 0 <= r.mean_jsd <= JSD_MAX and 0 <= r.mean_tvd <= 1
    with pytest.raises(ValueError, match="divergence must be 'jsd' or 'kl'"):
        adversarial_model(signal_model, train[:1], test[:1], 1.0, divergence="js")


def test_seed_variance_per_instance_median(signal_model, splits):
    _, _, test = splits
    others = [_signal_like(s) for s in (1, 2, 3)]
    sv = seed_variance([signal_model, *others], test)
    per_model = []
    for other in others:
        values = []
        for tokens, lengths, _ in test:
            w0, _ = attention_weights(signal_model, tokens, lengths)
            w, _ = attention_weights(other, tokens, lengths)
            values += jsd(w, w0).tolist()
        per_model.append(values)
    expected = torch.tensor(per_model).median(0).values
    assert torch.allclose(torch.tensor(sv["instance_median_jsd"]), expected)
    assert sv["mean_instance_median_jsd"] == pytest.approx(float(expected.mean()))


def _signal_like(seed: int) -> SentenceClassifier:
    torch.manual_seed(seed)
    return SentenceClassifier(30, 2, embed_dim=16, encoder="bilstm", hidden_size=16).eval()


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


def test_cli_paper_protocol_quick(toy_runs):
    run, _, _ = toy_runs
    result = CliRunner().invoke(
        explain_command, [str(run), "--protocol", "paper", "--quick", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "protocol: paper" in result.output
    assert "instances: 24 of the test split's 24" in result.output
