"""Speech recognition error rates (survey section 4.1, extrinsic evaluation of speech).

* :func:`word_error_rate` (WER): ``(S + D + I) / N`` over the words of a corpus, where
  ``S``, ``D``, ``I`` are the substitutions, deletions and insertions of a minimum edit
  (Levenshtein) alignment of each hypothesis to its reference and ``N`` the number of
  reference words. It can exceed 1 (many insertions).
* :func:`phoneme_error_rate` (PER): the same rate over phoneme sequences (each utterance a
  list of phoneme symbols, e.g. espeak-ng's ``--ipa`` or ``-x`` output split into phonemes).
* :func:`character_error_rate` (CER): the same rate over characters.

All three are corpus rates (total edits / total reference units, not a mean of sentence
rates) computed by jiwer (``pip install jiwer``, in ``attnlab[eval]``), which aligns each
pair with the Levenshtein distance (RapidFuzz). Cost: O(|ref| |hyp|) per pair.

Sources: the edit-distance error rate of speech recognition (e.g. Chorowski et al. 2015,
"Attention-Based Models for Speech Recognition", report PER on TIMIT; Chan et al. 2016,
"Listen, Attend and Spell", report WER); jiwer: https://github.com/jitsi/jiwer.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnlab._optional import require
from attnlab.evaluation._measures import check_paired

__all__ = ["character_error_rate", "phoneme_error_rate", "word_error_rate"]


def _check_pairs(references: Sequence, hypotheses: Sequence, what: str) -> None:
    if isinstance(references, str) or isinstance(hypotheses, str):
        raise TypeError(
            f"references and hypotheses must be lists of {what} (one per utterance), not a "
            "single string; wrap it: [text]"
        )
    check_paired(
        references, hypotheses, references_are="references", give="hypothesis per reference"
    )
    if not references:
        raise ValueError("no utterances: the error rate of an empty corpus is undefined")


def _units(text: str | Sequence[str], name: str, index: int) -> list[str]:
    """One utterance as a list of units: a string is split on whitespace."""
    units = text.split() if isinstance(text, str) else [str(u) for u in text]
    if any(not u or any(c.isspace() for c in u) for u in units):
        raise ValueError(f"{name}[{index}] holds an empty unit or a unit with whitespace")
    return units


def _rate(references: Sequence, hypotheses: Sequence, what: str) -> float:
    jiwer = require("jiwer")
    _check_pairs(references, hypotheses, what)
    refs = [_units(r, "references", i) for i, r in enumerate(references)]
    hyps = [_units(h, "hypotheses", i) for i, h in enumerate(hypotheses)]
    if sum(len(r) for r in refs) == 0:
        raise ValueError(f"the references hold no {what}: the error rate is undefined")
    # jiwer refuses an empty reference string; an utterance with an empty reference
    # contributes its hypothesis' units as insertions
    insertions = sum(len(h) for r, h in zip(refs, hyps, strict=True) if not r)
    kept = [(r, h) for r, h in zip(refs, hyps, strict=True) if r]
    out = jiwer.process_words([" ".join(r) for r, _ in kept], [" ".join(h) for _, h in kept])
    edits = out.substitutions + out.deletions + out.insertions + insertions
    return float(edits / sum(len(r) for r in refs))


def word_error_rate(
    references: Sequence[str | Sequence[str]], hypotheses: Sequence[str | Sequence[str]]
) -> float:
    """Corpus WER: ``(S + D + I) / N`` over the words.

    Args:
        references: one reference per utterance: a string (split on whitespace) or a list
            of words.
        hypotheses: the recogniser's output, one per reference, in the same form.

    An empty hypothesis counts all its reference's words as deletions; an empty reference
    counts the hypothesis' words as insertions.

    >>> round(word_error_rate(["the cat sat"], ["the cat sat down"]), 4)
    0.3333
    """
    return _rate(references, hypotheses, "words")


def phoneme_error_rate(
    references: Sequence[str | Sequence[str]], hypotheses: Sequence[str | Sequence[str]]
) -> float:
    """Corpus PER: ``(S + D + I) / N`` over phoneme symbols. Each utterance is a list of
    phoneme symbols (``["h", "@", "l", "oU"]``) or a string of space-separated symbols."""
    return _rate(references, hypotheses, "phonemes")


def character_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """Corpus CER: ``(S + D + I) / N`` over characters, spaces included (each utterance a
    string)."""
    if isinstance(references, str) or isinstance(hypotheses, str):
        raise TypeError("references and hypotheses must be lists of strings; wrap it: [text]")

    def chars(texts: Sequence[str]) -> list[list[str]]:
        return [["_" if c.isspace() else c for c in str(t)] for t in texts]

    return _rate(chars(references), chars(hypotheses), "characters")
