"""Tests of attnlab.lab.ablation_record: every reader of ablation.json refuses a damaged
record with one line naming the file."""

from __future__ import annotations

import json
import re

import pytest

from attnlab._checks import ConfigError
from attnlab.lab.ablation import AblationMismatchError, run_ablation
from attnlab.lab.ablation_record import AblationRecordError, read_ablation_record
from attnlab.lab.report.data import ReportError, load_report_data
from attnlab.lab.studies.alignment import aer_table

pytestmark = pytest.mark.usefixtures("toy_task_module")

GOOD = {
    "task": "toy",
    "task_options": {"epochs": 1},
    "grid": [{"name": "mean"}],
    "seeds": [0, 1],
    "executor": "local",
    "created": "2026-11-27T05:00:00+00:00",
    "updated": "2026-11-27T05:00:00+00:00",
}

DAMAGED = [
    ("[1]", "is not an ablation record: holds a JSON list, not an object"),
    ("{bad", "is not readable JSON (Expecting property name"),
    ("", "is not readable JSON (Expecting value"),
    ('{"task": 3}', "is not an ablation record: its 'task' is int, not str"),
    ('{"grid": 5}', "is not an ablation record: its 'grid' is int, not list"),
    ('{"grid": [1]}', "is not an ablation record: its grid holds a spec that is not an object"),
    ('{"seeds": [0, true]}', "is not an ablation record: its seeds are not all whole numbers"),
    ('{"seeds": [0.5]}', "is not an ablation record: its seeds are not all whole numbers"),
    ('{"task_options": []}', "is not an ablation record: its 'task_options' is list, not dict"),
    ('{"created": 5}', "is not an ablation record: its 'created' is int, not str"),
]


def _folder(tmp_path, text):
    folder = tmp_path / "abl"
    folder.mkdir()
    (folder / "ablation.json").write_bytes(text.encode() if isinstance(text, str) else text)
    return folder


def test_a_good_record_is_returned_as_written(tmp_path):
    folder = _folder(tmp_path, json.dumps(GOOD))
    assert read_ablation_record(folder) == GOOD
    (tmp_path / "x").mkdir()
    assert read_ablation_record(_folder(tmp_path / "x", "{}")) == {}  # every field optional


@pytest.mark.parametrize(("text", "why"), DAMAGED)
def test_a_damaged_record_is_one_line_naming_the_file(tmp_path, text, why):
    folder = _folder(tmp_path, text)
    with pytest.raises(AblationRecordError) as caught:
        read_ablation_record(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'ablation.json'} {why}")
    assert "\n" not in message
    assert isinstance(caught.value, ConfigError)  # the command line prints one error line


def test_bytes_that_are_not_utf8(tmp_path):
    with pytest.raises(AblationRecordError, match="is not readable JSON"):
        read_ablation_record(_folder(tmp_path, b'{"task": "\xff"}'))


def test_no_record(tmp_path):
    with pytest.raises(AblationRecordError, match=r"is not an ablation directory \(no ablation"):
        read_ablation_record(tmp_path)


@pytest.mark.parametrize(("text", "why"), DAMAGED[:5])
def test_every_reader_refuses_a_damaged_record(tmp_path, text, why):
    folder = _folder(tmp_path, text)
    why = re.escape(why)
    with pytest.raises(AblationMismatchError, match=f"{why}.*; restore it or choose another"):
        run_ablation("toy", ["mean"], [0], out_dir=folder, options={"epochs": 1}, progress=False)
    with pytest.raises(ReportError, match=why):
        load_report_data(folder)
    with pytest.raises(AblationRecordError, match=why):
        aer_table(folder)


def test_aer_table_names_an_ablation_without_a_task(tmp_path):
    with pytest.raises(ValueError, match=r"is an ablation without a task, not 'translation'$"):
        aer_table(_folder(tmp_path, "{}"))
