"""The Inpainter (a CNN with a non-local attention block): shapes, gradients, the kept
visible pixels, the baselines without attention, and why the data needs attention (the
hidden block's twin lies outside the convolutions' receptive field)."""

from __future__ import annotations

import pytest
import torch

from attnlab import registry
from attnlab._checks import ConfigError
from attnlab.data.mirrored_scenes import make_mirrored_scenes
from attnlab.models.inpainter import Inpainter, InpainterOutput, grid_positions
from attnlab.query import MultiHeadAttention


def _batch(n: int = 3, size: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    d = make_mirrored_scenes(n, seed, size=size)
    return torch.from_numpy(d.images), torch.from_numpy(d.masks)


@pytest.mark.parametrize(
    "attention", [None, {"num_heads": 1}, {"score": "additive"}, "mean", "none"]
)
def test_shapes_and_kept_pixels(attention) -> None:
    torch.manual_seed(0)
    model = Inpainter(16, channels=8, attention=attention, position_dim=4)
    images, masks = _batch()
    out = model(images, masks, need_weights=True)
    assert isinstance(out, InpainterOutput)
    assert out.pred.shape == out.filled.shape == (3, 16, 16, 3)
    visible = ~masks
    assert torch.equal(out.filled[visible], images[visible])
    assert torch.equal(out.filled[masks], out.pred[masks])
    if isinstance(attention, str):
        assert out.weights is None
    else:
        assert out.weights.shape == (3, 64, 64)
        assert torch.allclose(out.weights.sum(-1), torch.ones(3, 64), atol=1e-5)
        hidden = model.hidden_cells(masks).flatten(1)
        assert (out.weights * hidden[:, None, :]).abs().max() < 1e-6  # hidden keys unused


def test_the_attention_is_built_from_the_registry() -> None:
    model = Inpainter(16, channels=8, attention={"num_heads": 2})
    assert isinstance(model.attention, MultiHeadAttention)
    assert registry.get("model", "inpainter").cls is Inpainter


def test_gradient_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = Inpainter(16, channels=8, attention={}, positions="learned", position_dim=4)
    images, masks = _batch()
    out = model(images, masks)
    ((out.pred - images) ** 2 * masks[..., None]).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_none_baseline_is_the_same_cnn_without_attention_parameters() -> None:
    with_attention = Inpainter(16, channels=8, attention={})
    without = Inpainter(16, channels=8, attention="none")
    assert without.attention is None
    names = {n for n, _ in without.named_parameters()}
    block = ("attention.", "norm.")  # the non-local block: its norm and its attention
    assert names == {n for n, _ in with_attention.named_parameters() if not n.startswith(block)}
    assert not any(n.startswith(block) for n in names)
    assert without.norm is None


@pytest.mark.parametrize(("size", "block", "gap"), [(16, 4, 2), (32, 8, 4)])  # cpu, paper
def test_the_twin_is_outside_the_receptive_field_of_the_cnn(size, block, gap) -> None:
    # the task's premise: without attention no hidden pixel can see its mirror twin
    torch.manual_seed(0)
    d = make_mirrored_scenes(64, 0, size=size, block=block, gap=gap)
    images = torch.from_numpy(d.images).requires_grad_(True)
    masks = torch.from_numpy(d.masks)
    out = Inpainter(size, channels=8, attention="none")(images, masks)
    (out.pred * masks[..., None]).sum().backward()
    reach = images.grad.abs().sum(-1)
    assert reach.sum() > 0
    assert reach[torch.from_numpy(d.twin_masks())].abs().max() == 0


def test_grid_positions_are_row_and_column_encodings() -> None:
    table = grid_positions(4, "sinusoidal", 6)
    assert table.shape == (16, 6)
    assert torch.equal(table[1, :3], table[2, :3])  # same row
    assert torch.equal(table[0, 3:], table[4, 3:])  # same column
    onehot = grid_positions(4)
    assert onehot.shape == (16, 8) and torch.equal(onehot.sum(1), torch.full((16,), 2.0))
    assert onehot[6].nonzero().flatten().tolist() == [1, 6]  # row 1, column 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"positions": "rotary"}, ConfigError, "positions must be one of"),
        ({"positions": "sinusoidal", "position_dim": 5}, ConfigError, "position_dim must be even"),
        ({"size": 15, "patch": 2}, ConfigError, "size must be a multiple of patch"),
        ({"attention": "uniform"}, ConfigError, "attention must be a spec dict or one of"),
        ({"channels": 0}, ConfigError, "channels must be an int >= 1"),
    ],
)
def test_one_line_config_errors(kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        Inpainter(**{"size": 16, **kwargs})


def test_one_line_input_errors() -> None:
    model = Inpainter(16, channels=4, attention="none")
    images, masks = _batch()
    with pytest.raises(ValueError, match=r"images must be \[B, 16, 16, 3\]"):
        model(images[:, :8], masks)
    with pytest.raises(ValueError, match="masks must be bool"):
        model(images, masks.float())
    # uint8 pixels and float64 images failed in the first convolution, deep in PyTorch
    with pytest.raises(TypeError, match=r"^images has dtype torch.uint8, expected a floating"):
        model((images * 255).to(torch.uint8), masks)
    with pytest.raises(TypeError, match=r"^images has dtype torch.float64 but the parameters"):
        model(images.double(), masks)
    with pytest.raises(TypeError, match=r"^images must be a torch.Tensor, got ndarray$"):
        model(images.numpy(), masks)
    with pytest.raises(TypeError, match=r"^masks must be a torch.Tensor, got list$"):
        model(images, masks.tolist())
