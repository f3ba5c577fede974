"""Task ``speech``: every preset and baseline on a tiny espeak-ng corpus, the data and the
metrics by hand, the option presets, an end-to-end train_run, and a learning test that
attention passes and the mean-pooling baseline fails.

Needs espeak-ng (``apt-get install espeak-ng``) and jiwer (``pip install jiwer``); skipped
with that reason without them."""

from __future__ import annotations

import importlib.util
import math
import shutil

import numpy as np
import pytest
import torch
from task_harness import build, check_deterministic, check_train_run, run_spec, spec_id, train_steps

from attnlab import registry
from attnlab._checks import ConfigError
from attnlab.lab.tasks.speech import WORDS, SpeechTask
from attnlab.models.recogniser import ListenAttendSpell

_MISSING = [
    why
    for why, absent in (
        ("needs espeak-ng: apt-get install espeak-ng", shutil.which("espeak-ng") is None),
        ("needs jiwer: pip install 'jiwer>=3.0'", importlib.util.find_spec("jiwer") is None),
    )
    if absent
]
#: the tests that synthesise speech or score it
needs_speech = pytest.mark.skipif(bool(_MISSING), reason="; ".join(_MISSING))

TINY = {
    "train_size": 10,
    "dev_size": 4,
    "test_size": 5,
    "n_mels": 8,
    "listener_size": 4,
    "hidden_size": 6,
    "embed_dim": 4,
    "batch_size": 8,
}
SPECS = [{}, *({"name": p} for p in SpeechTask.presets), {"name": "mean"}, {"name": "uniform"}]
SPECS.append({"score": "additive", "d_w": 3, "align": "sparsemax"})


@needs_speech
@pytest.mark.parametrize("spec", SPECS, ids=spec_id)
def test_every_preset_and_baseline(spec) -> None:
    task = SpeechTask(**TINY)
    data = task.load_data()
    _, metrics, examples = run_spec(task, data, spec, 8, model_type=ListenAttendSpell, steps=2, n=3)
    assert set(task.metrics) <= set(metrics)
    assert metrics["error_rate"] == metrics["per"] >= 0
    assert math.isnan(metrics["cer"]) and math.isnan(metrics["wer"])
    for name in ("diagonal_mass", "forward_fraction", "diagonal_mass_uniform"):
        assert 0 <= metrics[name] <= 1
    if spec.get("name") in ("mean", "uniform"):
        assert metrics["diagonal_mass"] == pytest.approx(metrics["diagonal_mass_uniform"])
        assert metrics["forward_fraction"] == 0 and metrics["centroid_correlation"] == 0
    assert len(examples) == 3
    for ex in examples:
        assert ex.kind == "image" and ex.grid == (1, len(ex.cols))
        assert len(ex.rows) == len(ex.weights) == len(ex.prediction.split())
        picture = np.asarray(ex.image)
        assert picture.shape == (8, 6 * len(ex.cols), 3)  # n_mels x frames, 6 frames a cell
        assert picture.min() >= 0 and picture.max() <= 1
        for row in ex.weights:
            assert sum(row) == pytest.approx(1.0, abs=1e-4)


@needs_speech
def test_one_seed_one_model() -> None:
    task = SpeechTask(**TINY)
    check_deterministic(task, task.load_data(), {"name": "location"}, 8)


@needs_speech
def test_data_references_and_batches() -> None:
    task = SpeechTask(**TINY)
    data = task.load_data()
    vocab = data.info["vocab"]
    part = data.test
    for i, text in enumerate(part.texts):
        words = text.split()
        assert 2 <= len(words) <= 3 and set(words) <= set(WORDS)
        assert part.units[i] == part.phonemes[i] and vocab.decode(part.ids[i]) == list(
            part.units[i]
        )
        assert part.features[i].shape[1] == 8
    train = torch.cat(data.train.features)
    assert train.mean(0).abs().max() < 1e-3 and (train.std(0) - 1).abs().max() < 1e-2
    batch = task.make_batch(data, part, [0, 1])
    n0 = len(part.ids[0])
    assert batch["features"].shape[0] == 2 and batch["lengths"].tolist() == [
        part.features[0].shape[0],
        part.features[1].shape[0],
    ]
    assert batch["tokens_in"][0, 0] == vocab.index("<bos>")
    assert batch["tokens_in"][0, 1 : n0 + 1].tolist() == list(part.ids[0])
    assert batch["targets"][0, n0] == vocab.index("<eos>")
    again = SpeechTask(**TINY).load_data()
    assert again.test.texts == part.texts
    assert all(torch.equal(a, b) for a, b in zip(again.test.features, part.features, strict=True))


@needs_speech
def test_synthesis_shows_a_bar_only_with_progress_and_only_on_a_cache_miss(
    tmp_path, monkeypatch, capsys
) -> None:
    from attnlab.data._cache import clear_cache

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    clear_cache()
    quiet = SpeechTask(**{**TINY, "data_seed": 5})
    assert quiet.progress is False  # the default: a task prints nothing
    quiet.load_data()
    assert capsys.readouterr().err == ""
    clear_cache()
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "fresh"))
    import attnlab.lab.tasks.speech as speech_mod
    from attnlab.lab.progress import ProgressBar

    bars: list[tuple[bool, list[int]]] = []

    class Recorded(ProgressBar):  # what the task asked for, whatever tqdm's delay shows
        def __init__(self, enabled: bool, **kw) -> None:
            super().__init__(enabled, **kw)
            bars.append((enabled, []))

        def update(self, n: int = 1, **postfix) -> None:
            bars[-1][1].append(n)
            super().update(n, **postfix)

    monkeypatch.setattr(speech_mod, "ProgressBar", Recorded)
    shown = SpeechTask(**{**TINY, "data_seed": 5})
    shown.progress = True
    shown.load_data()
    assert bars[-1] == (True, [1] * 19)  # 10 + 4 + 5 utterances synthesised
    capsys.readouterr()  # whatever the bar drew (tqdm shows it only after its delay)
    clear_cache()  # the same corpus again, from the disk cache: the bar never advances
    shown.load_data()
    assert bars[-1] == (True, [])
    assert "espeak-ng" not in capsys.readouterr().err


@needs_speech
def test_character_targets_give_cer_and_wer() -> None:
    task = SpeechTask(targets="characters", **TINY)
    data = task.load_data()
    assert data.test.units[0] == tuple(data.test.texts[0])
    model = task.build_model(data, task.resolve_attention({}))
    metrics = task.evaluate(model.eval(), data, "test")
    assert metrics["error_rate"] == metrics["cer"] and metrics["wer"] >= 0
    assert math.isnan(metrics["per"])
    # the error rates by hand: a perfect transcript and an empty one
    refs = [list(u) for u in data.test.units]
    assert task.error_rates(data, "test", refs)["cer"] == 0
    empty = task.error_rates(data, "test", [[] for _ in refs])
    assert empty["cer"] == 1 and empty["wer"] == 1


def test_option_presets_and_errors() -> None:
    assert "speech" in registry.names("task")
    paper = SpeechTask(preset="paper")
    assert paper.options["pyramid"] == 3 and paper.options["hidden_size"] == 256
    assert SpeechTask(preset="paper", pyramid=2).options["pyramid"] == 2
    assert SpeechTask(preset="cpu").options == {**SpeechTask().options, "preset": "cpu"}
    with pytest.raises(ConfigError, match="option targets must be 'phonemes' or 'characters', got"):
        SpeechTask(targets="words")
    with pytest.raises(ConfigError, match="max_words"):
        SpeechTask(min_words=3, max_words=2)
    with pytest.raises(ConfigError, match=r"option words must be in \[1, 10\]"):
        SpeechTask(words=11)
    with pytest.raises(ConfigError, match="option pyramid must be an int >= 0"):
        SpeechTask(pyramid=-1)
    with pytest.raises(ConfigError, match="no option preset"):
        SpeechTask(preset="huge")


@needs_speech
def test_train_run_end_to_end(tmp_path) -> None:
    task = SpeechTask(epochs=1, **TINY)
    for spec in ({"name": "soft"}, {"name": "mean"}):
        _, examples = check_train_run(
            task, spec, tmp_path / spec["name"], num_threads=1, primary="error_rate",
            example_kind="image",
        )  # fmt: skip
        assert examples[0]["image"]


def _learn(spec: dict, seed: int, steps: int = 120) -> dict[str, float]:
    """Train on 300 utterances of two or three digit names (three voices, noise) and return
    the test metrics. Which phonemes come first is where they are in time: mean pooling
    over the annotation vectors keeps what was said but loses the order."""
    task = SpeechTask(
        train_size=300, dev_size=4, test_size=100, listener_size=32, hidden_size=32,
        embed_dim=16, stack=3, pyramid=1,
    )  # fmt: skip
    data = task.load_data()
    model = build(task, data, spec, seed)
    train_steps(
        task, data, model, 32, steps=steps, generator_seed=seed, lr=5e-3, epochs=None, grad_clip=5.0
    )
    model.eval()
    with torch.no_grad():
        return task.evaluate(model, data, "test")


@needs_speech
@pytest.mark.slow
def test_soft_attention_recognises_what_mean_pooling_cannot(one_thread) -> None:
    # seeds 0-4 (checked locally, 120 steps): soft PER 0.15-0.22, mean PER 0.36-0.49
    soft = _learn({"name": "soft"}, 0)
    mean = _learn({"name": "mean"}, 0)
    assert soft["per"] < mean["per"] - 0.15, (soft["per"], mean["per"])
    assert soft["diagonal_mass"] > soft["diagonal_mass_uniform"] + 0.05
    assert soft["centroid_correlation"] > 0.5 and mean["centroid_correlation"] == 0
