"""Synthesised speech for attention-based recognisers: utterances spoken by espeak-ng,
with their words, their phonemes (espeak-ng's own) and log-mel features.

Nothing is downloaded: the speech comes from the Debian package ``espeak-ng``
(``apt-get install espeak-ng``, in ``make system``), run as a program. Without it the
functions that speak raise :class:`~attnlab._optional.MissingDependencyError`
naming that command.

* :func:`synthesise`: one text as a waveform (float32 in [-1, 1], espeak-ng's 22,050 Hz),
  with a voice, a speed (words per minute) and a pitch (0-99).
* :func:`phonemes`: the text's phonemes as espeak-ng transcribes them (its ASCII
  phoneme mnemonics, ``-x``), stress marks and pauses removed: ``"red circle"`` ->
  ``["r", "E", "d", "s", "3:", "k", "@L"]``.
* :func:`mel_filterbank` and :func:`log_mel`: log-mel filterbank features (triangular
  filters on the HTK mel scale ``m = 2595 log10(1 + f / 700)`` over the power spectrum
  of 25 ms Hann windows every 10 ms; ``log(energy + 1e-6)``), ``[frames, n_mels]``.
* :func:`make_utterances`: a seeded corpus -- each text spoken with a random voice,
  speed and pitch from the given ranges, white noise added at ``snr_db`` -- cached on
  disk (``attnlab.data._cache``; the key holds espeak-ng's version and every argument).

Cost: espeak-ng synthesises far faster than real time (about 10 ms per short phrase);
the features are one STFT per utterance.

Sources: espeak-ng (https://github.com/espeak-ng/espeak-ng, GPL-3.0); log-mel features
as in Chan et al. 2016, "Listen, Attend and Spell" (ICASSP) and Chorowski et al. 2015,
"Attention-Based Models for Speech Recognition" (NeurIPS); the mel scale of S. Young et
al., The HTK Book.
"""

from __future__ import annotations

import io
import math
import shutil
import subprocess
import wave
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnlab._checks import check_int, check_number, check_seed
from attnlab._optional import MissingDependencyError, install_command
from attnlab.data._cache import cached
from attnlab.data.vocab import _check_not_text

__all__ = [
    "Utterance",
    "espeak_version",
    "log_mel",
    "make_utterances",
    "mel_filterbank",
    "phonemes",
    "synthesise",
]

_STRESS = str.maketrans("", "", "',")
_FORMAT = 1  # the format of the cached utterances


def _espeak() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise MissingDependencyError(
            f"espeak-ng is not installed: {install_command('espeak-ng')}", name="espeak-ng"
        )
    return path


def _run(args: list[str], what: str) -> bytes:
    done = subprocess.run([_espeak(), *args], capture_output=True, check=False, timeout=60)
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"espeak-ng failed on {what}: {err or f'exit {done.returncode}'}")
    return done.stdout


def espeak_version() -> str:
    """espeak-ng's version line (part of the cache key)."""
    return _run(["--version"], "--version").decode("utf-8", "replace").strip()


def _check_text(text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"text must be a non-empty string, got {text!r}")
    if text.lstrip().startswith("-"):
        raise ValueError(f"text must not start with '-' (espeak-ng reads an option): {text!r}")
    return text


def synthesise(
    text: str, *, voice: str = "en-us", speed: int = 160, pitch: int = 50
) -> tuple[np.ndarray, int]:
    """``text`` spoken by espeak-ng: ``(waveform float32 [n], sample_rate)``.

    Args:
        voice: an espeak-ng voice (``espeak-ng --voices``), e.g. ``"en-us"``, ``"en-gb"``.
        speed: words per minute (80..450).
        pitch: 0..99.
    """
    _check_text(text)
    if not 80 <= int(speed) <= 450:
        raise ValueError(f"speed must be in [80, 450] words per minute, got {speed}")
    if not 0 <= int(pitch) <= 99:
        raise ValueError(f"pitch must be in [0, 99], got {pitch}")
    raw = _run(
        ["--stdout", "-v", voice, "-s", str(int(speed)), "-p", str(int(pitch)), text], repr(text)
    )
    with wave.open(io.BytesIO(raw)) as w:
        rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
        # espeak-ng writes to a pipe, so the header's length is a placeholder: read to EOF
        frames = w.readframes(w.getnframes())
    if width != 2 or channels != 1:
        raise RuntimeError(
            f"espeak-ng wrote {channels} channels of {8 * width} bits; expected mono 16-bit"
        )
    samples = np.frombuffer(frames[: len(frames) // 2 * 2], dtype="<i2").astype(np.float32)
    return samples / 32768.0, int(rate)


def phonemes(text: str, *, voice: str = "en-us") -> list[str]:
    """espeak-ng's phoneme transcription of ``text`` (ASCII mnemonics), without stress
    marks and pauses."""
    _check_text(text)
    out = _run(["-q", "-x", "--sep= ", "-v", voice, text], repr(text)).decode("utf-8", "replace")
    units = [u.translate(_STRESS) for u in out.split()]
    return [u for u in units if u and not u.startswith("_")]


def mel_filterbank(
    n_fft: int, sample_rate: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters, equally spaced on the HTK mel scale
    between ``fmin`` and ``fmax`` (default: half the sample rate); each peaks at 1 at its
    centre frequency."""
    fmax = sample_rate / 2 if fmax is None else fmax
    if not 0 <= fmin < fmax <= sample_rate / 2:
        raise ValueError(f"need 0 <= fmin < fmax <= sample_rate / 2, got {fmin}, {fmax}")
    if n_mels < 1 or n_fft < 2:
        raise ValueError(f"n_mels must be >= 1 and n_fft >= 2, got {n_mels}, {n_fft}")

    def mel(f: np.ndarray | float) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(fmin), mel(fmax), n_mels + 2))
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    lo, centre, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None, :] - lo) / np.maximum(centre - lo, 1e-9)
    falling = (hi - freqs[None, :]) / np.maximum(hi - centre, 1e-9)
    return np.clip(np.minimum(rising, falling), 0.0, None)


def log_mel(
    waveform: np.ndarray,
    sample_rate: int,
    *,
    n_mels: int = 40,
    win_ms: float = 25.0,
    hop_ms: float = 10.0,
) -> np.ndarray:
    """Log-mel features ``[frames, n_mels]`` float32 of a mono waveform (see the module
    docstring); ``frames = 1 + len // hop`` (centred windows)."""
    x = np.asarray(waveform, dtype=np.float32)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"waveform must be a non-empty 1-D array, got shape {x.shape}")
    win = max(2, round(sample_rate * win_ms / 1000))
    hop = max(1, round(sample_rate * hop_ms / 1000))
    n_fft = 1 << math.ceil(math.log2(win))
    spec = torch.stft(
        torch.from_numpy(x),
        n_fft,
        hop_length=hop,
        win_length=win,
        window=torch.hann_window(win),
        center=True,
        pad_mode="constant",
        return_complex=True,
    )
    power = spec.abs().pow(2).numpy()  # [n_fft // 2 + 1, frames]
    fb = mel_filterbank(n_fft, sample_rate, n_mels)
    return np.log(fb @ power + 1e-6).T.astype(np.float32)


@dataclass(frozen=True)
class Utterance:
    """One synthesised utterance: the ``text``, its ``words``, its ``phonemes``, its
    log-mel ``features`` ``[frames, n_mels]`` and how it was spoken."""

    text: str
    words: tuple[str, ...]
    phonemes: tuple[str, ...]
    features: np.ndarray
    voice: str
    speed: int
    pitch: int


def _int_range(value: object, name: str, low: int, high: int | None) -> tuple[int, int]:
    """An inclusive range ``(a, b)`` of ints with ``low <= a <= b`` (``<= high`` where
    given); otherwise a ``ValueError`` naming ``name`` (numpy said "low >= high")."""
    ok = (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and low <= value[0] <= value[1]
        and (high is None or value[1] <= high)
    )
    if not ok:
        bound = f"{low} <= a <= b" + ("" if high is None else f" <= {high}")
        raise ValueError(
            f"{name} must be an inclusive range (a, b) of ints, {bound}, got {value!r}"
        )
    return int(value[0]), int(value[1])


def make_utterances(
    texts: Sequence[str],
    seed: int,
    *,
    voices: Sequence[str] = ("en-us", "en-gb", "en-gb-scotland"),
    speeds: tuple[int, int] = (130, 200),
    pitches: tuple[int, int] = (30, 70),
    snr_db: float | None = 20.0,
    n_mels: int = 40,
    progress: Callable[[], object] | None = None,
) -> list[Utterance]:
    """Every text spoken once with a voice, speed and pitch drawn from ``seed`` (uniform over
    ``voices`` and the inclusive ranges), white noise added at ``snr_db`` (None: none),
    as log-mel features. Cached on disk by espeak-ng's version and the arguments.

    ``progress`` is called once after each utterance is built (two espeak-ng calls, some
    tens of milliseconds): never when the corpus comes from the cache."""
    _check_not_text(texts, "texts", "a sequence of texts")  # "red": three one-letter texts
    _check_not_text(voices, "voices", "a sequence of espeak-ng voice names")
    texts = [_check_text(t) for t in texts]
    if not voices:
        raise ValueError("voices must name at least one espeak-ng voice")
    seed = check_seed(seed, minimum=0)  # the cache key and the generator read the same seed
    speeds = _int_range(speeds, "speeds", 1, None)
    pitches = _int_range(pitches, "pitches", 0, 99)
    if snr_db is not None:
        snr_db = check_number(snr_db, "snr_db", error=ValueError)  # NaN: all-NaN features
    n_mels = check_int(n_mels, "n_mels", error=ValueError)
    key = (
        _FORMAT,
        espeak_version(),
        tuple(texts),
        seed,
        tuple(voices),
        tuple(speeds),
        tuple(pitches),
        snr_db,
        n_mels,
    )

    def build() -> list[Utterance]:
        rng = np.random.default_rng(seed)
        out = []
        for text in texts:
            voice = str(voices[int(rng.integers(len(voices)))])
            speed = int(rng.integers(speeds[0], speeds[1] + 1))
            pitch = int(rng.integers(pitches[0], pitches[1] + 1))
            wave_, rate = synthesise(text, voice=voice, speed=speed, pitch=pitch)
            if snr_db is not None:
                power = float(np.mean(wave_**2)) or 1e-12
                sigma = math.sqrt(power / 10 ** (snr_db / 10))
                wave_ = wave_ + sigma * rng.standard_normal(wave_.shape).astype(np.float32)
            # rounded as the disk cache stores them, so a fresh build and a cached one agree
            feats = np.round(log_mel(wave_, rate, n_mels=n_mels), 4)
            out.append(
                Utterance(
                    text,
                    tuple(text.split()),
                    tuple(phonemes(text, voice=voice)),
                    feats,
                    voice,
                    speed,
                    pitch,
                )
            )
            if progress is not None:
                progress()
        return out

    def to_json(utts: list[Utterance]) -> list[dict]:
        return [
            {
                "text": u.text,
                "phonemes": list(u.phonemes),
                "features": np.round(u.features, 4).tolist(),
                "voice": u.voice,
                "speed": u.speed,
                "pitch": u.pitch,
            }
            for u in utts
        ]

    def from_json(rows: list[dict]) -> list[Utterance]:
        return [
            Utterance(
                r["text"],
                tuple(r["text"].split()),
                tuple(r["phonemes"]),
                np.asarray(r["features"], dtype=np.float32).reshape(-1, n_mels),
                r["voice"],
                int(r["speed"]),
                int(r["pitch"]),
            )
            for r in rows
        ]

    return cached("speech-utterances", key, build, to_json=to_json, from_json=from_json)
