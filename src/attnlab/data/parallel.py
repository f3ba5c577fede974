"""Parallel text: sentence pairs for translation and word alignment.

Two layouts, both pre-tokenised (tokens separated by whitespace):

* one file, one pair per line, sides separated by ``|||`` (the layout of fast_align and
  awesome-align): ``the house ||| la maison`` -- :func:`read_parallel`;
* two files with the same number of lines, line ``k`` of one translating line ``k`` of the
  other -- :func:`read_parallel_files`.

Both return a :class:`ParallelCorpus`. Errors name the file and line: a line without the
separator (or with two), an empty side, files of different lengths.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import IO, ClassVar, NamedTuple

from attnlab._atomic import write_text
from attnlab._checks import check_flags, check_seed
from attnlab.data._common import DataFormatError, assign_splits, check_split
from attnlab.data._io import Source, open_text, source_name
from attnlab.data.containers import _Columns

__all__ = [
    "ParallelCorpus",
    "ParallelPair",
    "read_parallel",
    "read_parallel_files",
    "write_parallel",
]


class ParallelPair(NamedTuple):
    source: tuple[str, ...]
    target: tuple[str, ...]
    id: str
    split: str


@dataclasses.dataclass(frozen=True, eq=False)
class ParallelCorpus(_Columns):
    """Tokenised sentence pairs.

    Attributes:
        source, target: the tokens of each side.
        ids: the line number (1-based) per pair, as a string.
        splits: ``split=`` for every pair, or a seeded train/dev/test split.
        name: where the data came from.
    """

    source: tuple[tuple[str, ...], ...]
    target: tuple[tuple[str, ...], ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = ("source", "target", "ids", "splits")

    def _validate_labels(self) -> None:
        """A parallel corpus has no labels: the columns' lengths and the split names are
        checked (the base's ``_validate``)."""

    def __getitem__(self, i: int) -> ParallelPair:
        return ParallelPair(self.source[i], self.target[i], self.ids[i], self.splits[i])

    @property
    def lengths(self) -> list[tuple[int, int]]:
        """``(source length, target length)`` per pair (for :func:`read_pharaoh`'s check)."""
        return [(len(s), len(t)) for s, t in zip(self.source, self.target, strict=True)]

    def label_counts(self) -> dict[str, int]:
        raise TypeError("a ParallelCorpus has no labels")


def _check_options(split: str | None, seed: int, **flags: bool) -> None:
    """The readers' options, checked before a file is opened."""
    check_split(split)
    check_seed(seed, minimum=0)
    check_flags(**flags)


def _check_separator(separator: object) -> None:
    if not isinstance(separator, str) or not separator:
        raise ValueError(f"separator must be a non-empty string, got {separator!r}")


def _finish(
    pairs: list[tuple[tuple[str, ...], tuple[str, ...], str]],
    name: str,
    split: str | None,
    seed: int,
) -> ParallelCorpus:
    if not pairs:
        raise DataFormatError("no sentence pairs", path=name)
    ids = tuple(p[2] for p in pairs)
    splits = (split,) * len(pairs) if split else assign_splits(ids, seed=seed)
    return ParallelCorpus(
        source=tuple(p[0] for p in pairs),
        target=tuple(p[1] for p in pairs),
        ids=ids,
        splits=tuple(splits),
        name=name,
    )


def read_parallel(
    source: Source,
    *,
    separator: str = "|||",
    lower: bool = False,
    allow_empty: bool = False,
    split: str | None = None,
    seed: int = 0,
) -> ParallelCorpus:
    """Read ``source tokens ||| target tokens`` lines into a :class:`ParallelCorpus`.

    Args:
        source: a path or an open text stream.
        separator: what separates the two sides.
        lower: lower-case the tokens.
        allow_empty: accept pairs with an empty side (otherwise an error).
        split: the split of every pair; by default a seeded 80/10/10 split (``seed``).
    """
    _check_separator(separator)
    _check_options(split, seed, lower=lower, allow_empty=allow_empty)
    where = source_name(source)
    pairs = []
    with open_text(source) as f:
        for line_no, line in enumerate(f, start=1):
            parts = line.rstrip("\r\n").split(separator)
            if len(parts) != 2:
                raise DataFormatError(
                    f"expected one {separator!r} between source and target, found {len(parts) - 1}",
                    path=where,
                    line=line_no,
                )
            src, tgt = (_tokens(p, lower) for p in parts)
            if not allow_empty and (not src or not tgt):
                raise DataFormatError(
                    f"the {'source' if not src else 'target'} side is empty (allow_empty=True accepts that)",
                    path=where,
                    line=line_no,
                )
            pairs.append((src, tgt, str(line_no)))
    return _finish(pairs, where, split, seed)


def read_parallel_files(
    source: Source,
    target: Source,
    *,
    lower: bool = False,
    allow_empty: bool = False,
    split: str | None = None,
    seed: int = 0,
) -> ParallelCorpus:
    """Read two line-aligned files (line k of ``source`` translates line k of ``target``)."""
    _check_options(split, seed, lower=lower, allow_empty=allow_empty)
    where_s, where_t = source_name(source), source_name(target)
    pairs = []
    with open_text(source) as fs, open_text(target) as ft:
        lines_s: Iterator[str] = iter(fs)
        lines_t: Iterator[str] = iter(ft)
        line_no = 0
        while True:
            a = next(lines_s, None)
            b = next(lines_t, None)
            if a is None and b is None:
                break
            line_no += 1
            if a is None or b is None:
                short, other = (where_s, where_t) if a is None else (where_t, where_s)
                raise DataFormatError(
                    f"{short} ends after {line_no - 1} lines but {other} goes on",
                    path=other,
                    line=line_no,
                )
            src, tgt = _tokens(a, lower), _tokens(b, lower)
            if not allow_empty and (not src or not tgt):
                raise DataFormatError(
                    "empty line (allow_empty=True accepts that)",
                    path=where_s if not src else where_t,
                    line=line_no,
                )
            pairs.append((src, tgt, str(line_no)))
    return _finish(pairs, f"{where_s} + {where_t}", split, seed)


def write_parallel(
    corpus: ParallelCorpus, target: str | os.PathLike | IO[str], *, separator: str = "|||"
) -> None:
    """Write a corpus as ``source ||| target`` lines.

    Every token must read back as itself: an empty token, or one that holds whitespace
    (a newline included) or the separator, raises a ``ValueError`` naming the pair and the
    token before anything is written."""
    _check_separator(separator)
    lines = []
    for k, (s, t) in enumerate(zip(corpus.source, corpus.target, strict=True)):
        line = f"{' '.join(s)} {separator} {' '.join(t)}"
        _check_written(line, s, t, separator, f"pair {k + 1} (id {corpus.ids[k]!r})")
        lines.append(line + "\n")
    text = "".join(lines)
    if isinstance(target, str | os.PathLike):
        write_text(target, text)  # atomically: an interrupted write keeps the old file
    else:
        target.write(text)


def _check_written(
    line: str, source: tuple[str, ...], target: tuple[str, ...], separator: str, pair: str
) -> None:
    """A ``ValueError`` unless :func:`read_parallel` reads ``line`` back as the two sides,
    naming the first token that spoils it."""
    parts = line.split(separator)
    if len(parts) == 2 and _tokens(parts[0], False) == tuple(source):
        if _tokens(parts[1], False) == tuple(target):
            return
    for side, tokens in (("source", source), ("target", target)):
        for i, token in enumerate(tokens, start=1):
            if not token:
                problem = "is empty"
            elif any(c.isspace() for c in token):
                problem = "holds whitespace or a line break"
            elif separator in token:
                problem = f"holds the separator {separator!r}"
            else:
                continue
            raise ValueError(
                f"cannot write {pair}: {side} token {i} {token!r} {problem}, which "
                "read_parallel could not read back"
            )
    raise ValueError(
        f"cannot write {pair} with the separator {separator!r}: read_parallel could not "
        "read the line back"
    )


def _tokens(text: str, lower: bool) -> tuple[str, ...]:
    words = text.split()
    return tuple(w.lower() for w in words) if lower else tuple(words)
