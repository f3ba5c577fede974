"""Word similarity and analogy benchmarks for word vectors, from the ``gensim`` wheel.

gensim ships three classic evaluation sets as test data (``gensim/test/test_data``), which
attnlab reads in place -- gensim is located on disk, never imported, so ``pip install
--no-deps gensim`` is enough (its numpy/scipy/smart_open dependencies are not needed):

* ``wordsim353.tsv``: WordSim-353 (Finkelstein et al. 2002), 353 word pairs with the mean
  human relatedness rating (0-10); ``# ...`` comment lines, then ``word1 TAB word2 TAB
  score``.
* ``simlex999.txt``: SimLex-999 (Hill, Reichart & Korhonen 2015), 999 pairs rated for
  similarity (not relatedness, 0-10), same layout.
* ``questions-words.txt``: the Google analogy test set (Mikolov et al. 2013), 19,544
  questions ``a b c d`` ("a is to b as c is to d") in 14 sections (``: capital-common-
  countries`` ... ``: gram9-plural-verbs``): 8,869 semantic, 10,675 syntactic (``gram*``).

:func:`evaluate_similarity` correlates the cosine similarity of each pair with the human
scores (Spearman's rho, the usual figure, and Pearson's r; pairs with a word the vectors do
not have are left out and counted). :func:`evaluate_analogies` answers each question by
3CosAdd (Mikolov et al. 2013): ``d* = argmax_{w not in {a,b,c}} cos(w, b - a + c)`` over
unit-normalised vectors, with the candidates restricted to the first ``restrict_vocab``
words (the most frequent, for frequency-ordered vectors such as GloVe), in batches.

Licences: WordSim-353 is distributed by its authors for research (see
https://gabrilovich.com/resources/data/wordsim353/); SimLex-999 likewise (see
https://fh295.github.io/simlex.html); the Google analogy set is Apache-2.0 (word2vec);
gensim itself is LGPL-2.1 (attnlab only reads its data files, it does not link gensim).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from attnlab._checks import check_flags, check_int, check_optional_int, check_path
from attnlab.data._cache import cached_package_file
from attnlab.data._common import DataFormatError, package_file
from attnlab.data._io import open_text
from attnlab.data.glove import WordVectors

__all__ = [
    "AnalogySet",
    "SimilaritySet",
    "evaluate_analogies",
    "evaluate_similarity",
    "load_analogies",
    "load_similarity",
    "read_analogies",
    "read_similarity",
]

DISTRIBUTION = "gensim"
FILES = {"wordsim353": "test/test_data/wordsim353.tsv", "simlex999": "test/test_data/simlex999.txt"}
ANALOGY_FILE = "test/test_data/questions-words.txt"
FORMAT_VERSION = 1


class _TwoColumns:
    """Two columns of equal length (``_columns`` names them); ``len`` is that length."""

    _columns: ClassVar[tuple[str, str]]

    def __post_init__(self) -> None:
        first, second = (getattr(self, name) for name in self._columns)
        if len(first) != len(second):
            raise ValueError(
                f"{len(first)} {self._columns[0]} but {len(second)} {self._columns[1]}"
            )

    def __len__(self) -> int:
        return len(getattr(self, self._columns[0]))

    def to_json(self) -> dict[str, Any]:
        """The set as JSON-compatible data (the two columns and the name)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Any:
        """The inverse of :meth:`to_json`."""
        items, values = (payload[name] for name in cls._columns)
        return cls(tuple(tuple(item) for item in items), tuple(values), payload["name"])  # type: ignore[call-arg]


@dataclasses.dataclass(frozen=True, eq=False)
class SimilaritySet(_TwoColumns):
    """Word pairs with human similarity (or relatedness) scores.

    Attributes:
        pairs: ``(word1, word2)`` per pair, as written in the source.
        scores: the mean human score of each pair.
        name: the set's name (``"wordsim353"``).
    """

    pairs: tuple[tuple[str, str], ...]
    scores: tuple[float, ...]
    name: str = ""

    _columns: ClassVar[tuple[str, str]] = ("pairs", "scores")


@dataclasses.dataclass(frozen=True, eq=False)
class AnalogySet(_TwoColumns):
    """Analogy questions ``a : b :: c : d`` grouped into sections.

    Attributes:
        questions: ``(a, b, c, d)`` per question, as written in the source.
        sections: the section of each question (``"capital-common-countries"``).
        name: the set's name.
    """

    questions: tuple[tuple[str, str, str, str], ...]
    sections: tuple[str, ...]
    name: str = ""

    _columns: ClassVar[tuple[str, str]] = ("questions", "sections")

    @property
    def section_names(self) -> tuple[str, ...]:
        """The sections in the order they first appear."""
        return tuple(dict.fromkeys(self.sections))


# ----------------------------------------------------------------------------- parsing


def parse_similarity(text: str, *, name: str = "", path: object = None) -> SimilaritySet:
    """A similarity set from text: ``#`` comment lines and blank lines are skipped, every
    other line is ``word1<TAB>word2<TAB>score``."""
    pairs, scores = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.rstrip("\r").split("\t")
        if len(fields) != 3 or not fields[0].strip() or not fields[1].strip():
            raise DataFormatError(
                f"expected 'word1<TAB>word2<TAB>score', found {line[:60]!r}", path=path, line=number
            )
        try:
            score = float(fields[2])
        except ValueError:
            raise DataFormatError(
                f"score {fields[2]!r} is not a number", path=path, line=number
            ) from None
        if not np.isfinite(score):
            raise DataFormatError(f"score {fields[2]!r} is not finite", path=path, line=number)
        pairs.append((fields[0].strip(), fields[1].strip()))
        scores.append(score)
    if not pairs:
        raise DataFormatError("no word pairs", path=path)
    return SimilaritySet(tuple(pairs), tuple(scores), name)


def parse_analogies(text: str, *, name: str = "", path: object = None) -> AnalogySet:
    """An analogy set from text: ``: section`` lines open a section, every other non-blank
    line is four words ``a b c d`` separated by white space."""
    questions, sections = [], []
    section = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.startswith(":"):
            section = line[1:].strip()
            if not section:
                raise DataFormatError("a section line without a name", path=path, line=number)
            continue
        words = line.split()
        if len(words) != 4:
            raise DataFormatError(
                f"expected four words 'a b c d', found {len(words)}", path=path, line=number
            )
        if section is None:
            raise DataFormatError(
                "a question before the first ': section' line", path=path, line=number
            )
        questions.append(tuple(words))
        sections.append(section)
    if not questions:
        raise DataFormatError("no analogy questions", path=path)
    return AnalogySet(tuple(questions), tuple(sections), name)  # type: ignore[arg-type]


def _read_text(path: str | Path) -> tuple[Path, str]:
    """``path`` (``~`` expanded) and its text, read as every data file is
    (:func:`~attnlab.data._io.open_text`: compressed files too, one-line errors)."""
    file = check_path(path)
    with open_text(file) as f:
        return file, f.read()


def read_similarity(path: str | Path, *, name: str | None = None) -> SimilaritySet:
    """A similarity file in the WordSim-353 / SimLex-999 layout of gensim's test data."""
    file, text = _read_text(path)
    return parse_similarity(text, name=name or file.stem, path=file)


def read_analogies(path: str | Path, *, name: str | None = None) -> AnalogySet:
    """An analogy file in the layout of word2vec's ``questions-words.txt``."""
    file, text = _read_text(path)
    return parse_analogies(text, name=name or file.stem, path=file)


# ----------------------------------------------------------------------------- loaders


_Set = TypeVar("_Set", bound=_TwoColumns)


def _load_gensim_file(
    key: str, relative: str, read: Callable[[Path], _Set], kind: type[_Set], cache: bool
) -> _Set:
    """``read`` of the gensim wheel's test-data file ``relative``, cached under ``key``."""
    return cached_package_file(
        key,
        package_file("gensim", relative, distribution=DISTRIBUTION, no_deps=True),
        read,
        distribution=DISTRIBUTION,
        format_version=FORMAT_VERSION,
        to_json=kind.to_json,
        from_json=kind.from_json,
        disk=cache,
    )


def load_similarity(name: str = "wordsim353", *, cache: bool = True) -> SimilaritySet:
    """WordSim-353 (``"wordsim353"``) or SimLex-999 (``"simlex999"``) from the gensim wheel.

    Needs ``pip install --no-deps gensim``; :class:`~attnlab.data.MissingDataError` says so
    otherwise. Parsed once and cached.
    """
    if name not in FILES:
        raise ValueError(f"name must be one of {sorted(FILES)}, got {name!r}")
    read = partial(read_similarity, name=name)
    return _load_gensim_file(f"similarity-{name}", FILES[name], read, SimilaritySet, cache)


def load_analogies(*, cache: bool = True) -> AnalogySet:
    """The Google analogy questions (19,544 in 14 sections) from the gensim wheel."""
    read = partial(read_analogies, name="google-analogies")
    return _load_gensim_file("analogies-google", ANALOGY_FILE, read, AnalogySet, cache)


# ----------------------------------------------------------------------------- evaluation


def _check_vectors(vectors: object) -> None:
    if not isinstance(vectors, WordVectors):
        raise TypeError(
            "vectors must be WordVectors (load_glove(), load_spacy_vectors(), ...), got "
            f"{type(vectors).__name__}"
        )


def evaluate_similarity(
    vectors: WordVectors, name: str | SimilaritySet = "wordsim353"
) -> dict[str, Any]:
    """How well the cosine similarities of ``vectors`` rank a similarity set's pairs.

    ``name``: ``"wordsim353"``, ``"simlex999"`` (loaded from gensim) or a
    :class:`SimilaritySet`. Words are looked up with :meth:`WordVectors.lookup` (as written,
    then lower-cased); pairs with a missing word are left out.

    Returns ``{"spearman", "pearson", "n_pairs", "n_oov", "name"}``: the correlations over
    the ``n_pairs`` pairs evaluated (NaN when fewer than two), and the ``n_oov`` left out.
    """
    from scipy import stats

    _check_vectors(vectors)
    if not isinstance(name, str | SimilaritySet):
        raise TypeError(
            f"name must be {' or '.join(repr(n) for n in FILES)} or a SimilaritySet, got {name!r}"
        )
    data = load_similarity(name) if isinstance(name, str) else name
    rows_a, rows_b, human = [], [], []
    n_oov = 0
    for (w1, w2), score in zip(data.pairs, data.scores, strict=True):
        i, j = vectors.lookup(w1), vectors.lookup(w2)
        if i is None or j is None:
            n_oov += 1
            continue
        rows_a.append(i)
        rows_b.append(j)
        human.append(score)
    result: dict[str, Any] = {
        "spearman": float("nan"),
        "pearson": float("nan"),
        "n_pairs": len(human),
        "n_oov": n_oov,
        "name": data.name,
    }
    if len(human) < 2:
        return result
    a = np.asarray(vectors.vectors[rows_a], dtype=np.float64)
    b = np.asarray(vectors.vectors[rows_b], dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = np.divide((a * b).sum(axis=1), norms, out=np.zeros(len(human)), where=norms > 0)
    result["spearman"] = float(stats.spearmanr(cosines, human).statistic)
    result["pearson"] = float(stats.pearsonr(cosines, human).statistic)
    return result


def _check_analogy_options(
    vectors: object,
    max_questions: object,
    questions: object,
    restrict_vocab: object,
    lowercase: object,
    batch_size: object,
) -> None:
    """:func:`evaluate_analogies`' arguments, checked before the questions are loaded."""
    _check_vectors(vectors)
    for option, value in (("max_questions", max_questions), ("restrict_vocab", restrict_vocab)):
        check_optional_int(value, option, error=ValueError)
    check_int(batch_size, "batch_size", 1, error=ValueError)
    check_flags(lowercase=lowercase)
    if questions is not None and not isinstance(questions, AnalogySet):
        raise TypeError(f"questions must be an AnalogySet or None, got {type(questions).__name__}")


def evaluate_analogies(
    vectors: WordVectors,
    max_questions: int | None = None,
    *,
    questions: AnalogySet | None = None,
    restrict_vocab: int | None = 30_000,
    lowercase: bool = True,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Analogy accuracy of ``vectors`` by 3CosAdd over a restricted vocabulary.

    Candidates are the first ``restrict_vocab`` words of ``vectors`` (None: all; with
    ``lowercase`` they are lower-cased and the first spelling of each wins, and the
    questions are lower-cased too). A question with a word outside the candidates is not
    asked (counted in ``n_oov``), as in word2vec's ``compute-accuracy`` and gensim. The
    answer is ``argmax_w cos(w, b - a + c)`` over unit vectors, ``w`` not one of a, b, c.
    ``questions`` defaults to the Google set; ``max_questions`` keeps that many, evenly
    spaced through the file (so every section keeps its share). ``max_questions`` and
    ``restrict_vocab`` are ints >= 1 or None, ``batch_size`` an int >= 1.

    Returns ``{"accuracy": {section: accuracy}, "overall", "semantic", "syntactic",
    "n_questions", "n_correct", "n_oov"}``: accuracies over the questions asked (NaN for a
    group with none); ``semantic`` / ``syntactic`` split the sections by the ``gram``
    prefix of the Google set's syntactic sections.
    """
    import torch

    _check_analogy_options(vectors, max_questions, questions, restrict_vocab, lowercase, batch_size)
    data = questions if questions is not None else load_analogies()
    picked = range(len(data))
    if max_questions is not None:
        if max_questions < len(data):
            picked = sorted(
                set(np.linspace(0, len(data) - 1, max_questions).round().astype(int).tolist())
            )
    limit = len(vectors) if restrict_vocab is None else min(restrict_vocab, len(vectors))
    fold = str.lower if lowercase else str
    index: dict[str, int] = {}
    source_rows: list[int] = []
    for row in range(limit):
        word = fold(vectors.words[row])
        if word not in index:
            index[word] = len(source_rows)
            source_rows.append(row)
    asked: list[tuple[int, int, int, int]] = []
    asked_sections: list[str] = []
    n_oov = 0
    for q in picked:
        ids = [index.get(fold(w)) for w in data.questions[q]]
        if any(i is None for i in ids):
            n_oov += 1
            continue
        asked.append(tuple(ids))  # type: ignore[arg-type]
        asked_sections.append(data.sections[q])
    correct = np.zeros(len(asked), dtype=bool)
    if asked:
        matrix = torch.from_numpy(
            np.asarray(vectors.vectors[np.asarray(source_rows)], dtype=np.float32)
        )
        unit = torch.nn.functional.normalize(matrix, dim=1)
        ids = torch.tensor(asked, dtype=torch.long)
        with torch.no_grad():
            for start in range(0, len(asked), batch_size):
                a, b, c, d = ids[start : start + batch_size].unbind(1)
                target = unit[b] - unit[a] + unit[c]
                scores = target @ unit.T
                rows = torch.arange(len(a))
                for excluded in (a, b, c):
                    scores[rows, excluded] = -torch.inf
                correct[start : start + len(a)] = (scores.argmax(dim=1) == d).numpy()

    def accuracy(mask: np.ndarray) -> float:
        return float(correct[mask].mean()) if mask.any() else float("nan")

    sections = np.asarray(asked_sections, dtype=object)
    syntactic = np.array([s.startswith("gram") for s in asked_sections], dtype=bool)
    return {
        "accuracy": {s: accuracy(sections == s) for s in data.section_names},
        "overall": accuracy(np.ones(len(asked), dtype=bool)),
        "semantic": accuracy(~syntactic),
        "syntactic": accuracy(syntactic),
        "n_questions": len(asked),
        "n_correct": int(correct.sum()),
        "n_oov": n_oov,
    }
