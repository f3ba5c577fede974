"""The shared start of the text classifiers (attnlab.models._text)."""

from __future__ import annotations

import pytest
import torch

import attnlab
from attnlab._checks import ConfigError
from attnlab.models import (
    CapsuleClassifier,
    DocumentClassifier,
    SentenceClassifier,
    TargetSentimentClassifier,
)
from attnlab.models._text import TEXT_DEFAULTS, TextClassifier


class Tiny(TextClassifier, default_embed_dim=6, encoder_names=("gru",)):
    """The smallest text classifier: the shared start and nothing else."""

    def __init__(self, vocab_size: int | None = None, **text):
        super().__init__(vocab_size, "gru", text, hidden_size=2)


def test_the_class_keywords_set_the_defaults():
    assert (Tiny.default_embed_dim, Tiny.encoder_names) == (6, ("gru",))
    assert (SentenceClassifier.default_embed_dim, DocumentClassifier.default_embed_dim) == (
        300,
        200,
    )
    assert TargetSentimentClassifier.default_embed_dim == 300
    assert CapsuleClassifier.encoder_names == ("lstm", "gru")
    with pytest.raises(ConfigError, match="default_embed_dim must be an int >= 1"):
        type("Bad", (TextClassifier,), {}, default_embed_dim=0)


def test_the_shared_parts_and_the_options():
    model = Tiny(9)
    assert model.embed_dim == 6 and model.vocab_size == 9 and model.padding_idx == 0
    assert model.embedding.weight.shape == (9, 6) and model.dropout.p == 0.0
    frozen = Tiny(
        embeddings=torch.ones(4, 3), freeze_embeddings=True, padding_idx=None, dropout=0.5
    )
    assert frozen.embed_dim == 3 and frozen.vocab_size == 4 and frozen.padding_idx is None
    assert not frozen.embedding.weight.requires_grad and frozen.dropout.p == 0.5
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\)"):
        Tiny(9, dropout=1.0)
    with pytest.raises(
        TypeError, match=r"^Tiny.__init__\(\) got an unexpected keyword argument 'bogus'$"
    ):
        Tiny(9, bogus=1)


@pytest.mark.parametrize("cls", [SentenceClassifier, DocumentClassifier, CapsuleClassifier])
def test_every_classifier_takes_the_options_and_records_their_defaults(cls):
    model = cls(12, 2, hidden_size=2, embed_dim=4, dropout=0.25)
    config = model.get_config()
    assert {k: config[k] for k in TEXT_DEFAULTS} == {
        **TEXT_DEFAULTS,
        "embed_dim": 4,
        "dropout": 0.25,
    }
    assert attnlab.build(config).get_config() == config
    with pytest.raises(TypeError, match="unexpected keyword argument 'embed_size'"):
        cls(12, 2, embed_size=4)
