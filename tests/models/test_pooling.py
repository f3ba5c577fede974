"""The uniform baseline of the task models (attnlab.models._pooling)."""

from __future__ import annotations

import torch

from attnlab.general.attention import Attention
from attnlab.models._pooling import uniform_context, uniform_weights


def test_uniform_weights_and_context():
    mask = torch.tensor([[True, True, False, False], [False, False, False, False]])
    w = uniform_weights(mask, torch.float64)
    assert w.dtype == torch.float64 and w.tolist() == [[0.5, 0.5, 0.0, 0.0], [0.0] * 4]
    values = torch.arange(8, dtype=torch.float64).reshape(1, 4, 2).expand(2, 4, 2)
    assert uniform_context(None, w, values).tolist() == [[1.0, 2.0], [0.0, 0.0]]
    attention = Attention("additive", d_q=2, d_k=2, value_dim=3).double()
    got = uniform_context(attention, w, values)
    torch.testing.assert_close(got, (w[..., None] * attention.value_proj(values)).sum(1))
