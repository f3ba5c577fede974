"""The checks of attnlab.lab.config made before a run starts: ``check_attention`` (specs
against a task, without its data), ``check_option_values`` (option types, one option per
``-o``), ``format_value`` and the help texts ``task_presets`` / ``describe_task``.

They must reject what is mistyped and never what a task takes: every preset of every
registered task, the task-specific keys of the models that have their own (translation's
``style``, VQA's ``co_attention``, ...) and every ``train`` / ``ablate`` command in the docs
pass.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest

import attnlab.lab.tasks  # noqa: F401 -- registers the lab's tasks
from attnlab import registry
from attnlab._checks import ConfigError
from attnlab.lab.ablation import expand_grid
from attnlab.lab.config import (
    check_attention,
    check_model_values,
    check_option_values,
    coerce_value,
    describe_task,
    format_value,
    parse_attention,
    parse_options,
    task_presets,
)
from attnlab.lab.training import resolve_task
from attnlab.models.sentence import SentenceClassifier
from attnlab.models.target import TargetSentimentClassifier

ROOT = Path(__file__).resolve().parents[2]
TASKS = registry.names("task")


def _task(name: str):
    return registry.get("task", name).cls()


# ----------------------------------------------------------------------------- no false alarms


@pytest.mark.parametrize("name", TASKS)
def test_every_preset_default_and_baseline_passes(name):
    task = _task(name)
    assert check_attention(task, {}) == task.default_attention
    for preset in task.presets:
        assert check_attention(task, {"name": preset}) == task.presets[preset]
    for baseline in task.baselines:
        assert check_attention(task, {"name": baseline}) == {"name": baseline}


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("translation", {"style": "bahdanau", "score": "general", "align": "local-p", "D": 4}),
        ("vqa", {"name": "alternating", "score": "dot"}),
        ("vqa", {"co_attention": "parallel", "affinity": "max"}),
        ("multilabel", {"routing": True, "d_caps": 8, "iterations": 2}),
        ("meta-embedding", {"meta": "cdme", "align": "sparsemax"}),
        ("target-sentiment", {"score": "additive", "align": "soft", "hops": 2}),
        ("document", {"score": "scaled-dot", "query_dim": 16}),
        ("document", {"score": "han"}),  # a preset name used as the score
        ("sentiment", {"score": "additive", "align": "sparsemax", "d_w": 64}),
        ("sentiment", {"name": "tanh", "align": "sparsemax"}),
        ("sentiment", {"score": "dot", "num_queries": 2, "key_dim": 16}),
        ("sentiment", {"name": "uniform", "d_w": 32}),
        ("pointer", {"score": "additive", "d_w": 16}),
    ],
)
def test_task_specific_specs_pass(name, spec):
    check_attention(_task(name), spec)


def _doc_commands() -> list[tuple[str, str, list[str]]]:
    """(page, task, arguments) of every ``attnlab train|ablate TASK ...`` in the docs."""
    found = []
    pattern = re.compile(r"attnlab (?:train|ablate) ([a-z][a-z-]*)((?: [^`|#\n]*)?)")
    for page in sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]):
        for match in pattern.finditer(page.read_text(encoding="utf-8")):
            task, rest = match.group(1), match.group(2)
            if task not in TASKS or "..." in rest:
                continue
            try:
                args = shlex.split(rest.rstrip("\\ "))
            except ValueError:
                continue
            found.append((str(page.relative_to(ROOT)), task, args))
    return found


DOC_COMMANDS = _doc_commands()


def test_the_docs_have_commands_to_check():
    assert len(DOC_COMMANDS) > 20


@pytest.mark.parametrize(("page", "task", "args"), DOC_COMMANDS)
def test_every_documented_command_passes_the_checks(page, task, args):
    specs, options = [], []
    for flag, value in itertools.pairwise(args):
        if flag in ("-a", "--attention"):
            specs.append(parse_attention(value))
        elif flag in ("-g", "--grid"):
            specs += expand_grid(value)
        elif flag in ("-o", "--option"):
            options.append(value)
    opts = parse_options(options)
    if "scale" in opts:  # the deprecations table of docs/call-convention.md shows the old form
        with pytest.warns(DeprecationWarning, match="use preset="):
            the_task = resolve_task(task, opts)
    else:
        the_task = resolve_task(task, opts)
    check_option_values(the_task, opts)
    for spec in specs or [{}]:
        check_attention(the_task, spec)


# ----------------------------------------------------------------------------- typos


@pytest.mark.parametrize(
    ("name", "spec", "text"),
    [
        ("sentiment", {"score": "foo", "align": "soft"}, "unknown score 'foo'"),
        ("sentiment", {"align": "softmx"}, "unknown align 'softmx'"),
        ("sentiment", {"dim": "multiple"}, "unknown dim 'multiple'"),
        ("sentiment", {"score": 3}, "score must be a registered score name, got 3"),
        ("sentiment", {"score": "dot;align=soft"}, "with ',' (score=dot,align=soft)"),
        ("sentiment", {"foo": "bar"}, "unknown key(s) foo"),
        ("sentiment", {"score": "dot", "d_w": 8}, "score 'dot' takes no options"),
        ("sentiment", {"name": "uniform", "foo": 1}, "unknown key(s) foo"),
        ("sentiment", {"name": "tanhh"}, "no attention preset 'tanhh'"),
        # names are checked in every task, keys only where the model takes generic specs
        ("translation", {"style": "luong", "score": "bahdanou"}, "unknown score 'bahdanou'"),
        ("vqa", {"co_attention": "parallel", "align": "nope"}, "unknown align 'nope'"),
    ],
)
def test_typos_are_one_line_config_errors(name, spec, text):
    with pytest.raises(ConfigError) as info:
        check_attention(_task(name), spec)
    message = str(info.value)
    assert text in message
    assert "\n" not in message
    assert message.startswith("attention ") or "preset" in message


def test_the_message_shows_the_spec_as_typed():
    with pytest.raises(ConfigError, match=r"^attention 'score=foo,align=soft' of task 'toy'"):
        import toy_task  # noqa: F401 -- registers "toy"

        check_attention(_task("toy"), parse_attention("score=foo,align=soft"))


def test_task_specific_keys_are_left_to_the_model():
    # translation's model has its own keys: an unknown one is for the model to report
    check_attention(_task("translation"), {"style": "luong", "whatever": 1})


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"lr": "abc"}, "option lr must be a number (its default is 0.001), got 'abc'"),
        ({"epochs": 2.5}, "option epochs must be an integer"),
        ({"epochs": True}, "option epochs must be an integer"),
        ({"freeze_embeddings": 1}, "option freeze_embeddings must be true or false"),
        ({"epochs": "3;lr=0.1"}, "(-o epochs=3 -o lr=0.1)"),
        ({"encoder": "cnn,hidden_size=8"}, "(-o encoder=cnn -o hidden_size=8)"),
        # the ranges of the training options
        ({"lr": -1}, "option lr must be > 0, got -1"),
        ({"lr": 0.0}, "option lr must be > 0, got 0.0"),
        ({"lr": None}, "option lr must be a number > 0, got 'none'"),
        ({"lr": float("nan")}, "option lr must be finite, got nan"),
        ({"weight_decay": -1e-5}, "option weight_decay must be >= 0 (0 or none: no weight"),
        ({"grad_clip": -0.5}, "option grad_clip must be >= 0 (0 or none: no clipping), got"),
        ({"grad_clip": float("inf")}, "option grad_clip must be finite, got inf"),
        ({"lr": 10**400}, "option lr must be finite, got 1000"),  # an OverflowError once
        ({"epochs": 0}, "option epochs must be an int >= 1, got 0"),
        ({"batch_size": None}, "option batch_size must be an int >= 1, got None"),
        # the shared model options, before any data is read (once only the model knew)
        ({"dropout": 1.5}, "option dropout must be in [0, 1), got 1.5"),
        ({"dropout": -1}, "option dropout must be in [0, 1), got -1"),
        ({"dropout": None}, "option dropout must be in [0, 1), got None"),
        ({"hidden_size": 0}, "option hidden_size must be an int >= 1, got 0"),
        ({"embed_dim": -3}, "option embed_dim must be an int >= 1, got -3"),
        ({"embed_dim": None}, "option embed_dim must be an int >= 1, got None"),
    ],
)
def test_bad_option_values(options, text):
    with pytest.raises(ConfigError) as info:
        check_option_values(registry.get("task", "sentiment").cls, options)
    assert text in str(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"lr": 1},  # an int where the default is a float
        {"grad_clip": None},  # none is left to the task
        {"grad_clip": 0, "weight_decay": None},  # no clipping, no weight decay
        {"grad_clip": 0.5, "weight_decay": 0, "lr": 1e-4},
        {"max_train": 200},  # default None: any type
        {"path": "/data/a=b/sst.csv"},  # '=' in a value is fine without ',key='
        {"encoder": "cnn", "epochs": 2, "freeze_embeddings": False, "dropout": 0.5},
        {"not_an_option": "x"},  # the task reports unknown names, with the known ones
    ],
)
def test_good_option_values(options):
    check_option_values(registry.get("task", "sentiment").cls, options)


@pytest.mark.parametrize("name", ["captioning", "document", "multilabel", "speech", "vqa"])
def test_shared_model_options_are_checked_for_every_task_that_has_them(name):
    """Each task with a dropout refuses 1.5 before its data is read; a task without the
    option leaves it to its own list of known options."""
    cls = registry.get("task", name).cls
    with pytest.raises(ConfigError, match=r"option dropout must be in \[0, 1\), got 1.5"):
        check_option_values(cls, {"dropout": 1.5})
    check_option_values(cls, {"dropout": 0.25})
    check_model_values({"dropout": 7}, {"hidden_size": 3})  # not an option of that task


@pytest.mark.parametrize("value", [None, True, False, 3, -2, 0.5, 1e-05, "cnn", [1, 3], []])
def test_format_value_is_read_back_by_coerce_value(value):
    assert coerce_value(format_value(value)) == value


# ----------------------------------------------------------------------------- help


def test_task_presets_marks_the_default():
    sentiment = registry.get("task", "sentiment").cls
    assert task_presets(sentiment) == (
        "tanh (default), dot, multi, sparsemax, hard; baselines mean, uniform, max"
    )


def test_describe_task_lists_every_option_and_preset():
    cls = registry.get("task", "translation").cls
    text = describe_task(cls)
    lines = text.splitlines()
    defaults = {**cls._TRAINING_DEFAULTS, **cls.defaults}
    for key, value in defaults.items():
        assert any(x.split() == [key, format_value(value)] for x in lines), key
    for name in cls.presets:
        assert any(x.split()[:1] == [name] for x in lines), name
    assert lines[0] == "task translation"
    assert any(x.split()[:1] == ["(default)"] for x in lines)


@pytest.mark.parametrize("name", ["captioning", "vqa"])
@pytest.mark.parametrize("channels", [16, [], [16.9], [True], [0], [8, -2], "16", None])
def test_channels_are_checked_before_any_data(name, channels) -> None:
    """``channels=16`` failed after the data ("'int' object is not iterable") and
    ``[16.9]`` quietly became ``[16]``: now a one-line ConfigError at construction."""
    cls = registry.get("task", name).cls
    with pytest.raises(ConfigError) as caught:
        cls(channels=channels)
    message = f"option channels must be a non-empty list of ints >= 1, got {channels!r}"
    assert str(caught.value) == message
    assert cls(channels=[4, 8]).options["channels"] == [4, 8]
    assert cls(channels=(4,)).options["channels"] == (4,)


@pytest.mark.parametrize(("name", "wrong"), [("sentiment", "lstm"), ("target-sentiment", "cnn")])
@pytest.mark.parametrize("value", ["bogus", "", "wrong", None, 1])
def test_encoder_is_checked_before_any_data(name, wrong, value):
    """``encoder=bogus`` (or another model's encoder) failed only when the model was
    built, after the data was read; now a one-line ConfigError naming the option at
    construction. Every encoder of the task's model is taken."""
    cls = registry.get("task", name).cls
    with pytest.raises(ConfigError) as caught:
        cls(encoder=wrong if value == "wrong" else value)
    message = str(caught.value)
    assert message.startswith("option encoder must be one of ") and "\n" not in message
    model = {"sentiment": SentenceClassifier, "target-sentiment": TargetSentimentClassifier}
    for encoder in model[name].encoder_names:
        assert cls(encoder=encoder).options["encoder"] == encoder
