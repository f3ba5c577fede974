"""Alignment error rate (Och & Ney 2003), the intrinsic metric of attention as word alignment.

With A the predicted links, S the sure gold links and P the possible gold links (S within
P), counted over the whole corpus (sums over sentence pairs, not an average of sentence
rates)::

    precision = |A & P| / |A|
    recall    = |A & S| / |S|
    AER       = 1 - (|A & S| + |A & P|) / (|A| + |S|)

An empty prediction has precision 1 by convention here (nothing predicted is wrong) and
AER 1 when S is non-empty. Cost: O(sum of links) with Python sets.

Source: F. J. Och and H. Ney, "A Systematic Comparison of Various Statistical Alignment
Models", Computational Linguistics 29(1), 2003. Luong et al. (2015) report the AER of a
translator's attention this way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnlab.data.pharaoh import Alignment, as_links
from attnlab.evaluation._measures import Record

__all__ = ["AERResult", "alignment_error_rate"]

Link = tuple[int, int]


@dataclass(frozen=True)
class AERResult(Record):
    """Corpus-level alignment scores.

    Attributes:
        aer: the alignment error rate in [0, 1].
        precision: |A & P| / |A|.
        recall: |A & S| / |S|.
        predicted: |A|, the number of predicted links.
        sure: |S|; possible: |P| (sure links included).
        hits_sure: |A & S|; hits_possible: |A & P|.
        pairs: the number of sentence pairs.
    """

    aer: float
    precision: float
    recall: float
    predicted: int
    sure: int
    possible: int
    hits_sure: int
    hits_possible: int
    pairs: int

    def __str__(self) -> str:
        return (
            f"AER {100 * self.aer:.1f}%  precision {100 * self.precision:.1f}%  "
            f"recall {100 * self.recall:.1f}%  links {self.predicted}"
        )


def _links(hyp: Alignment | Iterable[Link], name: str) -> frozenset[Link]:
    if isinstance(hyp, Alignment):
        return hyp.possible
    return as_links(hyp, name)


def alignment_error_rate(
    gold: Sequence[Alignment], predicted: Sequence[Alignment | Iterable[Link]]
) -> AERResult:
    """AER, precision and recall of ``predicted`` against ``gold`` over a corpus.

    Args:
        gold: one :class:`~attnlab.data.Alignment` per sentence pair (sure and possible).
        predicted: one alignment per pair: an Alignment (all its links count as predicted)
            or an iterable of 0-indexed ``(source, target)`` links.

    Raises ``ValueError`` when the two sequences have different lengths, ``TypeError``
    when a predicted item is no Alignment and holds something other than links (text
    such as ``"0-0 1-1"``: parse it with :func:`~attnlab.data.parse_pharaoh`).
    """
    if len(gold) != len(predicted):
        raise ValueError(
            f"gold has {len(gold)} sentence pairs but predicted has {len(predicted)}; "
            "give one alignment per pair, in the same order"
        )
    n_a = n_s = n_p = hit_s = hit_p = 0
    for k, (g, h) in enumerate(zip(gold, predicted, strict=True)):
        if not isinstance(g, Alignment):
            raise TypeError(f"gold items must be attnlab.data.Alignment, got {type(g).__name__}")
        a = _links(h, f"predicted[{k}]")
        s, p = g.sure, g.possible
        n_a += len(a)
        n_s += len(s)
        n_p += len(p)
        hit_s += len(a & s)
        hit_p += len(a & p)
    precision = hit_p / n_a if n_a else 1.0
    recall = hit_s / n_s if n_s else 1.0
    denom = n_a + n_s
    aer = 1.0 - (hit_s + hit_p) / denom if denom else 0.0
    return AERResult(aer, precision, recall, n_a, n_s, n_p, hit_s, hit_p, len(gold))


def _same_count(
    gold: list[Alignment], hyp: list[Alignment]
) -> tuple[list[Alignment], list[Alignment]]:
    """The two files' alignments without the empty ones that end the longer file past the
    other's count: a blank line at the end of a file reads as an empty alignment, and
    whether it is a pair without links or a stray line cannot be told from one file. An
    empty alignment adds nothing to any count of the AER, so dropping it changes no
    figure; a difference in non-empty lines stays an error."""
    short = min(len(gold), len(hyp))

    def trim(alignments: list[Alignment]) -> list[Alignment]:
        end = len(alignments)
        while end > short and not alignments[end - 1].possible:
            end -= 1
        return alignments[:end]

    return trim(gold), trim(hyp)


def _aer_command():
    import click

    @click.command("aer")
    @click.argument("gold", type=click.Path(exists=True, dir_okay=False))
    @click.argument("hyp", type=click.Path(exists=True, dir_okay=False))
    @click.option("--gold-one-indexed", is_flag=True, help="GOLD counts words from 1.")
    @click.option("--hyp-one-indexed", is_flag=True, help="HYP counts words from 1.")
    @click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
    def aer_command(
        gold: str, hyp: str, gold_one_indexed: bool, hyp_one_indexed: bool, as_json: bool
    ) -> None:
        """Alignment error rate of HYP against GOLD (Pharaoh files: `i-j` sure, `ipj`
        possible links, one sentence pair a line; 0-indexed unless told)."""
        import json

        from attnlab.data._common import DataFormatError
        from attnlab.data.pharaoh import read_pharaoh

        try:
            g = read_pharaoh(gold, one_indexed=gold_one_indexed)
            h = read_pharaoh(hyp, one_indexed=hyp_one_indexed)
            result = alignment_error_rate(*_same_count(g, h))
        except (DataFormatError, ValueError, OSError) as err:
            # one line and status 2 for a bad file, as every attnlab command (the lab's
            # attnlab.lab.errors.fail; evaluation may not import the lab)
            click.echo(f"error: {err}", err=True)
            raise SystemExit(2) from None
        if as_json:
            click.echo(json.dumps(result.as_dict(), indent=2))
            return
        click.echo(f"AER        {100 * result.aer:.1f}%")
        click.echo(f"precision  {100 * result.precision:.1f}%")
        click.echo(f"recall     {100 * result.recall:.1f}%")
        click.echo(f"predicted  {result.predicted} links")
        click.echo(
            f"gold       {result.sure} sure, {result.possible} possible links, "
            f"{result.pairs} sentence pairs"
        )

    return aer_command


aer_command = _aer_command()
