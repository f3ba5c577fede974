"""Generated scenes: seeded, masks consistent with the pixels and the captions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab.data.scenes import COLORS, SHAPES, make_scenes, render_shape


def test_seeded_and_deterministic() -> None:
    a, b = make_scenes(8, seed=3), make_scenes(8, seed=3)
    assert np.array_equal(a.images, b.images) and a.captions == b.captions
    c = make_scenes(8, seed=4)
    assert not np.array_equal(a.images, c.images)


def test_captions_describe_the_objects_left_to_right() -> None:
    s = make_scenes(40, seed=0, min_objects=1, max_objects=3, size=48, object_size=8)
    for i in range(len(s)):
        k = int(s.counts[i])
        assert 1 <= k <= 3 and len(s.captions[i]) == 3 * k - 1
        xs = []
        for j in range(k):
            m = s.masks[i, j]
            assert m.any()
            xs.append(np.nonzero(m)[1].mean())
            # the object's pixels hold its colour (noise aside)
            rgb = s.images[i][m].mean(0) / 255.0
            assert np.abs(rgb - np.array(COLORS[s.colors[i][j]])).max() < 0.05
            assert s.captions[i][3 * j : 3 * j + 2] == (s.colors[i][j], s.shapes[i][j])
            assert s.word_objects[i][3 * j : 3 * j + 2] == (j, j)
        assert xs == sorted(xs)  # left to right
        assert not s.masks[i, k:].any()
        # objects never overlap
        assert (s.masks[i, :k].sum(0) <= 1).all()


def test_shapes_by_hand() -> None:
    sq = render_shape("square", 8, 4.0, 4.0, 4)
    assert sq.sum() == 16 and sq[2:6, 2:6].all()
    circle = render_shape("circle", 8, 4.0, 4.0, 4)
    assert 9 <= circle.sum() < 16  # inside the square, smaller
    tri = render_shape("triangle", 8, 4.0, 4.0, 4)
    assert tri[5].sum() > tri[2].sum()  # wider at the bottom
    with pytest.raises(ValueError, match="shape"):
        render_shape("star", 8, 4.0, 4.0, 4)


def test_options_restrict_colours_and_shapes() -> None:
    s = make_scenes(30, seed=1, colors=2, shapes=1)
    assert {c for cs in s.colors for c in cs} <= set(list(COLORS)[:2])
    assert {x for xs in s.shapes for x in xs} == {SHAPES[0]}


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        make_scenes(1, 0, size=16, max_objects=3, object_size=8)
    with pytest.raises(ValueError, match="colors"):
        make_scenes(1, 0, colors=9)
    with pytest.raises(ValueError, match="max_objects"):
        make_scenes(1, 0, min_objects=3, max_objects=2)
    # noise must be a finite number >= 0: inf (accepted: images all 0/255) and text (a
    # bare TypeError from the comparison) are one line naming it
    for noise in (math.inf, math.nan, -0.1, "x"):
        with pytest.raises(ValueError, match=r"^noise must be a number >= 0, got "):
            make_scenes(1, 0, noise=noise)
    with pytest.raises(TypeError, match=r"^seed must be an int, got 1\.5"):
        make_scenes(1, 1.5)
