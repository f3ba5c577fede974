"""The files of a run directory under damage: checked JSON files, the checkpoint's sha256,
one-line errors naming the file, work folders of killed runs, and publishing a run
directory while another process does the same."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import attnlab.lab.training as training
from attnlab._checks import ConfigError
from attnlab.lab._process import host_tag
from attnlab.lab.checkpoint import MissingRunFileError, RunFileError, file_sha256
from attnlab.lab.training import load_run, read_metrics, read_run, read_run_file, train_run

pytestmark = pytest.mark.usefixtures("toy_task_module")  # registers "toy"


@pytest.fixture
def run(tmp_path, toy_run_dir):
    """A private copy of a finished toy run."""
    return shutil.copytree(toy_run_dir, tmp_path / "run")


def _one_line_naming(err: BaseException, path) -> None:
    assert str(path) in str(err) and "\n" not in str(err)


# ----------------------------------------------------------------------------- JSON files


def test_a_finished_run_reads_back(run):
    assert read_run(run)["status"] == "done"
    assert set(read_metrics(run)) >= {"dev", "test", "primary"}
    assert isinstance(read_run_file(run, "history.json"), list)


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("metrics.json", "[1, 2]", "holds list, not an object"),
        ("metrics.json", '{"test": [0.5]}', "'test' is list"),
        ("metrics.json", '{"test": {"accuracy": "high"}}', "not a number"),
        ("metrics.json", "{", "not readable JSON"),
        ("metrics.json", "", "not readable JSON"),
        ("run.json", '"done"', "holds str"),
        ("run.json", '{"task": "toy", "status": "done", "seed": "zero"}', "'seed' is str"),
        ("run.json", '{"status": "done"}', "has no 'task'"),
        ("history.json", '{"epoch": 1}', "holds dict, not a list"),
        ("history.json", "[1]", "entry 0 is not an object"),
    ],
)
def test_a_malformed_file_is_one_line_naming_it(run, name, text, problem):
    (run / name).write_text(text)
    with pytest.raises(RunFileError, match=problem) as info:
        read_run_file(run, name)
    _one_line_naming(info.value, run / name)


def test_a_missing_file(run):
    (run / "metrics.json").unlink()
    with pytest.raises(MissingRunFileError, match="missing") as info:
        read_metrics(run)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        read_run(run / "nowhere")


# ----------------------------------------------------------------------------- checkpoint


def test_run_json_records_the_checkpoint_sha256(run):
    assert read_run(run)["checkpoint_sha256"] == file_sha256(run / "model.safetensors")


def test_a_flipped_byte_in_the_tensor_data_is_refused(run):
    path = run / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the last tensor: safetensors alone would load it silently
    path.write_bytes(bytes(data))
    with pytest.raises(RunFileError, match="sha256") as info:
        load_run(run)
    _one_line_naming(info.value, path)


def test_a_run_written_before_checksums_still_loads(run, toy_run_dir):
    info = json.loads((run / "run.json").read_text())
    del info["checkpoint_sha256"]
    (run / "run.json").write_text(json.dumps(info))
    model = load_run(run)[2]
    _, _, reference = load_run(toy_run_dir)
    for (name, a), (_, b) in zip(
        model.state_dict().items(), reference.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("damage", ["truncated", "zero-length", "random", "missing"])
def test_a_damaged_checkpoint_is_one_line_naming_it(run, damage):
    path = run / "model.safetensors"
    info = json.loads((run / "run.json").read_text())
    del info["checkpoint_sha256"]  # the file itself must be judged, not only its checksum
    (run / "run.json").write_text(json.dumps(info))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "zero-length":
        path.write_bytes(b"")
    elif damage == "random":
        path.write_bytes(os.urandom(512))
    else:
        path.unlink()
    expected = MissingRunFileError if damage == "missing" else RunFileError
    with pytest.raises(expected) as info:
        load_run(run)
    _one_line_naming(info.value, path)


# ----------------------------------------------------------------------------- work folders


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_work_folders_are_removed_and_live_ones_kept(tmp_path):
    host, dead, me = host_tag(), _dead_pid(), os.getpid()
    names = {
        f".r.tmp-{dead}.{host}.abc123": False,  # a killed run's work folder
        f".r.old-{dead}.{host}.17": False,  # a killed replacement's old directory
        f".r.tmp-{me}.{host}.def456": True,  # a live process's
        f".r.tmp-{dead}.{host}-elsewhere.x": True,  # another host's: cannot tell
        ".r.tmp-legacy1": True,  # no owner in the name
        f".s.tmp-{dead}.{host}.abc": True,  # another run (with name="r")
    }
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
    removed = training.remove_stale_work_dirs(tmp_path, "r")
    assert sorted(p.name for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, k in names.items() if k)
    training.remove_stale_work_dirs(tmp_path)
    assert not (tmp_path / f".s.tmp-{dead}.{host}.abc").exists()


def test_a_run_removes_the_work_folders_its_killed_predecessors_left(tmp_path):
    stale = tmp_path / f".r.tmp-{_dead_pid()}.{host_tag()}.abc123"
    stale.mkdir()
    train_run("toy", options={"epochs": 1}, out_dir=tmp_path / "r", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


# ----------------------------------------------------------------------------- publishing


def test_publishing_while_another_process_publishes_the_same_run(tmp_path, monkeypatch):
    """Another process moves its directory into place between our check and our rename:
    the rename onto a non-empty directory fails (ENOTEMPTY); ours must still end up there,
    not turn a finished run into a failure."""
    out = tmp_path / "r"
    real = os.replace
    raced = []

    def racing_replace(src, dst):
        if str(dst) == str(out) and not raced:
            raced.append(True)
            out.mkdir()
            (out / "run.json").write_text('{"from": "the other process"}')
        return real(src, dst)

    monkeypatch.setattr(os, "replace", racing_replace)
    train_run("toy", options={"epochs": 1}, out_dir=out, progress=False)
    assert raced and read_run(out)["status"] == "done"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_other_rename_errors_still_raise(tmp_path, monkeypatch):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.mkdir()

    def denied(a, b):
        raise OSError(errno.EACCES, "denied")

    monkeypatch.setattr(os, "replace", denied)
    with pytest.raises(OSError, match="denied"):
        training._replace_dir(src, dst)


# ------------------------------------------------------------- what a run may replace


@pytest.mark.parametrize(
    ("out_dir", "error"), [("", ConfigError), ("  ", ConfigError), (5, TypeError), (None, None)]
)
def test_an_empty_or_non_path_out_dir_is_refused(tmp_path, monkeypatch, out_dir, error):
    """``out_dir=""`` is the working folder: a run there would replace the whole folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    if out_dir is None:  # None is the default run directory, not an error
        train_run("toy", options={"epochs": 1}, out_dir=out_dir, progress=False)
        assert (tmp_path / "notes.txt").read_text() == "mine"
        return
    with pytest.raises(error, match="out_dir must"):
        train_run("toy", options={"epochs": 1}, out_dir=out_dir, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_folder_of_other_files_is_never_replaced(tmp_path):
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "chapter1.tex").write_text("precious")
    with pytest.raises(ConfigError, match=r"no run\.json") as caught:
        train_run("toy", options={"epochs": 1}, out_dir=out, progress=False)
    _one_line_naming(caught.value, out)
    assert [p.name for p in out.iterdir()] == ["chapter1.tex"]
    assert [p.name for p in tmp_path.iterdir()] == ["thesis"]  # no work folder either


def test_a_file_is_never_replaced(tmp_path):
    out = tmp_path / "results"
    out.write_text("precious")
    with pytest.raises(ConfigError, match="is a file"):
        train_run("toy", options={"epochs": 1}, out_dir=out, progress=False)
    assert out.read_text() == "precious"
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


def test_an_empty_folder_and_a_dangling_link_are_replaced(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    train_run("toy", options={"epochs": 1}, out_dir=empty, progress=False)
    assert read_run(empty)["status"] == "done"
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "nowhere")
    train_run("toy", options={"epochs": 1}, out_dir=link, progress=False)
    assert not link.is_symlink() and read_run(link)["status"] == "done"


def test_a_folder_that_gains_files_while_the_run_trains_keeps_them(tmp_path):
    """The check before training cannot see the future: a folder that holds other files
    when the run is published keeps them, and the finished run goes beside it."""
    out = tmp_path / "r"

    def user_writes_there():
        out.mkdir()
        (out / "draft.txt").write_text("precious")

    with pytest.raises(ConfigError, match="the run is kept in") as caught:
        train_run(
            "toy",
            options={"epochs": 1},
            out_dir=out,
            progress=False,
            before_publish=user_writes_there,
        )
    assert [p.name for p in out.iterdir()] == ["draft.txt"]
    (kept,) = tmp_path.glob("r.run-*")
    assert str(kept) in str(caught.value)
    assert read_run(kept)["status"] == "done"
    assert read_run(kept)["checkpoint_sha256"] == file_sha256(kept / "model.safetensors")


def test_a_failed_run_into_a_folder_that_gained_files_is_not_published(tmp_path):
    out = tmp_path / "r"

    def user_writes_there():
        out.mkdir()
        (out / "draft.txt").write_text("precious")

    options = {"epochs": 1, "fail_after_steps": 1}
    with (
        pytest.warns(UserWarning, match="the run is not published"),
        pytest.raises(RuntimeError, match="failing on purpose"),
    ):
        train_run(
            "toy", options=options, out_dir=out, progress=False, before_publish=user_writes_there
        )
    assert [p.name for p in out.iterdir()] == ["draft.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


class Stop(Exception):
    pass


@pytest.mark.parametrize("fails", [False, True])
def test_before_publish_can_stop_a_run_from_being_written(tmp_path, fails):
    def refuse():
        raise Stop

    options = {"epochs": 1, "fail_after_steps": 1 if fails else None}
    with pytest.raises(Stop):
        train_run(
            "toy", options=options, out_dir=tmp_path / "r", progress=False, before_publish=refuse
        )
    # neither the run nor its work folder; only the state of its last finished epoch, from
    # which the same run started again goes on (attnlab.lab.resume)
    left = [p.name for p in tmp_path.iterdir()]
    assert left == ([] if fails else [".r.resume.safetensors"])


# ----------------------------------------------------------------------------- ~ in paths


def test_a_run_directory_under_home_is_written_and_read_with_tilde(tmp_path, monkeypatch):
    """``~`` means the home folder in every path of the lab, as in the data loaders: the
    run goes to ``$HOME/runs/one`` (not to a folder named ``~`` in the working folder),
    and the readers find it again by the same text."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    train_run("toy", options={"epochs": 1}, out_dir="~/runs/one", progress=False)
    assert read_run("~/runs/one")["status"] == "done"
    assert read_metrics("~/runs/one") == read_metrics(home / "runs" / "one")
    task, _data, _model = load_run("~/runs/one")
    assert task.name == "toy"
    assert list(work.iterdir()) == []  # no folder named "~"


@pytest.mark.parametrize("reader", [read_run, read_metrics, load_run])
@pytest.mark.parametrize(
    ("run_dir", "error"), [(5, TypeError), (None, TypeError), ("", ConfigError)]
)
def test_a_run_reader_refuses_a_non_path_in_one_line(reader, run_dir, error):
    """An int was read as an open file descriptor by ``open`` deep inside; ``""`` is the
    working folder."""
    with pytest.raises(error, match="run_dir must") as caught:
        reader(run_dir)
    assert "\n" not in str(caught.value)


def test_a_missing_run_under_home_is_named_by_its_real_place(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MissingRunFileError) as caught:
        read_run("~/nowhere")
    _one_line_naming(caught.value, tmp_path / "nowhere")
