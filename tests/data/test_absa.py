"""SemEval ABSA XML readers, on small files written for these tests."""

from __future__ import annotations

import io

import pytest

from attnlab.data import DataFormatError
from attnlab.data.absa import read_semeval_absa

XML_2014 = """<?xml version="1.0" encoding="UTF-8"?>
<sentences>
  <sentence id="s1">
    <text>The soup was cold but the bread was warm.</text>
    <aspectTerms>
      <aspectTerm term="soup" polarity="negative" from="4" to="8"/>
      <aspectTerm term="bread" polarity="positive" from="26" to="31"/>
    </aspectTerms>
  </sentence>
  <sentence id="s2">
    <text>Battery life is fine, screen so-so.</text>
    <aspectTerms>
      <aspectTerm term="Battery life" polarity="neutral" from="0" to="12"/>
      <aspectTerm term="screen" polarity="conflict" from="22" to="28"/>
    </aspectTerms>
  </sentence>
  <sentence id="s3">
    <text>Nothing to say.</text>
  </sentence>
</sentences>
"""

XML_2016 = """<?xml version="1.0" encoding="UTF-8"?>
<Reviews>
  <Review rid="r1">
    <sentences>
      <sentence id="r1:0">
        <text>Friendly staff, slow kitchen.</text>
        <Opinions>
          <Opinion target="staff" category="SERVICE#GENERAL" polarity="positive" from="9" to="14"/>
          <Opinion target="kitchen" category="SERVICE#GENERAL" polarity="negative" from="21" to="28"/>
          <Opinion target="kitchen" category="FOOD#QUALITY" polarity="negative" from="21" to="28"/>
          <Opinion target="NULL" category="RESTAURANT#GENERAL" polarity="positive" from="0" to="0"/>
        </Opinions>
      </sentence>
      <sentence id="r1:1">
        <text>The wine list was long.</text>
        <Opinions>
          <Opinion target="wine list" category="DRINKS#STYLE" polarity="positive" from="4" to="13"/>
          <Opinion target="wine list" category="DRINKS#PRICES" polarity="negative" from="4" to="13"/>
        </Opinions>
      </sentence>
    </sentences>
  </Review>
</Reviews>
"""


def test_2014_format(tmp_path):
    path = tmp_path / "Restaurants_Train.xml"
    path.write_text(XML_2014, encoding="utf-8")
    ds = read_semeval_absa(path)
    assert ds.ids == ("s1#0", "s1#1", "s2#0")  # conflict dropped, no-target sentence skipped
    assert ds.target == (("soup",), ("bread",), ("Battery", "life"))
    assert ds.left[1] == ("The", "soup", "was", "cold", "but", "the")
    assert ds.right[1] == ("was", "warm", ".")
    assert ds.labels == (0, 2, 1) and ds.label_names == ("negative", "neutral", "positive")
    assert ds.splits == ("train",) * 3  # from the file name
    assert ds.spans[2] == (0, 12)


def test_keep_conflict_and_lower():
    ds = read_semeval_absa(io.StringIO(XML_2014), keep_conflict=True, lower=True, split="test")
    assert ds.label_names == ("negative", "neutral", "positive", "conflict")
    assert ds.labels[-1] == 3 and ds.target[-1] == ("screen",)
    assert ds.target[2] == ("battery", "life") and ds.texts[2].startswith("Battery")
    assert ds.splits == ("test",) * 4


def test_2016_format():
    ds = read_semeval_absa(io.StringIO(XML_2016))
    # staff positive; kitchen negative twice (one per category) counts once; NULL skipped;
    # wine list positive and negative -> conflict, dropped
    assert ds.ids == ("r1:0#0", "r1:0#1")
    assert ds.target == (("staff",), ("kitchen",)) and ds.labels == (2, 0)
    assert ds.splits[0] == ds.splits[1]  # a sentence stays in one split
    with_conflict = read_semeval_absa(io.StringIO(XML_2016), keep_conflict=True)
    assert with_conflict.target[-1] == ("wine", "list") and with_conflict.labels[-1] == 3


@pytest.mark.parametrize(
    ("xml", "message"),
    [
        ("<sentences><sentence id='a'><text>x", r"line 1: not well-formed XML"),
        ("<root/>", "no <sentence> elements"),
        (
            "<sentences><sentence><text>x</text></sentence></sentences>",
            "sentence number 1 has no id",
        ),
        ("<sentences><sentence id='a'/></sentences>", "sentence 'a' has no <text>"),
        (
            "<sentences><sentence id='a'><text>good food</text><aspectTerms>"
            "<aspectTerm term='food' polarity='great' from='5' to='9'/></aspectTerms></sentence></sentences>",
            "sentence 'a': unknown polarity 'great'",
        ),
        (
            "<sentences><sentence id='a'><text>good food</text><aspectTerms>"
            "<aspectTerm term='food' polarity='positive' from='4' to='8'/></aspectTerms></sentence></sentences>",
            r"sentence 'a': target 'food' is not at characters 4:8 of the text \(found ' foo'\)",
        ),
        (
            "<sentences><sentence id='a'><text>good food</text><aspectTerms>"
            "<aspectTerm term='food' polarity='positive'/></aspectTerms></sentence></sentences>",
            "no integer from/to offsets",
        ),
        (
            "<sentences><sentence id='a'><text>good food</text><aspectTerms>"
            "<aspectTerm polarity='positive' from='5' to='9'/></aspectTerms></sentence></sentences>",
            "an opinion lacks 'term'",
        ),
        (
            "<sentences><sentence id='a'><text>x</text></sentence></sentences>",
            "no sentence has an explicit target",
        ),
    ],
)
def test_validation(xml, message):
    with pytest.raises(DataFormatError, match=message):
        read_semeval_absa(io.StringIO(xml))


def test_bad_split():
    with pytest.raises(ValueError, match="split must be"):
        read_semeval_absa(io.StringIO(XML_2014), split="heldout")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"split": "valid"}, ValueError, r"split must be one of 'train', 'dev', 'test' or None"),
        ({"fractions": (0.5, float("nan"), 0.5)}, ValueError, r"fractions must be three"),
        ({"seed": 1.5}, TypeError, r"seed must be an int, got 1\.5"),
        ({"keep_conflict": "no"}, TypeError, r"keep_conflict must be a bool, got 'no'"),
        ({"lower": None}, TypeError, r"lower must be a bool, got None"),
    ],
)
def test_bad_options_fail_before_the_file_is_read(tmp_path, options, error, message):
    """The split was checked only after parsing the XML; the seed, the fractions and
    the flags not at all (a NaN fraction ended in round(), 'no' switched a flag on)."""
    with pytest.raises(error, match=f"^{message}"):
        read_semeval_absa(tmp_path / "missing.xml", **options)


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("Restaurants_Train.xml", "train"),
        ("Restaurants_Train_v2.xml", "train"),
        ("ABSA16_Restaurants_Train_SB1_v2.xml", "train"),
        ("Laptops_Test_Gold.xml", "test"),
        ("EN_REST_SB1_TEST.xml.gold", "test"),
        ("restaurants-trial.xml", "dev"),
        ("laptops.dev.xml", "dev"),
        ("mobile_devices.xml", None),
        ("laptops_latest.xml", None),
        ("contest_entries.xml", None),
        ("trainee_reviews.xml", None),
        ("reviews.xml", None),
    ],
)
def test_split_from_whole_words_of_the_file_name(tmp_path, name, split):
    """A split word inside another word ('dev' in mobile_devices, 'test' in latest) set
    the split of every example; a name without one leaves the seeded split."""
    path = tmp_path / name
    path.write_text(XML_2014, encoding="utf-8")
    for seeded in ("train", "dev", "test"):
        fractions = tuple(float(s == seeded) for s in ("train", "dev", "test"))
        ds = read_semeval_absa(path, fractions=fractions)
        assert ds.splits == (split or seeded,) * len(ds)
