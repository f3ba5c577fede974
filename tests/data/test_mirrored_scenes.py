"""The mirrored mosaics of attnlab.data.mirrored_scenes: shapes, seeds, the mirror property,
where the hidden block lies, and the one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.data.mirrored_scenes import MirroredScenes, make_mirrored_scenes, mirror_twin


def test_shapes_and_types() -> None:
    d = make_mirrored_scenes(7, 0, size=16, cell=2, block=4, gap=2)
    assert isinstance(d, MirroredScenes) and len(d) == 7 and d.size == 16 and d.block == 4
    assert d.images.shape == (7, 16, 16, 3) and d.images.dtype == np.float32
    assert d.masks.shape == (7, 16, 16) and d.masks.dtype == bool
    assert d.boxes.shape == (7, 2) and d.boxes.dtype == np.int64
    assert 0.0 <= d.images.min() and d.images.max() <= 1.0
    assert len(make_mirrored_scenes(0, 0)) == 0


def test_same_seed_same_images_other_seed_other_images() -> None:
    a, b, c = (make_mirrored_scenes(5, s) for s in (3, 3, 4))
    assert np.array_equal(a.images, b.images) and np.array_equal(a.masks, b.masks)
    assert not np.array_equal(a.images, c.images)


def test_the_right_half_mirrors_the_left_exactly() -> None:
    d = make_mirrored_scenes(20, 1, size=16, cell=2)
    assert np.array_equal(d.images, d.images[:, :, ::-1])
    y, x = 3, 2
    assert mirror_twin(y, x, 16) == (3, 13)
    assert np.array_equal(d.images[:, y, x], d.images[:, 3, 13])
    # cells of one colour, independent across cells
    assert np.array_equal(d.images[:, 0::2, 0::2], d.images[:, 1::2, 1::2])
    assert not np.array_equal(d.images[:, 0, 0], d.images[:, 0, 2])


@pytest.mark.parametrize(("size", "block", "gap"), [(16, 4, 2), (24, 4, 3), (32, 8, 4)])
def test_one_hidden_block_on_one_side_away_from_the_centre(size, block, gap) -> None:
    d = make_mirrored_scenes(200, 2, size=size, block=block, gap=gap)
    assert (d.masks.sum((1, 2)) == block * block).all()
    for mask, (top, left) in zip(d.masks, d.boxes, strict=True):
        assert mask[top : top + block, left : left + block].all()
        cols = np.flatnonzero(mask.any(0))
        assert cols.max() < size // 2 - gap or cols.min() >= size // 2 + gap
    assert (d.boxes % 2 == 0).all()  # aligned to the cells
    sides = d.boxes[:, 1] < size // 2
    assert 0 < sides.mean() < 1  # both sides occur
    twins = d.twin_masks()
    assert not (twins & d.masks).any()
    assert np.array_equal(twins, d.masks[:, :, ::-1])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"size": 15}, "size must be even"),
        ({"size": 16, "cell": 3}, "multiple of cell"),
        ({"block": 6, "gap": 3}, "block \\+ gap must be <= size / 2"),
        ({"block": 0}, "block must be an int >= 1"),
        ({"gap": -1}, "gap must be an int >= 0"),
    ],
)
def test_one_line_errors(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        make_mirrored_scenes(2, 0, **kwargs)
