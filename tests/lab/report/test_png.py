"""attnlab.lab.report.png: the report's own PNG encoder, read back by hand (chunk layout,
CRC-32, zlib, filter bytes) against the PNG specification."""

from __future__ import annotations

import base64
import math
import struct
import zlib

import pytest

from attnlab.lab.report.png import PNG_SIGNATURE, data_uri, png_bytes, png_data_uri


def _read(png: bytes) -> tuple[dict[str, int], list[list[tuple[int, int, int]]]]:
    """The IHDR fields and the RGB rows of an 8-bit RGB PNG without interlacing."""
    assert png[:8] == PNG_SIGNATURE
    pos, chunks = 8, []
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, payload = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + payload) & 0xFFFFFFFF, kind
        chunks.append((kind, payload))
        pos += 12 + length
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"] and chunks[2][1] == b""
    w, h, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    header = {"width": w, "height": h, "depth": depth, "colour": colour}
    assert (comp, filt, interlace) == (0, 0, 0)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == h * (1 + 3 * w)
    rows = []
    for r in range(h):
        line = raw[r * (1 + 3 * w) : (r + 1) * (1 + 3 * w)]
        assert line[0] == 0  # filter type None
        rows.append([tuple(line[1 + 3 * c : 4 + 3 * c]) for c in range(w)])
    return header, rows


def test_pixels_round_trip():
    pixels = [
        [(0.0, 0.5, 1.0), (1.0, 0.0, 0.0), (0.2, 0.4, 0.6)],
        [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.1, 0.9, 0.5)],
    ]
    header, rows = _read(png_bytes(pixels))
    assert header == {"width": 3, "height": 2, "depth": 8, "colour": 2}
    want = [[tuple(round(c * 255) for c in px) for px in row] for row in pixels]
    assert rows == want
    assert rows[0][0] == (0, 128, 255)


def test_out_of_range_values_are_clipped_and_non_finite_ones_black():
    pixels = [[(-0.5, 1.7, math.nan), (math.inf, -math.inf, 0.5, 0.9)]]  # a 4th channel: ignored
    _, rows = _read(png_bytes(pixels))
    assert rows == [[(0, 255, 0), (0, 0, 128)]]


def test_bad_images_are_refused():
    with pytest.raises(ValueError, match="at least 1 x 1"):
        png_bytes([])
    with pytest.raises(ValueError, match="at least 1 x 1"):
        png_bytes([[]])
    with pytest.raises(ValueError, match="rows of the image differ in length"):
        png_bytes([[(0, 0, 0)], [(0, 0, 0), (1, 1, 1)]])
    with pytest.raises(ValueError, match="3 channels"):
        png_bytes([[(0, 0)]])


def test_data_uris():
    png = png_bytes([[(1.0, 0.0, 0.0)]])
    uri = png_data_uri([[(1.0, 0.0, 0.0)]])
    assert uri == data_uri(png)
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix) and base64.b64decode(uri[len(prefix) :]) == png
