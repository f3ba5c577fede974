"""The Task contract: options, presets, the selection metric, spec labels, examples."""

from __future__ import annotations

import pytest

from attnlab._checks import ConfigError
from attnlab.lab.task import AttentionExample, spec_label, spec_slug
from attnlab.lab.tasks.sentiment import SentimentTask


def test_unknown_option_is_named() -> None:
    with pytest.raises(ConfigError, match=r"no option.*bogus"):
        SentimentTask(bogus=1)


def test_selection_metric_default_and_chosen() -> None:
    assert SentimentTask().selection() == ("accuracy", True)
    assert SentimentTask(select_metric="roc_auc").selection() == ("roc_auc", True)
    with pytest.raises(ConfigError, match="select_metric='bleu' is not a metric"):
        SentimentTask(select_metric="bleu").selection()


def test_resolve_attention_presets_and_baselines() -> None:
    task = SentimentTask()
    assert task.resolve_attention(None) == task.default_attention
    assert task.resolve_attention({"name": "mean"}) == {"name": "mean"}
    assert task.resolve_attention({"name": "dot", "align": "sparsemax"}) == {
        "score": "scaled-dot",
        "align": "sparsemax",
    }
    with pytest.raises(ConfigError, match="no attention preset 'nope'"):
        task.resolve_attention({"name": "nope"})


def test_spec_label_and_slug() -> None:
    assert spec_label({"score": "additive", "align": "soft"}) == "align=soft,score=additive"
    assert spec_label({"name": "tanh", "D": 2, "flag": True}) == "tanh,D=2,flag=true"
    assert spec_label({}) == "default"
    assert spec_slug({"name": "a/b", "x": [1, 2]}) == "a_b__x=_1_2_"


def test_attention_example_checks_and_round_trip() -> None:
    ex = AttentionExample("t", ["q"], ["a", "b"], [[0.25, 0.75]], kind="matrix")
    assert AttentionExample.from_json(ex.to_json()) == ex
    with pytest.raises(ValueError, match="kind"):
        AttentionExample("t", ["q"], ["a"], [[1.0]], kind="video")
    with pytest.raises(ValueError, match="row 0 has 1 entries"):
        AttentionExample("t", ["q"], ["a", "b"], [[1.0]])
