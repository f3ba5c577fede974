"""Debian package descriptions with their debtags: a real multi-label text corpus, offline.

Debian's package lists (``/var/lib/apt/lists/*_Packages``, written by ``apt-get update``,
often lz4-, xz- or gzip-compressed) describe every binary package in RFC 822-style stanzas.
About 30,000 packages of Debian 12 carry a ``Tag:`` field: debtags, faceted labels
``facet::tag`` (``use::editing``, ``works-with::image``, ``implemented-in::python``) given
by Debian's maintainers and the debtags review team. The description -- the short synopsis
of the ``Description:`` line plus the long description where the list has one (Debian's
own lists keep long descriptions in ``*_i18n_Translation-en`` files, which are read too
when present; they are matched by ``Description-md5``) -- is the text, the debtags are its
labels.

Set-up freezes the lists into one file, so the corpus does not change with the next
``apt-get update``::

    python -m attnlab.data debtags freeze      # -> ~/.cache/attnlab/debtags/debtags.jsonl.gz

:func:`freeze_debtags` writes a gzip-compressed JSON Lines file (a header line, then one
record per tagged package: ``package``, ``source``, ``section``, ``description``,
``long_description``, ``tags``), byte-for-byte the same for the same lists.
:func:`load_debtags` reads it (or, without a frozen file, the apt lists themselves), keeps
the tags of the chosen facets seen on at least ``min_count`` packages, and returns a
:class:`MultiLabelDataset` with a seeded train/dev/test split by *source* package (the
binary packages of one source, such as ``libfoo1`` and ``libfoo-dev``, share wording and
never straddle train and test).

Data: package descriptions are part of each package and under that package's licence
(free software licences, Debian main); the debtags are Debian project data, published in
the archive's package lists (see https://wiki.debian.org/Debtags).
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from attnlab._atomic import write_file
from attnlab._checks import check_flags, check_int, check_optional_int, check_path, check_seed
from attnlab.data._cache import cache_dir, cached
from attnlab.data._common import (
    DataFormatError,
    MissingDataError,
    check_fractions,
    check_split,
    file_fingerprint,
)
from attnlab.data._io import json_objects
from attnlab.data.containers import _Columns, tokenize_texts

__all__ = [
    "DEFAULT_FACETS",
    "MultiLabelDataset",
    "MultiLabelExample",
    "default_frozen_path",
    "freeze_debtags",
    "load_debtags",
    "parse_packages",
    "parse_tags",
]

LISTS_DIR = "/var/lib/apt/lists"
FORMAT = "attnlab-debtags"
FORMAT_VERSION = 1
_FACET = re.compile(r"[a-z0-9][a-z0-9-]*")
DEFAULT_FACETS = ("use", "works-with", "field", "interface", "implemented-in")
SETUP_HINT = (
    "run `apt-get update` (as root) so that /var/lib/apt/lists holds Debian's package lists, "
    "then `python -m attnlab.data debtags freeze`"
)


# ----------------------------------------------------------------------------- container


class MultiLabelExample(NamedTuple):
    text: str
    labels: tuple[int, ...]
    id: str
    split: str
    group: str | None


@dataclasses.dataclass(frozen=True, eq=False)
class MultiLabelDataset(_Columns[MultiLabelExample]):
    """Texts with a set of labels each (possibly empty).

    Attributes:
        texts: the raw texts.
        label_sets: per text, the indices (into ``label_names``) of its labels, sorted.
        label_names: the names of the labels (``"use::editing"``).
        ids: a unique id per text (the Debian package name).
        splits: ``"train"``, ``"dev"`` or ``"test"`` per text.
        groups: the unit a text belongs to (the source package) where there is one; the
            seeded splits keep a group together.
        name: where the data came from.

    ``len(ds)``, ``ds[i]`` (a :class:`MultiLabelExample`), ``ds.split("train")``,
    ``ds.subset(idx)``, ``ds.label_counts()`` (texts per label), ``ds.label_matrix()``
    (``[n, n_labels]`` 0/1 float32), ``ds.tokens()``, ``to_json`` / ``from_json``.
    """

    texts: tuple[str, ...]
    label_sets: tuple[tuple[int, ...], ...]
    label_names: tuple[str, ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    groups: tuple[str, ...] | None = None
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = ("texts", "label_sets", "ids", "splits", "groups")
    _example: ClassVar[Callable[..., Any]] = MultiLabelExample

    def _validate_labels(self) -> None:
        k = len(self.label_names)
        for i, labels in enumerate(self.label_sets):
            if not isinstance(labels, tuple) or any(
                not isinstance(lab, int) or not 0 <= lab < k for lab in labels
            ):
                raise ValueError(
                    f"MultiLabelDataset.label_sets[{i}] = {labels!r} must be a tuple of "
                    f"indices into label_names (0..{k - 1})"
                )
            if list(labels) != sorted(set(labels)):
                raise ValueError(
                    f"MultiLabelDataset.label_sets[{i}] = {labels!r} must be sorted and "
                    "without repeats"
                )

    @property
    def labels(self) -> tuple[tuple[int, ...], ...]:  # the name other datasets use
        return self.label_sets

    def label_counts(self) -> dict[str, int]:
        """How many texts carry each label name."""
        counts = Counter(lab for labels in self.label_sets for lab in labels)
        return {name: counts.get(i, 0) for i, name in enumerate(self.label_names)}

    def label_matrix(self, dtype: Any = np.float32) -> np.ndarray:
        """The labels as a ``[len(self), len(label_names)]`` 0/1 matrix (multi-hot rows)."""
        out = np.zeros((len(self), len(self.label_names)), dtype=dtype)
        for i, labels in enumerate(self.label_sets):
            out[i, list(labels)] = 1
        return out

    def tokens(
        self, tokenizer: Callable[[str], list[str]] | None = None, *, lower: bool = False
    ) -> list[list[str]]:
        """Each text as tokens: ``tokenizer(text)``, by default :func:`simple_tokenize`."""
        return tokenize_texts(self.texts, tokenizer, lower=lower)


# ----------------------------------------------------------------------------- parsing


def parse_tags(value: str) -> tuple[str, ...]:
    """The tags of a ``Tag:`` field value, sorted and without repeats.

    Tags are separated by commas (and any white space, line breaks included); the compact
    form ``facet::{a,b}`` expands to ``facet::a, facet::b``. Every tag must read
    ``facet::tag``; anything else raises ``ValueError``.
    """
    tags: list[str] = []
    for item in re.findall(r"[^,{}\s]+(?:\{[^}]*\})?|\{[^}]*\}", value):
        match = re.fullmatch(r"([^:\s]+)::\{([^}]*)\}", item)
        parts = (
            [f"{match[1]}::{t.strip()}" for t in match[2].split(",") if t.strip()]
            if match
            else [item]
        )
        for tag in parts:
            if not re.fullmatch(r"[^:\s,{}]+::[^\s,{}]+", tag):
                raise ValueError(f"not a debtag (facet::tag): {tag!r}")
            tags.append(tag)
    return tuple(sorted(set(tags)))


def _stanzas(text: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(first line number, {field: value}) per stanza; continuation lines keep their
    newline and leading space in the value."""
    fields: dict[str, str] = {}
    start = 0
    last: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            if fields:
                yield start, fields
            fields, last = {}, None
            continue
        if line[0] in " \t":
            if last is None:
                raise DataFormatError("a continuation line outside a field", line=number)
            fields[last] += "\n" + line
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or " " in name:
            raise DataFormatError(f"not a 'Field: value' line: {line[:60]!r}", line=number)
        if not fields:
            start = number
        last = name
        fields[name] = value.strip()
    if fields:
        yield start, fields


def _long_description(continuation: str) -> str:
    """The long description of a ``Description`` field's continuation lines.

    Each line loses its one leading space; a line ``" ."`` ends a paragraph. Lines of a
    paragraph are joined with spaces, except verbatim lines (two or more leading spaces),
    which stay lines of their own; paragraphs are separated by a blank line.
    """
    paragraphs: list[list[str]] = [[]]
    joinable: list[list[bool]] = [[]]
    for raw in continuation.split("\n"):
        line = raw[1:] if raw[:1] in (" ", "\t") else raw
        if line.strip() == ".":
            paragraphs.append([])
            joinable.append([])
        elif line.strip():
            verbatim = line[:1] in (" ", "\t")
            if not verbatim and joinable[-1] and joinable[-1][-1]:
                paragraphs[-1][-1] += " " + line.strip()
            else:
                paragraphs[-1].append(line.rstrip() if verbatim else line.strip())
                joinable[-1].append(not verbatim)
    return "\n\n".join("\n".join(p) for p in paragraphs if p)


def parse_packages(
    text: str,
    *,
    translations: dict[str, str] | None = None,
    path: object = None,
    tagged_only: bool = True,
) -> list[dict[str, Any]]:
    """The package records of the text of a Debian ``Packages`` file.

    Each record is ``{"package", "source", "section", "description", "long_description",
    "tags"}``: the short description is the first line of ``Description`` (or
    ``Description-en``), the long one its continuation lines (see :func:`_long_description`)
    or, when the list has none, ``translations[Description-md5]`` where given. ``source``
    is the ``Source`` field without its version (the package itself when absent).
    Stanzas without a ``Tag`` field are left out unless ``tagged_only=False``
    (their ``tags`` is then empty).
    """
    records = []
    for line, fields in _stanzas(text):
        package = fields.get("Package")
        if not package:
            raise DataFormatError("a stanza without a Package field", path=path, line=line)
        description = fields.get("Description", fields.get("Description-en"))
        if description is None:
            raise DataFormatError(f"package {package!r} has no Description", path=path, line=line)
        short, _, rest = description.partition("\n")
        long = _long_description(rest) if rest else ""
        if not long and translations:
            long = translations.get(fields.get("Description-md5", ""), "")
        try:
            tags = parse_tags(fields["Tag"]) if "Tag" in fields else ()
        except ValueError as error:
            raise DataFormatError(f"package {package!r}: {error}", path=path, line=line) from None
        if tagged_only and not tags:
            continue
        # "Source: name (version)"; a missing or empty field: the package is its own source
        source = (fields.get("Source", "").split() or [package])[0]
        records.append(
            {
                "package": package,
                "source": source,
                "section": fields.get("Section", ""),
                "description": short.strip(),
                "long_description": long,
                "tags": list(tags),
            }
        )
    return records


def parse_translations(text: str, *, path: object = None) -> dict[str, str]:
    """``Description-md5`` -> long description, from a ``Translation-en`` file's text."""
    out: dict[str, str] = {}
    for _line, fields in _stanzas(text):
        md5 = fields.get("Description-md5")
        description = fields.get("Description-en")
        if md5 and description:
            _short, _, rest = description.partition("\n")
            out[md5] = _long_description(rest) if rest else ""
    return out


# ----------------------------------------------------------------------------- apt lists

_SUFFIXES = ("", ".gz", ".xz", ".lzma", ".bz2", ".lz4", ".zst")


def _list_files(lists_dir: Path, kind: str) -> list[Path]:
    """The files of ``lists_dir`` named ``*_<kind>`` (with any compression suffix), sorted;
    of two copies of one list (plain and compressed) the first suffix wins."""
    found: dict[str, Path] = {}
    for suffix in _SUFFIXES:
        for file in sorted(lists_dir.glob(f"*_{kind}{suffix}")):
            base = file.name[: len(file.name) - len(suffix)] if suffix else file.name
            if file.is_file() and base.endswith(f"_{kind}"):
                found.setdefault(base, file)
    return [found[k] for k in sorted(found)]


def read_list_file(path: Path) -> str:
    """The text of an apt list file, decompressed (gzip, xz, bzip2 in Python; lz4 and zstd
    through ``/usr/lib/apt/apt-helper cat-file``, or ``lz4cat`` / ``zstdcat``)."""
    name = path.name
    if name.endswith(".gz"):
        data = gzip.decompress(path.read_bytes())
    elif name.endswith((".xz", ".lzma")):
        data = lzma.decompress(path.read_bytes())
    elif name.endswith(".bz2"):
        data = bz2.decompress(path.read_bytes())
    elif name.endswith((".lz4", ".zst")):
        data = _external_decompress(path)
    else:
        data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(f"not UTF-8 text ({error})", path=path) from None


def _external_decompress(path: Path) -> bytes:
    tool = "lz4cat" if path.name.endswith(".lz4") else "zstdcat"
    commands = []
    helper = Path("/usr/lib/apt/apt-helper")
    if helper.is_file():
        commands.append([str(helper), "cat-file", str(path)])
    if shutil.which(tool):
        commands.append([tool, str(path)])
    errors = []
    for command in commands:
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode == 0:
            return done.stdout
        errors.append(f"{command[0]}: {done.stderr.decode(errors='replace').strip()[:200]}")
    raise DataFormatError(
        f"cannot decompress (needs /usr/lib/apt/apt-helper or {tool}): {'; '.join(errors)}",
        path=path,
    )


def read_apt_lists(lists_dir: str | Path = LISTS_DIR) -> tuple[list[dict[str, Any]], list[str]]:
    """The tagged package records of every ``*_Packages`` list in ``lists_dir`` (one record
    per package name: the first list, in name order, that tags it wins) and the list file
    names read. Long descriptions come from ``*_Translation-en`` lists where present."""
    lists_dir = check_path(lists_dir, "lists_dir")
    files = _list_files(lists_dir, "Packages") if lists_dir.is_dir() else []
    if not files:
        raise MissingDataError(
            f"no Debian package lists (*_Packages) in {lists_dir}, and no frozen debtags "
            f"file; {SETUP_HINT}"
        )
    translations: dict[str, str] = {}
    for file in _list_files(lists_dir, "Translation-en"):
        translations.update(parse_translations(read_list_file(file), path=file))
    records: dict[str, dict[str, Any]] = {}
    for file in files:
        for record in parse_packages(read_list_file(file), translations=translations, path=file):
            records.setdefault(record["package"], record)
    return [records[k] for k in sorted(records)], [f.name for f in files]


# ----------------------------------------------------------------------------- freeze


def default_frozen_path() -> Path | None:
    """Where ``freeze`` writes and ``load_debtags`` looks: ``<cache>/debtags/debtags.jsonl.gz``
    (None when the disk cache is off, ``ATTNLAB_CACHE=off``)."""
    root = cache_dir()
    return None if root is None else root / "debtags" / "debtags.jsonl.gz"


def freeze_debtags(dest: str | Path | None = None, *, lists_dir: str | Path = LISTS_DIR) -> Path:
    """Write the tagged packages of the apt lists in ``lists_dir`` to ``dest`` (default
    :func:`default_frozen_path`) as gzip-compressed JSON Lines; returns the path.

    The first line is a header ``{"format": "attnlab-debtags", "version": 1, "lists": [...],
    "packages": n}``; then one record per package, sorted by name. The same lists give
    the same bytes (the gzip header carries no time stamp). The file is written to a
    temporary name and renamed, so a reader never sees half a file.
    """
    records, lists = read_apt_lists(lists_dir)
    if dest is None:
        dest = default_frozen_path()
        if dest is None:
            raise ValueError("the attnlab cache is off (ATTNLAB_CACHE=off): pass dest")
    dest = check_path(dest, "dest")
    header = {"format": FORMAT, "version": FORMAT_VERSION, "lists": lists, "packages": len(records)}
    lines = [json.dumps(header, ensure_ascii=False, sort_keys=True)]
    lines += [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in records]
    payload = ("\n".join(lines) + "\n").encode("utf-8")
    dest.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as f,
        ):
            f.write(payload)

    return write_file(dest, write)


def read_frozen(path: str | Path) -> list[dict[str, Any]]:
    """The package records of a frozen debtags file, validated."""
    path = check_path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise DataFormatError(f"not a readable gzip text file ({error})", path=path) from None
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DataFormatError(f"not a frozen debtags file (no {FORMAT} header)", path=path, line=1)
    if header.get("version") != FORMAT_VERSION:
        raise DataFormatError(
            f"format version {header.get('version')}, this attnlab reads {FORMAT_VERSION}; "
            "freeze again with `python -m attnlab.data debtags freeze`",
            path=path,
            line=1,
        )
    records = []
    keys = {"package", "source", "section", "description", "long_description", "tags"}
    for number, record in json_objects(lines[1:], path, start=2):
        if set(record) != keys:
            raise DataFormatError(
                f"a record must have the keys {sorted(keys)}", path=path, line=number
            )
        if not isinstance(record["tags"], list) or not all(
            isinstance(t, str) and "::" in t for t in record["tags"]
        ):
            raise DataFormatError(
                "tags must be a list of 'facet::tag' strings", path=path, line=number
            )
        records.append(record)
    if len(records) != header.get("packages"):
        raise DataFormatError(
            f"the header announces {header.get('packages')} packages, the file has "
            f"{len(records)} (a truncated file?)",
            path=path,
        )
    return records


# ----------------------------------------------------------------------------- load


def _records(
    path: str | Path | None, lists_dir: str | Path | None, cache: bool
) -> tuple[list, str]:
    if path is None and lists_dir is None:  # an explicit lists_dir is read, not the default
        default = default_frozen_path()
        if default is not None and default.is_file():
            path = default
    if path is not None:
        path = check_path(path)
        if not path.is_file():
            raise MissingDataError(f"no frozen debtags file at {path}; {SETUP_HINT}")
        records = cached(
            "debtags-frozen",
            (FORMAT_VERSION, file_fingerprint(path)),
            lambda: read_frozen(path),
            disk=False,
        )
        return records, f"debtags (frozen {path.name})"
    lists_dir = check_path(LISTS_DIR if lists_dir is None else lists_dir, "lists_dir")
    files = _list_files(lists_dir, "Packages") if lists_dir.is_dir() else []
    if files:  # the long descriptions come from the Translation-en lists: they key it too
        files += _list_files(lists_dir, "Translation-en")
    parts = (FORMAT_VERSION, *(file_fingerprint(f) for f in files))
    if not files:
        read_apt_lists(lists_dir)  # raises MissingDataError with the set-up hint
    records = cached(
        "debtags-lists",
        parts,
        lambda: read_apt_lists(lists_dir)[0],
        to_json=list,
        from_json=list,
        disk=cache,
    )
    return records, f"debtags ({lists_dir})"


def _check_facets(facets: object) -> tuple[str, ...] | None:
    """``load_debtags``' ``facets``: None, or a non-empty sequence of facet names (a
    string would be read as its characters)."""
    if facets is None:
        return None
    names = () if isinstance(facets, str) or not isinstance(facets, Iterable) else tuple(facets)
    if not names or not all(isinstance(f, str) and f for f in names):
        raise ValueError(
            "facets must be None (every facet) or a non-empty list of facet names such as "
            f"{list(DEFAULT_FACETS[:2])}, got {facets!r}"
        )
    for facet in names:  # a tag, an underscore or a capital would match nothing, silently
        if not _FACET.fullmatch(facet):
            hint = " (a facet, not a tag: the part before '::')" if "::" in facet else ""
            raise ValueError(
                f"facet {facet!r} is not a debtags facet name (lower case, digits and '-', "
                f"such as 'works-with'){hint}"
            )
    return names


def load_debtags(
    split: str | None = None,
    *,
    facets: Sequence[str] | None = DEFAULT_FACETS,
    min_count: int = 50,
    max_labels: int | None = None,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    long_description: bool = True,
    keep_unlabelled: bool = False,
    path: str | Path | None = None,
    lists_dir: str | Path | None = None,
    cache: bool = True,
) -> MultiLabelDataset:
    """Debian package descriptions labelled with their debtags, as a :class:`MultiLabelDataset`.

    Reads the frozen file ``path``; else the apt lists in ``lists_dir`` when it is given
    (parsed once and cached, keyed by the ``Packages`` and ``Translation-en`` files); with
    neither, the frozen file that ``python -m attnlab.data debtags freeze`` wrote when it
    exists, else the system's apt lists (``/var/lib/apt/lists``).
    :class:`MissingDataError` when the chosen source is missing.

    Label set: the tags of the facets ``facets`` (None: every facet), without the
    placeholder ``facet::TODO`` tags, carried by at least ``min_count`` packages (counted
    over all packages, before the split; an int >= 1); with ``max_labels`` (an int >= 1),
    only the ``max_labels`` most frequent of those (ties by name). ``label_names`` is sorted by name. Packages
    without any kept label are left out unless ``keep_unlabelled``; a ``ValueError`` naming
    ``min_count`` when no tag is kept and so no package would be (unless ``keep_unlabelled``).

    Text: the short description, then (``long_description=True``, where the lists have one)
    a blank line and the long description. ``ids`` are package names, ``groups`` source
    package names; the split (``seed``, ``fractions``) is by source package.
    """
    check_split(split)
    check_int(min_count, "min_count", 1, error=ValueError)
    check_optional_int(max_labels, "max_labels", error=ValueError)
    chosen = _check_facets(facets)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(long_description=long_description, keep_unlabelled=keep_unlabelled, cache=cache)
    records, name = _records(
        path, None if lists_dir is None else check_path(lists_dir, "lists_dir"), cache
    )
    wanted = None if chosen is None else set(chosen)

    def keep(tag: str) -> bool:
        facet, _, value = tag.partition("::")
        return value != "TODO" and (wanted is None or facet in wanted)

    counts = Counter(t for r in records for t in r["tags"] if keep(t))
    ranked = sorted((t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t))
    if max_labels is not None:
        ranked = ranked[:max_labels]
    label_names = tuple(sorted(ranked))
    if not label_names and not keep_unlabelled:
        # else an empty dataset, or "no split 'train'" far from the cause
        top = max(counts.values(), default=0)
        raise ValueError(
            f"no tag of {_facet_names(chosen)} is carried by min_count={min_count} packages "
            f"(the most common is carried by {top}), so no package has a label; lower "
            "min_count"
        )
    index = {t: i for i, t in enumerate(label_names)}
    texts, label_sets, ids, groups = [], [], [], []
    for r in records:
        labels = tuple(sorted(index[t] for t in r["tags"] if t in index))
        if not labels and not keep_unlabelled:
            continue
        text = r["description"]
        if long_description and r["long_description"]:
            text = f"{text}\n\n{r['long_description']}"
        texts.append(text)
        label_sets.append(labels)
        ids.append(r["package"])
        groups.append(r["source"])
    return MultiLabelDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        texts=texts,
        label_sets=label_sets,
        label_names=label_names,
        ids=ids,
        groups=groups,
        name=f"{name}: {_facet_names(chosen)}, min_count={min_count}",
    )


def _facet_names(chosen: Sequence[str] | None) -> str:
    """How a dataset's name and errors speak of the chosen facets."""
    return "all facets" if chosen is None else "+".join(chosen)


# ----------------------------------------------------------------------------- command


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m attnlab.data debtags freeze [DEST] [--lists-dir DIR]`` and ``... stats``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m attnlab.data debtags", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    freeze = commands.add_parser("freeze", help="freeze the apt lists' debtags into a file")
    freeze.add_argument("dest", nargs="?", default=None, help="default: the attnlab cache")
    freeze.add_argument("--lists-dir", default=LISTS_DIR)
    stats = commands.add_parser("stats", help="print the corpus' counts")
    stats.add_argument("--path", default=None)
    stats.add_argument("--min-count", type=int, default=50)
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        if args.command == "freeze":
            dest = freeze_debtags(args.dest, lists_dir=args.lists_dir)
            n = len(read_frozen(dest))
            print(f"froze {n} tagged packages into {dest} ({dest.stat().st_size / 1e6:.1f} MB)")
        else:
            ds = load_debtags(path=args.path, min_count=args.min_count)
            sizes = Counter(ds.splits)
            print(
                f"{ds.name}: {len(ds)} packages, {len(ds.label_names)} labels, splits {dict(sizes)}"
            )
            for label, count in sorted(ds.label_counts().items(), key=lambda kv: -kv[1]):
                print(f"{count:6d}  {label}")
    except (MissingDataError, DataFormatError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (TypeError, ValueError) as error:  # a bad argument (ConfigError is a ValueError)
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0
