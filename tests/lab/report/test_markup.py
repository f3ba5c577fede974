"""attnlab.lab.report.markup: escaping and the numbers of the report's tables."""

from __future__ import annotations

import math

import pytest

from attnlab.lab.report.markup import esc, fmt_mean_std, fmt_num, option_text


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "–"),
        (0, "0.0000"),
        (-0.0, "0.0000"),
        (0.25, "0.2500"),
        (-3.14159, "-3.1416"),
        (99.99994, "99.9999"),
        (100, "100.00"),
        (-12345.678, "-12345.68"),
        (123456, "1.235e+05"),
        (0.001, "0.0010"),
        (0.00012345, "0.0001234"),  # a small MSE keeps its digits
        (-3e-6, "-3e-06"),
        (math.nan, "nan"),
        (math.inf, "inf"),
    ],
)
def test_fmt_num(value, text):
    assert fmt_num(value) == text


def test_fmt_mean_std():
    assert fmt_mean_std(None, 0.1) == "–"
    assert fmt_mean_std(0.5, None) == "0.5000"
    assert fmt_mean_std(0.5, 0.01) == "0.5000 ± 0.0100"
    assert fmt_mean_std(1e-4, 2e-5) == "0.0001 ± 2e-05"


def test_escaping():
    assert esc(None) == ""
    assert esc("<a href='x'>&\"") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&quot;"
    assert esc(3) == "3"
    assert option_text("<x>") == "&lt;x&gt;"  # strings as they are, escaped
    assert option_text({"a": [1, None]}) == "{&quot;a&quot;: [1, null]}"  # the rest as JSON
