"""A generated task whose important token is known (the label is 1 exactly when the signal
token, id 1, occurs) and a small sentence classifier trained on it. A module with a unique
name so the tests import it safely (``conftest`` names clash across test folders)."""

from __future__ import annotations

import torch

from attnlab.evaluation.diagnostics import as_batches
from attnlab.models.sentence import SentenceClassifier

SIGNAL = 1
VOCAB = 30


def make_signal_data(count: int, seed: int) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(seed)
    tokens, labels = [], []
    for i in range(count):
        n = int(torch.randint(5, 10, (1,), generator=g))
        seq = torch.randint(2, VOCAB, (n,), generator=g).tolist()
        label = i % 2
        if label:
            seq[int(torch.randint(0, n, (1,), generator=g))] = SIGNAL
        tokens.append(seq)
        labels.append(label)
    return tokens, labels


def train_signal_model(seed: int = 0, epochs: int = 5) -> SentenceClassifier:
    torch.manual_seed(seed)
    model = SentenceClassifier(VOCAB, 2, embed_dim=16, encoder="bilstm", hidden_size=16)
    tokens, labels = make_signal_data(256, seed=100)
    batches = as_batches(tokens, labels, batch_size=32)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(epochs):
        for x, n, y in batches:
            loss = torch.nn.functional.cross_entropy(model(x, lengths=n).logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.eval()
