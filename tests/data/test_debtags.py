"""Debtags: the Packages parser on a fixture, freeze -> load, MultiLabelDataset, real lists."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datahelpers import FIXTURES

from attnlab.data import DataFormatError, MissingDataError
from attnlab.data import debtags as dt
from attnlab.data.debtags import (
    MultiLabelDataset,
    freeze_debtags,
    load_debtags,
    parse_packages,
    parse_tags,
)

PACKAGES = (FIXTURES / "debtags_Packages").read_text(encoding="utf-8")
TRANSLATIONS = (FIXTURES / "debtags_Translation-en").read_text(encoding="utf-8")
REAL_LISTS = Path(dt.LISTS_DIR)
HAS_REAL_LISTS = REAL_LISTS.is_dir() and bool(dt._list_files(REAL_LISTS, "Packages"))


@pytest.fixture
def lists_dir(tmp_path):
    """A lists folder like apt's: the fixture Packages gzip-compressed, Translation-en xz."""
    folder = tmp_path / "lists"
    folder.mkdir()
    name = "deb.example.org_debian_dists_x_main_binary-amd64_Packages.gz"
    (folder / name).write_bytes(gzip.compress(PACKAGES.encode("utf-8")))
    (folder / "deb.example.org_debian_dists_x_main_i18n_Translation-en.xz").write_bytes(
        lzma.compress(TRANSLATIONS.encode("utf-8"))
    )
    (folder / "deb.example.org_debian_dists_x_InRelease").write_text("not a list\n")
    return folder


# ----------------------------------------------------------------------------- parser


def test_parse_tags():
    assert parse_tags("b::x, a::y,\n c::z") == ("a::y", "b::x", "c::z")
    assert parse_tags("works-with::{image,image:raster}, role::program") == (
        "role::program",
        "works-with::image",
        "works-with::image:raster",
    )
    assert parse_tags("a::x, a::x") == ("a::x",)
    assert parse_tags("") == ()
    with pytest.raises(ValueError, match="not a debtag"):
        parse_tags("role::program, lonely")


def test_parse_packages_fields_and_long_descriptions():
    records = parse_packages(PACKAGES)
    assert [r["package"] for r in records] == [
        "alpha-edit",
        "libalpha-dev",
        "beta-view",
        "delta-perl",
    ]
    alpha, lib, beta, delta = records
    assert alpha["description"] == "Small text editor for the console"
    # continuation lines joined, " ." ends a paragraph, verbatim (indented) lines kept
    assert alpha["long_description"] == (
        "Alpha is a small editor. It edits text files.\n\n"
        "Features:\n  * syntax colours\n  * undo\n\n"
        "Written in C."
    )
    # a Tag field on two lines
    assert alpha["tags"] == [
        "implemented-in::c",
        "interface::text-mode",
        "role::program",
        "use::editing",
        "works-with::text",
    ]
    assert alpha["source"] == "alpha-edit" and alpha["section"] == "editors"
    assert lib["source"] == "alpha-edit"  # "Source: alpha-edit (1.0-1)" without the version
    assert lib["long_description"] == ""
    assert "works-with::image:raster" in beta["tags"] and "interface::TODO" in beta["tags"]
    assert delta["long_description"] == ""  # not in the Packages file itself


def test_an_empty_source_field_means_the_package_itself():
    """``Source:`` with no value (an IndexError before) names no other source."""
    (record,) = parse_packages("Package: a\nSource:\nDescription: x\nTag: use::editing\n")
    assert record["source"] == "a"


def test_untagged_packages_are_left_out_unless_asked():
    every = parse_packages(PACKAGES, tagged_only=False)
    gamma = next(r for r in every if r["package"] == "gamma-untagged")
    assert gamma["tags"] == [] and gamma["long_description"] == (
        "With a long description that spans two lines."
    )
    assert len(every) == 5


def test_translations_fill_missing_long_descriptions_by_md5():
    translations = dt.parse_translations(TRANSLATIONS)
    records = {r["package"]: r for r in parse_packages(PACKAGES, translations=translations)}
    assert records["delta-perl"]["long_description"] == "Delta::Edit edits text in place."
    assert records["beta-view"]["long_description"] == ""  # md5 does not match


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Package: x\nDescription: d\nTag: role::program, nope\n", "not a debtag"),
        ("Version: 1\nDescription: d\nTag: a::b\n", "without a Package"),
        ("Package: x\nTag: a::b\n", "has no Description"),
        (" orphan continuation\n", "continuation line"),
        ("Package x\n", "not a 'Field: value' line"),
    ],
)
def test_malformed_stanzas(text, message):
    with pytest.raises(DataFormatError, match=message):
        parse_packages(text)


def test_malformed_stanza_names_the_line():
    with pytest.raises(DataFormatError, match="line 4"):
        parse_packages("Package: a\nDescription: d\n\nPackage: b\nTag: a::b\n", path="P")


# ----------------------------------------------------------------------------- freeze/load


def test_freeze_then_load_round_trip(lists_dir, tmp_path):
    dest = freeze_debtags(tmp_path / "frozen" / "d.jsonl.gz", lists_dir=lists_dir)
    assert [p.name for p in dest.parent.iterdir()] == ["d.jsonl.gz"]  # no temporary file
    raw = gzip.decompress(dest.read_bytes()).decode("utf-8").splitlines()
    header = json.loads(raw[0])
    assert header["format"] == "attnlab-debtags" and header["packages"] == 4
    assert header["lists"] == ["deb.example.org_debian_dists_x_main_binary-amd64_Packages.gz"]
    assert [json.loads(line)["package"] for line in raw[1:]] == [
        "alpha-edit",
        "beta-view",
        "delta-perl",
        "libalpha-dev",
    ]
    # deterministic bytes: freezing again gives the same file
    again = freeze_debtags(tmp_path / "again.jsonl.gz", lists_dir=lists_dir)
    assert again.read_bytes() == dest.read_bytes()

    ds = load_debtags(path=dest, facets=("use", "works-with", "implemented-in"), min_count=2)
    # tags on >= 2 packages among those facets: implemented-in::c (alpha, lib),
    # use::editing (alpha, delta), works-with::text (alpha, delta)
    assert ds.label_names == ("implemented-in::c", "use::editing", "works-with::text")
    assert ds.ids == ("alpha-edit", "delta-perl", "libalpha-dev")  # beta-view has none left
    assert ds.label_sets == ((0, 1, 2), (1, 2), (0,))
    assert ds.groups == ("alpha-edit", "delta-perl", "alpha-edit")
    assert ds.texts[0].startswith("Small text editor for the console\n\nAlpha is a small editor.")
    assert ds.texts[1] == "Perl module to edit text\n\nDelta::Edit edits text in place."
    assert ds.label_counts() == {"implemented-in::c": 2, "use::editing": 2, "works-with::text": 2}
    assert ds.splits[0] == ds.splits[2]  # one source package, one split
    short = load_debtags(path=dest, facets=("use",), min_count=1, long_description=False)
    assert short.texts == (
        "Small text editor for the console",
        "image viewer",
        "Perl module to edit text",
    )


def test_label_choice_options(lists_dir, tmp_path):
    dest = freeze_debtags(tmp_path / "d.jsonl.gz", lists_dir=lists_dir)
    every = load_debtags(path=dest, facets=None, min_count=1)
    assert "interface::TODO" not in every.label_names  # placeholders are never labels
    assert "role::program" in every.label_names and len(every) == 4
    top = load_debtags(path=dest, facets=None, min_count=1, max_labels=2)
    # most frequent first, ties by name: implemented-in::c (2) and role::program (2)
    # beat use::editing (2) alphabetically
    assert top.label_names == ("implemented-in::c", "role::program")
    kept = load_debtags(path=dest, facets=("field",), min_count=1, keep_unlabelled=True)
    assert kept.label_names == () and len(kept) == 4 and set(kept.label_sets) == {()}
    with pytest.raises(ValueError, match="min_count"):
        load_debtags(path=dest, min_count=0)
    # no tag frequent enough: one line naming min_count (an empty dataset before, and
    # "no split 'train'" with a split)
    for split in (None, "train"):
        with pytest.raises(ValueError, match=r"min_count=99 packages \(the most common is "):
            load_debtags(split, path=dest, facets=("use",), min_count=99)
    with pytest.raises(ValueError, match=r"no tag of field is carried by min_count=1 "):
        load_debtags(path=dest, facets=("field",), min_count=1)
    with pytest.raises(ValueError, match="split must be"):
        load_debtags("valid", path=dest)


def test_load_reads_the_lists_without_a_frozen_file(lists_dir, fresh_cache):
    ds = load_debtags(lists_dir=lists_dir, facets=("use",), min_count=1)
    assert ds.label_names == ("use::editing", "use::viewing")
    assert set(ds.ids) == {"alpha-edit", "beta-view", "delta-perl"}


def test_load_prefers_the_default_frozen_file(lists_dir, fresh_cache, tmp_path):
    dest = freeze_debtags(lists_dir=lists_dir)
    assert dest == fresh_cache / "debtags" / "debtags.jsonl.gz"
    ds = load_debtags(facets=("use",), min_count=1)
    assert len(ds) == 3
    assert ds.name.startswith("debtags (frozen debtags.jsonl.gz)")
    # an explicit lists_dir is read, not passed over for the default frozen file
    with pytest.raises(MissingDataError, match="apt-get update"):
        load_debtags(lists_dir=tmp_path / "nowhere", facets=("use",), min_count=1)
    assert load_debtags(lists_dir=lists_dir, facets=("use",), min_count=1).name.startswith(
        f"debtags ({lists_dir})"
    )


def test_the_lists_cache_follows_the_translation_files(lists_dir, fresh_cache):
    """The long descriptions come from the Translation-en lists: editing one reads again
    (the cache was keyed by the Packages lists only and served the old text)."""
    first = load_debtags(lists_dir=lists_dir, facets=("use",), min_count=1)
    translation = next(lists_dir.glob("*Translation-en.xz"))
    assert "Delta::Edit edits text" in TRANSLATIONS
    edited = TRANSLATIONS.replace("Delta::Edit edits text", "Delta::Edit rewrites text")
    translation.write_bytes(lzma.compress(edited.encode("utf-8")))
    again = load_debtags(lists_dir=lists_dir, facets=("use",), min_count=1)
    assert any("Delta::Edit edits text" in t for t in first.texts)
    assert any("Delta::Edit rewrites text" in t for t in again.texts)


def test_missing_data_names_the_set_up(fresh_cache, tmp_path):
    with pytest.raises(MissingDataError, match=r"apt-get update.*debtags freeze"):
        load_debtags(lists_dir=tmp_path / "empty")
    with pytest.raises(MissingDataError, match="no frozen debtags file"):
        load_debtags(path=tmp_path / "absent.jsonl.gz")


def test_damaged_frozen_files(lists_dir, tmp_path):
    dest = freeze_debtags(tmp_path / "d.jsonl.gz", lists_dir=lists_dir)
    lines = gzip.decompress(dest.read_bytes()).decode("utf-8").splitlines()
    truncated = tmp_path / "t.jsonl.gz"
    truncated.write_bytes(gzip.compress(("\n".join(lines[:-1]) + "\n").encode()))
    with pytest.raises(DataFormatError, match="truncated"):
        load_debtags(path=truncated)
    foreign = tmp_path / "f.jsonl.gz"
    foreign.write_bytes(gzip.compress(b'{"hello": 1}\n'))
    with pytest.raises(DataFormatError, match="not a frozen debtags file"):
        load_debtags(path=foreign)
    bad = tmp_path / "b.jsonl.gz"
    bad.write_bytes(gzip.compress(("\n".join([lines[0], "{not json", *lines[2:]])).encode()))
    with pytest.raises(DataFormatError, match="line 2"):
        load_debtags(path=bad)
    plain = tmp_path / "p.jsonl.gz"
    plain.write_text("not gzip")
    with pytest.raises(DataFormatError, match="gzip"):
        load_debtags(path=plain)


@pytest.mark.skipif(shutil.which("lz4") is None, reason="the lz4 command is not installed")
def test_lz4_lists_are_decompressed(tmp_path):
    plain = tmp_path / "x_Packages"
    plain.write_text(PACKAGES, encoding="utf-8")
    subprocess.run(["lz4", "-q", str(plain), str(tmp_path / "y_Packages.lz4")], check=True)
    assert dt.read_list_file(tmp_path / "y_Packages.lz4") == PACKAGES


# ----------------------------------------------------------------------------- dataset


def test_multilabel_dataset_container():
    ds = MultiLabelDataset(
        texts=("a", "b c", "d"),
        label_sets=((0, 2), (), (1,)),
        label_names=("x", "y", "z"),
        ids=("i0", "i1", "i2"),
        splits=("train", "test", "train"),
        groups=("g0", "g1", "g2"),
        name="toy",
    )
    assert len(ds) == 3 and ds[0].labels == (0, 2) and ds[0].group == "g0"
    assert ds.label_counts() == {"x": 1, "y": 1, "z": 1}
    assert ds.label_matrix().tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert ds.label_matrix().dtype == np.float32
    train = ds.split("train")
    assert train.ids == ("i0", "i2") and train.label_sets == ((0, 2), (1,))
    assert train.label_names == ds.label_names
    assert ds.subset([2, 0]).texts == ("d", "a")
    assert ds.tokens() == [["a"], ["b", "c"], ["d"]]
    back = MultiLabelDataset.from_json(json.loads(json.dumps(ds.to_json())))
    assert back.label_sets == ds.label_sets and back.groups == ds.groups
    with pytest.raises(ValueError, match="label_sets"):
        MultiLabelDataset(("a",), ((3,),), ("x",), ("i",), ("train",))
    with pytest.raises(ValueError, match="sorted"):
        MultiLabelDataset(("a",), ((0, 0),), ("x",), ("i",), ("train",))
    with pytest.raises(ValueError, match="one per item"):
        MultiLabelDataset(("a", "b"), ((0,),), ("x",), ("i",), ("train",))


def test_main_freeze_and_stats(lists_dir, tmp_path, capsys):
    dest = tmp_path / "cli.jsonl.gz"
    assert dt.main(["freeze", str(dest), "--lists-dir", str(lists_dir)]) == 0
    assert "froze 4 tagged packages" in capsys.readouterr().out
    assert dt.main(["stats", "--path", str(dest), "--min-count", "1"]) == 0
    assert "use::editing" in capsys.readouterr().out
    assert dt.main(["freeze", str(dest), "--lists-dir", str(tmp_path / "none")]) == 1
    assert "apt-get update" in capsys.readouterr().err


def test_the_set_up_command_runs_without_warnings(lists_dir, tmp_path):
    # `make data` runs it; `python -m attnlab.data.debtags` made runpy warn (RuntimeWarning:
    # the module was already imported by its package)
    dest = tmp_path / "m.jsonl.gz"
    command = [sys.executable, "-W", "error", "-m", "attnlab.data", "debtags", "freeze"]
    done = subprocess.run(
        [*command, str(dest), "--lists-dir", str(lists_dir)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and "froze 4 tagged packages" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "attnlab.data", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr


# ----------------------------------------------------------------------------- real data


@pytest.mark.skipif(not HAS_REAL_LISTS, reason=f"no Debian package lists in {dt.LISTS_DIR}")
def test_real_lists(tmp_path):
    dest = freeze_debtags(tmp_path / "real.jsonl.gz")
    records = dt.read_frozen(dest)
    assert len(records) > 20_000  # Debian 12 tags about 30,000 packages
    assert all(r["tags"] for r in records)
    ds = load_debtags(path=dest)
    counts = ds.label_counts()
    print(f"\n{ds.name}: {len(ds)} packages, {len(ds.label_names)} labels")
    assert 30 <= len(ds.label_names) <= 200 and len(ds) > 5_000
    assert min(counts.values()) >= 50
    assert {lab.split("::")[0] for lab in ds.label_names} <= set(dt.DEFAULT_FACETS)
    assert counts["implemented-in::python"] > 200
    sizes = {s: ds.splits.count(s) for s in ("train", "dev", "test")}
    assert sizes["train"] > 6 * sizes["test"] > 0 and sizes["dev"] > 0
    by_group: dict[str, set[str]] = {}
    for group, split in zip(ds.groups, ds.splits, strict=True):
        by_group.setdefault(group, set()).add(split)
    assert all(len(s) == 1 for s in by_group.values())
    assert all(t.strip() for t in ds.texts) and len(set(ds.ids)) == len(ds)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"min_count": 2.5}, ValueError, r"min_count must be an int >= 1, got 2\.5"),
        ({"min_count": True}, ValueError, r"min_count must be an int >= 1, got True"),
        ({"min_count": float("nan")}, ValueError, r"min_count must be an int >= 1, got nan"),
        ({"min_count": "5"}, ValueError, r"min_count must be an int >= 1, got '5'"),
        ({"max_labels": 2.5}, ValueError, r"max_labels must be an int >= 1 or None, got 2\.5"),
        ({"max_labels": True}, ValueError, r"max_labels must be an int >= 1 or None, got True"),
        ({"facets": "use"}, ValueError, r"facets must be None \(every facet\) or a non-empty list"),
        ({"facets": []}, ValueError, r"facets must be None \(every facet\) or a non-empty list"),
        ({"facets": 5}, ValueError, r"facets must be None \(every facet\) or a non-empty list"),
        ({"facets": ["works_with"]}, ValueError, r"facet 'works_with' is not a debtags facet name"),
        ({"facets": ["Use"]}, ValueError, r"facet 'Use' is not a debtags facet name"),
        (
            {"facets": ["use::editing"]},
            ValueError,
            r"facet 'use::editing' is not .*\(a facet, not a tag: the part before '::'\)$",
        ),
        ({"fractions": (float("nan"), 0.5, 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": "x"}, TypeError, r"seed must be an int, got 'x'"),
        ({"seed": -1}, ValueError, r"seed must be an int >= 0, got -1"),
        ({"keep_unlabelled": "no"}, TypeError, r"keep_unlabelled must be a bool, got 'no'"),
        ({"path": ""}, ValueError, r"path must not be empty"),
    ],
)
def test_bad_options_fail_before_the_data_is_read(tmp_path, options, error, message):
    """Checked before the (missing) frozen file is looked for: min_count=nan kept no
    label, 2.5 and True passed as numbers, facets='use' was read as the facets u, s, e
    and [] as no facet (both an empty dataset), strings failed in comparisons."""
    with pytest.raises(error, match=f"^{message}"):
        load_debtags(**{"path": tmp_path / "missing.jsonl.gz", **options})


def test_the_paths_of_the_debtags_files_are_checked(tmp_path, monkeypatch):
    for call in (dt.read_frozen, dt.read_apt_lists, lambda p: dt.freeze_debtags(p)):
        with pytest.raises(TypeError, match="must be a path"):
            call(0)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(MissingDataError, match=f"in {tmp_path / 'lists'},"):
        dt.read_apt_lists("~/lists")


@pytest.mark.parametrize(
    ("argv", "status", "message"),
    [
        (["freeze", "{tmp}"], 1, "is a folder, not a file"),
        (["freeze", ""], 2, "dest must not be empty"),
        (["stats", "--min-count", "0"], 2, "min_count must be an int >= 1, got 0"),
    ],
)
def test_main_says_a_bad_argument_in_one_line(lists_dir, tmp_path, capsys, argv, status, message):
    """These were tracebacks: a folder as the destination, an empty one, a bad count."""
    argv = [a.format(tmp=tmp_path) for a in argv] + (
        ["--lists-dir", str(lists_dir)] if argv[0] == "freeze" else ["--path", str(tmp_path)]
    )
    assert dt.main(argv) == status
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == [lists_dir.name]  # nothing written
