"""The parsed-data cache: in the process (a dict) and on disk (gzip-compressed JSON).

A loader names what it parsed by a key made of the loader's name, its format version, the
source package's version and the source file's path, size and modification time, so a new
package version, an edited file or a new parser never reads a stale entry. The disk cache
lives in ``$ATTNLAB_CACHE`` (default ``$XDG_CACHE_HOME/attnlab`` or ``~/.cache/attnlab``)
under ``parsed/``; ``ATTNLAB_CACHE=off`` turns the disk cache off. The cache stores JSON,
never pickles, so reading a cache file cannot run code. A cache that cannot be written (a
read-only home) only costs a warning; a damaged cache file is parsed again and replaced.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from attnlab._atomic import write_file
from attnlab.data._common import file_fingerprint, package_version

__all__ = ["cache_dir", "cached", "cached_package_file", "clear_cache"]

T = TypeVar("T")

_MEMORY: dict[str, Any] = {}
_OFF = {"0", "off", "none", "false", "no"}


def cache_dir() -> Path | None:
    """Where attnlab keeps parsed data and set-up downloads; None when the disk cache is off."""
    value = os.environ.get("ATTNLAB_CACHE")
    if value is not None and value.strip().lower() in _OFF:
        return None
    if value:
        return Path(value).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "attnlab"


def _key(parts: tuple[object, ...]) -> str:
    return hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=16).hexdigest()


def cached(
    name: str,
    parts: tuple[object, ...],
    build: Callable[[], T],
    *,
    to_json: Callable[[T], Any] | None = None,
    from_json: Callable[[Any], T] | None = None,
    disk: bool = True,
) -> T:
    """``build()``'s result for the key ``(name, *parts)``, parsed at most once.

    Looks in the process memory, then (``disk=True``) in the disk cache, and only then
    calls ``build``; the result is stored in both. ``to_json`` / ``from_json`` convert the
    result to and from JSON-compatible data for the disk (``disk=False`` needs neither).
    """
    key = f"{name}-{_key((name, *parts))}"
    if key in _MEMORY:
        return _MEMORY[key]
    if disk and (to_json is None or from_json is None):
        raise ValueError("the disk cache needs to_json and from_json")
    root = cache_dir() if disk else None
    file = root / "parsed" / f"{key}.json.gz" if root is not None else None
    if file is not None and file.is_file():
        try:
            payload = json.loads(gzip.decompress(file.read_bytes()).decode("utf-8"))
            value = from_json(payload)  # type: ignore[misc]
        except (OSError, ValueError, KeyError, TypeError, EOFError, gzip.BadGzipFile):
            value = None  # damaged or from an incompatible writer: parse again
        if value is not None:
            _MEMORY[key] = value
            return value
    value = build()
    _MEMORY[key] = value
    if file is not None:
        write_atomic(
            file,
            _gzip_json(to_json(value)),  # type: ignore[misc]
            what="data cache",
            then="the data will be parsed again next time (set ATTNLAB_CACHE to a writable "
            "folder, or to off)",
        )
    return value


def _row_tuples(rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in rows]


def cached_package_file(
    name: str,
    path: Path,
    parse: Callable[[Path], T],
    *,
    distribution: str,
    format_version: int,
    disk: bool = True,
    to_json: Callable[[T], Any] = list,
    from_json: Callable[[Any], T] = _row_tuples,  # type: ignore[assignment]
) -> T:
    """``parse(path)`` for a data file shipped in the installed package ``distribution``,
    :func:`cached` under ``name`` until ``format_version``, the package's version or the
    file changes. The default ``to_json`` / ``from_json`` store a list of row tuples."""
    return cached(
        name,
        (format_version, package_version(distribution), file_fingerprint(path)),
        lambda: parse(path),
        to_json=to_json,
        from_json=from_json,
        disk=disk,
    )


def write_atomic(file: Path, write: Callable[[BinaryIO], None], *, what: str, then: str) -> None:
    """Write ``file`` through ``write(stream)`` atomically (a temporary file in the same
    folder, then a rename). A cache is optional: an ``OSError`` becomes a
    ``RuntimeWarning`` "attnlab could not write its WHAT FILE (ERROR); THEN" pointing at
    the caller's caller, and the file is left as it was."""

    def write_to(tmp: Path) -> None:
        with open(tmp, "wb") as raw:
            write(raw)

    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        write_file(file, write_to)
    except OSError as error:
        warnings.warn(
            f"attnlab could not write its {what} {file} ({error}); {then}",
            RuntimeWarning,
            stacklevel=3,
        )


def _gzip_json(payload: Any) -> Callable[[BinaryIO], None]:
    """A writer of ``payload`` as gzipped compact JSON."""
    # one dumps and one write: json.dump into a gzip stream writes token by token
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return lambda raw: raw.write(gzip.compress(text.encode("utf-8"), compresslevel=6))


def clear_cache(*, memory: bool = True, disk: bool = False) -> None:
    """Forget parsed data: in this process (``memory``) and/or on disk (``disk``)."""
    if memory:
        _MEMORY.clear()
    root = cache_dir()
    if disk and root is not None and (root / "parsed").is_dir():
        for file in (root / "parsed").glob("*.json.gz"):
            file.unlink(missing_ok=True)
