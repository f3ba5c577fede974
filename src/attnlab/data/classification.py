"""Text classification files a user brings: CSV, TSV and JSON Lines.

One text and one label per record::

    text,label,split                 {"text": "a gem", "label": "pos"}
    "a gem of a film",pos,train      {"text": "dull", "label": "neg", "split": "test"}

* Column (or JSON key) names are configurable: ``text_column``, ``label_column``,
  ``id_column`` (default: the record's line number), ``split_column`` (default: none, and
  then a seeded split of the records, see :func:`attnlab.data.assign_splits`).
* Labels: by default the distinct values, sorted (numerically when all are integers), are
  the label names. ``labels=["neg", "pos"]`` fixes the names and their order (any other
  value is an error); ``labels={"0": "neg", "1": "neg", "3": "pos", "4": "pos", "2": None}``
  maps raw values to names, several to one, and drops the records mapped to None (an
  error if that leaves no record).
* Split values ``train``, ``dev``, ``test`` (``validation``, ``valid`` and ``val`` mean dev).
* CSV follows RFC 4180 (quoted fields may hold commas and newlines). TSV is unquoted: a
  field cannot hold a tab or a newline, and quotes are kept as written.
* Every problem raises :class:`~attnlab.data.DataFormatError` naming the file and the line:
  a missing column, a record with too few or too many fields, an empty text or label, an
  unknown label or split, a duplicate id, invalid JSON (or a key repeated in one object).

Paths ending in ``.gz``, ``.bz2`` or ``.xz`` are decompressed on the fly; an open text stream
works too (then give ``format``). The readers parse the file on every call; the loaders of
packaged data cache their results.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from attnlab._checks import check_seed
from attnlab.data._common import DataFormatError, assign_splits, check_fractions
from attnlab.data._io import Source, json_objects, open_text, source_name, suffixes
from attnlab.data.containers import TextDataset

__all__ = ["read_csv", "read_jsonl", "read_text_classification", "read_tsv"]

_SPLIT_ALIASES = {
    "train": "train",
    "dev": "dev",
    "validation": "dev",
    "valid": "dev",
    "val": "dev",
    "test": "test",
}
_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl"}

Labels = Sequence[str] | Mapping[str, str | None] | None


def read_text_classification(
    source: Source,
    *,
    format: str | None = None,
    text_column: str = "text",
    label_column: str = "label",
    id_column: str | None = None,
    split_column: str | None = None,
    labels: Labels = None,
    encoding: str = "utf-8",
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    name: str | None = None,
) -> TextDataset:
    """Read a CSV, TSV or JSON Lines text classification file into a :class:`TextDataset`.

    Args:
        source: a path (``.csv``, ``.tsv``/``.tab``, ``.jsonl``/``.ndjson``, optionally
            compressed) or an open text stream.
        format: ``"csv"``, ``"tsv"`` or ``"jsonl"``; by default taken from the suffix.
        text_column, label_column: where the text and the label are.
        id_column: where a unique id is; by default the record's (first) line number.
        split_column: where the split is; by default a seeded random split by record
            (``fractions`` of train/dev/test, ``seed``).
        labels: label names in order, or a mapping from raw values to names (None drops).
        encoding: the file's text encoding.
        name: the dataset's name (default: the file name).
    """
    fmt = _guess_format(source) if format is None else format
    if fmt not in ("csv", "tsv", "jsonl"):
        raise ValueError(f"format must be 'csv', 'tsv' or 'jsonl', got {fmt!r}")
    _check_labels(labels)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    where = source_name(source)
    records = _records(source, fmt, encoding=encoding)
    texts: list[str] = []
    raw_labels: list[tuple[str, int]] = []
    ids: list[str] = []
    splits: list[str] = []
    seen: dict[str, int] = {}
    wanted = [c for c in (text_column, label_column, id_column, split_column) if c is not None]
    for line, record in records:
        missing = [c for c in wanted if c not in record]
        if missing:
            raise DataFormatError(
                f"no field {missing[0]!r} (fields: {sorted(record)}); name the right one "
                "with text_column= / label_column= / id_column= / split_column=",
                path=where,
                line=line,
            )
        text = _as_str(record[text_column], text_column, where, line)
        if not text.strip():
            raise DataFormatError(f"the text ({text_column!r}) is empty", path=where, line=line)
        label = _as_str(record[label_column], label_column, where, line).strip()
        if not label:
            raise DataFormatError(f"the label ({label_column!r}) is empty", path=where, line=line)
        rid = str(line) if id_column is None else _as_str(record[id_column], id_column, where, line)
        if rid in seen:
            raise DataFormatError(
                f"duplicate id {rid!r} (first on line {seen[rid]})", path=where, line=line
            )
        seen[rid] = line
        if split_column is not None:
            value = _as_str(record[split_column], split_column, where, line).strip().lower()
            if value not in _SPLIT_ALIASES:
                raise DataFormatError(
                    f"unknown split {value!r} in {split_column!r}; expected one of "
                    f"{sorted(_SPLIT_ALIASES)}",
                    path=where,
                    line=line,
                )
            splits.append(_SPLIT_ALIASES[value])
        texts.append(text)
        raw_labels.append((label, line))
        ids.append(rid)
    if not texts:
        raise DataFormatError("no records", path=where)
    label_names, label_ids = _map_labels(raw_labels, labels, where)
    keep = [i for i, lab in enumerate(label_ids) if lab is not None]
    if not keep:
        raise DataFormatError(
            f"no records left: the label mapping drops all {len(texts)} records (their "
            "labels map to None)",
            path=where,
        )
    if split_column is None:
        splits = list(assign_splits(ids, fractions=fractions, seed=seed))
    return TextDataset(
        texts=tuple(texts[i] for i in keep),
        labels=tuple(label_ids[i] for i in keep),  # type: ignore[misc]
        label_names=label_names,
        ids=tuple(ids[i] for i in keep),
        splits=tuple(splits[i] for i in keep),
        name=name if name is not None else where,
    )


def read_csv(source: Source, **options: Any) -> TextDataset:
    """:func:`read_text_classification` with ``format="csv"``."""
    return read_text_classification(source, format="csv", **options)


def read_tsv(source: Source, **options: Any) -> TextDataset:
    """:func:`read_text_classification` with ``format="tsv"``."""
    return read_text_classification(source, format="tsv", **options)


def read_jsonl(source: Source, **options: Any) -> TextDataset:
    """:func:`read_text_classification` with ``format="jsonl"``."""
    return read_text_classification(source, format="jsonl", **options)


# ----------------------------------------------------------------------------- parts


def _guess_format(source: Source) -> str:
    for sfx in reversed(suffixes(source)):
        if sfx in _FORMATS:
            return _FORMATS[sfx]
    raise ValueError(
        f"cannot tell the format of {source_name(source)!r} from its name; pass "
        "format='csv', 'tsv' or 'jsonl'"
    )


def _records(source: Source, fmt: str, *, encoding: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of each non-blank record of a CSV, TSV or JSONL file; a
    UTF-8 byte-order mark at its start (Excel's "CSV UTF-8") is not part of the data."""
    where = source_name(source)
    with open_text(source, encoding=encoding, newline="" if fmt != "jsonl" else None) as f:
        lines = _without_bom(f)
        if fmt == "jsonl":
            yield from json_objects(lines, where)
        else:
            yield from _table_records(lines, fmt, where)


def _without_bom(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` with a byte-order mark removed from the start of the first."""
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return
    yield first.removeprefix("\ufeff")
    yield from it


def _table_records(f: Iterable[str], fmt: str, where: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The rows of a CSV (``fmt="csv"``) or TSV file as dicts keyed by its header."""
    if fmt == "csv":
        reader = csv.reader(f, strict=True)
    else:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        header = next(reader)
    except StopIteration:
        raise DataFormatError("the file is empty (no header line)", path=where) from None
    except csv.Error as error:
        raise DataFormatError(f"bad header: {error}", path=where, line=1) from None
    header = [h.strip() for h in header]
    if len(set(header)) != len(header):
        raise DataFormatError(f"repeated column names in the header {header}", path=where, line=1)
    end = reader.line_num
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise DataFormatError(
                f"malformed {fmt.upper()}: {error}", path=where, line=start
            ) from None
        end = reader.line_num
        if not row or (len(row) == 1 and not row[0].strip()):
            continue  # a blank line
        if len(row) != len(header):
            raise DataFormatError(
                f"{len(row)} fields, but the header has {len(header)} ({header})",
                path=where,
                line=start,
            )
        yield start, dict(zip(header, row, strict=True))


def _as_str(value: Any, column: str, where: str, line: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, list | dict):
        raise DataFormatError(
            f"{column!r} must be a string or a number, got {json.dumps(value)}",
            path=where,
            line=line,
        )
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _sort_key(values: list[str]) -> Any:
    try:
        numbers = {v: float(v) for v in values}
    except ValueError:
        return None
    return numbers.__getitem__


def _check_labels(labels: Labels) -> None:
    """``labels`` (see :func:`read_text_classification`): None, a mapping from raw values to
    names (str) or None, or a sequence of names; a ``TypeError`` otherwise, before the file
    is read."""
    if labels is None:
        return
    if isinstance(labels, Mapping):
        for raw, target in labels.items():
            if target is not None and not isinstance(target, str):
                raise TypeError(
                    f"labels maps {raw!r} to {target!r}; a label name must be a str "
                    "(or None to drop the records)"
                )
        return
    if isinstance(labels, str):
        raise TypeError("labels must be a sequence of label names or a mapping, not a string")
    if not isinstance(labels, Iterable):
        raise TypeError(f"labels must be a sequence of label names or a mapping, got {labels!r}")


def _map_labels(
    raw: list[tuple[str, int]], labels: Labels, where: str
) -> tuple[tuple[str, ...], list[int | None]]:
    if labels is None:
        distinct = sorted({v for v, _ in raw})
        key = _sort_key(distinct)
        if key is not None:
            distinct.sort(key=key)
        index = {v: i for i, v in enumerate(distinct)}
        return tuple(distinct), [index[v] for v, _ in raw]
    if isinstance(labels, Mapping):
        names: list[str] = []
        for target in labels.values():
            if target is not None and target not in names:
                names.append(target)
        index = {n: i for i, n in enumerate(names)}
        mapping = {str(k): (None if t is None else index[t]) for k, t in labels.items()}
        out: list[int | None] = []
        for value, line in raw:
            if value not in mapping:
                raise DataFormatError(
                    f"label {value!r} is not in the label mapping (keys: {sorted(mapping)})",
                    path=where,
                    line=line,
                )
            out.append(mapping[value])
        return tuple(names), out
    names = [str(n) for n in labels]
    if len(set(names)) != len(names):
        raise ValueError(f"labels has repeated names: {names}")
    index = {n: i for i, n in enumerate(names)}
    out = []
    for value, line in raw:
        if value not in index:
            raise DataFormatError(
                f"unknown label {value!r}; expected one of {names}", path=where, line=line
            )
        out.append(index[value])
    return tuple(names), out
