"""A minimal PNG encoder (8-bit RGB, no library) and PNG data URIs, for inline pictures."""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Sequence

__all__ = ["PNG_SIGNATURE", "data_uri", "png_bytes", "png_data_uri"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, payload: bytes) -> bytes:
    """One PNG chunk: length, type, payload, CRC-32 of type and payload."""
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload) & 0xFFFFFFFF)
    )


def _scanlines(pixels: Sequence[Sequence[Sequence[float]]], width: int) -> bytes:
    """The raw image data: each row as filter byte 0 then its RGB bytes (clipped to [0, 1],
    non-finite values black)."""
    raw = bytearray()
    for row in pixels:
        if len(row) != width:
            raise ValueError("png_bytes: rows of the image differ in length")
        raw.append(0)  # filter type 0 (none)
        for px in row:
            if len(px) < 3:
                raise ValueError("png_bytes: every pixel needs 3 channels (RGB)")
            for c in px[:3]:
                c = float(c)
                raw.append(0 if not math.isfinite(c) else round(min(max(c, 0.0), 1.0) * 255))
    return bytes(raw)


def png_bytes(pixels: Sequence[Sequence[Sequence[float]]]) -> bytes:
    """An 8-bit RGB PNG of an ``H x W x 3`` nested sequence of floats in [0, 1]."""
    height = len(pixels)
    width = len(pixels[0]) if height else 0
    if height == 0 or width == 0:
        raise ValueError("png_bytes needs an image of at least 1 x 1 pixels")
    raw = _scanlines(pixels, width)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` of the bytes of a PNG file."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def png_data_uri(pixels: Sequence[Sequence[Sequence[float]]]) -> str:
    """``data:image/png;base64,...`` of :func:`png_bytes`."""
    return data_uri(png_bytes(pixels))
