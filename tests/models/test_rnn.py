"""The recurrent encoders of the task models (attnlab.models._rnn)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnlab._recurrent import RNNWeights
from attnlab.feature.multilevel import MaskedRNN
from attnlab.models._rnn import RNN_ENCODERS, masked_rnn, run_packed


def test_run_packed_reads_only_the_real_steps():
    torch.manual_seed(0)
    rnn = nn.LSTM(3, 4, batch_first=True, bidirectional=True)
    x = torch.randn(3, 5, 3)
    lengths = torch.tensor([5, 2, 0])
    weights = RNNWeights(rnn)
    h = run_packed(weights, x, lengths, training=False)
    assert h.shape == (3, 5, 8)
    alone, (h_n, _) = rnn(x[1:2, :2])
    torch.testing.assert_close(h[1, :2], alone[0])
    # the final states are outputs: forward at the last real step, backward at step 0
    torch.testing.assert_close(h[1, 1, :4], h_n[0, 0])
    torch.testing.assert_close(h[1, 0, 4:], h_n[1, 0])
    assert h[1, 2:].abs().sum() == 0  # beyond the length: zero
    noisy = x.clone()
    noisy[1, 2:] = 100.0  # padding never reaches the outputs
    torch.testing.assert_close(run_packed(weights, noisy, lengths, training=False)[:2], h[:2])


class _Encoder(nn.Module):
    """An RNN run by ``run_packed``, its weights built with it (as the task models do)."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn
        self._weights = RNNWeights(rnn)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return run_packed(self._weights, x, lengths, training=self.training)


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_run_packed_traced_gives_the_packed_outputs(cell):
    """Under torch.compile / torch.export (no packing) the same weights run over the
    padded rows: the outputs of the packed run at the real steps, zeros beyond."""
    torch.manual_seed(0)
    enc = _Encoder(cell(3, 4, batch_first=True, bidirectional=True)).eval()
    x, lengths = torch.randn(3, 5, 3), torch.tensor([5, 2, 1])
    program = torch.export.export(enc, (x, lengths), strict=False)
    torch.testing.assert_close(program.module()(x, lengths), enc(x, lengths))


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_run_packed_compiles_in_one_graph(cell):
    """``torch.compile(fullgraph=True)``: the traced run never meets the ``nn.LSTM`` /
    ``nn.GRU`` (Dynamo refuses them), and its outputs and gradients are the packed run's."""
    torch.manual_seed(0)
    enc = _Encoder(cell(3, 4, batch_first=True, bidirectional=True)).eval()
    x, lengths = torch.randn(3, 5, 3), torch.tensor([5, 2, 1])
    params = list(enc.parameters())
    want = enc(x, lengths)
    g_want = torch.autograd.grad(want.square().sum(), params)
    torch._dynamo.reset()
    got = torch.compile(enc, backend="aot_eager", fullgraph=True)(x, lengths)
    g_got = torch.autograd.grad(got.square().sum(), params)
    torch.testing.assert_close(got, want)
    for a, b in zip(g_got, g_want, strict=True):
        torch.testing.assert_close(a, b)


def test_masked_rnn_of_every_encoder_name():
    for name, (cell, bidirectional) in RNN_ENCODERS.items():
        enc = masked_rnn(name, 3, 4)
        assert isinstance(enc, MaskedRNN) and enc.out_dim == (8 if bidirectional else 4)
        assert isinstance(enc.rnn, nn.LSTM if cell == "lstm" else nn.GRU)
        assert enc.rnn.bidirectional == bidirectional
