"""AER against hand-computed values, the published enfr figure, and the `attnlab aer` command."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from attnlab.data.pharaoh import Alignment, read_pharaoh
from attnlab.evaluation.aer import aer_command, alignment_error_rate

ALIGN = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "alignment"
needs_alignments = pytest.mark.skipif(
    not (ALIGN / "enfr.gold").is_file(),
    reason="reference data for maintainers is absent (awesome-align alignments)",
)

GOLD_1 = Alignment(sure=frozenset({(0, 0), (1, 1)}), possible_only=frozenset({(1, 2)}))
HYP_1 = {(0, 0), (1, 2), (2, 2)}


def test_one_pair_by_hand() -> None:
    # |A| = 3, |S| = 2, |A & S| = 1 ((0,0)), |A & P| = 2 ((0,0), (1,2))
    r = alignment_error_rate([GOLD_1], [HYP_1])
    assert r.aer == pytest.approx(1 - (1 + 2) / (3 + 2))
    assert r.precision == pytest.approx(2 / 3)
    assert r.recall == pytest.approx(1 / 2)
    assert (r.predicted, r.sure, r.possible, r.hits_sure, r.hits_possible) == (3, 2, 3, 1, 2)


def test_corpus_level_sums_counts_not_sentence_rates() -> None:
    gold_2 = Alignment(sure=frozenset({(0, 0)}))
    r = alignment_error_rate([GOLD_1, gold_2], [HYP_1, set()])
    # totals: |A| = 3, |S| = 3, hits 1 sure and 2 possible -> 1 - 3/6; the mean of the
    # sentence AERs would be (0.4 + 1.0) / 2 = 0.7
    assert r.aer == pytest.approx(0.5)
    assert r.precision == pytest.approx(2 / 3)
    assert r.recall == pytest.approx(1 / 3)
    assert r.pairs == 2


def test_perfect_and_possible_only_predictions() -> None:
    assert alignment_error_rate([GOLD_1], [GOLD_1.sure]).aer == 0.0
    # predicting only the possible link: precision 1, recall 0, AER = 1 - 1/(1 + 2)
    r = alignment_error_rate([GOLD_1], [{(1, 2)}])
    assert (r.precision, r.recall) == (1.0, 0.0)
    assert r.aer == pytest.approx(2 / 3)


def test_alignment_hypothesis_counts_all_its_links() -> None:
    hyp = Alignment(sure=frozenset({(0, 0)}), possible_only=frozenset({(1, 1)}))
    assert alignment_error_rate([GOLD_1], [hyp]).aer == 0.0


def test_empty_prediction_and_mismatched_lengths() -> None:
    r = alignment_error_rate([GOLD_1], [set()])
    assert (r.aer, r.precision, r.recall, r.predicted) == (1.0, 1.0, 0.0, 0)
    with pytest.raises(ValueError, match="gold has 1 sentence pairs but predicted has 2"):
        alignment_error_rate([GOLD_1], [set(), set()])
    with pytest.raises(TypeError, match="Alignment"):
        alignment_error_rate([{(0, 0)}], [set()])  # type: ignore[list-item]


@needs_alignments
def test_published_enfr_figure() -> None:
    gold = read_pharaoh(ALIGN / "enfr.gold", one_indexed=True)
    hyp = read_pharaoh(ALIGN / "enfr.awesome-align.out")
    r = alignment_error_rate(gold, hyp)
    # awesome-align's published figures: AER 4.1 %, precision 96.3 %, recall 95.4 %
    assert round(100 * r.aer, 1) == 4.1
    assert round(100 * r.precision, 1) == 96.3
    assert round(100 * r.recall, 1) == 95.4
    assert r.predicted == 6038


@needs_alignments
def test_command_on_enfr() -> None:
    out = CliRunner().invoke(
        aer_command,
        [str(ALIGN / "enfr.gold"), str(ALIGN / "enfr.awesome-align.out"), "--gold-one-indexed"],
    )
    assert out.exit_code == 0, out.output
    lines = dict(line.split(None, 1) for line in out.output.splitlines())
    assert lines["AER"] == "4.1%"
    assert lines["precision"] == "96.3%"
    assert lines["recall"] == "95.4%"
    assert lines["predicted"] == "6038 links"


def test_command_small_files_and_errors(tmp_path: Path) -> None:
    gold = tmp_path / "gold"
    hyp = tmp_path / "hyp"
    gold.write_text("1-1 2-2 2p3\n", encoding="utf-8")
    hyp.write_text("0-0 1-2 2-2\n", encoding="utf-8")
    out = CliRunner().invoke(aer_command, [str(gold), str(hyp), "--gold-one-indexed", "--json"])
    assert out.exit_code == 0, out.output
    assert '"aer": 0.4' in out.output
    # a 0 in a file read as 1-indexed is an error naming the file and line
    out = CliRunner().invoke(aer_command, [str(gold), str(hyp), "--hyp-one-indexed"])
    assert out.exit_code != 0
    assert "hyp" in out.output and "line 1" in out.output


def test_command_reads_a_pipe_and_says_one_line_for_an_unreadable_file(
    tmp_path: Path, monkeypatch
) -> None:
    gold = tmp_path / "gold"
    gold.write_text("0-0 1-1\n", encoding="utf-8")
    # /dev/null is no regular file (nor is the pipe of `attnlab aer gold <(command)`): read
    # it, and say that it holds no sentence pair
    out = CliRunner().invoke(aer_command, [str(gold), os.devnull])
    assert out.exit_code == 2
    assert out.output.strip() == (
        "error: gold has 1 sentence pairs but predicted has 0; give one alignment per pair, "
        "in the same order"
    )
    locked = tmp_path / "locked"
    locked.write_text("0-0\n", encoding="utf-8")
    real_open = open

    def no_permission(file, *args, **kwargs):
        if str(file) == str(locked):
            raise PermissionError(13, "Permission denied", str(locked))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_permission)
    out = CliRunner().invoke(aer_command, [str(gold), str(locked)])
    assert out.exit_code == 2
    assert out.output.strip() == f"error: [Errno 13] Permission denied: '{locked}'"


@pytest.mark.parametrize(
    ("predicted", "message"),
    [
        (["0-0 1-1"], r"predicted\[0\] must be \(source, target\) links.*parse_pharaoh"),
        ([[(0, -1)]], r"predicted\[0\] must be .* got \(0, -1\)$"),
        ([[(0, 1, 2)]], r"predicted\[0\] must be .* got \(0, 1, 2\)$"),
        ([[(True, 0)]], r"predicted\[0\] must be .* got \(True, 0\)$"),
        ([[(0.5, 1)]], r"predicted\[0\] must be .* got \(0\.5, 1\)$"),
        ([5], r"predicted\[0\] must be .* got 5$"),
    ],
)
def test_predicted_links_that_are_not_index_pairs_are_one_line(predicted, message):
    """Text would be read character by character (``"0-0"``: a link of three values);
    a bool, a float or a negative index is no word position."""
    with pytest.raises(TypeError, match=message):
        alignment_error_rate([Alignment({(0, 0)})], predicted)


def test_predicted_links_may_be_lists_and_numpy_ints():
    import numpy as np

    gold = [Alignment({(0, 0), (1, 1)})]
    as_lists = alignment_error_rate(gold, [[[0, 0], [np.int64(1), np.int64(1)]]])
    assert as_lists.aer == 0.0 and as_lists.predicted == 2


def test_command_ignores_a_blank_line_that_ends_one_file(tmp_path: Path) -> None:
    """A trailing blank line reads as an empty alignment; where it only makes one file
    longer, the command scores the pairs both files have (an empty alignment adds nothing
    to the AER's counts); a longer file with links stays an error."""
    gold, hyp = tmp_path / "gold", tmp_path / "hyp"
    gold.write_text("0-0 1-1 1p2\n1-0\n", encoding="utf-8")
    hyp.write_text("0-0 1-2 2-2\n1-0\n\n\n", encoding="utf-8")
    out = CliRunner().invoke(aer_command, [str(gold), str(hyp), "--json"])
    assert out.exit_code == 0, out.output
    assert '"pairs": 2' in out.output
    want = alignment_error_rate(read_pharaoh(gold), read_pharaoh(hyp)[:2])
    assert f'"aer": {want.aer}' in out.output
    swapped = CliRunner().invoke(aer_command, [str(hyp), str(gold), "--json"])
    assert swapped.exit_code == 0 and '"pairs": 2' in swapped.output
    hyp.write_text("0-0 1-2 2-2\n1-0\n\n3-3\n", encoding="utf-8")
    out = CliRunner().invoke(aer_command, [str(gold), str(hyp)])
    assert out.exit_code == 2 and "gold has 2 sentence pairs but predicted has 4" in out.output


def test_command_names_one_indexing_as_a_user_reads_it(tmp_path: Path) -> None:
    gold = tmp_path / "gold"
    gold.write_text("0-1\n", encoding="utf-8")
    out = CliRunner().invoke(aer_command, [str(gold), str(gold), "--gold-one-indexed"])
    assert out.exit_code == 2
    assert "read as 1-indexed (words counted from 1)" in out.output
    assert "one_indexed" not in out.output
