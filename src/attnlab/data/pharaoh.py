"""Word alignments in the Pharaoh format: one sentence pair per line, links separated by
spaces, ``i-j`` a sure link and ``ipj`` a possible link between source word ``i`` and target
word ``j``::

    0-0 1-2 2p1 3-3

Files differ in where they count from: aligners (fast_align, GIZA++ symmetrised,
awesome-align) write 0-indexed links, and many gold sets (WPT 2003 Hansards) are
1-indexed. :func:`read_pharaoh` takes ``one_indexed`` and always returns 0-indexed
:class:`Alignment` objects; :func:`write_pharaoh` writes either way. An empty line is a
pair without links.

Possible links follow the usual convention of the alignment error rate (AER): the sure
set S is part of the possible set P, so :attr:`Alignment.possible` includes the sure
links, and :attr:`Alignment.possible_only` holds the links written with ``p``.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
from collections.abc import Iterable, Sequence
from typing import IO

from attnlab._atomic import write_text
from attnlab._checks import check_flags
from attnlab.data._common import DataFormatError
from attnlab.data._io import Source, open_text, source_name

__all__ = ["Alignment", "parse_pharaoh", "read_pharaoh", "write_pharaoh"]

_LINK = re.compile(r"^(\d+)([-p])(\d+)$")

Link = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Alignment:
    """The word alignment of one sentence pair, 0-indexed ``(source, target)`` links.

    Attributes:
        sure: the sure links (``i-j``).
        possible_only: the links marked only possible (``ipj``), disjoint from ``sure``.
    """

    sure: frozenset[Link] = frozenset()
    possible_only: frozenset[Link] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sure", frozenset(self.sure))
        object.__setattr__(self, "possible_only", frozenset(self.possible_only) - self.sure)
        for link in self.sure | self.possible_only:
            if not _is_link(link):
                raise ValueError(
                    f"alignment links must be pairs of non-negative ints, got {link!r}"
                )

    @property
    def possible(self) -> frozenset[Link]:
        """Sure and possible links together (P in the AER, with S contained in P)."""
        return self.sure | self.possible_only

    def __len__(self) -> int:
        return len(self.possible)

    def max_indices(self) -> tuple[int, int]:
        """The largest source and target index linked, -1 where there is no link."""
        links = self.possible
        return (max((i for i, _ in links), default=-1), max((j for _, j in links), default=-1))

    def to_pharaoh(self, *, one_indexed: bool = False) -> str:
        """The line for this pair: links sorted by source then target index."""
        o = 1 if one_indexed else 0
        links = [(i, j, "-") for i, j in self.sure] + [(i, j, "p") for i, j in self.possible_only]
        return " ".join(f"{i + o}{sep}{j + o}" for i, j, sep in sorted(links))


def _is_link(link: object) -> bool:
    """Whether ``link`` is a pair ``(i, j)`` of non-negative ints (bools are not ints here)."""
    return (
        isinstance(link, tuple)
        and len(link) == 2
        and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in link)
    )


def as_links(links: object, name: str) -> frozenset[Link]:
    """``links`` (an iterable of ``(source, target)`` pairs of non-negative ints: Python or
    NumPy ints, not bools; a pair may be a list, or a row of an integer ``[n, 2]`` array or
    tensor such as ``np.argwhere(matrix)``) as a frozenset of int pairs; otherwise a
    ``TypeError`` naming ``name`` and the first bad entry: ``"predicted[0] must be
    (source, target) links, pairs of non-negative ints, got '0'"``. Text is refused whole
    (``"0-0"`` would be read as its characters): :func:`parse_pharaoh` reads it."""
    wanted = f"{name} must be (source, target) links, pairs of non-negative ints"
    if isinstance(links, str | bytes) or not isinstance(links, Iterable):
        hint = " (parse text with attnlab.data.parse_pharaoh)" if isinstance(links, str) else ""
        raise TypeError(f"{wanted}, got {links!r}{hint}")
    out = set()
    for link in links:
        if hasattr(link, "tolist") and getattr(link, "ndim", 0) == 1:
            link = link.tolist()  # a row of an [n, 2] array or tensor (np.argwhere's links)
        pair = tuple(map(_plain_int, link)) if isinstance(link, tuple | list) else None
        if pair is None or not _is_link(pair):
            raise TypeError(f"{wanted}, got {link!r}")
        out.add(pair)
    return frozenset(out)


def _plain_int(k: object) -> object:
    """A NumPy integer as an int; anything else (a bool too) as it is."""
    return int(k) if isinstance(k, numbers.Integral) and not isinstance(k, bool) else k


def parse_pharaoh(line: str, *, one_indexed: bool = False) -> Alignment:
    """One line of links; raises ``ValueError`` naming the bad link.

    A link given both as sure and as possible counts as sure; a repeated link is kept once.
    """
    if not isinstance(line, str):
        raise TypeError(f"line must be a str of links, got {type(line).__name__}")
    check_flags(one_indexed=one_indexed)
    offset = 1 if one_indexed else 0
    sure: set[Link] = set()
    possible: set[Link] = set()
    for item in line.split():
        m = _LINK.match(item)
        if m is None:
            raise ValueError(
                f"bad link {item!r}; expected i-j (sure) or ipj (possible) with integer indices"
            )
        i, j = int(m.group(1)) - offset, int(m.group(3)) - offset
        if i < 0 or j < 0:
            raise ValueError(
                f"link {item!r} has index 0, but the file is read as 1-indexed (words counted "
                "from 1)"
            )
        (sure if m.group(2) == "-" else possible).add((i, j))
    return Alignment(frozenset(sure), frozenset(possible))


def read_pharaoh(
    source: Source,
    *,
    one_indexed: bool = False,
    lengths: Sequence[tuple[int, int]] | None = None,
) -> list[Alignment]:
    """Read a Pharaoh alignment file, one :class:`Alignment` (0-indexed) per line.

    Args:
        source: a path or an open text stream.
        one_indexed: the file counts words from 1 (gold sets such as WPT 2003 do).
        lengths: optional ``(source length, target length)`` per pair, e.g. from
            :class:`~attnlab.data.ParallelCorpus.lengths`; then a link past the end of a
            sentence, or a different number of pairs, is an error.

    Raises :class:`~attnlab.data.DataFormatError` naming the file and line of a bad link.
    """
    check_flags(one_indexed=one_indexed)
    if lengths is not None:
        _check_lengths(lengths)
    where = source_name(source)
    out: list[Alignment] = []
    with open_text(source) as f:
        for line_no, line in enumerate(f, start=1):
            try:
                alignment = parse_pharaoh(line, one_indexed=one_indexed)
            except ValueError as error:
                raise DataFormatError(str(error), path=where, line=line_no) from None
            if lengths is not None and line_no <= len(lengths):
                n_src, n_tgt = lengths[line_no - 1]
                i, j = alignment.max_indices()
                if i >= n_src or j >= n_tgt:
                    o = 1 if one_indexed else 0
                    raise DataFormatError(
                        f"a link reaches source word {i + o} / target word {j + o} "
                        f"({'1' if one_indexed else '0'}-indexed), but the pair has "
                        f"{n_src} source and {n_tgt} target words",
                        path=where,
                        line=line_no,
                    )
            out.append(alignment)
    if lengths is not None and len(lengths) != len(out):
        raise DataFormatError(
            f"{len(out)} alignment lines for {len(lengths)} sentence pairs", path=where
        )
    return out


def _check_lengths(lengths: object) -> None:
    """``read_pharaoh``'s ``lengths``: a sequence of ``(source length, target length)``
    pairs of non-negative ints; a ``TypeError`` naming the first bad entry otherwise."""
    if isinstance(lengths, str) or not isinstance(lengths, Sequence):
        raise TypeError(
            f"lengths must be a sequence of (source length, target length) pairs, got {lengths!r}"
        )
    for k, pair in enumerate(lengths):
        if not _is_link(tuple(pair) if isinstance(pair, list) else pair):
            raise TypeError(
                f"lengths[{k}] must be a (source length, target length) pair of "
                f"non-negative ints, got {pair!r}"
            )


def write_pharaoh(
    alignments: Iterable[Alignment],
    target: str | os.PathLike | IO[str],
    *,
    one_indexed: bool = False,
) -> None:
    """Write alignments, one line per pair (``i-j`` sure, ``ipj`` possible)."""
    lines = "".join(a.to_pharaoh(one_indexed=one_indexed) + "\n" for a in alignments)
    if isinstance(target, str | os.PathLike):
        write_text(target, lines)  # atomically: an interrupted write keeps the old file
    else:
        target.write(lines)
