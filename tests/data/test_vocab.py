"""Vocab: specials, unknown tokens, building from a corpus, JSON."""

from __future__ import annotations

import pytest

from attnlab.data.vocab import Vocab


def test_specials_first_and_unknown_maps_to_unk():
    vocab = Vocab(["film", "good", "film"])
    assert vocab.tokens == ("<pad>", "<unk>", "film", "good")
    assert (vocab.pad_index, vocab.unk_index) == (0, 1)
    assert vocab.encode(["good", "bad", "film"]) == [3, 1, 2]
    assert vocab.decode([3, 0]) == ["good", "<pad>"]
    assert "good" in vocab and "bad" not in vocab and len(vocab) == 4
    assert vocab["film"] == 2 and vocab.token(3) == "good"


def test_from_corpus_orders_by_frequency_then_alphabet():
    texts = [["b", "a", "c"], ["a", "c", "d"], ["a"]]
    vocab = Vocab.from_corpus(texts)
    assert vocab.tokens[2:] == ("a", "c", "b", "d")  # a:3, c:2, then b, d (1 each) alphabetically
    assert Vocab.from_corpus(texts, min_freq=2).tokens[2:] == ("a", "c")
    assert Vocab.from_corpus(texts, max_size=1).tokens[2:] == ("a",)


def test_max_size_counts_the_ordinary_tokens_only():
    """Specials in the texts (``<unk>`` put in by preprocessing) took places of the
    ``max_size`` and were then dropped as repeats: fewer tokens than asked."""
    texts = [["<unk>", "<unk>", "<unk>", "a", "b", "b", "<pad>"]]
    assert Vocab.from_corpus(texts, max_size=2).tokens == ("<pad>", "<unk>", "b", "a")
    assert Vocab.from_corpus(texts).tokens == ("<pad>", "<unk>", "b", "a")


def test_without_unk_unknown_is_key_error():
    vocab = Vocab(["x"], specials=("<pad>",), unk=None)
    assert vocab.unk_index is None
    with pytest.raises(KeyError, match="'y' is not in the vocabulary"):
        vocab.encode(["y"])


def test_bad_arguments():
    with pytest.raises(ValueError, match="unk='<oov>' must be one of specials"):
        Vocab(["x"], unk="<oov>")
    with pytest.raises(TypeError, match="must be strings"):
        Vocab(["x", 3])  # type: ignore[list-item]


def test_json_round_trip_and_equality():
    vocab = Vocab.from_corpus([["x", "y", "x"]], specials=("<pad>", "<unk>", "<s>"))
    back = Vocab.from_json(vocab.to_json())
    assert back == vocab and back.tokens == ("<pad>", "<unk>", "<s>", "x", "y")
    assert Vocab(["x"]) != Vocab(["y"])


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Vocab("abc"), r"^tokens must be an iterable of token strings, not the string"),
        (lambda: Vocab(5), r"^tokens must be an iterable of token strings, got 5$"),
        (lambda: Vocab(["a"], specials="<pad>"), r"^specials must be a sequence of token str"),
        (
            lambda: Vocab.from_corpus(["a good film", "dull"]),
            r"^each text of texts must be a list of tokens, not the string 'a good film'$",
        ),
    ],
)
def test_a_string_is_not_taken_for_its_characters(call, message):
    """Vocab("abc") was the vocabulary a, b, c; specials="<pad>" the specials <, p, a, d, >;
    from_corpus of untokenised strings counted characters."""
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_freq": 0}, r"^min_freq must be an int >= 1, got 0$"),
        ({"min_freq": -1}, r"^min_freq must be an int >= 1, got -1$"),
        ({"min_freq": 1.5}, r"^min_freq must be an int >= 1, got 1\.5$"),
        ({"min_freq": float("nan")}, r"^min_freq must be an int >= 1, got nan$"),
        ({"min_freq": True}, r"^min_freq must be an int >= 1, got True$"),
        ({"min_freq": "2"}, r"^min_freq must be an int >= 1, got '2'$"),
        ({"max_size": 0}, r"^max_size must be an int >= 1 or None, got 0$"),
        ({"max_size": -3}, r"^max_size must be an int >= 1 or None, got -3$"),
        ({"max_size": 2.5}, r"^max_size must be an int >= 1 or None, got 2\.5$"),
        ({"max_size": "5"}, r"^max_size must be an int >= 1 or None, got '5'$"),
    ],
)
def test_from_corpus_bad_counts(options, message):
    """max_size=-3 dropped the last three tokens, min_freq=nan kept none and 1.5 acted as
    2 without a word; strings failed in a comparison or a slice."""
    with pytest.raises(ValueError, match=message):
        Vocab.from_corpus([["a", "b"], ["a"]], **options)


def test_token_and_decode_refuse_what_is_no_index():
    """``-1`` used to give the last token and 99 a bare "tuple index out of range"."""
    import numpy as np
    import torch

    v = Vocab(["a", "b"])
    assert v.decode(torch.tensor([2, 3])) == ["a", "b"]  # 0-d tensors, as a loop gives them
    assert v.decode(np.array([3])) == ["b"] and v.token(np.int64(2)) == "a"
    for bad in (-1, len(v)):
        with pytest.raises(IndexError, match=rf"^token index {bad} is outside the vocabulary"):
            v.token(bad)
        with pytest.raises(IndexError, match=rf"^token index {bad} is outside"):
            v.decode([2, bad])
    for bad in (1.0, True, "a", torch.tensor([1])):
        with pytest.raises(TypeError, match=r"^a token index must be an int"):
            v.token(bad)
