"""attnlab.lab.errors: one error line and its exit status, and warnings shown as notes."""

from __future__ import annotations

import warnings

import pytest

import attnlab.lab.training as training
from attnlab._checks import ConfigError
from attnlab._deprecation import REMOVED_IN, warn_deprecated
from attnlab.data import MissingDataError
from attnlab.lab.errors import fail, failing_on, warnings_as_notes


def _exit(capsys, error: BaseException, *errors: type[BaseException]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stop, failing_on(*errors):
        raise error
    return stop.value.code, capsys.readouterr().err


def test_fail_prints_one_line_and_exits_2_or_the_status_given(capsys):
    with pytest.raises(SystemExit) as stop:
        fail("bad")
    assert stop.value.code == 2 and capsys.readouterr().err == "error: bad\n"
    with pytest.raises(SystemExit) as stop:
        fail("no data", code=1)
    assert stop.value.code == 1


def test_failing_on_bad_input_is_status_2_and_missing_data_status_1(capsys):
    assert _exit(capsys, ConfigError("bad value"), ConfigError) == (2, "error: bad value\n")
    assert _exit(capsys, FileNotFoundError("no dir"), FileNotFoundError) == (2, "error: no dir\n")
    # missing data is status 1 whether it is listed or not, also as a FileNotFoundError
    assert _exit(capsys, MissingDataError("install x"), FileNotFoundError)[0] == 1
    assert _exit(capsys, MissingDataError("install x")) == (1, "error: install x\n")
    with pytest.raises(KeyError), failing_on(ValueError):  # others propagate
        raise KeyError("k")
    with failing_on(ValueError):  # nothing raised: nothing printed
        pass
    assert capsys.readouterr().err == ""


def _warn_from_attnlab(message: str) -> None:
    """A warning as attnlab code raises it (its file inside the package)."""
    warnings.warn_explicit(message, RuntimeWarning, training.__file__, 1)


def test_warnings_as_notes_shows_attnlab_warnings_once_each_on_one_line(capsys):
    with warnings_as_notes():
        for _ in range(3):
            _warn_from_attnlab("METEOR is NaN: nltk is not installed")
        _warn_from_attnlab("another notice")
    assert capsys.readouterr().err.splitlines() == [
        "note: METEOR is NaN: nltk is not installed",
        "note: another notice",
    ]


def test_warnings_as_notes_leaves_other_warnings_and_the_api_alone(capsys):
    with pytest.warns(UserWarning, match="from elsewhere"), warnings_as_notes():
        warnings.warn_explicit("from elsewhere", UserWarning, "/somewhere/else.py", 3)
    assert "note:" not in capsys.readouterr().err
    shows = warnings.showwarning
    with warnings_as_notes():
        pass
    assert warnings.showwarning is shows  # restored: the Python API warns as usual
    with pytest.warns(RuntimeWarning, match="as a warning"):
        _warn_from_attnlab("as a warning")


def test_warnings_as_notes_shows_attnlab_deprecations_under_pythons_default_filters(capsys):
    """attnlab's deprecations are attributed to the caller's frame (outside the package),
    and Python's default filters hide a DeprecationWarning not raised from ``__main__``:
    a command-line user still gets them as notes; other packages' stay hidden."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("ignore", DeprecationWarning)  # Python's default outside main
        with warnings_as_notes():
            warn_deprecated("thing: the option old='x' is deprecated; use new='x'")
            warnings.warn("another package's deprecation", DeprecationWarning, stacklevel=1)
        warn_deprecated("outside the block: hidden as before")
    assert capsys.readouterr().err.splitlines() == [
        f"note: thing: the option old='x' is deprecated; use new='x' "
        f"(removed in attnlab {REMOVED_IN})"
    ]


def test_error_message_unquotes_a_key_error_and_keeps_other_quotes():
    from attnlab.lab.errors import error_message

    assert error_message(KeyError("unknown score 'x'")) == "unknown score 'x'"
    assert error_message(ValueError("D must be an int >= 1, got 'x'")) == (
        "D must be an int >= 1, got 'x'"  # stripping quotes used to cut this one
    )
    assert error_message(KeyError("a", "b")) == "('a', 'b')"
    assert error_message(KeyError(3)) == "3"
