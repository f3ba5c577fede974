"""Fixtures: a sentence classifier trained on the signal task (see signal_task.py)."""

from __future__ import annotations

import pytest
import torch
from signal_task import make_signal_data, train_signal_model

from attnlab.evaluation.diagnostics import as_batches
from attnlab.models.sentence import SentenceClassifier


@pytest.fixture(scope="session")
def signal_model() -> SentenceClassifier:
    return train_signal_model(0)


@pytest.fixture(scope="session")
def signal_test() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    tokens, labels = make_signal_data(128, seed=7)
    return as_batches(tokens, labels, batch_size=32)
