"""The input checks that every classifier of token sequences makes of its ``tokens`` and
``lengths`` / ``mask`` arguments (attnlab.models._inputs), asserted once for the model
tests that share them (tests/models/test_capsule_classifier.py,
tests/models/test_meta_embedding_classifier.py, tests/models/test_vqa_model.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

__all__ = ["check_token_inputs_rejected"]


def check_token_inputs_rejected(
    model: Callable[..., Any], tokens: Tensor, lengths: Tensor, vocab_size: int
) -> None:
    """``model(tokens, lengths)`` / ``model(tokens, mask=...)`` raises, naming the bad
    argument, for: float and double ``tokens`` (TypeError), a token id ``>= vocab_size``
    (ValueError "outside"), a length longer than the sequences (ValueError "lengths") and
    a float or integer ``mask`` instead of a bool one (TypeError "mask"). ``tokens`` and
    ``lengths`` are a valid batch of shape ``[B, n]`` and ``[B]``."""
    b, n = tokens.shape
    for dtype in (torch.float32, torch.float64):
        with pytest.raises(TypeError, match="tokens"):
            model(tokens.to(dtype), lengths)
    with pytest.raises(ValueError, match="outside"):
        model(tokens + vocab_size, lengths)
    too_long = torch.ones_like(lengths)
    too_long[0] = n + 1
    with pytest.raises(ValueError, match="lengths"):
        model(tokens, too_long)
    for dtype in (torch.float32, torch.long):
        with pytest.raises(TypeError, match="mask"):
            model(tokens, mask=torch.ones(b, n, dtype=dtype))
