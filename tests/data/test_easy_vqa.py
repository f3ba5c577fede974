"""easy-VQA (the easy-vqa package): the PNG decoder, the shape regions, the real data, the
cache."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from datahelpers import needs_package

from attnlab.data import DataFormatError, MissingDataError
from attnlab.data import easy_vqa as ev
from attnlab.data.easy_vqa import load_easy_vqa, question_type, read_png, shape_region

needs_easy_vqa = needs_package("easy_vqa", "pip install easy-vqa")


# ----------------------------------------------------------------------------- PNG


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _encode_png(image: np.ndarray, filters: list[int], color_type: int = 2) -> bytes:
    """A PNG written by the specification's filter definitions, one row filter each
    (an encoder independent of the decoder under test)."""
    h, w, c = image.shape
    raw = bytearray()
    prev = [0] * (w * c)
    for y in range(h):
        row = [int(v) for v in image[y].reshape(-1)]
        f = filters[y]
        out = []
        for i, x in enumerate(row):
            a = row[i - c] if i >= c else 0
            b = prev[i]
            cc = prev[i - c] if i >= c else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - cc
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else cc)
            out.append((x - pred) % 256)
        raw.append(f)
        raw.extend(out)
        prev = row
    header = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(raw)))
        + _chunk(b"IEND", b"")
    )


def test_read_png_every_filter():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)
    data = _encode_png(image, [0, 1, 2, 3, 4])
    got = read_png(data)
    assert got.dtype == np.uint8 and got.shape == (5, 4, 3)
    np.testing.assert_array_equal(got, image)


def test_read_png_rgba_drops_alpha(tmp_path):
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (3, 3, 4), dtype=np.uint8)
    path = tmp_path / "x.png"
    path.write_bytes(_encode_png(image, [4, 3, 1], color_type=6))
    np.testing.assert_array_equal(read_png(path), image[..., :3])


def test_read_png_bad_input():
    with pytest.raises(DataFormatError, match="signature"):
        read_png(b"GIF89a....")
    bad_depth = (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 16, 2, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(b"\x00" + b"\x00" * 6))
    )
    with pytest.raises(DataFormatError, match="bit depth 16"):
        read_png(bad_depth)
    # a chunk cut short or an IHDR of the wrong size: DataFormatError (struct.error before)
    with pytest.raises(DataFormatError, match=r"truncated PNG: chunk b'IHDR' announces 13"):
        read_png(b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + b"\x00\x00")
    with pytest.raises(DataFormatError, match="IHDR chunk of 2 bytes"):
        read_png(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", b"\x00\x00"))
    whole = _encode_png(np.zeros((2, 2, 3), dtype=np.uint8), [0, 0])
    cut = whole.index(b"IDAT") + 6  # two bytes into the IDAT data
    with pytest.raises(DataFormatError, match=r"truncated PNG: chunk b'IDAT'"):
        read_png(whole[:cut])


# ----------------------------------------------------------------------------- regions


def test_shape_region_on_a_drawn_square():
    image = np.empty((64, 64, 3), dtype=np.uint8)
    image[:] = (240, 236, 250)
    image[10:20, 30:45] = (0, 128, 128)  # a teal rectangle
    image[19, 30] = (235, 236, 250)  # an edge pixel close to the background is not shape
    expected = np.zeros((64, 64), dtype=bool)
    expected[10:20, 30:45] = True
    expected[19, 30] = False
    np.testing.assert_array_equal(shape_region(image), expected)
    # floats in [0, 1] give the same mask
    np.testing.assert_array_equal(shape_region(image / 255.0), expected)


def test_shape_region_shape_touching_the_border():
    image = np.full((8, 8, 3), 250, dtype=np.uint8)
    image[0:3, 0:8] = (255, 0, 0)  # covers the top border, not most of the border
    mask = shape_region(image)
    assert mask[0:3].all() and not mask[3:].any()


def test_shape_region_bad_input():
    with pytest.raises(ValueError, match=r"expected \[H, W, 3\]"):
        shape_region(np.zeros((4, 4)))
    with pytest.raises(TypeError, match="dtype"):
        shape_region(np.zeros((4, 4, 3), dtype=np.int32))


def test_question_type():
    assert question_type("yes") == "yes/no" and question_type("no") == "yes/no"
    assert question_type("teal") == "color" and question_type("triangle") == "shape"
    with pytest.raises(ValueError):
        question_type("maybe")


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def data():
    return load_easy_vqa()


@needs_easy_vqa
def test_counts_and_answers(data):
    # the package's README: 4000 train images / 38575 questions, 1000 / 9673 test
    assert len(data.train) + len(data.dev) == 38575
    assert len(data.test) == 9673
    assert data.train.images.shape == (3600, 64, 64, 3)
    assert data.dev.images.shape == (400, 64, 64, 3)
    assert data.test.images.shape == (1000, 64, 64, 3)
    assert data.train.images.dtype == np.uint8
    assert len(data.answers) == 13
    assert set(data.answers) == {
        "circle", "rectangle", "triangle", "yes", "no",
        "red", "green", "blue", "black", "gray", "teal", "brown", "yellow",
    }  # fmt: skip
    for part in (data.train, data.dev, data.test):
        assert set(part.answers) == set(data.answers)
        assert len(part.questions) == len(part.question_images) == len(part.question_types)
        assert part.question_images.min() == 0
        assert part.question_images.max() == part.images.shape[0] - 1
    yes_no = sum(t == "yes/no" for t in data.train.question_types + data.dev.question_types)
    assert yes_no == 28407  # the README's count of yes/no training questions


@needs_easy_vqa
def test_dev_keeps_images_together(data):
    assert not set(data.train.image_ids.tolist()) & set(data.dev.image_ids.tolist())
    assert len(set(data.train.image_ids.tolist()) | set(data.dev.image_ids.tolist())) == 4000
    again = load_easy_vqa(seed=1)
    assert set(again.dev.image_ids.tolist()) != set(data.dev.image_ids.tolist())
    assert len(load_easy_vqa(dev_fraction=0.25).dev.image_ids) == 1000


@needs_easy_vqa
def test_questions_match_the_package_files(data):
    import json

    root = ev._root()
    rows = json.loads((root / "test" / "questions.json").read_text())
    assert data.test.questions[5] == rows[5][0] and data.test.answers[5] == rows[5][1]
    assert int(data.test.image_ids[data.test.question_images[5]]) == rows[5][2]
    # the image of a question is the decoded file of its id
    image_id = rows[100][2]
    np.testing.assert_array_equal(
        data.test.image(100), read_png(root / "test" / "images" / f"{image_id}.png")
    )


@needs_easy_vqa
def test_read_png_matches_pillow_on_real_images():
    Image = pytest.importorskip("PIL.Image")
    root = ev._root()
    for i in range(0, 200, 20):
        path = root / "train" / "images" / f"{i}.png"
        with Image.open(path) as im:
            np.testing.assert_array_equal(read_png(path), np.asarray(im.convert("RGB")))


@needs_easy_vqa
def test_shape_region_on_real_images(data):
    for i in range(0, len(data.test), 997):
        image = data.test.image(i)
        mask = shape_region(image)
        assert mask.shape == (64, 64) and mask.dtype == bool
        assert 20 < mask.sum() < 64 * 64 // 2  # non-empty, smaller than the image
        # the pixels outside the region are one colour (the background) up to the threshold
        outside = image[~mask].astype(int)
        assert (np.abs(outside - outside[0]).max(axis=1) <= 2 * 24).all()
        # most pixels inside are the shape's colour, far from the background
        inside = image[mask].astype(int)
        assert np.abs(inside - outside[0]).max(axis=1).mean() > 60


@needs_easy_vqa
def test_images_are_cached_as_npy(fresh_cache, monkeypatch):
    monkeypatch.setattr(ev, "_MEMORY", {})
    first = load_easy_vqa()
    files = sorted((fresh_cache / "easy_vqa").glob("*.npy"))
    assert len(files) == 2  # train and test
    assert {np.load(f, allow_pickle=False).shape[0] for f in files} == {4000, 1000}

    def no_decoding():
        raise AssertionError("decoded the PNGs although the cache holds them")

    monkeypatch.setattr(ev, "_MEMORY", {})
    monkeypatch.setattr(ev, "_decoder", no_decoding)
    second = load_easy_vqa()
    np.testing.assert_array_equal(first.test.images, second.test.images)
    assert first.train.questions == second.train.questions


def test_missing_package(hide_package, monkeypatch):
    monkeypatch.setattr(ev, "_MEMORY", {})
    hide_package("easy_vqa")
    with pytest.raises(MissingDataError, match="pip install easy-vqa"):
        load_easy_vqa()


def test_bad_dev_fraction():
    with pytest.raises(ValueError, match="dev_fraction"):
        load_easy_vqa(dev_fraction=1.0)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        (
            {"dev_fraction": "0.1"},
            ValueError,
            r"dev_fraction must be a number in \[0, 1\), got '0\.1'",
        ),
        (
            {"dev_fraction": float("nan")},
            ValueError,
            r"dev_fraction must be a number in \[0, 1\), got nan",
        ),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1\.5"),
        ({"seed": None}, TypeError, r"seed must be an int, got None"),
    ],
)
def test_load_bad_options_fail_before_loading(hide_package, options, error, message):
    """Checked before the package is looked for: seed=1.5 was truncated to 1, 'x' and
    None failed in int(), dev_fraction='0.1' in a comparison."""
    hide_package("easy_vqa")
    with pytest.raises(error, match=f"^{message}"):
        load_easy_vqa(**options)


@pytest.mark.parametrize("threshold", [float("nan"), -1, 255, "24", True, float("inf")])
def test_shape_region_bad_threshold(threshold):
    """NaN gave an all-False mask and -1 an all-True one without a word; '24' failed
    inside numpy."""
    image = np.zeros((8, 8, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"^threshold must be a number in \[0, 255\)"):
        shape_region(image, threshold=threshold)


def test_shape_region_empty_or_nan_image():
    with pytest.raises(ValueError, match=r"^image has shape \(0, 0, 3\), expected \[H, W, 3\]"):
        shape_region(np.zeros((0, 0, 3), dtype=np.uint8))  # was an IndexError
    with pytest.raises(ValueError, match=r"^image has float values outside \[0, 1\] \(or NaN\)"):
        shape_region(np.full((4, 4, 3), np.nan))  # was a RuntimeWarning and a garbage mask


def test_read_png_takes_bytes_or_a_path(tmp_path, monkeypatch):
    with pytest.raises(TypeError, match="data must be PNG bytes or a path, got int"):
        read_png(0)  # open(0) would read standard input
    png = _encode_png(np.array([[[1, 2, 3]]], dtype=np.uint8), [0])
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "x.png").write_bytes(png)
    assert read_png("~/x.png").tolist() == read_png(png).tolist() == [[[1, 2, 3]]]
