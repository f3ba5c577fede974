"""Synthesised speech: the mel filterbank and log-mel features by hand; espeak-ng's
speech, phonemes and the seeded, cached corpus (skipped without espeak-ng)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from attnlab._optional import install_command
from attnlab.data.speech import (
    log_mel,
    make_utterances,
    mel_filterbank,
    phonemes,
    synthesise,
)

needs_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason=f"espeak-ng is not installed ({install_command('espeak-ng')})",
)


def _mel(f: float) -> float:
    return 2595.0 * np.log10(1.0 + f / 700.0)


def test_mel_filterbank_by_hand() -> None:
    fb = mel_filterbank(512, 16000, 10)
    assert fb.shape == (10, 257) and (fb >= 0).all() and fb.max() <= 1.0
    freqs = np.linspace(0, 8000, 257)
    centres = freqs[fb.argmax(1)]
    # centres equally spaced in mel (to the FFT bin resolution of 31.25 Hz)
    want = 700 * (10 ** (np.linspace(0, _mel(8000), 12)[1:-1] / 2595) - 1)
    assert np.abs(centres - want).max() <= 16
    # each filter rises from its lower edge to its centre, then falls
    f0 = fb[3]
    peak = int(f0.argmax())
    assert (np.diff(f0[: peak + 1]) >= 0).all() and (np.diff(f0[peak:]) <= 0).all()
    with pytest.raises(ValueError, match="fmax"):
        mel_filterbank(512, 16000, 10, fmax=9000)


def test_log_mel_of_a_tone_peaks_at_its_filter() -> None:
    rate = 16000
    t = np.arange(rate // 2) / rate
    feats = log_mel(np.sin(2 * np.pi * 1000.0 * t).astype(np.float32), rate, n_mels=20)
    assert feats.shape == (1 + len(t) // 160, 20)
    fb = mel_filterbank(512, rate, 20)
    bin_1k = round(1000 / (rate / 2) * 256)
    assert int(np.median(feats.argmax(1))) == int(fb[:, bin_1k].argmax())
    with pytest.raises(ValueError, match="non-empty 1-D"):
        log_mel(np.zeros((2, 3)), rate)


@needs_espeak
def test_synthesis_and_phonemes() -> None:
    wave, rate = synthesise("red circle", voice="en-us", speed=160, pitch=50)
    assert rate == 22050 and wave.dtype == np.float32 and 0.3 < len(wave) / rate < 3
    assert 0.05 < np.abs(wave).max() <= 1.0
    slow, _ = synthesise("red circle", speed=100)
    assert len(slow) > len(wave)
    assert phonemes("red circle") == ["r", "E", "d", "s", "3:", "k", "@L"]
    with pytest.raises(ValueError, match="option"):
        synthesise("-x")
    with pytest.raises(ValueError, match="speed"):
        synthesise("red", speed=10)


@needs_espeak
def test_corpus_is_seeded_and_cached(tmp_path, monkeypatch) -> None:
    from attnlab.data._cache import clear_cache

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    texts = ["red circle", "blue square"]
    a = make_utterances(texts, seed=0, snr_db=20)
    assert [u.words for u in a] == [("red", "circle"), ("blue", "square")]
    assert all(u.features.shape[1] == 40 and len(u.phonemes) >= 5 for u in a)
    assert list((tmp_path / "parsed").glob("speech-utterances-*.json.gz"))
    clear_cache()  # read back from the disk cache
    b = make_utterances(texts, seed=0, snr_db=20)
    for u, v in zip(a, b, strict=True):
        assert (u.voice, u.speed, u.pitch, u.phonemes) == (v.voice, v.speed, v.pitch, v.phonemes)
        np.testing.assert_array_equal(u.features, v.features)
    c = make_utterances(texts, seed=1, snr_db=20)
    assert [(u.voice, u.speed, u.pitch) for u in c] != [(u.voice, u.speed, u.pitch) for u in a]


@needs_espeak
def test_progress_is_called_once_per_synthesised_utterance(tmp_path, monkeypatch) -> None:
    from attnlab.data._cache import clear_cache

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    clear_cache()
    ticks: list[int] = []
    texts = ["red circle", "blue square", "green"]
    built = make_utterances(texts, seed=3, progress=lambda: ticks.append(len(ticks)))
    assert ticks == [0, 1, 2] and len(built) == 3
    clear_cache()  # from the disk cache: nothing is synthesised, nothing is reported
    make_utterances(texts, seed=3, progress=lambda: ticks.append(len(ticks)))
    assert len(ticks) == 3


def test_missing_espeak_names_the_install(monkeypatch) -> None:
    from attnlab._optional import MissingDependencyError

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MissingDependencyError, match="apt-get install espeak-ng"):
        synthesise("red circle")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"texts": "red"}, TypeError, r"^texts must be a sequence of texts, not the string 'red'"),
        ({"voices": "en-us"}, TypeError, r"^voices must be a sequence of espeak-ng voice names"),
        ({"seed": 1.5}, TypeError, r"^seed must be an int, got 1\.5"),
        ({"seed": True}, TypeError, r"^seed must be an int, got True"),
        ({"speeds": (200, 130)}, ValueError, r"^speeds must be an inclusive range \(a, b\)"),
        ({"pitches": (30, 120)}, ValueError, r"^pitches must be .* <= 99, got \(30, 120\)"),
        ({"snr_db": float("nan")}, ValueError, r"^snr_db must be a finite number, got nan"),
        ({"n_mels": 0}, ValueError, r"^n_mels must be an int >= 1, got 0"),
    ],
)
def test_bad_arguments_are_one_line_before_espeak_runs(monkeypatch, options, error, message):
    """A string of texts was split into letters, a float seed was seed 1 from the cache and
    a TypeError without it, a reversed range was numpy's "low >= high" and a NaN SNR gave
    all-NaN features; each is now one line naming the argument, before espeak-ng runs."""
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no espeak-ng reached
    kwargs = {"texts": ["red"], "seed": 0, **options}
    with pytest.raises(error, match=message):
        make_utterances(**kwargs)
