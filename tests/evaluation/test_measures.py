"""The shared parts of the evaluation measures: result records and the pairing check."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from attnlab.evaluation._measures import Record, check_paired
from attnlab.evaluation.aer import AERResult
from attnlab.evaluation.significance import PairedComparison


def test_record_as_dict_lists_the_fields_in_order():
    @dataclass(frozen=True)
    class Score(Record):
        value: float
        n: int

    assert Score(0.5, 3).as_dict() == {"value": 0.5, "n": 3}
    assert issubclass(AERResult, Record) and issubclass(PairedComparison, Record)


def test_check_paired():
    check_paired([1, 2], ["a", "b"], references_are="references", give="hypothesis per reference")
    with pytest.raises(ValueError, match=r"^2 reference sets but 1 hypotheses; give one list$"):
        check_paired([1, 2], ["a"], references_are="reference sets", give="list")
