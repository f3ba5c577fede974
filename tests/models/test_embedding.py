"""The word embedding of the text models (attnlab.models._embedding)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.models._embedding import as_matrix, embedding_shape, init_text_model, word_embedding


def test_word_embedding_learned_or_pretrained():
    table = word_embedding(None, 7, None, default_dim=5, padding_idx=0)
    assert table.weight.shape == (7, 5) and table.weight.requires_grad
    assert torch.equal(table.weight[0], torch.zeros(5))
    matrix = np.arange(12, dtype=np.float64).reshape(4, 3)
    frozen = word_embedding(matrix, None, None, default_dim=5, padding_idx=1, freeze=True)
    assert frozen.weight.shape == (4, 3) and not frozen.weight.requires_grad
    assert torch.equal(frozen.weight, torch.from_numpy(matrix).float())
    with pytest.raises(ConfigError, match="vocab_size=5 but embeddings has shape"):
        embedding_shape(matrix, 5, None)
    with pytest.raises(ConfigError, match="give vocab_size or a pretrained embeddings matrix"):
        embedding_shape(None, None, 3)
    with pytest.raises(ConfigError, match=r"padding_idx=7 is outside \[0, vocab_size\)"):
        word_embedding(None, 7, 2, default_dim=5, padding_idx=7)
    with pytest.raises(ConfigError, match="num_classes must be an int >= 1"):
        word_embedding(None, 7, 2, default_dim=5, padding_idx=0, num_classes=0)
    with pytest.raises(TypeError, match="embeddings must be"):
        as_matrix("glove")
    with pytest.raises(ValueError, match="float matrix"):
        as_matrix(torch.zeros(3, dtype=torch.long))


def test_init_text_model_sets_the_shared_parts():
    model = torch.nn.Module()
    d = init_text_model(
        model, None, 9, None, 0, False, 0.25, default_dim=4,
        encoder=("encoder", "gru", ("lstm", "gru")), hidden_size=3,
    )  # fmt: skip
    assert d == 4 and model.vocab_size == 9 and model.padding_idx == 0
    assert model.dropout.p == 0.25 and model.embedding.weight.shape == (9, 4)
    with pytest.raises(ConfigError, match="encoder must be one of"):
        init_text_model(
            model, None, 9, None, 0, False, 0.0, default_dim=4, encoder=("encoder", "cnn", ("gru",))
        )
