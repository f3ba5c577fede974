"""The trainer's data pipeline: prefetching on a background thread (same batches, errors
propagate, the thread ends), the time spent waiting for data and the examples per second
in cost.json / history.json, ``attnlab train --profile``, the lazily read-back loss, and
resuming an ablation recorded before a task gained an option."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from click.testing import CliRunner

from attnlab.cli import main, profile_line
from attnlab.lab.ablation import run_ablation
from attnlab.lab.training import (
    DataTimer,
    _read_losses,
    batch_examples,
    device_batches,
    resolve_task,
    train_run,
)

TOY = "tests.lab.toy_task"
TINY = {"epochs": 2, "n_train": 96, "n_eval": 16}


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "attnlab-prefetch"]


def _toy_batches(toy_task_module, seed: int = 0):
    task = resolve_task("toy", {"n_train": 64})
    data = task.load_data()
    g = torch.Generator().manual_seed(seed)
    return task.batches(data, "train", 8, shuffle=True, generator=g)


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetching_gives_the_same_batches(toy_task_module, prefetch):
    plain = list(device_batches(_toy_batches(toy_task_module), torch.device("cpu")))
    timer = DataTimer()
    ahead = list(
        device_batches(
            _toy_batches(toy_task_module), torch.device("cpu"), prefetch=prefetch, timer=timer
        )
    )
    assert len(plain) == len(ahead) == 8
    for a, b in zip(plain, ahead, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert timer.batches == 8 and timer.examples == 64 and timer.seconds >= 0
    assert not _prefetch_threads()


def test_a_producer_error_is_raised_in_the_consumer():
    def broken():
        yield {"labels": torch.zeros(2)}
        raise RuntimeError("bad row 7")

    stream = device_batches(broken(), torch.device("cpu"), prefetch=2)
    assert batch_examples(next(stream)) == 2
    with pytest.raises(RuntimeError, match="bad row 7"):
        next(stream)
    assert not _prefetch_threads()


def test_stopping_early_ends_the_thread():
    def endless():
        while True:
            yield {"labels": torch.zeros(1)}

    stream = device_batches(endless(), torch.device("cpu"), prefetch=2)
    next(stream)
    stream.close()
    assert not _prefetch_threads()


def test_batch_examples():
    assert batch_examples({"images": torch.zeros(2, 3), "index": torch.arange(5)}) == 5
    assert batch_examples({"x": torch.zeros(4, 3), "labels": torch.zeros(6)}) == 6
    assert batch_examples({"src": torch.zeros(3, 9)}) == 3
    assert batch_examples((torch.zeros(7), 1)) == 7
    assert batch_examples({"n": 3}) == 0


def test_train_run_with_prefetching_gives_the_same_run(tmp_path, toy_task_module):
    a = train_run("toy", options=TINY, out_dir=tmp_path / "a", progress=False, prefetch=0)
    b = train_run("toy", options=TINY, out_dir=tmp_path / "b", progress=False, prefetch=2)
    assert a.metrics == b.metrics
    assert [h["train_loss"] for h in a.history] == [h["train_loss"] for h in b.history]
    assert (a.cost["prefetch"], b.cost["prefetch"]) == (0, 2)
    assert not _prefetch_threads()


def test_waiting_for_slow_batches_shows_in_the_data_share(tmp_path, toy_task_module):
    """A task whose batches take 20 ms each to build and whose steps are fast spends most
    of its training loop waiting for data; the figures say so."""

    class SlowData(toy_task_module.ToyTask):
        def batches(self, data, split, batch_size, **kw):
            for batch in super().batches(data, split, batch_size, **kw):
                if split == "train":
                    time.sleep(0.02)
                yield batch

    task = SlowData(**TINY)
    result = train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)
    cost = result.cost
    assert cost["data_share"] > 0.5
    assert cost["data_seconds"] >= 2 * 3 * 0.02  # 2 epochs x 3 batches x 20 ms
    # examples per second: 2 epochs x 96 examples over the time of the training loops
    loops = cost["data_seconds"] / cost["data_share"]
    assert cost["examples_per_second"] == pytest.approx(2 * 96 / loops)
    for h in result.history:
        assert h["data_share"] > 0.5 and h["examples_per_second"] > 0
    history = json.loads((result.run_dir / "history.json").read_text())
    assert history[0]["data_share"] == pytest.approx(result.history[0]["data_share"])


def test_train_profile_prints_the_throughput(tmp_path):
    out = tmp_path / "out"
    argv = ["train", "toy", "--plugin", TOY, "--no-progress", "--out", str(out)]
    result = CliRunner().invoke(
        main, [*argv, "--seed", "0", "--seed", "1", "--epochs", "1", "--profile"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if " examples/s;" in line]
    assert [line.split(":")[0] for line in lines] == ["seed 0", "seed 1"]
    cost = json.loads((out / "default--seed0" / "cost.json").read_text())
    assert lines[0] == f"seed 0: {profile_line(cost)}"
    assert "% of the training loops" in lines[0] and "(no prefetching)" in lines[0]
    plain = CliRunner().invoke(main, [*argv, "--epochs", "1"])
    assert "examples/s" not in plain.output


def test_profile_line_of_an_old_run():
    assert "no throughput recorded" in profile_line({"train_seconds": 1.0})


def test_read_losses_sums_and_names_the_first_bad_batch():
    pending = [torch.tensor(0.5), torch.tensor(0.25)]
    assert _read_losses(pending, 1, 2) == 0.75 and pending == []
    assert _read_losses([], 1, 0) == 0.0
    bad = [torch.tensor(1.0), torch.tensor(float("nan")), torch.tensor(float("inf"))]
    with pytest.raises(FloatingPointError, match="loss is nan at epoch 3, batch 9;"):
        _read_losses(bad, 3, 10)  # batches 8, 9, 10 are pending


def test_a_non_finite_loss_fails_the_run_naming_the_batch(tmp_path, toy_task_module):
    class NaNAtThree(toy_task_module.ToyTask):
        def loss(self, model, batch):
            loss = super().loss(model, batch)
            return loss * float("nan") if self.steps == 3 else loss

    task = NaNAtThree(**TINY)
    with pytest.raises(FloatingPointError, match="at epoch 1, batch 3; lower lr"):
        train_run(task, "tanh", out_dir=tmp_path / "r", progress=False)


def test_resuming_an_ablation_recorded_before_an_option_existed(tmp_path, toy_task_module):
    """ablation.json written before the task had an option (here: step_sleep): resuming
    with that option at its default is the same ablation, not a mismatch."""
    out = tmp_path / "ab"
    options = {"epochs": 1, "n_train": 32, "n_eval": 8}
    run_ablation("toy", [{"name": "tanh"}], [0], out_dir=out, options=options, progress=False)
    meta = json.loads((out / "ablation.json").read_text())
    del meta["task_options"]["step_sleep"]
    (out / "ablation.json").write_text(json.dumps(meta))
    again = run_ablation(
        "toy", [{"name": "tanh"}], [0], out_dir=out, options=options, progress=False
    )
    assert again.skipped and not again.ran
    # a recorded value other than the default still is a mismatch
    meta["task_options"]["n_eval"] = 9
    (out / "ablation.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="n_eval=9 -> 8"):
        run_ablation("toy", [{"name": "tanh"}], [0], out_dir=out, options=options, progress=False)
