"""The input and constructor checks shared by the task models (attnlab.models._inputs)."""

from __future__ import annotations

import pytest
import torch

from attnlab._checks import ConfigError
from attnlab.models._inputs import (
    check_choice,
    check_dropout,
    check_ids,
    check_index,
    check_lengths,
    check_mask,
    check_sizes,
    dict_spec,
    token_mask,
)

TOKENS = torch.tensor([[1, 2, 3], [4, 0, 0]])


def test_token_mask_from_lengths_mask_or_neither():
    assert token_mask(TOKENS, torch.tensor([3, 1]), vocab_size=5).tolist() == [
        [True, True, True],
        [True, False, False],
    ]
    assert token_mask(TOKENS, [3, 1], vocab_size=5).dtype == torch.bool  # a list is fine
    mask = torch.tensor([[True, False, True], [False, False, False]])
    assert torch.equal(token_mask(TOKENS, mask=mask, vocab_size=5), mask)
    assert token_mask(TOKENS, vocab_size=5).all()
    empty = torch.zeros(0, 4, dtype=torch.long)
    assert token_mask(empty, torch.zeros(0, dtype=torch.long), vocab_size=5).shape == (0, 4)


def test_token_errors_name_the_argument_and_the_shapes():
    with pytest.raises(TypeError, match=r"tokens must be a torch\.Tensor \[B, n\], got list"):
        token_mask([[1]], vocab_size=5)
    with pytest.raises(TypeError, match=r"tokens has dtype torch.float32 and shape \(2, 3\)"):
        token_mask(TOKENS.float(), vocab_size=5)
    with pytest.raises(ValueError, match=r"tokens has shape \(6,\), expected \[B, n\]$"):
        token_mask(TOKENS.flatten(), vocab_size=5)
    with pytest.raises(ValueError, match=r"holds ids in \[0, 4\], outside \[0, vocab_size\)"):
        token_mask(TOKENS, vocab_size=4)
    with pytest.raises(ValueError, match="give lengths or mask, not both"):
        token_mask(TOKENS, torch.tensor([1, 1]), torch.ones(2, 3, dtype=torch.bool), vocab_size=5)


def test_parts_batches_and_prefix_masks():
    with pytest.raises(ValueError, match=r"left has shape \(2, 3\), expected \[B, n\] = \[3, n\]"):
        token_mask(TOKENS, vocab_size=5, part="left", batch=3)
    with pytest.raises(ValueError, match=r"expected \[B, n\] with B = 3 \(the number of images\)"):
        token_mask(TOKENS, vocab_size=5, batch=3, batch_of="the number of images")
    with pytest.raises(ValueError, match="give left_lengths or left_mask, not both"):
        token_mask(TOKENS, [1, 1], torch.ones(2, 3, dtype=torch.bool), vocab_size=5, part="left")
    with pytest.raises(ValueError, match=r"left_lengths \(shape \(2,\)\).*outside \[0, n\] = "):
        token_mask(TOKENS, torch.tensor([4, 1]), vocab_size=5, part="left")
    gap = torch.tensor([[True, False, True], [True, False, False]])
    with pytest.raises(ValueError, match=r"not a prefix mask.*the BiLSTM encoder needs one"):
        token_mask(TOKENS, mask=gap, vocab_size=5, prefix="the BiLSTM encoder")
    assert torch.equal(token_mask(TOKENS, mask=gap, vocab_size=5), gap)


def test_lengths_and_masks_of_other_ranks():
    docs = torch.zeros(2, 3, 4, dtype=torch.long)
    assert check_ids(docs, 5, layout="[B, S, W]") is docs
    with pytest.raises(ValueError, match=r"expected \[B, S, W\]$"):
        check_ids(TOKENS, 5, layout="[B, S, W]")
    wl = check_lengths([[1, 2, 0], [4, 4, 4]], (2, 3), ("W", 4), name="word_lengths", tokens=docs)
    assert wl.dtype == torch.long and wl.shape == (2, 3)
    with pytest.raises(
        TypeError, match=r"word_lengths has dtype torch.float32 .* \[B, S\] = \[2, 3\]"
    ):
        check_lengths(torch.zeros(2, 3), (2, 3), ("W", 4), name="word_lengths", tokens=docs)
    with pytest.raises(ValueError, match=r"must lie in \[0, W\]"):
        check_lengths([[5, 0, 0], [0, 0, 0]], (2, 3), ("W", 4), name="word_lengths", tokens=docs)
    with pytest.raises(TypeError, match=r"mask has dtype torch.int64 .*\[B, S, W\] = \[2, 3, 4\]"):
        check_mask(docs, (2, 3, 4))
    with pytest.raises(TypeError, match="mask is a list"):
        check_mask([[True]], (1, 1))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\), expected \[B, n\] = \[2, 4\]"):
        check_mask(torch.ones(2, 3, dtype=torch.bool), (2, 4))


def test_constructor_checks():
    check_sizes(a=1, b=2)
    with pytest.raises(ConfigError, match="hidden_size must be an int >= 1, got 0"):
        check_sizes(vocab_size=3, hidden_size=0)
    with pytest.raises(ConfigError, match="embed_dim must be an int >= 1, got True"):
        check_sizes(embed_dim=True)
    assert check_choice("gru", "encoder", ("lstm", "gru")) == "gru"
    with pytest.raises(ConfigError, match=r"^encoder must be 'lstm' or 'gru', got 'cnn'$"):
        check_choice("cnn", "encoder", ("lstm", "gru"))
    with pytest.raises(ConfigError, match=r"^rnn must be one of 'lstm', 'gru', None, got 'x'$"):
        check_choice("x", "rnn", ("lstm", "gru", None))
    check_dropout(0.0)
    with pytest.raises(ConfigError, match=r"dropout must be in \[0, 1\), got 1.0"):
        check_dropout(1.0)
    check_index(5, padding_idx=None, bos_idx=4)
    with pytest.raises(ConfigError, match=r"bos_idx=5 is outside \[0, vocab_size\) = \[0, 5\)"):
        check_index(5, bos_idx=5)
    with pytest.raises(ConfigError, match=r"pad_idx=-1 is outside \[0, tgt_vocab_size\)"):
        check_index(5, "tgt_vocab_size", pad_idx=-1)
    for bad in (2.5, True, "3"):  # 2.5 passed the range test and broke at the first lookup
        with pytest.raises(ConfigError, match=rf"^bos_idx must be an int or None, got {bad!r}$"):
            check_index(5, bos_idx=bad)


def test_dict_spec_splits_off_uniform():
    spec = {"score": "dot", "uniform": True}
    assert dict_spec(spec) == ({"score": "dot"}, True) and spec["uniform"] is True
    assert dict_spec({}) == ({}, False)
    with pytest.raises(ConfigError, match="meta must be a name or a dict spec, got int"):
        dict_spec(3, "meta")
