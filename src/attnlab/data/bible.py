"""English-Spanish Bible verse pairs with silver word alignments from Strong's numbers.

Data: the SWORD modules of the Debian packages ``sword-text-kjv`` (King James Version,
1769 text, module ``engKJV2006eb``, abbreviation ``KJV``) and ``sword-text-sparv`` (Reina
Valera 1909, module ``spaRV1909eb``, abbreviation ``RV1909``), both public domain and both
in OSIS markup with Strong's numbers on the words::

    KJV    In the <w lemma="strong:H7225">beginning</w> <w lemma="strong:H0430">God</w> ...
    RV1909 <w lemma="strong:H7225">EN el principio</w> ... <w lemma="strong:H0430">Dios</w> ...

The modules are read with ``pysword`` (the zText blocks are decompressed once per book)
and the markup is parsed here: notes (footnotes with their text) are dropped, every other
tag keeps its text, and each token carries the Strong's numbers of the ``<w lemma=...>``
element(s) its characters lie in (``H430`` for Hebrew 0430, ``G2316`` for Greek 2316; the
zero padding is removed). Tokens are lower-cased words and single punctuation marks
(:func:`attnlab.data.simple_tokenize`); the text is tokenised as a whole, so a word split
by markup (``<w>LORD</w>'s``) stays one token.

Silver alignment: source token ``i`` and target token ``j`` are linked when they share a
Strong's number (:func:`strong_links`). With ``links="sure"`` (default) every such pair is a
sure link; with ``links="graded"`` a link is sure only when its number is carried by exactly
one token on each side (a one-to-one correspondence such as ``god``-``dios``) and possible
otherwise (``beginning`` - ``en el principio``, repeated words).

Both modules use the KJV versification, so verse ``Gen.1.1`` of one pairs with ``Gen.1.1``
of the other. A pair with an empty side (RV1909 merges a few verses of Job into their
neighbours) is left out. Splits keep whole chapters (or books) together.

Install: ``apt-get install sword-text-kjv sword-text-sparv`` and ``pip install pysword``.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import os
import random
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from attnlab._atomic import write_text
from attnlab._checks import check_flags, check_optional_int, check_path, check_seed
from attnlab.data._cache import cached
from attnlab.data._common import _TOKEN as _TOKEN  # simple_tokenize's rules, with spans
from attnlab.data._common import (
    DataFormatError,
    MissingDataError,
    assign_splits,
    check_fractions,
    file_fingerprint,
    package_version,
)
from attnlab.data.parallel import ParallelCorpus, write_parallel
from attnlab.data.pharaoh import Alignment, parse_pharaoh, write_pharaoh

__all__ = [
    "BibleCorpus",
    "BiblePair",
    "SwordModule",
    "find_sword_module",
    "load_bible_pairs",
    "load_bible_verses",
    "parse_osis_verse",
    "strong_links",
    "write_bible_pairs",
]

FORMAT_VERSION = 1
INSTALL_HINT = (
    "install the modules with `apt-get install sword-text-kjv sword-text-sparv` and the reader "
    "with `pip install pysword`"
)

#: Names a user may give for the modules of the two Debian packages (case-insensitive):
#: older packages named the modules ``KJV`` and ``SpaRV``, the current ones
#: ``engKJV2006eb`` and ``spaRV1909eb``.
ALIASES: dict[str, tuple[str, ...]] = {
    "kjv": ("KJV", "engKJV2006eb"),
    "engkjv2006eb": ("engKJV2006eb", "KJV"),
    "sparv": ("SpaRV", "spaRV1909eb"),
    "sparv1909eb": ("spaRV1909eb", "SpaRV"),
    "rv1909": ("spaRV1909eb", "SpaRV"),
}

Tags = tuple[str, ...]


# ----------------------------------------------------------------------------- modules


@dataclasses.dataclass(frozen=True)
class SwordModule:
    """An installed SWORD module: its name, library root, ``.conf`` file and settings."""

    name: str
    root: Path
    conf: Path
    data_path: Path
    settings: dict[str, str]

    @property
    def licence(self) -> str:
        return self.settings.get("DistributionLicense", self.settings.get("Copyright", ""))

    @property
    def description(self) -> str:
        return self.settings.get("Description", self.name)


def _sword_roots(sword_path: str | os.PathLike | None) -> list[Path]:
    if sword_path is not None:
        return [check_path(sword_path, "sword_path")]
    roots = [Path(p) for p in os.environ.get("SWORD_PATH", "").split(os.pathsep) if p]
    roots += [Path.home() / ".sword", Path("/usr/share/sword"), Path("/usr/local/share/sword")]
    return roots


def _read_conf(path: Path) -> tuple[str, dict[str, str]]:
    """The section name and the settings (first value of a repeated key) of a .conf file."""
    name = ""
    settings: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]") and not name:
            name = line[1:-1].strip()
        elif "=" in line:
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), value.strip())
    return name, settings


def find_sword_module(name: str, sword_path: str | os.PathLike | None = None) -> SwordModule:
    """Locate an installed SWORD module by its name or abbreviation (case-insensitive).

    Looks in ``sword_path`` or else ``$SWORD_PATH``, ``~/.sword``, ``/usr/share/sword`` and
    ``/usr/local/share/sword`` (each holding ``mods.d/*.conf``). ``"KJV"`` and ``"SpaRV"``
    also find the current Debian modules ``engKJV2006eb`` and ``spaRV1909eb``.
    Raises :class:`MissingDataError` naming the packages to install.
    """
    _check_module_name(name, "name")
    wanted = [name, *ALIASES.get(name.lower(), ())]
    wanted_l = [w.lower() for w in wanted]
    found: dict[str, SwordModule] = {}
    for root in _sword_roots(sword_path):
        confs = sorted((root / "mods.d").glob("*.conf")) if (root / "mods.d").is_dir() else []
        for conf in confs:
            section, settings = _read_conf(conf)
            if not section:
                continue
            module = SwordModule(
                section,
                root,
                conf,
                (root / settings.get("DataPath", "")).resolve(),
                settings,
            )
            for key in (section, settings.get("Abbreviation", "")):
                if key:
                    found.setdefault(key.lower(), module)
    for key in wanted_l:
        if key in found:
            module = found[key]
            if not module.data_path.is_dir():
                raise MissingDataError(
                    f"the SWORD module {module.name!r} ({module.conf}) has no data folder "
                    f"{module.data_path}; reinstall it: {INSTALL_HINT}"
                )
            return module
    where = ", ".join(str(r) for r in _sword_roots(sword_path))
    have = sorted({m.name for m in found.values()})
    raise MissingDataError(
        f"no SWORD module {name!r} in {where} (installed: {', '.join(have) or 'none'}); "
        f"{INSTALL_HINT}"
    )


def _check_module_name(name: object, argument: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"{argument} must be the name or abbreviation of a SWORD module (such as 'KJV'), "
            f"got {name!r}"
        )


def _open_bible(module: SwordModule) -> Any:
    try:
        from pysword.modules import SwordModules
    except ImportError:
        raise MissingDataError(
            f"reading the SWORD module {module.name!r} needs the package 'pysword'; {INSTALL_HINT}"
        ) from None
    modules = SwordModules(str(module.root))
    modules.parse_modules()
    bible = modules.get_bible_from_module(module.name)
    fetch = getattr(bible, "_decompressed_text", None)
    if fetch is not None:
        # zText stores a whole book per compressed block; pysword decompresses the block for
        # every verse. Remember the last few blocks (31k verses: 50 s -> 0.3 s).
        bible._decompressed_text = functools.lru_cache(maxsize=4)(fetch)
    return bible


# ----------------------------------------------------------------------------- markup

_PIECE = re.compile(r"<(/?)([A-Za-z]+)((?:[^>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>|([^<]+)")
_LEMMA = re.compile(r"\blemma\s*=\s*\"([^\"]*)\"")
_STRONG = re.compile(r"^(?:strong:)?([HGhg])0*(\d+)([a-z]?)$")
_USFM = re.compile(r"\\\+?[a-z]+\d*\*?")  # stray USFM markers such as \nd and \+nd*
_SKIP_TEXT = ("note",)


def _strong_numbers(lemma: str) -> Tags:
    out: list[str] = []
    for item in lemma.split():
        m = _STRONG.match(item.strip())
        if m:
            tag = f"{m.group(1).upper()}{m.group(2)}{m.group(3)}"
            if tag not in out:
                out.append(tag)
    return tuple(out)


def parse_osis_verse(markup: str) -> tuple[list[str], list[Tags]]:
    """Tokens (lower-cased) and the Strong's numbers of each token of one OSIS verse.

    Notes are dropped with their text; other tags keep their text. A token gets the
    numbers of every ``<w lemma="strong:...">`` element any of its characters lies in
    (``H0430`` -> ``H430``), in order, without repeats; tokens outside such elements get
    ``()``.

    >>> parse_osis_verse('In the <w lemma="strong:H7225">beginning</w>.')
    (['in', 'the', 'beginning', '.'], [(), (), ('H7225',), ()])
    """
    plain, segments = _verse_text(markup)
    return _token_tags(plain, segments)


def _verse_text(markup: str) -> tuple[str, list[tuple[int, int, Tags]]]:
    """The plain text of a verse (notes dropped) and the character spans inside
    ``<w lemma=...>`` elements with their Strong's numbers, in text order."""
    pieces: list[str] = []
    segments: list[tuple[int, int, Tags]] = []
    stack: list[Tags] = []  # the numbers of the open <w> elements
    skip = 0  # depth of open elements whose text is dropped
    pos = 0
    for m in _PIECE.finditer(markup):
        closing, tag, attrs, self_closing, text = m.groups()
        if text is None:
            if not self_closing:
                skip = _enter_or_leave(tag.lower(), closing, attrs, stack, skip)
            continue
        if skip:
            continue
        text = _USFM.sub(" ", html.unescape(text)).replace("\u00b6", " ")
        current = _open_numbers(stack)
        if current:
            segments.append((pos, pos + len(text), current))
        pieces.append(text)
        pos += len(text)
    return "".join(pieces), segments


def _enter_or_leave(tag: str, closing: str | None, attrs: str | None, stack: list[Tags], skip: int) -> int:  # fmt: skip
    """Track an opening or closing tag: push / pop the numbers of ``<w>``; return the new
    depth of elements whose text is dropped."""
    if tag in _SKIP_TEXT:
        return max(skip + (-1 if closing else 1), 0)
    if tag == "w":
        if not closing:
            lemma = _LEMMA.search(attrs or "")
            stack.append(_strong_numbers(lemma.group(1)) if lemma else ())
        elif stack:
            stack.pop()
    return skip


def _open_numbers(stack: list[Tags]) -> Tags:
    """The numbers of every open ``<w>`` element, in order, without repeats."""
    if not stack:
        return ()
    if len(stack) == 1:
        return stack[0]
    return tuple(dict.fromkeys(t for tags in stack for t in tags))


def _token_tags(plain: str, segments: list[tuple[int, int, Tags]]) -> tuple[list[str], list[Tags]]:
    """Tokens (lower-cased) of ``plain`` and the numbers of the segments each overlaps."""
    tokens: list[str] = []
    tags: list[Tags] = []
    k = 0  # first segment that may overlap the current token (both are in text order)
    for tm in _TOKEN.finditer(plain):
        s, e = tm.span()
        while k < len(segments) and segments[k][1] <= s:
            k += 1
        found: Tags = ()
        q = k
        while q < len(segments) and segments[q][0] < e:
            found = segments[q][2] if not found else tuple(dict.fromkeys(found + segments[q][2]))
            q += 1
        tokens.append(tm.group(0).lower())
        tags.append(found)
    return tokens, tags


def strong_links(
    source_tags: Sequence[Tags], target_tags: Sequence[Tags], links: str = "sure"
) -> Alignment:
    """The silver alignment of one verse pair: ``(i, j)`` when source token ``i`` and target
    token ``j`` share a Strong's number.

    ``links="sure"``: every link is sure. ``links="graded"``: a link is sure when some
    number it shares is carried by exactly one source and one target token, else possible.
    """
    if links not in ("sure", "graded"):
        raise ValueError(f"links must be 'sure' or 'graded', got {links!r}")
    src_pos: dict[str, list[int]] = defaultdict(list)
    tgt_pos: dict[str, list[int]] = defaultdict(list)
    for i, tags in enumerate(source_tags):
        for t in tags:
            src_pos[t].append(i)
    for j, tags in enumerate(target_tags):
        for t in tags:
            tgt_pos[t].append(j)
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for tag in src_pos.keys() & tgt_pos.keys():
        ss, ts = src_pos[tag], tgt_pos[tag]
        one_to_one = len(ss) == 1 and len(ts) == 1
        for i in ss:
            for j in ts:
                if links == "sure" or one_to_one:
                    sure.add((i, j))
                else:
                    possible.add((i, j))
    return Alignment(frozenset(sure), frozenset(possible - sure))


# ----------------------------------------------------------------------------- verses


def _canon() -> list[tuple[str, str, str, tuple[int, ...]]]:
    """The books of the KJV versification: ``(full name, OSIS name, abbreviation, verses
    per chapter)`` in canonical order (from pysword's tables)."""
    try:
        from pysword.canons import canons
    except ImportError:
        raise MissingDataError(
            f"reading SWORD modules needs the package 'pysword'; {INSTALL_HINT}"
        ) from None
    return [(e[0], e[1], e[2], tuple(e[3])) for t in ("ot", "nt") for e in canons["kjv"][t]]


def _parse_book(bible: Any, module: SwordModule, osis: str) -> dict[str, Any]:
    _testament, book = bible.get_structure().find_book(osis)
    texts = list(bible.get_iter(books=[book.name], clean=False))
    expected = sum(book.chapter_lengths)
    if len(texts) != expected:
        raise DataFormatError(
            f"book {osis} has {len(texts)} verses, the versification says {expected}",
            path=module.data_path,
        )
    ids: list[str] = []
    tokens: list[list[str]] = []
    tags: list[list[str]] = []
    k = 0
    for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
        for verse in range(1, n_verses + 1):
            toks, tok_tags = parse_osis_verse(texts[k] or "")
            k += 1
            ids.append(f"{osis}.{chapter}.{verse}")
            tokens.append(toks)
            tags.append([" ".join(t) for t in tok_tags])
    return {"ids": ids, "tokens": tokens, "tags": tags}


def _module_key(module: SwordModule) -> tuple[object, ...]:
    files = sorted(p for p in module.data_path.iterdir() if p.is_file())
    return (
        FORMAT_VERSION,
        module.name,
        package_version("pysword"),
        file_fingerprint(module.conf),
        *(file_fingerprint(p) for p in files),
    )


def load_bible_verses(
    name: str,
    *,
    books: Iterable[str] | str | None = None,
    sword_path: str | os.PathLike | None = None,
    cache: bool = True,
) -> dict[str, tuple[tuple[str, ...], tuple[Tags, ...]]]:
    """The verses of one module: ``{"Gen.1.1": (tokens, strongs_per_token), ...}`` in
    canonical order, for all books or ``books`` (see :func:`load_bible_pairs`). Each book
    is parsed once and cached (in the process and, with ``cache=True``, on disk)."""
    module = find_sword_module(name, sword_path)
    chosen = _book_filter(books)
    key = _module_key(module)
    opened: list[Any] = []

    def bible() -> Any:
        if not opened:
            opened.append(_open_bible(module))
        return opened[0]

    out: dict[str, tuple[tuple[str, ...], tuple[Tags, ...]]] = {}
    for _full, osis, _abbr, _chapters in _canon():
        if chosen and osis not in chosen:
            continue
        parsed = cached(
            "sword-book",
            (*key, osis),
            lambda osis=osis: _parse_book(bible(), module, osis),
            to_json=lambda x: x,
            from_json=lambda x: x,
            disk=cache,
        )
        for vid, toks, tags in zip(parsed["ids"], parsed["tokens"], parsed["tags"], strict=True):
            out[vid] = (tuple(toks), tuple(tuple(t.split()) for t in tags))
    return out


# ----------------------------------------------------------------------------- corpus


class BiblePair(NamedTuple):
    source: tuple[str, ...]
    target: tuple[str, ...]
    id: str
    split: str
    alignment: Alignment
    source_strongs: tuple[Tags, ...]
    target_strongs: tuple[Tags, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class BibleCorpus(ParallelCorpus):
    """Verse pairs (a :class:`~attnlab.data.ParallelCorpus`) with silver alignments.

    Attributes (one entry per pair, besides those of ParallelCorpus -- ``source``,
    ``target``, ``ids`` such as ``"Gen.1.1"``, ``splits``):
        alignments: the :class:`~attnlab.data.Alignment` (0-indexed source-target links).
        source_strongs, target_strongs: the Strong's numbers of every token (a tuple per
            token, empty for untagged tokens).
    """

    alignments: tuple[Alignment, ...] = ()
    source_strongs: tuple[tuple[Tags, ...], ...] = ()
    target_strongs: tuple[tuple[Tags, ...], ...] = ()

    _item_fields: ClassVar[tuple[str, ...]] = (
        "source",
        "target",
        "ids",
        "splits",
        "alignments",
        "source_strongs",
        "target_strongs",
    )

    def __getitem__(self, i: int) -> BiblePair:  # type: ignore[override]
        return BiblePair(
            self.source[i],
            self.target[i],
            self.ids[i],
            self.splits[i],
            self.alignments[i],
            self.source_strongs[i],
            self.target_strongs[i],
        )

    def stats(self) -> dict[str, float]:
        """Counts: pairs, tokens per side, links (sure / possible) per pair, share of
        tokens with a Strong's number, pairs per split."""
        n = max(len(self), 1)
        sure = sum(len(a.sure) for a in self.alignments)
        possible = sum(len(a.possible_only) for a in self.alignments)
        src_tok = sum(len(s) for s in self.source)
        tgt_tok = sum(len(t) for t in self.target)
        src_tagged = sum(1 for ts in self.source_strongs for t in ts if t)
        tgt_tagged = sum(1 for ts in self.target_strongs for t in ts if t)
        out: dict[str, float] = {
            "pairs": len(self),
            "source_tokens": src_tok,
            "target_tokens": tgt_tok,
            "sure_links_per_pair": sure / n,
            "possible_links_per_pair": possible / n,
            "source_tagged": src_tagged / max(src_tok, 1),
            "target_tagged": tgt_tagged / max(tgt_tok, 1),
        }
        for split in ("train", "dev", "test"):
            out[split] = sum(1 for s in self.splits if s == split)
        return out

    def to_json(self) -> dict[str, Any]:
        """The corpus as JSON-compatible data, each alignment as its Pharaoh line."""
        payload = super().to_json()
        payload["alignments"] = [a.to_pharaoh() for a in self.alignments]
        return payload

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> BibleCorpus:
        """The inverse of :meth:`to_json`: the alignments are read back from their lines."""
        payload = dict(payload)
        payload["alignments"] = [parse_pharaoh(a) for a in payload.get("alignments", ())]
        return super().from_json(payload)


_BOOK_GROUPS = {"ot": "ot", "nt": "nt", "old": "ot", "new": "nt"}


def _book_filter(books: Iterable[str] | str | None) -> set[str]:
    """The OSIS names of the chosen books (``"Gen"``, ``"Genesis"``, ``"OT"``, ``"NT"``)."""
    if books is None:
        return set()
    chosen_names = [books] if isinstance(books, str) else books
    chosen_names = list(chosen_names) if isinstance(chosen_names, Iterable) else []
    if not chosen_names:
        raise ValueError(
            f"books must be None (all books), a book name or a non-empty list of them, "
            f"got {books!r}"
        )
    names: dict[str, str] = {}
    group: dict[str, list[str]] = {"ot": [], "nt": []}
    for k, (full, osis, abbr, _chapters) in enumerate(_canon()):
        group["ot" if k < 39 else "nt"].append(osis)
        for key in (full, osis, abbr):
            names[key.lower().replace(" ", "")] = osis
    chosen: set[str] = set()
    for book in chosen_names:
        key = str(book).lower().replace(" ", "")
        if key in _BOOK_GROUPS:
            chosen.update(group[_BOOK_GROUPS[key]])
        elif key in names:
            chosen.add(names[key])
        else:
            raise ValueError(
                f"unknown book {book!r}; use OSIS names ({', '.join(group['ot'][:5])}, ..., "
                f"{', '.join(group['nt'][-3:])}), full names, or 'OT' / 'NT'"
            )
    return chosen


def load_bible_pairs(
    source: str = "KJV",
    target: str = "SpaRV",
    *,
    books: Iterable[str] | str | None = None,
    max_pairs: int | None = None,
    max_len: int | None = None,
    seed: int = 0,
    split_by: str = "chapter",
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    links: str = "sure",
    sword_path: str | os.PathLike | None = None,
    cache: bool = True,
) -> BibleCorpus:
    """Verse pairs of two SWORD Bibles with silver alignments from shared Strong's numbers.

    Args:
        source, target: module names or abbreviations (default KJV -> Reina Valera 1909).
        books: restrict to these books (OSIS names such as ``"Gen"``, ``"Matt"``, full
            names, or ``"OT"`` / ``"NT"``; at least one); default (None) all 66.
        max_pairs: keep a seeded random sample of this many pairs (in canonical order).
            The splits are assigned before sampling, so a verse's split never depends on
            ``max_pairs``.
        max_len: drop pairs with more tokens than this on either side (before sampling).
        seed: the seed of the split and of the sample.
        split_by: ``"chapter"`` (default) or ``"book"``: the unit kept in one split.
        fractions: train / dev / test fractions of the chapters (books).
        links: ``"sure"`` or ``"graded"`` (see :func:`strong_links`).
        sword_path: the SWORD library root (default: the usual places).
        cache: cache each parsed module on disk too (always in the process).

    Raises :class:`~attnlab.data.MissingDataError` when a module or pysword is missing.
    """
    if split_by not in ("chapter", "book"):
        raise ValueError(f"split_by must be 'chapter' or 'book', got {split_by!r}")
    for name, value in (("max_pairs", max_pairs), ("max_len", max_len)):
        check_optional_int(value, name, error=ValueError)
    if links not in ("sure", "graded"):
        raise ValueError(f"links must be 'sure' or 'graded', got {links!r}")
    _check_module_name(source, "source")
    _check_module_name(target, "target")
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(cache=cache)
    if isinstance(books, Iterable) and not isinstance(books, str):
        books = list(books)  # read twice below: a generator would be empty the second time
    _book_filter(books)  # a bad book name fails before any parsing
    src = load_bible_verses(source, books=books, sword_path=sword_path, cache=cache)
    tgt = load_bible_verses(target, books=books, sword_path=sword_path, cache=cache)
    ids = [v for v in src if v in tgt and src[v][0] and tgt[v][0]]
    # the split of a chapter (book) is drawn over all chapters (books) of the canon, so it
    # never depends on books, max_len or max_pairs
    units = [
        f"{osis}.{c}" if split_by == "chapter" else osis
        for _full, osis, _abbr, chapters in _canon()
        for c in (range(1, len(chapters) + 1) if split_by == "chapter" else [0])
    ]
    unit_split = dict(zip(units, assign_splits(units, fractions=fractions, seed=seed), strict=True))
    splits = [
        unit_split[v.rsplit(".", 1)[0] if split_by == "chapter" else v.split(".", 1)[0]]
        for v in ids
    ]
    keep = [
        k
        for k, v in enumerate(ids)
        if max_len is None or (len(src[v][0]) <= max_len and len(tgt[v][0]) <= max_len)
    ]
    if max_pairs is not None and max_pairs < len(keep):
        keep = sorted(random.Random(seed).sample(keep, max_pairs))
    if not keep:
        raise ValueError(
            f"no verse pairs left (books={books!r}, max_len={max_len!r}, max_pairs={max_pairs!r})"
        )
    sel = [ids[k] for k in keep]
    return BibleCorpus(
        source=tuple(src[v][0] for v in sel),
        target=tuple(tgt[v][0] for v in sel),
        ids=tuple(sel),
        splits=tuple(splits[k] for k in keep),
        name=f"{source}-{target}",
        alignments=tuple(strong_links(src[v][1], tgt[v][1], links) for v in sel),
        source_strongs=tuple(src[v][1] for v in sel),
        target_strongs=tuple(tgt[v][1] for v in sel),
    )


def write_bible_pairs(
    corpus: BibleCorpus,
    parallel_path: str | os.PathLike,
    alignment_path: str | os.PathLike | None = None,
    ids_path: str | os.PathLike | None = None,
) -> None:
    """Write the pairs as ``source ||| target`` lines (:func:`~attnlab.data.write_parallel`),
    the silver alignments in the Pharaoh format (0-indexed, ``i-j`` sure, ``ipj``
    possible; :func:`~attnlab.data.write_pharaoh`) and optionally the verse ids, one per
    line, all in the same order."""
    write_parallel(corpus, parallel_path)
    if alignment_path is not None:
        write_pharaoh(corpus.alignments, alignment_path)
    if ids_path is not None:
        write_text(ids_path, "".join(f"{i}\n" for i in corpus.ids))
