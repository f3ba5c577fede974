"""The translator AER study (``attnlab aer-table``): the table's format, and the table and
command on a tiny trained ablation of the generated ``reverse`` task (whose exact alignment
is known)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from click.testing import CliRunner
from tiny_tasks import translation_options

from attnlab.lab.studies.alignment import (
    AERRow,
    aer_table,
    aer_table_command,
    format_aer_table,
    translator_aer,
)


def test_format_aer_table() -> None:
    rows = [
        AERRow("luong-general", 2, 0.5, 0.05, 0.4, 0.01, 0.6, None, 5.0, 0.25),
        AERRow("diagonal", 0, 0.75, None, 0.2, None, 0.3, None, kind="baseline"),
    ]
    md = format_aer_table(rows, markdown=True).splitlines()
    assert md[0] == "| mechanism | n | AER % | precision % | recall % | BLEU |"
    assert md[2] == "| luong-general | 2 | 50.0 ± 5.0 | 40.0 ± 1.0 | 60.0 | 5.00 ± 0.25 |"
    assert md[3] == "| diagonal | - | 75.0 | 20.0 | 30.0 | - |"
    text = format_aer_table(rows)
    assert "luong-general" in text and "50.0 ± 5.0" in text


# ----------------------------------------------------------------------------- real runs

TINY = translation_options()  # the tiny generated "reverse" corpus of test_translation


@pytest.fixture(scope="module")
def tiny_ablation(tmp_path_factory):
    from attnlab.lab.ablation import run_ablation

    out = tmp_path_factory.mktemp("abl")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_ablation(
            "translation",
            [{"name": "luong-general"}, {"name": "local-p"}],
            [0, 1],
            out_dir=out,
            options=TINY,
            progress=False,
        )
    finally:
        torch.set_num_threads(old)
    return out


def _naive_aer(run_dir) -> float:
    """Argmax links by a Python loop over the teacher-forced matrices, AER by the formula."""
    from attnlab.lab.training import load_run

    task, data, model = load_run(run_dir)
    mats = task.attention_matrices(model, data, "test")
    a_s = a_p = n_a = n_s = 0
    for m, g in zip(mats, data.test.alignments, strict=True):
        for j in range(m.shape[0]):
            row = m[j].tolist()
            i = max(range(len(row)), key=lambda c: (row[c], -c))
            n_a += 1
            a_s += (i, j) in g.sure
            a_p += (i, j) in g.possible
        n_s += len(g.sure)
    return 1 - (a_s + a_p) / (n_a + n_s)


def test_translator_aer_matches_a_naive_loop(tiny_ablation) -> None:
    run_dir = tiny_ablation / "runs" / "luong-general--seed0"
    result = translator_aer(run_dir)
    assert result.aer == pytest.approx(_naive_aer(run_dir))
    from attnlab.lab.tasks.translation import TranslationTask

    test = TranslationTask(**TINY).load_data().test
    assert result.pairs == len(test) == 6
    assert result.predicted == sum(len(t) for t in test.target)  # one link per target word
    thr = translator_aer(run_dir, extraction="threshold", threshold=0.01)
    assert thr.predicted >= result.predicted
    with pytest.raises(ValueError, match="split"):
        translator_aer(run_dir, "valid")


def test_aer_table_rows(tiny_ablation) -> None:
    rows = aer_table(tiny_ablation, baselines=True, eflomal=False)
    names = [r.mechanism for r in rows]
    assert names == ["luong-general", "local-p", "diagonal", "argmax oracle"]
    first = rows[0]
    assert first.n == 2 and first.kind == "attention"
    aers = [_naive_aer(tiny_ablation / "runs" / f"luong-general--seed{s}") for s in (0, 1)]
    assert first.aer == pytest.approx(sum(aers) / 2)
    assert first.aer_std == pytest.approx(abs(aers[0] - aers[1]) / math.sqrt(2))
    bleus = [
        json.loads(
            (tiny_ablation / "runs" / f"luong-general--seed{s}" / "metrics.json").read_text()
        )["test"]["bleu"]
        for s in (0, 1)
    ]
    assert first.bleu == pytest.approx(sum(bleus) / 2)
    assert rows[2].kind == "baseline" and rows[2].bleu is None
    # the oracle of the exact reverse alignment: one sure link per target word -> AER 0
    assert rows[3].aer == pytest.approx(0.0)


def test_aer_table_command(tiny_ablation, tmp_path) -> None:
    runner = CliRunner()
    res = runner.invoke(aer_table_command, [str(tiny_ablation), "--markdown", "--no-eflomal"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()  # the table; the progress bar is on stderr
    assert lines[0].startswith("| mechanism | n | AER %")
    assert any(line.startswith("| local-p | 2 |") for line in lines)
    assert any(line.startswith("| diagonal | - |") for line in lines)
    assert "run/s" in res.stderr or "run]" in res.stderr  # a bar over the runs
    quiet = runner.invoke(
        aer_table_command, [str(tiny_ablation), "--markdown", "--no-eflomal", "--no-progress"]
    )
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == res.stdout
    res = runner.invoke(aer_table_command, [str(tmp_path)])
    assert res.exit_code != 0 and "ablation.json" in res.output


def _damaged_copy(tiny_ablation, tmp_path, name, damage):
    import shutil

    copy = tmp_path / name
    shutil.copytree(tiny_ablation, copy)
    damage(copy / "runs")
    return copy


def _swap(runs):  # another seed's weights: a checkpoint run.json did not record
    (runs / "luong-general--seed0" / "model.safetensors").write_bytes(
        (runs / "luong-general--seed1" / "model.safetensors").read_bytes()
    )


def _write(relative: str, text: str):
    """A damage: write ``text`` over the run file ``relative`` (below runs/)."""
    return lambda runs: (runs / relative).write_text(text)


def _no_runs(runs):
    import shutil

    shutil.rmtree(runs)


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        ("swapped", _swap, r"sha256"),
        ("metrics", _write("local-p--seed1/metrics.json", "[]"), r"metrics\.json' holds list"),
        (
            "nulltest",
            _write("local-p--seed1/metrics.json", '{"test": null}'),
            r"metrics\.json' is malformed: 'test' is NoneType",
        ),
        ("runjson", _write("local-p--seed0/run.json", "{bad"), r"run\.json' is not readable"),
        ("listrun", _write("local-p--seed0/run.json", "[]"), r"run\.json' holds list, not an"),
        ("noruns", _no_runs, r"holds no finished"),
    ],
)
def test_aer_table_refuses_damaged_runs_in_one_line(
    tiny_ablation, tmp_path, name, damage, message
) -> None:
    """A swapped checkpoint was scored silently, a malformed metrics.json or run.json was a
    traceback or an error naming no file, and an ablation without a finished run printed
    an empty table with exit 0: each is now one error line naming the file, exit 2."""
    copy = _damaged_copy(tiny_ablation, tmp_path, name, damage)
    res = CliRunner().invoke(aer_table_command, [str(copy), "--no-progress", "--no-eflomal"])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert re.search(message, lines[0]), lines[0]


def test_run_and_ablation_folders_are_paths_and_tilde_is_home(tmp_path, monkeypatch) -> None:
    from attnlab.lab.checkpoint import MissingRunFileError

    with pytest.raises(TypeError, match="run_dir must be a path"):
        translator_aer(3)
    with pytest.raises(TypeError, match="ablation_dir must be a path"):
        aer_table(3)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MissingRunFileError, match=f"'{tmp_path / 'gone'}' is not a run"):
        translator_aer("~/gone")
    with pytest.raises(Exception, match=str(tmp_path / "gone")):
        aer_table("~/gone")
