"""Opening text sources: paths (optionally .gz / .bz2 / .xz compressed) or open text streams;
reading JSON Lines."""

from __future__ import annotations

import bz2
import codecs
import contextlib
import gzip
import io
import json
import lzma
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TextIO

from attnlab._checks import check_path
from attnlab.data._common import DataFormatError

Source = str | os.PathLike | IO[str]

_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def source_name(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return str(source)
    return getattr(source, "name", "<stream>")


def suffixes(source: Source) -> list[str]:
    """The lower-case suffixes of a path, compression suffix removed (``a.tsv.gz`` -> .tsv)."""
    if not isinstance(source, str | os.PathLike):
        name = getattr(source, "name", "")
        if not isinstance(name, str):
            return []
        source = name
    sfx = [s.lower() for s in Path(source).suffixes]
    if sfx and sfx[-1] in _OPENERS:
        sfx = sfx[:-1]
    return sfx


@contextlib.contextmanager
def open_text(
    source: Source, *, encoding: str = "utf-8", newline: str | None = None
) -> Iterator[TextIO]:
    """A text stream for ``source``; a path is opened (and decompressed), a stream is used as is.
    A UTF-8 file's byte-order mark, if any, is not part of the text.

    Any path that is not a folder may be read, a pipe too (``<(command)``, ``/dev/stdin``);
    a missing path raises :class:`FileNotFoundError` (``no such data file: ...``), a folder
    :class:`IsADirectoryError` (``... is a folder, not a data file``), something that is
    neither a path nor a stream (or an empty path) ``TypeError`` (``ValueError``), an
    unknown ``encoding`` ``ValueError``. Text that is not in ``encoding`` (a binary file, a
    file of another format) raises :class:`~attnlab.data.DataFormatError` naming the file.
    """
    where = source_name(source)
    compressed = False
    if isinstance(source, io.TextIOBase) or (
        not isinstance(source, str | os.PathLike) and hasattr(source, "read")
    ):
        stream: TextIO = source  # type: ignore[assignment]
    else:
        path = check_path(source, "source")
        try:
            codec = codecs.lookup(encoding)
        except (LookupError, TypeError):
            raise ValueError(
                f"encoding must be the name of a text encoding, got {encoding!r}"
            ) from None
        if codec.name == "utf-8":  # a byte-order mark (Excel, Notepad) is not text
            encoding = "utf-8-sig"
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder, not a data file")
        if not path.exists():
            raise FileNotFoundError(f"no such data file: {path}")
        opener = _OPENERS.get(path.suffix.lower())
        compressed = opener is not None
        if opener is not None:
            stream = opener(path, "rt", encoding=encoding, newline=newline)
        else:
            stream = open(path, encoding=encoding, newline=newline)
    try:
        yield stream
    except UnicodeDecodeError as error:
        named = "utf-8" if error.encoding == "utf-8-sig" else error.encoding
        raise DataFormatError(
            f"not {named} text ({error.reason}): a binary file, or a file of "
            "another format or encoding?",
            path=where,
        ) from None
    except (OSError, EOFError, lzma.LZMAError) as error:
        if not compressed:
            raise
        raise DataFormatError(f"cannot decompress ({error})", path=where) from None
    finally:
        if stream is not source:
            stream.close()


class _RepeatedKey(Exception):
    """A key seen twice in one JSON object (raised by :func:`_unique_keys`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook``: the object as a dict, refusing a repeated key
    (plain ``json.loads`` keeps the last value silently)."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return record


def json_objects(
    lines: Iterable[str], where: object, *, start: int = 1
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of JSON Lines text, the first line
    numbered ``start``. A line that is not JSON, not a JSON object, or with a key repeated
    in an object, raises :class:`~attnlab.data.DataFormatError` naming ``where`` and the
    line."""
    for line_no, raw in enumerate(lines, start=start):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as error:
            raise DataFormatError(f"invalid JSON: {error.msg}", path=where, line=line_no) from None
        except _RepeatedKey as repeated:
            raise DataFormatError(
                f"repeated key {repeated.args[0]!r} in a JSON object", path=where, line=line_no
            ) from None
        if not isinstance(record, dict):
            raise DataFormatError(
                f"expected a JSON object per line, got {type(record).__name__}",
                path=where,
                line=line_no,
            )
        yield line_no, record
