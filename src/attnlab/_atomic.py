"""Atomic file writes, with the permissions any other program would give the file.

:func:`write_file` writes a file under a temporary name in the target's folder and moves
it over the target with :func:`os.replace`: a reader never sees a half-written file, and a
write that fails (or a process killed while writing) leaves the old file as it was; the
temporary file is removed on failure (:func:`temp_files` finds those a killed process
left). :func:`make_temp_folder` makes a new folder of a unique name the same way.

``tempfile.mkstemp`` and ``tempfile.mkdtemp`` make their files readable by their owner only
(mode ``0600`` / ``0700``) and the rename keeps that mode, so a file written this way would
be hidden from the user's group on a shared machine where every other file they write is
not. Here a new file gets the mode an ordinary ``open(path, "w")`` gives (``0666`` less the
process's umask: ``0644`` under the usual ``022``), a new folder ``0777`` less the umask,
and a file that replaces an existing one keeps that file's mode (a checkpoint the user
made private stays private).

Used by every writer of the package: the data cache and the data writers
(``write_parallel``, ``write_pharaoh``, ``write_bible_pairs``, the frozen debtags file), the
lab's JSON and text files, model checkpoints and resume states, and the lab's run folders.
"""

from __future__ import annotations

import glob
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "file_mode",
    "make_temp_folder",
    "process_umask",
    "temp_files",
    "write_file",
    "write_text",
]

_TEMP_SUFFIX = ".tmp"


def process_umask() -> int:
    """The process's umask, read without changing it where Linux tells it
    (``/proc/self/status``), else by setting it and setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode(*, folder: bool = False) -> int:
    """The mode of a new file (``0666``) or folder (``0777``) less the process's umask."""
    return (0o777 if folder else 0o666) & ~process_umask()


def _temp_prefix(target: Path) -> str:
    """The temporary files of ``target`` are hidden names that start with its name."""
    name = target.name
    return f"{name if name.startswith('.') else '.' + name}."


def temp_files(target: str | os.PathLike[str]) -> list[Path]:
    """The temporary files that writes of ``target`` left beside it (a process killed while
    writing leaves one): the hidden names ``.<name>.*`` (:func:`write_file` names them
    ``.<name>.<random>.tmp``; earlier versions left out the ``.tmp``)."""
    target = Path(target)
    return sorted(target.parent.glob(glob.escape(_temp_prefix(target)) + "*"))


def write_file(target: str | os.PathLike[str], write: Callable[[Path], None]) -> Path:
    """Write ``target`` atomically: ``write(path)`` writes the content to ``path``, a new
    temporary file beside ``target``, which then replaces ``target``. The file gets the
    mode of the file it replaces, else :func:`file_mode`. Any exception (an ``OSError``
    of a full disk, a ``KeyboardInterrupt``) removes the temporary file, leaves ``target``
    as it was and propagates. The folder must exist; a folder at ``target`` is an
    ``IsADirectoryError`` before anything is written. Returns ``target`` as a :class:`Path`."""
    target = Path(target)
    if target.is_dir():  # os.replace would fail only after the (maybe long) write
        raise IsADirectoryError(f"{str(target)!r} is a folder, not a file")
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=_TEMP_SUFFIX, dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except OSError:  # no file there yet (or one we may not look at): a new file's mode
            mode = file_mode()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def write_text(target: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``target`` as UTF-8, atomically (:func:`write_file`)."""
    return write_file(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def make_temp_folder(prefix: str, folder: str | os.PathLike[str]) -> Path:
    """A new, empty folder in ``folder`` whose name starts with ``prefix`` (unique, as
    ``tempfile.mkdtemp`` makes it), with the mode of a new folder (:func:`file_mode`)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=folder))
    os.chmod(path, file_mode(folder=True))
    return path
