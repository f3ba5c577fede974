"""`attnlab explain` on a run whose files are missing or damaged: one ``error:`` line
naming the file, exit status 2, no traceback."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import toy_task  # noqa: F401  (registers the "toy" task)

from attnlab.lab.studies.explanation import explain_command
from attnlab.lab.training import train_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain-files")
    opts = {"epochs": 1, "n_train": 64, "n_eval": 32}
    return Path(train_run("toy", {"name": "tanh"}, options=opts, out_dir=root / "r").run_dir)


def _damage(run: Path, damage: str) -> Path:
    """Damage a copy of ``run``; return the file that was damaged."""
    ckpt = run / "model.safetensors"
    if damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    elif damage == "zero-length":
        ckpt.write_bytes(b"")
    elif damage == "random":
        ckpt.write_bytes(os.urandom(1024))
    elif damage == "missing":
        ckpt.unlink()
    elif damage == "flipped-byte":
        data = bytearray(ckpt.read_bytes())
        data[-2] ^= 0x10
        ckpt.write_bytes(bytes(data))
    elif damage == "run-json-list":
        (run / "run.json").write_text("[]")
        return run / "run.json"
    elif damage == "run-json-invalid":
        (run / "run.json").write_text('{"task": "toy",')
        return run / "run.json"
    elif damage == "no-run-json":
        (run / "run.json").unlink()
        return run
    return ckpt


@pytest.mark.parametrize(
    "damage",
    [
        "truncated",
        "zero-length",
        "random",
        "missing",
        "flipped-byte",
        "run-json-list",
        "run-json-invalid",
        "no-run-json",
    ],
)
def test_a_damaged_run_is_one_error_line(trained: Path, tmp_path: Path, damage: str) -> None:
    run = Path(shutil.copytree(trained, tmp_path / "r"))
    if damage in ("truncated", "zero-length", "random"):  # judge the file, not the checksum
        info = json.loads((run / "run.json").read_text())
        info.pop("checkpoint_sha256")
        (run / "run.json").write_text(json.dumps(info))
    damaged = _damage(run, damage)
    res = CliRunner().invoke(explain_command, [str(run), "--quick", "--no-progress"])
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert str(damaged) in lines[0]


def test_the_run_directory_is_a_path_and_tilde_is_home(tmp_path: Path, monkeypatch) -> None:
    from attnlab._checks import ConfigError
    from attnlab.lab.checkpoint import MissingRunFileError
    from attnlab.lab.studies.explanation import explain_run

    for bad, error in ((3, TypeError), (None, TypeError), ("", ConfigError)):
        with pytest.raises(error, match="run_dir must"):
            explain_run(bad)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MissingRunFileError, match=f"'{tmp_path / 'gone'}' is not a run"):
        explain_run("~/gone")
