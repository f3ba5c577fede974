"""METEOR (Banerjee & Lavie 2005) for translations and captions, with its synonym stage
working offline.

METEOR aligns the hypothesis' words to a reference's in three stages -- exact match, then
Porter-stem match, then WordNet synonym match -- and scores the alignment with
``P = m / |hyp|``, ``R = m / |ref|`` (``m`` matched unigrams)::

    F_mean = P R / (alpha P + (1 - alpha) R)        (alpha = 0.9: recall-weighted)
    penalty = gamma (chunks / m) ^ beta              (gamma = 0.5, beta = 3)
    METEOR = F_mean (1 - penalty)

where ``chunks`` is the number of runs of matched words that are contiguous and in the same
order in both. With several references the best score counts. The score is computed by
NLTK (``nltk.translate.meteor_score``; ``pip install nltk``, in ``attnlab[eval]``);
:func:`corpus_meteor` is the mean of the sentence scores.

Two behaviours of NLTK's implementation differ from the paper, and scores differ
accordingly from the original METEOR tool: the alignment is built greedily, stage by
stage, rather than chosen as the one with the fewest chunks (a hypothesis that reorders
repeated words, "on the mat sat the cat" against "the cat sat on the mat", gets 6 chunks
where the paper's alignment has 3: 0.5 instead of 0.9375); and the synonym stage looks up
the Porter stems of the words left over by the stem stage, so a word whose stem is not a
WordNet lemma ("large" -> "larg") finds no synonym ("big" ~ "large" is not matched,
"car" ~ "auto" is).

WordNet comes from the Debian package ``wordnet-base`` (WordNet 3.0, Princeton's licence;
``apt-get install wordnet-base``, in ``make system``): its database files in
``/usr/share/wordnet`` are read by NLTK's ``WordNetCorpusReader``. Debian does not ship
the ``lexnames`` file (the list of the 45 lexicographer files, documented in
``lexnames(5WN)``) that NLTK's reader opens, so :func:`load_wordnet` serves it from
:data:`LEXNAMES`. Set ``ATTNLAB_WORDNET`` to read another WordNet 3.0 ``dict`` folder.
Nothing is downloaded. ``synonyms=False`` runs METEOR with the exact and stem stages
only (no WordNet needed).

Cost: O(|hyp| |ref|) per pair plus one WordNet look-up per unmatched word.

Sources: S. Banerjee and A. Lavie, "METEOR: An Automatic Metric for MT Evaluation with
Improved Correlation with Human Judgments", ACL workshop 2005; G. A. Miller, "WordNet: A
Lexical Database for English", CACM 1995; NLTK (Bird, Klein & Loper 2009).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab._optional import install_command, require
from attnlab.data._common import MissingDataError
from attnlab.evaluation._measures import check_paired

__all__ = [
    "LEXNAMES",
    "corpus_meteor",
    "load_wordnet",
    "meteor_or_nan",
    "sentence_meteor",
    "wordnet_dir",
]

#: WordNet 3.0's lexicographer files (lexnames(5WN)): number = position, name, syntactic
#: category (1 noun, 2 verb, 3 adjective, 4 adverb)
LEXNAMES: tuple[tuple[str, int], ...] = (
    ("adj.all", 3), ("adj.pert", 3), ("adv.all", 4), ("noun.Tops", 1), ("noun.act", 1),
    ("noun.animal", 1), ("noun.artifact", 1), ("noun.attribute", 1), ("noun.body", 1),
    ("noun.cognition", 1), ("noun.communication", 1), ("noun.event", 1), ("noun.feeling", 1),
    ("noun.food", 1), ("noun.group", 1), ("noun.location", 1), ("noun.motive", 1),
    ("noun.object", 1), ("noun.person", 1), ("noun.phenomenon", 1), ("noun.plant", 1),
    ("noun.possession", 1), ("noun.process", 1), ("noun.quantity", 1), ("noun.relation", 1),
    ("noun.shape", 1), ("noun.state", 1), ("noun.substance", 1), ("noun.time", 1),
    ("verb.body", 2), ("verb.change", 2), ("verb.cognition", 2), ("verb.communication", 2),
    ("verb.competition", 2), ("verb.consumption", 2), ("verb.contact", 2),
    ("verb.creation", 2), ("verb.emotion", 2), ("verb.motion", 2), ("verb.perception", 2),
    ("verb.possession", 2), ("verb.social", 2), ("verb.stative", 2), ("verb.weather", 2),
    ("adj.ppl", 3),
)  # fmt: skip

DEBIAN_WORDNET = Path("/usr/share/wordnet")
_REQUIRED = ("index.noun", "data.noun", "index.verb", "data.verb", "index.adj", "data.adj")
_READERS: dict[Path, Any] = {}


def wordnet_dir() -> Path:
    """The WordNet 3.0 database folder: ``$ATTNLAB_WORDNET`` or Debian's
    ``/usr/share/wordnet``; :class:`~attnlab.data.MissingDataError` (naming the install
    command) when it holds no database."""
    env = os.environ.get("ATTNLAB_WORDNET")
    root = Path(env).expanduser() if env else DEBIAN_WORDNET
    missing = [f for f in _REQUIRED if not (root / f).is_file()]
    if missing:
        where = f"ATTNLAB_WORDNET={env}" if env else str(root)
        raise MissingDataError(
            f"WordNet 3.0 is not installed ({where} lacks {', '.join(missing)}): "
            f"{install_command('wordnet')}"
        )
    return root.resolve()


def load_wordnet() -> Any:
    """NLTK's ``WordNetCorpusReader`` over :func:`wordnet_dir` (read once per process)."""
    nltk = require("nltk")
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = wordnet_dir()
    if root in _READERS:
        return _READERS[root]

    class _DebianWordNet(WordNetCorpusReader):
        """Debian's WordNet files plus the ``lexnames`` table Debian does not ship."""

        def open(self, file: str) -> Any:
            if file == "lexnames" and not (root / "lexnames").is_file():
                lines = [f"{i:02d}\t{name}\t{cat}\n" for i, (name, cat) in enumerate(LEXNAMES)]
                return io.StringIO("".join(lines))
            return super().open(file)

        def map_wn(self, version: str = "wordnet") -> None:
            # NLTK maps another WordNet version's synsets onto 3.0's for the multilingual
            # (OMW) data, reading NLTK's own downloaded copy; this is 3.0 and has no OMW
            return None

    # NLTK reads corpora only below its data paths (nltk.pathsec): allow this one folder
    if str(root) not in map(str, nltk.data.path):
        nltk.data.path.append(str(root))
    import warnings

    with warnings.catch_warnings():  # "multilingual functions are not available": no OMW
        warnings.simplefilter("ignore", UserWarning)
        reader = _DebianWordNet(str(root), None)
    _READERS[root] = reader
    return reader


class _NoSynonyms:
    """A WordNet stand-in without synonyms (METEOR's exact and stem stages only)."""

    @staticmethod
    def synsets(word: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []


def _tokens(text: str | Sequence[str], name: str) -> list[str]:
    if isinstance(text, str):
        return text.split()
    words = [str(w) for w in text]
    if any(not w for w in words):
        raise ValueError(f"{name} holds an empty word")
    return words


def sentence_meteor(
    references: Sequence[str | Sequence[str]],
    hypothesis: str | Sequence[str],
    *,
    synonyms: bool = True,
    language: str = "english",
    alpha: float = 0.9,
    beta: float = 3.0,
    gamma: float = 0.5,
) -> float:
    """METEOR of one hypothesis against its references (the best of them).

    Args:
        references: one or more references, each a string (split on whitespace) or a list
            of words.
        hypothesis: a string or a list of words.
        synonyms: use WordNet's synonym stage (needs ``wordnet-base``; English only);
            False keeps the exact and stem stages.
        language: ``"english"`` (Porter stems) or another language of NLTK's Snowball
            stemmer (``"spanish"``, ``"german"``, ...; then ``synonyms`` must be False).
        alpha, beta, gamma: METEOR's parameters (see the module docstring).

    Words are lower-cased. An empty hypothesis scores 0; an empty reference scores 0
    itself, so the best of the other references counts (0 when all are empty).
    """
    require("nltk")
    from nltk.stem.porter import PorterStemmer
    from nltk.stem.snowball import SnowballStemmer
    from nltk.translate.meteor_score import meteor_score

    if language == "english":
        stemmer: Any = PorterStemmer()
    else:
        if synonyms:
            raise ValueError(
                f"WordNet's synonyms are English; for language={language!r} pass synonyms=False"
            )
        if language not in SnowballStemmer.languages:
            raise ValueError(
                f"language must be 'english' or one of NLTK's Snowball languages "
                f"{sorted(SnowballStemmer.languages)}, got {language!r}"
            )
        stemmer = SnowballStemmer(language)

    if isinstance(references, str):
        raise TypeError("references must be a list of references; wrap one string: [text]")
    if not references:
        raise ValueError("no references")
    refs = [_tokens(r, "a reference") for r in references]
    hyp = _tokens(hypothesis, "hypothesis")
    refs = [r for r in refs if r]  # an empty reference scores 0: the best of the others
    if not hyp or not refs:
        return 0.0
    wordnet = load_wordnet() if synonyms else _NoSynonyms()
    return float(
        meteor_score(
            refs,
            hyp,
            preprocess=str.lower,
            stemmer=stemmer,
            wordnet=wordnet,
            alpha=alpha,
            beta=beta,
            gamma=gamma,
        )
    )


def corpus_meteor(
    references: Sequence[Sequence[str | Sequence[str]]],
    hypotheses: Sequence[str | Sequence[str]],
    *,
    synonyms: bool = True,
    language: str = "english",
) -> float:
    """Mean sentence METEOR over a corpus: ``references[i]`` are the references of
    ``hypotheses[i]`` (a list of references per hypothesis)."""
    if isinstance(hypotheses, str):
        raise TypeError("hypotheses must be a list (one per sentence); wrap one string: [text]")
    check_paired(
        references,
        hypotheses,
        references_are="reference sets",
        give="list of references per hypothesis",
    )
    if not hypotheses:
        return float("nan")
    scores = [
        sentence_meteor(refs, hyp, synonyms=synonyms, language=language)
        for refs, hyp in zip(references, hypotheses, strict=True)
    ]
    return float(sum(scores) / len(scores))


def meteor_or_nan(
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    language: str = "english",
) -> float:
    """A task's METEOR: the mean over tokenised hypotheses with one reference each. English
    uses WordNet's synonyms when ``wordnet-base`` is installed (else the exact and stem
    stages), another language the exact and Snowball-stem stages; NaN, with a warning,
    when NLTK is not installed (a task still trains on a fresh clone)."""
    import warnings

    from attnlab._optional import MissingDependencyError

    synonyms = False
    if language == "english":
        try:
            wordnet_dir()
            synonyms = True
        except MissingDataError:
            pass
    try:
        return corpus_meteor(
            [[list(r)] for r in references],
            [list(h) for h in hypotheses],
            synonyms=synonyms,
            language=language,
        )
    except MissingDependencyError as err:
        warnings.warn(f"METEOR is NaN: {err}", RuntimeWarning, stacklevel=2)
        return float("nan")
