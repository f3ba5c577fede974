"""train_run when the task model rejects the spec or an option: a one-line ConfigError
(ModelBuildError) and nothing written -- unlike an error during training, which leaves a
run directory whose run.json says "failed"."""

from __future__ import annotations

import json

import pytest
import toy_task  # noqa: F401 -- registers "toy"

from attnlab._checks import ConfigError
from attnlab.lab.training import ModelBuildError, train_run


@pytest.mark.parametrize(
    ("spec", "options", "text"),
    [
        ({"score": "dot", "dim": "multi"}, {}, "needs a vector score"),
        ({"score": "additive", "d_w": "abc"}, {}, "d_w must be a positive int"),
        ({}, {"encoder": "nope"}, "encoder must be one of"),
        ({"score": "queryless", "bogus": 1}, {}, "unknown options ['bogus']"),
    ],
)
def test_a_model_that_cannot_be_built_writes_nothing(tmp_path, spec, options, text):
    out = tmp_path / "runs" / "r"
    with pytest.raises(ModelBuildError) as info:
        train_run("toy", spec, options={"epochs": 1, **options}, out_dir=out, progress=False)
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert message.startswith("task 'toy' cannot build its model with attention ")
    assert text in message and "\n" not in message
    assert list((tmp_path / "runs").iterdir()) == []  # no run directory, no work folder


def test_an_error_while_training_still_leaves_a_failed_run(tmp_path):
    out = tmp_path / "r"
    with pytest.raises(RuntimeError, match="failing on purpose"):
        train_run("toy", "tanh", options={"fail_after_steps": 1}, out_dir=out, progress=False)
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "failed" and "RuntimeError" in info["error"]
