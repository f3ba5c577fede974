"""The helpers of the attentive decoders (attnlab.models._decoder)."""

from __future__ import annotations

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.general.attention import Attention
from attnlab.models._decoder import (
    decoder_attention,
    greedy_decode,
    greedy_search,
    teacher_forcing,
)


def test_decoder_attention_specs():
    att, uniform = decoder_attention(None, 4, "additive", d_w=6)
    assert isinstance(att, Attention) and not uniform and att.score.W1.out_features == 6
    assert decoder_attention("mean", 4, "additive") == (None, False)
    att, uniform = decoder_attention("uniform", 4, "general")
    assert uniform and isinstance(att, Attention)
    att, uniform = decoder_attention({"score": "dot", "uniform": True}, 4, "general")
    assert uniform and type(att.score).__name__ == "DotScore"
    with pytest.raises(ConfigError, match="not name="):
        decoder_attention({"name": "soft"}, 4, "additive")
    with pytest.raises(ConfigError, match="attention must be None, a score name"):
        decoder_attention(3, 4, "additive")


def test_decoders_without_ordered_keys_refuse_local_m():
    """local-m centres step t's window on key t: the captioner (image regions) and the
    recogniser (many frames per unit) refuse it with a reason and local-p as the way out
    (the window sat on keys 0..D at every step); the translator passes the step."""
    from attnlab.models.captioner import ShowAttendTell
    from attnlab.models.recogniser import ListenAttendSpell
    from attnlab.models.translator import Seq2SeqTranslator

    spec = {"align": "local-m", "D": 1}
    with pytest.raises(ConfigError, match=r"image regions.*local-p"):
        ShowAttendTell(7, image_size=16, grid=4, attention=spec)
    with pytest.raises(ConfigError, match=r"frames.*local-p"):
        ListenAttendSpell(7, n_mels=4, listener_size=3, pyramid=1, embed_dim=3,
                          hidden_size=4, attention=spec)  # fmt: skip
    ShowAttendTell(7, image_size=16, grid=4, attention={"align": "local-p", "D": 1})
    assert Seq2SeqTranslator(9, 9, attention=spec).local_m


def test_teacher_forcing_runs_one_step_per_word():
    seen = []

    def step(y, state):
        seen.append(y.tolist())
        logits = torch.nn.functional.one_hot(y, 5).float()
        return logits, state + 1, torch.full((y.shape[0], 3), 1 / 3), None

    tokens = torch.tensor([[1, 2], [3, 4]])
    logits, weights, log_prob = teacher_forcing(step, 0, tokens, torch.zeros(1), 5, 3)
    assert seen == [[1, 3], [2, 4]] and log_prob is None
    assert logits.shape == (2, 2, 5) and weights.shape == (2, 2, 3)
    assert logits.argmax(-1).tolist() == tokens.tolist()
    empty = teacher_forcing(step, 0, tokens[:, :0], torch.zeros(1), 5, 3)
    assert empty[0].shape == (2, 0, 5) and empty[1].shape == (2, 0, 3) and empty[2] is None


def test_greedy_search_stops_each_row_at_eos():
    # word ids 0..4, EOS = 4; row 0 says 1, 2 then EOS, row 1 says 3 until max_len
    plans = torch.tensor([[1, 2, 4, 4], [3, 3, 3, 3]])

    def step(y, t):
        logits = torch.full((2, 5), -1.0)
        logits[torch.arange(2), plans[:, t]] = 1.0
        return logits, t + 1, torch.full((2, 3), float(t)), None

    def score(logits):
        return torch.log_softmax(logits, -1)

    tokens, rows, totals = greedy_search(step, 0, torch.zeros(2, dtype=torch.long), 4, 3, score)
    assert tokens == [[1, 2], [3, 3, 3]]
    assert [len(r) for r in rows] == [2, 3] and rows[0][1].tolist() == [1.0, 1.0, 1.0]
    best = float(torch.log_softmax(torch.tensor([1.0, -1, -1, -1, -1]), 0)[0])
    assert totals[0] == pytest.approx(3 * best) and totals[1] == pytest.approx(3 * best)


class Parrot:
    """A decoder that most wants PAD, then BOS, then word 3 (PAD 0, BOS 1, EOS 2); it
    says EOS once ``memory`` steps have passed."""

    pad_idx, bos_idx, eos_idx = 0, 1, 2

    def __init__(self):
        self.inputs = []

    def init_state(self, memory):
        return 0

    def step(self, y_prev, state, memory):
        self.inputs.append(y_prev.tolist())
        logits = torch.tensor([9.0, 8.0, 0.0, 1.0]).repeat(y_prev.shape[0], 1)
        logits[:, 2] = 10.0 if state + 1 >= memory else -1.0
        return logits, state + 1, torch.ones(y_prev.shape[0], 2) / 2, None


def test_greedy_decode_starts_at_bos_and_never_says_pad_or_bos():
    parrot = Parrot()
    tokens, rows, totals = greedy_decode(parrot, 3, 2, torch.device("cpu"), 5)
    assert parrot.inputs == [[1, 1], [3, 3], [3, 3]]
    assert tokens == [[3, 3], [3, 3]] and totals == [12.0, 12.0]
    assert [r.shape for r in rows] == [(2, 2), (2, 2)]
    tokens, _, _ = greedy_decode(Parrot(), 9, 1, torch.device("cpu"), 4)
    assert tokens == [[3, 3, 3, 3]]
