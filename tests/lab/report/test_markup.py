"""attnlab.lab.report.markup: escaping (the numbers: tests/lab/test_seed_stats.py)."""

from __future__ import annotations

from attnlab.lab import seed_stats
from attnlab.lab.report import markup
from attnlab.lab.report.markup import esc, option_text


def test_escaping():
    assert esc(None) == ""
    assert esc("<a href='x'>&\"") == "&lt;a href=&#x27;x&#x27;&gt;&amp;&quot;"
    assert esc(3) == "3"
    assert option_text("<x>") == "&lt;x&gt;"  # strings as they are, escaped
    assert option_text({"a": [1, None]}) == "{&quot;a&quot;: [1, null]}"  # the rest as JSON


def test_the_page_writes_numbers_as_the_command_line_does():
    assert markup.fmt_num is seed_stats.fmt_num
    assert markup.fmt_mean_std is seed_stats.fmt_mean_std
