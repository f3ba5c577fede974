"""attnlab.capture_weights: the weights of every attnlab attention module inside a model,
by name, without changing the model's outputs or code."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnlab
from attnlab.capture import takes_need_weights
from attnlab.feature.rotatory import RotatoryAttention
from attnlab.query.transformer import TransformerEncoderLayer


class Classifier(nn.Module):
    """Two encoder layers (multi-head self-attention inside) and additive pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.ModuleList(
            TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0) for _ in range(2)
        )
        self.pool = attnlab.Attention("queryless", d_k=8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.encoder:
            x = layer(x, mask=mask[:, None, :]).context
        return self.out(self.pool(None, x, mask=mask).context)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 8, generator=g)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False]])
    return x, mask


def test_every_attention_module_records_its_weights_and_outputs_do_not_change():
    torch.manual_seed(0)
    model = Classifier().eval()
    x, mask = _batch()
    want = model(x, mask)
    with attnlab.capture_weights(model) as weights:
        got = model(x, mask)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)  # explicit path: rounding
    # the layers and the pooling, not their inner modules that the fused path never calls
    assert sorted(weights) == ["encoder.0", "encoder.0.self_attn", "encoder.1",
                               "encoder.1.self_attn", "pool"]  # fmt: skip
    assert all(len(v) == 1 for v in weights.values())
    (pooled,) = weights["pool"]
    assert pooled.shape == (3, 5) and not pooled.requires_grad
    torch.testing.assert_close(pooled.sum(-1), torch.ones(3))
    assert (pooled[1, 3:] == 0).all() and (pooled[2, 4:] == 0).all()
    # the same weights as a direct call with need_weights=True
    h = model.encoder[0](x, mask=mask[:, None, :]).context
    h = model.encoder[1](h, mask=mask[:, None, :]).context
    direct = model.pool(None, h, mask=mask, need_weights=True).weights
    torch.testing.assert_close(pooled, direct)
    layer0 = model.encoder[0].self_attn(x, mask=mask[:, None, :], need_weights=True).weights
    torch.testing.assert_close(weights["encoder.0.self_attn"][0], layer0)


def test_hooks_go_away_at_the_end_of_the_block_and_on_an_exception():
    model = Classifier().eval()
    x, mask = _batch()
    hooked = [m for m in model.modules() if takes_need_weights(m)]
    assert len(hooked) == 9  # the layers, their self-attention, its two heads, the pooling
    with attnlab.capture_weights(model) as weights:
        model(x, mask)
        model(x, mask)
    assert all(len(v) == 2 for v in weights.values())  # one entry a call, in order
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in hooked)
    with pytest.raises(RuntimeError, match="inside"):
        with attnlab.capture_weights(model):
            raise RuntimeError("inside")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in hooked)
    assert model.pool(None, x).weights is None  # need_weights is the caller's again


def test_weights_in_the_graph_train_an_attention_supervision_loss():
    torch.manual_seed(0)
    model = Classifier()
    x, mask = _batch()
    with attnlab.capture_weights(model, detach=False) as weights:
        model(x, mask)
    (pooled,) = weights["pool"]
    assert pooled.requires_grad
    target = mask.float() / mask.sum(-1, keepdim=True)  # uniform over the real tokens
    (pooled - target).pow(2).sum().backward()
    assert model.pool.score.w.grad is not None and model.pool.score.w.grad.abs().sum() > 0


def test_dict_weights_and_modules_outside_attnlab():
    """Rotatory attention's weights are a dict of its four attentions; torch's own
    nn.MultiheadAttention (not an attnlab module) is left alone; a non-module is refused."""
    torch.manual_seed(0)
    rot = RotatoryAttention(4, 4).eval()
    g = torch.Generator().manual_seed(1)
    left, target, right = (torch.randn(2, n, 4, generator=g) for n in (3, 2, 4))
    with attnlab.capture_weights(rot) as weights:
        rot(left, target, right)
    (w,) = weights[""]
    assert set(w) == {"left", "right", "target_left", "target_right"}
    assert w["left"].shape == (2, 3)
    torch_mha = nn.MultiheadAttention(4, 2, batch_first=True)
    assert not takes_need_weights(torch_mha)
    with attnlab.capture_weights(nn.Sequential(torch_mha)) as weights:
        pass
    assert weights == {}
    with pytest.raises(TypeError, match=r"model must be an nn\.Module, got function"):
        with attnlab.capture_weights(lambda x: x):  # type: ignore[arg-type]
            pass


def test_attention_over_attention_is_captured_by_its_document_attention():
    """``AoAOutput.weights`` is ``s``, the document-level attention, so capture_weights
    records attention-over-attention as it records every other module."""
    torch.manual_seed(0)
    aoa = attnlab.AttentionOverAttention(4, 4)
    doc, question = torch.randn(2, 6, 4), torch.randn(2, 3, 4)
    mask1 = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with attnlab.capture_weights(aoa) as weights:
        out = aoa(doc, question, mask1=mask1)
    assert out.weights is out.s
    (captured,) = weights[""]
    torch.testing.assert_close(captured, out.s)
    torch.testing.assert_close(captured.sum(-1), torch.ones(2))
    assert (captured[1, 4:] == 0).all()
