"""Aspect-based sentiment files of the SemEval ABSA tasks (2014 task 4; 2015 task 12 and 2016
task 5), which users bring (the organisers distribute them under their own terms).

Two layouts, told apart automatically:

* SemEval-2014: ``<sentences><sentence id=...><text>...</text><aspectTerms><aspectTerm
  term=... polarity=... from=... to=.../></aspectTerms></sentence></sentences>``;
  polarity positive / negative / neutral / conflict.
* SemEval-2015/2016: ``<Reviews><Review rid=...><sentences><sentence id=...><text>...</text>
  <Opinions><Opinion target=... category=... polarity=... from=... to=.../></Opinions>
  </sentence>...``; polarity positive / negative / neutral; ``target="NULL"`` marks an
  opinion without an explicit target.

:func:`read_semeval_absa` returns one :class:`TargetDataset` example per explicit target
(left context, target, right context, label). Choices: ``conflict`` polarities are
dropped unless ``keep_conflict=True`` (then a fourth label); implicit (``NULL``) targets
are skipped; several opinions on the same span with the same polarity (2016 gives one per
aspect category) count once, and with different polarities become ``conflict``.
Offsets are checked: ``text[from:to]`` must equal the target, else a
:class:`~attnlab.data.DataFormatError` names the sentence.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from attnlab._checks import check_flags, check_seed
from attnlab.data._common import (
    DataFormatError,
    assign_splits,
    check_fractions,
    check_split,
    simple_tokenize,
)
from attnlab.data._io import Source, open_text, source_name
from attnlab.data.containers import TargetDataset

__all__ = ["read_semeval_absa"]

LABELS = ("negative", "neutral", "positive")


def read_semeval_absa(
    source: Source,
    *,
    split: str | None = None,
    keep_conflict: bool = False,
    lower: bool = False,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> TargetDataset:
    """Read a SemEval-2014 or -2015/2016 ABSA XML file into a :class:`TargetDataset`.

    Args:
        source: a path or an open text stream.
        split: the split of every example; by default ``train`` / ``test`` / ``dev`` when
            the file name says so as a whole word (``Restaurants_Train.xml``,
            ``restaurants-trial.xml``; not ``contest.xml``), else a seeded split by sentence.
        keep_conflict: keep ``conflict`` polarities as a fourth label.
        lower: lower-case the tokens (``texts`` stay as written).
        seed, fractions: the seeded split, where there is one.
    """
    check_split(split)
    check_seed(seed, minimum=0)
    check_fractions(fractions)
    check_flags(keep_conflict=keep_conflict, lower=lower)
    where = source_name(source)
    with open_text(source) as f:
        try:
            root = ET.fromstring(f.read())
        except ET.ParseError as error:
            line = error.position[0] if getattr(error, "position", None) else None
            raise DataFormatError(f"not well-formed XML: {error}", path=where, line=line) from None
    names = (*LABELS, "conflict") if keep_conflict else LABELS
    if split is None:
        split = _split_from_name(where)

    examples = []
    n_sentences = 0
    for sentence in root.iter("sentence"):
        n_sentences += 1
        sid, text, spans = _sentence_spans(sentence, n_sentences, where)
        for k, ((start, end), polarity) in enumerate(sorted(spans.items())):
            if polarity == "conflict" and not keep_conflict:
                continue
            parts = [
                simple_tokenize(p, lower=lower) for p in (text[:start], text[start:end], text[end:])
            ]
            if not parts[1]:
                raise DataFormatError(
                    f"sentence {sid!r}: target {text[start:end]!r} has no tokens", path=where
                )
            examples.append((parts, names.index(polarity), f"{sid}#{k}", sid, text, (start, end)))
    if n_sentences == 0:
        raise DataFormatError("no <sentence> elements: not a SemEval ABSA file", path=where)
    if not examples:
        raise DataFormatError("no sentence has an explicit target with a polarity", path=where)
    groups = [e[3] for e in examples]
    splits = (
        (split,) * len(examples) if split else assign_splits(groups, fractions=fractions, seed=seed)
    )
    return TargetDataset(
        left=tuple(tuple(e[0][0]) for e in examples),
        target=tuple(tuple(e[0][1]) for e in examples),
        right=tuple(tuple(e[0][2]) for e in examples),
        labels=tuple(e[1] for e in examples),
        label_names=names,
        ids=tuple(e[2] for e in examples),
        splits=tuple(splits),
        texts=tuple(e[4] for e in examples),
        spans=tuple(e[5] for e in examples),
        name=where,
    )


def _sentence_spans(
    sentence: ET.Element, number: int, where: str
) -> tuple[str, str, dict[tuple[int, int], str]]:
    """``(id, text, {(start, end): polarity})`` of one ``<sentence>`` (SemEval-2014
    ``aspectTerms`` or 2015/2016 ``Opinions``); a span given two polarities is
    ``conflict``, opinions without an explicit target (``NULL``) are left out."""
    sid = sentence.get("id")
    if not sid:
        raise DataFormatError(f"sentence number {number} has no id", path=where)
    text_el = sentence.find("text")
    if text_el is None or text_el.text is None:
        raise DataFormatError(f"sentence {sid!r} has no <text>", path=where)
    text = text_el.text
    opinions = sentence.findall("aspectTerms/aspectTerm")
    target_attr = "term"
    if not opinions:
        opinions = sentence.findall("Opinions/Opinion")
        target_attr = "target"
    spans: dict[tuple[int, int], str] = {}
    for op in opinions:
        found = _opinion(op, target_attr, sid, text, where)
        if found is not None:
            start, end, polarity = found
            old = spans.get((start, end))
            spans[(start, end)] = polarity if old in (None, polarity) else "conflict"
    return sid, text, spans


def _opinion(
    op: ET.Element, target_attr: str, sid: str, text: str, where: str
) -> tuple[int, int, str] | None:
    """``(start, end, polarity)`` of one checked opinion, ``None`` for a ``NULL`` target."""
    term = op.get(target_attr)
    polarity = op.get("polarity")
    if term is None or polarity is None:
        raise DataFormatError(
            f"sentence {sid!r}: an opinion lacks {target_attr!r} or 'polarity'", path=where
        )
    if term == "NULL":
        return None  # an opinion without an explicit target
    if polarity not in (*LABELS, "conflict"):
        raise DataFormatError(
            f"sentence {sid!r}: unknown polarity {polarity!r} (expected one of "
            f"{[*LABELS, 'conflict']})",
            path=where,
        )
    try:
        start, end = int(op.get("from", "")), int(op.get("to", ""))
    except ValueError:
        raise DataFormatError(
            f"sentence {sid!r}: target {term!r} has no integer from/to offsets", path=where
        ) from None
    if not (0 <= start < end <= len(text)) or text[start:end] != term:
        raise DataFormatError(
            f"sentence {sid!r}: target {term!r} is not at characters {start}:{end} of the "
            f"text (found {text[start:end]!r})",
            path=where,
        )
    return start, end, polarity


def _split_from_name(name: str) -> str | None:
    """The split a file name states as a whole word (no letter on either side), so that
    ``Restaurants_Train_v2.xml`` and ``EN_REST_SB1_TEST.xml.gold`` say ``train`` / ``test``
    while ``mobile_devices.xml`` or ``contest_entries.xml`` say nothing."""
    stem = Path(name).name.lower()
    for word, split in (("train", "train"), ("test", "test"), ("trial", "dev"), ("dev", "dev")):
        if re.search(rf"(?<![^\W\d_]){word}(?![^\W\d_])", stem):
            return split
    return None
