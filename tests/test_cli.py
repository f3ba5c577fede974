"""Tests for the ``attnlab`` command (attnlab.cli, a click group), via click's CliRunner
and the installed console script."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from attnlab import registry
from attnlab.cli import KIND_TITLES, LAZY_COMMANDS, _module_missing, main
from attnlab.lab.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
TOY = "tests.lab.toy_task"

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


def run(*argv: str, **kw):
    return CliRunner().invoke(main, list(argv), catch_exceptions=False, **kw)


def test_main_is_a_click_group():
    assert isinstance(main, click.Group)
    assert main.name == "attnlab"
    for name in ("list", "path", "train"):
        assert name in main.commands


def test_list_prints_every_mechanism_with_formula_and_source():
    result = run("list")
    assert result.exit_code == 0
    out = result.stdout
    _assert_lists_every_entry(out)
    for name in SCORES + ALIGNS + DIMS:
        assert any(line.startswith(name) for line in out.splitlines()), name
    # grouped under the survey's headings, scores first
    assert out.index("Score functions") < out.index("Alignment functions")
    assert out.index("Alignment functions") < out.index("Attention dimensionality")
    assert "w^T act(W1 q + W2 k_l + b)" in out
    assert "Bahdanau et al. 2015" in out
    assert "(aliases: multiplicative)" in out


def test_list_shows_the_tasks():
    result = run("list", "--kind", "task")
    assert result.exit_code == 0
    assert result.stdout.startswith("Tasks of the lab (survey section 2 on real data)\n")
    _assert_lists_every_entry(result.stdout, kinds=["task"])
    assert "\nsentiment\n" in result.stdout
    assert "Jain & Wallace 2019" in result.stdout
    assert "Score functions" not in result.stdout


def test_list_json():
    result = run("list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    got = {(r["kind"], r["name"]) for r in rows}
    assert got >= {(e.kind, e.name) for e in _builtin_entries()}
    assert ("task", "sentiment") in got
    by_name = {(r["kind"], r["name"]): r for r in rows}
    additive = by_name[("score", "additive")]
    assert additive["formula"] == "e_l = w^T act(W1 q + W2 k_l + b)"
    assert "Bahdanau" in additive["source"]
    assert "concat" in additive["aliases"]
    assert additive["class"] == "attnlab.general.scoring.AdditiveScore"
    assert by_name[("task", "sentiment")]["class"] == ("attnlab.lab.tasks.sentiment.SentimentTask")
    for r in rows:
        assert set(r) == {"kind", "name", "aliases", "formula", "cost", "source", "class"}


def test_list_kind_score():
    result = run("list", "--kind", "score")
    assert result.exit_code == 0
    out = result.stdout
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


def test_list_kind_align_json():
    result = run("list", "--kind", "align", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
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
def test_path_prints_the_path(argv, path):
    result = run("path", *argv)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0] == f"path:   {path}"
    assert lines[1].startswith("reason: ")
    assert len(lines[1]) > len("reason: ")


def test_path_option_values_are_read_as_task_option_values():
    result = run("path", "--score", "dot", "--align", "local-m", "--option", "D=3")
    assert result.exit_code == 0
    assert "2D+1 = 7" in result.stdout
    bad = run("path", "--align", "local-m", "--option", "D=x")
    assert bad.exit_code == 2  # the message keeps its closing quote
    assert bad.stderr.strip().endswith("must be an int >= 1, got 'x'")
    listed = run("path", "--option", "D=[1,2]")
    assert listed.exit_code == 2 and "write [1;2], not [1,2]" in listed.stderr


def test_path_takes_the_spec_of_train():
    """``-a SPEC`` as ``attnlab train -a`` reads it; the flags override its keys."""
    same = [
        (["-a", "score=additive,dim=multi"], ["--score", "additive", "--dim", "multi"]),
        (["-a", "score=dot,d_q=4,d_k=8"], ["--score", "dot", "--d-q", "4", "--d-k", "8"]),
        (["-a", "score=additive,act=relu"], ["--score", "additive", "--option", "act=relu"]),
        (["-a", "score=additive", "--score", "dot"], ["--score", "dot"]),
        (["-a", "align=local-m,D=3,score=dot", "--option", "D=2"], ["--score", "dot",
         "--align", "local-m", "--option", "D=2"]),
    ]  # fmt: skip
    for spec_argv, flag_argv in same:
        by_spec, by_flags = run("path", *spec_argv), run("path", *flag_argv)
        assert (by_spec.exit_code, by_spec.output) == (by_flags.exit_code, by_flags.output)
    assert "2D+1 = 5" in run("path", "-a", "align=local-m,D=3,score=dot", "--option", "D=2").stdout
    preset = run("path", "-a", "tanh")
    assert preset.exit_code == 2
    assert preset.stderr.strip() == (
        "error: --attention tanh: 'tanh' names a task's preset or baseline; path takes "
        "score=..., align=..., dim=... and their options"
    )
    broken = run("path", "-a", "score=dot,,")
    assert broken.exit_code == 2 and broken.stderr.startswith("error: ")


def test_path_plans_for_the_device_asked_for_in_one_line():
    """``--device cuda`` says what a GPU call would take, on any machine."""
    lines = run("path", "--score", "scaled-dot", "--device", "cuda").stdout.splitlines()
    assert lines[0] == "path:   sdpa" and "[B, H, n, d]" in lines[1]
    assert "[B, 1, n, d] (the fused CPU kernel)" in run("path", "--score", "scaled-dot").stdout
    result = CliRunner().invoke(main, ["path", "--device", "bogus"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: device 'bogus' is not a device name (try 'cpu', 'cuda' or 'cuda:0')"
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["path", "--score", "dot", "--score", "additive"], "--score is given 2 times"),
        (["train", "toy", "--out", "a", "--out", "b"], "--out is given 2 times"),
        (["train", "toy", "-a", "dot", "--attention", "tanh"], "--attention/-a is given 2"),
        (["ablate", "toy", "--num-seeds", "2", "--num-seeds", "3"], "--num-seeds is given 2"),
        (["report", "x", "--out", "a.html", "--out", "b.html"], "--out is given 2 times"),
    ],
)
def test_an_option_of_one_value_given_twice_is_an_error_not_the_last_value(
    tmp_path, monkeypatch, argv, named
):
    """click keeps the last value of a repeated option; attnlab refuses the repeat before
    the command runs (a flag, such as ``--no-progress``, may be repeated)."""
    monkeypatch.chdir(tmp_path)
    result = run(*argv)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {named}") and len(result.stderr.splitlines()) == 1
    assert result.stderr.strip().endswith("it takes one value: give it once")
    assert list(tmp_path.iterdir()) == []  # nothing ran
    flags = run("path", "--need-weights", "--need-weights")
    assert flags.exit_code == 0, flags.output


def test_train_out_is_refused_inside_a_run_or_an_ablation(tmp_path):
    """``--out`` of train must not put runs into a run directory or an ablation's folder."""
    assert run(*_toy_argv(tmp_path / "runs", "--epochs", "1")).exit_code == 0
    abl = tmp_path / "abl"
    abl.mkdir()
    (abl / "ablation.json").write_text("{}")
    refused = {
        tmp_path / "runs" / "default--seed0": "a run directory; give a folder of its own",
        tmp_path / "runs" / "default--seed0" / "x": "inside the run directory",
        abl: "an ablation directory (attnlab ablate's)",
        abl / "runs": "inside the ablation directory",
    }
    for out, message in refused.items():
        result = run(*_toy_argv(out, "--epochs", "1"))
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: --out {out}: ") and message in result.stderr
    assert sorted(p.name for p in abl.iterdir()) == ["ablation.json"]


def test_path_option_key_given_twice_and_train_seed_given_twice_are_errors(tmp_path):
    twice = run("path", "--score", "additive", "--option", "d_w=3", "--option", "d_w=4")
    assert twice.exit_code == 2
    assert twice.stderr.strip() == "error: --option: option 'd_w' is given twice ('d_w=4')"
    seeds = run(*_toy_argv(tmp_path, "--seed", "0", "--seed", "1", "--seed", "0"))
    assert seeds.exit_code == 2
    assert seeds.stderr.strip() == "error: seed 0 is given 2 times; give it once"
    assert list(tmp_path.iterdir()) == []


def test_path_bad_option_exits_2():
    result = run("path", "--score", "additive", "--option", "bogus=1")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert "bogus" in result.stderr


def test_path_option_without_equals_exits_2():
    result = run("path", "--option", "D")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.stderr


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--score", "dot", "--dim", "multi"], "multi-dimensional"),
        (["--score", "queryless", "--align", "local-p"], "query-less"),
        (["--score", "dot", "--d-q", "4", "--d-k", "8"], "d_q == d_k"),
        (["--score", "nonsense"], "unknown score 'nonsense'"),
    ],
)
def test_path_impossible_configuration_exits_2(argv, text):
    result = run("path", *argv)
    assert result.exit_code == 2
    assert text in result.stderr


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["list", "--bogus"], "No such option '--bogus'"),
        (["list", "--kind", "nonsense"], "'nonsense' is not one of"),
        (["path", "--d-q", "four"], "'four' is not a valid integer"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["train"], "Missing argument 'TASK'"),
    ],
)
def test_bad_command_line_exits_2(argv, text):
    result = run(*argv)
    assert result.exit_code == 2
    assert "Usage: attnlab" in result.stderr
    assert text in result.stderr


def test_no_command_prints_the_usage():
    result = run()
    assert result.exit_code in (0, 2)  # click >= 8.2 exits 2 when a group gets no command
    assert "Usage: attnlab" in result.output
    for name in ("list", "path", "train", "explain", "aer"):
        assert name in result.output


# ----------------------------------------------------------------------------- lazy commands


def test_lazy_commands_tolerate_only_their_own_module_missing():
    missing_self = ModuleNotFoundError("x", name="attnlab.lab.ablation")
    missing_package = ModuleNotFoundError("x", name="attnlab.evaluation")
    missing_dependency = ModuleNotFoundError("x", name="ray")
    assert _module_missing(missing_self, "attnlab.lab.ablation")
    assert _module_missing(missing_package, "attnlab.evaluation.aer")
    assert not _module_missing(missing_dependency, "attnlab.lab.ablation")
    assert not _module_missing(ModuleNotFoundError("x", name="attnlab"), "attnlab.lab.demo")


def test_lazy_commands_are_listed_when_their_module_exists():
    import importlib.util

    result = run("--help")
    assert result.exit_code == 0
    for name, (module, _) in LAZY_COMMANDS.items():
        try:
            exists = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            exists = False
        listed = any(line.split()[:1] == [name] for line in result.stdout.splitlines())
        assert listed == exists, name


# ----------------------------------------------------------------------------- train


def _toy_argv(tmp_path, *extra):
    return ["train", "toy", "--plugin", TOY, "--no-progress", "--out", str(tmp_path), *extra]


def test_train_the_toy_task_with_a_plugin(tmp_path):
    result = run(*_toy_argv(tmp_path, "--attention", "mean", "--seed", "1", "--seed", "2"))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0] == "toy  attention: mean"
    assert "test accuracy" in out and "test f1" in out and "mean ± std" in out
    for seed in (1, 2):
        run_dir = tmp_path / f"mean--seed{seed}"
        assert str(run_dir) in out
        info = json.loads((run_dir / "run.json").read_text())
        assert info["status"] == "done" and info["seed"] == seed
        assert info["attention"] == {"name": "mean"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mean--seed1", "mean--seed2"]


def test_train_refuses_a_negative_seed_in_one_line_before_any_data(tmp_path):
    """``--seed -3`` was a ValueError traceback after the task was set up (Python's
    ``random`` takes -3 as 3, so it is refused, as ``ablate --seeds`` refuses it)."""
    result = CliRunner().invoke(main, _toy_argv(tmp_path, "--seed", "1", "--seed", "-3"))
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "error: seed must be an int >= 0, got -3"
    assert list(tmp_path.iterdir()) == []  # seed 1 did not run either
    result = CliRunner().invoke(
        main, ["ablate", "toy", "--plugin", TOY, "--seeds=0,-1", "--out", str(tmp_path / "a")]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip() == "error: seeds must be an int >= 0, got -1"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("restart", [False, True])
def test_train_goes_on_after_an_interruption_unless_restart(tmp_path, monkeypatch, restart):
    from attnlab.lab import training

    argv = _toy_argv(tmp_path, "-a", "tanh", "-o", "epochs=3", "-o", "dropout=0.3")
    real = training._Trainer.epoch
    seen: list[int] = []

    def epoch(self, number):
        if number == 3 and not seen:
            seen.append(number)
            raise KeyboardInterrupt  # Ctrl-C in epoch 3
        return real(self, number)

    monkeypatch.setattr(training._Trainer, "epoch", epoch)
    assert run(*argv).exit_code == 1  # click: "Aborted!"
    assert (tmp_path / ".tanh--seed0.resume.safetensors").is_file()
    result = run(*argv, *(["--restart"] if restart else []))
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "tanh--seed0" / "run.json").read_text())
    assert info["status"] == "done"
    assert info["resumed_after"] == ([] if restart else [2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tanh--seed0"]


def test_train_says_one_line_when_its_folder_cannot_be_made(tmp_path, monkeypatch):
    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", denied)
    result = run(*_toy_argv(tmp_path / "runs", "-a", "mean", "--epochs", "1"))
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: run directory {tmp_path / 'runs' / 'mean--seed0'}: cannot create "
        f"{tmp_path / 'runs'} (Permission denied)"
    )


def test_train_table_shows_the_best_epoch_of_those_trained(tmp_path):
    """``-o patience=1``: the run stops one epoch after its best; the table says which
    epoch was kept of how many were trained, as metrics.json records them."""
    result = run(*_toy_argv(tmp_path, "-a", "mean", "-o", "epochs=6", "-o", "patience=1"))
    assert result.exit_code == 0, result.output
    metrics = json.loads((tmp_path / "mean--seed0" / "metrics.json").read_text())
    best, trained = metrics["best_epoch"], metrics["epochs_trained"]
    assert trained == min(best + 1, 6)  # patience 1: one epoch without a better one
    row = next(line for line in result.stdout.splitlines() if line.startswith("0 "))
    assert f" {best} of {trained} " in row


def test_train_options_precedence(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "attention: {score: scaled-dot}\noptions: {epochs: 3, lr: 0.05}\nseeds: [4]\n"
    )
    out = tmp_path / "runs"
    result = run(*_toy_argv(out, "--config", str(config), "-o", "epochs=2", "--batch-size", "16"))
    assert result.exit_code == 0, result.output
    info = json.loads((out / "score=scaled-dot--seed4" / "run.json").read_text())
    assert info["seed"] == 4
    assert info["attention"] == {"score": "scaled-dot"}
    assert info["task_options"]["epochs"] == 2  # -o over the file
    assert info["task_options"]["lr"] == 0.05  # from the file
    assert info["task_options"]["batch_size"] == 16  # --batch-size over both
    # --attention and --seed override the file
    result = run(*_toy_argv(out, "--config", str(config), "--attention", "tanh", "--seed", "0"))
    assert result.exit_code == 0, result.output
    assert (out / "tanh--seed0" / "run.json").is_file()


def test_train_default_out_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("train", "toy", "--plugin", TOY, "--no-progress", "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "toy" / "default--seed0" / "run.json").is_file()


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--attention", "score=dot,,align=soft"], "stray comma"),
        (["--attention", "tanh,mean"], "two names"),
        (["--attention", "bogus"], "no attention preset 'bogus'"),
        (["-o", "epochz=3"], "no option(s) epochz"),
        (["-o", "epochs"], "an option must be key=value, got 'epochs'"),
        (["--device", "cuda:99"], "cuda:99"),
        (["--config", "missing.yaml"], "does not exist"),
    ],
)
def test_train_bad_input_exits_2_with_a_message(tmp_path, extra, text):
    result = run(*_toy_argv(tmp_path, *extra))
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
    assert text in result.stderr
    assert not any(p.name.endswith("seed0") for p in tmp_path.iterdir())


def _one_line_error(result) -> str:
    """The stderr of a refused command: exactly one line ``error: ...``, no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    return lines[0]


# training options out of their range: torch refuses a learning rate <= 0 only once the
# optimizer is built (after the data is loaded), and a negative grad_clip would flip the
# gradients; all are refused with the typos, before anything is loaded or written
BAD_TRAINING_VALUES = {  # what follows -o -> a piece of the error
    "lr=-1": "option lr must be > 0, got -1",
    "lr=0": "option lr must be > 0, got 0",
    "lr=none": "option lr must be a number > 0, got 'none'",
    "weight_decay=-0.1": "option weight_decay must be >= 0 (0 or none: no weight decay)",
    "grad_clip=-1": "option grad_clip must be >= 0 (0 or none: no clipping), got -1",
    "epochs=0": "option epochs must be an int >= 1, got 0",
    "batch_size=-4": "option batch_size must be an int >= 1, got -4",
}


# what a user may mistype: (argv, a piece of the message). The first ones are caught from
# the spec and the options alone; the last three only by building the task model, which
# the trainer does before it writes anything.
BAD_TRAIN_INPUT = [
    (["--attention", "score=foo,align=soft"], "unknown score 'foo'"),
    (["--attention", "score=dot;align=soft"], "(score=dot,align=soft)"),
    (["--attention", "foo=bar"], "unknown key(s) foo"),
    (["--attention", "score=dot,d_w=8"], "score 'dot' takes no options"),
    (["--attention", "align=nope"], "unknown align 'nope'"),
    (["-o", "lr=abc"], "option lr must be a number"),
    (["-o", "epochs=2.5"], "option epochs must be an integer"),
    (["-o", "epochs=3;lr=0.1"], "-o epochs=3 -o lr=0.1"),
    (["-o", "freeze=1"], "no option(s) freeze"),
    (["-o", "encoder=nope"], "encoder must be one of"),
    (["--lr", "-1"], "option lr must be > 0, got -1.0"),
    *[(["-o", typed], text) for typed, text in BAD_TRAINING_VALUES.items()],
    (["--attention", "score=dot,dim=multi"], "needs a vector score"),
    (["--attention", "score=additive,d_w=abc"], "d_w must be a positive int"),
]


@pytest.mark.parametrize(("extra", "text"), BAD_TRAIN_INPUT)
def test_train_typo_is_one_line_exit_2_and_writes_nothing(tmp_path, extra, text):
    out = tmp_path / "out"
    result = run(*_toy_argv(out, *extra))
    assert text in _one_line_error(result)
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.mark.parametrize("extra", [["-o", "grad_clip=0"], ["-o", "grad_clip=none"]])
def test_train_grad_clip_zero_or_none_turns_clipping_off(tmp_path, extra):
    result = run(*_toy_argv(tmp_path, "--epochs", "1", *extra))
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "default--seed0" / "run.json").read_text())
    assert info["task_options"]["grad_clip"] in (0, None)


def _a_file(tmp_path: Path) -> Path:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    return afile


def _nothing_but(tmp_path: Path, afile: Path) -> None:
    assert [p.name for p in tmp_path.iterdir()] == [afile.name]
    assert afile.read_text() == "keep me\n"


@pytest.mark.parametrize("below", ["", "x", "x/y"])
def test_train_out_on_or_under_a_file_is_one_line_naming_it(tmp_path, below):
    afile = _a_file(tmp_path)
    out = afile / below if below else afile
    line = _one_line_error(run(*_toy_argv(out)))
    assert line == f"error: --out {out}: {afile} is a file, not a folder"
    _nothing_but(tmp_path, afile)


def test_ablate_out_under_a_file_is_one_line_naming_it(tmp_path):
    afile = _a_file(tmp_path)
    line = _one_line_error(run(*_ablate_argv(afile / "x", "-a", "tanh", "--seeds", "0")))
    assert line == f"error: ablation directory {afile / 'x'}: {afile} is a file, not a folder"
    _nothing_but(tmp_path, afile)


def test_report_out_under_a_file_is_one_line_naming_it(tmp_path):
    afile = _a_file(tmp_path)
    target = afile / "x.html"
    line = _one_line_error(run("report", str(tmp_path), "--out", str(target)))
    assert line == f"error: report file {target}: {afile} is a file, not a folder"
    _nothing_but(tmp_path, afile)


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["--attention", "score=foo,align=soft"], "unknown score 'foo'"),
        (["--attention", "score=dot;align=soft"], "(score=dot,align=soft)"),
        (["--attention", "foo=bar"], "unknown key(s) foo"),
        (["-o", "lr=abc"], "option lr must be a number"),
    ],
)
def test_train_sentiment_spec_errors_come_before_its_data(tmp_path, extra, text):
    # the sentiment data is an optional package: the typo is reported whether it is there
    # or not, because the spec and options are checked before the data is loaded
    out = tmp_path / "out"
    argv = ["train", "sentiment", "--no-progress", "--out", str(out), *extra]
    assert text in _one_line_error(run(*argv))
    assert not out.exists()


def test_train_help_lists_presets_syntax_and_the_way_to_the_options():
    result = run("train", "--help")
    assert result.exit_code == 0
    out = result.stdout
    for entry in registry.entries("task"):
        line = next((x for x in out.splitlines() if x.split()[:1] == [entry.name]), None)
        assert line is not None, f"task {entry.name} is not listed"
        first_preset = next(iter(entry.cls.presets), None)
        if first_preset is not None:
            assert first_preset in line
    assert "tanh (default)" in out  # sentiment's default attention is its tanh preset
    assert "--list-options" in out
    assert "-a score=additive,align=sparsemax" in out  # ',' inside one spec
    assert "-o epochs=3 -o encoder=cnn" in out  # one option per -o


def test_train_list_options_prints_the_defaults_and_trains_nothing(tmp_path):
    from tests.lab.toy_task import ToyTask

    result = run(*_toy_argv(tmp_path / "out", "--list-options"))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for key, value in ToyTask.defaults.items():
        shown = "none" if value is None else str(value)
        assert any(x.split() == [key, shown] for x in lines), (key, shown)
    assert any(x.split() == ["dot", "score=scaled-dot,align=soft"] for x in lines)
    assert any(x.split() == ["uniform", "baseline"] for x in lines)
    assert not (tmp_path / "out").exists()


def test_train_list_options_of_an_unknown_task_exits_2():
    assert "unknown task 'nope'" in _one_line_error(run("train", "nope", "--list-options"))


# ----------------------------------------------------------------------------- ablate


def _ablate_argv(out, *extra):
    return ["ablate", "toy", "--plugin", TOY, "--out", str(out), "--no-report", *extra]


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (["-a", "tanh", "-a", "score=foo,align=soft"], "unknown score 'foo'"),
        (["-a", "tanh", "-a", "score=dot;align=soft"], "(score=dot,align=soft)"),
        (["-g", "score=dot,foo;align=soft"], "unknown score 'foo'"),
        (["-a", "tanh", "-a", "foo=bar"], "unknown key(s) foo"),
        (["-a", "tanh", "-o", "lr=abc"], "option lr must be a number"),
        (["-a", "tanh", "-o", "epochs=3,lr=0.1"], "-o epochs=3 -o lr=0.1"),
        (["-a", "tanh", "--device", "cuda:99"], "cuda:99"),
        (["-a", "tanh", "--lr", "-1"], "option lr must be > 0, got -1.0"),
        *[(["-a", "tanh", "-o", typed], text) for typed, text in BAD_TRAINING_VALUES.items()],
    ],
)
def test_ablate_checks_every_spec_and_option_before_the_first_run(tmp_path, extra, text):
    out = tmp_path / "out"
    result = run(*_ablate_argv(out, "--seeds", "0", *extra))
    assert text in _one_line_error(result)
    assert not out.exists()


def test_ablate_stops_at_missing_data_before_the_ablation_directory(tmp_path):
    out = tmp_path / "out"
    result = run(
        "ablate", "sentiment", "-a", "tanh", "-a", "dot", "--seeds", "0,1",
        "-o", "data=sst", "-o", f"path={tmp_path / 'none.csv'}", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: the SST binary CSV is not at")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.output and "failed" not in result.output
    assert not out.exists()


def test_ablate_ray_executor_without_ray_writes_nothing(tmp_path):
    if importlib.util.find_spec("ray") is not None:
        pytest.skip("ray is installed")
    out = tmp_path / "out"
    line = _one_line_error(run(*_ablate_argv(out, "-a", "tanh", "--executor", "ray")))
    assert "pip install 'attnlab[ray]'" in line
    assert not out.exists()


def test_ablate_epochs_batch_size_and_lr_shortcuts(tmp_path):
    out = tmp_path / "out"
    argv = _ablate_argv(out, "-a", "tanh", "--no-baselines", "--seeds", "0", "-o", "epochs=3")
    result = run(*argv, "--epochs", "1", "--batch-size", "16", "--lr", "0.05")
    assert result.exit_code == 0, result.output
    options = json.loads((out / "ablation.json").read_text())["task_options"]
    assert (options["epochs"], options["batch_size"], options["lr"]) == (1, 16, 0.05)


def test_ablate_help_shows_the_grid_syntax_and_the_presets():
    result = run("ablate", "--help")
    assert result.exit_code == 0
    out = result.stdout
    assert '-g "score=additive,dot;align=soft,sparsemax"' in out
    assert "';' separates the axes" in out
    assert "--epochs" in out and "--list-options" in out
    assert "tanh (default)" in out


def test_ablate_list_options(tmp_path):
    result = run(*_ablate_argv(tmp_path / "out", "--list-options"))
    assert result.exit_code == 0, result.output
    assert any(x.split() == ["n_train", "240"] for x in result.stdout.splitlines())
    assert not (tmp_path / "out").exists()


def test_train_unknown_task_and_plugin(tmp_path):
    result = run("train", "nope", "--out", str(tmp_path))
    assert result.exit_code == 2
    assert "unknown task 'nope'; registered tasks:" in result.stderr
    assert "sentiment" in result.stderr
    result = run("train", "toy", "--plugin", "no_such_plugin_module")
    assert result.exit_code == 2
    assert "--plugin 'no_such_plugin_module'" in result.stderr


def test_train_plugin_from_a_file(tmp_path):
    plugin = tmp_path / "my_task.py"
    plugin.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport {TOY}\n")
    result = run(
        "train", "toy", "--plugin", str(plugin), "--no-progress", "--epochs", "1",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output


def test_ablate_plugin_from_a_file_reaches_the_workers(tmp_path):
    """``ablate --plugin FILE.py`` takes a file as ``train`` does; the worker processes run
    the file too, so the task it registers trains there."""
    plugin = tmp_path / "file_task.py"
    plugin.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.lab.toy_task import ToyTask, register_once\n"
        "class FileToyTask(ToyTask):\n    pass\n"
        "register_once('toy-file', FileToyTask, formula='toy', source='a test file')\n"
    )
    out = tmp_path / "abl"
    argv = ["ablate", "toy-file", "--plugin", str(plugin), "-a", "dot", "--seeds", "0,1"]
    argv += ["-j", "2", "-o", "epochs=1", "-o", "n_train=64", "-o", "n_eval=32"]
    argv += ["--no-report", "--no-progress", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "attnlab", *argv],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = ResultsStore(out).runs()
    assert len(rows) == 6 and {r.status for r in rows} == {"done"}
    missing = run("ablate", "toy", "--plugin", str(tmp_path / "none.py"), "--out", str(out))
    assert missing.exit_code == 2
    assert "none.py' cannot be imported: no such file" in missing.stderr


def test_train_missing_data_exits_1(tmp_path):
    result = run(
        "train", "sentiment", "-o", "data=sst", "-o", f"path={tmp_path / 'none.csv'}",
        "--no-progress", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.startswith("error: the SST binary CSV is not at")
    failed = json.loads((tmp_path / "o" / "default--seed0" / "run.json").read_text())
    assert failed["status"] == "failed" and "MissingDataError" in failed["error"]


def test_train_malformed_data_is_one_line_exit_1(tmp_path):
    """A data file of the user's without the label column: its loader's DataFormatError
    (file, line, fields) is the one error line, not a traceback."""
    data = tmp_path / "mine.tsv"
    data.write_text("stars\ttext\n5\tgreat film\n1\tdull film\n", encoding="utf-8")
    result = run(
        "train", "sentiment", "-o", "data=csv", "-o", f"path={data}", "--epochs", "1",
        "--no-progress", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {data}, line 2: no field 'label'"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.output


def test_ablate_malformed_data_is_one_line_exit_1_before_the_directory(tmp_path):
    data = tmp_path / "mine.tsv"
    data.write_text("stars\ttext\n5\tgreat film\n1\tdull film\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run(
        "ablate", "sentiment", "-a", "tanh", "--seeds", "0", "-o", "data=csv",
        "-o", f"path={data}", "--no-progress", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {data}, line 2: no field 'label'"), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists()


def test_train_non_finite_loss_is_one_line_exit_1(tmp_path):
    """A learning rate that blows the loss up: the training loop's message (epoch, batch,
    what to do) is the one error line, and the run is recorded as failed."""
    out = tmp_path / "o"
    result = run(
        "train", "toy", "--plugin", TOY, "--lr", "1e20", "--epochs", "3", "-o", "n_train=64",
        "-o", "n_eval=16", "--no-progress", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: the training loss is") and "Traceback" not in result.output
    assert "lower lr or check the data" in line, line
    failed = json.loads((out / "default--seed0" / "run.json").read_text())
    assert failed["status"] == "failed" and "FloatingPointError" in failed["error"]


# ----------------------------------------------------------------------------- one style


def _aer_files(tmp_path: Path) -> list[str]:
    """``aer GOLD HYP --hyp-one-indexed`` where HYP holds a 0: a bad file."""
    (tmp_path / "gold").write_text("1-1 2-2\n", encoding="utf-8")
    (tmp_path / "hyp").write_text("0-0 1-1\n", encoding="utf-8")
    return [str(tmp_path / "gold"), str(tmp_path / "hyp"), "--hyp-one-indexed"]


#: bad input of the commands that printed "Error: ..." and exited 1: (argv after the command
#: name, given tmp_path holding an empty folder "empty"; a piece of the one error line)
BAD_INPUT_OF_EVERY_COMMAND = {
    "aer": (lambda tmp: ["aer", *_aer_files(tmp)], "hyp, line 1: link '0-0' has index 0"),
    "aer-table": (lambda tmp: ["aer-table", str(tmp / "empty")], "is not an ablation directory"),
    "correctness": (lambda tmp: ["correctness", str(tmp / "empty")], "is not a run directory"),
    "report": (lambda tmp: ["report", str(tmp / "empty")], "neither a run directory"),
    "report-missing": (lambda tmp: ["report", str(tmp / "missing")], "no such directory"),
    "ablate-seeds": (
        lambda tmp: _ablate_argv(tmp / "out", "--seeds", "0", "--num-seeds", "2"),
        "error: give either --seeds or --num-seeds, not both",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUT_OF_EVERY_COMMAND)
def test_bad_input_of_every_command_is_one_error_line_and_status_2(tmp_path, case):
    argv, text = BAD_INPUT_OF_EVERY_COMMAND[case]
    (tmp_path / "empty").mkdir()
    line = _one_line_error(run(*argv(tmp_path)))
    assert text in line
    assert "Error: " not in line


def test_correctness_max_questions_names_the_option(tmp_path):
    result = run("correctness", str(tmp_path), "--max-questions", "0")
    assert result.exit_code == 2
    assert "Invalid value for '--max-questions': 0 is not in the range x>=1" in result.stderr
    assert "max_questions" not in result.stderr


#: a broken config file of each kind -> (where, what) in the one error line
BROKEN_CONFIGS = {
    "config.yaml": (
        "attention:\n  score: additive\n  bad: x: y\n",
        "line 3, column 9: mapping values are not allowed here",
    ),
    "quote.yaml": (
        "attention: 'additive\n",
        "line 2, column 1: found unexpected end of stream (while scanning a quoted scalar "
        "from line 1, column 12)",
    ),
    "config.json": (
        '{"attention": {"score": "additive",}}',
        "line 1, column 36: Expecting property name enclosed in double quotes",
    ),
    "config.toml": ("seeds = [0\nattention = 1\n", "line 2, column 1: "),
}


@pytest.mark.parametrize("name", BROKEN_CONFIGS)
def test_broken_config_file_is_one_line_naming_the_file_line_and_column(tmp_path, name):
    text, where = BROKEN_CONFIGS[name]
    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    line = _one_line_error(run(*_toy_argv(tmp_path / "out", "--config", str(config))))
    assert line.startswith(f"error: cannot parse {str(config)!r}, {where}")
    assert "<unicode string>" not in line
    assert not (tmp_path / "out").exists()


def test_train_shows_a_library_warning_as_one_note_line(tmp_path, monkeypatch):
    """captioning's METEOR without nltk: one line ``note: ...`` for the whole command, not
    Python's RuntimeWarning with its file and source line; the API still warns."""
    import attnlab.evaluation.meteor as meteor
    from attnlab._optional import MissingDependencyError

    def missing(name: str):
        raise MissingDependencyError(f"{name} is not installed: pip install {name}")

    monkeypatch.setattr(meteor, "require", missing)
    small = ["-o", "train_size=32", "-o", "dev_size=8", "-o", "test_size=8", "--epochs", "2"]
    result = run(
        "train", "captioning", *small, "--seed", "0", "--seed", "1", "--no-progress",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "note: METEOR is NaN: nltk is not installed: pip install nltk"
    ]
    assert "n/a" in result.stdout  # the table's METEOR
    with pytest.warns(RuntimeWarning, match="METEOR is NaN"):  # the Python API warns as before
        meteor.meteor_or_nan([["a"]], [["a"]])


def test_train_prints_the_run_directories_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("train", "toy", "--plugin", TOY, "--no-progress", "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[3].endswith("  runs/toy/default--seed0")
    result = run(*_toy_argv("sub/dir", "--epochs", "1", "--seed", "3"))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[3].endswith("  sub/dir/default--seed3")
    assert str(tmp_path) not in result.stdout


def test_report_of_the_folder_that_train_fills(tmp_path):
    out = tmp_path / "runs"
    for attention in ("mean", "tanh"):
        argv = _toy_argv(out, "-a", attention, "--epochs", "1", "--seed", "0", "--seed", "1")
        assert run(*argv).exit_code == 0
    result = run("report", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out / "report.html")
    text = (out / "report.html").read_text(encoding="utf-8")
    assert "<title>attnlab run folder report: toy</title>" in text
    for label in ("mean", "tanh"):  # one row per attention over its two seeds
        assert f'data-label="{label}"' in text


def test_path_sizes_are_at_least_1():
    for argv in (["--d-q", "0", "--d-k", "0"], ["--d-q", "0"]):
        result = run("path", *argv)
        assert result.exit_code == 2
        assert "Invalid value for '--d-q': 0 is not in the range x>=1" in result.stderr
        assert "d_q == d_k" not in result.stderr and "sdpa" not in result.output
    result = run("path", "--d-k", "-1")
    assert result.exit_code == 2 and "'--d-k': -1 is not in the range x>=1" in result.stderr


def test_path_help_describes_every_option():
    text = " ".join(run("path", "--help").stdout.split())
    for piece in (
        "--score TEXT the score function (the names: attnlab list --kind score)",
        "--align TEXT the alignment function (the names: attnlab list --kind align)",
        "--dim TEXT single: one weight per key; multi: one weight per key and feature",
        "--d-q INTEGER RANGE the size of a query vector",
        "--d-k INTEGER RANGE the size of a key vector",
        "--need-weights the caller asks for the attention weights",
    ):
        assert piece in text


def test_documented_command_lines_name_no_path_of_the_developers():
    """A user can type every ``attnlab`` line of the lab's and the tasks' pages: none names
    a file that exists only beside the developers' checkout (``../shared/...``)."""
    pages = [*(ROOT / "docs" / "lab").glob("*.md"), *(ROOT / "docs" / "tasks").glob("*.md")]
    assert pages
    for page in pages:
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.lstrip("$ ").startswith("attnlab "):
                assert "../shared" not in line, f"{page.name}: {line}"


# ----------------------------------------------------------------------------- installed


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
        [_console_script(), "path", "--score", "additive", "--option", "bogus=1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "bogus" in proc.stderr


def test_installed_console_script_trains_with_a_plugin_from_the_current_directory(tmp_path):
    proc = subprocess.run(
        [_console_script(), "train", "toy", "--plugin", TOY, "--epochs", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "toy seed 0" in proc.stderr  # the progress bars go to stderr
    assert (tmp_path / "default--seed0" / "model.safetensors").is_file()


def test_python_m_attnlab(monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["attnlab", "list", "--kind", "dim"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("attnlab", run_name="__main__")
    assert exit_.value.code == 0
    assert "Attention dimensionality" in capsys.readouterr().out


def test_the_seed_table_mean_counts_the_finite_values_only():
    from attnlab.cli import _mean_std

    assert _mean_std([0.6, 0.8]) == f"0.7000 ± {0.02**0.5:.4f}"
    assert _mean_std([0.6, None, float("nan")]) == "0.6000"  # one value: no spread to show
    assert _mean_std([None, float("inf")]) == "n/a"


def test_version():
    import tomllib

    import attnlab

    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"attnlab {attnlab.__version__}\n"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert attnlab.__version__ == project["version"]  # one version, not two that drift
