"""attnlab.lab.progress.ProgressBar: the lab's one progress bar, a no-op when progress is
off."""

from __future__ import annotations

from attnlab.lab.progress import ProgressBar


def test_a_disabled_bar_prints_nothing_and_passes_values_on(capsys):
    bar = ProgressBar(False, total=3, desc="nothing")
    assert bar.step(41) == 41
    bar.update(1, loss="0.5")
    bar.note("failed=1")
    bar.write("a line")
    bar.close()
    with ProgressBar(False) as quiet:
        quiet.update()
    assert capsys.readouterr() == ("", "")


def test_an_enabled_bar_shows_its_count_description_and_postfix_on_stderr(capsys):
    with ProgressBar(True, total=3, desc="runs", unit="run") as bar:
        assert bar.step("x") == "x"
        bar.update(1, loss="0.2500")
        assert bar.bar.postfix == "loss=0.2500"
        bar.note("failed=1")
        bar.update(1)
        bar.write("run a failed: boom")
    out, err = capsys.readouterr()
    assert "run a failed: boom" in out  # above the bar, on stdout (tqdm.write's default)
    assert "runs" in err and "3/3" in err and "failed=1" in err
    assert bar.bar.n == 3
