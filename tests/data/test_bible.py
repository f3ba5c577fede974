"""The Bible loader: OSIS parsing, Strong's links, module lookup, and the real KJV / Reina
Valera 1909 modules when installed (skipped with the install command otherwise)."""

from __future__ import annotations

import pytest

from attnlab.data import MissingDataError, _cache, read_parallel, read_pharaoh
from attnlab.data.bible import (
    BibleCorpus,
    find_sword_module,
    load_bible_pairs,
    parse_osis_verse,
    strong_links,
    write_bible_pairs,
)
from attnlab.data.pharaoh import Alignment


def _have_modules() -> str | None:
    try:
        import pysword  # noqa: F401

        find_sword_module("KJV")
        find_sword_module("SpaRV")
    except ImportError:
        return "pysword is not installed (make data, or pip install pysword)"
    except MissingDataError as err:
        return str(err)
    return None


_MISSING = _have_modules()
needs_bible = pytest.mark.skipif(_MISSING is not None, reason=f"{_MISSING}")


# ----------------------------------------------------------------------------- parsing


def test_parse_tags_per_token_and_zero_padding() -> None:
    tokens, tags = parse_osis_verse(
        'In the <w lemma="strong:H7225">beginning</w> <w lemma="strong:H0430">God</w>.'
    )
    assert tokens == ["in", "the", "beginning", "god", "."]
    assert tags == [(), (), ("H7225",), ("H430",), ()]


def test_parse_multiword_element_and_several_numbers() -> None:
    tokens, tags = parse_osis_verse(
        '<w lemma="strong:H7225">EN el principio</w> <w lemma="strong:G2424 G5547">de '
        'Jesucristo</w>, <w lemma="strong:H0398 H0398">comerás</w>'
    )
    assert tokens == ["en", "el", "principio", "de", "jesucristo", ",", "comerás"]
    assert tags == [
        ("H7225",),
        ("H7225",),
        ("H7225",),
        ("G2424", "G5547"),
        ("G2424", "G5547"),
        (),
        ("H398",),
    ]


def test_parse_drops_notes_keeps_other_markup_text() -> None:
    markup = (
        '<div type="x-milestone" sID="pv1"/>¶ the <divineName><w lemma="strong:H3068">LORD'
        '</w></divineName>\'s <transChange type="added">day</transChange>.<note placement="'
        'foot"><reference>1.1 </reference>Heb. <w lemma="strong:H1">x</w></note> end'
    )
    tokens, tags = parse_osis_verse(markup)
    # the word split by markup stays one token, with its number; the note text is gone
    assert tokens == ["the", "lord's", "day", ".", "end"]
    assert tags == [(), ("H3068",), (), (), ()]


def test_parse_entities_and_usfm_remnants() -> None:
    tokens, _ = parse_osis_verse("a &amp; b \\nd c\\+nd*")
    assert tokens == ["a", "&", "b", "c"]


# ----------------------------------------------------------------------------- links


def test_strong_links_sure() -> None:
    src = [(), ("H1",), ("H2",), ("H1",)]
    tgt = [("H2",), ("H1", "H3"), ()]
    a = strong_links(src, tgt)
    assert a.sure == {(1, 1), (3, 1), (2, 0)}
    assert a.possible_only == frozenset()


def test_strong_links_graded() -> None:
    # H2 is one-to-one -> sure; H1 is on two source tokens -> possible
    src = [(), ("H1",), ("H2",), ("H1",)]
    tgt = [("H2",), ("H1",), ()]
    a = strong_links(src, tgt, "graded")
    assert a.sure == {(2, 0)}
    assert a.possible_only == {(1, 1), (3, 1)}
    with pytest.raises(ValueError, match="links"):
        strong_links(src, tgt, "bad")


# ----------------------------------------------------------------------------- lookup


def test_missing_module_names_the_install_commands(tmp_path) -> None:
    with pytest.raises(MissingDataError) as err:
        find_sword_module("KJV", tmp_path)
    assert "apt-get install sword-text-kjv sword-text-sparv" in str(err.value)
    assert "pip install pysword" in str(err.value)


def test_module_found_by_abbreviation_in_a_library(tmp_path) -> None:
    (tmp_path / "mods.d").mkdir()
    (tmp_path / "modules" / "texts" / "ztext" / "abc").mkdir(parents=True)
    (tmp_path / "mods.d" / "abc.conf").write_text(
        "[engABC]\nAbbreviation=ABC\nDataPath=./modules/texts/ztext/abc/\n"
        "DistributionLicense=Public Domain\n",
        encoding="utf-8",
    )
    module = find_sword_module("abc", tmp_path)
    assert module.name == "engABC"
    assert module.licence == "Public Domain"
    assert module.data_path == (tmp_path / "modules/texts/ztext/abc").resolve()


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def genesis() -> BibleCorpus:
    return load_bible_pairs(books=["Gen"])


@needs_bible
def test_genesis_1_1(genesis: BibleCorpus) -> None:
    pair = genesis[genesis.ids.index("Gen.1.1")]
    assert " ".join(pair.source) == ("in the beginning god created the heaven and the earth .")
    assert " ".join(pair.target) == "en el principio crió dios los cielos y la tierra ."
    god, dios = pair.source.index("god"), pair.target.index("dios")
    assert (god, dios) in pair.alignment.sure
    assert pair.source_strongs[god] == ("H430",)
    assert pair.target_strongs[dios] == ("H430",)
    # "beginning" <-> "en el principio" (one number on three Spanish tokens)
    beginning = pair.source.index("beginning")
    assert {j for i, j in pair.alignment.sure if i == beginning} == {0, 1, 2}
    # untagged English words ("the") have no link
    assert not any(i == 1 for i, _ in pair.alignment.sure)


@needs_bible
def test_links_share_a_number_and_stay_in_range(genesis: BibleCorpus) -> None:
    for k in range(0, len(genesis), 97):
        pair = genesis[k]
        for i, j in pair.alignment.sure:
            assert set(pair.source_strongs[i]) & set(pair.target_strongs[j])
            assert i < len(pair.source) and j < len(pair.target)
        assert len(pair.source_strongs) == len(pair.source)
        assert len(pair.target_strongs) == len(pair.target)
    links = sum(len(a.sure) for a in genesis.alignments) / len(genesis)
    assert 5 < links < 60


@needs_bible
def test_splits_keep_chapters_together_and_are_seeded(genesis: BibleCorpus) -> None:
    where: dict[str, set[str]] = {}
    for vid, split in zip(genesis.ids, genesis.splits, strict=True):
        where.setdefault(vid.rsplit(".", 1)[0], set()).add(split)
    assert all(len(s) == 1 for s in where.values())
    assert {"train", "dev", "test"} <= {s for ss in where.values() for s in ss}
    # the split of a verse does not depend on the sample, the length limit or the books
    small = load_bible_pairs(books=["Gen", "Matt"], max_pairs=50, max_len=25)
    assert len(small) == 50
    assert all(
        len(s) <= 25 and len(t) <= 25 for s, t in zip(small.source, small.target, strict=True)
    )
    index = {v: k for k, v in enumerate(genesis.ids)}
    for vid, split in zip(small.ids, small.splits, strict=True):
        if vid in index:
            assert genesis.splits[index[vid]] == split
    other = load_bible_pairs(books=["Gen"], seed=1)
    assert other.splits != genesis.splits


@needs_bible
def test_cache_returns_the_parse_and_writes_to_disk(genesis: BibleCorpus) -> None:
    root = _cache.cache_dir()
    assert root is not None
    files = list((root / "parsed").glob("sword-book-*.json.gz"))
    assert len(files) >= 2  # Genesis of each module
    _cache.clear_cache(memory=True)  # force a read from disk
    again = load_bible_pairs(books=["Gen"])
    assert again.ids == genesis.ids
    assert again.source == genesis.source
    assert again.alignments == genesis.alignments


@needs_bible
def test_write_parallel_and_pharaoh_round_trip(genesis: BibleCorpus, tmp_path) -> None:
    part = genesis.subset(range(20))
    write_bible_pairs(part, tmp_path / "p.txt", tmp_path / "p.align", tmp_path / "p.ids")
    back = read_parallel(tmp_path / "p.txt")
    assert back.source == part.source and back.target == part.target
    aligns = read_pharaoh(tmp_path / "p.align", lengths=back.lengths)
    assert aligns == list(part.alignments)
    assert (tmp_path / "p.ids").read_text().split() == list(part.ids)


def test_bad_arguments() -> None:
    # checked before pysword or any module is looked for
    with pytest.raises(ValueError, match="split_by"):
        load_bible_pairs(split_by="verse")
    with pytest.raises(ValueError, match="max_pairs"):
        load_bible_pairs(max_pairs=0)


def test_unknown_book() -> None:
    # the book names come from pysword's versification tables
    pytest.importorskip(
        "pysword", reason="pysword is not installed (make data, or pip install pysword)"
    )
    with pytest.raises(ValueError, match="unknown book"):
        load_bible_pairs(books=["Hezekiah"])


def test_alignment_type() -> None:
    assert isinstance(strong_links([("H1",)], [("H1",)]), Alignment)


def test_json_round_trip_gives_the_corpus_back() -> None:
    """``from_json(to_json())`` reads the Pharaoh lines back into alignments (it kept the
    strings), through real JSON text; sure and possible links both survive."""
    import json

    corpus = BibleCorpus(
        source=(("in", "the", "beginning"), ("amen",)),
        target=(("en", "el", "principio"), ("amen",)),
        ids=("Gen.1.1", "Rev.22.21"),
        splits=("train", "test"),
        name="toy",
        alignments=(Alignment(sure={(0, 0), (2, 2)}, possible_only={(1, 1)}), Alignment()),
        source_strongs=((("H7225",), (), ("H7225",)), ((),)),
        target_strongs=((("H7225",), (), ("H7225",)), ((),)),
    )
    back = BibleCorpus.from_json(json.loads(json.dumps(corpus.to_json())))
    assert back.alignments == corpus.alignments
    assert all(isinstance(a, Alignment) for a in back.alignments)
    assert list(back) == list(corpus)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"source": 5}, ValueError, r"source must be the name or abbreviation of a SWORD module"),
        ({"target": ""}, ValueError, r"target must be the name or abbreviation of a SWORD module"),
        (
            {"books": []},
            ValueError,
            r"books must be None \(all books\), a book name or a non-empty",
        ),
        ({"books": 5}, ValueError, r"books must be None \(all books\), a book name or a non-empty"),
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1\.5"),
        ({"cache": "no"}, TypeError, r"cache must be a bool, got 'no'"),
        ({"sword_path": ""}, ValueError, r"sword_path must not be empty"),
    ],
)
def test_bad_arguments_fail_before_the_modules_are_read(tmp_path, options, error, message):
    """books=[] read all 66 books; source=5 failed in str.lower; a NaN fraction ended in
    round() after both Bibles were parsed; sword_path='' searched the working folder."""
    with pytest.raises(error, match=f"^{message}"):
        load_bible_pairs(**{"sword_path": tmp_path, **options})
