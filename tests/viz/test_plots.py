"""The PNG figures: valid images, the drawn content where it can be checked, and errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("matplotlib", reason="attnlab.viz needs matplotlib (attnlab[eval])")
import matplotlib.image as mpimg

from attnlab.viz import (
    plot_coattention,
    plot_heads,
    plot_hierarchy,
    plot_image_attention,
    plot_matrix,
    plot_scatter,
)


def _decode(png: bytes) -> np.ndarray:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return mpimg.imread(io.BytesIO(png), format="png")


def test_matrix_draws_dark_cells_for_high_weights(tmp_path: Path) -> None:
    w = torch.zeros(3, 4)
    w[1, 2] = 1.0
    png = plot_matrix(
        w, ["a", "b", "c"], ["w", "x", "y", "z"], sure=[(2, 1)], path=tmp_path / "m.png"
    )
    img = _decode(png)
    assert (tmp_path / "m.png").read_bytes() == png
    rgb = img[..., :3]
    # one black cell (weight 1 in the Greys map) and the red gold-link marker
    assert (rgb.sum(-1) < 0.2).any()
    assert ((rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)).any()
    empty = _decode(plot_matrix(torch.zeros(3, 4)))[..., :3]
    # the all-zero matrix has no black cell area of that size
    assert (empty.sum(-1) < 0.2).sum() < (rgb.sum(-1) < 0.2).sum()
    with pytest.raises(ValueError, match="2 dimensions"):
        plot_matrix(torch.zeros(4))
    with pytest.raises(ValueError, match="labels"):
        plot_matrix(torch.zeros(2, 2), ["a"], ["x", "y"])


def test_heads_grid_grows_with_heads() -> None:
    small = _decode(plot_heads(torch.softmax(torch.randn(2, 3, 3), -1)))
    large = _decode(plot_heads(torch.softmax(torch.randn(8, 3, 3), -1), columns=4))
    assert large.shape[0] > small.shape[0]  # two rows of panels instead of one
    with pytest.raises(ValueError, match="3 dimensions"):
        plot_heads(torch.zeros(3, 3))


def test_coattention_hierarchy_image_scatter() -> None:
    _decode(
        plot_coattention(
            torch.randn(3, 4),
            list("abc"),
            list("wxyz"),
            torch.softmax(torch.randn(3), 0),
            torch.softmax(torch.randn(4), 0),
        )
    )
    with pytest.raises(ValueError, match="expected"):
        plot_coattention(torch.randn(3, 4), list("abc"), list("wxyz"), torch.ones(3), torch.ones(3))
    _decode(
        plot_hierarchy(
            [["good", "film"], ["bad", "ending", "though"]],
            [[0.3, 0.7], [0.5, 0.4, 0.1]],
            [0.8, 0.2],
        )
    )
    with pytest.raises(ValueError, match="sentence 0"):
        plot_hierarchy([["a"]], [[0.5, 0.5]], [1.0])
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    grid = np.zeros((8, 8))
    grid[0, 0] = 1.0
    over = _decode(plot_image_attention(image, grid))
    assert over[..., :3].max() > 0.3  # the attended cell is coloured on the black image
    with pytest.raises(ValueError, match="evenly"):
        plot_image_attention(image, np.zeros((5, 5)))
    _decode(
        plot_scatter(
            [0.1, 0.5], [0.0, 0.3], xlabel="max attention", ylabel="median TVD", groups=[0, 1]
        )
    )
    with pytest.raises(ValueError, match="values"):
        plot_scatter([0.1], [0.0, 0.3], xlabel="x", ylabel="y")


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: plot_matrix(np.zeros((0, 3))), ValueError, r"shape \(0, 3\): nothing to draw"),
        (lambda: plot_matrix(np.full((2, 2), np.nan)), ValueError, "weights must be finite"),
        (lambda: plot_heads(np.full((1, 2, 2), np.inf)), ValueError, "weights must be finite"),
        (lambda: plot_matrix(np.eye(2), sure="0-0"), TypeError, "sure must be .*parse_pharaoh"),
        (lambda: plot_matrix(np.eye(2), possible=[(0, -1)]), TypeError, "possible must be"),
        (lambda: plot_heads(np.ones((2, 2, 2)), columns=0), ValueError, "columns must be an int"),
        (lambda: plot_heads(np.ones((2, 2, 2)), columns="2"), ValueError, "columns must be"),
        (
            lambda: plot_image_attention(np.ones((4, 4, 3)), np.ones((2, 2)), alpha=2),
            ValueError,
            r"alpha must be a number in \[0, 1\], got 2",
        ),
        (
            lambda: plot_scatter([1, 2], [1, 2], xlabel="x", ylabel="y", groups=[1]),
            ValueError,
            "groups has 1 entries for 2 points",
        ),
    ],
)
def test_bad_inputs_are_one_line(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_the_png_path(tmp_path: Path, monkeypatch) -> None:
    """Written atomically into folders made on the way; an empty path or a folder is an
    error, and the figure is closed either way (no figure leaks in a loop)."""
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()
    target = tmp_path / "new" / "deeper" / "m.png"
    png = plot_matrix(np.eye(2), path=target)
    assert target.read_bytes() == png
    assert [p.name for p in target.parent.iterdir()] == ["m.png"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path must not be empty"):
        plot_matrix(np.eye(2), path="")
    with pytest.raises(ValueError, match="is a folder: name the PNG file"):
        plot_matrix(np.eye(2), path=tmp_path)
    with pytest.raises(TypeError, match="sure must be"):
        plot_matrix(np.eye(2), sure="0-0")
    assert plt.get_fignums() == open_before


def test_image_attention_takes_the_layouts_a_model_gives() -> None:
    """A PyTorch image ``[3, H, W]`` (it was read as a 3 x 16 image), a grey ``[H, W]`` one,
    a uint8 one whose values are all <= 1 (it was not rescaled) and a model's flat ``[R]``
    region weights draw the same figure as the ``[H, W, 3]`` floats and ``[h, w]`` grid."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    grid = rng.random((4, 4))
    reference = plot_image_attention(pixels / 255.0, grid)
    chw = torch.from_numpy(pixels).permute(2, 0, 1)  # uint8, channels first
    assert plot_image_attention(chw, torch.from_numpy(grid).flatten()) == reference
    assert plot_image_attention(chw.float() / 255, grid) == reference
    grey = pixels[..., 0]
    assert plot_image_attention(grey, grid) == plot_image_attention(
        np.repeat(grey[..., None], 3, axis=-1), grid
    )
    dark = np.zeros((16, 16, 3), dtype=np.uint8)
    dark[:8] = 1  # uint8 values 0 and 1: nearly black, not white where they are 1
    assert plot_image_attention(dark, grid) == plot_image_attention(dark / 255.0, grid)
    for image, weights, message in (
        (
            rng.random((16, 16, 5)),
            grid,
            r"image has shape \(16, 16, 5\), expected \[H, W, C\] or \[C, H, W\] with C = 1, 3 or 4",
        ),
        (rng.random((1, 16, 16, 3)), grid, r"image has shape \(1, 16, 16, 3\), expected"),
        (pixels, rng.random(15), r"weights has 15 values: a flat grid needs a square number"),
    ):
        with pytest.raises(ValueError, match=message):
            plot_image_attention(image, weights)


def test_scatter_takes_tensors_that_require_grad() -> None:
    """``numpy()`` of a tensor that requires grad was a RuntimeError."""
    x = torch.rand(6, requires_grad=True)
    y = torch.rand(6)
    drawn = plot_scatter(x * 1, y, xlabel="a", ylabel="b")
    assert drawn == plot_scatter(x.detach().numpy(), y.numpy(), xlabel="a", ylabel="b")
    with pytest.raises(TypeError, match="x must be a sequence of numbers, got object"):
        plot_scatter(object(), y, xlabel="a", ylabel="b")


def test_hierarchy_and_matrix_take_tensors_and_arrays_as_they_come() -> None:
    """Word and sentence weights that require grad (a model's output) were a RuntimeError;
    gold links as ``np.argwhere`` rows were refused."""
    words = torch.tensor([0.3, 0.7], requires_grad=True)
    sentences = torch.tensor([0.8, 0.2], requires_grad=True)
    text = [["good", "film"], ["bad"]]
    drawn = plot_hierarchy(text, [words * 1, torch.ones(1, requires_grad=True)], sentences * 1)
    assert drawn == plot_hierarchy(text, [[0.3, 0.7], [1.0]], [0.8, 0.2])
    weights = torch.softmax(torch.randn(3, 3), -1)
    gold = np.eye(3, dtype=int)
    assert plot_matrix(weights, sure=np.argwhere(gold)) == plot_matrix(
        weights, sure=[(0, 0), (1, 1), (2, 2)]
    )


@pytest.mark.parametrize(
    ("word_weights", "sentence_weights", "message"),
    [
        ([[float("nan"), 0.5], [1.0]], [0.5, 0.5], "word_weights[0] must be finite"),
        ([[0.2, 0.8], [float("inf")]], [0.5, 0.5], "word_weights[1] must be finite"),
        ([[0.2, 0.8], [1.0]], [float("nan"), 0.5], "sentence_weights must be finite"),
        ([[0.2, 0.8], [1.0]], torch.tensor([0.5, -float("inf")]), "sentence_weights must be"),
        (
            [[0.2, 0.8], [1.0]],
            [[0.5, 0.5], [0.5, 0.5]],
            "sentence_weights has shape (2, 2), expected 1 dimensions",
        ),
        ([[0.2, 0.8], [[1.0]]], [0.5, 0.5], "word_weights[1] has shape (1, 1), expected 1"),
    ],
)
def test_hierarchy_refuses_nan_infinity_and_the_wrong_rank(
    word_weights, sentence_weights, message
) -> None:
    """NaN and infinity were drawn (as 0 and 1) although the module refuses them, and a 2-D
    sentence_weights of two sentences passed the length check and failed in matplotlib."""
    with pytest.raises(ValueError) as caught:
        plot_hierarchy([["good", "film"], ["bad"]], word_weights, sentence_weights)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_hierarchy_draws_an_empty_sentence_and_refuses_an_empty_document() -> None:
    _decode(plot_hierarchy([["good", "film"], []], [[0.3, 0.7], []], [1.0, 0.0]))
    with pytest.raises(ValueError, match="nothing to draw"):
        plot_hierarchy([], [], [])
