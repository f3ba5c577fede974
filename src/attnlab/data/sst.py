"""Stanford Sentiment Treebank trees in the bracketed (PTB) format.

One sentence per line, every node ``(LABEL child...)`` and every leaf ``(LABEL word)``, with
sentiment labels 0 (very negative) to 4 (very positive) on every phrase::

    (3 (2 It) (4 (4 (2 's) (4 (3 (2 a) (4 (3 lovely) (2 film))) ...)) (2 .)))

:func:`parse_tree` reads one tree; :func:`read_sst_trees` reads a file (``train.txt``,
``dev.txt``, ``test.txt`` of the treebank's ``trainDevTestTrees_PTB``, which users bring)
into a :class:`TreeDataset`: the tokens, the root label and the labels of all phrases as
token spans. ``labels="binary"`` gives the usual binary task: 0-1 negative, 3-4 positive,
and neutral (2) sentences dropped (neutral phrases are dropped from the phrase list).
:meth:`Tree.binarized` turns any n-ary tree into a binary one (the treebank's own trees are
already binary). Errors name the file, the line and the character position.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from attnlab._checks import check_flags, check_seed
from attnlab.data._common import DataFormatError, assign_splits, check_fractions, check_split
from attnlab.data._io import Source, open_text, source_name
from attnlab.data.containers import TextDataset, _Columns, _tuplify

__all__ = ["FINE_LABELS", "Tree", "TreeDataset", "TreeExample", "parse_tree", "read_sst_trees"]

FINE_LABELS = ("very negative", "negative", "neutral", "positive", "very positive")
BINARY_LABELS = ("negative", "positive")
_BINARY = {0: 0, 1: 0, 2: None, 3: 1, 4: 1}
_UNESCAPE = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


@dataclasses.dataclass(frozen=True)
class Tree:
    """A labelled tree node: a leaf has a ``word`` and no children."""

    label: int
    children: tuple[Tree, ...] = ()
    word: str | None = None

    @property
    def is_leaf(self) -> bool:
        return self.word is not None

    def leaves(self) -> list[str]:
        """The words, left to right."""
        if self.word is not None:
            return [self.word]
        return [w for child in self.children for w in child.leaves()]

    def spans(self) -> list[tuple[int, int, int]]:
        """``(start, end, label)`` of every node (leaves included), token offsets, end
        exclusive, in pre-order (the root, ``(0, n, root label)``, comes first)."""
        out: list[tuple[int, int, int]] = []

        def walk(node: Tree, start: int) -> int:
            i = len(out)
            out.append((start, start, node.label))
            end = start + 1 if node.word is not None else start
            for child in node.children:
                end = walk(child, end)
            out[i] = (start, end, node.label)
            return end

        walk(self, 0)
        return out

    def binarized(self) -> Tree:
        """The same tree with every node of more than two children right-factored:
        ``(L a b c)`` becomes ``(L a (L b c))``; the new inner nodes carry the parent's label."""
        if self.word is not None:
            return self
        kids = [c.binarized() for c in self.children]
        while len(kids) > 2:
            kids = [*kids[:-2], Tree(self.label, (kids[-2], kids[-1]))]
        return Tree(self.label, tuple(kids))

    def __str__(self) -> str:
        if self.word is not None:
            return f"({self.label} {self.word})"
        return f"({self.label} {' '.join(str(c) for c in self.children)})"


def parse_tree(text: str, *, unescape: bool = True) -> Tree:
    """Parse one bracketed tree ``(3 (2 It) (4 ...))`` with integer labels.

    ``unescape`` turns the treebank's ``-LRB-`` / ``-RRB-`` (and square / curly variants)
    back into brackets. Raises ``ValueError`` naming the character position of a problem
    (a :class:`~attnlab.data.DataFormatError` ``"tree nested too deeply"`` for a tree deeper
    than Python's recursion limit allows).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str holding one tree, got {type(text).__name__}")
    check_flags(unescape=unescape)
    reader = _TreeReader(text, unescape)
    if not reader.tokens:
        raise ValueError("empty tree")
    try:
        tree = reader.node()
    except RecursionError:  # one Python frame per level: a line nested deeper than the stack
        raise DataFormatError(str(reader.fail("tree nested too deeply"))) from None
    if reader.pos != len(reader.tokens):
        raise reader.fail("text after the end of the tree")
    return tree


class _TreeReader:
    """Recursive-descent reader of one bracketed tree (see :func:`parse_tree`)."""

    def __init__(self, text: str, unescape: bool) -> None:
        self.text, self.unescape = text, unescape
        self.tokens = [(m.group(), m.start()) for m in _TOKEN.finditer(text)]
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][0] if self.pos < len(self.tokens) else None

    def fail(self, message: str, at: int | None = None) -> ValueError:
        if at is None:
            at = self.tokens[self.pos][1] if self.pos < len(self.tokens) else len(self.text)
        return ValueError(f"{message} at character {at + 1}")

    def label(self) -> int:
        tok = self.peek()
        if tok is None or tok in "()":
            raise self.fail("expected a label after '('")
        raw, at = self.tokens[self.pos]
        try:
            label = int(raw)
        except ValueError:
            raise self.fail(f"label {raw!r} is not an integer", at) from None
        self.pos += 1
        return label

    def node(self) -> Tree:
        if self.peek() != "(":
            raise self.fail("expected '('")
        self.pos += 1
        label = self.label()
        tok = self.peek()
        if tok is None:
            raise self.fail("unbalanced brackets: missing ')'")
        if tok not in "()":  # a leaf
            self.pos += 1
            if self.peek() != ")":
                raise self.fail("a leaf holds exactly one word; expected ')'")
            self.pos += 1
            return Tree(label, word=_UNESCAPE.get(tok, tok) if self.unescape else tok)
        if tok == ")":
            raise self.fail("a node without a word or children")
        children = []
        while self.peek() == "(":
            children.append(self.node())
        if self.peek() != ")":
            missing = self.peek() is None
            raise self.fail("unbalanced brackets: missing ')'" if missing else "expected ')'")
        self.pos += 1
        return Tree(label, tuple(children))


class TreeExample(NamedTuple):
    tokens: tuple[str, ...]
    label: int
    id: str
    split: str
    phrases: tuple[tuple[int, int, int], ...]
    tree: Tree


@dataclasses.dataclass(frozen=True, eq=False)
class TreeDataset(_Columns[TreeExample]):
    """Sentences of a treebank with their root label and phrase labels.

    Attributes:
        tokens: the words of each sentence.
        labels: the root label, an index into ``label_names``.
        label_names: :data:`FINE_LABELS` (five classes) or ``("negative", "positive")``.
        ids: ``"<file stem>-<line>"`` per sentence.
        splits: from the file name (``train`` / ``dev`` / ``test``), ``split=``, or seeded.
        phrases: per sentence, ``(start, end, label)`` for every labelled node (token offsets,
            end exclusive, label in the same scheme as ``labels``); in binary mode neutral
            phrases are left out.
        trees: the parsed trees (labels as in the file, 0-4).
    """

    tokens: tuple[tuple[str, ...], ...]
    labels: tuple[int, ...]
    label_names: tuple[str, ...]
    ids: tuple[str, ...]
    splits: tuple[str, ...]
    phrases: tuple[tuple[tuple[int, int, int], ...], ...]
    trees: tuple[Tree, ...]
    name: str = ""

    _item_fields: ClassVar[tuple[str, ...]] = (
        "tokens",
        "labels",
        "ids",
        "splits",
        "phrases",
        "trees",
    )
    _example: ClassVar[Callable[..., Any]] = TreeExample

    def to_json(self) -> dict[str, Any]:
        """The dataset as JSON-compatible data; a tree is ``[label, word]`` (a leaf) or
        ``[label, [child, ...]]``."""
        payload = super().to_json()
        payload["trees"] = [_tree_to_json(t) for t in self.trees]
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> TreeDataset:
        """The inverse of :meth:`to_json`."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: _tuplify(v) for k, v in payload.items() if k in fields and k != "trees"}
        return cls(**values, trees=tuple(_tree_from_json(t) for t in payload["trees"]))

    def to_text_dataset(self) -> TextDataset:
        """The sentences (tokens joined by spaces) with their root labels."""
        return TextDataset(
            texts=tuple(" ".join(t) for t in self.tokens),
            labels=self.labels,
            label_names=self.label_names,
            ids=self.ids,
            splits=self.splits,
            name=self.name,
        )


def read_sst_trees(
    source: Source,
    *,
    labels: str = "fine",
    split: str | None = None,
    lower: bool = False,
    binarize: bool = False,
    unescape: bool = True,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> TreeDataset:
    """Read an SST PTB tree file (one tree per line) into a :class:`TreeDataset`.

    Args:
        source: a path or an open text stream.
        labels: ``"fine"`` (five classes, 0-4) or ``"binary"`` (negative / positive,
            neutral sentences dropped).
        split: the split of every sentence; by default the file stem when it is ``train``,
            ``dev`` or ``test``, else a seeded split (``seed``, ``fractions``).
        lower: lower-case the tokens.
        binarize: right-factor nodes with more than two children (:meth:`Tree.binarized`).
        unescape: turn ``-LRB-`` / ``-RRB-`` back into brackets.
    """
    if labels not in ("fine", "binary"):
        raise ValueError(f"labels must be 'fine' or 'binary', got {labels!r}")
    where = source_name(source)
    stem = Path(where).name.split(".")[0].lower()
    if split is None and stem in ("train", "dev", "test"):
        split = stem
    check_split(split)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(lower=lower, binarize=binarize, unescape=unescape)
    rows = []
    for line_no, tree in _trees(source, where, unescape=unescape):
        if binarize:
            tree = tree.binarized()
        spans = tree.spans()
        for start, end, lab in spans:
            if not 0 <= lab <= 4:
                raise DataFormatError(
                    f"sentiment label {lab} of the phrase at tokens {start}:{end} is outside 0-4",
                    path=where,
                    line=line_no,
                )
        words = tuple(w.lower() for w in tree.leaves()) if lower else tuple(tree.leaves())
        if labels == "binary":
            root = _BINARY[tree.label]
            if root is None:
                continue
            phrases = tuple((s, e, _BINARY[lab]) for s, e, lab in spans if _BINARY[lab] is not None)
        else:
            root = tree.label
            phrases = tuple(spans)
        rows.append((words, root, f"{stem}-{line_no}", phrases, tree))
    if not rows:
        raise DataFormatError("no trees", path=where)
    ids = tuple(r[2] for r in rows)
    splits = (split,) * len(rows) if split else assign_splits(ids, fractions=fractions, seed=seed)
    return TreeDataset(
        tokens=tuple(r[0] for r in rows),
        labels=tuple(r[1] for r in rows),
        label_names=FINE_LABELS if labels == "fine" else BINARY_LABELS,
        ids=ids,
        splits=tuple(splits),
        phrases=tuple(r[3] for r in rows),  # type: ignore[misc]
        trees=tuple(r[4] for r in rows),
        name=where,
    )


def _tree_to_json(tree: Tree) -> list[Any]:
    if tree.word is not None:
        return [tree.label, tree.word]
    return [tree.label, [_tree_to_json(c) for c in tree.children]]


def _tree_from_json(data: Any) -> Tree:
    label, rest = data
    if isinstance(rest, str):
        return Tree(int(label), word=rest)
    return Tree(int(label), tuple(_tree_from_json(c) for c in rest))


def _trees(source: Source, where: str, *, unescape: bool) -> Iterator[tuple[int, Tree]]:
    with open_text(source) as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, parse_tree(line, unescape=unescape)
            except ValueError as error:
                raise DataFormatError(str(error), path=where, line=line_no) from None
