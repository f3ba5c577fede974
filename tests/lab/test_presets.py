"""Option presets of the tasks (``-o preset=paper``): every task has ``cpu`` and ``paper``;
each preset resolves to options the task accepts and its model builds at the paper's sizes
(on tiny data; nothing is trained); options given beside a preset win; a bad preset is one
line, exit 2, before anything is written. Also Jain & Wallace's SST length filter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tiny_tasks import TASKS, tiny_task

import attnlab.lab.tasks as tasks_package
from attnlab import registry
from attnlab._checks import ConfigError
from attnlab.cli import main
from attnlab.data import MissingDataError
from attnlab.lab.config import check_option_values, describe_task
from attnlab.lab.task import Task
from attnlab.lab.tasks.sentiment import SentimentTask, jain_wallace_filter
from attnlab.lab.training import resolve_task

SST = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "sst" / "sst_binary.csv"
REGISTERED = {"target_sentiment": "target-sentiment", "meta_embedding": "meta-embedding"}


def _cls(name: str) -> type[Task]:
    return registry.get("task", REGISTERED.get(name, name)).cls


def _builtin_tasks() -> list[str]:
    """The tasks attnlab ships (the registry's list, not a copy; tasks that tests register
    from plugins, such as ``toy``, are left out)."""
    return [
        name
        for name in registry.names("task")
        if registry.get("task", name).cls.__module__.startswith("attnlab.lab.tasks.")
    ]


def test_the_builtin_task_list_is_complete():
    assert len(_builtin_tasks()) == len(list(Path(tasks_package.__file__).parent.glob("[!_]*.py")))


@pytest.mark.parametrize("name", _builtin_tasks())
def test_every_task_has_a_cpu_and_a_paper_preset(name):
    """Every task attnlab ships, with the task's own checks of its options run on the
    paper preset: no data is read."""
    cls = registry.get("task", name).cls
    assert {"cpu", "paper"} <= set(cls.option_presets)
    assert cls.option_presets["cpu"] == {}
    known = {**Task._TRAINING_DEFAULTS, **cls.defaults}
    paper = cls.option_presets["paper"]
    assert paper, "the paper preset changes something"
    assert set(paper) <= set(known), sorted(set(paper) - set(known))
    check_option_values(cls, paper)  # the types of the defaults
    task = cls(preset="paper")  # the task's own checks of its options
    assert task.options["preset"] == "paper"
    for key, value in paper.items():
        assert task.options[key] == value
    assert "preset" not in cls().options  # only recorded when given


SIZES = ("hidden_size", "embed_dim", "d_proj", "attention_dim", "d_caps", "n")


@pytest.mark.parametrize("name", TASKS)
def test_the_paper_preset_builds_its_model(name):
    """The model of the paper preset builds on tiny data (nothing is trained), and where
    the preset changes a size its parameter count differs from the CPU model's."""
    small = tiny_task(name)
    data = small.load_data()
    cls = type(small)
    paper = cls(**{"preset": "paper", **_data_free_options(name)})
    torch.manual_seed(0)
    big = paper.build_model(data, paper.resolve_attention(None))
    torch.manual_seed(0)
    cpu = cls(**_data_free_options(name)).build_model(data, small.resolve_attention(None))
    changed = [
        k
        for k, v in cls.option_presets["paper"].items()
        if k in SIZES and {**Task._TRAINING_DEFAULTS, **cls.defaults}[k] not in (None, v)
    ]
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    if changed and changed != ["n"]:
        assert count(big) > count(cpu), changed
    else:
        # e.g. sentiment: its defaults are J&W's sizes; its paper model has one sigmoid
        # output (d_c + 1 parameters fewer than two logits) and two sentence markers (2 d_e)
        extra = 2 * cpu.embed_dim - (cpu.d_c + 1) if name == "sentiment" else 0
        assert count(big) == count(cpu) + extra


@pytest.mark.parametrize("name", ["multilabel", "meta-embedding"])
def test_the_untruncated_paper_presets_read_their_data(name):
    """``max_len=None`` (untruncated texts, the paper presets) reaches the data: the
    tokens of the longest text are all kept (a subsample keeps the test short)."""
    task = registry.get("task", name).cls(preset="paper", max_train=200, max_eval=50)
    assert task.options["max_len"] is None
    data = load_or_skip(task)
    cut = registry.get("task", name).cls(preset="paper", max_train=200, max_eval=50, max_len=5)
    lengths = [len(ids) for ids in data.train.ids]
    assert max(lengths) > 5
    assert max(len(ids) for ids in load_or_skip(cut).train.ids) <= 5


def load_or_skip(task: Task):
    try:
        return task.load_data()
    except MissingDataError as error:
        pytest.skip(str(error))


def _data_free_options(name: str) -> dict:
    """Options that keep a paper-size model buildable on the tiny data (no data package):
    learned embeddings where the paper preset would read GloVe."""
    if name in ("sentiment", "document", "target_sentiment"):
        return {"embeddings": "learned"}
    if name == "multilabel":
        return {"glove": False}
    return {}


def test_options_beside_a_preset_win_and_are_recorded():
    task = SentimentTask(preset="paper", epochs=2, embeddings="learned")
    assert task.options["epochs"] == 2 and task.options["hidden_size"] == 128
    assert task.options["data"] == "sst" and task.options["preset"] == "paper"
    again = resolve_task(task, {"lr": 0.01})  # rebuilt from its own options
    assert again.options == {**task.options, "lr": 0.01}
    assert SentimentTask(preset="cpu").options == {**SentimentTask().options, "preset": "cpu"}
    assert SentimentTask(preset=None).options == SentimentTask().options


@pytest.mark.parametrize("bad", ["papers", "PAPER", 3])
def test_an_unknown_preset_names_the_known_ones(bad):
    with pytest.raises(ConfigError) as err:
        SentimentTask(preset=bad)
    message = str(err.value)
    assert "\n" not in message
    assert f"no option preset {bad!r}; its option presets: cpu, paper" in message


def test_cli_bad_preset_is_one_line_exit_2(tmp_path):
    out = tmp_path / "out"
    argv = ["train", "pointer", "--no-progress", "--out", str(out), "-o", "preset=huge"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "error: task 'pointer' has no option preset 'huge'; its option presets: cpu, paper"
    ]
    assert not out.exists()


def test_list_options_shows_the_presets():
    text = describe_task(_cls("pointer"))
    assert "option presets (-o preset=NAME" in text
    assert "  cpu    the defaults above" in text
    assert "paper  problem=hull, n=50" in text


def test_jain_wallace_filter():
    """More than 5 tokens and fewer than the split's longest, both strict."""
    rows = [(tuple("w" * 1 for _ in range(n)), n % 2) for n in (3, 5, 6, 9, 12, 12)]
    kept = jain_wallace_filter(rows)
    assert [len(t) for t, _ in kept] == [6, 9]
    assert jain_wallace_filter([]) == []


def test_length_filter_option_values():
    with pytest.raises(ConfigError, match="option length_filter must be 'jain-wallace'"):
        SentimentTask(length_filter="jw")


@pytest.mark.skipif(not SST.is_file(), reason=f"the SST CSV of shared/ is absent ({SST})")
def test_the_paper_preset_reads_jain_and_wallaces_sst_split():
    """6,355 / 1,725 train / test sentences: the sizes of J&W's SST (863 + 862 test
    sentences in their evaluate.json)."""
    task = SentimentTask(preset="paper", path=str(SST), embeddings="learned")
    data = task.load_data()
    assert (len(data.train), len(data.test)) == (6355, 1725)
    assert min(len(t) for t in data.test.tokens) == 6
    everything = SentimentTask(data="sst", path=str(SST), embeddings="learned").load_data()
    assert len(everything.test) == 1821
