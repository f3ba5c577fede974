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


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"lr": -1.0}, "option lr must be > 0, got -1.0"),
        ({"weight_decay": -0.1}, "option weight_decay must be >= 0"),
        ({"grad_clip": -1.0}, "option grad_clip must be >= 0 (0 or none: no clipping)"),
    ],
)
def test_training_values_out_of_range_write_nothing(tmp_path, options, text):
    # torch would refuse the learning rate only after the data is loaded (and a run marked
    # failed written); a negative clipping norm it would take, flipping the gradients
    with pytest.raises(ConfigError) as info:
        train_run("toy", options=options, out_dir=tmp_path / "runs" / "r", progress=False)
    assert text in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_a_file_above_the_run_directory_is_a_config_error(tmp_path):
    (tmp_path / "afile").write_text("keep")
    out = tmp_path / "afile" / "x" / "r"
    with pytest.raises(ConfigError, match=r"afile is a file, not a folder$"):
        train_run("toy", options={"epochs": 1}, out_dir=out, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]
