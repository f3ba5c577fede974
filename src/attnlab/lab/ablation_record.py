"""``ablation.json``, the record of an ablation directory, read and checked in one place.

:func:`attnlab.lab.ablation.run_ablation` writes it (atomically) as::

    {"task": str, "task_options": {...}, "precision": str, "grid": [{spec}, ...],
     "seeds": [int, ...], "executor": str, "created": str, "updated": str}

(``precision`` since it is compared on resume; a record without it was fp32.)

and every reader -- the ablation that resumes into the directory, ``attnlab report`` and
``attnlab aer-table`` -- reads it with :func:`read_ablation_record`, which refuses a file
that is not readable JSON or not such a record with one line naming the file
(:class:`AblationRecordError`), instead of failing later on a field of the wrong type.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from attnlab.lab.checkpoint import RunFileError

__all__ = ["RECORD_NAME", "AblationRecordError", "read_ablation_record"]

#: The name of the record in an ablation directory.
RECORD_NAME = "ablation.json"


class AblationRecordError(RunFileError):
    """``ablation.json`` is missing, not readable JSON or not an ablation record; the
    message is one line naming the file."""


def _problem(record: Any) -> str | None:
    """What makes ``record`` no ablation record (None when it is one)."""
    if not isinstance(record, dict):
        return f"holds a JSON {type(record).__name__}, not an object"
    expected = {"task": str, "task_options": dict, "grid": list, "seeds": list}
    for key, kind in expected.items():
        if key in record and not isinstance(record[key], kind):
            return f"its {key!r} is {type(record[key]).__name__}, not {kind.__name__}"
    if not all(isinstance(spec, dict) for spec in record.get("grid", [])):
        return "its grid holds a spec that is not an object"
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in record.get("seeds", [])):
        return "its seeds are not all whole numbers"
    for key in ("precision", "executor", "created", "updated"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"its {key!r} is {type(record[key]).__name__}, not str"
    return None


def read_ablation_record(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``ablation.json`` of the ablation directory ``folder``, checked: a JSON object
    whose ``task`` (text), ``task_options`` (object), ``grid`` (array of objects), ``seeds``
    (array of ints), ``precision``, ``executor``, ``created`` and ``updated`` (text), where
    present, have those types. Raises :class:`AblationRecordError` (one line naming the file) when it is
    missing, not readable JSON or not such a record."""
    path = Path(folder) / RECORD_NAME
    if not path.is_file():
        raise AblationRecordError(f"{folder} is not an ablation directory (no {RECORD_NAME})")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: bad JSON or not UTF-8
        raise AblationRecordError(f"{path} is not readable JSON ({err})") from None
    problem = _problem(record)
    if problem is not None:
        raise AblationRecordError(f"{path} is not an ablation record: {problem}")
    return record
