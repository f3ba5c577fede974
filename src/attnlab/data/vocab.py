"""Vocabularies: the token <-> index mapping models use, built from a corpus or word list.

``Vocab`` puts its special tokens first (by default ``<pad>`` at 0 and ``<unk>`` at 1),
then the tokens in the order given. Unknown tokens encode to ``<unk>`` (or raise
``KeyError`` when the vocabulary has no unknown token)::

    vocab = Vocab.from_corpus([["a", "good", "film"], ["a", "bad", "film"]])
    vocab.encode(["a", "great", "film"])   # [2, 1, 3]: "great" is unknown
"""

from __future__ import annotations

import numbers
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from attnlab._checks import check_int, check_optional_int

__all__ = ["PAD", "UNK", "Vocab"]

PAD = "<pad>"
UNK = "<unk>"


class Vocab:
    """An immutable token <-> index mapping.

    Args:
        tokens: the ordinary tokens, in index order (duplicates and specials are skipped).
        specials: tokens placed first, in order (default ``("<pad>", "<unk>")``).
        unk: the token unknown tokens map to (must be among ``specials``), or None to make
            unknown tokens a ``KeyError``.
        pad: the padding token (must be among ``specials``) or None.
    """

    def __init__(
        self,
        tokens: Iterable[str] = (),
        *,
        specials: Sequence[str] = (PAD, UNK),
        unk: str | None = UNK,
        pad: str | None = PAD,
    ):
        _check_not_text(tokens, "tokens", "an iterable of token strings")
        _check_not_text(specials, "specials", "a sequence of token strings")
        for name, special in (("unk", unk), ("pad", pad)):
            if special is not None and special not in specials:
                raise ValueError(f"{name}={special!r} must be one of specials {tuple(specials)}")
        itos: list[str] = []
        stoi: dict[str, int] = {}
        for token in (*specials, *tokens):
            if not isinstance(token, str):
                raise TypeError(f"vocabulary tokens must be strings, got {token!r}")
            if token not in stoi:
                stoi[token] = len(itos)
                itos.append(token)
        self._itos = tuple(itos)
        self._stoi = stoi
        self.specials = tuple(dict.fromkeys(specials))
        self.unk = unk
        self.pad = pad

    @classmethod
    def from_corpus(
        cls,
        texts: Iterable[Iterable[str]],
        *,
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = (PAD, UNK),
        unk: str | None = UNK,
        pad: str | None = PAD,
    ) -> Vocab:
        """The tokens of ``texts`` (lists of tokens) seen at least ``min_freq`` times, most
        frequent first (ties in alphabetical order), at most ``max_size`` of them (besides
        the specials, which a text may also hold, e.g. ``<unk>`` put in by preprocessing).

        ``min_freq`` is an int >= 1 and ``max_size`` an int >= 1 or None; each text is a
        list of tokens, not a string (a string would count its characters)."""
        check_int(min_freq, "min_freq", 1, error=ValueError)
        check_optional_int(max_size, "max_size", error=ValueError)
        _check_not_text(texts, "texts", "an iterable of token lists")
        counts: Counter[str] = Counter()
        for text in texts:
            _check_not_text(text, "each text of texts", "a list of tokens")
            counts.update(text)
        special = set(specials)  # already in the vocabulary: not among the max_size
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_freq and t not in special),
            key=lambda t: (-counts[t], t),
        )
        if max_size is not None:
            ranked = ranked[:max_size]
        return cls(ranked, specials=specials, unk=unk, pad=pad)

    @property
    def tokens(self) -> tuple[str, ...]:
        """All tokens in index order, specials first."""
        return self._itos

    @property
    def unk_index(self) -> int | None:
        return None if self.unk is None else self._stoi[self.unk]

    @property
    def pad_index(self) -> int | None:
        return None if self.pad is None else self._stoi[self.pad]

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __iter__(self):
        return iter(self._itos)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return (self._itos, self.specials, self.unk, self.pad) == (
            other._itos,
            other.specials,
            other.unk,
            other.pad,
        )

    __hash__ = None  # type: ignore[assignment]

    def index(self, token: str) -> int:
        """The index of ``token``; the unknown token's index for an unknown one."""
        i = self._stoi.get(token)
        if i is not None:
            return i
        if self.unk is None:
            raise KeyError(f"{token!r} is not in the vocabulary (it has no unknown token)")
        return self._stoi[self.unk]

    __getitem__ = index

    def token(self, index: int) -> str:
        """The token of ``index`` (``0 <= index < len(self)``; a Python, NumPy or 0-d tensor
        int); anything else is an ``IndexError`` naming it (``-1`` is no token here: a
        negative index would silently give one from the end)."""
        n = len(self._itos)
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            if not (hasattr(index, "ndim") and index.ndim == 0 and hasattr(index, "item")):
                raise TypeError(f"a token index must be an int, got {index!r}")
            value = index.item()
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"a token index must be an int, got {index!r}")
            index = value
        if not 0 <= index < n:
            raise IndexError(f"token index {int(index)} is outside the vocabulary of {n} tokens")
        return self._itos[int(index)]

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self.index(t) for t in tokens]

    def decode(self, indices: Iterable[int]) -> list[str]:
        """The tokens of ``indices`` (:meth:`token` of each)."""
        return [self.token(i) for i in indices]

    def to_json(self) -> dict[str, Any]:
        n = len(self.specials)
        return {
            "tokens": list(self._itos[n:]),
            "specials": list(self.specials),
            "unk": self.unk,
            "pad": self.pad,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Vocab:
        return cls(
            payload["tokens"], specials=payload["specials"], unk=payload["unk"], pad=payload["pad"]
        )

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self._itos[:6])
        return f"Vocab({len(self)} tokens: {head}{', ...' if len(self) > 6 else ''})"


def _check_not_text(value: object, name: str, wanted: str) -> None:
    """A ``TypeError`` when ``value`` is a string (whose characters would be taken for
    tokens) or not iterable at all: ``"tokens must be an iterable of token strings, not
    the string 'abc'"``."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} must be {wanted}, not the string {value[:40]!r}")
    if not isinstance(value, Iterable):
        raise TypeError(f"{name} must be {wanted}, got {value!r}")
