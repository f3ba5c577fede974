"""The recurrent encoders of the task models (attnlab.models._rnn)."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.feature.multilevel import MaskedRNN
from attnlab.models._rnn import RNN_ENCODERS, masked_rnn, run_packed


def test_run_packed_reads_only_the_real_steps():
    torch.manual_seed(0)
    rnn = nn.LSTM(3, 4, batch_first=True, bidirectional=True)
    x = torch.randn(3, 5, 3)
    lengths = torch.tensor([5, 2, 0])
    h, (h_n, _) = run_packed(rnn, x, lengths)
    assert h.shape == (3, 5, 8) and h_n.shape == (2, 3, 4)
    alone, _ = rnn(x[1:2, :2])
    torch.testing.assert_close(h[1, :2], alone[0])
    assert h[1, 2:].abs().sum() == 0  # beyond the length: zero
    noisy = x.clone()
    noisy[1, 2:] = 100.0  # padding never reaches the outputs
    torch.testing.assert_close(run_packed(rnn, noisy, lengths)[0][:2], h[:2])


def test_masked_rnn_of_every_encoder_name():
    for name, (cell, bidirectional) in RNN_ENCODERS.items():
        enc = masked_rnn(name, 3, 4)
        assert isinstance(enc, MaskedRNN) and enc.out_dim == (8 if bidirectional else 4)
        assert isinstance(enc.rnn, nn.LSTM if cell == "lstm" else nn.GRU)
        assert enc.rnn.bidirectional == bidirectional
