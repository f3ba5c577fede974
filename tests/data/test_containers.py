"""The dataset containers: validation, splits, subsets, JSON round trips."""

from __future__ import annotations

import json

import pytest

from attnlab.data._common import assign_splits
from attnlab.data.containers import DocumentDataset, TargetDataset, TextDataset


def _text(**over):
    fields = {
        "texts": ("a good film", "dull", "fine", "bad"),
        "labels": (1, 0, 1, 0),
        "label_names": ("neg", "pos"),
        "ids": ("1", "2", "3", "4"),
        "splits": ("train", "test", "train", "dev"),
        "scores": (2.0, -1.5, 0.5, -3.0),
    }
    fields.update(over)
    return TextDataset(**fields)


def test_text_dataset_items_and_splits():
    ds = _text()
    assert len(ds) == 4
    assert ds[1].text == "dull" and ds[1].label == 0 and ds[1].score == -1.5 and ds[1].group is None
    train = ds.split("train")
    assert (
        train.texts == ("a good film", "fine")
        and train.ids == ("1", "3")
        and train.scores == (2.0, 0.5)
    )
    assert train.label_names == ("neg", "pos")
    assert ds.subset([3, 0]).ids == ("4", "1")
    assert ds.label_counts() == {"neg": 2, "pos": 2}
    assert [x.id for x in ds] == ["1", "2", "3", "4"]


def test_text_dataset_tokens():
    ds = _text()
    assert ds.tokens()[0] == ["a", "good", "film"]
    assert ds.tokens(str.split, lower=True)[1] == ["dull"]


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match=r"no split 'valid'.*\['dev', 'test', 'train'\]"):
        _text().split("valid")


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"labels": (1, 0, 1)}, r"labels has 3 entries, expected one per item \(4"),
        ({"labels": (1, 0, 2, 0)}, r"labels must index label_names .* found 2"),
        ({"splits": ("train",)}, r"splits has 1 entries"),
        ({"scores": (1.0,)}, r"scores has 1 entries"),
        # a bool was taken for the label 0 / 1
        ({"labels": (1, 0, True, 0)}, r"labels must index label_names .* found True"),
        # a split outside train/dev/test could never be chosen with split()
        ({"splits": ("train", "test", "valid", "dev")}, r"splits must hold 'train', .* 'valid'"),
        # repeated names were accepted, and label_counts() merged their counts
        (
            {"label_names": ("pos", "neg", "pos")},
            r"^TextDataset\.label_names repeats 'pos' \(at 0 and 2\); each label needs its own",
        ),
    ],
)
def test_text_dataset_validation(over, message):
    with pytest.raises(ValueError, match=message):
        _text(**over)


def test_text_dataset_is_immutable_and_json_round_trips():
    ds = _text(groups=("m1", "m1", "m2", "m3"), name="x")
    with pytest.raises(AttributeError):
        ds.texts = ()  # type: ignore[misc]
    back = TextDataset.from_json(json.loads(json.dumps(ds.to_json())))
    assert back.to_json() == ds.to_json()
    assert back.texts == ds.texts and isinstance(back.texts, tuple) and back.groups == ds.groups


def test_document_dataset():
    ds = DocumentDataset(
        documents=(("s1.", "s2."), ("t1.",)),
        labels=(1, 0),
        label_names=("negative", "positive"),
        ids=("d1", "d2"),
        splits=("train", "test"),
        sentence_ids=(("1_1", "1_2"), ("2_1",)),
        scores=(0.5, -1.0),
        sentence_scores=((1.0, 0.0), (-1.0,)),
    )
    assert ds[0].sentences == ("s1.", "s2.") and ds[0].sentence_scores == (1.0, 0.0)
    assert ds.split("test").sentence_ids == (("2_1",),)
    back = DocumentDataset.from_json(json.loads(json.dumps(ds.to_json())))
    assert back.documents == ds.documents and back.sentence_scores == ds.sentence_scores
    with pytest.raises(ValueError, match="document 'd1' has 2 sentences"):
        DocumentDataset(
            documents=(("s1.", "s2."),),
            labels=(1,),
            label_names=("negative", "positive"),
            ids=("d1",),
            splits=("train",),
            sentence_ids=(("1_1",),),
        )


def test_target_dataset():
    ds = TargetDataset(
        left=(("the",), ()),
        target=(("pasta",), ("@united",)),
        right=(("was", "great"), ("lost", "my", "bag")),
        labels=(2, 0),
        label_names=("negative", "neutral", "positive"),
        ids=("s1#0", "t2"),
        splits=("train", "dev"),
        texts=("the pasta was great", "@united lost my bag"),
        spans=((4, 9), (0, 7)),
    )
    ex = ds[0]
    assert ex.text[ex.span[0] : ex.span[1]] == "pasta"
    assert ds.split("dev").target == (("@united",),)
    assert TargetDataset.from_json(json.loads(json.dumps(ds.to_json()))).spans == ds.spans
    with pytest.raises(ValueError, match="target of item 'x' has no tokens"):
        TargetDataset(
            left=((),),
            target=((),),
            right=((),),
            labels=(0,),
            label_names=("negative",),
            ids=("x",),
            splits=("train",),
            texts=("",),
            spans=((0, 0),),
        )


def test_seeded_splits_by_groups_else_by_ids():
    texts = [f"text {i}" for i in range(40)]
    ids = [str(i) for i in range(40)]
    groups = [f"doc{i // 4}" for i in range(40)]
    common = {"texts": texts, "labels": [i % 2 for i in range(40)], "label_names": ("a", "b")}
    ds = TextDataset.seeded(
        None, seed=3, fractions=(0.5, 0.25, 0.25), ids=ids, groups=groups, **common
    )
    assert ds.texts == tuple(texts) and ds.groups == tuple(groups)  # lists become tuples
    assert ds.splits == assign_splits(groups, fractions=(0.5, 0.25, 0.25), seed=3)
    by_ids = TextDataset.seeded(None, seed=3, fractions=(0.5, 0.25, 0.25), ids=ids, **common)
    assert by_ids.splits == assign_splits(ids, fractions=(0.5, 0.25, 0.25), seed=3)
    test = TextDataset.seeded("test", seed=3, fractions=(0.5, 0.25, 0.25), ids=ids, **common)
    assert test.ids == by_ids.split("test").ids and set(test.splits) == {"test"}


def test_seeded_refuses_nan_fractions_and_a_str_seed():
    common = {"texts": ["a", "b"], "labels": [0, 1], "label_names": ("n", "p"), "ids": ["1", "2"]}
    with pytest.raises(ValueError, match=r"^fractions must be three non-negative numbers"):
        TextDataset.seeded(None, seed=0, fractions=(float("nan"), 0.5, 0.5), **common)
    with pytest.raises(TypeError, match=r"^seed must be an int, got 'x'$"):
        TextDataset.seeded(None, seed="x", fractions=(0.8, 0.1, 0.1), **common)
