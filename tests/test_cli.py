"""Tests for the ``attnlab`` command (attnlab.cli)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlab import registry
from attnlab.cli import KIND_TITLES, main

SCORES = [
    "dot",
    "scaled-dot",
    "general",
    "biased-general",
    "activated-general",
    "cosine",
    "additive",
    "queryless",
]
ALIGNS = ["soft", "hard", "local-m", "local-p", "reinforced", "sparsemax", "entmax15"]
DIMS = ["single", "multi"]


def _sections(text: str) -> dict[str, list[str]]:
    """Heading -> the lines under it (a heading is a line underlined with '=')."""
    lines = text.splitlines()
    out: dict[str, list[str]] = {}
    current = None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and lines[i + 1] and set(lines[i + 1]) == {"="}:
            current = line
            out[current] = []
        elif current is not None and not (line and set(line) == {"="}):
            out[current].append(line)
    return out


def _builtin_entries(kinds=None):
    """The registered entries of attnlab itself (other tests may register test classes)."""
    every = registry.entries() if kinds is None else [e for k in kinds for e in registry.entries(k)]
    return [e for e in every if e.cls.__module__.startswith("attnlab.")]


def _assert_lists_every_entry(text: str, kinds=None) -> None:
    entries = _builtin_entries(kinds)
    assert entries
    sections = _sections(text)
    for e in entries:
        title = KIND_TITLES.get(e.kind, e.kind)
        assert title in sections, f"no section {title!r}"
        lines = sections[title]
        # the name starts a line, and its formula and source follow it
        starts = [i for i, line in enumerate(lines) if line.split("  (aliases")[0] == e.name]
        assert starts, f"{e.kind} {e.name!r} is not listed"
        block = "\n".join(lines[starts[0] : starts[0] + 4])
        assert f"formula: {e.formula}" in block, e.name
        assert f"source:  {e.source}" in block, e.name


def test_list_prints_every_mechanism_with_formula_and_source(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    _assert_lists_every_entry(out)
    for name in SCORES + ALIGNS + DIMS:
        assert any(line.startswith(name) for line in out.splitlines()), name
    # grouped under the survey's headings, scores first
    assert out.index("Score functions") < out.index("Alignment functions")
    assert out.index("Alignment functions") < out.index("Attention dimensionality")
    assert "w^T act(W1 q + W2 k_l + b)" in out
    assert "Bahdanau et al. 2015" in out
    assert "(aliases: multiplicative)" in out


def test_list_json(capsys):
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    got = {(r["kind"], r["name"]) for r in rows}
    assert got >= {(e.kind, e.name) for e in _builtin_entries()}
    by_name = {(r["kind"], r["name"]): r for r in rows}
    additive = by_name[("score", "additive")]
    assert additive["formula"] == "e_l = w^T act(W1 q + W2 k_l + b)"
    assert "Bahdanau" in additive["source"]
    assert "concat" in additive["aliases"]
    assert additive["class"] == "attnlab.general.scoring.AdditiveScore"
    for r in rows:
        assert set(r) == {"kind", "name", "aliases", "formula", "cost", "source", "class"}


def test_list_kind_score(capsys):
    assert main(["list", "--kind", "score"]) == 0
    out = capsys.readouterr().out
    _assert_lists_every_entry(out, kinds=["score"])
    assert "Score functions" in out
    assert "Alignment functions" not in out
    names = {
        line.split("  (")[0]
        for line in out.splitlines()
        if line and not line.startswith((" ", "="))
    }
    assert set(SCORES) <= names
    assert not names & set(ALIGNS)


def test_list_kind_align_json(capsys):
    assert main(["list", "--kind", "align", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["kind"] for r in rows} == {"align"}
    assert {r["name"] for r in rows} >= set(ALIGNS)


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["--score", "additive"], "lean-additive"),
        ([], "sdpa"),
        (["--score", "general", "--d-q", "8", "--d-k", "16"], "sdpa"),
        (["--score", "additive", "--dim", "multi"], "lean-multi"),
        (["--score", "additive", "--dim", "multi", "--need-weights"], "explicit"),
        (["--score", "dot", "--align", "local-p", "--option", "D=4"], "local-window"),
        (["--score", "cosine", "--align", "hard"], "explicit"),
        (["--score", "additive", "--option", "d_w=32", "--option", "act=relu"], "lean-additive"),
    ],
)
def test_explain_prints_the_path(capsys, argv, path):
    assert main(["explain", *argv]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"path:   {path}"
    assert lines[1].startswith("reason: ")
    assert len(lines[1]) > len("reason: ")


def test_explain_option_values_are_parsed_as_json(capsys):
    assert main(["explain", "--score", "dot", "--align", "local-m", "--option", "D=3"]) == 0
    assert "2D+1 = 7" in capsys.readouterr().out


def test_explain_bad_option_exits_2(capsys):
    assert main(["explain", "--score", "additive", "--option", "bogus=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "bogus" in err


def test_explain_option_without_equals_exits_2(capsys):
    assert main(["explain", "--option", "D"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--score", "dot", "--dim", "multi"], "multi-dimensional"),
        (["--score", "queryless", "--align", "local-p"], "query-less"),
        (["--score", "dot", "--d-q", "4", "--d-k", "8"], "d_q == d_k"),
        (["--score", "nonsense"], "unknown score 'nonsense'"),
    ],
)
def test_explain_impossible_configuration_exits_2(capsys, argv, text):
    assert main(["explain", *argv]) == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "--bogus"],
        ["list", "--kind", "nonsense"],
        ["explain", "--d-q", "four"],
        ["frobnicate"],
        [],
    ],
)
def test_bad_command_line_exits_2(capsys, argv):
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    assert "usage: attnlab" in capsys.readouterr().err


def _console_script() -> str:
    here = Path(sys.executable).with_name("attnlab")
    if here.exists():
        return str(here)
    found = shutil.which("attnlab")
    assert found, "the attnlab console script is not installed (pip install -e .)"
    return found


def test_installed_console_script_lists_everything():
    proc = subprocess.run(
        [_console_script(), "list"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    _assert_lists_every_entry(proc.stdout)


def test_installed_console_script_bad_option_exits_2():
    proc = subprocess.run(
        [_console_script(), "explain", "--score", "additive", "--option", "bogus=1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "bogus" in proc.stderr
