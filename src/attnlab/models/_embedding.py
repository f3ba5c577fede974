"""The word-embedding table of the task models: a pretrained matrix or a learned one.

Every text model starts with ``x_t = E[w_t]``; :func:`word_embedding` builds ``E`` from
the constructor's ``vocab_size`` / ``embed_dim`` / ``embeddings`` / ``padding_idx`` /
``freeze_embeddings`` arguments, checking that they agree. Cost: O(V d_e) memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab._checks import ConfigError
from attnlab.models._inputs import check_choice, check_dropout, check_index, check_sizes

__all__ = ["as_matrix", "embedding_shape", "init_text_model", "word_embedding"]


def as_matrix(embeddings: Any) -> Tensor:
    """A float32 ``[V, d]`` tensor from a tensor, an array or ``attnlab.data.Embeddings``."""
    matrix = getattr(embeddings, "matrix", embeddings)
    if isinstance(matrix, np.ndarray):
        matrix = torch.from_numpy(np.array(matrix, dtype=np.float32, copy=True))
    if not isinstance(matrix, Tensor):
        raise TypeError(
            "embeddings must be a [V, d] tensor, a numpy array or attnlab.data.Embeddings, "
            f"got {type(embeddings).__name__}"
        )
    if matrix.dim() != 2 or not matrix.dtype.is_floating_point:
        raise ValueError(
            f"embeddings has shape {tuple(matrix.shape)} and dtype {matrix.dtype}, expected a "
            "float matrix [vocab_size, embed_dim]"
        )
    return matrix.detach().to(torch.float32).clone()


def embedding_shape(
    embeddings: Any, vocab_size: int | None, embed_dim: int | None
) -> tuple[Tensor | None, int, int | None]:
    """The pretrained matrix (or None) and the vocabulary size and embedding size it implies,
    checked against the ones given."""
    matrix = as_matrix(embeddings) if embeddings is not None else None
    if matrix is not None:
        if vocab_size is not None and vocab_size != matrix.shape[0]:
            raise ConfigError(
                f"vocab_size={vocab_size} but embeddings has shape {tuple(matrix.shape)}"
            )
        if embed_dim is not None and embed_dim != matrix.shape[1]:
            raise ConfigError(
                f"embed_dim={embed_dim} but embeddings has shape {tuple(matrix.shape)}"
            )
        vocab_size, embed_dim = matrix.shape
    if vocab_size is None:
        raise ConfigError("give vocab_size or a pretrained embeddings matrix")
    return matrix, vocab_size, embed_dim


def word_embedding(
    embeddings: Any,
    vocab_size: int | None,
    embed_dim: int | None,
    *,
    default_dim: int,
    padding_idx: int | None,
    freeze: bool = False,
    **sizes: Any,
) -> nn.Embedding:
    """The embedding table ``E`` ``[V, d_e]``: a copy of the pretrained ``embeddings``
    (whose shape sets ``vocab_size`` and ``embed_dim`` when they are None) or a learned
    table of ``embed_dim`` (``default_dim`` if None) columns; ``freeze`` keeps it fixed.
    Checks ``vocab_size``, ``embed_dim`` and the other ``sizes`` (ints >= 1, in this
    order) and ``padding_idx`` (in ``[0, V)`` or None)."""
    matrix, vocab_size, embed_dim = embedding_shape(embeddings, vocab_size, embed_dim)
    embed_dim = default_dim if embed_dim is None else embed_dim
    check_sizes(vocab_size=vocab_size, embed_dim=embed_dim, **sizes)
    check_index(vocab_size, padding_idx=padding_idx)
    table = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
    if matrix is not None:
        with torch.no_grad():
            table.weight.copy_(matrix)
    table.weight.requires_grad_(not freeze)
    return table


def init_text_model(
    model: nn.Module,
    embeddings: Any,
    vocab_size: int | None,
    embed_dim: int | None,
    padding_idx: int | None,
    freeze: bool,
    dropout: float,
    *,
    default_dim: int,
    encoder: tuple[str, Any, tuple[str, ...]],
    **sizes: Any,
) -> int:
    """The start every text model's constructor shares, from its arguments of the same
    names (``freeze`` = ``freeze_embeddings``): check the ``sizes`` (ints >= 1),
    ``dropout`` (in ``[0, 1)``) and ``encoder`` = (its argument name, its value, the
    choices); set ``model.embedding`` (:func:`word_embedding`, ``default_dim`` columns
    unless given), ``model.vocab_size``, ``model.padding_idx`` and ``model.dropout``.
    Returns the embedding size ``d_e``."""
    model.embedding = word_embedding(
        embeddings,
        vocab_size,
        embed_dim,
        default_dim=default_dim,
        padding_idx=padding_idx,
        freeze=freeze,
        **sizes,
    )
    check_dropout(dropout)
    name, value, choices = encoder
    check_choice(value, name, choices)
    model.vocab_size = int(model.embedding.num_embeddings)
    model.padding_idx = padding_idx
    model.dropout = nn.Dropout(dropout)
    return int(model.embedding.embedding_dim)
