"""Attention correctness of a VQA run (attnlab.lab.studies.vqa_correctness).

Hand-made cases: two 64x64 images whose shapes cover known cells of the 8x8 grid
(tests/evaluation/vqa_hand_data.py), a stub model with known region weights, masses and
Spearman's rho computed by hand / naive loops. One real-data test (skipped without
easy-vqa) trains a tiny run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

import attnlab.lab.studies.vqa_correctness as vc
from attnlab.lab.task import TaskData
from attnlab.lab.tasks.vqa import VQAData, VQATask
from attnlab.models.vqa import VQAModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "evaluation"))
from vqa_hand_data import FRAC_A, FRAC_B, W1, W2, R, image_a, image_b, naive_spearman


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):  # tests/conftest.py's fixture, for every test here
    yield


# ----------------------------------------------------------------------------- hand data


class StubModel(nn.Module):
    """Region weights looked up by the question's first token id (1-based row of
    ``table``); predicts answer ``pred[id - 1]``."""

    def __init__(self, table: np.ndarray, pred: list[int], num_answers: int = 2) -> None:
        super().__init__()
        self.grid = 8
        self.anchor = nn.Parameter(torch.zeros(1))
        self.table = torch.tensor(table, dtype=torch.float64)
        self.pred = torch.tensor(pred)
        self.num_answers = num_answers

    def forward(self, images, tokens, lengths=None, mask=None, image_index=None):
        ids = tokens[:, 0] - 1
        logits = torch.nn.functional.one_hot(self.pred[ids], self.num_answers).float()
        return SimpleNamespace(region_weights=self.table[ids], logits=logits)


def make_part(images: list[np.ndarray], image_of: list[int], labels: list[int], types):
    n = len(image_of)
    return VQAData(
        images=torch.from_numpy(np.stack(images)),
        image_index=torch.tensor(image_of, dtype=torch.long),
        tokens=torch.arange(1, n + 1, dtype=torch.long)[:, None],
        lengths=torch.ones(n, dtype=torch.long),
        labels=torch.tensor(labels, dtype=torch.long),
        words=tuple(("q",) for _ in range(n)),
        types=tuple(types),
    )


def fake_run(monkeypatch, tmp_path: Path, part: VQAData, model: nn.Module) -> Path:
    """A run directory whose load_run gives (VQATask, data with ``part`` as every split,
    ``model``)."""
    data = TaskData(part, part, part, {"answers": ("no", "yes"), "num_classes": 2})
    task = VQATask()
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"label": "stub", "status": "done"}))

    def load(run_dir, *, device="cpu"):
        assert Path(run_dir) == run
        return task, data, model

    monkeypatch.setattr(vc, "load_run", load)
    return run


@pytest.fixture
def two_questions(monkeypatch, tmp_path):
    part = make_part([image_a(), image_b()], [0, 1], [0, 1], ["shape", "color"])
    model = StubModel(np.stack([W1, W2]), pred=[0, 0])  # q1 right, q2 wrong
    return fake_run(monkeypatch, tmp_path, part, model)


# ----------------------------------------------------------------------------- tests


def test_vqa_correctness_two_questions(two_questions: Path) -> None:
    r = vc.vqa_correctness(two_questions)
    assert r["questions"] == 2 and r["grid"] == [8, 8] and r["label"] == "stub"
    assert r["accuracy"] == 0.5 and r["model_is_uniform"] is False
    assert r["accuracy_by_type"]["shape"] == 1.0 and r["accuracy_by_type"]["color"] == 0.0
    assert math.isnan(r["accuracy_by_type"]["yes/no"])
    rho1, rho2 = naive_spearman(W1, FRAC_A), naive_spearman(W2, FRAC_B)
    m = r["maps"]["model"]
    o = m["overall"]
    assert o["mass"]["mean"] == pytest.approx((0.625 + 0.0) / 2)
    assert o["mass"]["std"] == pytest.approx(0.3125)  # population std of {0.625, 0}
    assert o["mass_touch"]["mean"] == pytest.approx(0.375)
    assert o["pointing"]["mean"] == pytest.approx(0.5)
    assert o["spearman"]["mean"] == pytest.approx((rho1 + rho2) / 2)
    assert o["mass"]["n"] == 2
    # by type and by correctness: q1 is a right "shape" question, q2 a wrong "color" one
    assert m["by_type"]["shape"]["mass"]["mean"] == pytest.approx(0.625)
    assert m["by_type"]["color"]["spearman"]["mean"] == pytest.approx(rho2)
    assert m["by_type"]["yes/no"]["mass"]["n"] == 0
    assert m["by_correct"]["correct"]["mass"]["mean"] == pytest.approx(0.625)
    assert m["by_correct"]["wrong"]["mass_touch"]["mean"] == pytest.approx(0.0)
    # the uniform reference: mass = area fraction of each region
    u = r["maps"]["uniform"]["overall"]
    assert u["mass"]["mean"] == pytest.approx((2.5 / 64 + 4 / 64) / 2)
    assert u["mass_touch"]["mean"] == pytest.approx((3 / 64 + 4 / 64) / 2)
    assert u["spearman"]["n"] == 0 and math.isnan(u["spearman"]["mean"])
    assert r["region"]["area"]["mean"] == pytest.approx(u["mass"]["mean"])
    assert r["lift"]["mass_minus_uniform"]["mean"] == pytest.approx(
        ((0.625 - 2.5 / 64) + (0 - 4 / 64)) / 2
    )
    assert r["lift"]["share_above_uniform"] == 0.5
    sp = r["spread"]
    assert sp["model"]["max_weight"]["mean"] == pytest.approx((0.5 + 1.0) / 2)
    h1 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)) / math.log(R)
    assert sp["model"]["entropy"]["mean"] == pytest.approx(h1 / 2)  # q2 is one-hot: 0
    assert sp["uniform"]["entropy"]["mean"] == pytest.approx(1.0)


def test_correctness_json_keys_and_nan_as_null(two_questions: Path) -> None:
    r = vc.vqa_correctness(two_questions)
    saved = json.loads((two_questions / "correctness.json").read_text())
    assert set(saved) == {
        "run_dir",
        "task",
        "label",
        "split",
        "questions",
        "grid",
        "accuracy",
        "accuracy_by_type",
        "model_is_uniform",
        "region",
        "maps",
        "spread",
        "lift",
        "reference",
    }
    assert set(saved["maps"]) == set(vc.MAPS) == {"model", "uniform", "random"}
    for name in vc.MAPS:
        assert set(saved["maps"][name]) == {"overall", "by_type", "by_correct"}
        assert set(saved["maps"][name]["overall"]) == set(vc.METRICS)
        assert set(saved["maps"][name]["by_type"]) == {"shape", "color", "yes/no"}
        assert set(saved["maps"][name]["by_correct"]) == {"correct", "wrong"}
    assert saved["maps"]["uniform"]["overall"]["spearman"]["mean"] is None
    assert saved["maps"]["model"]["overall"]["mass"]["mean"] == pytest.approx(
        r["maps"]["model"]["overall"]["mass"]["mean"]
    )
    assert saved["task"] == "vqa" and saved["split"] == "test"


def test_max_questions_and_no_write(two_questions: Path) -> None:
    r = vc.vqa_correctness(two_questions, max_questions=1, write=False)
    assert r["questions"] == 1
    assert r["maps"]["model"]["overall"]["mass"]["mean"] == pytest.approx(0.625)
    assert not (two_questions / "correctness.json").exists()
    with pytest.raises(ValueError, match="max_questions"):
        vc.vqa_correctness(two_questions, max_questions=0)


def test_mean_baseline_model_equals_uniform_reference(monkeypatch, tmp_path) -> None:
    part = make_part([image_a(), image_b()], [0, 1, 1], [0, 1, 0], ["shape", "color", "yes/no"])
    torch.manual_seed(0)
    model = VQAModel(5, 2, embed_dim=4, hidden_size=4, channels=(4,), attention="mean").eval()
    run = fake_run(monkeypatch, tmp_path, part, model)
    r = vc.vqa_correctness(run, write=False)
    assert r["model_is_uniform"] is True
    for metric in ("mass", "mass_touch", "pointing"):
        got = r["maps"]["model"]["overall"][metric]["mean"]
        assert got == pytest.approx(r["maps"]["uniform"]["overall"][metric]["mean"])
    assert r["maps"]["model"]["overall"]["mass"]["mean"] == pytest.approx(
        (2.5 / 64 + 4 / 64 + 4 / 64) / 3
    )
    assert r["maps"]["model"]["overall"]["spearman"]["n"] == 0
    assert r["lift"]["share_above_uniform"] == 0.0


def test_random_reference_is_chance_level_and_seeded(monkeypatch, tmp_path) -> None:
    n = 240
    image_of = [i % 2 for i in range(n)]
    part = make_part([image_a(), image_b()], image_of, [0] * n, ["shape"] * n)
    model = StubModel(np.full((n, R), 1 / R), pred=[0] * n)
    run = fake_run(monkeypatch, tmp_path, part, model)
    r = vc.vqa_correctness(run, write=False, seed=3)
    area = (2.5 / 64 + 4 / 64) / 2
    rnd = r["maps"]["random"]["overall"]
    # Dirichlet(1) maps: E[mass] = area fraction (sd of the mean ~ 0.002), E[rho] = 0
    assert rnd["mass"]["mean"] == pytest.approx(area, abs=0.01)
    assert abs(rnd["spearman"]["mean"]) < 0.05
    assert rnd["mass"]["std"] > 0
    again = vc.vqa_correctness(run, write=False, seed=3)["maps"]["random"]["overall"]
    other = vc.vqa_correctness(run, write=False, seed=4)["maps"]["random"]["overall"]
    assert again["mass"]["mean"] == rnd["mass"]["mean"]
    assert other["mass"]["mean"] != rnd["mass"]["mean"]


def test_command_prints_table(two_questions: Path) -> None:
    res = CliRunner().invoke(vc.correctness_command, [str(two_questions), "--max-questions", "2"])
    assert res.exit_code == 0, res.output
    assert "mass_touch" in res.output and "uniform" in res.output and "random" in res.output
    assert "written:" in res.output
    assert (two_questions / "correctness.json").is_file()
    bad = CliRunner().invoke(vc.correctness_command, [str(two_questions), "--max-questions", "0"])
    assert bad.exit_code != 0 and "'--max-questions'" in bad.output


# ----------------------------------------------------------------------------- real data


@pytest.mark.slow
def test_real_easy_vqa_tiny_run(tmp_path: Path) -> None:
    from attnlab.data import MissingDataError
    from attnlab.data.easy_vqa import load_easy_vqa, shape_region
    from attnlab.lab.training import load_run, train_run

    try:
        load_easy_vqa()
    except MissingDataError as error:
        pytest.skip(str(error))
    opts = dict(max_train=300, max_dev=60, max_test=120, epochs=1, hidden_size=8, embed_dim=8)
    run = train_run(
        "vqa",
        {"name": "parallel"},
        seed=0,
        options=opts,
        out_dir=tmp_path / "run",
        progress=False,
        num_threads=1,
    ).run_dir
    r = vc.vqa_correctness(run, max_questions=100)
    assert r["questions"] == 100 and r["model_is_uniform"] is False
    assert json.loads((Path(run) / "correctness.json").read_text())["questions"] == 100
    # uniform mass = the shapes' pixel share, computed here from the pixels directly
    _, data, _ = load_run(run)
    test = data.test
    share = [
        shape_region(test.images[int(test.image_index[i])].numpy()).sum() / 64**2
        for i in range(100)
    ]
    assert r["maps"]["uniform"]["overall"]["mass"]["mean"] == pytest.approx(np.mean(share))
    o = r["maps"]["model"]["overall"]
    assert 0 <= o["mass"]["mean"] <= o["mass_touch"]["mean"] <= 1
    assert -1 <= o["spearman"]["mean"] <= 1 and o["spearman"]["n"] == 100
    counts = sum(s["mass"]["n"] for s in r["maps"]["model"]["by_type"].values())
    assert counts == 100


def test_the_run_directory_is_a_path_and_tilde_is_home(tmp_path, monkeypatch):
    from attnlab._checks import ConfigError
    from attnlab.lab.checkpoint import MissingRunFileError

    for bad, error in ((3, TypeError), (None, TypeError), ("", ConfigError)):
        with pytest.raises(error, match="run_dir must"):
            vc.vqa_correctness(bad)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MissingRunFileError, match=f"'{tmp_path / 'gone'}' is not a run"):
        vc.vqa_correctness("~/gone")
