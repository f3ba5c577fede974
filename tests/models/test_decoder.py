"""The helpers of the attentive decoders (attnlab.models._decoder)."""

from __future__ import annotations

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.general.attention import Attention
from attnlab.models._decoder import decoder_attention, greedy_search, teacher_forcing


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
