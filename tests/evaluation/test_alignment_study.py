"""The translator AER study: link extraction and AER on hand-made matrices (hand-computed
numbers), baselines on a tiny hand corpus, and the table / command on a tiny trained
ablation of the generated ``reverse`` task (whose exact alignment is known)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from attnlab.data.pharaoh import Alignment
from attnlab.evaluation.alignment_study import (
    AERRow,
    aer_table,
    aer_table_command,
    attention_links,
    baseline_aers,
    format_aer_table,
    oracle_argmax_links,
    restrict_to_linked,
    translator_aer,
)

# two pairs; matrices are target rows x source columns
W0 = [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]]  # T=2, S=3: argmax -> (1, 0), (0, 1)
W1 = [[0.5, 0.5], [0.2, 0.8], [0.9, 0.1]]  # T=3, S=2: ties take the first column
GOLD = [
    Alignment(sure={(1, 0)}, possible_only={(2, 1)}),  # (0, 1) predicted: wrong
    Alignment(sure={(0, 0), (1, 1)}),  # (0, 2) predicted: wrong
]


def test_argmax_links_and_aer_by_hand() -> None:
    links = attention_links([W0, torch.tensor(W1)])
    assert links == [{(1, 0), (0, 1)}, {(0, 0), (1, 1), (0, 2)}]
    from attnlab.evaluation.aer import alignment_error_rate

    r = alignment_error_rate(GOLD, links)
    # |A| = 5, |S| = 3, |P| = 4; A&S = {(1,0), (0,0), (1,1)} = 3 = A&P
    assert (r.predicted, r.sure, r.hits_sure, r.hits_possible) == (5, 3, 3, 3)
    assert r.aer == pytest.approx(1 - 6 / 8)
    assert r.precision == pytest.approx(3 / 5) and r.recall == pytest.approx(1.0)


def test_threshold_links_by_hand() -> None:
    links = attention_links([W0, W1], extraction="threshold", threshold=0.5)
    assert links == [{(1, 0), (0, 1)}, {(0, 0), (1, 0), (1, 1), (0, 2)}]
    with pytest.raises(ValueError, match="extraction"):
        attention_links([W0], extraction="max")


def test_restrict_to_linked_and_oracle_by_hand() -> None:
    # pair 0: linked source {1, 2}, target {0, 1}: (0, 1) goes (source 0 unlinked)
    # pair 1: linked source {0, 1}, target {0, 1}: (0, 2) goes (target 2 unlinked)
    links = attention_links([W0, W1])
    assert restrict_to_linked(links, GOLD) == [{(1, 0)}, {(0, 0), (1, 1)}]
    # oracle: a sure link per linked target word (else a possible one), a wrong one else
    oracle = oracle_argmax_links(GOLD, [2, 3])
    assert oracle == [{(1, 0), (2, 1)}, {(0, 0), (1, 1), (-3, 2)}]


def _fake_corpus() -> SimpleNamespace:
    """TaskData-like: split(name) -> source, target, alignments; test pairs of lengths
    (S, T) = (3, 2) and (2, 4)."""

    def part(source, target, alignments):
        return SimpleNamespace(source=source, target=target, alignments=alignments)

    words = [f"w{i}" for i in range(6)]
    train_src = [words[k % 6 : k % 6 + 3] or ["w0"] for k in range(30)]
    train = part(train_src, [["x" + w[1:] for w in s] for s in train_src], [None] * len(train_src))
    test = part(
        [["w0", "w1", "w2"], ["w3", "w4"]],
        [["x0", "x1"], ["x3", "x3", "x4", "x4"]],
        [
            Alignment(sure={(0, 0), (2, 1)}),
            Alignment(sure={(0, 0), (1, 3)}, possible_only={(0, 1)}),
        ],
    )
    dev = part([["w5"]], [["x5"]], [Alignment(sure={(0, 0)})])
    parts = {"train": train, "dev": dev, "test": test}
    return SimpleNamespace(split=lambda name: parts[name])


def test_baseline_aers_diagonal_by_hand() -> None:
    out = baseline_aers(_fake_corpus(), "test", eflomal=False)
    assert set(out) == {"diagonal", "argmax oracle"}
    # diagonal: (S, T) = (3, 2) -> {(0, 0), (2, 1)}; (2, 4) -> {(0, 0), (0, 1), (1, 2), (1, 3)}
    # |A| = 6, |S| = 4; A&S = 2 + 2 = 4; A&P = 2 + 3 (pair 1 adds the possible (0, 1)) = 5
    d = out["diagonal"]
    assert (d.predicted, d.sure, d.hits_sure, d.hits_possible) == (6, 4, 4, 5)
    assert d.aer == pytest.approx(1 - 9 / 10)
    # oracle: pair 0 {(0,0),(2,1)}; pair 1 {(0,0),(0,1),(-3,2),(1,3)}: A=6, A&S=4, A&P=5
    assert out["argmax oracle"].aer == pytest.approx(1 - 9 / 10)
    linked = baseline_aers(_fake_corpus(), "test", eflomal=False, oracle=False, scope="linked")
    # pair 1: target 2 is unlinked -> (1, 2) dropped: A = 5
    assert linked["diagonal"].predicted == 5
    assert linked["diagonal"].aer == pytest.approx(1 - 9 / 9)
    with pytest.raises(ValueError, match="scope"):
        baseline_aers(_fake_corpus(), "test", eflomal=False, scope="some")
    with pytest.raises(ValueError, match="split"):
        baseline_aers(_fake_corpus(), "valid", eflomal=False)


def test_baseline_aers_eflomal_scores_the_test_pairs() -> None:
    """eflomal runs on all 33 pairs; the links scored must be those of the test pairs (a
    wrong offset would index outside the test sentences)."""
    pytest.importorskip("eflomal", reason="eflomal is not installed (attnlab[eval])")
    corpus = _fake_corpus()
    out = baseline_aers(corpus, "test")
    assert {k for k in out if k.startswith("eflomal")} == {
        "eflomal forward",
        "eflomal reverse",
        "eflomal intersection",
        "eflomal grow-diag-final-and",
    }
    for r in out.values():
        assert r.pairs == 2 and 0.0 <= r.aer <= 1.0
    assert 0 < out["eflomal forward"].predicted <= 6  # at most one link per target word


def test_eflomal_iterations_as_an_int() -> None:
    pytest.importorskip("eflomal", reason="eflomal is not installed (attnlab[eval])")
    from attnlab.evaluation.aligners import eflomal_directions

    fwd, rev = eflomal_directions([["a", "b"]] * 4, [["x", "y"]] * 4, iterations=2)
    assert len(fwd) == len(rev) == 4


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

TINY = {
    "corpus": "reverse",
    "synthetic_pairs": 60,
    "max_len": 5,
    "embed_dim": 8,
    "hidden_size": 8,
    "batch_size": 8,
    "dropout": 0.0,
    "epochs": 1,
}


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
    lines = res.output.splitlines()
    assert lines[0].startswith("| mechanism | n | AER %")
    assert any(line.startswith("| local-p | 2 |") for line in lines)
    assert any(line.startswith("| diagonal | - |") for line in lines)
    res = runner.invoke(aer_table_command, [str(tmp_path)])
    assert res.exit_code != 0 and "ablation.json" in res.output


def test_bible_baselines_if_installed() -> None:
    from attnlab.data import MissingDataError
    from attnlab.lab.tasks.translation import TranslationTask

    task = TranslationTask(books=["Prov"], max_len=14, min_freq=1)
    try:
        data = task.load_data()
    except MissingDataError as err:
        pytest.skip(str(err))
    out = baseline_aers(data, "test", eflomal=False)
    # the oracle is the floor of every one-link-per-target-word extraction
    assert out["argmax oracle"].aer <= out["diagonal"].aer
    assert 0.0 < out["diagonal"].aer < 1.0
