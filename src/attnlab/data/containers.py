"""The small, immutable datasets every loader returns.

All are column-oriented frozen dataclasses of tuples (one entry per item), so a dataset is
cheap to cache and share, and safe to hand around: nothing can change it in place.

* :class:`TextDataset`: texts with one label each (sentence classification).
* :class:`DocumentDataset`: documents as lists of sentences, one label per document
  (hierarchical attention), with the sentences' own ratings where the source has them.
* :class:`TargetDataset`: a text split around a target phrase into left context, target
  and right context, with the sentiment towards the target (target-dependent sentiment).

Common to all: ``len(ds)``, ``ds[i]`` (a named tuple of the item's fields),
``ds.split("train")`` (the items of one split, in their original order), ``ds.subset(idx)``,
``ds.label_counts()``, and ``ds.splits`` / ``ds.ids`` / ``ds.labels`` / ``ds.label_names``.
Labels are integers indexing ``label_names`` (distinct names). A loader of a source without
splits builds its dataset with ``Dataset.seeded(split, seed=..., fractions=..., **columns)``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from attnlab.data._common import SPLIT_NAMES, assign_splits, first_repeat, simple_tokenize

__all__ = [
    "DocumentDataset",
    "DocumentExample",
    "TargetDataset",
    "TargetExample",
    "TextDataset",
    "TextExample",
]


def _tuplify(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_tuplify(v) for v in value)
    return value


def tokenize_texts(
    texts: Iterable[str],
    tokenizer: Callable[[str], list[str]] | None = None,
    *,
    lower: bool = False,
) -> list[list[str]]:
    """Each text as tokens: ``tokenizer(text)``, by default :func:`simple_tokenize`
    (lower-cased when ``lower``)."""
    if tokenizer is None:
        return [simple_tokenize(t, lower=lower) for t in texts]
    return [[w.lower() for w in tokenizer(t)] if lower else tokenizer(t) for t in texts]


E = TypeVar("E")


class _Columns(Generic[E]):
    """Per-item columns (``_item_fields``) of equal length plus dataset-level fields; item
    ``i`` is the named tuple ``_example`` of the columns' ``i``-th entries, in the order
    of ``_item_fields`` (``None`` for an absent optional column)."""

    _item_fields: ClassVar[tuple[str, ...]]
    _example: ClassVar[Callable[..., Any]]

    ids: tuple[str, ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    splits: tuple[str, ...]

    def __post_init__(self) -> None:  # called by each dataclass subclass
        self._validate()

    def _validate(self) -> None:
        n = len(self.ids)
        for name in self._item_fields:
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(
                    f"{type(self).__name__}.{name} has {len(column)} entries, expected one "
                    f"per item ({n}, the length of ids)"
                )
        unknown = set(self.splits) - set(SPLIT_NAMES)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.splits must hold {', '.join(map(repr, SPLIT_NAMES))}, "
                f"found {sorted(unknown, key=str)[0]!r}"
            )
        self._validate_labels()

    def _validate_labels(self) -> None:
        repeat = first_repeat(self.label_names)
        if repeat is not None:
            first, again = repeat
            raise ValueError(
                f"{type(self).__name__}.label_names repeats {self.label_names[again]!r} "
                f"(at {first} and {again}); each label needs its own name"
            )
        k = len(self.label_names)
        bad = [
            lab
            for lab in self.labels
            if not (isinstance(lab, int) and not isinstance(lab, bool) and 0 <= lab < k)
        ]
        if bad:
            raise ValueError(
                f"{type(self).__name__}.labels must index label_names {self.label_names} "
                f"(0..{k - 1}), found {bad[0]!r}"
            )

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> E:
        columns = (getattr(self, name) for name in self._item_fields)
        return self._example(*(None if c is None else c[i] for c in columns))  # type: ignore[return-value]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def subset(self, indices: Iterable[int]) -> Any:
        """The items at ``indices``, in that order, as a dataset of the same type."""
        idx = list(indices)
        columns = {
            name: (
                None if getattr(self, name) is None else tuple(getattr(self, name)[i] for i in idx)
            )
            for name in self._item_fields
        }
        return dataclasses.replace(self, **columns)

    def split(self, name: str) -> Any:
        """The items whose split is ``name`` (``"train"``, ``"dev"`` or ``"test"``)."""
        names = sorted(set(self.splits))
        if name not in names:
            raise ValueError(f"no split {name!r} in {type(self).__name__}; splits: {names}")
        return self.subset(i for i, s in enumerate(self.splits) if s == name)

    @classmethod
    def seeded(
        cls,
        split: str | None,
        *,
        seed: int,
        fractions: tuple[float, float, float],
        **fields: Any,
    ) -> Any:
        """A dataset of ``fields`` (list columns become tuples) with the seeded
        :func:`~attnlab.data.assign_splits` by its ``groups`` column where it has one, else
        by ``ids``: all of it when ``split`` is None, else the items of that split. The end
        of every loader of a source that has no splits of its own."""
        columns = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        groups = columns.get("groups") or columns["ids"]
        ds = cls(splits=assign_splits(groups, fractions=fractions, seed=seed), **columns)
        return ds if split is None else ds.split(split)

    def label_counts(self) -> dict[str, int]:
        """How many items carry each label name."""
        counts = Counter(self.labels)
        return {name: counts.get(i, 0) for i, name in enumerate(self.label_names)}

    def to_json(self) -> dict[str, Any]:
        """The dataset as JSON-compatible data (lists and scalars)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Any:
        """The inverse of :meth:`to_json`."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: _tuplify(v) for k, v in payload.items() if k in names})


class TextExample(NamedTuple):
    text: str
    label: int
    id: str
    split: str
    score: float | None
    group: str | None


@dataclasses.dataclass(frozen=True, eq=False)
class TextDataset(_Columns[TextExample]):
    """Texts with one label each.

    Attributes:
        texts: the raw texts (for pre-tokenised sources, tokens joined by single spaces).
        labels: the label of each text, an index into ``label_names``.
        label_names: the names of the labels, e.g. ``("negative", "positive")``.
        ids: a unique id per text (the source's id where it has one).
        splits: ``"train"``, ``"dev"`` or ``"test"`` per text.
        scores: a real-valued rating per text where the source has one (else None).
        groups: the unit the text belongs to (a movie, a document) where there is one; the
            seeded splits keep a group together.
        name: where the data came from.
    """

    texts: tuple[str, ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    scores: tuple[float, ...] | None = None
    groups: tuple[str, ...] | None = None
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = (
        "texts",
        "labels",
        "ids",
        "splits",
        "scores",
        "groups",
    )
    _example: ClassVar[Callable[..., Any]] = TextExample

    def tokens(
        self, tokenizer: Callable[[str], list[str]] | None = None, *, lower: bool = False
    ) -> list[list[str]]:
        """Each text as tokens: ``tokenizer(text)``, by default :func:`simple_tokenize`."""
        return tokenize_texts(self.texts, tokenizer, lower=lower)


class DocumentExample(NamedTuple):
    sentences: tuple[str, ...]
    label: int
    id: str
    split: str
    score: float | None
    sentence_ids: tuple[str, ...]
    sentence_scores: tuple[float, ...] | None


@dataclasses.dataclass(frozen=True, eq=False)
class DocumentDataset(_Columns[DocumentExample]):
    """Documents as sequences of sentences, with one label per document.

    Attributes:
        documents: per document, its sentences in order.
        labels, label_names, ids, splits: as in :class:`TextDataset`, per document.
        scores: a real-valued rating per document where there is one (else None).
        sentence_ids: per document, the source's id of each sentence.
        sentence_scores: per document, a rating per sentence where the source has them.
        name: where the data came from.
    """

    documents: tuple[tuple[str, ...], ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    sentence_ids: tuple[tuple[str, ...], ...]
    scores: tuple[float, ...] | None = None
    sentence_scores: tuple[tuple[float, ...], ...] | None = None
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = (
        "documents",
        "labels",
        "ids",
        "splits",
        "scores",
        "sentence_ids",
        "sentence_scores",
    )
    _example: ClassVar[Callable[..., Any]] = DocumentExample

    def __post_init__(self) -> None:
        self._validate()
        for i, (doc, sids) in enumerate(zip(self.documents, self.sentence_ids, strict=True)):
            if len(doc) != len(sids) or (
                self.sentence_scores is not None and len(self.sentence_scores[i]) != len(doc)
            ):
                raise ValueError(
                    f"document {self.ids[i]!r} has {len(doc)} sentences but a different "
                    "number of sentence ids or sentence scores"
                )


class TargetExample(NamedTuple):
    left: tuple[str, ...]
    target: tuple[str, ...]
    right: tuple[str, ...]
    label: int
    id: str
    split: str
    text: str
    span: tuple[int, int]


@dataclasses.dataclass(frozen=True, eq=False)
class TargetDataset(_Columns[TargetExample]):
    """Texts split around a target phrase, labelled with the sentiment towards the target.

    Attributes:
        left: the tokens before the target.
        target: the tokens of the target phrase (one or more).
        right: the tokens after the target.
        labels, label_names, ids, splits: as in :class:`TextDataset`.
        texts: the whole text.
        spans: the target's character offsets ``(start, end)`` in the text, so that
            ``text[start:end]`` is the target as written.
        name: where the data came from.
    """

    left: tuple[tuple[str, ...], ...]
    target: tuple[tuple[str, ...], ...]
    right: tuple[tuple[str, ...], ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    texts: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = (
        "left",
        "target",
        "right",
        "labels",
        "ids",
        "splits",
        "texts",
        "spans",
    )
    _example: ClassVar[Callable[..., Any]] = TargetExample

    def __post_init__(self) -> None:
        self._validate()
        empty = [self.ids[i] for i, t in enumerate(self.target) if not t]
        if empty:
            raise ValueError(f"TargetDataset: the target of item {empty[0]!r} has no tokens")


def split_around(
    text: str, start: int, end: int, tokenizer: Callable[[str], list[str]] = simple_tokenize
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """``text`` as (left tokens, target tokens, right tokens) around ``text[start:end]``."""
    return (
        tuple(tokenizer(text[:start])),
        tuple(tokenizer(text[start:end])),
        tuple(tokenizer(text[end:])),
    )
