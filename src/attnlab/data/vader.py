"""The human-rated sentences of the VADER paper (Hutto & Gilbert 2014).

``hutto_ICWSM_2014.tar.gz`` holds four tab-separated ``*_GroundTruth.txt`` files, one
sentence per line with its id and its mean sentiment rating by 20 or more people, on a
scale from -4 (extremely negative) to +4 (extremely positive):

==========  =======  ========================================================  ===========
source      lines    what                                                       ids
==========  =======  ========================================================  ===========
movie       10,605   sentences of Rotten Tomatoes reviews (Pang & Lee 2004)     ``k``
amazon       3,708   sentences of 300 Amazon product reviews (Hu & Liu 2004)    ``doc_sent``
nyt          5,190   sentences of 498 New York Times opinion editorials         ``doc_sent``
tweets       4,200   tweet-like texts                                           ``k``
==========  =======  ========================================================  ===========

:func:`load_vader_sentences` gives the sentences (one source or all); :func:`load_vader_documents`
groups the Amazon or NYT sentences by document, in sentence order, for hierarchical
attention. The documents carry no rating of their own: a document's score is the mean
rating of its sentences, and its label the sign of that score (documented choice).

Labels: ``labels="binary"`` gives negative (score < -threshold) / positive (score >
threshold) and drops the rest; ``labels="ternary"`` keeps them as neutral. With the default
``threshold=0`` only exact zeros are neutral; ``threshold`` is a number in ``[0, 4)`` (from 4
on, no rating of the -4..4 scale lies outside the neutral band). ``scores`` keeps the
ratings for regression.
Splits: none in the source; seeded 80/10/10 by document (Amazon, NYT) or sentence.

Where the file comes from: the archive ships in the *source* distribution of
``vaderSentiment`` 3.3.2 (``additional_resources/``), not in its wheel, so ``pip install``
does not bring it. Fetch the source archive at set-up, once, with pip::

    pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d ~/.cache/attnlab/sources

The loader looks (in order) at ``path=``, ``$ATTNLAB_VADER_DATA``, and the folders
``$ATTNLAB_SOURCES`` (default ``<cache dir>/sources``, see :func:`sources_dir`) and
``~/.cache/attnlab/sources`` for ``hutto_ICWSM_2014.tar.gz`` or
``vaderSentiment-3.3.2.tar.gz``. ``path`` may be either
archive or the unpacked ``hutto_ICWSM_2014`` folder. Nothing is unpacked to disk.

Licence: vaderSentiment is MIT-licensed (the archive is part of its source distribution);
the README asks users of the data to cite Hutto & Gilbert (2014).
"""

from __future__ import annotations

import os
import re
import tarfile
from collections import defaultdict
from pathlib import Path

from attnlab._checks import check_flags, check_number, check_path, check_seed
from attnlab.data._cache import cache_dir, cached
from attnlab.data._common import (
    DataFormatError,
    MissingDataError,
    check_fractions,
    check_split,
    env_path,
    file_fingerprint,
    number_in_range,
)
from attnlab.data.containers import DocumentDataset, TextDataset

__all__ = ["SOURCES", "find_vader_archive", "load_vader_documents", "load_vader_sentences"]

SOURCES = {
    "movie": "movieReviewSnippets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
}
DOCUMENT_SOURCES = ("amazon", "nyt")
ARCHIVE = "hutto_ICWSM_2014.tar.gz"
SDIST = "vaderSentiment-3.3.2.tar.gz"
FETCH = "pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d ~/.cache/attnlab/sources"
FORMAT_VERSION = 1

_ID = {"movie": re.compile(r"^\d+$"), "tweets": re.compile(r"^\d+$")}
_DOC_ID = re.compile(r"^(\d+)_(\d+)$")

Row = tuple[str, float, str]  # (id, mean rating, text)


def sources_dir() -> Path:
    """Where set-up puts source archives: ``$ATTNLAB_SOURCES`` or ``<cache>/sources``."""
    return (
        env_path("ATTNLAB_SOURCES")
        or (cache_dir() or Path.home() / ".cache" / "attnlab") / "sources"
    )


def find_vader_archive(path: str | os.PathLike | None = None) -> Path:
    """The archive (or folder) holding the VADER ground-truth files; see the module doc."""
    if path is not None:
        p = check_path(path)
        if not p.exists():
            raise MissingDataError(f"no such file or folder: {p}")
        return p
    env = env_path("ATTNLAB_VADER_DATA")
    if env is not None:
        if not env.exists():
            raise MissingDataError(f"$ATTNLAB_VADER_DATA points at {env}, which does not exist")
        return env
    folder = sources_dir()
    default = Path.home() / ".cache" / "attnlab" / "sources"
    for place in dict.fromkeys([folder, default]):
        for name in (ARCHIVE, SDIST):
            if (place / name).is_file():
                return place / name
    fetch = f"pip download --no-deps --no-binary :all: vaderSentiment==3.3.2 -d {folder}"
    raise MissingDataError(
        "the VADER rated sentences ship only in the source archive of the package "
        f"vaderSentiment 3.3.2 (not in its wheel), which was not found in {folder}. "
        f"Fetch it once with `{fetch}` (or set $ATTNLAB_SOURCES to the folder you download "
        "it to), or pass path= to the archive or to the unpacked hutto_ICWSM_2014 folder"
    )


def _read_files(location: Path) -> dict[str, bytes]:
    """The ground-truth files' bytes, from a folder, the data archive or the sdist."""
    wanted = set(SOURCES.values())
    if location.is_dir():
        found = {n: (location / n).read_bytes() for n in wanted if (location / n).is_file()}
    else:
        try:
            with tarfile.open(location, "r:*") as outer:
                names = outer.getnames()
                if any(Path(n).name in wanted for n in names):
                    found = _members(outer, wanted)
                else:
                    inner_name = next((n for n in names if Path(n).name == ARCHIVE), None)
                    if inner_name is None:
                        raise DataFormatError(
                            f"neither the ground-truth files nor {ARCHIVE} inside", path=location
                        )
                    blob = outer.extractfile(inner_name)
                    if blob is None:
                        raise DataFormatError(f"{inner_name} is not a file", path=location)
                    with tarfile.open(fileobj=blob, mode="r:*") as inner:
                        found = _members(inner, wanted)
        except tarfile.TarError as error:
            raise DataFormatError(f"not a readable tar archive: {error}", path=location) from None
    missing = sorted(wanted - set(found))
    if missing:
        raise DataFormatError(f"missing {missing}", path=location)
    return found


def _members(archive: tarfile.TarFile, wanted: set[str]) -> dict[str, bytes]:
    out = {}
    for member in archive.getmembers():
        name = Path(member.name).name
        if member.isfile() and name in wanted:
            f = archive.extractfile(member)
            if f is not None:
                out[name] = f.read()
    return out


def _parse(location: Path) -> dict[str, list[Row]]:
    files = _read_files(location)
    parsed: dict[str, list[Row]] = {}
    for source, name in SOURCES.items():
        where = f"{location}:{name}"
        try:
            text = files[name].decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataFormatError(f"not UTF-8 ({error})", path=where) from None
        rows: list[Row] = []
        seen: set[str] = set()
        # lines end at "\n" (or "\r\n") only: str.splitlines() also broke a sentence at
        # U+2028, U+0085, form feeds and the like
        for line_no, raw in enumerate(text.split("\n"), start=1):
            line = raw.removesuffix("\r")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3:
                raise DataFormatError(
                    f"{len(parts)} tab-separated fields, expected 3 (id, rating, text)",
                    path=where,
                    line=line_no,
                )
            sid, rating, sentence = parts[0].strip(), parts[1].strip(), " ".join(parts[2].split())
            pattern = _ID.get(source, _DOC_ID)
            if not pattern.match(sid):
                raise DataFormatError(f"bad id {sid!r} for {source}", path=where, line=line_no)
            if sid in seen:
                raise DataFormatError(f"duplicate id {sid!r}", path=where, line=line_no)
            seen.add(sid)
            score = number_in_range(rating, "rating", -4.0, 4.0, path=where, line=line_no)
            if not sentence:
                raise DataFormatError("empty sentence", path=where, line=line_no)
            rows.append((sid, score, sentence))
        if not rows:
            raise DataFormatError("no sentences", path=where)
        parsed[source] = rows
    return parsed


def _load(path: str | os.PathLike | None, cache: bool) -> dict[str, list[Row]]:
    location = find_vader_archive(path)
    stamp = file_fingerprint(location) if location.is_file() else str(location.resolve())
    if location.is_dir():
        stamp += "|" + "|".join(
            file_fingerprint(location / n)
            for n in sorted(SOURCES.values())
            if (location / n).is_file()
        )
    return cached(
        "vader-icwsm2014",
        (FORMAT_VERSION, stamp),
        lambda: _parse(location),
        to_json=lambda d: d,
        from_json=lambda d: {k: [tuple(r) for r in v] for k, v in d.items()},
        disk=cache,
    )


def _label_names(labels: str) -> tuple[str, ...]:
    if labels == "binary":
        return ("negative", "positive")
    if labels == "ternary":
        return ("negative", "neutral", "positive")
    raise ValueError(f"labels must be 'binary' or 'ternary', got {labels!r}")


def _label(score: float, labels: str, threshold: float) -> int | None:
    if score > threshold:
        return 1 if labels == "binary" else 2
    if score < -threshold:
        return 0
    return None if labels == "binary" else 1


def _check_source(source: str, allowed: tuple[str, ...]) -> None:
    if source not in allowed:
        raise ValueError(f"source must be one of {list(allowed)}, got {source!r}")


def _checked_ratings(
    source: str,
    allowed: tuple[str, ...],
    split: str | None,
    labels: str,
    threshold: float,
    seed: int,
    fractions: tuple[float, float, float],
    path: str | os.PathLike | None,
    cache: bool,
) -> tuple[tuple[str, ...], dict[str, list[Row]]]:
    """Check the loaders' arguments (before any file is read); the label names and the
    parsed ratings."""
    _check_source(source, allowed)
    check_split(split)
    names = _label_names(labels)
    check_number(threshold, "threshold", low=0, high=4, open_high=True)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(cache=cache)
    return names, _load(path, cache)


def load_vader_sentences(
    source: str = "movie",
    split: str | None = None,
    *,
    labels: str = "binary",
    threshold: float = 0.0,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    path: str | os.PathLike | None = None,
    cache: bool = True,
) -> TextDataset:
    """Rated sentences of one source (``"movie"``, ``"amazon"``, ``"nyt"``, ``"tweets"``) or
    of all (``"all"``), as a :class:`TextDataset` with ``scores`` (mean ratings, -4..4).

    ``ids`` are ``"<source>-<id>"``; ``groups`` are the documents (Amazon, NYT) or the
    sentences themselves, and the seeded split keeps a document together.
    """
    names, data = _checked_ratings(
        source, (*SOURCES, "all"), split, labels, threshold, seed, fractions, path, cache
    )
    texts, label_ids, ids, scores, groups = [], [], [], [], []
    for src in SOURCES if source == "all" else (source,):
        for sid, score, sentence in data[src]:
            lab = _label(score, labels, threshold)
            if lab is None:
                continue
            texts.append(sentence)
            label_ids.append(lab)
            ids.append(f"{src}-{sid}")
            scores.append(score)
            groups.append(f"{src}-{sid.split('_')[0]}")
    return TextDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        texts=texts,
        labels=label_ids,
        label_names=names,
        ids=ids,
        scores=scores,
        groups=groups,
        name=f"vader-{source} (Hutto & Gilbert 2014)",
    )


def load_vader_documents(
    source: str = "amazon",
    split: str | None = None,
    *,
    labels: str = "binary",
    threshold: float = 0.0,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    path: str | os.PathLike | None = None,
    cache: bool = True,
) -> DocumentDataset:
    """Amazon reviews (``"amazon"``, 300) or NYT editorials (``"nyt"``, 498) as documents of
    rated sentences, in sentence order (:class:`DocumentDataset`).

    A document's score is the mean of its sentence ratings; its label is that score's
    sign (``labels``/``threshold`` as for sentences). All sentences are kept, also neutral ones.
    """
    names, data = _checked_ratings(
        source, DOCUMENT_SOURCES, split, labels, threshold, seed, fractions, path, cache
    )
    docs: dict[str, list[tuple[int, str, float, str]]] = defaultdict(list)
    for sid, score, sentence in data[source]:
        doc, number = sid.split("_")  # the parser checked the form doc_sentence
        docs[doc].append((int(number), sid, score, sentence))
    documents, doc_labels, ids, doc_scores, sentence_ids, sentence_scores = [], [], [], [], [], []
    for doc_id in sorted(docs, key=int):
        sentences = sorted(docs[doc_id])
        mean = sum(s[2] for s in sentences) / len(sentences)
        lab = _label(mean, labels, threshold)
        if lab is None:
            continue
        documents.append(tuple(s[3] for s in sentences))
        sentence_ids.append(tuple(s[1] for s in sentences))
        sentence_scores.append(tuple(s[2] for s in sentences))
        doc_scores.append(mean)
        doc_labels.append(lab)
        ids.append(f"{source}-{doc_id}")
    return DocumentDataset.seeded(
        split,
        seed=seed,
        fractions=fractions,
        documents=documents,
        labels=doc_labels,
        label_names=names,
        ids=ids,
        sentence_ids=sentence_ids,
        scores=doc_scores,
        sentence_scores=sentence_scores,
        name=f"vader-{source}-documents (Hutto & Gilbert 2014)",
    )
