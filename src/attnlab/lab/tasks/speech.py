"""Task ``speech``: attention-based speech recognition ("Listen, Attend and Spell", Chan et
al. 2016) on utterances synthesised offline by espeak-ng.

Data (:mod:`attnlab.data.speech`; needs the Debian package ``espeak-ng``, ``make system``):
each utterance is ``min_words..max_words`` words drawn from the first ``words`` of
:data:`WORDS` (the digit names), spoken with a voice, speed and pitch drawn from
``data_seed`` (``voices``, ``speeds``, ``pitches``), white noise added at ``snr_db``, as
``n_mels`` log-mel features (standardised per channel with the training split's mean and
deviation); cached on disk. The references are the words, their characters and espeak-ng's
own phonemes (which depend on the voice: en-gb and en-us say "zero" differently).

Targets (option ``targets``): ``phonemes`` (default; one output per espeak-ng phoneme) or
``characters`` (letters and the space).

Model: :class:`attnlab.models.recogniser.ListenAttendSpell` (pyramidal BiLSTM listener,
LSTM speller attending over the listener's annotation vectors at every output unit).
Loss: cross-entropy of the targets (teacher forcing), plus ``reinforce_weight`` times the
REINFORCE term of a hard alignment.

Attention presets: ``soft`` (default; additive score, soft alignment: LAS and Chorowski et
al.'s content-based attention), ``location`` (location-aware score, Chorowski et al. 2015:
the previous weights convolved into the score), ``dot`` (scaled dot product), ``hard``
(one annotation vector sampled per unit, REINFORCE), and the baselines ``mean`` (the mean
of the annotation vectors at every step: no attention) and ``uniform``.

Metrics (lower is better for the error rates; jiwer, :mod:`attnlab.evaluation.error_rates`):
``error_rate`` (selection: the PER with phoneme targets, the CER with character targets),
``per``, ``cer``, ``wer`` of the greedy transcripts (a rate the targets do not give is NaN:
phonemes give no words), and the shape of the attention (teacher forcing on the test
references; :mod:`attnlab.evaluation.monotonicity`): ``diagonal_mass`` (mass within
``band`` of the diagonal), ``forward_fraction``, ``centroid_correlation``, and
``diagonal_mass_uniform``, the same for uniform attention (the floor; ``mean`` and
``uniform`` score exactly it, 0 forward fraction and 0 correlation).

Option presets (``-o preset=...``): ``cpu`` (the defaults: 600 training utterances of 2-3
digit names, a 48-unit speller: minutes on a CPU) and ``paper`` (LAS's sizes and outputs:
40 mel channels, a listener of three pyramid BiLSTM layers of 256 per direction (the
time reduced 8 times), batches of 32, character targets; ours, not LAS's: a one-layer
256-unit speller, embeddings of 64, dropout 0.1, Adam 1e-3, 30 epochs, 20,000 utterances
of 1-6 words). Not reproduced at either scale: LAS's data (about 2,000 hours of real
voice-search speech), its two-layer 512-unit speller, its score (the dot product of two
MLP projections, ``phi(s_i)^T psi(h_u)``; ``soft`` here is the additive score, and
``-a score=general`` the bilinear one, linear ``phi`` and ``psi``), its optimiser (ASGD
from 0.2 with a geometric decay) and its training until the dev error stops falling, the
sampling of 10% of the previous outputs from the model during training, and beam search
rescored by a language model (decoding here is greedy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.data.speech import make_utterances
from attnlab.data.vocab import Vocab
from attnlab.evaluation.error_rates import (
    character_error_rate,
    phoneme_error_rate,
    word_error_rate,
)
from attnlab.evaluation.monotonicity import alignment_shape
from attnlab.lab.batching import pad_ids
from attnlab.lab.progress import ProgressBar
from attnlab.lab.task import AttentionExample, Task, TaskData, register_task
from attnlab.lab.tasks._shared import add_reinforce
from attnlab.models.recogniser import ListenAttendSpell

__all__ = ["WORDS", "SpeechData", "SpeechTask"]

IGNORE = -1
SPECIALS = ("<pad>", "<bos>", "<eos>")
#: the words utterances are made of (the first ``words`` of them)
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SHAPE = ("diagonal_mass", "forward_fraction", "centroid_correlation")


@dataclass(frozen=True)
class SpeechData:
    """One split: ``features`` (one ``[T_i, n_mels]`` float tensor per utterance, already
    standardised), ``texts`` (the words), ``units`` (the target units: phonemes or
    characters), ``ids`` (their vocabulary ids) and ``phonemes``."""

    features: tuple[Tensor, ...]
    texts: tuple[str, ...]
    units: tuple[tuple[str, ...], ...]
    ids: tuple[tuple[int, ...], ...]
    phonemes: tuple[tuple[str, ...], ...]

    def __len__(self) -> int:
        return len(self.texts)


def _units(utterance: Any, targets: str) -> tuple[str, ...]:
    if targets == "phonemes":
        return tuple(utterance.phonemes)
    return tuple(utterance.text)


@register_task("speech")
class SpeechTask(Task):
    """Recognising synthesised digit strings with
    :class:`~attnlab.models.recogniser.ListenAttendSpell`.

    Options (besides ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``grad_clip``):
        targets: ``"phonemes"`` or ``"characters"``.
        words, min_words, max_words: the vocabulary (the first ``words`` of :data:`WORDS`)
            and the words per utterance.
        train_size, dev_size, test_size: utterances per split; data_seed: train, dev and
            test use ``data_seed``, ``+ 1``, ``+ 2`` (texts and voices).
        voices, speeds, pitches, snr_db, n_mels: how they are spoken and featurised (see
            :func:`attnlab.data.speech.make_utterances`).
        listener_size, pyramid, stack, embed_dim, hidden_size, dropout: the model.
        reinforce_weight: weight of the REINFORCE term of hard attention.
        band: the diagonal band of ``diagonal_mass`` (a fraction of the utterance).

    :formula: a = pBLSTM(log-mel frames); s_t = LSTM([E y_{t-1}; c_{t-1}], s_{t-1}); c_t = sum_l
        align(score(s_t, a_l)) a_l; p(y_t) = softmax(W_o tanh(W_p [s_t; c_t]))
    :source: Chan et al. 2016, Listen, Attend and Spell (ICASSP); Chorowski et al. 2015,
        Attention-Based Models for Speech Recognition (NeurIPS), on speech synthesised by
        espeak-ng
    :cost: listener O(T h (n_mels + h)) once per utterance + per unit LSTM O(d (d_e + 2d)) +
        attention O(S d d_w)
    """

    metrics: ClassVar[tuple[str, ...]] = ("error_rate", "per", "cer", "wer", *_SHAPE)
    higher_is_better: ClassVar[bool] = False
    defaults: ClassVar[dict[str, Any]] = {
        "epochs": 15,
        "lr": 3e-3,
        "targets": "phonemes",
        "words": 10,
        "min_words": 2,
        "max_words": 3,
        "train_size": 600,
        "dev_size": 100,
        "test_size": 100,
        "data_seed": 0,
        "voices": ["en-us", "en-gb", "en-gb-scotland"],
        "speeds": [130, 200],
        "pitches": [30, 70],
        "snr_db": 20.0,
        "n_mels": 24,
        "listener_size": 48,
        "pyramid": 1,
        "stack": 3,
        "embed_dim": 16,
        "hidden_size": 48,
        "dropout": 0.0,
        "reinforce_weight": 1.0,
        "band": 0.1,
    }
    option_presets: ClassVar[dict[str, dict[str, Any]]] = {
        "cpu": {},
        "paper": {
            "epochs": 30,
            "min_words": 1,
            "max_words": 6,
            "train_size": 20000,
            "dev_size": 1000,
            "test_size": 1000,
            "n_mels": 40,
            "listener_size": 256,
            "pyramid": 3,
            "stack": 1,
            "embed_dim": 64,
            "hidden_size": 256,
            "dropout": 0.1,
            "lr": 1e-3,
            "targets": "characters",
        },
    }
    default_attention: ClassVar[dict[str, Any]] = {"score": "additive"}
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "soft": {"score": "additive"},
        "location": {"score": "location-aware"},
        "dot": {"score": "scaled-dot"},
        "hard": {"score": "additive", "align": "hard"},
    }
    data_source: ClassVar[str] = "digit strings spoken by espeak-ng (apt-get install espeak-ng)"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_int_options(
            "words", "min_words", "max_words", "train_size", "dev_size", "test_size", "n_mels",
            "listener_size", "embed_dim", "hidden_size", "stack",
        )  # fmt: skip
        self.check_int_options("pyramid", minimum=0)
        self.check_option_choice("targets", ("phonemes", "characters"))
        if o["words"] > len(WORDS):
            raise ConfigError(f"option words must be in [1, {len(WORDS)}], got {o['words']}")
        if o["max_words"] < o["min_words"]:
            raise ConfigError(
                f"option max_words={o['max_words']} must be >= min_words={o['min_words']}"
            )
        self.check_number_options("band", low=0.0, high=1.0)
        self.check_number_options("snr_db")  # any finite level: below 0 dB the noise is louder

    # ------------------------------------------------------------------ data

    def _texts(self, count: int, seed: int) -> list[str]:
        o = self.options
        rng = np.random.default_rng(seed)
        vocab = WORDS[: int(o["words"])]
        sizes = rng.integers(int(o["min_words"]), int(o["max_words"]) + 1, size=count)
        return [" ".join(vocab[int(i)] for i in rng.integers(len(vocab), size=k)) for k in sizes]

    def load_data(self) -> TaskData:
        o = self.options
        seed = int(o["data_seed"])
        sizes = (int(o["train_size"]), int(o["dev_size"]), int(o["test_size"]))
        spoken = []
        # the bar advances only where espeak-ng runs (a cache miss: 20,000 utterances take
        # minutes); with no update it never shows (delay) and leaves nothing behind
        bar_kw = {"desc": "speech: espeak-ng", "unit": "utt", "leave": False, "delay": 0.5}
        with ProgressBar(self.progress, total=sum(sizes), **bar_kw) as bar:
            for offset, size in enumerate(sizes):
                spoken.append(
                    make_utterances(
                        self._texts(size, seed + offset),
                        seed + offset,
                        voices=tuple(o["voices"]),
                        speeds=tuple(int(s) for s in o["speeds"]),
                        pitches=tuple(int(p) for p in o["pitches"]),
                        snr_db=None if o["snr_db"] is None else float(o["snr_db"]),
                        n_mels=int(o["n_mels"]),
                        progress=bar.update,
                    )
                )
        train_frames = np.concatenate([u.features for u in spoken[0]])
        mean, std = train_frames.mean(0), train_frames.std(0) + 1e-5
        # the inventory of all splits: a voice's phoneme unseen in training stays a class
        inventory = sorted({c for part in spoken for u in part for c in _units(u, o["targets"])})
        vocab = Vocab(inventory, specials=SPECIALS, unk=None, pad="<pad>")

        def split(utterances: Sequence[Any]) -> SpeechData:
            units = tuple(_units(u, o["targets"]) for u in utterances)
            return SpeechData(
                features=tuple(torch.from_numpy((u.features - mean) / std) for u in utterances),
                texts=tuple(u.text for u in utterances),
                units=units,
                ids=tuple(tuple(vocab.encode(list(x))) for x in units),
                phonemes=tuple(tuple(u.phonemes) for u in utterances),
            )

        longest = max(len(_units(u, o["targets"])) for part in spoken for u in part)
        info = {"vocab": vocab, "max_len": longest + 2}
        return TaskData(*(split(p) for p in spoken), info)

    def example_size(self, part: SpeechData, i: int) -> int:
        return int(part.features[i].shape[0])

    def make_batch(self, data: TaskData, part: SpeechData, idx: list[int]) -> dict[str, Tensor]:
        vocab: Vocab = data.info["vocab"]
        bos, eos = vocab.index("<bos>"), vocab.index("<eos>")
        frames = [part.features[i] for i in idx]
        lengths = torch.tensor([f.shape[0] for f in frames], dtype=torch.long)
        features = torch.zeros(len(idx), int(lengths.max()), frames[0].shape[1])
        for row, f in enumerate(frames):
            features[row, : f.shape[0]] = f
        tokens_in, _ = pad_ids([(bos, *part.ids[i]) for i in idx], vocab.pad_index)
        targets, _ = pad_ids([(*part.ids[i], eos) for i in idx], IGNORE)
        return {
            "features": features,
            "lengths": lengths,
            "tokens_in": tokens_in,
            "targets": targets,
            "index": torch.tensor(idx, dtype=torch.long),
        }

    # ------------------------------------------------------------------ model

    def build_model(self, data: TaskData, attention: Mapping[str, Any]) -> nn.Module:
        o = self.options
        vocab: Vocab = data.info["vocab"]
        sizes = ("n_mels", "listener_size", "pyramid", "stack", "embed_dim", "hidden_size")
        specials = {f"{s}_idx": vocab.index(f"<{s}>") for s in ("pad", "bos", "eos")}
        return ListenAttendSpell(
            len(vocab),
            **{k: int(o[k]) for k in sizes},
            attention=self.model_attention(attention),
            dropout=float(o["dropout"]),
            **specials,
        )

    # ------------------------------------------------------------------ training

    def loss(self, model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
        out = model(batch["features"], batch["lengths"], batch["tokens_in"])
        targets = batch["targets"]
        # cross_entropy gives 0 at the ignored (padding) positions
        ce = F.cross_entropy(
            out.logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none"
        ).view_as(targets)
        per_utterance = ce.sum(1)
        mean = per_utterance.sum() / (targets != IGNORE).sum().clamp(min=1)
        log_prob = out.log_prob
        if log_prob is not None:
            log_prob = log_prob.masked_fill(targets == IGNORE, 0.0).sum(1)
        return add_reinforce(
            mean, log_prob, per_utterance, float(self.options["reinforce_weight"]), model
        )

    def transcripts(self, model: nn.Module, data: TaskData, split: str) -> list[list[str]]:
        """The greedy transcripts of one split, as units (phonemes or characters)."""
        vocab: Vocab = data.info["vocab"]
        device = next(model.parameters()).device
        out: list[list[str]] = []
        for batch in self.batches(data, split, 128):
            dec = model.greedy(
                batch["features"].to(device), batch["lengths"].to(device), data.info["max_len"]
            )
            out += [vocab.decode(t) for t in dec.tokens]
        return out

    def alignments(self, model: nn.Module, data: TaskData, split: str) -> list[np.ndarray]:
        """The attention of each utterance of a split, ``[units + 1, S_i]`` (teacher forcing
        on its reference; the last row produced EOS)."""
        device = next(model.parameters()).device
        part: SpeechData = data.split(split)
        mats = []
        for batch in self.batches(data, split, 128):
            out = model(*(batch[k].to(device) for k in ("features", "lengths", "tokens_in")))
            real = out.mask.sum(1).tolist()
            weights = out.weights.detach().float().cpu().numpy()
            for row, i in enumerate(batch["index"].tolist()):
                mats.append(weights[row, : len(part.ids[i]) + 1, : real[row]])
        return mats

    def error_rates(self, data: TaskData, split: str, hyps: list[list[str]]) -> dict[str, float]:
        """PER, CER and WER of the transcripts ``hyps`` (NaN where the targets give none)."""
        part: SpeechData = data.split(split)
        nan = float("nan")
        if self.options["targets"] == "phonemes":
            per = phoneme_error_rate([list(u) for u in part.units], hyps)
            return {"error_rate": per, "per": per, "cer": nan, "wer": nan}
        texts = ["".join(h) for h in hyps]
        cer = character_error_rate(list(part.texts), texts)
        wer = word_error_rate(list(part.texts), texts)
        return {"error_rate": cer, "per": nan, "cer": cer, "wer": wer}

    def evaluate(self, model: nn.Module, data: TaskData, split: str) -> dict[str, float]:
        band = float(self.options["band"])
        metrics = self.error_rates(data, split, self.transcripts(model, data, split))
        mats = self.alignments(model, data, split)
        metrics.update(alignment_shape(mats, band=band))
        floor = [np.full_like(m, 1.0 / m.shape[1]) for m in mats]
        metrics["diagonal_mass_uniform"] = alignment_shape(floor, band=band)["diagonal_mass"]
        return metrics

    def attention_examples(
        self, model: nn.Module, data: TaskData, n: int = 4
    ) -> list[AttentionExample]:
        """The greedy transcripts of the first ``n`` test utterances: the attention of each
        output unit drawn over the utterance's spectrogram (one grid cell per annotation
        vector, ``stack 2^pyramid`` frames wide)."""
        part: SpeechData = data.test
        k = min(n, len(part))
        if k <= 0:
            return []
        vocab: Vocab = data.info["vocab"]
        batch = self.make_batch(data, part, list(range(k)))
        device = next(model.parameters()).device
        dec = model.greedy(
            batch["features"].to(device), batch["lengths"].to(device), data.info["max_len"]
        )
        stride = int(self.options["stack"]) * 2 ** int(self.options["pyramid"])
        examples = []
        for b in range(k):
            att = dec.attention[b].float().cpu()
            S = att.shape[1]
            examples.append(
                AttentionExample(
                    title=f"test #{b}: {part.texts[b]!r}",
                    rows=vocab.decode(dec.tokens[b]),
                    cols=[f"{10 * stride * s} ms" for s in range(S)],
                    weights=att.tolist(),
                    label=" ".join(part.units[b]),
                    prediction=" ".join(vocab.decode(dec.tokens[b])),
                    kind="image",
                    grid=(1, S),
                    image=_spectrogram_picture(part.features[b], S * stride),
                    extra={"frames_per_cell": stride, "text": part.texts[b]},
                )
            )
        return examples


def _spectrogram_picture(features: Tensor, frames: int) -> list:
    """A ``[n_mels, frames, 3]`` grey picture of ``[T, n_mels]`` features (low frequencies at
    the bottom, scaled to [0, 1], padded to ``frames`` columns with the darkest value)."""
    x = features.float().T.flip(0)  # [n_mels, T], high frequencies on top
    lo, hi = float(x.min()), float(x.max())
    x = (x - lo) / max(hi - lo, 1e-6)
    x = F.pad(x, (0, max(frames - x.shape[1], 0)))
    return x[..., None].expand(-1, -1, 3).numpy().round(3).tolist()
