"""Tests of attnlab.lab.config: --attention specs, -o options and run config files."""

from __future__ import annotations

import json

import pytest

from attnlab._checks import ConfigError
from attnlab.lab.config import (
    coerce_value,
    load_config_file,
    parse_attention,
    parse_options,
)

# ----------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ("-12", -12),
        ("+4", 4),
        ("1e-3", 0.001),
        ("0.5", 0.5),
        ("true", True),
        ("False", False),
        ("none", None),
        ("NULL", None),
        ("tanh", "tanh"),
        ("scaled-dot", "scaled-dot"),
        ("[1;3;5]", [1, 3, 5]),
        ("[]", []),
        ("[a;2.5]", ["a", 2.5]),
        ("nan", "nan"),
        ("inf", "inf"),
        # every spelling of a non-finite number stays text (-nan and 1e400 became floats)
        ("-nan", "-nan"),
        ("+NaN", "+NaN"),
        ("-Infinity", "-Infinity"),
        ("+infinity", "+infinity"),
        ("1e400", "1e400"),
        (" 7 ", 7),
    ],
)
def test_coerce_value(text, value):
    got = coerce_value(text)
    assert got == value
    assert type(got) is type(value)


def test_a_list_with_commas_says_how_lists_are_written():
    with pytest.raises(ConfigError, match=r"separated by ';' \(.*\): write \[1;2\], not \[1,2\]"):
        coerce_value("[1,2]")
    with pytest.raises(ConfigError, match="separated by ';'"):
        parse_options(["hops=[1, 3]"])
    assert coerce_value("[a,b;c]") == ["a,b", "c"]  # with a ';' the commas are text


# ----------------------------------------------------------------------------- --attention


def test_parse_attention_key_values():
    spec = parse_attention("score=additive,align=soft,dim=multi")
    assert spec == {"score": "additive", "align": "soft", "dim": "multi"}
    assert list(spec) == ["score", "align", "dim"]


def test_parse_attention_coerces_values():
    spec = parse_attention("score=additive, d_w=32 ,tau=0.5,uniform=true,D=none")
    assert spec == {"score": "additive", "d_w": 32, "tau": 0.5, "uniform": True, "D": None}
    assert type(spec["d_w"]) is int


@pytest.mark.parametrize("name", ["mean", "tanh", "uniform", "bahdanau"])
def test_parse_attention_bare_word_is_a_name(name):
    assert parse_attention(name) == {"name": name}


def test_parse_attention_mixes_name_and_options():
    assert parse_attention("bahdanau,score=general") == {"name": "bahdanau", "score": "general"}
    assert parse_attention("score=general,bahdanau") == {"score": "general", "name": "bahdanau"}


def test_parse_attention_reads_a_list_value_among_pieces():
    assert parse_attention("tanh,d_w=[1;2],tau=0.5") == {"name": "tanh", "d_w": [1, 2], "tau": 0.5}


@pytest.mark.parametrize("text", [None, "", "   "])
def test_parse_attention_empty_is_the_default(text):
    assert parse_attention(text) == {}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("score=additive,,align=soft", "stray comma"),
        ("score=additive,", "stray comma"),
        ("=3", "''"),
        ("score=", "'score'"),
        ("score=dot,score=additive", "'score' is given twice"),
        ("tanh,mean", "'tanh' and 'mean'"),
        ("two words", "'two words'"),
        ("score=dot,a b=1", "'a b'"),
        ("tanh,d_w=[1,2]", "write [1;2], not [1,2]"),  # the list's ',' is not a piece's
        ("tanh,d_w=[1;2", "'[' is not closed"),
    ],
)
def test_parse_attention_errors_name_the_bad_piece(text, named):
    with pytest.raises(ConfigError) as err:
        parse_attention(text)
    assert named in str(err.value)


def test_parse_attention_rejects_non_text():
    with pytest.raises(ConfigError, match="must be text"):
        parse_attention({"score": "dot"})  # type: ignore[arg-type]


def test_parse_attention_reads_yaml_toml_json_files(tmp_path):
    want = {"score": "additive", "align": "sparsemax", "d_w": 16}
    (tmp_path / "a.yaml").write_text("score: additive\nalign: sparsemax\nd_w: 16\n")
    (tmp_path / "a.yml").write_text("{score: additive, align: sparsemax, d_w: 16}\n")
    (tmp_path / "a.toml").write_text('score = "additive"\nalign = "sparsemax"\nd_w = 16\n')
    (tmp_path / "a.json").write_text(json.dumps(want))
    for name in ("a.yaml", "a.yml", "a.toml", "a.json"):
        assert parse_attention(str(tmp_path / name)) == want, name


def test_parse_attention_file_holding_spec_text(tmp_path):
    (tmp_path / "s.yaml").write_text('"tanh,align=sparsemax"\n')
    assert parse_attention(str(tmp_path / "s.yaml")) == {"name": "tanh", "align": "sparsemax"}


def test_parse_attention_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        parse_attention(str(tmp_path / "missing.yaml"))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="mapping"):
        parse_attention(str(tmp_path / "list.json"))
    (tmp_path / "bad.toml").write_text("score = \n")
    with pytest.raises(ConfigError, match=r"cannot parse .*bad\.toml"):
        parse_attention(str(tmp_path / "bad.toml"))


# ----------------------------------------------------------------------------- -o


def test_parse_options():
    got = parse_options(["epochs=3", "encoder=cnn", "lr=1e-3", "max_train=none", "x=a=b"])
    assert got == {"epochs": 3, "encoder": "cnn", "lr": 0.001, "max_train": None, "x": "a=b"}
    assert parse_options([]) == {}
    assert parse_options(None) == {}


@pytest.mark.parametrize(
    ("items", "named"),
    [
        (["epochs"], "'epochs'"),
        (["epochs=3", "epochs=4"], "'epochs' is given twice"),
        (["=3"], "''"),
        (["bad key=1"], "'bad key'"),
    ],
)
def test_parse_options_errors(items, named):
    with pytest.raises(ConfigError) as err:
        parse_options(items)
    assert named in str(err.value)


# ----------------------------------------------------------------------------- files


def test_load_config_file_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "attention: {score: additive, align: sparsemax}\n"
        "options: {epochs: 3, encoder: cnn}\n"
        "seeds: [0, 1, 2]\n"
    )
    assert load_config_file(path) == {
        "attention": {"score": "additive", "align": "sparsemax"},
        "options": {"epochs": 3, "encoder": "cnn"},
        "seeds": [0, 1, 2],
    }


def test_text_option_values_in_a_file_are_read_as_on_the_command_line(tmp_path):
    """YAML 1.1 reads ``1e-3`` and ``none`` as text: they are the number and None that
    ``-o lr=1e-3`` and ``-o grad_clip=none`` give (``lr: 1e-3`` was refused as text, and
    ``select_metric: none`` became the metric name 'none')."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "options: {lr: 1e-3, grad_clip: none, select_metric: null, encoder: cnn, "
        "kernel_sizes: '[1;3]', epochs: 2}\n"
    )
    options = load_config_file(path)["options"]
    assert options == {
        "lr": 0.001, "grad_clip": None, "select_metric": None, "encoder": "cnn",
        "kernel_sizes": [1, 3], "epochs": 2,
    }  # fmt: skip
    assert options == parse_options(
        ["lr=1e-3", "grad_clip=none", "select_metric=none", "encoder=cnn",
         "kernel_sizes=[1;3]", "epochs=2"]
    )  # fmt: skip


def test_load_config_file_toml_and_json_subsets(tmp_path):
    (tmp_path / "run.toml").write_text('attention = "mean"\nseeds = 4\n')
    assert load_config_file(tmp_path / "run.toml") == {"attention": {"name": "mean"}, "seeds": [4]}
    (tmp_path / "run.json").write_text('{"options": {"lr": 0.01}}')
    assert load_config_file(tmp_path / "run.json") == {"options": {"lr": 0.01}}
    (tmp_path / "empty.yaml").write_text("")
    assert load_config_file(tmp_path / "empty.yaml") == {}


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("atention: mean\nseed: 1\n", "unknown key(s) atention, seed"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("options: [1, 2]\n", "'options' must be a mapping"),
        ("seeds: [0, x]\n", "'seeds' must be"),
        ("seeds: []\n", "'seeds' must be"),
        ("seeds: true\n", "'seeds' must be"),
        ("attention: 3\n", "'attention' must be"),
        ("attention: 'tanh,,x=1'\n", "stray comma"),
    ],
)
def test_load_config_file_errors(tmp_path, content, named):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config_file(path)
    assert named in str(err.value)


def test_load_config_file_needs_a_known_suffix(tmp_path):
    path = tmp_path / "run.ini"
    path.write_text("[x]\n")
    with pytest.raises(ConfigError, match=r"must end in \.yaml"):
        load_config_file(path)


def test_load_config_file_refuses_what_is_no_path_and_expands_home(tmp_path, monkeypatch):
    for bad in (5, None):
        with pytest.raises(TypeError, match="config file must be a path"):
            load_config_file(bad)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run.json").write_text('{"seeds": [1]}')
    assert load_config_file("~/run.json") == {"seeds": [1]}
